//! What the listeners have learned and the forwarder has yet to send.
//!
//! Each DP rank's [`ReplicaState`] and its queue of pending index changes
//! live together behind one lock, so "apply a batch and queue its changes"
//! and "snapshot the state for a resync and drop the queued changes it
//! covers" are each atomic. That is what makes dropping safe: when the queue
//! is full the oldest changes are dropped and the rank is marked for resync,
//! and the resync (a snapshot of the current state) supersedes everything
//! that was dropped. The engine side never waits on the index side.

use std::collections::VecDeque;

use ic_kvevents::{ApplyStats, DecodedBatch, IndexChange, ReplicaConfig, ReplicaState};

use crate::tier2::{EngineCache, EngineLoad, Tier2Counters};

/// Work for the forwarder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outgoing {
    /// Replace the rank's whole state in the index with this snapshot.
    Resync {
        /// DP rank.
        rank: u32,
        /// The rank's full state.
        snapshot: Vec<IndexChange>,
    },
    /// Apply these changes, in order.
    Delta {
        /// DP rank.
        rank: u32,
        /// The changes.
        changes: Vec<IndexChange>,
    },
}

#[derive(Debug)]
struct Rank {
    replica: ReplicaState,
    pending: VecDeque<IndexChange>,
    needs_resync: bool,
    /// The listener has rebuilt what it can: until then nothing is sent,
    /// so the index keeps its view of the engine (a restarted subscriber
    /// must not replace it with an empty resync).
    ready: bool,
    /// Batches before the rank's view could not be recovered.
    incomplete: bool,
    /// Tokens stored since the last store whose parent the view lacked
    /// (counts towards the turnover that completes the history again).
    clean_tokens: u64,
}

/// What one [`Outbox::apply`] did besides updating the replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Queued changes dropped to make room (the rank resyncs instead).
    pub dropped: usize,
    /// The rank's history was incomplete and the engine's cache has now
    /// turned over (see [`Outbox::with_history_turnover`]).
    pub history_completed: bool,
}

/// Per-rank state plus the bounded queue of changes to forward.
#[derive(Debug)]
pub struct Outbox {
    ranks: Vec<Rank>,
    capacity: usize,
    queued: usize,
    /// Latest tier-2 counters; `None` while the engine exports none.
    pub tier2: Option<Tier2Counters>,
    /// The engine's latest load, if scraped.
    pub engine_load: Option<EngineLoad>,
    /// The engine's KV cache size, if scraped.
    pub engine_cache: Option<EngineCache>,
    /// Clean tokens that complete an incomplete history; 0 = the engine's
    /// reported KV capacity.
    history_turnover_tokens: u64,
}

/// Locks the shared outbox. A panic elsewhere cannot leave it half-updated
/// in a way that matters (every operation is a complete step), so a
/// poisoned lock is simply taken over.
pub fn lock(outbox: &std::sync::Mutex<Outbox>) -> std::sync::MutexGuard<'_, Outbox> {
    outbox
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Outbox {
    /// `ranks` DP ranks, at most `capacity` queued changes in total.
    pub fn new(ranks: u32, capacity: usize, replica: ReplicaConfig) -> Self {
        Self {
            ranks: (0..ranks.max(1))
                .map(|_| Rank {
                    replica: ReplicaState::new(replica),
                    pending: VecDeque::new(),
                    needs_resync: true,
                    ready: false,
                    incomplete: false,
                    clean_tokens: 0,
                })
                .collect(),
            capacity: capacity.max(1),
            queued: 0,
            tier2: None,
            engine_load: None,
            engine_cache: None,
            history_turnover_tokens: 0,
        }
    }

    /// An incomplete history counts as complete again once the rank has
    /// stored `tokens` tokens (0: the engine's reported KV capacity; never,
    /// while it reports none) with no store extending a block the view
    /// lacks. A block stored before the view began and still in use shows
    /// up as such a parent; once a whole cache's worth has been stored
    /// without one, what the view lacks has been evicted or is unused.
    pub fn with_history_turnover(mut self, tokens: u64) -> Self {
        self.history_turnover_tokens = tokens;
        self
    }

    /// Number of ranks.
    pub fn ranks(&self) -> u32 {
        u32::try_from(self.ranks.len()).unwrap_or(u32::MAX)
    }

    /// Whether `rank` may be forwarded.
    pub fn is_ready(&self, rank: u32) -> bool {
        self.ranks.get(rank as usize).is_some_and(|r| r.ready)
    }

    /// Lets `rank` be forwarded (its first resync goes next).
    pub fn set_ready(&mut self, rank: u32) {
        if let Some(r) = self.ranks.get_mut(rank as usize) {
            r.ready = true;
        }
    }

    /// Records whether `rank`'s view misses unrecoverable batches.
    pub fn set_incomplete(&mut self, rank: u32, incomplete: bool) {
        if let Some(r) = self.ranks.get_mut(rank as usize) {
            r.incomplete = incomplete;
            r.clean_tokens = 0;
        }
    }

    /// Whether `rank`'s view misses unrecoverable batches.
    pub fn is_incomplete(&self, rank: u32) -> bool {
        self.ranks.get(rank as usize).is_some_and(|r| r.incomplete)
    }

    /// Number of changes waiting to be forwarded.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Blocks the rank currently holds.
    pub fn blocks(&self) -> usize {
        self.ranks.iter().map(|r| r.replica.len()).sum()
    }

    /// Blocks held per LoRA adapter, summed over the ranks.
    pub fn adapters(&self) -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        for rank in &self.ranks {
            for (name, n) in rank.replica.adapters() {
                *out.entry(name.to_owned()).or_default() += n;
            }
        }
        out
    }

    fn turnover_tokens(&self) -> Option<u64> {
        match self.history_turnover_tokens {
            0 => self.engine_cache.and_then(|c| c.capacity_tokens),
            n => Some(n),
        }
    }

    /// Records the engine's scraped cache size; returns the ranks whose
    /// history it completes (enough clean tokens were already stored).
    pub fn set_engine_cache(&mut self, cache: Option<EngineCache>) -> Vec<u32> {
        self.engine_cache = cache;
        let turnover = self.turnover_tokens();
        (0..self.ranks())
            .filter(|&r| {
                let state = &mut self.ranks[r as usize];
                state.incomplete && state.complete_if_turned_over(turnover)
            })
            .collect()
    }

    /// Applies a decoded batch to `rank` and queues the resulting changes.
    pub fn apply(&mut self, rank: u32, batch: &DecodedBatch, stats: &mut ApplyStats) -> Applied {
        let turnover = self.turnover_tokens();
        let Some(state) = self.ranks.get_mut(rank as usize) else {
            return Applied::default();
        };
        let unresolved_before = stats.unresolved_parent_blocks;
        let mut changes = Vec::new();
        state.replica.apply_batch(batch, &mut changes, stats);
        let mut history_completed = false;
        if state.incomplete {
            if stats.unresolved_parent_blocks > unresolved_before {
                state.clean_tokens = 0;
            } else {
                state.clean_tokens = state.clean_tokens.saturating_add(stored_tokens(batch));
            }
            history_completed = state.complete_if_turned_over(turnover);
        }
        if state.needs_resync {
            // A resync is already owed: the snapshot will include these.
            return Applied {
                dropped: 0,
                history_completed,
            };
        }
        self.queued += changes.len();
        state.pending.extend(changes);
        Applied {
            dropped: self.enforce_capacity(),
            history_completed,
        }
    }

    fn enforce_capacity(&mut self) -> usize {
        let mut dropped = 0;
        while self.queued > self.capacity {
            // Drop from the rank with the longest queue, oldest first.
            let Some(victim) = self.ranks.iter_mut().max_by_key(|r| r.pending.len()) else {
                break;
            };
            let n = victim.pending.len();
            victim.pending.clear();
            victim.needs_resync = true;
            self.queued -= n;
            dropped += n;
        }
        dropped
    }

    /// The engine behind `rank` restarted: forget its state; the next
    /// forward replaces the index's view of it with an empty resync.
    pub fn reset_rank(&mut self, rank: u32) {
        if let Some(state) = self.ranks.get_mut(rank as usize) {
            state.replica.clear();
            self.queued -= state.pending.len();
            state.pending.clear();
            state.needs_resync = true;
        }
    }

    /// After (re)connecting to the index server, every rank resyncs.
    pub fn mark_all_for_resync(&mut self) {
        for state in &mut self.ranks {
            self.queued -= state.pending.len();
            state.pending.clear();
            state.needs_resync = true;
        }
    }

    /// Takes the next work for the forwarder: resyncs first, then up to
    /// `max_changes` pending changes per rank.
    pub fn take(&mut self, max_changes: usize) -> Vec<Outgoing> {
        let mut out = Vec::new();
        for (rank, state) in self.ranks.iter_mut().enumerate() {
            let rank = u32::try_from(rank).unwrap_or(u32::MAX);
            if !state.ready {
                continue;
            }
            if state.needs_resync {
                self.queued -= state.pending.len();
                state.pending.clear();
                state.needs_resync = false;
                out.push(Outgoing::Resync {
                    rank,
                    snapshot: state.replica.snapshot(),
                });
            } else if !state.pending.is_empty() {
                let n = state.pending.len().min(max_changes);
                self.queued -= n;
                out.push(Outgoing::Delta {
                    rank,
                    changes: state.pending.drain(..n).collect(),
                });
            }
        }
        out
    }
}

impl Rank {
    fn complete_if_turned_over(&mut self, turnover: Option<u64>) -> bool {
        if turnover.is_some_and(|t| self.clean_tokens >= t) {
            self.incomplete = false;
            self.clean_tokens = 0;
            return true;
        }
        false
    }
}

/// Tokens the batch's stores cover.
fn stored_tokens(batch: &DecodedBatch) -> u64 {
    batch
        .events
        .iter()
        .map(|e| match e {
            ic_kvevents::KvEvent::BlockStored(s) => {
                (s.block_hashes.len() as u64).saturating_mul(u64::from(s.block_size))
            }
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ic_kvevents::{BlockStored, KvEvent, Medium};

    fn batch(hash: u64) -> DecodedBatch {
        DecodedBatch {
            ts: 1.0,
            events: vec![KvEvent::BlockStored(BlockStored {
                block_hashes: vec![ic_kvevents::EngineHash(hash)],
                parent_block_hash: None,
                token_ids: vec![hash as u32; 4],
                block_size: 4,
                lora_id: None,
                medium: Medium::Gpu,
                lora_name: None,
                group_idx: None,
                kv_cache_spec_kind: None,
                cache_salt: None,
                extra_keys: None,
            })],
            ..DecodedBatch::default()
        }
    }

    #[test]
    fn starts_with_a_resync_then_forwards_deltas() {
        let mut outbox = Outbox::new(1, 10, ReplicaConfig::default());
        let mut stats = ApplyStats::default();
        outbox.apply(0, &batch(1), &mut stats);
        // Nothing leaves before the listener has rebuilt what it can.
        assert!(outbox.take(100).is_empty());
        outbox.set_ready(0);
        let first = outbox.take(100);
        assert!(
            matches!(&first[..], [Outgoing::Resync { rank: 0, snapshot }] if snapshot.len() == 1)
        );
        outbox.apply(0, &batch(2), &mut stats);
        assert!(
            matches!(&outbox.take(100)[..], [Outgoing::Delta { rank: 0, changes }] if changes.len() == 1)
        );
        assert!(outbox.take(100).is_empty());
    }

    #[test]
    fn overflow_drops_oldest_and_resyncs_with_the_full_state() {
        let mut outbox = Outbox::new(1, 3, ReplicaConfig::default());
        outbox.set_ready(0);
        let mut stats = ApplyStats::default();
        outbox.take(100);
        let mut dropped = 0;
        for h in 1..=5 {
            dropped += outbox.apply(0, &batch(h), &mut stats).dropped;
        }
        assert!(dropped > 0);
        assert!(outbox.queued() <= 3);
        // Nothing is lost for good: the resync carries all five blocks.
        match &outbox.take(100)[..] {
            [Outgoing::Resync { snapshot, .. }] => assert_eq!(snapshot.len(), 5),
            other => panic!("{other:?}"),
        }
        assert_eq!(outbox.queued(), 0);
    }

    #[test]
    fn engine_reset_resyncs_to_empty() {
        let mut outbox = Outbox::new(2, 10, ReplicaConfig::default());
        outbox.set_ready(0);
        outbox.set_ready(1);
        let mut stats = ApplyStats::default();
        outbox.take(100);
        outbox.apply(1, &batch(1), &mut stats);
        outbox.reset_rank(1);
        assert_eq!(
            outbox.take(100),
            vec![Outgoing::Resync {
                rank: 1,
                snapshot: vec![]
            }]
        );
        assert_eq!(outbox.blocks(), 0);
    }

    fn child(hash: u64, parent: u64) -> DecodedBatch {
        let mut b = batch(hash);
        if let KvEvent::BlockStored(s) = &mut b.events[0] {
            s.parent_block_hash = Some(ic_kvevents::EngineHash(parent));
        }
        b
    }

    #[test]
    fn an_incomplete_history_completes_after_a_clean_turnover() {
        let mut outbox = Outbox::new(1, 100, ReplicaConfig::default()).with_history_turnover(8);
        outbox.set_ready(0);
        outbox.set_incomplete(0, true);
        let mut stats = ApplyStats::default();
        // 4 clean tokens, then a store extending a block the view lacks:
        // the old history is still in use, so the count starts again.
        assert!(!outbox.apply(0, &batch(1), &mut stats).history_completed);
        assert!(!outbox.apply(0, &child(2, 99), &mut stats).history_completed);
        assert!(!outbox.apply(0, &batch(3), &mut stats).history_completed);
        assert!(outbox.is_incomplete(0));
        assert!(outbox.apply(0, &batch(4), &mut stats).history_completed);
        assert!(!outbox.is_incomplete(0));
        // A complete history stays complete.
        assert!(!outbox.apply(0, &child(5, 98), &mut stats).history_completed);
    }

    #[test]
    fn without_a_turnover_size_the_history_stays_incomplete_until_the_engine_reports_one() {
        let mut outbox = Outbox::new(1, 100, ReplicaConfig::default());
        outbox.set_ready(0);
        outbox.set_incomplete(0, true);
        let mut stats = ApplyStats::default();
        for h in 1..=10 {
            assert!(!outbox.apply(0, &batch(h), &mut stats).history_completed);
        }
        // The clean tokens so far count as soon as the size is known.
        let cache = EngineCache {
            memory_bytes: None,
            capacity_tokens: Some(8),
        };
        assert_eq!(outbox.set_engine_cache(Some(cache)), vec![0]);
        assert!(!outbox.is_incomplete(0));
    }
}
