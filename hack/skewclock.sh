#!/usr/bin/env bash
# hack/skewclock.sh OUT PKG: builds the Go program PKG into OUT with its wall clock skewed by
# LOCKSTEP_TEST_CLOCK_SKEW seconds (a signed integer, read once when the program starts; unset or
# 0: no skew), as a machine whose clock is that far off would show it to the program.
#
# The test bed's stand-in for faketime: faketime interposes libc's clock calls, which a Go program
# never makes (the Go runtime reads the clock through the vDSO). So the build interposes the Go
# standard library's time.Now instead, with a build overlay made here from the local Go's own
# source: only the wall reading moves, the monotonic one does not (a clock that is off, not one
# that runs fast), so time.Since, timers and deadlines behave as on the skewed machine, while
# every timestamp the program writes or compares (the API objects it stamps, TLS certificates'
# validity) is read on the skewed clock. The program's own source is the one that ships.
set -euo pipefail
[ $# -eq 2 ] || {
  echo "usage: $0 OUT PKG" >&2
  exit 2
}
out="$1" pkg="$2"
goroot="$(go env GOROOT)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

src="$goroot/src/time/time.go"
anchor=$'\tsec, nsec, mono := runtimeNow()'
[ "$(grep -cxF "$anchor" "$src")" = 1 ] || {
  echo "skewclock: $src has no single line '$anchor' to add the skew after (Go $(go env GOVERSION)); update $0" >&2
  exit 1
}
awk -v anchor="$anchor" '{ print } $0 == anchor { print "\tsec += lockstepClockSkewSeconds" }' "$src" >"$work/time.go"
cat >"$work/lockstep_clock_skew.go" <<'EOF'
package time

import "syscall"

// lockstepClockSkewSeconds moves Now's wall reading (hack/skewclock.sh).
var lockstepClockSkewSeconds = func() int64 {
	v, _ := syscall.Getenv("LOCKSTEP_TEST_CLOCK_SKEW")
	var n int64
	neg := len(v) > 0 && v[0] == '-'
	if neg || len(v) > 0 && v[0] == '+' {
		v = v[1:]
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			panic("LOCKSTEP_TEST_CLOCK_SKEW is not a whole number of seconds")
		}
		n = n*10 + int64(v[i]-'0')
	}
	if neg {
		return -n
	}
	return n
}()
EOF
printf '{"Replace":{"%s":"%s","%s":"%s"}}\n' "$src" "$work/time.go" "$goroot/src/time/lockstep_clock_skew.go" "$work/lockstep_clock_skew.go" >"$work/overlay.json"
go build -overlay "$work/overlay.json" -o "$out" "$pkg"
