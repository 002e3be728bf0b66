#!/bin/bash
# Builds lockstep's test guest for the VM tier: Debian 12's kernel and a busybox initramfs whose
# init serves a stateful counter over TCP (hack/guest/init, hack/guest/handler; the other services
# that the benchmark and the tests use are the other files of hack/guest). Packages are
# Debian's, pinned by version.
#
#   hack/guest.sh    -> prints the directory holding vmlinuz and initramfs.cpio.gz
#
# Cached under ~/.cache/lockstep/guest/<kernel>-<busybox>-<hash of hack/guest>/ and linked at
# bin/guest.
set -euo pipefail

KERNEL_PKG="${KERNEL_PKG:-linux-image-6.1.0-56-amd64}"
KERNEL_VERSION="${KERNEL_VERSION:-6.1.192-2}"
BUSYBOX_VERSION="${BUSYBOX_VERSION:-1:1.35.0-4+deb12u1+b1}"
MODULES=(virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci failover
  net_failover virtio_net virtio_blk mii 8139cp e1000)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/guest"
hash="$(cd "$ROOT/hack/guest" && for f in *; do echo "$f"; cat "$f"; done | sha256sum | cut -c1-12)"
OUT="$CACHE/$KERNEL_VERSION-${BUSYBOX_VERSION#*:}-$hash"

if [ ! -f "$OUT/initramfs.cpio.gz" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  cd "$work"
  # apt-get download writes as _apt when it can; a world-writable directory lets it.
  chmod 777 "$work"
  apt-get download "$KERNEL_PKG=$KERNEL_VERSION" "busybox-static=$BUSYBOX_VERSION" >&2 || {
    apt-get update >&2 && apt-get download "$KERNEL_PKG=$KERNEL_VERSION" "busybox-static=$BUSYBOX_VERSION" >&2
  }
  dpkg-deb -x "$KERNEL_PKG"_*.deb kernel
  dpkg-deb -x busybox-static_*.deb busybox
  mkdir -p rootfs/bin rootfs/lib/modules
  cp busybox/bin/busybox rootfs/bin/busybox
  for m in "${MODULES[@]}"; do
    cp "$(find kernel/lib/modules -name "$m.ko" | head -n1)" rootfs/lib/modules/
  done
  for f in "$ROOT"/hack/guest/*; do install -m 0755 "$f" "rootfs/$(basename "$f")"; done
  mkdir -p "$OUT.tmp"
  # busybox's own cpio: the host may have none.
  (cd rootfs && find . | ./bin/busybox cpio -o -H newc 2>/dev/null | gzip -9) >"$OUT.tmp/initramfs.cpio.gz"
  cp kernel/boot/vmlinuz-* "$OUT.tmp/vmlinuz"
  rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
fi
mkdir -p "$ROOT/bin"
ln -sfn "$OUT" "$ROOT/bin/guest"
echo "$OUT"
