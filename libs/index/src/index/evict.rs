//! The writer's bookkeeping of stored and removed holders, and eviction:
//! the store-epoch clock, dropping a replica's entries, and evicting whole
//! oldest epochs to stay within capacity.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Index, Writer};
use crate::arena::{EPOCHS, EpochSet, Holder, add_epoch};
use crate::index::ReplicaIdx;
use crate::types::Tier;

impl Index {
    /// Bookkeeping for a run of stores into one epoch: `added` new
    /// entries, `stored` holders stored in all (new or refreshed; a
    /// refreshed one's previous epoch is [`Index::account_refresh`]'s).
    pub(super) fn account_run(
        &self,
        writer: &mut Writer,
        idx: ReplicaIdx,
        tier: Tier,
        epoch: u32,
        added: u64,
        stored: u64,
    ) {
        if added > 0 {
            let counts = writer.counts(idx);
            counts.entries += added;
            if tier == Tier::T1 {
                counts.t1 += added;
            }
            self.count_entries(writer, added, 0);
        }
        writer.epoch_entries[epoch as usize] += stored;
    }

    /// Bookkeeping for a holder stored again: its previous store leaves
    /// its epoch (the new one is counted by [`Index::account_run`]).
    pub(super) fn account_refresh(
        &self,
        writer: &mut Writer,
        idx: ReplicaIdx,
        tier: Tier,
        previous: Holder,
    ) {
        writer.epoch_entries[previous.epoch() as usize] -= 1;
        let counts = writer.counts(idx);
        counts.t1 =
            counts.t1 - u64::from(previous.tier() == Tier::T1) + u64::from(tier == Tier::T1);
    }

    /// Advances the eviction clock by `stores` stores, which reach at
    /// most the end of the current epoch (the caller cuts its runs there
    /// and stores nothing in the next epoch before the clock reaches it).
    pub(super) fn tick_clock_by(&self, writer: &mut Writer, stores: u64) {
        writer.epoch_fill += stores;
        while writer.epoch_fill >= writer.epoch_size {
            writer.epoch = (writer.epoch + 1) % EPOCHS;
            writer.epoch_fill -= writer.epoch_size.max(1);
            // The clock came round: what this epoch still holds was not
            // stored again for a whole turn, the oldest entries there are.
            // While the index has room for the epoch about to be filled,
            // they stay: their holders already carry this epoch, so they
            // now count as stored in it (re-stamped at no cost: no record
            // is written, so lock-free readers see nothing change), and
            // capacity eviction, which takes the oldest epochs first,
            // reaches them last. An engine reports a block once when it
            // stores it and nothing on a cache hit, so an entry alone in
            // an old epoch is often a hot prefix the engine still holds.
            // Within an epoch of capacity they go, and only they (the
            // oldest), before the epoch is reused.
            let e = writer.epoch as usize;
            if writer.epoch_entries[e] > 0 && self.near_capacity(writer) {
                let mut doomed = vec![false; EPOCHS as usize];
                doomed[e] = true;
                self.evict_epochs(writer, &doomed, &self.clock_evictions);
            }
        }
    }

    /// Whether storing one more epoch's worth of new entries could take
    /// the index past capacity (so an epoch's leftovers from the clock's
    /// last turn are retired rather than kept).
    fn near_capacity(&self, writer: &Writer) -> bool {
        self.len().saturating_add(writer.epoch_size) > self.config.capacity_entries
    }

    /// Bookkeeping for one removed holder, but for the index's entry
    /// count, which the caller lowers once per removal
    /// ([`Index::count_entries`]).
    pub(super) fn forget(writer: &mut Writer, holder: Holder) {
        writer.epoch_entries[holder.epoch() as usize] -= 1;
        let counts = writer.counts(holder.replica());
        counts.entries = counts.entries.saturating_sub(1);
        counts.t1 = counts
            .t1
            .saturating_sub(u64::from(holder.tier() == Tier::T1));
    }

    /// Counts entries in and out. Only the writer (whose guard this takes)
    /// changes the count and readers only load it, so a plain store does:
    /// an atomic add per block would also wait for every load in flight.
    pub(super) fn count_entries(&self, _writer: &mut Writer, added: u64, removed: u64) {
        let n = self.entries.load(Ordering::Relaxed);
        self.entries
            .store((n + added).saturating_sub(removed), Ordering::Relaxed);
    }

    /// Removes every entry of slot `idx` (at `tier`, if given): one pass
    /// over the pages, each locked only for its own part.
    pub(super) fn drop_where(&self, writer: &mut Writer, idx: ReplicaIdx, tier: Option<Tier>) {
        if writer.counts(idx).entries == 0 {
            return;
        }
        let mut gone = 0;
        self.store.remove_where(
            None,
            |h| h.replica() == idx && tier.is_none_or(|t| h.tier() == t),
            |h| {
                gone += 1;
                Self::forget(writer, h);
            },
        );
        self.count_entries(writer, 0, gone);
    }

    /// Evicts beyond capacity, then lets the store reclaim emptied and
    /// sparse pages.
    pub(super) fn enforce_capacity(&self, writer: &mut Writer) {
        self.evict_excess(writer);
        self.store.compact();
    }

    /// Evicts beyond capacity.
    pub(super) fn evict_excess(&self, writer: &mut Writer) {
        if self.len() > self.config.capacity_entries {
            let excess = self.len() - self.config.capacity_entries;
            self.evict_oldest(writer, excess);
        }
    }

    /// Evicts whole epochs, oldest first, until at least `at_least` entries
    /// (and at least 1/8 of capacity, so passes stay rare: each one sweeps
    /// the key tables) are selected; then removes them in one pass.
    pub(super) fn evict_oldest(&self, writer: &mut Writer, at_least: u64) {
        let target = at_least.max(self.config.capacity_entries / 8);
        let mut doomed = vec![false; EPOCHS as usize];
        let mut selected = 0u64;
        for step in 1..=EPOCHS {
            let e = ((writer.epoch + step) % EPOCHS) as usize;
            if writer.epoch_entries[e] == 0 {
                continue;
            }
            doomed[e] = true;
            selected += writer.epoch_entries[e];
            if selected >= target {
                break;
            }
        }
        if selected > 0 {
            self.evict_epochs(writer, &doomed, &self.capacity_evictions);
        }
    }

    /// Removes every holder stored in a `doomed` epoch, in one pass over
    /// the pages holding any of them, counted in `counter`.
    fn evict_epochs(&self, writer: &mut Writer, doomed: &[bool], counter: &AtomicU64) {
        let mut epochs: EpochSet = [0; (EPOCHS / 64) as usize];
        for (e, _) in doomed.iter().enumerate().filter(|(_, d)| **d) {
            add_epoch(&mut epochs, u32::try_from(e).unwrap_or(0));
        }
        let mut evicted = 0u64;
        self.store.remove_where(
            Some(&epochs),
            |h| doomed[h.epoch() as usize],
            |h| {
                evicted += 1;
                Self::forget(writer, h);
            },
        );
        self.count_entries(writer, 0, evicted);
        counter.fetch_add(evicted, Ordering::Relaxed);
    }
}
