#!/usr/bin/env bash
# Postfix's smtp-source, the mail row's load (test/workloads), from Debian 12's postfix package,
# pinned: unpacked, not installed (installing postfix would make this machine a mail server).
# It runs with LD_LIBRARY_PATH at the unpacked usr/lib/postfix, where its libraries are.
#
#   hack/smtp-source.sh -> prints the unpacked root (usr/sbin/smtp-source, usr/lib/postfix),
#                          linked at bin/smtp-source
#
# Cached under ~/.cache/lockstep/smtp-source/<version>.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POSTFIX_VERSION="${POSTFIX_VERSION:-3.7.11-0+deb12u1}"
# shellcheck source=hack/debs.sh
source "$ROOT/hack/debs.sh"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/smtp-source"
OUT="$CACHE/$POSTFIX_VERSION"
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

if [ ! -x "$OUT/x/usr/sbin/smtp-source" ]; then
  echo ">> unpacking postfix $POSTFIX_VERSION for smtp-source" >&2
  work="$(mktemp -d "$CACHE/.build-XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  unpack_debs "$work" "postfix=$POSTFIX_VERSION"
  # Without arguments it prints its usage (and exits 1): it loads and runs.
  usage="$(LD_LIBRARY_PATH="$work/x/usr/lib/postfix" "$work/x/usr/sbin/smtp-source" 2>&1 || true)"
  [[ "$usage" == *usage:* ]] || {
    echo "smtp-source: the unpacked binary does not run here: $usage" >&2
    exit 1
  }
  rm -rf "$OUT" && mkdir -p "$OUT" && mv "$work/x" "$OUT/x"
fi
mkdir -p "$ROOT/bin"
ln -sfn "$OUT/x" "$ROOT/bin/smtp-source"
echo "$OUT/x"
