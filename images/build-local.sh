#!/usr/bin/env bash
# Registry-free image build: packages binaries already compiled in
# target/<profile>/ into FROM-scratch OCI images with buildah, one per line of
# images.list, and writes each as an OCI archive <out>/<image>.tar. The root
# filesystem is laid out by rootfs.sh, the same script the Dockerfile runs.
#
# usage: build-local.sh [--profile release|debug] [--bin-dir DIR] [--out DIR] [--tag TAG]
#                       [--list FILE] [IMAGE...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
profile=release
bin_dir=""
list=""
out=""
tag=""
want=()
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --bin-dir) bin_dir=$2; shift 2 ;;
    --list) list=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    -*) echo "build-local.sh: unknown flag $1" >&2; exit 2 ;;
    *) want+=("$1"); shift ;;
  esac
done
case "$profile" in release|debug) ;; *) echo "build-local.sh: --profile is release or debug" >&2; exit 2 ;; esac
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n 1)
[ -n "$tag" ] || tag=$version
if [ -z "$out" ]; then
  out="$root/target/images"
  [ "$profile" = release ] || out="$out/$profile"
fi
[ -n "$list" ] || list="$here/images.list"
[ -n "$bin_dir" ] || bin_dir="${CARGO_TARGET_DIR:-$root/target}/$profile"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
mkdir -p "$out"
# buildah mount needs root, or a user namespace that buildah unshare provides.
if [ "$(id -u)" -ne 0 ] && [ -z "${_IC_IN_UNSHARE:-}" ]; then
  _IC_IN_UNSHARE=1 exec buildah unshare "$0" --profile "$profile" --bin-dir "$bin_dir" --list "$list" --out "$out" --tag "$tag" ${want[@]+"${want[@]}"}
fi
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
built=0
while read -r image bins; do
  case "$image" in ''|'#'*) continue ;; esac
  if [ ${#want[@]} -gt 0 ] && ! printf '%s\n' "${want[@]}" | grep -qx "$image"; then continue; fi
  paths=()
  for b in $bins; do paths+=("$bin_dir/$b"); done
  "$here/rootfs.sh" "$work/$image" "${paths[@]}"
  entry=$(set -- $bins; echo "$1")
  ref="localhost/inferencecache/$image:$tag"
  c=$(buildah from scratch)
  m=$(buildah mount "$c")
  cp -a "$work/$image/." "$m/"
  buildah umount "$c" >/dev/null
  buildah config \
    --entrypoint "[\"/usr/local/bin/$entry\"]" --cmd '[]' \
    --user 65532:65532 --workingdir /home/nonroot --env PATH=/usr/local/bin \
    --stop-signal SIGTERM \
    --label org.opencontainers.image.title="$image" \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.revision="$revision" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    --label io.inferencecache.build-profile="$profile" \
    "$c"
  buildah commit -q --rm --timestamp 0 --identity-label=false "$c" "$ref" >/dev/null
  rm -f "$out/$image.tar"
  buildah push -q "$ref" "oci-archive:$out/$image.tar:$ref"
  printf '%-24s %s (%s)\n' "$image" "$out/$image.tar" "$(du -h "$out/$image.tar" | cut -f1)"
  built=$((built + 1))
done <"$list"
[ "$built" -gt 0 ] || { echo "build-local.sh: no image matched ${want[*]}" >&2; exit 2; }
