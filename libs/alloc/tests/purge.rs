//! `keep_freed_pages` and `set_purge_delay_ms`: mimalloc stops (or starts
//! again) returning freed pages to the OS. mimalloc reads its variables
//! (`MIMALLOC_PURGE_DELAY`, legacy `MIMALLOC_RESET_DELAY`) once at start,
//! so each test runs its body in a child process of this test binary with
//! an environment it sets itself, whatever the caller's environment holds.

use std::process::Command;

use ic_alloc::{PURGE_DELAY_ENV, SplitAlloc, keep_freed_pages, purge_delay_ms, set_purge_delay_ms};

#[global_allocator]
static ALLOCATOR: SplitAlloc = SplitAlloc;

/// Set in a child: the body to run there.
const CHILD: &str = "IC_ALLOC_PURGE_CHILD";

// Collects every thread-free and empty page now, purging those due, as
// mimalloc would a second later from inside some allocation.
#[allow(unsafe_code)]
unsafe extern "C" {
    fn mi_collect(force: bool);
}

fn resident_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages in statm");
    pages * 4096
}

/// Resident bytes after filling `bytes` in small blocks, freeing them and
/// collecting, against before the fill.
fn kept_after_free(bytes: usize) -> (usize, usize) {
    let blocks: Vec<Vec<u8>> = (0..bytes / 4096).map(|i| vec![i as u8; 4096]).collect();
    let filled = resident_bytes();
    drop(blocks);
    // SAFETY: a plain call into the linked mimalloc.
    #[allow(unsafe_code)]
    unsafe {
        mi_collect(true);
    }
    (filled, resident_bytes())
}

const BYTES: usize = 64 << 20;

fn purged(bytes: usize) {
    let (filled, after) = kept_after_free(bytes);
    assert!(
        filled.saturating_sub(after) > bytes / 2,
        "purged: resident {filled} -> {after} bytes"
    );
}

fn kept(bytes: usize) {
    let (filled, after) = kept_after_free(bytes);
    assert!(
        filled.saturating_sub(after) < bytes / 8,
        "kept: resident {filled} -> {after} bytes"
    );
}

/// Runs `test` (this binary's test of that name) in a child process with
/// mimalloc's variables removed and `env` set, and fails with its output
/// when it fails. In the child (`CHILD` set) returns false: run the body.
fn in_child(test: &str, env: &[(&str, &str)]) -> bool {
    if std::env::var_os(CHILD).is_some() {
        return false;
    }
    let mut child = Command::new(std::env::current_exe().expect("this test binary"));
    child
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1");
    for name in PURGE_DELAY_ENV {
        child.env_remove(name);
    }
    child.envs(env.iter().copied());
    let out = child.output().expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{test} in a child with {env:?}: {:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The child ran the one test (not zero: a renamed test would pass).
    assert!(stdout.contains("1 passed"), "{test}: {stdout}");
    true
}

#[test]
fn freed_pages_stay_mapped_once_kept() {
    if in_child("freed_pages_stay_mapped_once_kept", &[]) {
        return;
    }
    // The option index is mimalloc's purge delay: its default, 1,000 ms.
    assert_eq!(
        purge_delay_ms(),
        1000,
        "MI_OPTION_PURGE_DELAY does not read mimalloc's purge delay default \
         (MIMALLOC_PURGE_DELAY and MIMALLOC_RESET_DELAY are removed here)"
    );
    // By default the freed pages go back to the OS.
    purged(BYTES);
    keep_freed_pages();
    assert_eq!(purge_delay_ms(), -1);
    kept(BYTES);
    // `--allocator-purge-delay-ms 0`: they go back again.
    set_purge_delay_ms(0);
    assert_eq!(purge_delay_ms(), 0);
    purged(BYTES);
}

/// mimalloc's own variable, where set, wins over `keep_freed_pages`, and
/// `set_purge_delay_ms` over it.
#[test]
fn mimallocs_variable_wins_over_keep() {
    if in_child(
        "mimallocs_variable_wins_over_keep",
        &[("MIMALLOC_PURGE_DELAY", "250")],
    ) {
        return;
    }
    assert_eq!(purge_delay_ms(), 250);
    keep_freed_pages();
    assert_eq!(purge_delay_ms(), 250);
    set_purge_delay_ms(-1);
    assert_eq!(purge_delay_ms(), -1);
}
