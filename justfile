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

# The whole test suite: formatting, lints, generated-artefact drift, tests.
test: fmt-check clippy
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

# Regenerate committed artefacts: CRD YAML (the gRPC code is generated at build time
# by libs/proto/build.rs with a vendored protoc).
generate:
    cargo run --quiet -p ic-api --bin crdgen
    cargo build --quiet -p ic-proto

# Fail when committed generated artefacts are stale.
generate-check:
    cargo run --quiet -p ic-api --bin crdgen -- --check

# Run the criterion benchmarks.
bench *ARGS:
    cargo bench --workspace {{ARGS}}
