#!/usr/bin/env bash
# Builds lockstep's Debian test guest: a Debian 12 disk image that boots by itself under SeaBIOS
# and OVMF, as a VM's disk.img on a claim does. debootstrap's minbase and the packages pinned in
# hack/debian-guest/packages (the Debian kernel, systemd, cloud-init, qemu-guest-agent, sshd,
# PostgreSQL 15, Postfix); cloud-init reads only the NoCloud ISO; the counter
# (hack/debian-guest/lockstep-counter) is a systemd service that keeps its count on the partition
# labelled counter. Where the VM has a disk with serial "data", PostgreSQL and Postfix keep their
# state on it (hack/debian-guest/lockstep-data, made ext4 at its first boot) and run; elsewhere
# they do not start.
#
# The disk (GPT, 2 GiB, sparse):
#   1 esp      64 MiB  FAT: syslinux for SeaBIOS (legacy-BIOS-bootable, gptmbr.bin in the
#                      protective MBR) and for OVMF (EFI/BOOT/BOOTX64.EFI), the kernel, the initramfs
#   2 counter   8 MiB  raw: the counter's sector
#   3 root     rest    ext4, made from the debootstrap tree (mkfs.ext4 -d: no loop device, no mount)
#
#   hack/debian-guest.sh   -> prints the directory holding disk.img and packages.lock
#
# DEBIAN_GUEST_VARIANT=workloads builds the variant that make bench-workloads runs (and the libvirt
# tier's check of its drivers): the same guest with the programs of hack/debian-guest/workloads
# (fio, iperf3, sockperf, gcc and make) and the source it builds, linked at
# bin/debian-guest-workloads. A variant is made from the plain guest's tree (kept as tree.tar
# beside its disk), not from a debootstrap of its own. The other tiers run the plain guest, which
# stays as small as it was.
#
# Cached under ~/.cache/lockstep/debian-guest/<hash of this script, hack/debian-guest and the
# variant>/ and linked at bin/debian-guest. The host tools it and the tests that run it use are Debian 12's,
# pinned and installed here (genisoimage writes the NoCloud ISO, as KubeVirt's launcher does;
# ssh is the tests' client of the guest's sshd; pgbench, iperf3 and sockperf the workloads'
# clients, test/workloads).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONF="$ROOT/hack/debian-guest"
CACHE="${LOCKSTEP_CACHE:-$HOME/.cache/lockstep}/debian-guest"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
HOST_TOOLS=(debootstrap=1.0.128+nmu2+deb12u2 fdisk=2.38.1-5+deb12u3 dosfstools=4.2-1
  mtools=4.0.33-1+really4.0.32-1 syslinux=3:6.04~git20190206.bf6db5b4+dfsg1-3+b1
  syslinux-common=3:6.04~git20190206.bf6db5b4+dfsg1-3 syslinux-efi=3:6.04~git20190206.bf6db5b4+dfsg1-3
  genisoimage=9:1.1.11-3.4 openssh-client=1:9.2p1-2+deb12u6 postgresql-client-15=15.18-0+deb12u1
  iperf3=3.12-1+deb12u2 sockperf=3.7-1)
# How the plain guest's tree is kept for its variants (tree.tar): owners by number, with xattrs.
TREE_TAR=(--numeric-owner --xattrs --xattrs-include='*')
DISK_MIB=2048
ESP_MIB=64
COUNTER_MIB=8

VARIANT="${DEBIAN_GUEST_VARIANT:-}"
LINK="$ROOT/bin/debian-guest"
case "$VARIANT" in
  "") skip=./workloads ;;
  workloads) skip=./none LINK="$ROOT/bin/debian-guest-workloads" ;;
  *) echo "debian-guest: unknown DEBIAN_GUEST_VARIANT $VARIANT (none or workloads)" >&2; exit 2 ;;
esac
hash="$( (cat "${BASH_SOURCE[0]}"; echo "$VARIANT"; cd "$CONF" && find . -path "$skip" -prune -o -type f ! -name '*_test.go' -print | LC_ALL=C sort | while read -r f; do echo "$f"; cat "$f"; done) |
  sha256sum | cut -c1-12)"
OUT="$CACHE/$hash"

host_tools() {
  local missing=()
  for p in "${HOST_TOOLS[@]}"; do
    [ "$(dpkg-query -W -f='${Status} ${Version}' "${p%%=*}" 2>/dev/null)" = "install ok installed ${p#*=}" ] || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return
  echo ">> installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2 || {
    apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
  }
}

# in_root runs a command in the tree (chroot, nothing mounted: the packages' scripts need no
# /proc or /dev here).
in_root() {
  DEBIAN_FRONTEND=noninteractive LC_ALL=C chroot "$tree" "$@"
}

# apps sets up the applications whose clients the full stack runs (test/apps): PostgreSQL 15 with the role and databases of the ledger and of pgbench, which
# clients reach from the VM's network with a password, amcheck in the ledger's database; Postfix
# accepting mail for the local user "mailbox" from anywhere, delivering to /var/mail; both
# keeping their state on the data disk (lockstep-data.service), and running only where it is.
apps() {
  local pg=/etc/postgresql/15/main uid db sql unit
  printf '%s\n' "# lockstep's test guest" "listen_addresses = '*'" "shared_buffers = 32MB" >>"$tree$pg/postgresql.conf"
  echo "host  all  lockstep  0.0.0.0/0  scram-sha-256" >>"$tree$pg/pg_hba.conf"
  # The role and databases, by the server in single-user mode: no socket, no POSIX shared memory
  # (the tree has no /dev/shm), nothing left running.
  uid="$(in_root id -u postgres)"
  for db in postgres ledger; do
    case "$db" in
    postgres) sql="CREATE ROLE lockstep LOGIN PASSWORD 'lockstep'
CREATE DATABASE ledger OWNER lockstep
CREATE DATABASE bench OWNER lockstep" ;;
    ledger) sql="CREATE EXTENSION amcheck
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO lockstep" ;;
    esac
    echo "$sql" | LC_ALL=C chroot --userspec="$uid:$uid" "$tree" /usr/lib/postgresql/15/bin/postgres --single \
      -D /var/lib/postgresql/15/main -c config_file=$pg/postgresql.conf -c dynamic_shared_memory_type=mmap "$db" >&2
  done
  # The mailbox is locked with fcntl alone, which dies with the guest. Debian's default adds a
  # dotlock file, which a guest that stops hard (a restart from its disks) leaves behind on disk
  # (its creation committed by the mailbox's fsync, its removal not): local delivery then defers
  # every message until the lock is stale_lock_time (500 s) old.
  in_root postconf -e 'inet_interfaces = all' 'inet_protocols = ipv4' 'mydestination = localhost' \
    'myhostname = localhost' 'mailbox_size_limit = 0' 'mailbox_delivery_lock = fcntl'
  in_root useradd --create-home --shell /usr/sbin/nologin mailbox
  install -m 0755 "$CONF/lockstep-data" "$tree/usr/local/sbin/lockstep-data"
  install -m 0644 "$CONF/lockstep-data.service" "$tree/etc/systemd/system/lockstep-data.service"
  ln -sf /etc/systemd/system/lockstep-data.service "$tree/etc/systemd/system/multi-user.target.wants/lockstep-data.service"
  mkdir -p "$tree/srv/data"
  for unit in postgresql@.service postfix@.service; do
    mkdir -p "$tree/etc/systemd/system/$unit.d"
    install -m 0644 "$CONF/apps.conf" "$tree/etc/systemd/system/$unit.d/lockstep.conf"
  done
}

# install_pins installs the packages pinned in FILE... into the tree (nothing they install
# starts in it), and writes what the tree then holds to packages.lock.
install_pins() {
  : "${tree:?}" "${work:?}"
  local pins
  mapfile -t pins < <(grep -hv '^#' "$@" | grep .)
  [ ${#pins[@]} -gt 0 ] || { echo "debian-guest: no packages pinned in $*" >&2; exit 1; }
  echo ">> installing ${pins[*]}" >&2
  rm -f "$tree/etc/resolv.conf" # a link into /run, in a tree debootstrap made: never written through
  cp /etc/resolv.conf "$tree/etc/resolv.conf" 2>/dev/null || true
  printf '#!/bin/sh\nexit 101\n' >"$tree/usr/sbin/policy-rc.d"
  chmod 0755 "$tree/usr/sbin/policy-rc.d"
  in_root apt-get update -q >&2
  in_root apt-get install -y -q --no-install-recommends "${pins[@]}" >&2
  rm -f "$tree/usr/sbin/policy-rc.d" "$tree/etc/resolv.conf"
  in_root dpkg-query -W -f='${Package}=${Version}\n' | LC_ALL=C sort >"$work/packages.lock"
}

# plain_tree makes the plain guest's tree: debootstrap, the pinned packages, the guest's own
# configuration and programs.
plain_tree() {
  : "${tree:?}"
  echo ">> debootstrap (minbase) of bookworm from $MIRROR" >&2
  debootstrap --variant=minbase bookworm "$tree" "$MIRROR" >&2
  printf '%s\n' "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" \
    "deb $SECURITY_MIRROR bookworm-security main" >"$tree/etc/apt/sources.list"
  # Only the modules that find the root go into the initramfs: a smaller one boots faster under TCG.
  mkdir -p "$tree/etc/initramfs-tools/conf.d"
  echo MODULES=list >"$tree/etc/initramfs-tools/conf.d/lockstep"
  grep -v '^#' "$CONF/initramfs-modules" >>"$tree/etc/initramfs-tools/modules"
  # Postfix delivers locally.
  printf '%s\n' 'postfix postfix/main_mailer_type select Local only' 'postfix postfix/mailname string localhost' |
    in_root debconf-set-selections
  install_pins "$CONF/packages"

  echo ">> configuring the guest" >&2
  install -m 0644 "$CONF/fstab" "$tree/etc/fstab"
  mkdir -p "$tree/boot/efi"
  install -m 0644 "$CONF/cloud.cfg" "$tree/etc/cloud/cloud.cfg.d/90-lockstep.cfg"
  CGO_ENABLED=0 go build -C "$ROOT" -trimpath -o "$tree/usr/local/bin/lockstep-counter" ./hack/debian-guest/lockstep-counter
  install -m 0644 "$CONF/lockstep-counter.service" "$tree/etc/systemd/system/lockstep-counter.service"
  ln -sf /etc/systemd/system/lockstep-counter.service "$tree/etc/systemd/system/multi-user.target.wants/lockstep-counter.service"
  apps
}

# variant_tree makes a variant's tree from the plain guest's (which it builds first if it is not
# cached): the variant's packages and the sources it fetches, on top.
variant_tree() {
  : "${tree:?}"
  local plain
  plain="$(DEBIAN_GUEST_VARIANT='' "${BASH_SOURCE[0]}")"
  echo ">> the plain guest's tree, from $plain" >&2
  mkdir -p "$tree"
  tar -C "$tree" "${TREE_TAR[@]}" -xf "$plain/tree.tar"
  install_pins "$CONF/$VARIANT/packages"
  mkdir -p "$tree/usr/local/src"
  grep -v '^#' "$CONF/$VARIANT/sources" | grep . | while read -r file path sum; do
    echo ">> fetching $MIRROR/$path" >&2
    curl -fsSL --retry 3 -o "$tree/usr/local/src/$file" "$MIRROR/$path"
    echo "$sum  $tree/usr/local/src/$file" | sha256sum -c --quiet >&2
  done
}

build() {
  work="$(mktemp -d "${TMPDIR:-/tmp}/debian-guest.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  tree="$work/root"
  if [ -z "$VARIANT" ]; then plain_tree; else variant_tree; fi
  # Made at first boot, per instance: the machine id by systemd, the host keys by cloud-init (after
  # every package, so that none leaves one of its own in the image).
  : >"$tree/etc/machine-id"
  rm -f "$tree/var/lib/dbus/machine-id" "$tree"/etc/ssh/ssh_host_*
  echo debian >"$tree/etc/hostname"
  in_root apt-get clean
  rm -rf "$tree"/var/lib/apt/lists/* "$tree"/usr/share/doc/* "$tree"/usr/share/man/* "$tree"/usr/share/locale/*
  # Drivers no VM of KubeVirt's has: the image is copied for every member.
  rm -rf "$tree"/usr/lib/modules/*/kernel/drivers/{gpu,media,net/wireless,infiniband,staging,isdn,bluetooth,iio} \
    "$tree"/usr/lib/modules/*/kernel/sound
  kver="$(basename "$(ls -d "$tree"/usr/lib/modules/*)")"
  in_root depmod "$kver"
  # The plain guest's tree, kept for its variants (variant_tree).
  [ -n "$VARIANT" ] || tar -C "$tree" "${TREE_TAR[@]}" -cf "$work/tree.tar" .

  echo ">> making the disk" >&2
  local esp="$work/esp.img" rootfs="$work/root.img" disk="$work/disk.img"
  local root_mib=$((DISK_MIB - 1 - ESP_MIB - COUNTER_MIB - 1))
  mkfs.vfat -n ESP -C "$esp" $((ESP_MIB * 1024)) >/dev/null
  mmd -i "$esp" ::/EFI ::/EFI/BOOT
  mcopy -i "$esp" "$tree/boot/vmlinuz-$kver" ::/vmlinuz
  mcopy -i "$esp" "$tree/boot/initrd.img-$kver" ::/initrd.img
  mcopy -i "$esp" "$CONF/syslinux.cfg" ::/syslinux.cfg
  mcopy -i "$esp" /usr/lib/SYSLINUX.EFI/efi64/syslinux.efi ::/EFI/BOOT/BOOTX64.EFI
  mcopy -i "$esp" /usr/lib/syslinux/modules/efi64/ldlinux.e64 ::/EFI/BOOT/ldlinux.e64
  mcopy -i "$esp" "$CONF/syslinux.cfg" ::/EFI/BOOT/syslinux.cfg
  syslinux --install "$esp"
  mkfs.ext4 -q -L root -d "$tree" "$rootfs" "${root_mib}M"
  truncate -s "${DISK_MIB}M" "$disk"
  sfdisk -q "$disk" <<EOF
label: gpt
start=1MiB, size=${ESP_MIB}MiB, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name=esp, attrs=LegacyBIOSBootable
size=${COUNTER_MIB}MiB, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name=counter
size=${root_mib}MiB, type=4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709, name=root
EOF
  dd if="$esp" of="$disk" bs=1M seek=1 conv=notrunc,sparse status=none
  dd if="$rootfs" of="$disk" bs=1M seek=$((1 + ESP_MIB + COUNTER_MIB)) conv=notrunc,sparse status=none
  dd if=/usr/lib/syslinux/mbr/gptmbr.bin of="$disk" bs=440 count=1 conv=notrunc status=none

  rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
  mv "$disk" "$work/packages.lock" "$OUT.tmp/"
  [ -n "$VARIANT" ] || mv "$work/tree.tar" "$OUT.tmp/"
  echo "$kver" >"$OUT.tmp/kernel"
  rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
}

host_tools
# Everything the build prints goes to stderr: stdout is the directory alone.
# The plain guest keeps its tree for its variants: a cache of it without one is made again.
[ -f "$OUT/disk.img" ] && { [ -n "$VARIANT" ] || [ -f "$OUT/tree.tar" ]; } || build >&2
mkdir -p "$ROOT/bin"
ln -sfn "$OUT" "$LINK"
echo "$OUT"
