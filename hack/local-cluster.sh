#!/usr/bin/env bash
# A local cluster for end-to-end tests and the demo: a real kube-apiserver, etcd,
# kube-controller-manager and kube-scheduler (built from source by build-k8s-binaries.sh) with
# kwok-simulated nodes, run by kwokctl's binary runtime; the KubeVirt, NAD, cert-manager and
# monitoring CRDs; the lockstep operator running as a process with its own ServiceAccount's RBAC
# (and, as root, in a memory cgroup with its Deployment's memory limit); KubeVirt v1.9.0's own
# virt-api (built from source, hack/build-kubevirt.sh) with KubeVirt's CRDs, RBAC and webhooks from
# its install strategy and the KubeVirt CR of hack/local-cluster-kubevirt.yaml, run by
# test/kubevirtcontrol's kubevirt-control as virt-operator would; and the KubeVirt TEST DOUBLE
# (test/kubevirtdouble) for the rest of KubeVirt (virt-controller's launcher pods, virt-handler and
# virt-launcher), the only fake in the loop. Nothing is downloaded but Go modules (and, with
# FULL_STACK=1, the Debian packages hack/ pins).
#
# FULL_STACK=1 (needs root) runs every part: each node gets a host (a network namespace
# <cluster>_<node>, on a VM network, a logging network and a node network that a switch namespace
# <cluster>_sw joins) running lockstepd as its DaemonSet would (config/lockstepd, the real binary,
# its pod's token, its certificate from the operator's signer); the operator runs with --colo; and
# the KubeVirt double boots each member VMI on its node's host through lockstep's KubeVirt hook and
# a libvirt daemon of its own, following its launcher pod as config/kubevirt's policies admitted it
# (the member directory, and lockstep's QEMU image, hack/qemu-image.sh, pulled from an OCI archive
# under bin/local-cluster/), with the Debian guest booting from its disk (hack/debian-guest.sh,
# hack/libvirt.sh). A client namespace <cluster>_client is on the VM network at 10.214.0.1.
#
#   hack/local-cluster.sh up [NODES]        start (idempotent) with NODES nodes (default 6)
#   hack/local-cluster.sh down              stop and remove everything (idempotent)
#   hack/local-cluster.sh kubeconfig        print the kubeconfig path
#   hack/local-cluster.sh add-node NAME [ZONE]  add a node (idempotent)
#   hack/local-cluster.sh kill-node NAME... the nodes' hosts die at once: kwok stops simulating them (and with
#                                           FULL_STACK, its QEMUs, libvirt daemons, lockstepd and
#                                           links die with its namespace)
#   hack/local-cluster.sh revive-node NAME  simulate it again: the host came back (empty)
#   hack/local-cluster.sh silence-node NAME the node loses only its heartbeat: kwok stops, the host
#                                           runs on (revive-node ends it)
#   hack/local-cluster.sh cut-api NAME | heal-api NAME
#                                           FULL_STACK: cut (restore) the host's path to the control
#                                           plane, as a network would: its heartbeat stops, lockstepd
#                                           loses the API server, its kubelet sees nothing (what is
#                                           deleted meanwhile runs on until healed); the VM and
#                                           logging networks stay up
#   hack/local-cluster.sh skew-clock NAME SECONDS
#                                           FULL_STACK: the host's clock is SECONDS off (0: right):
#                                           its lockstepd restarts on a wall clock that far off
#                                           (hack/skewclock.sh; the host's other programs keep
#                                           the machine's clock)
#   hack/local-cluster.sh partition-node NAME | heal-node NAME
#                                           FULL_STACK: cut (restore) the node's logging link
#   hack/local-cluster.sh netns client|NODE print a namespace's name (FULL_STACK)
#   hack/local-cluster.sh start|stop|kill operator|kubevirt-double|kubevirt-control
#                                           manage a process (stop: SIGTERM; kill: SIGKILL)
#   hack/local-cluster.sh logs operator|kubevirt-double|kubevirt-control|virt-api   print the process's log path
#   hack/local-cluster.sh pid operator|kubevirt-double|kubevirt-control|kube-apiserver|etcd|...  print its pid
#   hack/local-cluster.sh helm ARGS...      run helm against the cluster
#
# INSTALL=helm installs lockstep with `helm upgrade --install` of charts/lockstep and the values
# of hack/local-cluster-values.yaml (HELM_VALUES: more values files) instead of config/local. kwok
# runs no containers, so the operator runs as a process with the args of the chart's Deployment
# (read back from the API: a `helm upgrade` followed by `stop`/`start operator` is a rollout), its
# webhook certificate from the chart's Secret, and its webhooks, which the API server calls on
# loopback (the chart's webhook.url). With FULL_STACK too, the chart's lockstepd and launcher
# policies, COLO and the logging network (hack/local-cluster-values-fullstack.yaml).
#
# Environment: CLUSTER_NAME (default lockstep), NODE_LOST_GRACE (operator, default 10s; with
# INSTALL=helm it sets the chart's operator.nodeLostGrace), OPERATOR_ARGS (more operator flags),
# FULL_STACK, INSTALL, HELM_VALUES, LOCKSTEP_CACHE, KWOKCTL_CONFIG (kwokctl's configuration, default
# hack/kwokctl.yaml; @CLUSTER_DIR@ in it stands for the cluster's directory).
#
# (kwokctl v0.8.0 panics on --extra-args for kwok-controller, cluster.go:253: hence the file.)
#
# Nodes carry realistic capacity (16 CPUs, 64 GiB, 100 GiB of ephemeral storage: a kubelet reports
# it, and lockstep's pods request some), hostname and zone labels (zone-a/b/c in turn).
# hack/kwokctl.yaml makes a lost node show within seconds (node monitor period 2s, grace
# 8s); `kill-node` stops kwok's simulation of one node (see kill_node).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME="${CLUSTER_NAME:-lockstep}"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}"
export KWOK_WORKDIR="${KWOK_WORKDIR:-$CACHE/kwok}"
CLUSTER_DIR="$KWOK_WORKDIR/clusters/$NAME"
KUBECONFIG_PATH="$CLUSTER_DIR/kubeconfig.yaml"
RUN_DIR="$CLUSTER_DIR/lockstep" # pid files, logs and the operator's kubeconfig
HOSTS_DIR="/run/lockstep-hosts/$NAME" # FULL_STACK: the hosts' directories (short: socket paths)
QEMU_ARCHIVE="$ROOT/bin/local-cluster/$NAME/lockstep-qemu.oci.tar" # FULL_STACK: the image config/kubevirt mounts, which the double pulls
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
  if helm_install; then "$ROOT/hack/tools.sh" helm; fi
  "$ROOT/hack/test-crds.sh"
  make -s -C "$ROOT" kubevirt-assets >/dev/null # KubeVirt's binaries and install strategy (cached)
  (cd "$ROOT" && go build -o bin/lockstep-operator ./cmd/lockstep-operator &&
    go build -o bin/kubevirt-double ./test/kubevirtdouble/cmd/kubevirt-double &&
    go build -o bin/kubevirt-control ./test/kubevirtcontrol/cmd/kubevirt-control)
  if full_stack; then
    [ "$(id -u)" = 0 ] || { echo "FULL_STACK=1 needs root (network namespaces, QEMU, libvirtd)" >&2; exit 1; }
    # lockstep's QEMU, as the image that config/kubevirt mounts into members' launcher pods, under
    # the reference the policy names; the double pulls it from this archive.
    mkdir -p "$(dirname "$QEMU_ARCHIVE")"
    "$ROOT/hack/qemu-image.sh" --oci "$QEMU_ARCHIVE" "$(qemu_image_ref)" >/dev/null
    "$ROOT/hack/debian-guest.sh" >/dev/null
    "$ROOT/hack/libvirt.sh" >/dev/null
    (cd "$ROOT" && go build -o bin/lockstepd ./cmd/lockstepd &&
      mkdir -p bin/skewclock && hack/skewclock.sh bin/skewclock/lockstepd ./cmd/lockstepd &&
      go build -o bin/lockstep-kubevirt-hook ./cmd/lockstep-kubevirt-hook &&
      go build -o bin/counter-client ./test/counter/cmd/counter-client &&
      go build -o bin/kubectl-ftvm ./cmd/kubectl-ftvm)
  fi
  if ! exists; then
    "$ROOT/bin/kwokctl" create cluster --name "$NAME" --runtime binary \
      --kube-apiserver-binary "$K8S/kube-apiserver" \
      --kube-controller-manager-binary "$K8S/kube-controller-manager" \
      --kube-scheduler-binary "$K8S/kube-scheduler" \
      --etcd-binary "$K8S/etcd" \
      --kwok-controller-binary "$ROOT/bin/kwok" \
      --config "$(kwokctl_config)" \
      --kubeconfig "" --wait 2m
  else
    "$ROOT/bin/kwokctl" start cluster --name "$NAME" --wait 2m
  fi
  local zones=(a b c)
  for i in $(seq 1 "$nodes"); do node_yaml "node-$i" "zone-${zones[(i - 1) % 3]}"; done | kubectl apply -f - >/dev/null
  start kubevirt-control
  install
  wait_virt_api
  start kubevirt-double
  start operator
  if full_stack; then wait_hosts "$nodes"; fi
  echo ">> cluster $NAME up: $nodes nodes, KubeVirt's virt-api, the lockstep operator and the KubeVirt test double running" >&2
  echo ">> export KUBECONFIG=$KUBECONFIG_PATH" >&2
}

# kwokctl_config: kwokctl's configuration for this cluster, its @CLUSTER_DIR@ filled in.
kwokctl_config() {
  local out="$ROOT/bin/local-cluster/$NAME/kwokctl.yaml"
  mkdir -p "$(dirname "$out")"
  sed "s|@CLUSTER_DIR@|$CLUSTER_DIR|g" "${KWOKCTL_CONFIG:-$ROOT/hack/kwokctl.yaml}" >"$out"
  echo "$out"
}

# install: the third-party CRDs (KubeVirt's come from kubevirt-control, as virt-operator applies
# them), the KubeVirt CR as a user sets it, then lockstep's CRD, RBAC, namespace and PriorityClass.
install() {
  local d
  for d in multus cert-manager monitoring; do
    kubectl apply --server-side --force-conflicts -f "$ROOT/bin/test-crds/$d" >/dev/null
  done
  local established=""
  for _ in $(seq 1 240); do
    established="$(kubectl get crd kubevirts.kubevirt.io -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null || true)"
    [ "$established" = True ] && break
    running kubevirt-control || break
    sleep 0.5
  done
  [ "$established" = True ] || { echo ">> KubeVirt's CRDs are not there (kubevirt-control ended, or 2 minutes passed): see $RUN_DIR/kubevirt-control.log" >&2; exit 1; }
  kubectl apply -f "$ROOT/hack/local-cluster-kubevirt.yaml" >/dev/null
  if helm_install; then
    local values=(-f "$ROOT/hack/local-cluster-values.yaml") f
    if full_stack; then values+=(-f "$ROOT/hack/local-cluster-values-fullstack.yaml"); fi
    for f in ${HELM_VALUES:-}; do values+=(-f "$f"); done
    if [ -n "${NODE_LOST_GRACE:-}" ]; then values+=(--set "operator.nodeLostGrace=$NODE_LOST_GRACE"); fi
    helm upgrade --install lockstep "$ROOT/charts/lockstep" -n lockstep-system --create-namespace "${values[@]}" >/dev/null
  else
    "$ROOT/bin/kustomize" build "$ROOT/config/local" | kubectl apply --server-side --force-conflicts -f - >/dev/null
  fi
  if full_stack; then
    # lockstepd, and what members' launcher pods get: the member directory and lockstep's QEMU
    # (the chart holds them; kustomize users apply them beside config/default).
    local c
    if ! helm_install; then
      for c in lockstepd kubevirt; do
        "$ROOT/bin/kustomize" build "$ROOT/config/$c" | kubectl apply --server-side --force-conflicts -f - >/dev/null
      done
      # The logging network lockstepd attaches, which a kustomize user creates (config/default
      # says so), with the one configuration the chart's values give it.
      local net
      net="$(sed -n "s/^  config: '\(.*\)'$/\1/p" "$ROOT/hack/local-cluster-values-fullstack.yaml")"
      [ -n "$net" ] || { echo ">> no loggingNetwork.config in hack/local-cluster-values-fullstack.yaml" >&2; exit 1; }
      kubectl apply -f - >/dev/null <<NAD
apiVersion: k8s.cni.cncf.io/v1
kind: NetworkAttachmentDefinition
metadata: {name: ft-logging, namespace: lockstep-system}
spec:
  config: '$net'
NAD
    fi
    wait_launcher_policies
  fi
  kubectl wait --for condition=Established --timeout 60s crd --all >/dev/null
}

# wait_hosts N: until the hosts of node-1..N are up, each with its lockstepd running, so that a VM
# applied as soon as `up` returns lands on hosts that are there.
wait_hosts() {
  local i ns pid missing
  for _ in $(seq 1 600); do
    missing=()
    for i in $(seq 1 "$1"); do
      ns="${NAME}_node-$i"
      ip netns list | grep -q "^$ns\b" || { missing+=("node-$i"); continue; }
      for pid in $(ip netns pids "$ns" 2>/dev/null); do
        [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = lockstepd ] && continue 2
      done
      missing+=("node-$i")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    sleep 0.2
  done
  echo ">> the hosts of ${missing[*]} are not up after 2 minutes: see $RUN_DIR/kubevirt-double.log" >&2
  exit 1
}

# wait_virt_api: until kubevirt-control has virt-api serving and its webhooks installed (it
# installs them once virt-api answers): VMIs are admitted by KubeVirt from then on.
wait_virt_api() {
  for _ in $(seq 1 240); do
    kubectl get validatingwebhookconfiguration virt-api-validator >/dev/null 2>&1 && return 0
    running kubevirt-control || break
    sleep 0.5
  done
  echo ">> virt-api is not serving (kubevirt-control ended, or 2 minutes passed): see $RUN_DIR/kubevirt-control.log" >&2
  exit 1
}

# skew_clock NODE SECONDS: the host's clock is SECONDS off from now on (0: right again). Its
# lockstepd restarts, as the kubelet restarts a container that exited, and reads the clock then.
skew_clock() {
  full_stack || { echo "skew-clock needs FULL_STACK=1" >&2; exit 2; }
  [[ "$2" =~ ^[-+]?[0-9]+$ ]] || { echo "skew-clock $1 $2: SECONDS is a whole number" >&2; exit 2; }
  local file="$HOSTS_DIR/$1.clock-skew"
  [ "$(cat "$file" 2>/dev/null || echo 0)" = "$2" ] && return 0 # already so: nothing restarts
  echo "$2" >"$file"
  local pid
  for pid in $(ip netns pids "${NAME}_$1" 2>/dev/null); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = lockstepd ] && kill -TERM "$pid"
  done
  return 0
}

full_stack() { [ -n "${FULL_STACK:-}" ] && [ "${FULL_STACK}" != 0 ]; }
helm_install() { [ "${INSTALL:-}" = helm ]; }
helm() { "$ROOT/bin/helm" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

# helm_operator_args: the args of the chart's operator Deployment, then what a process outside the
# cluster needs instead (flags given later win); its webhook certificate goes to RUN_DIR.
helm_operator_args() {
  local dir="$RUN_DIR/webhook-certs" key
  mkdir -p "$dir"
  for key in tls.crt tls.key; do
    kubectl -n lockstep-system get secret lockstep-webhook-tls -o "jsonpath={.data.${key//./\\.}}" | base64 -d >"$dir/$key"
  done
  chmod 600 "$dir/tls.key"
  kubectl -n lockstep-system get deployment lockstep-operator \
    -o go-template='{{range (index .spec.template.spec.containers 0).args}}{{.}}{{"\n"}}{{end}}'
  printf '%s\n' --kubeconfig "$RUN_DIR/operator.kubeconfig" --leader-election-namespace lockstep-system \
    --metrics-bind-address 0 --health-probe-bind-address 0 --webhook-cert-dir "$dir"
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
# qemu_image_ref: the image that config/kubevirt's policy mounts into members' launcher pods.
qemu_image_ref() {
  sed -n 's/.*image: Object.spec.volumes.image{reference: "\([^"]*\)".*/\1/p' "$ROOT/config/kubevirt/member-qemu-policy.yaml"
}

# wait_launcher_policies: a MutatingAdmissionPolicy is in force a moment after it is created; the
# launcher pod of a member created before then would get neither its directory nor lockstep's
# QEMU. A server-side dry run of a member's launcher pod shows when both are.
wait_launcher_policies() {
  local i vols
  for i in $(seq 1 60); do
    vols=" $(kubectl create --dry-run=server -o jsonpath='{.spec.volumes[*].name}' -f - 2>/dev/null <<POD || true
apiVersion: v1
kind: Pod
metadata:
  namespace: default
  generateName: virt-launcher-policy-check-
  labels: {kubevirt.io: virt-launcher, ft.lockstep.dev/pair: policy-check, kubevirt.io/created-by: policy-check}
spec:
  containers: [{name: compute, image: virt-launcher}]
POD
) "
    if [[ "$vols" == *" lockstep-member "* && "$vols" == *" lockstep-qemu "* ]]; then return 0; fi
    sleep 0.5
  done
  echo ">> the launcher pod policies of config/kubevirt are not in force after 30 s" >&2
  return 1
}

start() {
  mkdir -p "$RUN_DIR"
  if running "$1"; then return 0; fi
  local cmd
  case "$1" in
    operator)
      operator_kubeconfig
      if helm_install; then
        local args
        mapfile -t args < <(helm_operator_args)
        # shellcheck disable=SC2206 # OPERATOR_ARGS is a list of flags
        cmd=("$ROOT/bin/lockstep-operator" "${args[@]}" ${OPERATOR_ARGS:-})
      else
      # shellcheck disable=SC2206 # OPERATOR_ARGS is a list of flags
      cmd=("$ROOT/bin/lockstep-operator" --kubeconfig "$RUN_DIR/operator.kubeconfig"
        --leader-elect --leader-election-namespace lockstep-system --metrics-bind-address 0 --health-probe-bind-address 0
        --node-lost-grace "${NODE_LOST_GRACE:-10s}" --retry-interval 10s --webhooks=false ${OPERATOR_ARGS:-})
      fi
      if full_stack; then cmd+=(--colo); fi ;;
    kubevirt-control)
      cmd=("$ROOT/bin/kubevirt-control" --kubeconfig "$KUBECONFIG_PATH" --bin "$ROOT/bin/kubevirt" --dir "$RUN_DIR/kubevirt") ;;
    kubevirt-double)
      cmd=("$ROOT/bin/kubevirt-double" --kubeconfig "$KUBECONFIG_PATH" --kubevirt-service-account kubevirt:kubevirt-controller)
      if full_stack; then
        cmd+=(--hosts --cluster "$NAME" --hosts-dir "$HOSTS_DIR" --lockstepd "$ROOT/bin/lockstepd" --lockstepd-skew-clock "$ROOT/bin/skewclock/lockstepd"
          --kubevirt-hook "$ROOT/bin/lockstep-kubevirt-hook" --qemu "$("$ROOT/hack/qemu.sh")" --guest "$("$ROOT/hack/debian-guest.sh")"
          --images "$QEMU_ARCHIVE")
      fi ;;
    *) echo "unknown process $1 (operator, kubevirt-double, kubevirt-control)" >&2; exit 2 ;;
  esac
  echo "--- $(date -u +%FT%TZ) start: ${cmd[*]}" >>"$RUN_DIR/$1.log"
  local cg="" limit
  if [ "$1" = operator ]; then
    limit="$(operator_memory_limit)"
    cg="$(memory_cgroup operator "$limit")"
  fi
  if [ -n "$cg" ]; then
    echo "$cg" >"$RUN_DIR/$1.cgroup"
    echo "--- in memory cgroup $cg (limit $limit)" >>"$RUN_DIR/$1.log"
    # shellcheck disable=SC2016 # $$ and $@ are the inner shell's
    setsid sh -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" "${cmd[@]}" </dev/null >>"$RUN_DIR/$1.log" 2>&1 &
  else
    setsid "${cmd[@]}" </dev/null >>"$RUN_DIR/$1.log" 2>&1 &
  fi
  echo $! >"$RUN_DIR/$1.pid"
  if [ "$1" = operator ] && helm_install; then wait_webhook; fi
}

# wait_webhook: until the operator accepts connections on the webhook port the chart's webhook.url names
# (the API server calls it there): FaultTolerantVM writes fail until then, as in a cluster whose
# every operator replica is starting.
wait_webhook() {
  local url port
  url="$(helm get values lockstep -n lockstep-system --all -o json | sed -n 's/.*"url":"\(https:[^"]*\)".*/\1/p')"
  port="${url##*:}"
  port="${port%%/*}"
  for _ in $(seq 1 120); do
    if timeout 1 bash -c "</dev/tcp/127.0.0.1/${port:-9443}" 2>/dev/null; then return 0; fi
    running operator || break
    sleep 0.5
  done
  echo ">> the operator does not answer on its webhook port ${port:-9443}: see $RUN_DIR/operator.log" >&2
  return 1
}

# operator_memory_limit: the memory limit of the operator's Deployment (the chart's, read back
# from the API, or config/manager's), as Kubernetes writes it (256Mi).
operator_memory_limit() {
  if helm_install; then
    kubectl -n lockstep-system get deployment lockstep-operator \
      -o jsonpath='{.spec.template.spec.containers[0].resources.limits.memory}'
  else
    sed -n 's/.*limits: *{ *memory: *\([0-9A-Za-z]*\) *}.*/\1/p' "$ROOT/config/manager/manager.yaml" | head -1
  fi
}

# memory_cgroup NAME LIMIT: a memory cgroup of the cluster's own (cgroup v1 or v2) limited to
# LIMIT, for a process that runs in a container with that limit in a cluster: the container
# runtime would put it in one, the process reads its limit there, and the kernel enforces it.
# Prints its path, or nothing (with a note on stderr) where none can be made: not root, no
# memory controller, or no limit.
memory_cgroup() {
  local bytes dir
  [ -n "$2" ] && [ "$(id -u)" = 0 ] || return 0
  bytes="$(numfmt --from=iec-i "$2" 2>/dev/null || numfmt --from=si "$2" 2>/dev/null || true)"
  [ -n "$bytes" ] || { echo ">> no memory cgroup for $1: cannot read the limit '$2'" >&2; return 0; }
  if [ -d /sys/fs/cgroup/memory ]; then # cgroup v1
    dir="/sys/fs/cgroup/memory$(awk -F: '$2 == "memory" {print $3}' /proc/self/cgroup)/lockstep-$NAME-$1"
    dir="${dir//\/\//\/}"
    mkdir -p "$dir" && echo "$bytes" >"$dir/memory.limit_in_bytes" && echo "$dir" && return 0
  elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then # cgroup v2
    dir="/sys/fs/cgroup/lockstep-$NAME-$1"
    mkdir -p "$dir" && echo "$bytes" >"$dir/memory.max" && echo "$dir" && return 0
  fi
  echo ">> no memory cgroup for $1 on this machine: it runs without its limit" >&2
}

# remove_memory_cgroup NAME: the cgroup that start put the process in, once the process is gone.
remove_memory_cgroup() {
  local f="$RUN_DIR/$1.cgroup"
  [ -f "$f" ] || return 0
  rmdir "$(cat "$f")" 2>/dev/null || true
  rm -f "$f"
}

# pid_of NAME: the pid of a process of the cluster: operator, kubevirt-double, kubevirt-control, or
# one of kwokctl's components (kube-apiserver, etcd, ...).
pid_of() {
  case "$1" in
    operator|kubevirt-double|kubevirt-control) cat "$RUN_DIR/$1.pid" ;;
    *) cat "$CLUSTER_DIR/pids/$1.pid" ;;
  esac
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
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  remove_memory_cgroup "$1"
}

# add_node NAME ZONE: a kwok node with realistic capacity.
add_node() { node_yaml "$1" "$2" | kubectl apply -f - >/dev/null; }

# node_yaml NAME ZONE: the node's manifest (a document of a stream).
node_yaml() {
  cat <<EOF
---
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
  allocatable: {cpu: "16", memory: 64Gi, ephemeral-storage: 100Gi, pods: "110"}
  capacity: {cpu: "16", memory: 64Gi, ephemeral-storage: 100Gi, pods: "110"}
EOF
}

# kill_node NAME: the node's host dies. kwok simulates a node only while it holds the node's
# Lease (kube-node-lease), so another holder with a long lease silences it: no more heartbeats,
# status or pod updates, and the node lifecycle controller marks it unreachable after its grace.
# revive-node deletes that Lease; kwok creates it again and the node comes back Ready.
kill_node() { set_lease_holder "$1" lockstep-killed-node; }

# kill_nodes NAME...: the hosts of several nodes die at once.
kill_nodes() {
  local n pids=()
  for n in "$@"; do kill_node "$n" & pids+=($!); done
  for n in "${pids[@]}"; do wait "$n"; done
}

# set_lease_holder NAME HOLDER: another holder of the node's kwok Lease (see kill_node).
set_lease_holder() {
  local now
  now="$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ)"
  kubectl -n kube-node-lease patch lease "$1" --type merge >/dev/null -p \
    "{\"spec\":{\"holderIdentity\":\"$2\",\"leaseDurationSeconds\":86400,\"renewTime\":\"$now\"}}"
}

# logging_link NAME up|down: the node's link into the logging network (FULL_STACK).
logging_link() {
  ip -n "${NAME}_$1" link set ftlog "$2"
}

down() {
  stop operator TERM
  stop kubevirt-double TERM # it takes the hosts down with it
  stop kubevirt-control TERM # and virt-api with it
  if [ -x "$ROOT/bin/kwokctl" ] && exists; then
    "$ROOT/bin/kwokctl" delete cluster --name "$NAME"
  fi
  # What a killed double left: its namespaces (<cluster>_*) and directories.
  if command -v ip >/dev/null && [ "$(id -u)" = 0 ]; then
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${NAME}_" || true); do
      ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
      ip netns delete "$ns" 2>/dev/null || true
    done
    rm -rf "$HOSTS_DIR"
    # The members' launcher cgroups (test/virtlauncher) that the killed processes left (rmdir
    # removes only those without processes).
    find /sys/fs/cgroup -maxdepth 6 -type d -name 'lockstep-launcher-*' -exec rmdir {} + 2>/dev/null || true
  fi
  rm -rf "$RUN_DIR"
}

usage() {
  echo "usage: $0 up [NODES] | down | kubeconfig | add-node NAME [ZONE] | kill-node NAME... | revive-node|silence-node NAME | pid NAME" \
    "| partition-node|heal-node NAME | cut-api|heal-api NAME | skew-clock NAME SECONDS | netns client|NODE | start|stop|kill operator|kubevirt-double|kubevirt-control | logs operator|kubevirt-double|kubevirt-control|virt-api|COMPONENT | helm ARGS..." >&2
  exit 2
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  kubeconfig) echo "$KUBECONFIG_PATH" ;;
  add-node) add_node "$2" "${3:-zone-a}" ;;
  kill-node) shift; kill_nodes "$@" ;;
  revive-node) kubectl -n kube-node-lease delete lease "$2" --ignore-not-found >/dev/null ;;
  silence-node) set_lease_holder "$2" lockstep-silenced-node ;;
  cut-api) set_lease_holder "$2" lockstep-cut-node ;;
  skew-clock) skew_clock "$2" "$3" ;;
  heal-api) kubectl -n kube-node-lease delete lease "$2" --ignore-not-found >/dev/null ;;
  partition-node) logging_link "$2" down ;;
  heal-node) logging_link "$2" up ;;
  netns) echo "${NAME}_$2" ;;
  start) start "$2" ;;
  stop) stop "$2" TERM ;;
  kill) stop "$2" KILL ;;
  logs) case "$2" in operator|kubevirt-double|kubevirt-control) echo "$RUN_DIR/$2.log" ;; virt-api) echo "$RUN_DIR/kubevirt/virt-api/virt-api.log" ;; *) echo "$CLUSTER_DIR/logs/$2.log" ;; esac ;;
  pid) pid_of "$2" ;;
  helm) shift; helm "$@" ;;
  *) usage ;;
esac
