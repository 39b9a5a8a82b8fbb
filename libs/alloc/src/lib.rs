//! The global allocator of the InferenceCache servers (`ic-coordinator`,
//! `ic-index-server`): mimalloc below [`HUGE`] bytes, the system allocator
//! from there. The request paths allocate small blocks per request and per
//! key, where mimalloc's fast paths cost a fraction of glibc's and it does
//! not stop a later request to consolidate what an earlier one freed
//! (glibc's `malloc_consolidate` of a tokenized prompt's frees was a fifth
//! of what the endpoint picker's decision took beyond a lookup: 75 µs
//! without fastbins against 92–102 µs, 2026-12-05; `git show
//! 5242aa15:docs/benchmarks.md`, since pruned from it).
//! Blocks from [`HUGE`] up go to the system allocator: a table that grows
//! by doubling is moved by glibc's `realloc` (mremap) where mimalloc copies
//! it, a stall of tens of ms at every doubling past a million keys (the
//! coordinator's `/events` p99). glibc mmaps only above its dynamic
//! threshold (128 KiB, rising to at most 32 MiB as mmapped blocks are
//! freed): blocks of 1–32 MiB may still be copied, every block from 32 MiB
//! up is moved.
//!
//! mimalloc returns pages left free for a second to the OS (`madvise`)
//! from inside the next allocation or free, a request's on a server;
//! [`keep_freed_pages`] turns that off for a binary that asks
//! (`ic-coordinator`), [`set_purge_delay_ms`] sets the delay to any value
//! (its `--allocator-purge-delay-ms`) and [`purge_delay_ms`] reads it.
//!
//! A binary opts in with
//! `#[global_allocator] static ALLOCATOR: ic_alloc::SplitAlloc = ic_alloc::SplitAlloc;`
//! (no `unsafe` there). The `unsafe` is all here, in three places: the
//! `GlobalAlloc` impl, the declaration of mimalloc's two option functions
//! (`mi_option_get`, `mi_option_set`), and the two calls to them in
//! [`set_purge_delay_ms`] and [`purge_delay_ms`].

use std::alloc::{GlobalAlloc, Layout, System};

use mimalloc::MiMalloc;

/// Bytes from which a block is the system allocator's.
pub const HUGE: usize = 1 << 20;

/// mimalloc below [`HUGE`] bytes, the system allocator from it. Which one
/// owns a block follows from its layout's size alone, which every call
/// carries.
#[derive(Clone, Copy, Debug, Default)]
pub struct SplitAlloc;

// SAFETY: every block is freed or resized by the allocator that made it
// (chosen by its size, which `dealloc` and `realloc` are given unchanged);
// a resize across `HUGE` allocates in the other one, copies, and frees.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for SplitAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        unsafe {
            if layout.size() >= HUGE {
                System.alloc(layout)
            } else {
                MiMalloc.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if layout.size() >= HUGE {
                System.alloc_zeroed(layout)
            } else {
                MiMalloc.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from the allocator its size chose.
        unsafe {
            if layout.size() >= HUGE {
                System.dealloc(ptr, layout)
            } else {
                MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same-side resizes go to the owner; a crossing one makes a
        // block of the new size (and the old alignment) on the other side,
        // copies the smaller length, and frees the old block with its owner.
        unsafe {
            match (layout.size() >= HUGE, new_size >= HUGE) {
                (true, true) => System.realloc(ptr, layout, new_size),
                (false, false) => MiMalloc.realloc(ptr, layout, new_size),
                _ => {
                    let new_layout = Layout::from_size_align_unchecked(new_size, layout.align());
                    let new = self.alloc(new_layout);
                    if !new.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    new
                }
            }
        }
    }
}

// === Returning freed pages ===

/// mimalloc's `mi_option_purge_delay`: its index in the `mi_option_e` enum
/// of `c_src/mimalloc/v3/include/mimalloc.h` in `libmimalloc-sys` 0.1.49,
/// the version the workspace pins exactly (`mimalloc` and
/// `libmimalloc-sys` in the root `Cargo.toml`), since that crate exports no
/// constant for it and another version may number the options otherwise.
/// `tests/purge.rs` checks that it reads that option's default (1,000 ms).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// mimalloc's environment variables for the purge delay (the second its
/// legacy name), which it reads at start.
pub const PURGE_DELAY_ENV: [&str; 2] = ["MIMALLOC_PURGE_DELAY", "MIMALLOC_RESET_DELAY"];

// The C functions of the mimalloc that `libmimalloc-sys` links (its
// `extended` feature declares them too, but pulls in a crate for C types
// this needs none of).
#[allow(unsafe_code)]
unsafe extern "C" {
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}

/// Keeps the pages mimalloc frees mapped instead of returning them to the
/// OS. By default mimalloc returns (`madvise(MADV_DONTNEED)`) the pages
/// left free for a second, from inside whatever allocation or free comes
/// next: on a server that is a request, which then pays the system call
/// and, when the memory is used again, a page fault per page. A process
/// whose small-block memory comes back to its peak (request buffers,
/// batches) loses nothing by keeping it; its resident size stays at that
/// peak. Call it first thing in `main`; mimalloc's own variables
/// ([`PURGE_DELAY_ENV`]), where set, still win. Blocks from [`HUGE`] up
/// are the system allocator's and unaffected.
pub fn keep_freed_pages() {
    // mimalloc's own variable, where an operator set one, decides.
    if PURGE_DELAY_ENV
        .iter()
        .any(|name| std::env::var_os(name).is_some())
    {
        return;
    }
    set_purge_delay_ms(-1);
}

/// Sets mimalloc's purge delay: pages left free this many ms go back to
/// the OS (0: at once; -1: never, as [`keep_freed_pages`]). Overrides
/// mimalloc's environment variables.
pub fn set_purge_delay_ms(ms: i32) {
    // SAFETY: sets an option word; mimalloc reads it at each purge decision.
    #[allow(unsafe_code)]
    unsafe {
        mi_option_set(MI_OPTION_PURGE_DELAY, std::ffi::c_long::from(ms));
    }
}

/// mimalloc's purge delay in ms (-1: freed pages are kept).
pub fn purge_delay_ms() -> i64 {
    // SAFETY: reads an option word.
    #[allow(unsafe_code)]
    let ms = unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) };
    // `c_long` is `i64` or `i32`, by platform: widening either way.
    ms as i64
}

#[cfg(test)]
mod tests {
    use super::{HUGE, SplitAlloc};

    // The tests allocate through it, as the binaries do.
    #[global_allocator]
    static ALLOCATOR: SplitAlloc = SplitAlloc;

    /// Blocks grown and shrunk across `HUGE` (each time moved to the other
    /// allocator) and within either side keep their bytes, and free cleanly.
    #[test]
    fn blocks_keep_their_bytes_across_the_split() {
        let fill = |v: &mut Vec<u64>, n: usize| {
            let start = v.len();
            v.extend((start..n).map(|i| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        };
        let check = |v: &[u64]| {
            v.iter()
                .enumerate()
                .all(|(i, x)| *x == (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        };
        let words = |bytes: usize| bytes / std::mem::size_of::<u64>();
        let mut v = Vec::with_capacity(words(HUGE / 4));
        fill(&mut v, words(HUGE / 4));
        // mimalloc to the system allocator, then within it (mremap).
        v.reserve_exact(words(HUGE * 3));
        fill(&mut v, words(HUGE * 3));
        v.reserve_exact(words(HUGE * 8));
        fill(&mut v, words(HUGE * 5));
        assert!(check(&v), "the bytes moved intact");
        // Back under the line: the system allocator to mimalloc.
        v.truncate(words(HUGE / 8));
        v.shrink_to_fit();
        assert!(v.capacity() * 8 < HUGE);
        assert!(check(&v), "the bytes kept after shrinking");
        // Zeroed blocks on both sides.
        for bytes in [64, HUGE / 2, HUGE, HUGE * 2] {
            let z = vec![0u8; bytes];
            assert!(z.iter().all(|b| *b == 0), "{bytes} zeroed bytes");
        }
        // Aligned past the system allocator's minimum, across the line.
        #[repr(align(4096))]
        #[derive(Clone, Copy, Debug, PartialEq)]
        struct Page([u8; 4096]);
        let mut pages: Vec<Page> = (0..64).map(|i| Page([i as u8; 4096])).collect();
        pages.extend((64..600).map(|i| Page([i as u8; 4096])));
        assert!(pages.capacity() * 4096 >= HUGE);
        assert!(
            pages
                .iter()
                .all(|p| (p.0.as_ptr() as usize).is_multiple_of(4096))
        );
        assert!(
            pages
                .iter()
                .enumerate()
                .all(|(i, p)| p.0.iter().all(|b| *b == i as u8))
        );
    }
}
