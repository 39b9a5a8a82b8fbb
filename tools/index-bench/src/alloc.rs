//! A counting global allocator (this binary only): live heap bytes, so an
//! index's own bytes are what is freed when it is dropped.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

static LIVE: AtomicIsize = AtomicIsize::new(0);

/// The system allocator, counting live bytes.
#[derive(Debug)]
pub struct Counting;

// SAFETY: every call is forwarded to `System` with the caller's arguments;
// only a counter is updated besides.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller guarantees for `GlobalAlloc::alloc`.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller guarantees for `GlobalAlloc::alloc_zeroed`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as the caller guarantees for `GlobalAlloc::dealloc`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as the caller guarantees for `GlobalAlloc::realloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

/// Live heap bytes now.
pub fn live() -> i64 {
    LIVE.load(Ordering::Relaxed) as i64
}

unsafe extern "C" {
    /// glibc: hands free heap memory back to the kernel.
    fn malloc_trim(pad: usize) -> i32;
}

/// Returns freed heap memory to the kernel, so a resident-set delta counts
/// only what the next structure takes.
pub fn trim() {
    // SAFETY: glibc's `malloc_trim` takes no pointers and may be called at
    // any time.
    unsafe { malloc_trim(0) };
}

/// Resident set size in bytes (from /proc/self/statm).
pub fn rss() -> i64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: i64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    pages * 4096
}
