#!/usr/bin/env bash
# make demo: a real VM protected by lockstep survives the death of its node, with nothing lost.
#
#   1. starts the full-stack local cluster (hack/local-cluster.sh with FULL_STACK=1: a real
#      kube-apiserver, etcd, controller manager and scheduler; kwok nodes, each with a host of its
#      own running lockstepd; the operator; the KubeVirt test double booting each member through
#      lockstep's hook and libvirt, with real QEMU and the counter guest), lockstep installed as
#      users install it: the Helm chart (INSTALL=helm), its webhooks answering;
#   2. applies the counter VM (test/fullstack/testdata/counter-vm.yaml) and waits until it is
#      Protected;
#   3. starts a client that asks the VM's counter all along, kills the primary's node (its host:
#      links, QEMU, libvirt, lockstepd) and prints a timeline: kill, secondary live, the client's
#      next reply, promoted, new secondary placed, Protected again; and the client's last count
#      before the kill and first after;
#   4. tears everything down, or with KEEP=1 leaves it up and says how to reach it.
# It exits non-zero if a step does not happen in time or the client sees what FT forbids. Needs
# root (network namespaces, QEMU, libvirtd).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CLUSTER_NAME="${CLUSTER_NAME:-lockstep-demo}" FULL_STACK=1 INSTALL="${INSTALL:-helm}"
export NODE_LOST_GRACE="${NODE_LOST_GRACE:-10s}"
CLUSTER="$ROOT/hack/local-cluster.sh"
STEP_TIMEOUT="${STEP_TIMEOUT:-180}" # seconds per step
FTVM=counter
VM_ADDR=10.214.0.10
HOSTS_DIR="/run/lockstep-hosts/$CLUSTER_NAME"
CLIENT_LOG="$(mktemp)"
CLIENT_PID=

bold() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() { printf '\n\033[31mdemo failed: %s\033[0m\n' "$*" >&2; exit 1; }

cleanup() {
  local rc=$?
  [ -z "$CLIENT_PID" ] || kill "$CLIENT_PID" 2>/dev/null || true
  if [ -n "${KEEP:-}" ]; then
    bold "KEEP=1: the cluster stays up"
    echo "  export KUBECONFIG=$KUBECONFIG      # kubectl is $ROOT/bin/k8s/kubectl"
    echo "  kubectl get ftvm -o wide -w"
    echo "  $ROOT/bin/counter-client --netns $("$CLUSTER" netns client) --addr $VM_ADDR     # ask the VM"
    echo "  CLUSTER_NAME=$CLUSTER_NAME hack/local-cluster.sh kill-node|revive-node|silence-node|partition-node|heal-node node-N"
    echo "  logs: $("$CLUSTER" logs operator), $("$CLUSTER" logs kubevirt-double), $HOSTS_DIR/node-N-lockstepd.log"
    echo "  tear down: CLUSTER_NAME=$CLUSTER_NAME hack/local-cluster.sh down"
  else
    bold "tearing down (KEEP=1 leaves the cluster up)"
    "$CLUSTER" down >/dev/null 2>&1 || true
  fi
  rm -f "$CLIENT_LOG"
  exit "$rc"
}

[ "$(id -u)" = 0 ] || fail "the demo runs VMs in network namespaces: run it as root"
bold "starting a local cluster of 4 nodes, each with a host running lockstepd; the operator; KubeVirt's double with libvirt and QEMU"
"$CLUSTER" down >/dev/null 2>&1 || true
"$CLUSTER" up 4
KUBECONFIG="$("$CLUSTER" kubeconfig)"
export KUBECONFIG
trap cleanup EXIT
k() { "$ROOT/bin/k8s/kubectl" "$@"; }
k get nodes -L topology.kubernetes.io/zone

field() { k get ftvm "$FTVM" -o jsonpath="{$1}" 2>/dev/null || true; }
now_ms() { date +%s%3N; }

# wait_for WHAT CMD...: poll CMD until it succeeds, or fail after STEP_TIMEOUT.
wait_for() {
  local what="$1" deadline=$((SECONDS + STEP_TIMEOUT))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what did not happen within ${STEP_TIMEOUT}s"
    client_ok
    sleep 0.05
  done
}
show() {
  k get ftvm -o wide
  echo
  k get vmi -o custom-columns='VMI:.metadata.name,ROLE:.metadata.labels.ft\.lockstep\.dev/role,NODE:.status.nodeName,PHASE:.status.phase'
}
client_ok() {
  if [ -n "$CLIENT_PID" ] && ! kill -0 "$CLIENT_PID" 2>/dev/null; then
    tail -3 "$CLIENT_LOG" >&2
    fail "the client stopped: $(grep VIOLATION "$CLIENT_LOG" || echo 'it exited')"
  fi
}

bold "applying the counter VM: a root and a data disk, an L2 VM network, the logging network, the FaultTolerantVM $FTVM"
k apply -f "$ROOT/test/fullstack/testdata/counter-vm.yaml"
protected() {
  [ "$(field .status.state)" = Protected ] && [ "$(field .status.replication.secondary.synchronized)" = true ] &&
    [ "$(field .status.replication.secondary.vmi)" = "$(field .status.secondary.vmi)" ]
}
wait_for "$FTVM reaching Protected" protected
show

bold "a client asks the VM's counter ($VM_ADDR:7777) from its own namespace, all along"
"$ROOT/bin/counter-client" --netns "$("$CLUSTER" netns client)" --addr "$VM_ADDR" >"$CLIENT_LOG" 2>&1 &
CLIENT_PID=$!
replies() { grep -c " ok " "$CLIENT_LOG" || true; }
answering() { [ "$(replies)" -ge 10 ]; }
wait_for "the client's first replies" answering
tail -2 "$CLIENT_LOG"

primary_node="$(field .status.primary.node)"
primary_vmi="$(field .status.primary.vmi)"
secondary_node="$(field .status.secondary.node)"
secondary_vmi="$(field .status.secondary.vmi)"
killed_file="$HOSTS_DIR/$primary_node.killed"
rm -f "$killed_file"
bold "killing $primary_node, the primary's node: its heartbeat, links, QEMU, libvirt and lockstepd die at once"
"$CLUSTER" kill-node "$primary_node"
host_killed() { [ -s "$killed_file" ]; }
wait_for "the host of $primary_node dying" host_killed
kill_ms="$(cat "$killed_file")"
timeline="$(mktemp)"
stamp() { # stamp MS WHAT
  local ms=$(($1 - kill_ms))
  printf '%6d ms  %s\n' "$ms" "$2" >>"$timeline"
}
stamp "$kill_ms" "$primary_node killed (its host off the networks)"

lease_holder() { k get lease "ft-$FTVM" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true; }
secondary_live() { [ "$(lease_holder)" = "$secondary_node/$secondary_vmi" ]; }
wait_for "the secondary going live" secondary_live
acquired="$(k get lease "ft-$FTVM" -o jsonpath='{.spec.acquireTime}')"
stamp "$(date -d "$acquired" +%s%3N)" "secondary $secondary_vmi on $secondary_node won the pair's Lease and went live (lockstepd, --detect=500ms)"

# The client's lines are "<unix ms> ok count=N ...": the last reply before the kill and the first after.
after_kill() { awk -v k="$kill_ms" '$1 >= k && $2 == "ok"' "$CLIENT_LOG" | head -1; }
replied() { [ -n "$(after_kill)" ]; }
wait_for "the client's next reply" replied
before="$(awk -v k="$kill_ms" '$1 < k && $2 == "ok"' "$CLIENT_LOG" | tail -1)"
first="$(after_kill)"
stamp "${first%% *}" "the client's next reply: $(cut -d' ' -f3 <<<"$first") (the last before the kill: $(cut -d' ' -f3 <<<"$before"))"

promoted() { [ "$(field .status.primary.vmi)" = "$secondary_vmi" ]; }
wait_for "the promotion of $secondary_vmi" promoted
stamp "$(now_ms)" "operator promoted $secondary_vmi on lockstepd's report (failovers: $(field .status.failoverCount)); $primary_node is still $(k get node "$primary_node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].reason}') to the API server"

new_secondary() { [ -n "$(field .status.secondary.node)" ] && [ "$(field .status.secondary.vmi)" != "$secondary_vmi" ]; }
wait_for "a new secondary" new_secondary
new_node="$(field .status.secondary.node)"
stamp "$(now_ms)" "new secondary $(field .status.secondary.vmi) placed on $new_node"
# The killed node still reads Ready to the API server; it lost the primary, so it is suspect
# until it proves healthy (docs/operator.md, "Suspect nodes").
[ "$new_node" != "$primary_node" ] || fail "the new secondary was placed on $primary_node, whose host was just killed"

wait_for "$FTVM being Protected again" protected
stamp "$(now_ms)" "Protected again: lockstepd resynchronized the disk and the memory into the new secondary"
sleep 2
client_ok
last="$(grep " ok " "$CLIENT_LOG" | tail -1)"

bold "after the failover"
show
bold "events of $FTVM"
k get events --field-selector involvedObject.name="$FTVM" --sort-by=.metadata.creationTimestamp \
  -o custom-columns='REASON:.reason,FROM:.reportingComponent,MESSAGE:.message' | tail -8 | cut -c1-200
bold "timeline (milliseconds after $primary_node's host died)"
sort -n "$timeline"
rm -f "$timeline"
echo
echo "the client: $(replies) replies, none lost, the boot id unchanged; now at $(cut -d' ' -f3 <<<"$last"), $(awk -v k="$kill_ms" '$1 >= k && $2 == "unanswered"' "$CLIENT_LOG" | wc -l) requests unanswered after the kill"
