//! `keep_freed_pages`: mimalloc stops returning freed pages to the OS.
//! One test in its own process, so the option starts at mimalloc's default.

use ic_alloc::{SplitAlloc, keep_freed_pages, purge_delay_ms};

#[global_allocator]
static ALLOCATOR: SplitAlloc = SplitAlloc;

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

#[test]
fn freed_pages_stay_mapped_once_kept() {
    const BYTES: usize = 64 << 20;
    // The option index is mimalloc's purge delay: its default, 1,000 ms.
    assert_eq!(purge_delay_ms(), 1000);
    // By default the freed pages go back to the OS.
    let (filled, after) = kept_after_free(BYTES);
    assert!(
        filled.saturating_sub(after) > BYTES / 2,
        "purged by default: resident {filled} -> {after} bytes"
    );
    keep_freed_pages();
    assert_eq!(purge_delay_ms(), -1);
    let (filled, after) = kept_after_free(BYTES);
    assert!(
        filled.saturating_sub(after) < BYTES / 8,
        "kept: resident {filled} -> {after} bytes"
    );
}
