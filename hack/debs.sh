# Sourced by the hack/ scripts that take files from Debian's packages.
#
# unpack_debs DIR PKG=VERSION...: the packages, pinned, downloaded into DIR and unpacked into
# DIR/x (no scripts run, nothing installed).
unpack_debs() {
  local dir="$1"
  shift
  chmod 777 "$dir" # apt-get download writes as _apt when it can
  (cd "$dir" && { apt-get download "$@" >&2 || { apt-get update >&2 && apt-get download "$@" >&2; }; })
  for deb in "$dir"/*.deb; do dpkg-deb -x "$deb" "$dir/x"; done
}
