//! Speculative holders: a pick is remembered as "this replica will hold the
//! prompt's blocks" until the engine's own events say so, or a short TTL
//! passes. Without it, requests sharing a new prefix that arrive before the
//! first one's KV events scatter across the fleet (each sees no holder).
//!
//! Kept apart from the index: nothing here is a real holding, so `/snapshot`
//! never shows it; a replica's speculations go when it leaves the index
//! (`retain`) or its events speak for those blocks (`confirm`); the number of
//! remembered blocks is bounded, the oldest going first.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::index::FastMap;

use smallvec::SmallVec;

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

/// A block's speculative holders: replica id and expiry.
type Holders = SmallVec<[(Box<str>, i64); 2]>;

/// Which (scope, block) keys the table holds, read without the table's
/// lock: a count of keys per hash slot, so a lookup whose blocks all fall in
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
        let h = (scope ^ fp.0.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.slots[(h >> 48) as usize % PRESENCE_SLOTS]
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

/// The speculation table. `scope` is a caller-chosen tag of the index scope
/// (the same prompt in two scopes is two different things).
#[derive(Debug, Default)]
pub struct Speculation {
    settings: SpeculationSettings,
    blocks: FastMap<(u64, Fingerprint), Holders>,
    /// The keys of `blocks`, for readers without the lock.
    presence: Arc<Presence>,
    /// Insertion order, for expiry and the size bound.
    order: VecDeque<(u64, Fingerprint, i64)>,
    entries: usize,
    dropped_for_space: u64,
}

impl Speculation {
    /// An empty table.
    pub fn new(settings: SpeculationSettings) -> Self {
        Self {
            settings,
            ..Self::default()
        }
    }

    /// The table's keys, readable without its lock ([`Presence`]).
    pub fn presence(&self) -> Arc<Presence> {
        Arc::clone(&self.presence)
    }

    /// Whether speculation is on.
    pub fn enabled(&self) -> bool {
        self.settings.ttl_ms > 0 && self.settings.max_entries > 0
    }

    /// `replica_id` was picked for a prompt of `blocks` at `now_ms` (the
    /// blocks it does not hold yet: a real holding needs no stand-in).
    ///
    /// A block it already holds speculatively keeps its expiry: a pick the
    /// speculation itself attracted must not keep it alive, or a few picks
    /// made before the real holder was known would split a hot prompt for
    /// as long as traffic flows. Only the engine's events confirm it.
    pub fn record(&mut self, scope: u64, replica_id: &str, blocks: &[Fingerprint], now_ms: i64) {
        if !self.enabled() {
            return;
        }
        self.expire(now_ms);
        let expires = now_ms.saturating_add(self.settings.ttl_ms);
        for &fp in blocks {
            let holders = self.blocks.entry((scope, fp)).or_default();
            if holders.iter().any(|(id, _)| &**id == replica_id) {
                continue;
            }
            if holders.is_empty() {
                self.presence.added(scope, fp);
            }
            holders.push((replica_id.into(), expires));
            self.entries += 1;
            self.order.push_back((scope, fp, expires));
        }
        while self.entries > self.settings.max_entries {
            let Some((scope, fp, _)) = self.order.pop_front() else {
                break;
            };
            if let Some(holders) = self.blocks.remove(&(scope, fp)) {
                self.presence.removed(scope, fp);
                self.entries -= holders.len();
                self.dropped_for_space += holders.len() as u64;
            }
        }
    }

    /// Drops what expired by `now_ms`.
    pub fn expire(&mut self, now_ms: i64) {
        while let Some(&(scope, fp, expires)) = self.order.front() {
            if expires > now_ms {
                break;
            }
            self.order.pop_front();
            if let Some(holders) = self.blocks.get_mut(&(scope, fp)) {
                let before = holders.len();
                holders.retain(|(_, e)| *e > now_ms);
                self.entries -= before - holders.len();
                if holders.is_empty() {
                    self.blocks.remove(&(scope, fp));
                    self.presence.removed(scope, fp);
                }
            }
        }
    }

    /// The engine's events for `replica_id` now speak for `blocks` (stored:
    /// the real holding replaces the speculation; evicted: it is gone).
    pub fn confirm(&mut self, scope: u64, replica_id: &str, blocks: &[Fingerprint]) {
        for &fp in blocks {
            if let Some(holders) = self.blocks.get_mut(&(scope, fp)) {
                let before = holders.len();
                holders.retain(|(id, _)| &**id != replica_id);
                self.entries -= before - holders.len();
                if holders.is_empty() {
                    self.blocks.remove(&(scope, fp));
                    self.presence.removed(scope, fp);
                }
            }
        }
    }

    /// Keeps only replicas `keep` accepts (those still in the index).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        let mut removed = 0;
        let presence = &self.presence;
        self.blocks.retain(|&(scope, fp), holders| {
            let before = holders.len();
            holders.retain(|(id, _)| keep(id));
            removed += before - holders.len();
            if holders.is_empty() {
                presence.removed(scope, fp);
            }
            !holders.is_empty()
        });
        self.entries -= removed;
    }

    /// For each replica speculatively holding the prompt's first block, how
    /// many of `blocks` it holds in a row from the start, at `now_ms`.
    pub fn matched(&self, scope: u64, blocks: &[Fingerprint], now_ms: i64) -> Vec<(String, u32)> {
        let live = |fp: Fingerprint| {
            self.blocks
                .get(&(scope, fp))
                .map_or(&[][..], |h| h.as_slice())
                .iter()
                .filter(move |(_, e)| *e > now_ms)
        };
        let Some((&first, rest)) = blocks.split_first() else {
            return Vec::new();
        };
        let mut active: Vec<(String, u32)> =
            live(first).map(|(id, _)| (id.to_string(), 1)).collect();
        for (depth, &fp) in (1u32..).zip(rest) {
            if active.is_empty() {
                break;
            }
            // Compared in place: a prompt walks one block per step, and
            // nothing here should allocate per block.
            let mut any = false;
            for (id, run) in &mut active {
                if *run == depth && live(fp).any(|(holder, _)| **holder == **id) {
                    *run += 1;
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
        active
    }

    /// Every speculative holding of `blocks` at `now_ms`: runs from the
    /// first block, and runs continuing the real holdings of `holders`
    /// (replica id and blocks really held from the start); per replica,
    /// the blocks held from the start, real and speculative together.
    pub fn holdings(
        &self,
        scope: u64,
        blocks: &[Fingerprint],
        holders: &[(&str, u32)],
        now_ms: i64,
    ) -> Vec<(String, u32)> {
        if self.entries == 0 {
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
    /// where `blocks` starts).
    pub fn extension(
        &self,
        scope: u64,
        replica_id: &str,
        blocks: &[Fingerprint],
        now_ms: i64,
    ) -> u32 {
        let mut run = 0;
        for &fp in blocks {
            let held = self
                .blocks
                .get(&(scope, fp))
                .is_some_and(|h| h.iter().any(|(id, e)| *e > now_ms && &**id == replica_id));
            if !held {
                break;
            }
            run += 1;
        }
        run
    }

    /// (block, replica) entries remembered.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Entries dropped to stay within `max_entries`, since start.
    pub fn dropped_for_space(&self) -> u64 {
        self.dropped_for_space
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
        let mut s = table(1_000, 100);
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
        let mut s = table(1_000, 100);
        s.record(1, "a", &fps(&[10, 11, 12]), 0);
        s.record(1, "b", &fps(&[10, 11]), 0);
        let mut m = s.matched(1, &fps(&[10, 11, 12]), 1);
        m.sort();
        assert_eq!(m, vec![("a".into(), 3), ("b".into(), 2)]);
    }

    #[test]
    fn real_events_and_departures_replace_it() {
        let mut s = table(1_000, 100);
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
        let mut s = table(10_000, 4);
        s.record(1, "a", &fps(&[1, 2, 3]), 0);
        s.record(1, "b", &fps(&[4, 5]), 1);
        assert_eq!(s.len(), 4);
        assert_eq!(s.dropped_for_space(), 1);
        assert!(
            s.matched(1, &fps(&[1]), 2).is_empty(),
            "the oldest went first"
        );
        assert_eq!(s.matched(1, &fps(&[4, 5]), 2), vec![("b".into(), 2)]);
    }

    #[test]
    fn a_pick_does_not_renew_a_speculation_and_extends_a_real_holding() {
        let mut s = table(1_000, 100);
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
        let mut s = table(0, 100);
        s.record(1, "a", &fps(&[1]), 0);
        assert!(s.is_empty());
    }

    #[test]
    fn presence_follows_the_table_and_never_misses_a_holding() {
        let mut s = table(1_000, 3);
        let p = s.presence();
        assert!(!p.may_hold_any(1, &fps(&[10, 11]), &[]));
        s.record(1, "a", &fps(&[10, 11]), 0);
        s.record(1, "b", &fps(&[10]), 0);
        assert!(p.may_hold_any(1, &fps(&[10, 11]), &[]));
        // A holder really holding 10 continues at 11.
        assert!(p.may_hold_any(1, &fps(&[9, 11]), &[("a", 1)]));
        assert!(!p.may_hold(2, fps(&[10])[0]), "another scope");
        s.confirm(1, "a", &fps(&[11]));
        assert!(!p.may_hold(1, fps(&[11])[0]));
        s.record(1, "c", &fps(&[12, 13]), 0);
        assert_eq!(s.dropped_for_space(), 2, "10 went for space");
        assert!(!p.may_hold(1, fps(&[10])[0]));
        s.retain(|id| id != "c");
        s.record(1, "d", &fps(&[14]), 0);
        s.expire(1_000);
        assert!(s.is_empty());
        assert!(
            [10, 11, 12, 13, 14]
                .iter()
                .all(|&b| !p.may_hold(1, fps(&[b])[0])),
            "every key gone from the table is gone from the presence"
        );
    }
}
