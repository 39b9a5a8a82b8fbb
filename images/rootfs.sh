#!/usr/bin/env bash
# Lays out the root filesystem of one InferenceCache image in DIR: the
# binaries, exactly the shared libraries `ldd` says they load (and the dynamic
# loader), the CA certificate bundle (TLS clients load the system roots), and
# passwd/group entries for the non-root user 65532. No shell, no package
# manager, nothing else. Used by both recipes: the Dockerfile's build
# stage and the registry-free local build (build-local.sh), so the two images
# hold the same files.
#
# usage: rootfs.sh DIR BINARY [BINARY...]   (the first binary is the entrypoint)
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DIR BINARY [BINARY...]" >&2; exit 2; }
dir=$1; shift
rm -rf "$dir"
mkdir -p "$dir/usr/local/bin" "$dir/etc" "$dir/tmp" "$dir/home/nonroot"
chmod 1777 "$dir/tmp"
for bin in "$@"; do
  [ -x "$bin" ] || { echo "rootfs.sh: $bin is not an executable" >&2; exit 1; }
  install -m 0755 "$bin" "$dir/usr/local/bin/$(basename "$bin")"
  # Every absolute path ldd prints: the libraries after "=>" and the loader.
  # A static binary prints none ("not a dynamic executable"), which is fine.
  for lib in $(ldd "$bin" 2>/dev/null | grep -oE '/[^ ]+' || true); do
    mkdir -p "$dir$(dirname "$lib")"
    cp -L "$lib" "$dir$lib"
  done
done
ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] || { echo "rootfs.sh: $ca is missing (install ca-certificates)" >&2; exit 1; }
mkdir -p "$dir/etc/ssl/certs"
cp -L "$ca" "$dir/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$dir/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$dir/etc/group"
chown 65532:65532 "$dir/home/nonroot" 2>/dev/null || true
