#!/usr/bin/env bash
# make lint-manifests: judges from outside the project over what users install. Every manifest
# a user can apply is rendered (the chart with its default and with non-default values,
# config/default, config/prometheus, config/kubevirt, the samples) and judged by
#   - kubeconform -strict, against schemas generated here from the pinned kube-apiserver and the
#     CRDs it serves (hack/kubeschemas): a field that is misspelt, misplaced or of the wrong type;
#   - kube-score, the workloads' hygiene: security contexts, seccomp, probes, resources,
#     disruption budgets, anti-affinity, network policies. hack/kube-score-exceptions lists each
#     check it skips, with the reason; everything else must pass, warnings included.
# Each judge is first shown manifests it must refuse.
# Needs bin/k8s (make envtest-assets) and bin/test-crds (make test-crds).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN="$ROOT/bin"
OUT="$BIN/judges"
KUBE_VERSION=1.37.1
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
cd "$ROOT"
"$ROOT/hack/tools.sh" kubeconform kube-score helm kustomize

rm -rf "$OUT"
mkdir -p "$OUT"
"$BIN/helm" template lockstep charts/lockstep --namespace lockstep-system --kube-version "$KUBE_VERSION" >"$OUT/chart-default.yaml"
"$BIN/helm" template ft charts/lockstep --namespace ft-system --kube-version "$KUBE_VERSION" \
  --values test/install/testdata/values-nondefault.yaml >"$OUT/chart-nondefault.yaml"
for k in default prometheus kubevirt samples; do
  "$BIN/kustomize" build "config/$k" >"$OUT/config-$k.yaml"
done

go run ./hack/kubeschemas -out "$OUT/schemas"

# The judge must be able to fail: a field misspelt and one misplaced are each refused.
cat >"$OUT/probe-misspelt.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: probe}
spec:
  replica: 2
  selector: {matchLabels: {app: probe}}
  template:
    metadata: {labels: {app: probe}}
    spec: {containers: [{name: c, image: probe:1}]}
YAML
cat >"$OUT/probe-misplaced.yaml" <<'YAML'
apiVersion: ft.lockstep.dev/v1alpha1
kind: FaultTolerantVM
metadata: {name: probe}
spec:
  loggingNetwork: {name: ft-logging, interval: 1s}
  template: {spec: {domain: {devices: {}}}}
YAML
for probe in "$OUT"/probe-*.yaml; do
  if "$BIN/kubeconform" -strict -schema-location "$OUT/schemas/{{ .Group }}/{{ .ResourceAPIVersion }}/{{ .ResourceKind }}.json" "$probe" >/dev/null; then
    echo "kubeconform -strict took $probe, which it must refuse" >&2
    exit 1
  fi
  rm "$probe"
done
echo ">> kubeconform -strict"
"$BIN/kubeconform" -strict -summary -kubernetes-version "$KUBE_VERSION" \
  -schema-location "$OUT/schemas/{{ .Group }}/{{ .ResourceAPIVersion }}/{{ .ResourceKind }}.json" \
  "$OUT"/*.yaml

echo ">> kube-score"
told=()
while read -r entry _; do
  case "$entry" in
    ''|'#'*) ;;
    --*) told+=("$entry") ;;
    *) told+=(--ignore-test "$entry") ;;
  esac
done <hack/kube-score-exceptions
score() {
  "$BIN/kube-score" score --kubernetes-version "v${KUBE_VERSION%.*}" --output-format ci --exit-one-on-warning \
    --enable-optional-test container-seccomp-profile "${told[@]}" "$@"
}
# A Deployment that runs as root without probes or a memory limit.
cat >"$OUT/probe-bare.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: probe}
spec:
  replicas: 1
  selector: {matchLabels: {app: probe}}
  template:
    metadata: {labels: {app: probe}}
    spec: {containers: [{name: c, image: probe:1}]}
YAML
if score "$OUT/probe-bare.yaml" >/dev/null; then
  echo "kube-score passed $OUT/probe-bare.yaml, which it must refuse" >&2
  exit 1
fi
rm "$OUT/probe-bare.yaml"
score "$OUT"/chart-*.yaml "$OUT"/config-*.yaml
