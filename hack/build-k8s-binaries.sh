#!/usr/bin/env bash
# Builds pinned Kubernetes control-plane binaries and etcd from source through the Go module proxy,
# because setup-envtest and kwokctl cannot download release binaries on these machines.
#
#   hack/build-k8s-binaries.sh [component ...]   (default: kube-apiserver etcd)
#
# components: kube-apiserver kube-controller-manager kube-scheduler kubectl etcd
# Binaries are cached under ~/.cache/lockstep/k8s/<version>/ and linked into bin/k8s/, so a
# second run is instant. A cold build of kube-apiserver and etcd takes about 8 minutes on 2 cores.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.1}"
ETCD_VERSION="${ETCD_VERSION:-v3.7.3}"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$CACHE/k8s/$K8S_VERSION"
LINK_DIR="$ROOT/bin/k8s"

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(kube-apiserver etcd)

mkdir -p "$OUT" "$LINK_DIR"
export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0

# build_k8s NAME: one k8s.io/kubernetes command, from a throwaway module whose staging modules
# are replaced by the published k8s.io/* modules of the matching v0.x version.
build_k8s() {
  local name="$1" mod="$CACHE/k8s/src-$K8S_VERSION"
  local staging="v0.${K8S_VERSION#v1.}"
  if [ ! -f "$mod/go.mod" ]; then
    mkdir -p "$mod"
    local kmod
    kmod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
    {
      echo "module lockstep.local/k8s-binaries"
      echo
      grep -m1 '^go ' "$kmod"
      echo
      echo "require k8s.io/kubernetes $K8S_VERSION"
      echo
      echo "replace ("
      sed -n "s#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 $staging#p" "$kmod"
      echo ")"
    } >"$mod/go.mod.tmp"
    mv "$mod/go.mod.tmp" "$mod/go.mod"
  fi
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  local pkgs=(k8s.io/component-base/version k8s.io/client-go/pkg/version)
  local ldflags="-s -w"
  for p in "${pkgs[@]}"; do
    ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$mod" && go build -trimpath -ldflags "$ldflags" -o "$OUT/$name.tmp" "k8s.io/kubernetes/cmd/$name")
  mv "$OUT/$name.tmp" "$OUT/$name"
}

build_etcd() {
  local mod="$CACHE/k8s/src-etcd-$ETCD_VERSION"
  mkdir -p "$mod"
  if [ ! -f "$mod/go.mod" ]; then
    printf 'module lockstep.local/etcd\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$mod/go.mod"
  fi
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3)
  mv "$OUT/etcd.tmp" "$OUT/etcd"
}

for c in "${components[@]}"; do
  if [ ! -x "$OUT/$c" ]; then
    echo ">> building $c ($([ "$c" = etcd ] && echo "$ETCD_VERSION" || echo "$K8S_VERSION")), cached in $OUT" >&2
    start=$(date +%s)
    case "$c" in
      etcd) build_etcd ;;
      kube-apiserver|kube-controller-manager|kube-scheduler|kubectl) build_k8s "$c" ;;
      *) echo "unknown component $c" >&2; exit 2 ;;
    esac
    echo ">> built $c in $(( $(date +%s) - start ))s" >&2
  fi
  ln -sfn "$OUT/$c" "$LINK_DIR/$c"
done
