#!/usr/bin/env bash
# Builds KubeVirt's own binaries, pinned, from the Go module kubevirt.io/kubevirt, as
# hack/build-k8s-binaries.sh builds Kubernetes': no registry here serves KubeVirt's images.
#
#   hack/build-kubevirt.sh [component ...]   (default: virt-operator virt-api virt-controller)
#
# components: virt-operator virt-api virt-controller virt-handler virt-launcher
#             virt-launcher-monitor virt-probe virt-freezer virt-chroot resource-generator domainxml
# (resource-generator is KubeVirt's tool that writes virt-operator's own manifests: the KubeVirt CRD,
# the operator's RBAC, the priority class; domainxml is lockstep's, hack/kubevirt/domainxml: the
# domain KubeVirt's converter makes of a VMI, cached under the hash of its source)
# Binaries are cached under ~/.cache/lockstep/kubevirt/<version>/ and linked into bin/kubevirt/.
#
# The module builds from a throwaway module of lockstep's that requires it, with these
# replacements (Go reads a dependency's replace lines from the main module only):
#   - KubeVirt's own replace lines, copied from its go.mod, except its two ./staging ones:
#     the module zip has no staging/ directory, and kubevirt.io/api and kubevirt.io/client-go
#     are published at the same version;
#   - kubevirt.io/virt-template-{api,client-go,engine} v0.2.0: the proxy serves v0.1.7 only;
#     v0.1.7 with its API package v1alpha1 renamed v1beta1 (the names v1.9.0 imports) is made
#     here from the module cache, into the throwaway module's directory;
#   - libguestfs.org/libnbd: not served; hack/kubevirt/libnbd stands in (every call fails; only
#     virt-launcher's changed-block backup client calls it).
# virt-launcher and virt-handler link libvirt through cgo: their build takes Debian's libvirt-dev
# of the libvirt that hack/libvirt.sh pins, unpacked (not installed) under the cache.
set -euo pipefail

KUBEVIRT_VERSION="${KUBEVIRT_VERSION:-v1.9.0}"
VIRT_TEMPLATE_VERSION="${VIRT_TEMPLATE_VERSION:-v0.1.7}"
LIBVIRT_DEB_VERSION="${LIBVIRT_DEB_VERSION:-9.0.0-4+deb12u2}"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$CACHE/kubevirt/$KUBEVIRT_VERSION"
SRC="$CACHE/kubevirt/src-$KUBEVIRT_VERSION"
LINK_DIR="$ROOT/bin/kubevirt"
# shellcheck source=hack/debs.sh
. "$ROOT/hack/debs.sh"

COMPONENTS=(virt-operator virt-api virt-controller virt-handler virt-launcher virt-launcher-monitor virt-probe virt-freezer virt-chroot resource-generator domainxml)
# package PROGRAM: its Go package in the module.
package() {
  case "$1" in
    resource-generator) echo "kubevirt.io/kubevirt/tools/$1" ;;
    domainxml) echo "./domainxml" ;;
    *) echo "kubevirt.io/kubevirt/cmd/$1" ;;
  esac
}
# cached NAME: the cached binary of NAME; lockstep's own tool is cached under its source's hash.
cached() {
  case "$1" in
    domainxml) echo "$OUT/domainxml-$(cat "$ROOT/hack/kubevirt/domainxml/main.go" | sha256sum | cut -c1-12)" ;;
    *) echo "$OUT/$1" ;;
  esac
}
components=("$@")
[ ${#components[@]} -gt 0 ] || components=(virt-operator virt-api virt-controller)

mkdir -p "$OUT" "$LINK_DIR"
export GOFLAGS="-mod=mod -buildvcs=false" GOTOOLCHAIN=local

# module_dir MOD@VERSION: where the module cache holds it (downloaded if need be).
module_dir() {
  go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'
}

# virt_template NAME: kubevirt.io/virt-template-NAME at VIRT_TEMPLATE_VERSION, its API version
# v1alpha1 renamed v1beta1, in $SRC/virt-template-NAME.
virt_template() {
  local name="$1" dir
  dir="$(module_dir "kubevirt.io/virt-template-$name@$VIRT_TEMPLATE_VERSION")"
  rm -rf "$SRC/virt-template-$name"
  cp -r "$dir" "$SRC/virt-template-$name"
  chmod -R u+w "$SRC/virt-template-$name"
  (
    cd "$SRC/virt-template-$name"
    find . -depth -type d -name '*v1alpha1*' | while read -r d; do
      mv "$d" "$(dirname "$d")/$(basename "$d" | sed 's/v1alpha1/v1beta1/g')"
    done
    find . -type f -name '*.go' -exec sed -i 's/v1alpha1/v1beta1/g; s/V1alpha1/V1beta1/g' {} +
  )
}

# prepare: the throwaway module, once.
prepare() {
  [ ! -f "$SRC/.ready" ] || return 0
  rm -rf "$SRC"
  mkdir -p "$SRC"
  local kmod t cmd
  kmod="$(go mod download -json "kubevirt.io/kubevirt@$KUBEVIRT_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  for t in api client-go engine; do virt_template "$t"; done
  cp -r "$ROOT/hack/kubevirt/libnbd" "$SRC/libnbd"
  {
    echo "module lockstep.local/kubevirt-binaries"
    echo
    grep -m1 '^go ' "$kmod"
    echo
    echo "require kubevirt.io/kubevirt $KUBEVIRT_VERSION"
    echo
    echo "replace ("
    # KubeVirt's replace block, but for its ./staging lines.
    sed -n '/^replace (/,/^)/p' "$kmod" | sed '1d;$d' | grep '=>' | grep -v '=> \./staging/'
    echo "	kubevirt.io/api => kubevirt.io/api $KUBEVIRT_VERSION"
    echo "	kubevirt.io/client-go => kubevirt.io/client-go $KUBEVIRT_VERSION"
    for t in api client-go engine; do echo "	kubevirt.io/virt-template-$t => ./virt-template-$t"; done
    echo "	libguestfs.org/libnbd => ./libnbd"
    echo ")"
  } >"$SRC/go.mod"
  # The blank imports make go mod tidy resolve every command's dependencies.
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for cmd in "${COMPONENTS[@]}"; do
      [ "$cmd" != domainxml ] || continue # lockstep's own, copied in at its build
      echo "	_ \"$(package "$cmd")\""
    done
    echo ")"
  } >"$SRC/tools.go"
  (cd "$SRC" && go mod tidy -e >/dev/null)
  touch "$SRC/.ready"
}

# libvirt_dev: Debian's libvirt-dev of the pinned libvirt, unpacked; sets LIBVIRT_SYSROOT, under
# which pkg-config finds it (libvirt.org/go/libvirt asks pkg-config).
libvirt_dev() {
  local dir="$CACHE/kubevirt/libvirt-dev-$LIBVIRT_DEB_VERSION"
  if [ ! -f "$dir/.ready" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    unpack_debs "$dir" "libvirt-dev=$LIBVIRT_DEB_VERSION" "libvirt0=$LIBVIRT_DEB_VERSION"
    touch "$dir/.ready"
  fi
  LIBVIRT_SYSROOT="$dir/x"
}

build() {
  local name="$1" ldflags cgo=0 pcpath="" sysroot=""
  ldflags="-s -w -X kubevirt.io/client-go/version.gitVersion=$KUBEVIRT_VERSION -X kubevirt.io/client-go/version.gitTreeState=clean -X kubevirt.io/client-go/version.buildDate=1970-01-01T00:00:00Z"
  case "$name" in
    domainxml)
      rm -rf "$SRC/domainxml" && mkdir -p "$SRC/domainxml"
      cp "$ROOT/hack/kubevirt/domainxml/main.go" "$SRC/domainxml/"
      ;;
    virt-launcher|virt-handler)
      libvirt_dev
      cgo=1 sysroot="$LIBVIRT_SYSROOT" pcpath="$LIBVIRT_SYSROOT/usr/lib/x86_64-linux-gnu/pkgconfig"
      ;;
  esac
  (cd "$SRC" && CGO_ENABLED=$cgo PKG_CONFIG_PATH="$pcpath" PKG_CONFIG_SYSROOT_DIR="$sysroot" \
    go build -trimpath -ldflags "$ldflags" -o "$OUT/$name.tmp" "$(package "$name")")
  mv "$OUT/$name.tmp" "$(cached "$name")"
}

for c in "${components[@]}"; do
  [[ " ${COMPONENTS[*]} " == *" $c "* ]] || { echo "unknown component $c (one of: ${COMPONENTS[*]})" >&2; exit 2; }
  if [ ! -x "$(cached "$c")" ]; then
    prepare
    echo ">> building $c ($KUBEVIRT_VERSION), cached in $OUT" >&2
    start=$(date +%s)
    build "$c"
    echo ">> built $c in $(( $(date +%s) - start ))s" >&2
  fi
  ln -sfn "$(cached "$c")" "$LINK_DIR/$c"
done
