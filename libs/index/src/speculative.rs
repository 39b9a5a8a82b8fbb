//! Speculative holders: a pick is remembered as "this replica will hold the
//! prompt's blocks" until the engine's own events say so, or a short TTL
//! passes. Without it, requests sharing a new prefix that arrive before the
//! first one's KV events scatter across the fleet (each sees no holder).
//!
//! Kept apart from the index: nothing here is a real holding, so `/snapshot`
//! never shows it; a replica's speculations go when it leaves the index
//! (`retain`) or its events speak for those blocks (`confirm`); the number of
//! remembered blocks is bounded, the oldest going first.
//!
//! Every pick with a new tail writes here and every lookup may read here,
//! so a pick's blocks are kept as one run, the table is split into shards
//! by (scope, the run's first block), each behind its own short lock, and
//! a key's presence is readable with no lock at all: a pick takes one
//! shard's lock for its run, and two lookups meet on a lock only when
//! they read runs of the same shard at the same moment (one table of
//! single blocks behind one lock cost LookupRoute over half its rate at 64
//! in flight with new prompt tails, docs/benchmarks.md).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use parking_lot::Mutex;
use smallvec::SmallVec;

use crate::index::FastMap;
use crate::types::Fingerprint;

/// Bounds of the speculation table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpeculationSettings {
    /// How long a pick stands in for the real events, ms (0 disables).
    pub ttl_ms: i64,
    /// Most (block, replica) entries remembered.
    pub max_entries: usize,
}

impl Default for SpeculationSettings {
    fn default() -> Self {
        Self {
            ttl_ms: 2_000,
            max_entries: 1_000_000,
        }
    }
}

/// Which (scope, block) keys the table holds (the blocks its runs start
/// at), read without a lock: a count of keys per hash slot, so a lookup whose blocks all fall in
/// empty slots knows the table has nothing for it (the usual case: most
/// prompts are held for real) and skips the lock and the walk.
#[derive(Debug)]
pub struct Presence {
    slots: Box<[AtomicU32]>,
}

/// Slots of [`Presence`] (256 KiB): nearly empty at the tables of a few
/// thousand live blocks that TTLs of seconds keep.
const PRESENCE_SLOTS: usize = 1 << 16;

impl Default for Presence {
    fn default() -> Self {
        Self {
            slots: (0..PRESENCE_SLOTS).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

impl Presence {
    fn slot(&self, scope: u64, fp: Fingerprint) -> &AtomicU32 {
        &self.slots[(key_hash(scope, fp) >> 48) as usize % PRESENCE_SLOTS]
    }

    fn added(&self, scope: u64, fp: Fingerprint) {
        self.slot(scope, fp).fetch_add(1, Ordering::Relaxed);
    }

    fn removed(&self, scope: u64, fp: Fingerprint) {
        let _ = self
            .slot(scope, fp)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(1))
            });
    }

    /// Whether the table may hold `fp` in `scope` (false: it does not).
    pub fn may_hold(&self, scope: u64, fp: Fingerprint) -> bool {
        self.slot(scope, fp).load(Ordering::Relaxed) != 0
    }

    /// Whether [`Speculation::holdings`] of `blocks` continuing `holders`
    /// may find anything: it starts every run at the first block or where
    /// a holder's real holding ends (false: it finds nothing).
    pub fn may_hold_any(
        &self,
        scope: u64,
        blocks: &[Fingerprint],
        holders: &[(&str, u32)],
    ) -> bool {
        let at = |i: usize| blocks.get(i).is_some_and(|&fp| self.may_hold(scope, fp));
        at(0) || holders.iter().any(|&(_, real)| at(real as usize))
    }
}

/// A (scope, block) key's hash: its presence slot from the top 16 bits,
/// its shard from the 6 below them (a multiplicative hash mixes only
/// upwards: its low bits follow the key's low bits alone).
fn key_hash(scope: u64, fp: Fingerprint) -> u64 {
    (scope ^ fp.0.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// Most shards, and the fewest entries a shard is sized for: a small
/// table (a test's, a tiny `max_entries`) is one shard, bounded oldest
/// first over all its runs.
const MAX_SHARDS: usize = 64;
const MIN_SHARD_ENTRIES: usize = 4_096;

/// A pick's speculative holding: the blocks its replica did not hold, in
/// prompt order, kept whole under the key of its first block. Fingerprints
/// chain, so a block names its whole prefix: a lookup reaching the run's
/// first block compares the rest of its prompt with `blocks` in one
/// sequential read, where a table of single blocks would take a random
/// read (and a lock) per block to record, expire and walk.
#[derive(Debug)]
struct Run {
    replica: Arc<str>,
    expires: i64,
    blocks: Box<[Fingerprint]>,
}

/// The runs starting at one block (most blocks start one, or none).
type Runs = SmallVec<[Run; 1]>;

/// One shard: its runs by (scope, first block), in the order they
/// expire, behind its lock, and how many keys it holds (written under the
/// lock, read without it). Aligned so that two shards' locks never share
/// a cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    table: Mutex<Table>,
    keys: AtomicUsize,
}

/// A shard's table.
#[derive(Debug, Default)]
struct Table {
    runs: FastMap<(u64, Fingerprint), Runs>,
    /// Runs' keys in insertion order (with their expiry), for expiry and
    /// the size bound.
    order: VecDeque<(u64, Fingerprint, i64)>,
    /// (block, replica) entries: the runs' blocks.
    entries: usize,
    dropped_for_space: u64,
}

impl Table {
    /// Removes the runs at `key` that `gone` selects; their blocks.
    fn remove(
        &mut self,
        key: (u64, Fingerprint),
        presence: &Presence,
        mut gone: impl FnMut(&Run) -> bool,
    ) -> usize {
        let Some(runs) = self.runs.get_mut(&key) else {
            return 0;
        };
        let before: usize = runs.iter().map(|r| r.blocks.len()).sum();
        runs.retain(|r| !gone(r));
        let after: usize = runs.iter().map(|r| r.blocks.len()).sum();
        if runs.is_empty() {
            self.runs.remove(&key);
            presence.removed(key.0, key.1);
        }
        self.entries -= before - after;
        before - after
    }

    /// Drops what expired by `now_ms`.
    fn expire(&mut self, now_ms: i64, presence: &Presence) {
        while let Some(&(scope, fp, expires)) = self.order.front() {
            if expires > now_ms {
                break;
            }
            self.order.pop_front();
            self.remove((scope, fp), presence, |r| r.expires <= now_ms);
        }
    }

    /// Adds `run` at `key`.
    fn insert(&mut self, key: (u64, Fingerprint), run: Run, presence: &Presence) {
        let runs = self.runs.entry(key).or_default();
        if runs.is_empty() {
            presence.added(key.0, key.1);
        }
        self.entries += run.blocks.len();
        self.order.push_back((key.0, key.1, run.expires));
        runs.push(run);
    }

    /// The most blocks of `prompt` (from its first) that one of
    /// `replica_id`'s live runs at `key` holds.
    fn longest(
        &self,
        key: (u64, Fingerprint),
        replica_id: &str,
        prompt: &[Fingerprint],
        now_ms: i64,
    ) -> usize {
        self.runs.get(&key).map_or(0, |runs| {
            runs.iter()
                .filter(|r| r.expires > now_ms && &*r.replica == replica_id)
                .map(|r| common_prefix(&r.blocks, prompt))
                .max()
                .unwrap_or(0)
        })
    }
}

/// How many blocks `a` and `b` share from their first.
fn common_prefix(a: &[Fingerprint], b: &[Fingerprint]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The speculation table. `scope` is a caller-chosen tag of the index scope
/// (the same prompt in two scopes is two different things). Shared by
/// reference: every method takes `&self`.
#[derive(Debug)]
pub struct Speculation {
    settings: SpeculationSettings,
    /// The runs' keys in every shard, for readers without a lock.
    presence: Presence,
    shards: Box<[Shard]>,
    /// Shards holding any run: changed only when one empties or fills
    /// (under its lock), so picks into a busy table never write it; an
    /// event reads it once to skip an empty table.
    held_shards: AtomicUsize,
    /// Entries a shard keeps at most: its share of `max_entries`.
    shard_max_entries: usize,
}

impl Default for Speculation {
    fn default() -> Self {
        Self::new(SpeculationSettings::default())
    }
}

impl Speculation {
    /// An empty table.
    pub fn new(settings: SpeculationSettings) -> Self {
        let wanted = (settings.max_entries / MIN_SHARD_ENTRIES).clamp(1, MAX_SHARDS);
        // A power of two, so a shard is a mask of the hash's bits.
        let shards = 1 << wanted.ilog2();
        Self {
            settings,
            presence: Presence::default(),
            shards: (0..shards).map(|_| Shard::default()).collect(),
            held_shards: AtomicUsize::new(0),
            shard_max_entries: settings.max_entries.div_ceil(shards),
        }
    }

    /// The table's keys, readable without a lock ([`Presence`]).
    pub fn presence(&self) -> &Presence {
        &self.presence
    }

    /// Whether speculation is on.
    pub fn enabled(&self) -> bool {
        self.settings.ttl_ms > 0 && self.settings.max_entries > 0
    }

    fn shard(&self, scope: u64, fp: Fingerprint) -> &Mutex<Table> {
        &self.shard_of(scope, fp).table
    }

    fn shard_of(&self, scope: u64, fp: Fingerprint) -> &Shard {
        let i = (key_hash(scope, fp) >> 42) as usize & (self.shards.len() - 1);
        &self.shards[i]
    }

    /// Publishes that `shard` (locked by the caller) holds `keys` keys, and
    /// counts it among the shards holding any.
    fn publish(&self, shard: &Shard, keys: usize) {
        let before = shard.keys.swap(keys, Ordering::Relaxed);
        if (before == 0) != (keys == 0) {
            if keys == 0 {
                self.held_shards.fetch_sub(1, Ordering::Relaxed);
            } else {
                self.held_shards.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Runs `f` on the table of `(scope, fp)`'s shard, then publishes how
    /// many keys it holds.
    fn with_shard<R>(&self, scope: u64, fp: Fingerprint, f: impl FnOnce(&mut Table) -> R) -> R {
        let shard = self.shard_of(scope, fp);
        let mut t = shard.table.lock();
        let r = f(&mut t);
        self.publish(shard, t.runs.len());
        r
    }

    /// `replica_id` was picked for a prompt of `blocks` at `now_ms` (the
    /// blocks it does not hold yet: a real holding needs no stand-in).
    ///
    /// A block it already holds speculatively keeps its expiry: a pick the
    /// speculation itself attracted must not keep it alive, or a few picks
    /// made before the real holder was known would split a hot prompt for
    /// as long as traffic flows. Only the engine's events confirm it. The
    /// rest is one run, under one shard's lock, that shard's expired runs
    /// dropped first and its oldest while it is over its share of
    /// `max_entries`; a run longer than that share keeps its first blocks
    /// (what a lookup matches first), so the newest pick is never the one
    /// dropped.
    pub fn record(&self, scope: u64, replica_id: &str, blocks: &[Fingerprint], now_ms: i64) {
        if !self.enabled() {
            return;
        }
        let held = self.extension(scope, replica_id, blocks, now_ms) as usize;
        let Some(new) = blocks.get(held..).filter(|b| !b.is_empty()) else {
            return;
        };
        let new = &new[..new.len().min(self.shard_max_entries)];
        let key = (scope, new[0]);
        let run = Run {
            replica: replica_id.into(),
            expires: now_ms.saturating_add(self.settings.ttl_ms),
            blocks: new.into(),
        };
        self.with_shard(scope, new[0], |t| {
            t.expire(now_ms, &self.presence);
            t.insert(key, run, &self.presence);
            while t.entries > self.shard_max_entries {
                let Some((scope, fp, _)) = t.order.pop_front() else {
                    break;
                };
                let dropped = t.remove((scope, fp), &self.presence, |_| true);
                t.dropped_for_space += dropped as u64;
            }
        });
    }

    /// Drops what expired by `now_ms`, shard by shard.
    pub fn expire(&self, now_ms: i64) {
        for shard in &self.shards {
            let mut t = shard.table.lock();
            t.expire(now_ms, &self.presence);
            self.publish(shard, t.runs.len());
        }
    }

    /// The engine's events for `replica_id` now speak for `blocks`, in
    /// prompt order (stored: the real holding replaces the speculation;
    /// evicted: it is gone). Each of `replica_id`'s runs starting at one of
    /// them ends; what such a run holds past the event's blocks (a prefill
    /// stored in chunks) stays, as a run of its own with the same expiry.
    /// A run the event's blocks start inside is left to its TTL. A block
    /// no run starts at takes no lock, a block of an empty shard reads one
    /// word of a few kilobytes that stay in cache, and an event into an
    /// empty table (ingest while no pick left blocks unheld) one word in
    /// all.
    pub fn confirm(&self, scope: u64, replica_id: &str, blocks: &[Fingerprint]) {
        if self.held_shards.load(Ordering::Relaxed) == 0 {
            return;
        }
        for (i, &fp) in blocks.iter().enumerate() {
            if self.shard_of(scope, fp).keys.load(Ordering::Relaxed) == 0
                || !self.presence.may_hold(scope, fp)
            {
                continue;
            }
            // What the runs ending here hold past the event, put in first,
            // so that no reader (nor this shard's count) sees neither.
            let rests: SmallVec<[Run; 1]> = self
                .shard(scope, fp)
                .lock()
                .runs
                .get(&(scope, fp))
                .into_iter()
                .flatten()
                .filter(|r| &*r.replica == replica_id)
                .filter_map(|r| {
                    let spoken = common_prefix(&r.blocks, &blocks[i..]);
                    (spoken < r.blocks.len()).then(|| Run {
                        replica: Arc::clone(&r.replica),
                        expires: r.expires,
                        blocks: r.blocks[spoken..].into(),
                    })
                })
                .collect();
            for run in rests {
                let first = run.blocks[0];
                self.with_shard(scope, first, |t| {
                    t.insert((scope, first), run, &self.presence);
                });
            }
            self.with_shard(scope, fp, |t| {
                t.remove((scope, fp), &self.presence, |r| &*r.replica == replica_id)
            });
        }
    }

    /// Keeps only replicas `keep` accepts (those still in the index),
    /// shard by shard.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) {
        for shard in &self.shards {
            let mut t = shard.table.lock();
            // Rare (a replica left, or its cache was cleared): the keys are
            // listed first so that every removal is counted in one place.
            let keys: Vec<(u64, Fingerprint)> = t.runs.keys().copied().collect();
            for key in keys {
                t.remove(key, &self.presence, |r| !keep(&r.replica));
            }
            self.publish(shard, t.runs.len());
        }
    }

    /// For each replica speculatively holding the prompt's first block, how
    /// many of `blocks` it holds in a row from the start, at `now_ms`.
    pub fn matched(&self, scope: u64, blocks: &[Fingerprint], now_ms: i64) -> Vec<(String, u32)> {
        let Some(&first) = blocks.first() else {
            return Vec::new();
        };
        if !self.presence.may_hold(scope, first) {
            return Vec::new();
        }
        let mut replicas: SmallVec<[Arc<str>; 4]> = SmallVec::new();
        if let Some(runs) = self.shard(scope, first).lock().runs.get(&(scope, first)) {
            for r in runs.iter().filter(|r| r.expires > now_ms) {
                if !replicas.contains(&r.replica) {
                    replicas.push(Arc::clone(&r.replica));
                }
            }
        }
        replicas
            .into_iter()
            .map(|id| {
                let run = self.extension(scope, &id, blocks, now_ms);
                (id.to_string(), run)
            })
            .filter(|(_, run)| *run > 0)
            .collect()
    }

    /// Every speculative holding of `blocks` at `now_ms`: runs from the
    /// first block, and runs continuing the real holdings of `holders`
    /// (replica id and blocks really held from the start); per replica,
    /// the blocks held from the start, real and speculative together.
    /// Costs a lock-free read of a block or two when no run starts where
    /// one could be found ([`Presence::may_hold_any`]).
    pub fn holdings(
        &self,
        scope: u64,
        blocks: &[Fingerprint],
        holders: &[(&str, u32)],
        now_ms: i64,
    ) -> Vec<(String, u32)> {
        if !self.presence.may_hold_any(scope, blocks, holders) {
            return Vec::new();
        }
        let mut found = self.matched(scope, blocks, now_ms);
        for &(id, real) in holders {
            let Some(rest) = blocks.get(real as usize..).filter(|r| !r.is_empty()) else {
                continue;
            };
            let run = self.extension(scope, id, rest, now_ms);
            if run == 0 {
                continue;
            }
            match found.iter_mut().find(|(f, _)| f == id) {
                Some(f) => f.1 = f.1.max(real + run),
                None => found.push((id.to_owned(), real + run)),
            }
        }
        found
    }

    /// How many of `blocks`, from the first, `replica_id` holds
    /// speculatively at `now_ms` (continuing a real holding that ends
    /// where `blocks` starts): its runs followed from one to the next, one
    /// lock a run.
    pub fn extension(
        &self,
        scope: u64,
        replica_id: &str,
        blocks: &[Fingerprint],
        now_ms: i64,
    ) -> u32 {
        let mut held = 0;
        while let Some(&fp) = blocks.get(held) {
            if !self.presence.may_hold(scope, fp) {
                break;
            }
            let run = self.shard(scope, fp).lock().longest(
                (scope, fp),
                replica_id,
                &blocks[held..],
                now_ms,
            );
            if run == 0 {
                break;
            }
            held += run;
        }
        u32::try_from(held).unwrap_or(u32::MAX)
    }

    /// (block, replica) entries remembered (each shard locked in turn).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.table.lock().entries).sum()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries dropped to stay within `max_entries`, since start.
    pub fn dropped_for_space(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.table.lock().dropped_for_space)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(ttl_ms: i64, max_entries: usize) -> Speculation {
        Speculation::new(SpeculationSettings {
            ttl_ms,
            max_entries,
        })
    }

    fn fps(v: &[u64]) -> Vec<Fingerprint> {
        Fingerprint::from_raw(v.to_vec())
    }

    #[test]
    fn a_pick_stands_in_until_its_ttl() {
        let s = table(1_000, 100);
        s.record(1, "a", &fps(&[10, 11, 12]), 0);
        assert_eq!(
            s.matched(1, &fps(&[10, 11, 12, 13]), 500),
            vec![("a".into(), 3)]
        );
        assert_eq!(
            s.matched(1, &fps(&[10, 99, 12]), 500),
            vec![("a".into(), 1)]
        );
        assert!(
            s.matched(2, &fps(&[10, 11]), 500).is_empty(),
            "scopes are apart"
        );
        assert!(s.matched(1, &fps(&[10, 11]), 1_000).is_empty(), "expired");
        s.expire(1_000);
        assert!(s.is_empty());
    }

    #[test]
    fn runs_are_counted_per_replica_from_the_start() {
        let s = table(1_000, 100);
        s.record(1, "a", &fps(&[10, 11, 12]), 0);
        s.record(1, "b", &fps(&[10, 11]), 0);
        let mut m = s.matched(1, &fps(&[10, 11, 12]), 1);
        m.sort();
        assert_eq!(m, vec![("a".into(), 3), ("b".into(), 2)]);
    }

    #[test]
    fn real_events_and_departures_replace_it() {
        let s = table(1_000, 100);
        s.record(1, "a", &fps(&[10, 11]), 0);
        s.record(1, "b", &fps(&[10, 11]), 0);
        s.confirm(1, "a", &fps(&[10, 11]));
        assert_eq!(s.matched(1, &fps(&[10, 11]), 1), vec![("b".into(), 2)]);
        s.retain(|id| id != "b");
        assert!(s.is_empty());
        assert!(s.matched(1, &fps(&[10, 11]), 1).is_empty());
    }

    #[test]
    fn the_table_is_bounded_oldest_first() {
        let s = table(10_000, 4);
        s.record(1, "a", &fps(&[1, 2, 3]), 0);
        s.record(1, "b", &fps(&[4, 5]), 1);
        // A pick's run goes whole: a's three blocks for b's two.
        assert_eq!(s.len(), 2);
        assert_eq!(s.dropped_for_space(), 3);
        assert!(
            s.matched(1, &fps(&[1]), 2).is_empty(),
            "the oldest went first"
        );
        assert_eq!(s.matched(1, &fps(&[4, 5]), 2), vec![("b".into(), 2)]);
        s.record(1, "c", &fps(&[6, 7]), 2);
        assert_eq!((s.len(), s.dropped_for_space()), (4, 3), "within the bound");
    }

    #[test]
    fn a_pick_does_not_renew_a_speculation_and_extends_a_real_holding() {
        let s = table(1_000, 100);
        s.record(1, "a", &fps(&[10, 11]), 0);
        // Picked again (the speculation attracted it): the expiry stands.
        s.record(1, "a", &fps(&[10, 11]), 900);
        assert_eq!(s.len(), 2);
        assert!(s.matched(1, &fps(&[10, 11]), 1_000).is_empty());
        // A real holder of 20, 21 speculatively holds what comes next.
        s.record(1, "b", &fps(&[22, 23]), 1_000);
        assert_eq!(s.extension(1, "b", &fps(&[22, 23, 24]), 1_001), 2);
        assert_eq!(s.extension(1, "c", &fps(&[22, 23]), 1_001), 0);
        assert_eq!(s.extension(1, "b", &fps(&[22, 23]), 2_000), 0, "expired");
    }

    #[test]
    fn a_zero_ttl_disables_it() {
        let s = table(0, 100);
        s.record(1, "a", &fps(&[1]), 0);
        assert!(s.is_empty());
    }

    #[test]
    fn presence_follows_the_table_and_never_misses_a_holding() {
        let s = table(1_000, 3);
        let p = s.presence();
        assert!(!p.may_hold_any(1, &fps(&[10, 11]), &[]));
        s.record(1, "a", &fps(&[10, 11]), 0);
        s.record(1, "b", &fps(&[10]), 0);
        assert!(p.may_hold_any(1, &fps(&[10, 11]), &[]));
        assert!(!p.may_hold(2, fps(&[10])[0]), "another scope");
        // a's events store 10: what its run holds past it starts at 11, so
        // a holder really holding 10 continues there.
        s.confirm(1, "a", &fps(&[10]));
        assert!(p.may_hold_any(1, &fps(&[9, 11]), &[("a", 1)]));
        assert_eq!(s.extension(1, "a", &fps(&[11, 12]), 1), 1);
        s.confirm(1, "a", &fps(&[11]));
        assert!(!p.may_hold(1, fps(&[11])[0]));
        s.record(1, "c", &fps(&[12, 13]), 0);
        s.record(1, "d", &fps(&[14]), 0);
        assert_eq!(s.dropped_for_space(), 1, "b's run at 10 went for space");
        assert!(!p.may_hold(1, fps(&[10])[0]));
        s.retain(|id| id != "c");
        s.expire(1_000);
        assert!(s.is_empty());
        assert!(
            [10, 11, 12, 13, 14]
                .iter()
                .all(|&b| !p.may_hold(1, fps(&[b])[0])),
            "every key gone from the table is gone from the presence"
        );
        assert!(
            s.shards
                .iter()
                .all(|sh| sh.keys.load(Ordering::Relaxed) == 0),
            "and from its shard's count, which events read first"
        );
    }

    #[test]
    fn runs_chain_fork_and_end_where_the_events_speak() {
        let s = table(1_000, 100);
        // a holds 1..=3 speculatively; a later pick of a (attracted by that)
        // for a longer prompt adds only what follows, as a run of its own.
        s.record(1, "a", &fps(&[1, 2, 3]), 0);
        s.record(1, "a", &fps(&[1, 2, 3, 4, 5]), 10);
        assert_eq!(s.len(), 5);
        assert_eq!(
            s.matched(1, &fps(&[1, 2, 3, 4, 5, 6]), 20),
            vec![("a".into(), 5)]
        );
        // A prompt forking inside the first run: a's fork is a run at 3'.
        s.record(1, "a", &fps(&[1, 2, 30, 31]), 10);
        assert_eq!(s.len(), 7);
        assert_eq!(s.extension(1, "a", &fps(&[1, 2, 30, 31, 32]), 20), 4);
        assert_eq!(s.extension(1, "a", &fps(&[1, 2, 3, 4]), 20), 4);
        // The first run expires at 1,000; what the later picks added
        // stays until 1,010.
        assert_eq!(s.extension(1, "a", &fps(&[4, 5]), 1_005), 2);
        assert_eq!(s.extension(1, "a", &fps(&[1, 2, 3]), 1_005), 0);
        // A prefill stored in two chunks: the first chunk's event leaves
        // the rest speculative, the second's ends it.
        let s = table(1_000, 100);
        s.record(1, "b", &fps(&[7, 8, 9, 10]), 0);
        s.confirm(1, "b", &fps(&[7, 8]));
        assert_eq!(s.len(), 2);
        assert!(s.matched(1, &fps(&[7, 8, 9]), 1).is_empty());
        assert_eq!(s.extension(1, "b", &fps(&[9, 10, 11]), 1), 2);
        s.confirm(1, "b", &fps(&[9, 10]));
        assert!(s.is_empty());
        assert_eq!(s.shards[0].keys.load(Ordering::Relaxed), 0);
        // Two forks of b's at one key (picks that raced): a chunk's event
        // keeps both rests.
        let s = table(1_000, 100);
        s.record(1, "b", &fps(&[7, 8]), 0);
        s.record(1, "b", &fps(&[7, 8]), 0);
        let t = &s.shards[0];
        let mut guard = t.table.lock();
        let forked = guard.runs.get_mut(&(1, fps(&[7])[0])).unwrap();
        assert_eq!(forked.len(), 1, "the second pick added nothing");
        forked.push(Run {
            replica: "b".into(),
            expires: 1_000,
            blocks: fps(&[7, 9]).into(),
        });
        guard.entries += 2;
        drop(guard);
        s.confirm(1, "b", &fps(&[7]));
        assert_eq!(s.extension(1, "b", &fps(&[8]), 1), 1);
        assert_eq!(s.extension(1, "b", &fps(&[9]), 1), 1);
        assert_eq!(s.len(), 2);
        // Another replica's events end nothing of b's.
        let s = table(1_000, 100);
        s.record(1, "b", &fps(&[7, 8]), 0);
        s.confirm(1, "c", &fps(&[7, 8]));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn a_large_table_is_sharded_and_each_shard_is_bounded() {
        let s = table(10_000, 8_192);
        assert_eq!(s.shards.len(), 2);
        for i in 0..10_000_u64 {
            s.record(1, "a", &fps(&[1_000_000 + i]), 0);
        }
        assert!(s.len() <= 8_192);
        assert_eq!(s.len() as u64 + s.dropped_for_space(), 10_000);
        // The newest of each shard is kept; the oldest went.
        assert_eq!(s.extension(1, "a", &fps(&[1_009_999]), 1), 1);
        assert_eq!(s.extension(1, "a", &fps(&[1_000_000]), 1), 0);
        assert_eq!(table(1, 1_000_000).shards.len(), MAX_SHARDS);
        // A prompt longer than a shard's share keeps its first blocks (an
        // older run of its shard may go for it).
        let s = table(10_000, 8_192);
        s.record(1, "a", &fps(&[1]), 0);
        let long: Vec<u64> = (100..100 + 5_000).collect();
        s.record(1, "b", &fps(&long), 0);
        assert_eq!(s.extension(1, "b", &fps(&long), 1), 4_096);
        assert!(s.dropped_for_space() <= 1);
        assert_eq!(s.len() as u64 + s.dropped_for_space(), 4_097);
    }

    #[test]
    fn concurrent_picks_and_events_lose_nothing() {
        // Shards of 15,625 entries: 16,000 pass one only if the keys
        // crowd into few shards.
        let s = table(1_000, 1_000_000);
        assert_eq!(s.shards.len(), MAX_SHARDS);
        let prompt = |p: u64| fps(&(0..16).map(|b| p * 100 + b).collect::<Vec<_>>());
        std::thread::scope(|scope| {
            for t in 0..4_u64 {
                let s = &s;
                scope.spawn(move || {
                    let id = format!("r{t}");
                    for p in 0..500 {
                        s.record(1, &id, &prompt(p), 0);
                        // Each thread's events end its odd prompts.
                        if p % 2 == 1 {
                            s.confirm(1, &id, &prompt(p));
                        }
                        let _ = s.holdings(1, &prompt(p / 2), &[(&id, 0)], 1);
                    }
                });
            }
        });
        assert_eq!(s.len(), 4 * 250 * 16);
        assert_eq!(s.dropped_for_space(), 0);
        let held = s
            .shards
            .iter()
            .filter(|sh| sh.keys.load(Ordering::Relaxed) > 0)
            .count();
        assert_eq!(s.held_shards.load(Ordering::Relaxed), held);
        for p in 0..500 {
            let mut m = s.matched(1, &prompt(p), 1);
            m.sort();
            let want: Vec<(String, u32)> = if p % 2 == 1 {
                Vec::new()
            } else {
                (0..4).map(|t| (format!("r{t}"), 16)).collect()
            };
            assert_eq!(m, want, "prompt {p}");
        }
    }
}
