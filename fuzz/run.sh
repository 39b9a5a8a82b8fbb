#!/usr/bin/env bash
# Runs every fuzz target (or those named) under libFuzzer with AddressSanitizer
# for FUZZ_SECONDS each (default 600), starting from the committed corpus.
# New inputs go to target/fuzz/corpus/<target> (with FUZZ_MERGE=1, those
# that reach new code are then merged into fuzz/corpus/<target>), crashes to
# fuzz/libfuzzer/artifacts/<target>; a crash exits non-zero. Fix it, then
# commit the input under fuzz/regressions/<target>/ (the suite replays it).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${FUZZ_SECONDS:-600}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(ls fuzz/corpus)
fi
# cargo-fuzz passes nightly-only sanitizer flags; the pinned stable
# toolchain accepts them with RUSTC_BOOTSTRAP.
export RUSTC_BOOTSTRAP=1
for t in "${targets[@]}"; do
  scratch="target/fuzz/corpus/$t"
  mkdir -p "$scratch"
  echo "== $t for ${seconds}s"
  status=0
  cargo fuzz run --fuzz-dir fuzz/libfuzzer "$t" "$scratch" "fuzz/corpus/$t" \
    -- -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=10 -print_final_stats=1 \
    > "target/fuzz/$t.log" 2>&1 || status=$?
  grep -E "^(#[0-9]+ *DONE|stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)|==[0-9]+==ERROR|SUMMARY|error)" \
    "target/fuzz/$t.log" || true
  [ "$status" -eq 0 ] || { echo "$t failed (a crash, or the build): see target/fuzz/$t.log" >&2; exit 1; }
  if [ -n "${FUZZ_MERGE:-}" ]; then
    # Keep, in the committed corpus, the new inputs that reach new code.
    cargo fuzz run --fuzz-dir fuzz/libfuzzer "$t" "fuzz/corpus/$t" "$scratch" -- -merge=1 \
      > "target/fuzz/$t.merge.log" 2>&1
    grep -E "MERGE-OUTER: [0-9]+ new files" "target/fuzz/$t.merge.log" || true
  fi
done
