#!/usr/bin/env bash
# Builds, once per machine, the venv the conformance tier runs the real
# engine-side packages in (LMCache, vLLM, SGLang, Mooncake; about 8 GB, most
# of it torch and its CUDA libraries, which load without a GPU), and prints
# its path. The venv's name carries a hash of the requirement lists and the
# engine versions, so a change to them builds a new one beside the old.
#
# vLLM and SGLang are installed without their dependency trees (GPU kernels,
# a second torch): the tier runs their argument parsers, whose imports
# requirements.txt lists. vLLM 0.11.2 and 0.33.0 live in separate --target
# dirs, put on PYTHONPATH per case.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache="${IC_TOOLS_CACHE:-$HOME/.cache/inferencecache/tools}"
VLLM_VERSIONS="0.11.2 0.33.0"
SGLANG_VERSION=0.5.23

log() { printf '\033[1;34m[conformance]\033[0m %s\n' "$*" >&2; }

# The key covers what is installed, not how: the lists and the versions.
key=$( (cat "$here/requirements.txt" "$here/constraints.txt"; echo "$VLLM_VERSIONS $SGLANG_VERSION") | sha256sum | cut -c1-12)
venv="$cache/conformance-$key"

system_ready() {
  # redis-server for the RESP provider, and the RDMA/NUMA libraries
  # Mooncake's transfer engine links (loaded even for TCP).
  local libs
  libs=$(/sbin/ldconfig -p 2>/dev/null || true)
  command -v redis-server >/dev/null 2>&1 \
    && [[ "$libs" == *libibverbs.so.1* && "$libs" == *librdmacm.so.1* && "$libs" == *libnuma.so.1* ]]
}

if [ -f "$venv/.complete" ] && system_ready; then
  echo "$venv"
  exit 0
fi
# Parallel tests may all ask at once: one installs, the others wait for it.
mkdir -p "$cache"
exec 9>"$cache/conformance.lock"
flock 9
if ! system_ready; then
  log "installing redis-server, libibverbs1, librdmacm1, libnuma1"
  run=""; [ "$(id -u)" -ne 0 ] && run="sudo -n"
  $run apt-get update -qq >&2 && $run apt-get install -y -qq redis-server libibverbs1 librdmacm1 libnuma1 python3-venv >&2
fi
if [ -f "$venv/.complete" ]; then
  echo "$venv"
  exit 0
fi

log "building $venv (one-time: about 8 GB from PyPI, a few minutes)"
rm -rf "$venv"
mkdir -p "$cache"
python3 -m venv "$venv"
pip=("$venv/bin/pip" --disable-pip-version-check --no-input --quiet)
"${pip[@]}" install -r "$here/requirements.txt" -c "$here/constraints.txt" >&2
"${pip[@]}" install --no-deps "sglang==$SGLANG_VERSION" >&2
for v in $VLLM_VERSIONS; do
  "${pip[@]}" install --no-deps --target "$venv/vllm-$v" "vllm==$v" >&2
done
# A smoke import of each piece, so a broken venv fails here, not in a test.
"$venv/bin/python" -c 'import lmcache, mooncake.store, redis, sglang.srt.server_args' >&2
touch "$venv/.complete"
# Venvs of other requirement lists are left to whoever may still use them
# (another checkout); those unused for two weeks are removed.
find "$cache" -maxdepth 1 -name 'conformance-*' -type d ! -path "$venv" -mtime +14 -exec rm -rf {} + 2>/dev/null || true
echo "$venv"
