//! The writer's bookkeeping of stored and removed holders, and eviction:
//! the store-epoch clock, dropping a replica's entries, and evicting whole
//! oldest epochs to stay within capacity.

use std::sync::atomic::Ordering;

use super::{Index, Writer};
use crate::arena::{EPOCHS, EpochSet, Holder, Stored, add_epoch};
use crate::index::ReplicaIdx;
use crate::types::Tier;

impl Index {
    /// Bookkeeping for one stored holder, and the eviction clock.
    pub(super) fn account_store(
        &self,
        writer: &mut Writer,
        idx: ReplicaIdx,
        tier: Tier,
        epoch: u32,
        stored: Stored,
    ) {
        match stored {
            Stored::Added => {
                let counts = writer.counts(idx);
                counts.entries += 1;
                counts.t1 += u64::from(tier == Tier::T1);
                self.count_entries(writer, true);
            }
            Stored::Refreshed(previous) => {
                writer.epoch_entries[previous.epoch() as usize] -= 1;
                let counts = writer.counts(idx);
                counts.t1 = counts.t1 - u64::from(previous.tier() == Tier::T1)
                    + u64::from(tier == Tier::T1);
            }
        }
        writer.epoch_entries[epoch as usize] += 1;
        self.tick_clock(writer);
    }

    /// Advances the eviction clock by one store.
    pub(super) fn tick_clock(&self, writer: &mut Writer) {
        writer.epoch_fill += 1;
        if writer.epoch_fill >= writer.epoch_size {
            writer.epoch = (writer.epoch + 1) % EPOCHS;
            writer.epoch_fill = 0;
            // The clock wrapped onto the oldest epoch: retire it first.
            if writer.epoch_entries[writer.epoch as usize] > 0 {
                self.evict_oldest(writer, 1);
            }
        }
    }

    /// Bookkeeping for one removed holder.
    pub(super) fn forget(&self, writer: &mut Writer, holder: Holder) {
        writer.epoch_entries[holder.epoch() as usize] -= 1;
        let counts = writer.counts(holder.replica());
        counts.entries = counts.entries.saturating_sub(1);
        counts.t1 = counts
            .t1
            .saturating_sub(u64::from(holder.tier() == Tier::T1));
        self.count_entries(writer, false);
    }

    /// Counts an entry in or out. Only the writer (whose guard this takes)
    /// changes the count and readers only load it, so a plain store does:
    /// an atomic add per block would also wait for every load in flight.
    pub(super) fn count_entries(&self, _writer: &mut Writer, added: bool) {
        let n = self.entries.load(Ordering::Relaxed);
        let n = if added { n + 1 } else { n.saturating_sub(1) };
        self.entries.store(n, Ordering::Relaxed);
    }

    /// Removes every entry of slot `idx` (at `tier`, if given): one pass
    /// over the pages, each locked only for its own part.
    pub(super) fn drop_where(&self, writer: &mut Writer, idx: ReplicaIdx, tier: Option<Tier>) {
        if writer.counts(idx).entries == 0 {
            return;
        }
        self.store.remove_where(
            None,
            |h| h.replica() == idx && tier.is_none_or(|t| h.tier() == t),
            |h| self.forget(writer, h),
        );
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
        if selected == 0 {
            return;
        }
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
                self.forget(writer, h);
            },
        );
        self.capacity_evictions
            .fetch_add(evicted, Ordering::Relaxed);
    }
}
