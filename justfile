# InferenceCache developer recipes. `./dev.sh <recipe>` installs `just` and
# the tools a recipe needs first; with them installed, `just <recipe>` works too.

set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes.
default:
    @just --list

# Run the main job on the embedded defaults (the local fleet on loopback).
demo *ARGS:
    cargo build --workspace --bins
    target/debug/ic-local-fleet {{ARGS}}

# The whole test suite: formatting, lints, supply chain, tests.
test: fmt-check clippy deny
    cargo nextest run --workspace --all-targets --no-fail-fast

# Same as `test` (what CI runs).
ci: test

# Format the code.
fmt:
    cargo fmt --all

# Fail when the code is not formatted.
fmt-check:
    cargo fmt --all -- --check

# Lint everything, warnings are errors.
clippy:
    cargo clippy --workspace --all-targets -- -D warnings

# Licences, duplicate versions (each allowed one with its reason) and sources
# of every dependency (deny.toml); offline, once every platform's crates are
# fetched (cargo deny reads the whole graph, which a build for this platform
# alone does not download).
deny:
    cargo fetch --locked --quiet
    cargo deny --offline check --deny warnings licenses bans sources

# RustSec advisories for every dependency: fetches the advisory database
# from GitHub, so it is not part of `test` (which runs offline). Given a
# checkout of github.com/rustsec/advisory-db, it reads that instead, offline
# (cargo-deny looks for the database under this fixed directory name).
audit DB="":
    #!/usr/bin/env bash
    set -euo pipefail
    if [ -n "{{DB}}" ]; then
      dbs="${CARGO_HOME:-$HOME/.cargo}/advisory-dbs"
      mkdir -p "$dbs"
      rm -rf "$dbs/advisory-db-3157b0e258782691"
      git clone --quiet "{{DB}}" "$dbs/advisory-db-3157b0e258782691"
      git -C "$dbs/advisory-db-3157b0e258782691" log -1 --format='advisory database of %cs (%h)'
      cargo deny --offline check --deny warnings advisories
    else
      cargo deny check --deny warnings advisories
    fi

# Fuzz every target (or those named) under libFuzzer, FUZZ_SECONDS each
# (default 600); the suite replays the committed corpora (fuzz/README.md).
fuzz *TARGETS:
    fuzz/run.sh {{TARGETS}}

# Regenerate committed artefacts: CRD YAML (the gRPC code is generated at build time
# by libs/proto/build.rs with a vendored protoc).
generate:
    cargo run --quiet -p ic-api --bin crdgen
    cargo build --quiet -p ic-proto

# Fail when committed generated artefacts are stale.
generate-check:
    cargo run --quiet -p ic-api --bin crdgen -- --check

# Build release binaries, package one FROM-scratch OCI image per binary into
# target/images/<image>.tar (no registry needed), and smoke-run each with podman.
images:
    cargo build --release --workspace --bins
    images/build-local.sh --profile release
    images/smoke.sh target/images

# The chart tests: lint, golden renders, strict validation, contracts with the code.
chart:
    cargo build --workspace --bins
    cargo nextest run -p ic-e2e --test chart --test chart_contract

# Rewrite the chart's golden renders (review the diff before committing).
chart-golden:
    UPDATE_GOLDEN=1 cargo nextest run -p ic-e2e --test chart -E 'test(renders_match_their_golden_files)'

# The conformance tier: our wiring fed to the real LMCache, vLLM, SGLang,
# Mooncake and Redis (the venv comes from e2e/conformance/setup.sh).
conformance:
    cargo nextest run -p ic-e2e --test conformance

# The cluster suite (not part of `test`): installs the chart into the cluster
# KUBECONFIG names, wires an engine pod and checks a Ready backend and a
# LookupRoute hit. Push the images first and set IC_CLUSTER_IMAGE_REGISTRY.
cluster-test:
    cargo build --workspace --bins
    cargo nextest run -p ic-e2e --features cluster --test cluster --no-capture

# Run the criterion benchmarks.
bench *ARGS:
    cargo bench --workspace {{ARGS}}
