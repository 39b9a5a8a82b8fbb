#!/usr/bin/env bash
# Smoke-runs every image archive in DIR with podman: `--help` answers, each
# server starts, answers /live on loopback, and exits 0 within its grace
# period after SIGTERM. Prints one line per image with its archive size.
#
# usage: smoke.sh [DIR]   (default target/images)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
dir=${1:-$root/target/images}
grace=${IC_SMOKE_GRACE_SECONDS:-10}
export CONTAINERS_CONF="${CONTAINERS_CONF:-$here/containers.conf}"
work=$(mktemp -d)
# The images run as 65532: let them read the certificate and kubeconfig.
chmod 0755 "$work"
cleanup() {
  # Servers run in $(...) subshells, so find them by the name prefix.
  podman ps -aq --filter "name=^ic-smoke-$$-" | xargs -r podman rm -f >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "smoke: $*" >&2; exit 1; }

# Every server binds port 0 on loopback and reports what it bound with
# --listen-report (a guessed "free" port can be taken by another server on
# the host network before the image binds it). The admin server's port, the
# one that answers /live, is read back from the report.
report_port() { # file -> admin port, once reported
  local file=$1 deadline=$((SECONDS + 60))
  while [ $SECONDS -lt $deadline ]; do
    if [ -s "$file" ]; then
      sed -n 's/.*"admin":"[^"]*:\([0-9]*\)".*/\1/p' "$file" | grep . && return 0
    fi
    sleep 0.1
  done
  return 1
}

# HTTP GET over bash's /dev/tcp (no curl needed); prints the status code.
http_status() {
  local port=$1 path=$2 line
  exec 3<>"/dev/tcp/127.0.0.1/$port" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n' "$path" >&3
  IFS= read -r line <&3 || true
  exec 3<&- 3>&-
  echo "$line" | awk '{print $2}'
}

wait_live() {
  local name=$1 port=$2 deadline=$((SECONDS + 60))
  while [ $SECONDS -lt $deadline ]; do
    if [ "$(http_status "$port" /live 2>/dev/null || true)" = 200 ]; then return 0; fi
    if [ "$(podman inspect -f '{{.State.Running}}' "$name" 2>/dev/null)" != true ]; then
      podman logs "$name" >&2 || true
      fail "$name exited before answering /live"
    fi
    sleep 0.2
  done
  podman logs "$name" >&2 || true
  fail "$name did not answer /live on 127.0.0.1:$port within 60 s"
}

# A serving certificate for the webhook's file mode.
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost \
  -keyout "$work/tls.key" -out "$work/tls.crt" >/dev/null 2>&1 \
  || fail "openssl is needed to make the webhook's test certificate"
chmod 0644 "$work/tls.key" "$work/tls.crt"
# A kubeconfig that points nowhere: the binaries build their clients lazily.
cat >"$work/kubeconfig" <<KUBE
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
KUBE
chmod 0644 "$work/kubeconfig"

run_server() { # image args...
  local image=$1; shift
  local name="ic-smoke-$$-$image" report="$work/report-$image" port
  mkdir -p "$report" && chmod 0777 "$report"
  podman run -q -d --name "$name" --network host -v "$work:/smoke:ro" -v "$report:/report" \
    "$ref" --listen-report /report/listening.json "$@" >/dev/null
  port=$(report_port "$report/listening.json") || {
    podman logs "$name" >&2 || true
    fail "$image reported no admin address in 60 s"
  }
  wait_live "$name" "$port"
  local start end took code
  start=$(date +%s%N)
  podman stop -t "$grace" "$name" >/dev/null
  end=$(date +%s%N)
  took=$(( (end - start) / 1000000 ))
  code=$(podman inspect -f '{{.State.ExitCode}}' "$name")
  [ "$code" = 0 ] || { podman logs "$name" >&2 || true; fail "$image exited $code after SIGTERM (want 0)"; }
  [ "$took" -lt $((grace * 1000)) ] || fail "$image took ${took} ms to stop (grace ${grace} s)"
  podman rm "$name" >/dev/null
  echo "stopped on SIGTERM in ${took} ms, exit 0"
}

count=0
for archive in "$dir"/*.tar; do
  [ -e "$archive" ] || fail "no image archives in $dir"
  image=$(basename "$archive" .tar)
  size=$(du -h "$archive" | cut -f1)
  ref=$(podman load -q -i "$archive" | sed -n 's/^Loaded image[^:]*: //p' | tail -n 1)
  [ -n "$ref" ] || fail "podman could not load $archive"
  user=$(podman image inspect -f '{{.Config.User}}' "$ref")
  unpacked=$(podman image inspect -f '{{.Size}}' "$ref" | awk '{printf "%.1f MB", $1 / 1e6}')
  [ "$user" = 65532:65532 ] || fail "$image runs as '$user' (want 65532:65532)"
  podman run -q --rm --network host "$ref" --help >"$work/help" || fail "$image --help failed"
  grep -qi usage "$work/help" || fail "$image --help printed no usage"
  # Every port a server opens is named here, on 127.0.0.1:0.
  case "$image" in
    ic-controller)
      result=$(run_server "$image" --admin-addr 127.0.0.1:0 --leader-election=false) ;;
    ic-webhook)
      result=$(run_server "$image" --admin-addr 127.0.0.1:0 --https-addr 127.0.0.1:0 \
        --tls-cert /smoke/tls.crt --tls-key /smoke/tls.key --kubeconfig /smoke/kubeconfig) ;;
    ic-index-server)
      podman run -q --rm --network host --entrypoint /usr/local/bin/icctl "$ref" --help >/dev/null \
        || fail "icctl --help failed in $image"
      result=$(run_server "$image" --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0) ;;
    ic-kvevent-subscriber)
      # It binds only its admin port; the engine and index server it dials
      # are the discard port, where nothing answers (it retries).
      result=$(run_server "$image" --admin-addr 127.0.0.1:0 --model-id smoke --replica-id smoke-0 \
        --tenant smoke --index-server http://127.0.0.1:9 --engine-endpoint tcp://127.0.0.1:9) ;;
    ic-coordinator)
      result=$(run_server "$image" --host 127.0.0.1 --port 0) ;;
    *) fail "no smoke run is defined for image $image" ;;
  esac
  printf '%-24s archive %5s, image %9s, user %s, --help ok, /live ok, %s\n' "$image" "$size" "$unpacked" "$user" "$result"
  count=$((count + 1))
done
echo "smoke: $count images passed"
