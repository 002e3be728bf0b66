#!/usr/bin/env bash
# Builds the QEMU that the VM tier runs: Debian 12's QEMU source package (pinned, checked against
# the .dsc's SHA-256) with its own patches, plus lockstep's three fixes for COLO under TCG
# (hack/qemu/*.patch, docs/colo.md): the big lock around the checkpoint's live state (DESIGN.md
# explains the deadlock), TCG's TLB reset after a dirty-bitmap sync (without it pages written
# between checkpoints are missed and the secondary's guest diverges), and, at a checkpoint, the
# invalidation of exactly the translated code whose pages the secondary rewrote instead of all of
# it (a full flush made the secondary too slow to ever match the primary's packets). Only
# qemu-system-x86_64 (with what COLO needs: replication, quorum, NBD, tap) and the tools
# (qemu-img for the active and hidden disks) are built.
#
#   hack/qemu.sh                      -> prints the install prefix (bin/qemu-system-x86_64, share/qemu)
#   hack/qemu.sh --source DIR         -> only fetches, checks and patches the source into DIR
#   hack/qemu.sh --configure-options  -> prints the configure options
# (the last two are for builds elsewhere: hack/virt-launcher/Dockerfile).
#
# The build is cached under ~/.cache/lockstep/qemu/<version>-<patch hash>/ and linked at
# bin/qemu; a rerun is instant. A cold build took 13 minutes on 2 cores here. Build
# dependencies come from Debian's packages (apt-get) when they are missing.
set -euo pipefail

QEMU_DEB_VERSION="${QEMU_DEB_VERSION:-7.2+dfsg-7+deb12u18}"
QEMU_DSC_SHA256="${QEMU_DSC_SHA256:-6b6bd27b947ec89e40a1d6b26d9c9f3c698ca691da13163e0483f6061bbb20b3}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/qemu"
# lockstep's own patches, applied in name order after Debian's.
PATCHES=("$ROOT"/hack/qemu/*.patch)
CONFIGURE=(--target-list=x86_64-softmmu --enable-tcg --enable-replication --enable-tools
  --disable-werror --disable-docs --disable-gtk --disable-sdl --disable-vnc --disable-opengl
  --disable-spice --disable-curl --disable-libusb --disable-usb-redir --disable-xen
  --disable-capstone --disable-slirp --disable-guest-agent)
# The cache key covers the version, the patch and the configuration.
ID="$QEMU_DEB_VERSION-$( (cat "${PATCHES[@]}"; echo "${CONFIGURE[*]}") | sha256sum | cut -c1-12)"
PREFIX="$CACHE/$ID"

# fetch_source DIR: Debian's source package, checked against the pinned .dsc, with Debian's
# patches and lockstep's applied, in DIR/src.
fetch_source() {
  cd "$1"
  dsc="qemu_${QEMU_DEB_VERSION}.dsc"
  echo ">> fetching $dsc from $MIRROR" >&2
  curl -sSfO "$MIRROR/pool/main/q/qemu/$dsc"
  echo "$QEMU_DSC_SHA256  $dsc" | sha256sum -c --quiet - >&2
  # The .dsc names the tarballs and their SHA-256; fetch and check each.
  sed -n '/^Checksums-Sha256:/,/^[A-Z]/p' "$dsc" | awk 'NF==3 {print $1, $3}' | while read -r sum file; do
    curl -sSfO "$MIRROR/pool/main/q/qemu/$file"
    echo "$sum  $file" | sha256sum -c --quiet - >&2
  done
  dpkg-source --no-check -x "$dsc" src >&2   # applies Debian's patches
  for p in "${PATCHES[@]}"; do (cd src && patch -p1 <"$p" >&2); done
}

case "${1:-}" in
  --configure-options) echo "${CONFIGURE[*]}"; exit 0 ;;
  --source) mkdir -p "$2" && fetch_source "$2" && exit 0 ;;
esac

if [ ! -x "$PREFIX/bin/qemu-system-x86_64" ]; then
  deps=(libglib2.0-dev libpixman-1-dev libfdt-dev zlib1g-dev meson ninja-build pkg-config python3 dpkg-dev xz-utils curl)
  missing=()
  for d in "${deps[@]}"; do dpkg-query -W -f='${Status}' "$d" 2>/dev/null | grep -q 'install ok installed' || missing+=("$d"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo ">> installing build dependencies: ${missing[*]}" >&2
    apt-get install -y --no-install-recommends "${missing[@]}" >&2 || {
      apt-get update >&2 && apt-get install -y --no-install-recommends "${missing[@]}" >&2
    }
  fi

  work="$CACHE/src-$ID"
  rm -rf "$work" && mkdir -p "$work"
  fetch_source "$work"
  mkdir -p src/build && cd src/build
  ../configure --prefix="$PREFIX" "${CONFIGURE[@]}" >&2
  ninja >&2
  ninja install >&2
  cd / && rm -rf "$work"
fi
# Firmware: the dfsg source carries no prebuilt ROMs, so take Debian's (SeaBIOS, and the option
# ROMs of qemu-system-data such as linuxboot_dma.bin for -kernel). Run QEMU with
# -L $PREFIX/firmware/qemu -L $PREFIX/firmware/seabios.
SEABIOS_VERSION="${SEABIOS_VERSION:-1.16.2-1}"
if [ ! -f "$PREFIX/firmware/seabios/bios-256k.bin" ]; then
  fw="$(mktemp -d)"
  chmod 777 "$fw"
  (cd "$fw" && apt-get download "seabios=$SEABIOS_VERSION" "qemu-system-data=1:$QEMU_DEB_VERSION" >&2)
  for deb in "$fw"/*.deb; do dpkg-deb -x "$deb" "$fw/x"; done
  mkdir -p "$PREFIX/firmware"
  rm -rf "$PREFIX/firmware/seabios" "$PREFIX/firmware/qemu"
  cp -rL "$fw/x/usr/share/seabios" "$PREFIX/firmware/seabios"
  cp -r "$fw/x/usr/share/qemu" "$PREFIX/firmware/qemu"
  rm -rf "$fw"
fi
mkdir -p "$ROOT/bin"
ln -sfn "$PREFIX" "$ROOT/bin/qemu"
echo "$PREFIX"
