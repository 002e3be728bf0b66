#!/usr/bin/env bash
# make demo: lockstep protecting a VM on a 6-node local cluster, then surviving a node's death.
#
#   1. starts the local cluster (hack/local-cluster.sh: real kube-apiserver, etcd, controller
#      manager and scheduler; kwok nodes; the operator; the KubeVirt test double);
#   2. applies config/samples (the logging network and the FaultTolerantVM mail-01) and waits
#      until it is Protected;
#   3. kills the primary's node and prints a timeline: node NotReady, secondary promoted, new
#      secondary running, Protected again;
#   4. tears everything down, or with KEEP=1 leaves it up and says how to reach it.
# It exits non-zero if a step does not happen in time.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CLUSTER_NAME="${CLUSTER_NAME:-lockstep-demo}"
export NODE_LOST_GRACE="${NODE_LOST_GRACE:-10s}"
CLUSTER="$ROOT/hack/local-cluster.sh"
STEP_TIMEOUT="${STEP_TIMEOUT:-120}" # seconds per step
FTVM=mail-01

bold() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() { printf '\n\033[31mdemo failed: %s\033[0m\n' "$*" >&2; exit 1; }

cleanup() {
  local rc=$?
  if [ -n "${KEEP:-}" ]; then
    bold "KEEP=1: the cluster stays up"
    echo "  export KUBECONFIG=$KUBECONFIG"
    echo "  kubectl get ftvm -o wide            # kubectl is $ROOT/bin/k8s/kubectl"
    echo "  CLUSTER_NAME=$CLUSTER_NAME hack/local-cluster.sh kill-node|revive-node node-N"
    echo "  logs: $("$CLUSTER" logs operator)"
    echo "  tear down: CLUSTER_NAME=$CLUSTER_NAME hack/local-cluster.sh down"
  else
    bold "tearing down (KEEP=1 leaves the cluster up)"
    "$CLUSTER" down >/dev/null 2>&1 || true
  fi
  exit "$rc"
}

bold "starting a local cluster with 6 nodes, the lockstep operator and the KubeVirt test double"
"$CLUSTER" up 6
KUBECONFIG="$("$CLUSTER" kubeconfig)"
export KUBECONFIG
trap cleanup EXIT
k() { "$ROOT/bin/k8s/kubectl" "$@"; }
k get nodes -L topology.kubernetes.io/zone

# field PATH: a jsonpath field of the FaultTolerantVM.
field() { k get ftvm "$FTVM" -o jsonpath="{$1}" 2>/dev/null || true; }

# wait_for WHAT CMD...: poll CMD until it succeeds, or fail after STEP_TIMEOUT.
wait_for() {
  local what="$1" deadline=$((SECONDS + STEP_TIMEOUT))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what did not happen within ${STEP_TIMEOUT}s"
    sleep 0.25
  done
}
show() {
  k get ftvm -o wide
  echo
  k get vmi -o custom-columns='VMI:.metadata.name,ROLE:.metadata.labels.ft\.lockstep\.dev/role,NODE:.status.nodeName,PHASE:.status.phase'
  echo
  k get pods -o wide
}

bold "applying config/samples: the FT logging network and the FaultTolerantVM $FTVM"
k apply -k "$ROOT/config/samples"
is_protected() { [ "$(field .status.state)" = Protected ]; }
wait_for "$FTVM reaching Protected" is_protected
show

primary_node="$(field .status.primary.node)"
secondary_node="$(field .status.secondary.node)"
secondary_vmi="$(field .status.secondary.vmi)"
bold "killing $primary_node, the primary's node (its kubelet stops reporting, as when a host dies)"
start_ms=$(date +%s%3N)
"$CLUSTER" kill-node "$primary_node"
timeline="$(mktemp)"
stamp() {
  local ms=$(($(date +%s%3N) - start_ms))
  printf '%4d.%ds  %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*" | tee -a "$timeline"
}
stamp "$primary_node killed"

node_not_ready() { [ "$(k get node "$primary_node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" != True ]; }
wait_for "$primary_node turning NotReady" node_not_ready
stamp "$primary_node NotReady (node lifecycle controller: 8s grace in the local cluster)"

promoted() { [ "$(field .status.primary.vmi)" = "$secondary_vmi" ]; }
wait_for "the promotion of $secondary_vmi" promoted
stamp "secondary $secondary_vmi on $secondary_node promoted to primary (operator: --node-lost-grace=$NODE_LOST_GRACE)"

new_secondary() { [ -n "$(field .status.secondary.node)" ] && [ "$(field .status.secondary.vmi)" != "$secondary_vmi" ]; }
wait_for "a new secondary" new_secondary
stamp "new secondary $(field .status.secondary.vmi) placed on $(field .status.secondary.node)"

wait_for "$FTVM being Protected again" is_protected
stamp "new secondary Running: $FTVM Protected again (failovers: $(field .status.failoverCount))"

bold "after the failover"
show
bold "events of $FTVM"
k get events --field-selector involvedObject.name="$FTVM" --sort-by=.metadata.creationTimestamp \
  -o custom-columns='TYPE:.type,REASON:.reason,MESSAGE:.message' | cut -c1-200
bold "timeline (seconds after $primary_node was killed)"
cat "$timeline"
rm -f "$timeline"
