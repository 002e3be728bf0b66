#!/usr/bin/env bash
# Installs the libvirt daemon that the libvirt tier runs: Debian 12's packages, pinned by
# version (the daemon, its QEMU driver and virsh; no libvirt-daemon-system, so no service is
# started and no QEMU package is pulled in). The packages are downloaded into
# ~/.cache/lockstep/libvirt/<version>/ once and installed from there; a rerun is instant when they
# are installed. It also makes the system user libvirt-qemu, which the daemon resolves at start
# before qemu.conf's user applies (libvirt-daemon-system's postinst would make it).
#
#   hack/libvirt.sh   -> prints the path of libvirtd
set -euo pipefail

LIBVIRT_VERSION="${LIBVIRT_VERSION:-9.0.0-4+deb12u2}"
PACKAGES=(libvirt0 libvirt-clients libvirt-daemon libvirt-daemon-driver-qemu)
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/libvirt/$LIBVIRT_VERSION"

installed() {
  for p in "${PACKAGES[@]}"; do
    [ "$(dpkg-query -W -f='${Status} ${Version}' "$p" 2>/dev/null)" = "install ok installed $LIBVIRT_VERSION" ] || return 1
  done
}

if ! installed; then
  mkdir -p "$CACHE"
  if ! ls "$CACHE"/*.deb >/dev/null 2>&1; then
    pinned=()
    for p in "${PACKAGES[@]}"; do pinned+=("$p=$LIBVIRT_VERSION"); done
    echo ">> downloading ${pinned[*]}" >&2
    (cd "$CACHE" && { apt-get download "${pinned[@]}" >&2 || { apt-get update >&2 && apt-get download "${pinned[@]}" >&2; }; })
  fi
  echo ">> installing libvirt $LIBVIRT_VERSION from $CACHE" >&2
  apt-get install -y --no-install-recommends "$CACHE"/*.deb >&2 || {
    apt-get update >&2 && apt-get install -y --no-install-recommends "$CACHE"/*.deb >&2
  }
fi
getent passwd libvirt-qemu >/dev/null ||
  useradd --system --user-group --no-create-home --home-dir /var/lib/libvirt --shell /usr/sbin/nologin libvirt-qemu
echo /usr/sbin/libvirtd
