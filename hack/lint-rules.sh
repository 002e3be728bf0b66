#!/usr/bin/env bash
# Proves that .golangci.yml's depguard rules hold: for each rule it drops a probe file with the
# import the rule forbids into a package the rule covers, and expects golangci-lint to refuse it
# with that rule's name. The probes are removed whatever happens.
set -euo pipefail
lint=${GOLANGCI_LINT:-bin/golangci-kal}
cd "$(dirname "$0")/.."
mod=github.com/lockstep-dev/lockstep
probes=()
trap 'rm -f "${probes[@]}"' EXIT

# rule  package-dir  forbidden-import
checks=(
  "internal-not-operator internal/relay $mod/controllers"
  "engines-not-daemon internal/colo $mod/internal/lockstepd"
  "agent-without-kubernetes internal/agent sigs.k8s.io/controller-runtime/pkg/client"
  "agent-without-kubernetes internal/agent $mod/internal/arbiter"
  "operator-not-daemon controllers $mod/internal/lockstepd"
  "operator-not-daemon internal/admission $mod/internal/lockstepd"
  "rules-pure internal/validation sigs.k8s.io/controller-runtime/pkg/client"
  "rules-pure internal/placement k8s.io/client-go/rest"
  "decisions-pure internal/roles k8s.io/apimachinery/pkg/types"
  "decisions-pure internal/operations sigs.k8s.io/controller-runtime/pkg/client"
  "nodecert-pure internal/nodecert k8s.io/api/certificates/v1"
  "nodecert-pure internal/nodecert os"
)
fail=0
for c in "${checks[@]}"; do
  read -r rule dir imp <<<"$c"
  pkg=$(go list -f '{{.Name}}' "./$dir")
  probe="$dir/zz_depguard_probe.go"
  probes+=("$probe")
  printf 'package %s\n\nimport _ "%s"\n' "$pkg" "$imp" >"$probe"
  out=$("$lint" run --enable-only depguard "./$dir/" 2>&1 || true)
  rm -f "$probe"
  if grep -q "$rule" <<<"$out"; then
    echo "depguard $rule: refuses $imp in $dir"
  else
    echo "depguard $rule: accepted $imp in $dir:"; echo "$out"; fail=1
  fi
done
exit $fail
