#!/usr/bin/env bash
# A local cluster for end-to-end tests and the demo: a real kube-apiserver, etcd,
# kube-controller-manager and kube-scheduler (built from source by build-k8s-binaries.sh) with
# kwok-simulated nodes, run by kwokctl's binary runtime; the KubeVirt, NAD, cert-manager and
# monitoring CRDs; the lockstep operator running as a process with its own ServiceAccount's RBAC;
# and the KubeVirt TEST DOUBLE (test/kubevirtdouble), the only fake in the loop. Nothing is
# downloaded but Go modules.
#
#   hack/local-cluster.sh up [NODES]        start (idempotent) with NODES nodes (default 6)
#   hack/local-cluster.sh down              stop and remove everything (idempotent)
#   hack/local-cluster.sh kubeconfig        print the kubeconfig path
#   hack/local-cluster.sh add-node NAME [ZONE]  add a node (idempotent)
#   hack/local-cluster.sh kill-node NAME    stop simulating the node, as if its host died
#   hack/local-cluster.sh revive-node NAME  simulate it again: the host came back
#   hack/local-cluster.sh start|stop|kill operator|kubevirt-double
#                                           manage a process (stop: SIGTERM; kill: SIGKILL)
#   hack/local-cluster.sh logs operator|kubevirt-double   print the process's log path
#
# Environment: CLUSTER_NAME (default lockstep), NODE_LOST_GRACE (operator, default 10s),
# OPERATOR_ARGS (more operator flags), LOCKSTEP_CACHE.
#
# (kwokctl v0.8.0 panics on --extra-args for kwok-controller, cluster.go:253: hence the file.)
#
# Nodes carry realistic capacity (16 CPUs, 64 GiB), hostname and zone labels (zone-a/b/c in
# turn). hack/kwokctl.yaml makes a lost node show within seconds (node monitor period 2s, grace
# 8s); `kill-node` stops kwok's simulation of one node (see kill_node).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME="${CLUSTER_NAME:-lockstep}"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}"
export KWOK_WORKDIR="${KWOK_WORKDIR:-$CACHE/kwok}"
CLUSTER_DIR="$KWOK_WORKDIR/clusters/$NAME"
KUBECONFIG_PATH="$CLUSTER_DIR/kubeconfig.yaml"
RUN_DIR="$CLUSTER_DIR/lockstep" # pid files, logs and the operator's kubeconfig
K8S="$ROOT/bin/k8s"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

kubectl() { "$K8S/kubectl" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# exists: whether the cluster exists. (Not `kwokctl get clusters | grep -q`: under pipefail, grep
# closing the pipe early fails the test.)
exists() {
  local clusters
  clusters="$("$ROOT/bin/kwokctl" get clusters 2>/dev/null || true)"
  grep -qx "$NAME" <<<"$clusters"
}

up() {
  local nodes="${1:-6}"
  "$ROOT/hack/build-k8s-binaries.sh" kube-apiserver kube-controller-manager kube-scheduler kubectl etcd
  "$ROOT/hack/tools.sh" kwokctl kwok kustomize
  "$ROOT/hack/test-crds.sh"
  (cd "$ROOT" && go build -o bin/lockstep-operator ./cmd/lockstep-operator &&
    go build -o bin/kubevirt-double ./test/kubevirtdouble/cmd/kubevirt-double)
  if ! exists; then
    "$ROOT/bin/kwokctl" create cluster --name "$NAME" --runtime binary \
      --kube-apiserver-binary "$K8S/kube-apiserver" \
      --kube-controller-manager-binary "$K8S/kube-controller-manager" \
      --kube-scheduler-binary "$K8S/kube-scheduler" \
      --etcd-binary "$K8S/etcd" \
      --kwok-controller-binary "$ROOT/bin/kwok" \
      --config "$ROOT/hack/kwokctl.yaml" \
      --kubeconfig "" --wait 2m
  else
    "$ROOT/bin/kwokctl" start cluster --name "$NAME" --wait 2m
  fi
  local zones=(a b c)
  for i in $(seq 1 "$nodes"); do add_node "node-$i" "zone-${zones[(i - 1) % 3]}"; done
  install
  start kubevirt-double
  start operator
  echo ">> cluster $NAME up: $nodes nodes, the lockstep operator and the KubeVirt test double running" >&2
  echo ">> export KUBECONFIG=$KUBECONFIG_PATH" >&2
}

# install: the third-party CRDs, then lockstep's CRD, RBAC, namespace and PriorityClass.
install() {
  local d
  for d in kubevirt multus cert-manager monitoring; do
    kubectl apply --server-side --force-conflicts -f "$ROOT/bin/test-crds/$d" >/dev/null
  done
  "$ROOT/bin/kustomize" build "$ROOT/config/local" | kubectl apply --server-side --force-conflicts -f - >/dev/null
  kubectl wait --for condition=Established --timeout 60s crd --all >/dev/null
}

# operator_kubeconfig: a kubeconfig with the operator ServiceAccount's token, so that the
# operator runs with exactly the RBAC it has in a cluster.
operator_kubeconfig() {
  local token server ca
  token="$(kubectl -n lockstep-system create token lockstep-operator --duration 24h)"
  server="$(kubectl config view --raw --flatten -o jsonpath='{.clusters[0].cluster.server}')"
  ca="$(kubectl config view --raw --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
  (umask 077 && cat >"$RUN_DIR/operator.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: lockstep-operator, user: {token: "$token"}}]
contexts: [{name: local, context: {cluster: local, user: lockstep-operator, namespace: lockstep-system}}]
current-context: local
EOF
  )
}

# start NAME: start a process (idempotent), detached from the caller, logging into RUN_DIR.
start() {
  mkdir -p "$RUN_DIR"
  if running "$1"; then return 0; fi
  local cmd
  case "$1" in
    operator)
      operator_kubeconfig
      # shellcheck disable=SC2206 # OPERATOR_ARGS is a list of flags
      cmd=("$ROOT/bin/lockstep-operator" --kubeconfig "$RUN_DIR/operator.kubeconfig"
        --leader-elect --leader-election-namespace lockstep-system --metrics-bind-address 0 --health-probe-bind-address 0
        --node-lost-grace "${NODE_LOST_GRACE:-10s}" --retry-interval 10s ${OPERATOR_ARGS:-}) ;;
    kubevirt-double)
      cmd=("$ROOT/bin/kubevirt-double" --kubeconfig "$KUBECONFIG_PATH") ;;
    *) echo "unknown process $1 (operator, kubevirt-double)" >&2; exit 2 ;;
  esac
  echo "--- $(date -u +%FT%TZ) start: ${cmd[*]}" >>"$RUN_DIR/$1.log"
  setsid "${cmd[@]}" </dev/null >>"$RUN_DIR/$1.log" 2>&1 &
  echo $! >"$RUN_DIR/$1.pid"
}

running() { [ -f "$RUN_DIR/$1.pid" ] && kill -0 "$(cat "$RUN_DIR/$1.pid")" 2>/dev/null; }

# stop NAME SIGNAL: stop a process and wait until it is gone (idempotent).
stop() {
  local pid
  if ! running "$1"; then rm -f "$RUN_DIR/$1.pid"; return 0; fi
  pid="$(cat "$RUN_DIR/$1.pid")"
  kill "-$2" "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$RUN_DIR/$1.pid"
}

# add_node NAME ZONE: a kwok node with realistic capacity.
add_node() {
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $1
  labels:
    kubernetes.io/hostname: $1
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    topology.kubernetes.io/zone: $2
    type: kwok
status:
  allocatable: {cpu: "16", memory: 64Gi, pods: "110"}
  capacity: {cpu: "16", memory: 64Gi, pods: "110"}
EOF
}

# kill_node NAME: the node's host dies. kwok simulates a node only while it holds the node's
# Lease (kube-node-lease), so another holder with a long lease silences it: no more heartbeats,
# status or pod updates, and the node lifecycle controller marks it unreachable after its grace.
# revive-node deletes that Lease; kwok creates it again and the node comes back Ready.
kill_node() {
  local now
  now="$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"
  kubectl -n kube-node-lease patch lease "$1" --type merge >/dev/null -p \
    "{\"spec\":{\"holderIdentity\":\"lockstep-killed-node\",\"leaseDurationSeconds\":86400,\"renewTime\":\"$now\"}}"
}

down() {
  stop operator TERM
  stop kubevirt-double TERM
  if [ -x "$ROOT/bin/kwokctl" ] && exists; then
    "$ROOT/bin/kwokctl" delete cluster --name "$NAME"
  fi
  rm -rf "$RUN_DIR"
}

usage() {
  echo "usage: $0 up [NODES] | down | kubeconfig | add-node NAME [ZONE] | kill-node NAME | revive-node NAME" \
    "| start|stop|kill operator|kubevirt-double | logs operator|kubevirt-double" >&2
  exit 2
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  kubeconfig) echo "$KUBECONFIG_PATH" ;;
  add-node) add_node "$2" "${3:-zone-a}" ;;
  kill-node) kill_node "$2" ;;
  revive-node) kubectl -n kube-node-lease delete lease "$2" --ignore-not-found >/dev/null ;;
  start) start "$2" ;;
  stop) stop "$2" TERM ;;
  kill) stop "$2" KILL ;;
  logs) echo "$RUN_DIR/$2.log" ;;
  *) usage ;;
esac
