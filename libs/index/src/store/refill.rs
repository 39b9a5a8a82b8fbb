//! Reusing dead slots: once dead records pass a small share of all
//! records, the writer queues the pages with the most dead slots and puts
//! new records into their runs of dead slots before appending.
//!
//! Refilling costs nothing beyond the write itself, whereas compaction
//! copies live records and re-points their keys; so when engines evict in
//! an order that leaves holes all over the pages, refilling keeps the
//! dead share (and so the memory per entry) low, and compaction stays
//! the backstop for an index that only shrinks.
//!
//! Only runs of [`MIN_RUN`] or more dead slots are refilled: a chain laid
//! into single holes would be scattered, and a lookup walking it would
//! probe the key table at every break instead of reading on.

use super::{PageWriter, Placement, Store};
use crate::arena::PAGE_RECORDS;

/// Refilling starts when dead records exceed 1/`REFILL_LIMIT` of all
/// records…
pub(super) const REFILL_LIMIT: usize = 16;
/// …and each pick queues runs for 1/`REFILL_BATCH` of all records (so that
/// picks, which look at every page, stay rare).
const REFILL_BATCH: usize = 32;
/// Shortest run of dead slots refilled.
#[cfg(not(test))]
pub(super) const MIN_RUN: usize = 16;
// Pages hold 8 records under test.
#[cfg(test)]
pub(super) const MIN_RUN: usize = 2;
/// Pages looked into per pick beyond those queued (a pick that finds the
/// sparsest pages holding only short runs gives up early).
const PICK_SCAN: usize = 64;

impl Store {
    /// Queues pages to refill if dead records are over their share and the
    /// slots queued last time are running out (before they are gone, so
    /// that a chain rarely finds the queue empty halfway and appends its
    /// rest).
    pub(super) fn pick_refills(&self, place: &mut Placement) {
        let goal = (place.records / REFILL_BATCH).max(PAGE_RECORDS);
        if (place.queued * 4 >= goal && !place.refill.is_empty())
            || place.dead <= place.pick_after
            || place.dead * REFILL_LIMIT <= place.records
        {
            return;
        }
        let mut pages: Vec<(usize, usize)> = Vec::new();
        {
            for (n, page) in self.pages.iter() {
                let page = page.read();
                let dead = page.len() - page.live();
                if place.current != Some(n) && dead >= MIN_RUN {
                    pages.push((page.live(), n));
                }
            }
        }
        pages.sort_unstable();
        let mut found = 0;
        place.refill.clear();
        let dir = &self.pages;
        for (looked, (_, n)) in pages.into_iter().enumerate() {
            if found >= goal || looked >= place.refill.len() + PICK_SCAN {
                break;
            }
            let holes = dir.get(n).map_or(0, |p| p.read().holes(MIN_RUN));
            if holes > 0 {
                found += holes;
                place.refill.push(n);
            }
        }
        // Filled from the end: lowest page first.
        place.refill.sort_unstable_by(|a, b| b.cmp(a));
        place.refill_from = 0;
        place.queued = found;
        // Too few long runs: wait until more records died before looking
        // again, rather than rescanning the same pages after every write.
        place.pick_after = if found < goal { place.dead + goal } else { 0 };
    }
}

/// The next dead slot to refill: page and offset.
pub(super) fn next_hole(
    place: &mut Placement,
    writer: &mut PageWriter<'_>,
) -> Option<(usize, usize)> {
    while let Some(&n) = place.refill.last() {
        if let Some(at) = writer
            .look(n)
            .and_then(|p| p.hole(place.refill_from, MIN_RUN))
        {
            place.refill_from = at + 1;
            place.queued = place.queued.saturating_sub(1);
            return Some((n, at));
        }
        place.refill.pop();
        place.refill_from = 0;
    }
    place.queued = 0;
    None
}
