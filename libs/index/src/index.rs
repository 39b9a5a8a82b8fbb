//! The index itself.
//!
//! Layout: entries live in `shards`, keyed by `(scope id, fingerprint)`, each
//! holding the fingerprint's depth in its prompt and the replicas that hold
//! it (with their tier). Writers (ingest) are serialised by one mutex that
//! also guards each replica's set of held fingerprints — that set is what
//! makes clears, resyncs and drains exact. Readers never take that mutex:
//! they read replica metadata from a read-mostly registry and each entry
//! under its shard's read lock.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};
use smallvec::SmallVec;

use crate::types::{
    Candidate, Change, ContentError, Fingerprint, LookupOutcome, ReplicaKey, ReplicaSnapshot,
    Scope, Tier,
};

type ScopeId = u32;
type ReplicaIdx = u32;

/// Fingerprints are already uniformly random: mixing the scope id in is all
/// the hashing they need.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8)) ^ u64::from(b);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 ^= u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

type Map<K, V> = HashMap<K, V, BuildHasherDefault<KeyHasher>>;

#[derive(Clone, Copy, Debug)]
struct Holder {
    replica: ReplicaIdx,
    tier: Tier,
    /// Matches the capacity queue record that stored it.
    stamp: u32,
}

#[derive(Debug)]
struct Entry {
    depth: u32,
    holders: SmallVec<[Holder; 2]>,
}

#[derive(Debug, Default)]
struct Shard {
    map: Map<(ScopeId, Fingerprint), Entry>,
}

/// Read-mostly facts about a replica.
#[derive(Debug)]
struct ReplicaMeta {
    key: ReplicaKey,
    scope: ScopeId,
    address: String,
    last_seen_ms: AtomicI64,
}

#[derive(Debug, Default)]
struct Registry {
    scopes: HashMap<Scope, ScopeId>,
    scope_list: Vec<Scope>,
    /// Block size learned per scope from stored events.
    block_sizes: HashMap<ScopeId, u32>,
    replicas: Vec<Option<Arc<ReplicaMeta>>>,
    by_key: HashMap<ReplicaKey, ReplicaIdx>,
}

/// Writer-side state of a replica.
#[derive(Debug, Default)]
struct Holdings {
    held: Map<Fingerprint, Tier>,
    last_event_ms: Option<i64>,
    block_size: u32,
    tier2: Option<(u64, u64)>,
}

#[derive(Debug, Default)]
struct Writer {
    holdings: HashMap<ReplicaIdx, Holdings>,
    /// Insertion order of (scope, fingerprint, replica, stamp), for evicting
    /// the least recently stored entries. Stale records are skipped lazily.
    order: VecDeque<(ScopeId, Fingerprint, ReplicaIdx, u32)>,
    next_stamp: u32,
    free_replica_slots: Vec<ReplicaIdx>,
}

/// Shard access for writers: lock one shard per operation, or use guards
/// already held on every shard (for an atomic resync).
enum Shards<'a> {
    Lock(&'a [RwLock<Shard>]),
    Held(Vec<parking_lot::RwLockWriteGuard<'a, Shard>>),
}

impl Shards<'_> {
    fn with<R>(&mut self, i: usize, f: impl FnOnce(&mut Shard) -> R) -> R {
        match self {
            Shards::Lock(shards) => f(&mut shards[i].write()),
            Shards::Held(guards) => f(&mut guards[i]),
        }
    }
}

/// Whether replica `idx` may appear in an answer for `scope`.
fn eligible(
    reg: &Registry,
    idx: ReplicaIdx,
    scope: ScopeId,
    candidates: Option<&HashSet<String>>,
    fresh_since_ms: Option<i64>,
) -> bool {
    let Some(Some(meta)) = reg.replicas.get(idx as usize) else {
        return false;
    };
    meta.scope == scope
        && candidates.is_none_or(|c| c.contains(&meta.key.replica_id))
        && fresh_since_ms.is_none_or(|t| meta.last_seen_ms.load(Ordering::Relaxed) >= t)
}

/// Orders matches best first: longest, then T1 before T2, then the replica
/// heard from most recently, then by key (deterministic).
fn ranked(reg: &Registry, scope: ScopeId, matches: Vec<(ReplicaIdx, u32, Tier)>) -> LookupOutcome {
    let block_size = reg.block_sizes.get(&scope).copied().unwrap_or(0);
    let mut out: Vec<(Candidate, i64)> = matches
        .into_iter()
        .filter_map(|(idx, matched_blocks, tier)| {
            let meta = reg.replicas.get(idx as usize)?.as_ref()?;
            Some((
                Candidate {
                    replica: meta.key.clone(),
                    address: meta.address.clone(),
                    matched_blocks,
                    block_size,
                    tier,
                },
                meta.last_seen_ms.load(Ordering::Relaxed),
            ))
        })
        .collect();
    out.sort_by(|(a, a_seen), (b, b_seen)| {
        b.matched_blocks
            .cmp(&a.matched_blocks)
            .then(a.tier.cmp(&b.tier))
            .then(b_seen.cmp(a_seen))
            .then(a.replica.cmp(&b.replica))
    });
    LookupOutcome::Matches(out.into_iter().map(|(c, _)| c).collect())
}

/// Sizing of the index.
#[derive(Clone, Copy, Debug)]
pub struct IndexConfig {
    /// Most (replica, block) entries held; beyond it the least recently
    /// stored are evicted.
    pub capacity_entries: u64,
    /// Number of lock shards (rounded up to a power of two).
    pub shards: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            capacity_entries: 10_000_000,
            shards: 64,
        }
    }
}

/// The prefix index.
#[derive(Debug)]
pub struct Index {
    config: IndexConfig,
    registry: RwLock<Registry>,
    shards: Box<[RwLock<Shard>]>,
    writer: Mutex<Writer>,
    entries: AtomicU64,
    capacity_evictions: AtomicU64,
}

impl Index {
    /// An empty index.
    pub fn new(config: IndexConfig) -> Self {
        let n = config.shards.max(1).next_power_of_two();
        Self {
            config,
            registry: RwLock::default(),
            shards: (0..n).map(|_| RwLock::default()).collect(),
            writer: Mutex::default(),
            entries: AtomicU64::new(0),
            capacity_evictions: AtomicU64::new(0),
        }
    }

    fn shard_index(&self, scope: ScopeId, fp: Fingerprint) -> usize {
        // The shard comes from the top bits of a second multiplicative hash,
        // so the bits each shard's hash table indexes by (the key's low bits)
        // stay uniform within a shard. (Taking the shard from those same bits
        // left most buckets unreachable and made inserts quadratic.)
        let mix = (fp ^ u64::from(scope).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .wrapping_mul(0xff51_afd7_ed55_8ccd);
        let bits = self.shards.len().trailing_zeros();
        if bits == 0 {
            return 0;
        }
        // The shift leaves `bits` (< 64) bits: always a valid index.
        #[allow(clippy::cast_possible_truncation)]
        let i = (mix >> (64 - bits)) as usize;
        i
    }

    fn shard(&self, scope: ScopeId, fp: Fingerprint) -> &RwLock<Shard> {
        &self.shards[self.shard_index(scope, fp)]
    }

    /// Resident (replica, block) entries.
    pub fn len(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// Whether the index holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Entries evicted to stay within capacity, since start.
    pub fn capacity_evictions(&self) -> u64 {
        self.capacity_evictions.load(Ordering::Relaxed)
    }

    /// The block size learned for a scope from its events.
    pub fn block_size(&self, scope: &Scope) -> Option<u32> {
        let reg = self.registry.read();
        let id = reg.scopes.get(scope)?;
        reg.block_sizes.get(id).copied()
    }

    // === ingest ===

    /// Registers (or refreshes) a replica; returns whether it is new or
    /// changed scope (in which case its previous holdings were dropped).
    pub fn touch(&self, key: &ReplicaKey, scope: &Scope, address: &str, now_ms: i64) -> bool {
        let mut writer = self.writer.lock();
        self.touch_locked(&mut writer, key, scope, address, now_ms)
            .1
    }

    fn touch_locked(
        &self,
        writer: &mut Writer,
        key: &ReplicaKey,
        scope: &Scope,
        address: &str,
        now_ms: i64,
    ) -> (ReplicaIdx, bool) {
        {
            let reg = self.registry.read();
            if let Some(&idx) = reg.by_key.get(key)
                && let Some(Some(meta)) = reg.replicas.get(idx as usize)
                && reg.scopes.get(scope) == Some(&meta.scope)
                && meta.address == address
            {
                meta.last_seen_ms.fetch_max(now_ms, Ordering::Relaxed);
                return (idx, false);
            }
        }
        let mut reg = self.registry.write();
        let scope_id = match reg.scopes.get(scope) {
            Some(&id) => id,
            None => {
                let id = ScopeId::try_from(reg.scope_list.len()).unwrap_or(ScopeId::MAX);
                reg.scopes.insert(scope.clone(), id);
                reg.scope_list.push(scope.clone());
                id
            }
        };
        let existing = reg.by_key.get(key).copied();
        let mut old_scope = None;
        let (idx, changed_scope) = match existing {
            Some(idx) => {
                old_scope = reg.replicas[idx as usize].as_ref().map(|m| m.scope);
                (idx, old_scope != Some(scope_id))
            }
            None => {
                let idx = match writer.free_replica_slots.pop() {
                    Some(i) => i,
                    None => {
                        reg.replicas.push(None);
                        ReplicaIdx::try_from(reg.replicas.len() - 1).unwrap_or(ReplicaIdx::MAX)
                    }
                };
                reg.by_key.insert(key.clone(), idx);
                (idx, true)
            }
        };
        reg.replicas[idx as usize] = Some(Arc::new(ReplicaMeta {
            key: key.clone(),
            scope: scope_id,
            address: address.to_owned(),
            last_seen_ms: AtomicI64::new(now_ms),
        }));
        drop(reg);
        if changed_scope && let Some(old_scope) = old_scope {
            // Its entries were filed under the old scope.
            self.drop_all(&mut Shards::Lock(&self.shards), writer, old_scope, idx);
        }
        writer.holdings.entry(idx).or_default();
        (idx, changed_scope)
    }

    fn scope_of(&self, idx: ReplicaIdx) -> Option<ScopeId> {
        self.registry
            .read()
            .replicas
            .get(idx as usize)
            .and_then(|m| m.as_ref().map(|m| m.scope))
    }

    /// Applies changes reported by a replica. Inconsistent changes are
    /// skipped and returned; everything else is applied.
    pub fn apply(
        &self,
        key: &ReplicaKey,
        scope: &Scope,
        address: &str,
        changes: &[Change],
        now_ms: i64,
    ) -> Vec<ContentError> {
        let mut writer = self.writer.lock();
        let (idx, _) = self.touch_locked(&mut writer, key, scope, address, now_ms);
        let mut shards = Shards::Lock(&self.shards);
        let errors = self.apply_locked(&mut shards, &mut writer, idx, changes, now_ms);
        self.enforce_capacity(&mut writer);
        errors
    }

    /// Replaces a replica's whole state (a resync) in one step: lookups see
    /// either the old holdings or the new ones, never a mix.
    pub fn replace(
        &self,
        key: &ReplicaKey,
        scope: &Scope,
        address: &str,
        changes: &[Change],
        now_ms: i64,
    ) -> Vec<ContentError> {
        let mut writer = self.writer.lock();
        let (idx, _) = self.touch_locked(&mut writer, key, scope, address, now_ms);
        let Some(scope_id) = self.scope_of(idx) else {
            return Vec::new();
        };
        // Hold every shard (in index order, so writers cannot deadlock) for
        // the swap: no lookup observes it half done.
        let mut shards = Shards::Held(self.shards.iter().map(RwLock::write).collect());
        self.drop_all(&mut shards, &mut writer, scope_id, idx);
        let errors = self.apply_locked(&mut shards, &mut writer, idx, changes, now_ms);
        drop(shards);
        self.enforce_capacity(&mut writer);
        errors
    }

    /// Forgets a replica (drained or gone).
    pub fn remove_replica(&self, key: &ReplicaKey) -> bool {
        let mut writer = self.writer.lock();
        let Some(idx) = self.registry.read().by_key.get(key).copied() else {
            return false;
        };
        if let Some(scope_id) = self.scope_of(idx) {
            self.drop_all(&mut Shards::Lock(&self.shards), &mut writer, scope_id, idx);
        }
        writer.holdings.remove(&idx);
        writer.free_replica_slots.push(idx);
        let mut reg = self.registry.write();
        reg.by_key.remove(key);
        reg.replicas[idx as usize] = None;
        true
    }

    /// Replicas not heard from since `cutoff_ms` (Unix ms).
    pub fn replicas_silent_since(&self, cutoff_ms: i64) -> Vec<ReplicaKey> {
        self.registry
            .read()
            .replicas
            .iter()
            .flatten()
            .filter(|m| m.last_seen_ms.load(Ordering::Relaxed) < cutoff_ms)
            .map(|m| m.key.clone())
            .collect()
    }

    /// Records the replica's latest tier-2 counters.
    pub fn set_tier2(&self, key: &ReplicaKey, tier2: Option<(u64, u64)>) {
        let mut writer = self.writer.lock();
        if let Some(idx) = self.registry.read().by_key.get(key).copied()
            && let Some(h) = writer.holdings.get_mut(&idx)
        {
            h.tier2 = tier2;
        }
    }

    fn apply_locked(
        &self,
        shards: &mut Shards<'_>,
        writer: &mut Writer,
        idx: ReplicaIdx,
        changes: &[Change],
        now_ms: i64,
    ) -> Vec<ContentError> {
        let Some(scope) = self.scope_of(idx) else {
            return Vec::new();
        };
        let mut errors = Vec::new();
        for change in changes {
            match change {
                Change::Stored {
                    start_depth,
                    fingerprints,
                    block_size,
                    tier,
                } => {
                    if *block_size > 0
                        && self.registry.read().block_sizes.get(&scope) != Some(block_size)
                    {
                        self.registry.write().block_sizes.insert(scope, *block_size);
                    }
                    for (i, &fp) in fingerprints.iter().enumerate() {
                        let depth =
                            start_depth.saturating_add(u32::try_from(i).unwrap_or(u32::MAX));
                        if let Err(e) = self.store_one(shards, writer, scope, idx, fp, depth, *tier)
                        {
                            errors.push(e);
                        }
                    }
                    if let Some(h) = writer.holdings.get_mut(&idx) {
                        h.block_size = *block_size;
                    }
                }
                Change::Evicted { fingerprints } => {
                    self.drop_entries(
                        shards,
                        writer,
                        scope,
                        idx,
                        fingerprints.iter().copied(),
                        None,
                    );
                }
                Change::Cleared { tier } => {
                    let at_tier: Vec<Fingerprint> = writer
                        .holdings
                        .get(&idx)
                        .map(|h| {
                            h.held
                                .iter()
                                .filter(|(_, t)| *t == tier)
                                .map(|(f, _)| *f)
                                .collect()
                        })
                        .unwrap_or_default();
                    self.drop_entries(shards, writer, scope, idx, at_tier.into_iter(), Some(*tier));
                }
            }
            if let Some(h) = writer.holdings.get_mut(&idx) {
                h.last_event_ms = Some(h.last_event_ms.map_or(now_ms, |t| t.max(now_ms)));
            }
        }
        errors
    }

    #[allow(clippy::too_many_arguments)]
    fn store_one(
        &self,
        shards: &mut Shards<'_>,
        writer: &mut Writer,
        scope: ScopeId,
        idx: ReplicaIdx,
        fp: Fingerprint,
        depth: u32,
        tier: Tier,
    ) -> Result<(), ContentError> {
        let stamp = writer.next_stamp;
        writer.next_stamp = writer.next_stamp.wrapping_add(1);
        let added = shards.with(self.shard_index(scope, fp), |shard| {
            let entry = shard.map.entry((scope, fp)).or_insert_with(|| Entry {
                depth,
                holders: SmallVec::new(),
            });
            if entry.depth != depth {
                if entry.holders.is_empty() {
                    entry.depth = depth;
                } else {
                    return Err(ContentError::DepthMismatch {
                        fingerprint: fp,
                        known: entry.depth,
                        reported: depth,
                    });
                }
            }
            match entry.holders.iter_mut().find(|h| h.replica == idx) {
                Some(h) => {
                    h.tier = tier;
                    h.stamp = stamp;
                    Ok(false)
                }
                None => {
                    entry.holders.push(Holder {
                        replica: idx,
                        tier,
                        stamp,
                    });
                    Ok(true)
                }
            }
        })?;
        if added {
            self.entries.fetch_add(1, Ordering::Relaxed);
        }
        writer
            .holdings
            .entry(idx)
            .or_default()
            .held
            .insert(fp, tier);
        writer.order.push_back((scope, fp, idx, stamp));
        Ok(())
    }

    /// Removes `idx` as holder of everything it holds in `scope`.
    fn drop_all(
        &self,
        shards: &mut Shards<'_>,
        writer: &mut Writer,
        scope: ScopeId,
        idx: ReplicaIdx,
    ) {
        let held: Vec<Fingerprint> = writer
            .holdings
            .get(&idx)
            .map(|h| h.held.keys().copied().collect())
            .unwrap_or_default();
        self.drop_entries(shards, writer, scope, idx, held.into_iter(), None);
    }

    /// Removes `idx` as holder of `fps` in `scope` (only those held at
    /// `tier`, if given).
    fn drop_entries(
        &self,
        shards: &mut Shards<'_>,
        writer: &mut Writer,
        scope: ScopeId,
        idx: ReplicaIdx,
        fps: impl Iterator<Item = Fingerprint>,
        tier: Option<Tier>,
    ) {
        let Some(holdings) = writer.holdings.get_mut(&idx) else {
            return;
        };
        for fp in fps {
            match (holdings.held.get(&fp), tier) {
                (None, _) => continue,
                (Some(t), Some(want)) if *t != want => continue,
                _ => {}
            }
            holdings.held.remove(&fp);
            let removed = shards.with(self.shard_index(scope, fp), |shard| {
                let Some(entry) = shard.map.get_mut(&(scope, fp)) else {
                    return false;
                };
                let before = entry.holders.len();
                entry.holders.retain(|h| h.replica != idx);
                let removed = entry.holders.len() < before;
                if entry.holders.is_empty() {
                    shard.map.remove(&(scope, fp));
                }
                removed
            });
            if removed {
                self.entries.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    fn enforce_capacity(&self, writer: &mut Writer) {
        while self.len() > self.config.capacity_entries {
            let Some((scope, fp, idx, stamp)) = writer.order.pop_front() else {
                break;
            };
            let mut shard = self.shard(scope, fp).write();
            let Some(entry) = shard.map.get_mut(&(scope, fp)) else {
                continue;
            };
            let Some(pos) = entry
                .holders
                .iter()
                .position(|h| h.replica == idx && h.stamp == stamp)
            else {
                continue;
            };
            entry.holders.remove(pos);
            if entry.holders.is_empty() {
                shard.map.remove(&(scope, fp));
            }
            drop(shard);
            self.entries.fetch_sub(1, Ordering::Relaxed);
            self.capacity_evictions.fetch_add(1, Ordering::Relaxed);
            if let Some(h) = writer.holdings.get_mut(&idx) {
                h.held.remove(&fp);
            }
        }
        // Keep the queue from outgrowing the entries it describes.
        if writer.order.len() as u64 > self.len().saturating_mul(2) + 4096 {
            writer.order.retain(|(scope, fp, idx, stamp)| {
                self.shard(*scope, *fp)
                    .read()
                    .map
                    .get(&(*scope, *fp))
                    .is_some_and(|e| {
                        e.holders
                            .iter()
                            .any(|h| h.replica == *idx && h.stamp == *stamp)
                    })
            });
        }
    }

    // === lookup ===

    /// Scores every replica in `scope` by its longest run of consecutive
    /// blocks of `fingerprints` from the start. `candidates` restricts the
    /// answer to those replica ids; `fresh_since_ms` drops replicas not seen
    /// since then.
    pub fn lookup(
        &self,
        scope: &Scope,
        fingerprints: &[Fingerprint],
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
    ) -> LookupOutcome {
        // Held for the whole lookup: shared, and written only when replicas
        // join, leave or move.
        let reg = self.registry.read();
        let Some(&scope_id) = reg.scopes.get(scope) else {
            return LookupOutcome::UnknownScope;
        };
        let eligible = |idx: ReplicaIdx| eligible(&reg, idx, scope_id, candidates, fresh_since_ms);
        let Some((&first, rest)) = fingerprints.split_first() else {
            return LookupOutcome::NoEntry;
        };
        // (replica, coldest tier so far)
        let mut active: SmallVec<[(ReplicaIdx, Tier); 8]> = {
            let shard = self.shard(scope_id, first).read();
            match shard.map.get(&(scope_id, first)) {
                Some(entry) => entry
                    .holders
                    .iter()
                    .filter(|h| eligible(h.replica))
                    .map(|h| (h.replica, h.tier))
                    .collect(),
                None => SmallVec::new(),
            }
        };
        if active.is_empty() {
            return LookupOutcome::NoEntry;
        }
        let mut finished: Vec<(ReplicaIdx, u32, Tier)> = Vec::new();
        let mut matched = 1u32;
        for &fp in rest {
            let shard = self.shard(scope_id, fp).read();
            let entry = shard.map.get(&(scope_id, fp));
            let mut survivors: SmallVec<[(ReplicaIdx, Tier); 8]> = SmallVec::new();
            for &(idx, tier) in &active {
                match entry.and_then(|e| e.holders.iter().find(|h| h.replica == idx)) {
                    Some(h) => survivors.push((idx, tier.max(h.tier))),
                    None => finished.push((idx, matched, tier)),
                }
            }
            drop(shard);
            active = survivors;
            if active.is_empty() {
                break;
            }
            matched += 1;
        }
        finished.extend(active.iter().map(|&(idx, tier)| (idx, matched, tier)));
        ranked(&reg, scope_id, finished)
    }

    /// Replicas holding the block `fingerprint` (and so the whole prefix
    /// ending with it); matched blocks come from its recorded depth.
    pub fn lookup_prefix_hash(
        &self,
        scope: &Scope,
        fingerprint: Fingerprint,
        candidates: Option<&HashSet<String>>,
        fresh_since_ms: Option<i64>,
    ) -> LookupOutcome {
        let reg = self.registry.read();
        let Some(&scope_id) = reg.scopes.get(scope) else {
            return LookupOutcome::UnknownScope;
        };
        let matches: Vec<(ReplicaIdx, u32, Tier)> = {
            let shard = self.shard(scope_id, fingerprint).read();
            let Some(entry) = shard.map.get(&(scope_id, fingerprint)) else {
                return LookupOutcome::NoEntry;
            };
            entry
                .holders
                .iter()
                .filter(|h| eligible(&reg, h.replica, scope_id, candidates, fresh_since_ms))
                .map(|h| (h.replica, entry.depth.saturating_add(1), h.tier))
                .collect()
        };
        if matches.is_empty() {
            return LookupOutcome::NoEntry;
        }
        ranked(&reg, scope_id, matches)
    }

    // === snapshot ===

    /// Every replica with its counts, sorted by key.
    pub fn snapshot(&self) -> Vec<ReplicaSnapshot> {
        let writer = self.writer.lock();
        let reg = self.registry.read();
        let mut out: Vec<ReplicaSnapshot> = reg
            .replicas
            .iter()
            .enumerate()
            .filter_map(|(i, meta)| {
                let meta = meta.as_ref()?;
                let idx = ReplicaIdx::try_from(i).ok()?;
                let h = writer.holdings.get(&idx);
                Some(ReplicaSnapshot {
                    key: meta.key.clone(),
                    scope: reg.scope_list.get(meta.scope as usize)?.clone(),
                    address: meta.address.clone(),
                    prefix_count: h.map_or(0, |h| h.held.len() as u64),
                    t1_count: h.map_or(0, |h| {
                        h.held.values().filter(|t| **t == Tier::T1).count() as u64
                    }),
                    last_seen_ms: meta.last_seen_ms.load(Ordering::Relaxed),
                    last_event_ms: h.and_then(|h| h.last_event_ms),
                    block_size: h.map_or(0, |h| h.block_size),
                    tier2: h.and_then(|h| h.tier2),
                })
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}
