#!/usr/bin/env bash
# Assembles lockstep's QEMU as the files of the image that every member's compute container
# mounts (docs/kubevirt.md, "lockstep's QEMU in the member's launcher"): qemu-system-x86_64 from
# hack/qemu.sh's build, with every library it loads, the dynamic loader, its firmware (SeaBIOS,
# QEMU's option ROMs, iPXE's NIC ROMs) and keymaps, and each package's copyright file. The
# libraries come from the Debian packages pinned in hack/qemu-image/packages, not from the host.
#
# The binary runs on a root that holds none of these (KubeVirt's launcher is CentOS Stream): its
# interpreter is the image's own loader and its library path (DT_RPATH, which also covers the
# libraries' own dependencies) the image's lib/, both at MOUNT, where the compute container mounts
# the image. QEMU finds its firmware and keymaps beside its binary (../share/qemu).
#
#   hack/qemu-image.sh                -> prints the image's root (bin/, lib/, share/), linked at
#                                        bin/qemu-image
#   hack/qemu-image.sh --oci OUT REF  -> also writes it as the image REF, an OCI archive at OUT
#                                        (hack/imagebuild; `make images`), labelled $VERSION
#
# Cached under ~/.cache/lockstep/qemu-image/<hash of the QEMU build, this script, the pins>.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# MOUNT is where the member's compute container has the image: the mountPath in
# config/kubevirt/member-qemu-policy.yaml (internal/kubevirthook.LockstepQEMUMount, under which the
# hook names the emulator; the tests check that the three agree).
MOUNT="$(sed -n 's/.*name: "lockstep-qemu", mountPath: "\([^"]*\)".*/\1/p' "$ROOT/config/kubevirt/member-qemu-policy.yaml")"
[ -n "$MOUNT" ] || { echo "qemu-image: no mountPath of lockstep-qemu in config/kubevirt/member-qemu-policy.yaml" >&2; exit 1; }
PATCHELF_VERSION="${PATCHELF_VERSION:-0.14.3-1+b1}"
# shellcheck source=hack/debs.sh
source "$ROOT/hack/debs.sh"

QEMU="$("$ROOT/hack/qemu.sh")"
mapfile -t PINS < <(grep -v '^#' "$ROOT/hack/qemu-image/packages" | grep .)
# Firmware that hack/qemu.sh fetched, which the image carries, and whose licences it needs.
FIRMWARE_PACKAGES=(seabios qemu-system-data)
# The key covers what goes in: the binary and firmware as built, the pins, how they are put
# together, and where the image is mounted.
ID="$( (sha256sum "$QEMU/bin/qemu-system-x86_64"; find "$QEMU/firmware/seabios" "$QEMU/firmware/qemu" "$QEMU/share/qemu/keymaps" -type f -print0 | sort -z | xargs -0 sha256sum
  cat "${BASH_SOURCE[0]}" "$ROOT/hack/debs.sh" "$ROOT/hack/qemu-image/packages"; echo "$MOUNT") | sha256sum | cut -c1-12)"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/qemu-image"
OUT="$CACHE/$ID"
mkdir -p "$CACHE"
# One build at a time (apt's lock, the cache's directories).
exec 9>"$CACHE/.lock"
flock 9

# $OUT.complete is written last: a directory without it is an interrupted build.
if [ ! -f "$OUT.complete" ]; then
  if [ "$(dpkg-query -W -f='${Status} ${Version}' patchelf 2>/dev/null)" != "install ok installed $PATCHELF_VERSION" ]; then
    echo ">> installing patchelf $PATCHELF_VERSION" >&2
    apt-get install -y --no-install-recommends "patchelf=$PATCHELF_VERSION" >&2 || {
      apt-get update >&2 && apt-get install -y --no-install-recommends "patchelf=$PATCHELF_VERSION" >&2
    }
  fi
  work="$(mktemp -d "$CACHE/.build-XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  echo ">> unpacking ${#PINS[@]} pinned packages" >&2
  mkdir -p "$work/debs"
  unpack_debs "$work/debs" "${PINS[@]}"
  x="$work/debs/x"
  root="$work/root"
  mkdir -p "$root/bin" "$root/lib" "$root/share/qemu" "$root/share/doc"

  strip --strip-unneeded -o "$root/bin/qemu-system-x86_64" "$QEMU/bin/qemu-system-x86_64"

  # Every library the binary needs, and theirs, from the packages; none may be missing.
  find_lib() {
    local d
    for d in "$x/lib/x86_64-linux-gnu" "$x/usr/lib/x86_64-linux-gnu"; do
      [ -e "$d/$1" ] && { echo "$d/$1"; return 0; }
    done
    return 1
  }
  needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
  queue=("$root/bin/qemu-system-x86_64")
  while [ ${#queue[@]} -gt 0 ]; do
    f="${queue[0]}"
    queue=("${queue[@]:1}")
    for so in $(needed "$f"); do
      [ -e "$root/lib/$so" ] && continue
      src="$(find_lib "$so")" || { echo "qemu-image: $so, which $(basename "$f") needs, is in none of hack/qemu-image/packages" >&2; exit 1; }
      if readelf -d "$src" | grep -q '(RUNPATH)'; then
        echo "qemu-image: $so has a RUNPATH, which would override the image's library path for its dependencies" >&2
        exit 1
      fi
      cp -L "$src" "$root/lib/$so"
      queue+=("$root/lib/$so")
    done
  done
  cp -L "$x/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" "$root/lib/ld-linux-x86-64.so.2"
  patchelf --set-interpreter "$MOUNT/lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$MOUNT/lib" "$root/bin/qemu-system-x86_64"

  # Firmware for x86 and the keymaps, where QEMU looks beside its binary.
  cp -r "$QEMU/share/qemu/keymaps" "$root/share/qemu/"
  cp "$QEMU"/firmware/seabios/*.bin "$root/share/qemu/"
  for f in kvmvapic.bin linuxboot.bin linuxboot_dma.bin multiboot.bin multiboot_dma.bin pvh.bin qboot.rom sgabios.bin; do
    cp "$QEMU/firmware/qemu/$f" "$root/share/qemu/"
  done
  cp "$x"/usr/lib/ipxe/qemu/efi-*.rom "$root/share/qemu/"

  # The licences: each package's copyright file, and what QEMU is and where its source is.
  for pkg in $(printf '%s\n' "${PINS[@]%%=*}") "${FIRMWARE_PACKAGES[@]}"; do
    f="$x/usr/share/doc/$pkg/copyright"
    [ -f "$f" ] || f="$QEMU/firmware/doc/$pkg/copyright"
    [ -f "$f" ] || { echo "qemu-image: no copyright file of $pkg" >&2; exit 1; }
    mkdir -p "$root/share/doc/$pkg"
    cp "$f" "$root/share/doc/$pkg/"
  done
  mkdir -p "$root/share/doc/qemu"
  cat >"$root/share/doc/qemu/README" <<TXT
qemu-system-x86_64 here is QEMU $(basename "$QEMU" | cut -d- -f1-2) (GPL-2.0-only): Debian's source
package qemu_$(basename "$QEMU" | cut -d- -f1-2), with lockstep's patches (hack/qemu/*.patch in
lockstep's repository), built by hack/qemu.sh with: $("$ROOT/hack/qemu.sh" --configure-options)
TXT

  find "$root" -type d -exec chmod 0755 {} +
  find "$root" -type f -exec chmod go+r,u+w {} +
  chmod 0755 "$root/bin/qemu-system-x86_64" "$root/lib/ld-linux-x86-64.so.2"
  rm -rf "$OUT"
  mv "$root" "$OUT"
  touch "$OUT.complete"
fi
mkdir -p "$ROOT/bin"
ln -sfn "$OUT" "$ROOT/bin/qemu-image"
if [ "${1:-}" = --oci ]; then
  (cd "$ROOT" && go run ./hack/imagebuild -root "$OUT" -mount "$MOUNT" -out "$2" -ref "$3" -version "${VERSION:-dev}")
fi
echo "$OUT"
