//! The first-block filter: a small bit array, read without a lock, that
//! answers "no record of this key is a chain's first block" before a
//! lookup reads the key tables.
//!
//! Most prompts a fleet is asked about match no replica, so most lookups
//! end at their first block; at millions of keys, probing the key table
//! for it is a few cache misses (the table's header and two buckets spread
//! over the whole key space). Only records at depth 0 can start a match
//! (a prompt's first block is at depth 0; a fingerprint has one depth), so
//! this filter holds just those, a bit or two per chain, and stays in the
//! core's cache.
//!
//! A blocked Bloom filter: a key sets two bits of one 64-bit word, both
//! taken from its hash (words from the low bits, which pick neither a key
//! table nor a bucket). Its size is derived from the record capacity at
//! start (half a bit per record, 512 B to 1 MiB: 512 KiB at 5 M), not a
//! limit of its own: a smaller filter only answers "maybe" more often.
//!
//! Removals clear nothing (a stale bit only costs the probe it would have
//! cost anyway); rebuilds keep stale bits from piling up, once the first
//! blocks created since the last one outnumber those it found (and an
//! eighth of the bits). A rebuild is a pass over the pages, made in
//! slices of [`REBUILD_PAGES`] pages, one slice a [`super::Store::compact`]
//! call (under the placement mutex, so stores wait for one slice, not the
//! pass: at 5 M records the whole pass held them 3.9-8.7 ms), into a
//! [`Fresh`] filter that replaces the bits when the last page is read.
//!
//! **Never a false negative.** The writer sets a record's bits when it
//! creates a depth-0 record (before its key is published), and bits are
//! only cleared by [`Firsts::replace`], storing each word whole: a reader
//! loads either the old word or the new. The new words hold every depth-0
//! record live when the pass ends: every record is written under the
//! placement mutex (created, refilled into a hole, or moved by
//! compaction), and while a pass is under way each depth-0 record written
//! is also marked in its [`Fresh`] ([`Firsts::add`], [`Firsts::moved`]);
//! a record not written during the pass sat in the same page slot
//! throughout, and its page was read by a slice (a record's depth never
//! changes in place), so it was marked then. Pages made during the pass
//! hold only records written during it.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::keys::Sole;

/// The fewest and most bits the filter has (512 bytes to 1 MiB).
const MIN_BITS: usize = 1 << 12;
const MAX_BITS: usize = 1 << 23;

/// Pages a rebuild reads in one [`super::Store::compact`] call (at 2,048
/// records a page, about 16 k records: a few tens of microseconds).
pub(crate) const REBUILD_PAGES: usize = 8;

/// The filter.
#[derive(Debug)]
pub(crate) struct Firsts {
    words: Box<[AtomicU64]>,
    /// `words.len() - 1` (a power of two less one).
    mask: usize,
}

/// The writer's bookkeeping of the filter (kept under the placement
/// mutex).
#[derive(Debug, Default)]
pub(crate) struct FirstsCount {
    /// Depth-0 records created since the last rebuild.
    pub(crate) added: usize,
    /// Live depth-0 records the last rebuild found.
    pub(crate) found: usize,
    /// Rebuilds so far.
    pub(crate) rebuilds: u64,
    /// The rebuild under way, if any: the filter being built and the next
    /// page to read.
    pub(crate) pending: Option<(Fresh, usize)>,
}

/// A filter being built from the live depth-0 records (see
/// [`Firsts::fresh`]).
#[derive(Debug)]
pub(crate) struct Fresh {
    words: Vec<u64>,
    mask: usize,
    found: usize,
}

impl Fresh {
    /// Marks a live depth-0 record of hash `h`.
    pub(crate) fn add(&mut self, h: u64) {
        let (word, bits) = place(h, self.mask);
        if let Some(w) = self.words.get_mut(word) {
            *w |= bits;
        }
        self.found += 1;
    }
}

/// Word and bits of hash `h`.
#[inline]
fn place(h: u64, mask: usize) -> (usize, u64) {
    // Masked to the word count.
    #[allow(clippy::cast_possible_truncation)]
    let word = (h as usize) & mask;
    let bits = 1u64 << ((h >> 32) & 63) | 1u64 << ((h >> 40) & 63);
    (word, bits)
}

impl Firsts {
    /// A filter for an index of about `records` records: half a bit per
    /// record (chains are tens of blocks long, so a few percent of the
    /// bits are set), within [`MIN_BITS`] and [`MAX_BITS`].
    pub(crate) fn for_records(records: usize) -> Self {
        let bits = (records / 2).next_power_of_two().clamp(MIN_BITS, MAX_BITS);
        let words = bits / 64;
        Self {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            mask: words - 1,
        }
    }

    /// Whether a depth-0 record of hash `h` may exist (false: surely not).
    #[inline]
    pub(crate) fn may_hold(&self, h: u64) -> bool {
        let (word, bits) = place(h, self.mask);
        self.words
            .get(word)
            .is_some_and(|w| w.load(Ordering::Acquire) & bits == bits)
    }

    /// Marks a depth-0 record of hash `h` (the writer's, `sole` proves it:
    /// a load and a store, no atomic read-modify-write).
    #[inline]
    pub(crate) fn add(&self, _sole: &mut Sole, count: &mut FirstsCount, h: u64) {
        let (word, bits) = place(h, self.mask);
        count.added += 1;
        Self::moved(count, h);
        if let Some(w) = self.words.get(word) {
            let old = w.load(Ordering::Relaxed);
            if old & bits != bits {
                w.store(old | bits, Ordering::Release);
            }
        }
    }

    /// Marks a depth-0 record of hash `h` written elsewhere (moved by
    /// compaction, its bits already set) in the rebuild under way, if any.
    #[inline]
    pub(crate) fn moved(count: &mut FirstsCount, h: u64) {
        if let Some((fresh, _)) = &mut count.pending {
            fresh.add(h);
        }
    }

    /// Whether enough first blocks were created since the last rebuild
    /// that stale bits may have piled up.
    pub(crate) fn due(&self, count: &FirstsCount) -> bool {
        count.added >= count.found.max(self.words.len() * 64 / 8)
    }

    /// An empty filter of this one's size, for [`Firsts::replace`].
    pub(crate) fn fresh(&self) -> Fresh {
        Fresh {
            words: vec![0; self.words.len()],
            mask: self.mask,
            found: 0,
        }
    }

    /// Replaces the bits with `fresh`'s, word by word. `fresh` must hold
    /// every live depth-0 record (the caller holds the placement mutex, so
    /// none is created meanwhile; see the module's doc for a pass made in
    /// slices). `found` counts a record created in a page not yet read
    /// twice: the next rebuild comes at most that much later.
    pub(crate) fn replace(&self, _sole: &mut Sole, count: &mut FirstsCount, fresh: &Fresh) {
        for (w, &f) in self.words.iter().zip(&fresh.words) {
            if w.load(Ordering::Relaxed) != f {
                w.store(f, Ordering::Release);
            }
        }
        *count = FirstsCount {
            added: 0,
            found: fresh.found,
            rebuilds: count.rebuilds + 1,
            pending: None,
        };
    }

    /// Heap bytes.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.words.len() * size_of::<AtomicU64>()
    }

    /// Bits set (for tests).
    #[cfg(test)]
    pub(crate) fn ones(&self) -> u32 {
        self.words
            .iter()
            .map(|w| w.load(Ordering::Relaxed).count_ones())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::hash;

    #[test]
    fn every_added_hash_is_held_and_a_rebuild_keeps_exactly_the_live_ones() {
        let f = Firsts::for_records(1 << 16);
        let mut sole = Sole::default();
        let mut count = FirstsCount::default();
        let hs: Vec<u64> = (0..4_096u64).map(hash).collect();
        for &h in &hs {
            f.add(&mut sole, &mut count, h);
        }
        assert!(hs.iter().all(|&h| f.may_hold(h)));
        // Others mostly miss (a few percent may not).
        let others = (10_000..20_000u64).filter(|&k| f.may_hold(hash(k))).count();
        assert!(others < 1_000, "{others} of 10,000 absent keys held");
        assert!(f.due(&count));
        // Half of them live on.
        let mut fresh = f.fresh();
        for &h in hs.iter().step_by(2) {
            fresh.add(h);
        }
        f.replace(&mut sole, &mut count, &fresh);
        assert!(hs.iter().step_by(2).all(|&h| f.may_hold(h)));
        assert!(!f.due(&count));
        assert_eq!(count.found, 2_048);
        let after = f.ones();
        let fresh = Firsts::for_records(1 << 16);
        let mut c = FirstsCount::default();
        for &h in hs.iter().step_by(2) {
            fresh.add(&mut sole, &mut c, h);
        }
        assert_eq!(after, fresh.ones(), "the rebuild dropped the dead bits");
    }
}
