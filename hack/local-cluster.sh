#!/usr/bin/env bash
# A local cluster for end-to-end tests and the demo: a real kube-apiserver, etcd,
# kube-controller-manager and kube-scheduler (built from source by build-k8s-binaries.sh) with
# kwok-simulated nodes, run by kwokctl's binary runtime. Nothing is downloaded but Go modules.
#
#   hack/local-cluster.sh up [NODES]   start (idempotent) with NODES nodes (default 6)
#   hack/local-cluster.sh down         stop and remove everything (idempotent)
#   hack/local-cluster.sh kubeconfig   print the kubeconfig path
#   hack/local-cluster.sh kill-node N  stop simulating node N, as if its host died
#
# (kwokctl v0.8.0 panics on --extra-args for kwok-controller, cluster.go:253: hence the file.)
#
# Nodes carry realistic capacity (16 CPUs, 64 GiB), hostname and zone labels (zone-a/b/c in
# turn). hack/kwokctl.yaml makes a lost node show within seconds (node monitor period 2s, grace
# 8s) and lets `kill-node` stop kwok's heartbeats for one node: measured here, the node is
# Unknown with the unreachable taint 5-9 s later.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME="${CLUSTER_NAME:-lockstep}"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}"
export KWOK_WORKDIR="${KWOK_WORKDIR:-$CACHE/kwok}"
KUBECONFIG_PATH="$KWOK_WORKDIR/clusters/$NAME/kubeconfig.yaml"
K8S="$ROOT/bin/k8s"

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
  "$ROOT/hack/tools.sh" kwokctl kwok
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
  echo ">> cluster $NAME up with $nodes nodes; KUBECONFIG=$KUBECONFIG_PATH" >&2
}

# add_node NAME ZONE: a kwok node with realistic capacity.
add_node() {
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $1
  annotations:
    kwok.x-k8s.io/node: fake
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

down() {
  if [ -x "$ROOT/bin/kwokctl" ] && exists; then
    "$ROOT/bin/kwokctl" delete cluster --name "$NAME"
  fi
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  kubeconfig) echo "$KUBECONFIG_PATH" ;;
  kill-node) kubectl annotate node "$2" kwok.x-k8s.io/node- >/dev/null ;;
  *) echo "usage: $0 up [NODES] | down | kubeconfig | kill-node NODE" >&2; exit 2 ;;
esac
