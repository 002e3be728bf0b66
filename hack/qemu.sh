#!/usr/bin/env bash
# Builds the QEMU that the VM tier runs: the newest QEMU that Debian's source packages offer here
# (pinned, checked against the .dsc's SHA-256), with Debian's patches and lockstep's twenty-one patches
# for COLO (hack/qemu/*.patch, docs/colo.md): the big lock around the checkpoint's live state
# (without it the primary deadlocks at its first checkpoint under TCG); colo-compare's count of
# the checkpoints that a mismatch and a timeout asked for (lockstepd reports them); colo-compare
# releasing packets in the order it compared them (it reversed those queued while its output socket
# was full); colo-compare letting the bare TCP packets left over at a connection's end expire instead of forcing a
# checkpoint for each; colo-compare holding the primary's packets that it cannot compare (IPv6,
# ARP) until the next checkpoint instead of releasing them at once, and checkpointing sooner than
# its timeout when both guests' replies wait for each other; the primary resuming once the secondary has received a checkpoint rather
# than loaded it, and sending the dirtied RAM ahead of each checkpoint while its VM runs (two
# shorter pauses); and, on the secondary, the invalidation of the translated code whose pages a
# checkpoint rewrote (without it the secondary can run code that is no longer in memory), and its
# filter-rewriter delivering the packets that came while its VM was stopped for a checkpoint,
# rewritten for the state the checkpoint loaded, and ending a connection's handshake at a checkpoint; the
# primary keeping a packet its NIC could not take through a checkpoint's stop (it was dropped) and
# mirroring it to the secondary again; the COLO streams written one packet per write and read up
# to 64 KiB at a time (socket chardevs read 4 KiB); the primary's disk writes completing once
# copied, sent on to the secondary behind them, and caught up while the VM runs before each
# checkpoint; and, on
# q35 (KubeVirt's machine), the ICH9 LPC bridge mapping its register block once when a checkpoint's
# device state is loaded into the running secondary (without it the secondary aborts at its first
# checkpoint). Only qemu-system-x86_64 (with what COLO needs: replication, quorum, NBD, tap; and
# VNC, which KubeVirt's domains use) and the tools (qemu-img for the active and hidden disks) are
# built.
#
#   hack/qemu.sh                      -> prints the install prefix (bin/qemu-system-x86_64, share/qemu)
#   hack/qemu.sh --source DIR         -> only fetches, checks and patches the source into DIR
#   hack/qemu.sh --configure-options  -> prints the configure options
# (the last two are for builds elsewhere). hack/qemu-image.sh makes the build the image that
# members' launchers mount.
#
# The build is cached under ~/.cache/lockstep/qemu/<version>-<patch hash>/ and linked at
# bin/qemu; a rerun is instant. Build dependencies come from Debian's packages (apt-get) when they
# are missing.
set -euo pipefail

QEMU_DEB_VERSION="${QEMU_DEB_VERSION:-10.2.2+ds-1}"
QEMU_DSC_SHA256="${QEMU_DSC_SHA256:-f1684b3aa5ec500c3389d346c6501dee45041ea91656c6556d4da9023b7987dd}"
# QEMU 10 builds with meson 1.5 or newer (Debian 12 has 1.0). Debian's source package leaves out
# the meson wheel that QEMU's own tarball carries; the one QEMU pins comes from PyPI, checked.
MESON_VERSION="1.9.0"
MESON_WHEEL_SHA256="45e51ddc41e37d961582d06e78c48e0f9039011587f3495c4d6b0781dad92357"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/qemu"
# lockstep's own patches, applied in name order after Debian's.
PATCHES=("$ROOT"/hack/qemu/*.patch)
CONFIGURE=(--target-list=x86_64-softmmu --enable-tcg --enable-replication --enable-tools
  --disable-werror --disable-docs --disable-gtk --disable-sdl --disable-opengl
  --disable-spice --disable-curl --disable-libusb --disable-usb-redir --disable-xen
  --disable-capstone --disable-slirp --disable-guest-agent --disable-rust --disable-install-blobs)
# The cache key covers the version, the patches' diffs (not their messages) and the configuration.
for p in "${PATCHES[@]}"; do
  grep -q '^--- a/' "$p" || { echo "qemu.sh: $p has no diff (no '--- a/' line)" >&2; exit 1; }
done
ID="$QEMU_DEB_VERSION-$( (for p in "${PATCHES[@]}"; do sed -n '/^--- a\//,$p' "$p"; done; echo "${CONFIGURE[*]}") | sha256sum | cut -c1-12)"
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
  for p in "${PATCHES[@]}"; do
    (cd src && patch -p1 <"$p" >&2) || { echo "qemu.sh: $p does not apply" >&2; exit 1; }
  done
  mkdir -p src/python/wheels
  python3 -m pip download --quiet --no-deps --only-binary=:all: "meson==$MESON_VERSION" -d src/python/wheels >&2
  echo "$MESON_WHEEL_SHA256  src/python/wheels/meson-$MESON_VERSION-py3-none-any.whl" | sha256sum -c --quiet - >&2
}

case "${1:-}" in
  --configure-options) echo "${CONFIGURE[*]}"; exit 0 ;;
  # Called on its own, not in a list, so that set -e stops at the first command that fails.
  --source) mkdir -p "$2"; fetch_source "$2"; exit 0 ;;
esac

if [ ! -x "$PREFIX/bin/qemu-system-x86_64" ]; then
  # QEMU's configure enables what it finds: these are every library the build links (VNC's TLS,
  # PNG and JPEG; curses; bzip2), so that a cold machine builds the QEMU this one does, and the
  # image's pins (hack/qemu-image/packages) hold what it loads. A library added here needs its
  # runtime package pinned there.
  deps=(libglib2.0-dev libpixman-1-dev libfdt-dev zlib1g-dev libgnutls28-dev libpng-dev libjpeg62-turbo-dev
    libbz2-dev libncurses-dev ninja-build pkg-config python3 python3-venv flex bison dpkg-dev xz-utils curl)
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
  # Only what installs: QEMU's default target also builds its tests (qtest, the unit tests,
  # SoftFloat's and TestFloat's), a third of what it compiles.
  mapfile -t targets < <(pyvenv/bin/meson introspect --installed . | python3 -c '
import json, os, sys
build = os.getcwd()
for path in json.load(sys.stdin):
    if path.startswith(build + os.sep):
        print(os.path.relpath(path, build))')
  [ ${#targets[@]} -gt 0 ] || { echo "qemu.sh: meson names nothing to install" >&2; exit 1; }
  ninja "${targets[@]}" >&2
  pyvenv/bin/meson install --no-rebuild >&2
  cd / && rm -rf "$work"
fi
# shellcheck source=hack/debs.sh
source "$ROOT/hack/debs.sh"
# Firmware: the dfsg source carries no prebuilt ROMs, so take Debian's (SeaBIOS, and the option
# ROMs of qemu-system-data such as linuxboot_dma.bin for -kernel). Run QEMU with
# -L $PREFIX/firmware/qemu -L $PREFIX/firmware/seabios.
SEABIOS_VERSION="${SEABIOS_VERSION:-1.16.2-1}"
# The option ROMs come from Debian 12's qemu-system-data: the firmware interface they use
# (fw_cfg) is stable, and Debian 12's apt reaches no newer one.
QEMU_DATA_VERSION="${QEMU_DATA_VERSION:-1:7.2+dfsg-7+deb12u18}"
if [ ! -f "$PREFIX/firmware/seabios/bios-256k.bin" ] || [ ! -f "$PREFIX/firmware/doc/seabios/copyright" ]; then
  fw="$(mktemp -d)"
  unpack_debs "$fw" "seabios=$SEABIOS_VERSION" "qemu-system-data=$QEMU_DATA_VERSION"
  mkdir -p "$PREFIX/firmware"
  rm -rf "$PREFIX/firmware/seabios" "$PREFIX/firmware/qemu"
  cp -rL "$fw/x/usr/share/seabios" "$PREFIX/firmware/seabios"
  cp -r "$fw/x/usr/share/qemu" "$PREFIX/firmware/qemu"
  # Their licences, for what carries them (hack/qemu-image.sh).
  for pkg in seabios qemu-system-data; do
    mkdir -p "$PREFIX/firmware/doc/$pkg"
    cp "$fw/x/usr/share/doc/$pkg/copyright" "$PREFIX/firmware/doc/$pkg/"
  done
  rm -rf "$fw"
fi
# OVMF, for guests that boot with EFI: Debian 12's build, whose file names are those KubeVirt's
# domains give (OVMF_CODE.secboot.fd, the VARS template OVMF_VARS.fd). A launcher image carries it
# at /usr/share/edk2/ovmf.
OVMF_VERSION="${OVMF_VERSION:-2022.11-6+deb12u2}"
if [ ! -f "$PREFIX/firmware/ovmf/OVMF_CODE.secboot.fd" ]; then
  fw="$(mktemp -d)"
  unpack_debs "$fw" "ovmf=$OVMF_VERSION"
  mkdir -p "$PREFIX/firmware"
  rm -rf "$PREFIX/firmware/ovmf"
  cp -rL "$fw/x/usr/share/OVMF" "$PREFIX/firmware/ovmf"
  rm -rf "$fw"
fi
mkdir -p "$ROOT/bin"
ln -sfn "$PREFIX" "$ROOT/bin/qemu"
echo "$PREFIX"
