#!/usr/bin/env bash
# hack/gotest.sh TIER [--ginkgo] [go test args...]: go test (with --ginkgo, the pinned Ginkgo
# CLI's `ginkgo run`, which runs a suite's specs in parallel processes), with its whole output kept in
# bin/test-logs/TIER.log and, when it fails, why it failed printed last: every Ginkgo [FAILED]
# block and go test's failure lines, and the seeds the run printed. A CI log that keeps only its
# tail then still says what failed, with what, and how to repeat it.
set -uo pipefail
tier=$1
shift
logs="$(cd "$(dirname "$0")/.." && pwd)/bin/test-logs"
mkdir -p "$logs"
log="$logs/$tier.log"

runner=(go test)
if [ "${1:-}" = --ginkgo ]; then
  shift
  runner=("$(dirname "$logs")/ginkgo" run)
fi
"${runner[@]}" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 0 ]; then
  exit 0
fi

# Failure blocks, without colour: a Ginkgo [FAILED] line up to its "In [It] at:" line (at most 40
# lines each), and go test's "--- FAIL" lines with the last 30 lines the test logged (t.Log, t.Error).
why() {
  plain | awk '
    /\[(FAILED|PANICKED!?)\] (\[[0-9.]+ seconds\]|in \[)/ { next }
    /\[(FAILED|PANICKED)\]/ && !inblock { inblock = 1; n = 0; panicked = /PANICKED/; print "----"; }
    inblock { print; n++; if ((!panicked && $0 ~ /In \[[A-Za-z]+\] at:/) || /^----------/ || n >= 40) inblock = 0; next }
    /^=== (RUN|CONT)/ { nb = 0 }
    /^[[:space:]]*--- FAIL/ { for (i = (nb > 30 ? nb - 30 : 0); i < nb; i++) print buf[i % 30]; nb = 0; print; gofail = 1; next }
    /^[[:space:]]+[^[:space:]]+\.go:[0-9]+: / { if (gofail) { print; next } buf[nb % 30] = $0; nb++ }
    { gofail = 0 }'
}

# In short, last, for a log that keeps only its tail: each failure's first lines and where, and
# the seeds the run printed.
short() {
  plain | awk '
    /\[(FAILED|PANICKED!?)\] (\[[0-9.]+ seconds\]|in \[)/ { next }
    /\[(FAILED|PANICKED)\]/ && !inblock { inblock = 1; n = 0; panicked = /PANICKED/ }
    inblock { n++; if (n <= 3 || (panicked && n <= 6) || $0 ~ /In \[[A-Za-z]+\] at:/) print; if ((!panicked && $0 ~ /In \[[A-Za-z]+\] at:/) || /^----------/ || n >= 40) inblock = 0; next }
    /^[[:space:]]*--- FAIL/ { print }
    /[Ss]eed [0-9]+/ && !/Random Seed/ && !seen[$0]++ { seeds[ns++] = $0 }
    END { for (i = (ns > 5 ? ns - 5 : 0); i < ns; i++) print "seed: " seeds[i] }'
}

plain() { sed -e 's/\x1b\[[0-9;]*m//g' "$log"; }

{
  echo
  echo "==== $tier failed (${runner[0]##*/} exit $rc); the whole output: $log ===="
  why | tail -n 150
  echo "==== $tier failed, in short ===="
  short | tail -n 12
} >&2
exit "$rc"
