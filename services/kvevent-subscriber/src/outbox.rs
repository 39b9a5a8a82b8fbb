//! What the listeners have learned and the forwarders have yet to send.
//!
//! Each DP rank's [`ReplicaState`] and its log of pending index changes
//! live together behind one lock, so "apply a batch and log its changes"
//! and "snapshot the state for a resync and skip the logged changes it
//! covers" are each atomic. That is what makes dropping safe: when the log
//! is full the oldest changes are dropped and the destinations that had
//! not taken them are marked for resync, and the resync (a snapshot of the
//! current state) supersedes everything that was dropped. The engine side
//! never waits on the index side.
//!
//! Changes go to several destinations (every index-server replica, or a
//! Kafka topic): one log per rank, one cursor per destination and rank. A
//! destination that is slow or gone falls behind on its own; when the log
//! overflows, the destinations furthest behind resync, and the others,
//! which have taken those changes already, lose nothing.

use std::collections::VecDeque;
use std::sync::Arc;

use ic_kvevents::{ApplyStats, DecodedBatch, IndexChange, ReplicaConfig, ReplicaState};
use tokio::sync::Notify;

use crate::tier2::{EngineCache, EngineLoad, Tier2Counters};

/// Work for a forwarder.
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

/// One destination of the changes (an index-server replica, a topic).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DestinationId(u32);

#[derive(Debug)]
struct Rank {
    replica: ReplicaState,
    /// Changes some destination has yet to take; `log[0]` is change
    /// number `base` of this rank.
    log: VecDeque<IndexChange>,
    base: u64,
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

impl Rank {
    fn end(&self) -> u64 {
        self.base + self.log.len() as u64
    }
}

/// Where one destination stands on one rank.
#[derive(Clone, Copy, Debug)]
struct Cursor {
    /// Number of the next change it takes.
    next: u64,
    /// It takes a snapshot next (and then the changes after it).
    needs_resync: bool,
}

#[derive(Debug)]
struct Destination {
    id: DestinationId,
    cursors: Vec<Cursor>,
}

/// What one [`Outbox::apply`] did besides updating the replica.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Logged changes dropped to make room.
    pub dropped: usize,
    /// Destinations that fell so far behind that they resync instead.
    pub overflowed: usize,
    /// The rank's history was incomplete and the engine's cache has now
    /// turned over (see [`Outbox::with_history_turnover`]).
    pub history_completed: bool,
}

/// Per-rank state plus the bounded log of changes to forward.
#[derive(Debug)]
pub struct Outbox {
    ranks: Vec<Rank>,
    destinations: Vec<Destination>,
    next_destination: u32,
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

/// Wakes every forwarder when the listeners have logged something.
#[derive(Debug, Default)]
pub struct Wakers {
    notifies: std::sync::Mutex<Vec<Arc<Notify>>>,
}

impl Wakers {
    /// A new set, shared by the listeners and the forwarders.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// One forwarder's wake-up: a stored permit, so a wake that comes
    /// while it is busy is not lost.
    pub fn register(&self) -> Arc<Notify> {
        let notify = Arc::new(Notify::new());
        self.list().push(notify.clone());
        notify
    }

    /// Forgets a forwarder that stopped.
    pub fn unregister(&self, notify: &Arc<Notify>) {
        self.list().retain(|n| !Arc::ptr_eq(n, notify));
    }

    /// Wakes every forwarder.
    pub fn wake_all(&self) {
        for notify in self.list().iter() {
            notify.notify_one();
        }
    }

    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Notify>>> {
        self.notifies
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Outbox {
    /// `ranks` DP ranks, at most `capacity` logged changes in total.
    pub fn new(ranks: u32, capacity: usize, replica: ReplicaConfig) -> Self {
        Self {
            ranks: (0..ranks.max(1))
                .map(|_| Rank {
                    replica: ReplicaState::new(replica),
                    log: VecDeque::new(),
                    base: 0,
                    ready: false,
                    incomplete: false,
                    clean_tokens: 0,
                })
                .collect(),
            destinations: Vec::new(),
            next_destination: 0,
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

    /// Number of changes logged for some destination.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Number of changes `destination` has yet to take (not counting a
    /// resync it owes).
    pub fn queued_for(&self, destination: DestinationId) -> usize {
        self.destination(destination).map_or(0, |d| {
            d.cursors
                .iter()
                .zip(&self.ranks)
                .filter(|(c, _)| !c.needs_resync)
                .map(|(c, r)| usize::try_from(r.end() - c.next).unwrap_or(usize::MAX))
                .sum()
        })
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

    // === destinations ===

    /// A new destination; every rank owes it a resync first.
    pub fn add_destination(&mut self) -> DestinationId {
        let id = DestinationId(self.next_destination);
        self.next_destination = self.next_destination.wrapping_add(1);
        let cursors = self
            .ranks
            .iter()
            .map(|r| Cursor {
                next: r.end(),
                needs_resync: true,
            })
            .collect();
        self.destinations.push(Destination { id, cursors });
        id
    }

    /// Forgets a destination (its replica is gone); the log no longer
    /// keeps changes for it.
    pub fn remove_destination(&mut self, destination: DestinationId) {
        self.destinations.retain(|d| d.id != destination);
        for rank in 0..self.ranks.len() {
            self.trim(rank);
        }
    }

    /// Number of destinations.
    pub fn destinations(&self) -> usize {
        self.destinations.len()
    }

    /// `destination` (re)connected or lost its place: every rank resyncs
    /// to it next.
    pub fn mark_for_resync(&mut self, destination: DestinationId) {
        let Some(d) = self.destinations.iter_mut().find(|d| d.id == destination) else {
            return;
        };
        for cursor in &mut d.cursors {
            cursor.needs_resync = true;
        }
        for rank in 0..self.ranks.len() {
            self.trim(rank);
        }
    }

    fn destination(&self, id: DestinationId) -> Option<&Destination> {
        self.destinations.iter().find(|d| d.id == id)
    }

    /// The oldest change some destination still needs on `rank`, if any
    /// destination needs the rank's log at all.
    fn oldest_needed(&self, rank: usize) -> Option<u64> {
        self.destinations
            .iter()
            .map(|d| d.cursors[rank])
            .filter(|c| !c.needs_resync)
            .map(|c| c.next)
            .min()
    }

    /// Drops the changes of `rank` every destination has taken or will
    /// take through a resync.
    fn trim(&mut self, rank: usize) {
        let state = &mut self.ranks[rank];
        let keep_from = self
            .destinations
            .iter()
            .map(|d| d.cursors[rank])
            .filter(|c| !c.needs_resync)
            .map(|c| c.next)
            .min()
            .unwrap_or_else(|| state.end());
        let n = usize::try_from(keep_from.saturating_sub(state.base))
            .unwrap_or(usize::MAX)
            .min(state.log.len());
        state.log.drain(..n);
        state.base += n as u64;
        self.queued -= n;
    }

    // === the listeners' side ===

    /// Applies a decoded batch to `rank` and logs the resulting changes.
    pub fn apply(&mut self, rank: u32, batch: &DecodedBatch, stats: &mut ApplyStats) -> Applied {
        let turnover = self.turnover_tokens();
        let index = rank as usize;
        let Some(state) = self.ranks.get_mut(index) else {
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
        if self.oldest_needed(index).is_none() {
            // Every destination owes a resync (or there is none yet): the
            // snapshot will include these.
            return Applied {
                history_completed,
                ..Applied::default()
            };
        }
        let state = &mut self.ranks[index];
        self.queued += changes.len();
        state.log.extend(changes);
        let (dropped, overflowed) = self.enforce_capacity();
        Applied {
            dropped,
            overflowed,
            history_completed,
        }
    }

    /// While the log is over capacity: on the rank with the longest log,
    /// the destinations furthest behind resync instead, and what only they
    /// needed is dropped.
    fn enforce_capacity(&mut self) -> (usize, usize) {
        let (mut dropped, mut overflowed) = (0, 0);
        while self.queued > self.capacity {
            let Some(victim) = (0..self.ranks.len()).max_by_key(|&r| self.ranks[r].log.len())
            else {
                break;
            };
            let Some(oldest) = self.oldest_needed(victim) else {
                break;
            };
            for d in &mut self.destinations {
                let cursor = &mut d.cursors[victim];
                if !cursor.needs_resync && cursor.next == oldest {
                    cursor.needs_resync = true;
                    overflowed += 1;
                }
            }
            let before = self.queued;
            self.trim(victim);
            dropped += before - self.queued;
        }
        (dropped, overflowed)
    }

    /// The engine behind `rank` restarted: forget its state; the next
    /// forward replaces the index's view of it with an empty resync.
    pub fn reset_rank(&mut self, rank: u32) {
        let index = rank as usize;
        if let Some(state) = self.ranks.get_mut(index) {
            state.replica.clear();
            for d in &mut self.destinations {
                d.cursors[index].needs_resync = true;
            }
            self.trim(index);
        }
    }

    // === the forwarders' side ===

    /// Takes `destination`'s next work: resyncs first, then up to
    /// `max_changes` logged changes per rank.
    pub fn take(&mut self, destination: DestinationId, max_changes: usize) -> Vec<Outgoing> {
        let Some(d) = self.destinations.iter().position(|d| d.id == destination) else {
            return Vec::new();
        };
        // The only destination still reading the log may take its changes
        // instead of copying them (the common case: one index server).
        let sole_reader = |outbox: &Self, rank: usize| {
            outbox
                .destinations
                .iter()
                .filter(|x| !x.cursors[rank].needs_resync)
                .count()
                == 1
        };
        let mut out = Vec::new();
        for index in 0..self.ranks.len() {
            let rank = u32::try_from(index).unwrap_or(u32::MAX);
            if !self.ranks[index].ready {
                continue;
            }
            let cursor = self.destinations[d].cursors[index];
            let end = self.ranks[index].end();
            if cursor.needs_resync {
                self.destinations[d].cursors[index] = Cursor {
                    next: end,
                    needs_resync: false,
                };
                out.push(Outgoing::Resync {
                    rank,
                    snapshot: self.ranks[index].replica.snapshot(),
                });
            } else if cursor.next < end {
                let n = usize::try_from(end - cursor.next)
                    .unwrap_or(usize::MAX)
                    .min(max_changes);
                let state = &self.ranks[index];
                let from = usize::try_from(cursor.next - state.base).unwrap_or(usize::MAX);
                let changes = if from == 0 && sole_reader(self, index) {
                    let state = &mut self.ranks[index];
                    state.base += n as u64;
                    self.queued -= n;
                    state.log.drain(..n).collect()
                } else {
                    state.log.range(from..from + n).cloned().collect()
                };
                self.destinations[d].cursors[index].next = cursor.next + n as u64;
                out.push(Outgoing::Delta { rank, changes });
            }
            self.trim(index);
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
        let d = outbox.add_destination();
        let mut stats = ApplyStats::default();
        outbox.apply(0, &batch(1), &mut stats);
        // Nothing leaves before the listener has rebuilt what it can.
        assert!(outbox.take(d, 100).is_empty());
        outbox.set_ready(0);
        let first = outbox.take(d, 100);
        assert!(
            matches!(&first[..], [Outgoing::Resync { rank: 0, snapshot }] if snapshot.len() == 1)
        );
        outbox.apply(0, &batch(2), &mut stats);
        assert!(
            matches!(&outbox.take(d, 100)[..], [Outgoing::Delta { rank: 0, changes }] if changes.len() == 1)
        );
        assert!(outbox.take(d, 100).is_empty());
    }

    #[test]
    fn overflow_drops_oldest_and_resyncs_with_the_full_state() {
        let mut outbox = Outbox::new(1, 3, ReplicaConfig::default());
        let d = outbox.add_destination();
        outbox.set_ready(0);
        let mut stats = ApplyStats::default();
        outbox.take(d, 100);
        let mut dropped = 0;
        for h in 1..=5 {
            dropped += outbox.apply(0, &batch(h), &mut stats).dropped;
        }
        assert!(dropped > 0);
        assert!(outbox.queued() <= 3);
        assert_eq!(outbox.queued_for(d), 0, "the whole backlog went");
        // Nothing is lost for good: the resync carries all five blocks.
        match &outbox.take(d, 100)[..] {
            [Outgoing::Resync { snapshot, .. }] => assert_eq!(snapshot.len(), 5),
            other => panic!("{other:?}"),
        }
        assert_eq!(outbox.queued(), 0);
    }

    #[test]
    fn engine_reset_resyncs_to_empty() {
        let mut outbox = Outbox::new(2, 10, ReplicaConfig::default());
        let d = outbox.add_destination();
        outbox.set_ready(0);
        outbox.set_ready(1);
        let mut stats = ApplyStats::default();
        outbox.take(d, 100);
        outbox.apply(1, &batch(1), &mut stats);
        outbox.reset_rank(1);
        assert_eq!(
            outbox.take(d, 100),
            vec![Outgoing::Resync {
                rank: 1,
                snapshot: vec![]
            }]
        );
        assert_eq!(outbox.blocks(), 0);
    }

    #[test]
    fn every_destination_gets_every_change_once() {
        let mut outbox = Outbox::new(1, 100, ReplicaConfig::default());
        outbox.set_ready(0);
        let (a, b) = (outbox.add_destination(), outbox.add_destination());
        let mut stats = ApplyStats::default();
        outbox.apply(0, &batch(1), &mut stats);
        for d in [a, b] {
            assert!(
                matches!(&outbox.take(d, 100)[..], [Outgoing::Resync { snapshot, .. }] if snapshot.len() == 1)
            );
        }
        outbox.apply(0, &batch(2), &mut stats);
        outbox.apply(0, &batch(3), &mut stats);
        assert_eq!(outbox.queued(), 2);
        // `a` takes one, then the rest; `b` still finds both.
        assert!(
            matches!(&outbox.take(a, 1)[..], [Outgoing::Delta { changes, .. }] if changes.len() == 1)
        );
        assert!(
            matches!(&outbox.take(a, 100)[..], [Outgoing::Delta { changes, .. }] if changes.len() == 1)
        );
        assert_eq!(outbox.queued_for(a), 0);
        assert_eq!(outbox.queued_for(b), 2);
        assert_eq!(outbox.queued(), 2, "kept while b has not taken them");
        assert!(
            matches!(&outbox.take(b, 100)[..], [Outgoing::Delta { changes, .. }] if changes.len() == 2)
        );
        assert_eq!(
            outbox.queued(),
            0,
            "dropped once every destination has them"
        );
    }

    #[test]
    fn a_slow_destination_resyncs_alone_when_the_log_overflows() {
        let mut outbox = Outbox::new(1, 3, ReplicaConfig::default());
        outbox.set_ready(0);
        let (fast, slow) = (outbox.add_destination(), outbox.add_destination());
        outbox.take(fast, 100);
        outbox.take(slow, 100);
        let mut stats = ApplyStats::default();
        let mut overflowed = 0;
        for h in 1..=6 {
            overflowed += outbox.apply(0, &batch(h), &mut stats).overflowed;
            // The fast one keeps up.
            let taken = outbox.take(fast, 100);
            assert!(
                matches!(&taken[..], [Outgoing::Delta { changes, .. }] if changes.len() == 1),
                "{taken:?}"
            );
        }
        assert_eq!(overflowed, 1, "the slow destination overflowed once");
        assert!(outbox.queued() <= 3);
        match &outbox.take(slow, 100)[..] {
            [Outgoing::Resync { snapshot, .. }] => assert_eq!(snapshot.len(), 6),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_removed_or_resyncing_destination_holds_nothing() {
        let mut outbox = Outbox::new(1, 100, ReplicaConfig::default());
        outbox.set_ready(0);
        let (a, b) = (outbox.add_destination(), outbox.add_destination());
        outbox.take(a, 100);
        outbox.take(b, 100);
        let mut stats = ApplyStats::default();
        outbox.apply(0, &batch(1), &mut stats);
        outbox.take(a, 100);
        assert_eq!(outbox.queued(), 1);
        outbox.remove_destination(b);
        assert_eq!(outbox.queued(), 0);
        outbox.apply(0, &batch(2), &mut stats);
        outbox.mark_for_resync(a);
        assert_eq!(outbox.queued(), 0);
        // With no destination reading the log, nothing is logged at all.
        outbox.apply(0, &batch(3), &mut stats);
        assert_eq!(outbox.queued(), 0);
        assert!(
            matches!(&outbox.take(a, 100)[..], [Outgoing::Resync { snapshot, .. }] if snapshot.len() == 3)
        );
        assert!(
            outbox.take(b, 100).is_empty(),
            "a removed destination gets nothing"
        );
    }

    #[test]
    fn a_new_destination_starts_with_a_resync_without_disturbing_the_others() {
        let mut outbox = Outbox::new(1, 100, ReplicaConfig::default());
        outbox.set_ready(0);
        let a = outbox.add_destination();
        outbox.take(a, 100);
        let mut stats = ApplyStats::default();
        outbox.apply(0, &batch(1), &mut stats);
        let late = outbox.add_destination();
        assert!(
            matches!(&outbox.take(late, 100)[..], [Outgoing::Resync { snapshot, .. }] if snapshot.len() == 1)
        );
        assert!(
            matches!(&outbox.take(a, 100)[..], [Outgoing::Delta { changes, .. }] if changes.len() == 1)
        );
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
