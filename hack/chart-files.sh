#!/usr/bin/env bash
# Copies into charts/lockstep what the chart takes from config/, so that there is one source of
# each: the CRD, the RBAC (the operator's generated from its markers), the webhook configurations
# (generated from internal/admission's markers), the admission policies, the KubeVirt Plugin, and
# the monitoring. Run by `make manifests`; `make verify` fails when the copies are stale.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
KUSTOMIZE="${KUSTOMIZE:-$ROOT/bin/kustomize}"
chart="$ROOT/charts/lockstep"
cd "$ROOT"
mkdir -p "$chart/crds" "$chart/files"
cp config/crd/bases/ft.lockstep.dev_faulttolerantvms.yaml config/crd/bases/ft.lockstep.dev_faulttolerantvmoperations.yaml "$chart/crds/"
{
  "$KUSTOMIZE" build config/rbac
  for f in config/lockstepd/rbac/service_account.yaml config/lockstepd/rbac/role.yaml config/lockstepd/rbac/role_binding.yaml; do
    echo "---"
    grep -v '^---$' "$f"
  done
} >"$chart/files/rbac.yaml"
cp config/webhook/manifests.yaml "$chart/files/webhooks.yaml"
cp config/lockstepd/admission-policy.yaml "$chart/files/lockstepd-admission-policy.yaml"
cp config/adoption/adopted-vm-policy.yaml "$chart/files/adopted-vm-policy.yaml"
cp config/kubevirt/member-directory-policy.yaml "$chart/files/member-directory-policy.yaml"
cp config/kubevirt/member-qemu-policy.yaml "$chart/files/member-qemu-policy.yaml"
cp config/kubevirt-plugin/plugin.yaml "$chart/files/kubevirt-plugin.yaml"
cp config/prometheus/rules.yaml "$chart/files/prometheus-rules.yaml"
cp config/prometheus/monitors.yaml "$chart/files/monitors.yaml"
cp config/prometheus/dashboard.json "$chart/files/dashboard.json"
