//! Applying a replica's changes: stored chains (in epoch-sized runs, the
//! clock and the counts settled after the store released its locks),
//! evicted blocks and cleared tiers.

use std::sync::atomic::Ordering;

use super::{ChainScratch, Index, ReplicaIdx, SCRATCH_KEEP, ScopeId, Writer, entry_key};
use crate::arena::{Holder, MAX_DEPTH, Stored};
use crate::store::Block;
use crate::types::{Change, ContentError, Fingerprint, Tier};

impl Index {
    /// Applies `changes` of replica slot `idx` in `scope`, in order,
    /// returning what was not applied.
    pub(super) fn apply_locked(
        &self,
        writer: &mut Writer,
        idx: ReplicaIdx,
        scope: ScopeId,
        changes: &[Change],
        now_ms: i64,
    ) -> Vec<ContentError> {
        let mut errors = Vec::new();
        for change in changes {
            match change {
                Change::Stored {
                    start_depth,
                    fingerprints,
                    block_size,
                    tier,
                } => {
                    if *block_size > 0 && writer.counts(idx).block_size != *block_size {
                        writer.counts(idx).block_size = *block_size;
                        let mut reg = self.registry.write();
                        reg.set_block_size(scope, *block_size);
                    }
                    // In chunks, evicting between them: a batch (or a
                    // resync) larger than the room left never takes the
                    // index past capacity by more than one chunk, so the
                    // key tables do not grow for a moment's excess.
                    let chunk = usize::try_from(writer.epoch_size).unwrap_or(usize::MAX);
                    let mut depth = *start_depth;
                    for part in fingerprints.chunks(chunk.max(1)) {
                        let whole =
                            self.store_chain(writer, scope, idx, depth, part, *tier, &mut errors);
                        self.evict_excess(writer);
                        // Blocks past a hole could never be matched (a
                        // lookup walks from the first block): stop here.
                        if !whole {
                            break;
                        }
                        depth = depth.saturating_add(u32::try_from(part.len()).unwrap_or(u32::MAX));
                    }
                }
                Change::Evicted { fingerprints } => {
                    let mut blocks = std::mem::take(&mut writer.scratch.blocks);
                    blocks.clear();
                    blocks.extend(
                        fingerprints
                            .iter()
                            .map(|&fp| Block::new(entry_key(scope, fp), 0)),
                    );
                    // Every holder dropped is this replica's: its counts
                    // are settled once for the event (only the epochs'
                    // counts per holder), not per holder.
                    let (mut gone, mut t1_gone) = (0u64, 0u64);
                    let epochs = &mut writer.epoch_entries;
                    self.store.remove(
                        &blocks,
                        |h| h.replica() == idx,
                        |h| {
                            gone += 1;
                            t1_gone += u64::from(h.tier() == Tier::T1);
                            epochs[h.epoch() as usize] -= 1;
                        },
                    );
                    let counts = writer.counts(idx);
                    counts.entries = counts.entries.saturating_sub(gone);
                    counts.t1 = counts.t1.saturating_sub(t1_gone);
                    self.count_entries(writer, 0, gone);
                    if blocks.capacity() <= SCRATCH_KEEP {
                        writer.scratch.blocks = blocks;
                    }
                }
                Change::Cleared { tier } => {
                    let counts = *writer.counts(idx);
                    let at_tier = match tier {
                        Tier::T1 => counts.t1,
                        Tier::T2 => counts.entries - counts.t1,
                    };
                    if at_tier > 0 {
                        self.drop_where(writer, idx, Some(*tier));
                    }
                }
            }
            let counts = writer.counts(idx);
            counts.last_event_ms = Some(counts.last_event_ms.map_or(now_ms, |t| t.max(now_ms)));
        }
        errors
    }

    /// Stores a chain of blocks; the bookkeeping happens after the store
    /// released its locks. False when the record space ran out: the run
    /// that failed and the rest of the chain were not stored.
    #[allow(clippy::too_many_arguments)]
    fn store_chain(
        &self,
        writer: &mut Writer,
        scope: ScopeId,
        idx: ReplicaIdx,
        start_depth: u32,
        fingerprints: &[Fingerprint],
        tier: Tier,
        errors: &mut Vec<ContentError>,
    ) -> bool {
        let ChainScratch {
            mut blocks,
            mut results,
        } = std::mem::take(&mut writer.scratch);
        blocks.clear();
        blocks.extend(fingerprints.iter().enumerate().map(|(i, &fp)| {
            let depth = start_depth
                .saturating_add(u32::try_from(i).unwrap_or(u32::MAX))
                .min(MAX_DEPTH);
            Block::new(entry_key(scope, fp), depth)
        }));
        // Stored and accounted a run of one epoch at a time, the clock
        // advanced once per run (rather than counts, entries and the clock
        // per block): a run fills the current epoch at most, so the clock
        // reaches the next epoch, and settles what it still holds from the
        // clock's last turn (kept or retired), before anything is stored in
        // it.
        let mut start = 0;
        let mut whole = true;
        while start < blocks.len() {
            let room = writer.epoch_size.max(1).saturating_sub(writer.epoch_fill);
            let end = start
                + usize::try_from(room)
                    .map_or(usize::MAX, |r| r.max(1))
                    .min(blocks.len() - start);
            let epoch = writer.epoch;
            if self
                .store
                .store_chain(
                    &blocks[start..end],
                    |_| Holder::new(idx, tier, epoch),
                    &mut results,
                )
                .is_err()
            {
                self.out_of_space.fetch_add(1, Ordering::Relaxed);
                errors.push(ContentError::OutOfSpace);
                whole = false;
                break;
            }
            let mut added = 0u64;
            let mut stored = 0u64;
            for (i, result) in (start..end).zip(&results) {
                match *result {
                    Ok(Stored::Added) => added += 1,
                    Ok(Stored::Refreshed(previous)) => {
                        self.account_refresh(writer, idx, tier, previous);
                    }
                    Err(known) => {
                        errors.push(ContentError::DepthMismatch {
                            fingerprint: fingerprints[i],
                            known,
                            reported: blocks[i].depth,
                        });
                        continue;
                    }
                }
                stored += 1;
            }
            self.account_run(writer, idx, tier, epoch, added, stored);
            self.tick_clock_by(writer, (end - start) as u64);
            start = end;
        }
        writer.scratch = ChainScratch::keep(blocks, results);
        whole
    }
}
