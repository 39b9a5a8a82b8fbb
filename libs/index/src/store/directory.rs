//! The page directory, read without a lock: pages in chunks of
//! [`CHUNK_PAGES`], each chunk allocated once when its first page is made
//! and never moved, so a reader reaches page `n` with two loads and takes
//! only that page's own lock. A page given back is emptied in place (its
//! record array freed) rather than removed; readers that reach it through
//! a stale record id find no record there, as they would find a dead one.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::RwLock;

use crate::arena::{MAX_PAGES, PAGE_RECORDS, Page};

/// Pages per chunk.
const CHUNK_PAGES: usize = 64;

/// [`CHUNK_PAGES`] pages, allocated together.
type Chunk = Box<[RwLock<Page>]>;

/// The directory.
#[derive(Debug)]
pub(crate) struct Directory {
    /// Allocated with the first page (an empty index holds nothing).
    chunks: OnceLock<Box<[OnceLock<Chunk>]>>,
    /// Chunks the directory may have.
    max_chunks: usize,
    /// Pages made so far (only the writer adds them).
    len: AtomicUsize,
}

impl Directory {
    /// Room for `records` records, give or take: four times the pages they
    /// fill plus two chunks, never beyond [`MAX_PAGES`]. (A resync keeps the
    /// replica's old records, dead, until it ends, so for a moment a full
    /// index holds twice its records and more; only the chunks used are
    /// allocated, so the headroom costs a few bytes per chunk.)
    pub(crate) fn for_records(records: usize) -> Self {
        let pages = records
            .div_ceil(PAGE_RECORDS)
            .saturating_mul(4)
            .saturating_add(2 * CHUNK_PAGES)
            .min(MAX_PAGES);
        Self {
            chunks: OnceLock::new(),
            max_chunks: pages.div_ceil(CHUNK_PAGES),
            len: AtomicUsize::new(0),
        }
    }

    /// Most pages this directory can make.
    #[cfg(test)]
    pub(crate) fn max_pages(&self) -> usize {
        (self.max_chunks * CHUNK_PAGES).min(MAX_PAGES - 1)
    }

    /// Pages made so far.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// Page `n`, if made.
    #[inline]
    pub(crate) fn get(&self, n: usize) -> Option<&RwLock<Page>> {
        if n >= self.len() {
            return None;
        }
        self.chunks
            .get()?
            .get(n / CHUNK_PAGES)?
            .get()?
            .get(n % CHUNK_PAGES)
    }

    /// Every page made, with its number.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &RwLock<Page>)> {
        (0..self.len()).filter_map(|n| self.get(n).map(|p| (n, p)))
    }

    /// Makes the next page (empty, its records not yet allocated) and
    /// returns its number; `None` when the directory is full. Writer only
    /// (the caller holds the placement mutex).
    pub(crate) fn push(&self) -> Option<usize> {
        let n = self.len.load(Ordering::Relaxed);
        // The last page stays unused (ids stay below `RecId::MAX`).
        if n + 1 >= MAX_PAGES {
            return None;
        }
        let max = self.max_chunks;
        let chunks = self
            .chunks
            .get_or_init(|| (0..max).map(|_| OnceLock::new()).collect());
        let chunk = chunks.get(n / CHUNK_PAGES)?;
        chunk.get_or_init(|| {
            (0..CHUNK_PAGES)
                .map(|_| RwLock::new(Page::vacant()))
                .collect()
        });
        self.len.store(n + 1, Ordering::Release);
        Some(n)
    }

    /// Heap bytes of the directory itself (the chunks' page structs, not
    /// what the pages hold).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.chunks.get().map_or(0, |chunks| {
            chunks.len() * size_of::<OnceLock<Chunk>>()
                + chunks.iter().filter(|c| c.get().is_some()).count()
                    * CHUNK_PAGES
                    * size_of::<RwLock<Page>>()
        })
    }
}
