//! Giving record space back: pages whose records all died are freed as
//! they empty, and when dead records grow past a fixed share of all
//! records, the live records of the sparsest pages move to the end so that
//! those pages can be freed too.
//!
//! Engines mostly evict what they stored earliest, so pages tend to die
//! whole and cost nothing to free. Holes left by other eviction orders are
//! mostly reused by new records (see [`super::refill`]), which keeps the
//! dead share well under the limit while engines keep storing; copying is
//! the backstop for an index that loses entries without storing new ones,
//! and for holes too short to refill. The limit bounds the memory spent on
//! dead records whatever happens.

use std::sync::atomic::Ordering;

use smallvec::SmallVec;

use super::firsts::{Firsts, REBUILD_PAGES};
use super::{OutOfSpace, PageWriter, Placement, Store, hash, next_room};
use crate::arena::{Page, RecId, offset_of, rec_id};

/// Compaction starts when dead records exceed 1/`DEAD_LIMIT` of all
/// records…
pub(super) const DEAD_LIMIT: usize = 4;
/// …and stops once they are at most 1/`DEAD_TARGET` (the gap makes every
/// pass reclaim a few percent, so passes, which look at every page, stay
/// rare).
const DEAD_TARGET: usize = 5;

impl Store {
    /// Frees emptied pages, then, if dead records are over their share,
    /// moves the live records of the sparsest pages to the end, in page
    /// order (keeping a chain's records together), and queues pages for
    /// refilling if dead records are over the smaller share that starts
    /// it. Out of record space, it leaves the rest in place.
    pub(crate) fn compact(&self) {
        let mut place = self.place.lock();
        let mut emptied = std::mem::take(&mut place.emptied);
        emptied.sort_unstable();
        emptied.dedup();
        // All of these before any move: moves may reuse freed pages.
        for n in emptied {
            if self.free_page(&mut place, n) && place.current == Some(n) {
                place.current = None;
            }
        }
        if place.dead * DEAD_LIMIT > place.records {
            // Starts the refilling afresh: queued pages may be emptied here.
            place.refill.clear();
            place.queued = 0;
            place.pick_after = 0;
            for (n, live) in self.sparsest(&place) {
                if self.move_out(&mut place, n, live).is_err() {
                    return;
                }
                self.free_page(&mut place, n);
            }
        }
        self.pick_refills(&mut place);
        if place.firsts.pending.is_some() || self.firsts.due(&place.firsts) {
            self.rebuild_firsts(&mut place);
        }
    }

    /// Goes on with the rebuild of the first-block filter from the live
    /// depth-0 records (see [`super::firsts`]), starting one if none is
    /// under way: the next [`REBUILD_PAGES`] pages, each read-locked in
    /// turn (the placement mutex, held, keeps their records still); after
    /// the last page, the filter takes the rebuilt bits.
    fn rebuild_firsts(&self, place: &mut Placement) {
        let (mut fresh, from) = place
            .firsts
            .pending
            .take()
            .unwrap_or_else(|| (self.firsts.fresh(), 0));
        let to = (from + REBUILD_PAGES).min(self.pages.len());
        for n in from..to {
            if let Some(page) = self.pages.get(n) {
                for key in page.read().first_keys() {
                    fresh.add(hash(key));
                }
            }
        }
        if to < self.pages.len() {
            place.firsts.pending = Some((fresh, to));
        } else {
            self.firsts
                .replace(&mut place.sole, &mut place.firsts, &fresh);
        }
    }

    /// The pages to empty so that dead records fall to their target share,
    /// sparsest first, returned in page order with their live counts.
    fn sparsest(&self, place: &Placement) -> Vec<(usize, usize)> {
        let mut pages: Vec<(usize, usize, usize)> = Vec::new();
        {
            for (n, page) in self.pages.iter() {
                let page = page.read();
                if place.current != Some(n) && page.live() < page.len() {
                    pages.push((page.live(), page.len(), n));
                }
            }
        }
        pages.sort_unstable();
        // Emptying a page removes its dead records from both counts:
        // `(dead - x) * T <= records - x` needs x >= (T*dead - records)/(T-1).
        let needed = (place.dead * DEAD_TARGET).saturating_sub(place.records) / (DEAD_TARGET - 1);
        let mut reclaimed = 0;
        let mut chosen: Vec<(usize, usize)> = Vec::new();
        for (live, len, n) in pages {
            if reclaimed > needed {
                break;
            }
            reclaimed += len - live;
            chosen.push((n, live));
        }
        chosen.sort_unstable();
        chosen
    }

    /// Returns page `n` to the free list if records were written to it and
    /// all of them died (never a reserved page not yet written); reports
    /// whether it did.
    fn free_page(&self, place: &mut Placement, n: usize) -> bool {
        let Some(page) = self.pages.get(n) else {
            return false;
        };
        let mut page = page.write();
        let len = match (page.len(), page.live()) {
            (len, 0) if len > 0 => len,
            _ => return false,
        };
        // Emptied in place: a reader holding a stale id finds no record.
        *page = Page::vacant();
        drop(page);
        place.records = place.records.saturating_sub(len);
        place.dead = place.dead.saturating_sub(len);
        place.free.push(n);
        true
    }

    /// Moves the `live` records of page `n` to the current page(s), leaving
    /// `n` all dead.
    fn move_out(&self, place: &mut Placement, n: usize, live: usize) -> Result<(), OutOfSpace> {
        if live == 0 {
            return Ok(());
        }
        self.reserve(place, live)?;
        let mut moved: Vec<(u64, RecId, RecId)> = Vec::with_capacity(live);
        {
            let dir = &self.pages;
            // Copy out first: one lock at a time.
            let copies: Vec<(usize, u64, u32, SmallVec<[u32; 4]>)> = match dir.get(n) {
                Some(page) => {
                    let page = page.read();
                    page.live_offsets()
                        .filter_map(|o| {
                            page.view(o)
                                .map(|v| (o, v.key, v.depth, SmallVec::from_slice(v.holders())))
                        })
                        .collect()
                }
                None => return Ok(()),
            };
            let mut writer = PageWriter::new(dir);
            for (offset, key, depth, holders) in copies {
                let to = next_room(place, &mut writer).ok_or(OutOfSpace)?;
                let page = writer.page(to).ok_or(OutOfSpace)?;
                let at = page.append(key, depth, &holders);
                if depth == 0 {
                    // Its bits are set; a rebuild under way needs them too.
                    Firsts::moved(&mut place.firsts, hash(key));
                }
                place.records += 1;
                moved.push((hash(key), rec_id(n, offset), rec_id(to, at)));
            }
        }
        self.publish(&mut place.sole, &moved, |table, sole, &(h, old, new)| {
            table.relocate(sole, h, old, new);
        });
        if let Some(page) = self.pages.get(n) {
            let mut page = page.write();
            for &(_, old, _) in &moved {
                page.kill(offset_of(old));
            }
        }
        place.dead += moved.len();
        self.relocations
            .fetch_add(moved.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}
