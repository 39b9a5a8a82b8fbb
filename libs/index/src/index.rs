//! The index itself.
//!
//! Layout: blocks live in the [`crate::store`] — 14-byte records in the
//! order engines reported them (so a prompt's blocks are mostly adjacent),
//! found through lock-free cuckoo key tables of 6-byte slots — keyed by the
//! fingerprint mixed with the scope id, each holding its depth in the
//! prompt (saturating at 32,766) and its holders
//! (replica, tier, store epoch). Writers (ingest) are serialised by one
//! mutex that also owns per-replica counters and the eviction clock; a
//! write holds one page lock at a time for a few records (the key tables
//! take no lock: see [`crate::keys`]), so a lookup waits for at most one
//! short write. Readers never take the writer mutex.
//!
//! There is deliberately no per-replica set of held blocks and no per-entry
//! eviction queue — they cost more memory than the entries themselves.
//! Instead:
//! * eviction works in store *epochs*: every entry carries the epoch it was
//!   last stored in, and the capacity bound removes whole oldest epochs in
//!   one pass over the pages that hold them (an epoch is 1/16 of capacity;
//!   a pass evicts at least 1/8 of capacity, so passes stay rare); the
//!   epochs are a ring of 1,024, so an entry not stored again for a whole
//!   turn (64 capacities of stores) is met again when the clock comes
//!   round to its epoch: while the index has room for another epoch it
//!   stays, counted as stored in the epoch now starting (its holder
//!   already carries it, so nothing is written), and within an epoch of
//!   capacity it is retired, alone with the rest of that epoch's
//!   leftovers (counted apart: [`Index::clock_evictions`]);
//! * dropping a replica's entries (drain, scope move, resync, clear) is a
//!   pass over the pages. A resync first builds the new state under a
//!   fresh, not yet visible replica slot and then swaps the slots in the
//!   registry, so lookups see the old state or the new, never a mix.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::arena::{EPOCHS, MAX_REPLICAS, Stored};
pub(crate) use crate::registry::{FastMap, Members, Registry, ReplicaIdx, ReplicaMeta, ScopeId};
use crate::store::{Block, Store};
use crate::types::{
    Change, ContentError, Fingerprint, HashScheme, IndexMemory, ReplicaKey, ReplicaSnapshot, Scope,
};

#[cfg(test)]
mod capacity_tests;
mod changes;
#[cfg(test)]
mod clock_tests;
mod evict;
#[cfg(test)]
mod test_support;

/// Capacity is clamped here so record ids (32 bits; dead records are at
/// most a quarter of all, plus the page being filled) can never run out.
const MAX_CAPACITY: u64 = 1 << 30;

/// Keys per key table the store is sized for at full capacity (between
/// half and all of this, as table counts are powers of two). A bucket is
/// picked by the top bits of a key's 16-bit tag, so the keys of one bucket
/// differ only in the rest: at this size a probe meets a foreign key with
/// the same tag 3–6% of the time (one wasted record read), against about a
/// quarter at 8,192. Smaller tables gained no more speed and cost memory
/// (their shares swing more, so each needs more slack).
const KEYS_PER_TABLE: u64 = 2048;

/// Key tables per shard for an index of `capacity` entries over `shards`.
fn tables_per_shard(capacity: u64, shards: usize) -> usize {
    let tables = capacity.div_ceil(KEYS_PER_TABLE) / shards as u64;
    usize::try_from(tables.max(1).next_power_of_two()).unwrap_or(1)
}

/// Keys one table is sized for: its share of the capacity (see
/// [`crate::keys`] for the slack it is given).
fn table_keys(capacity: u64, shards: usize, tables: usize) -> usize {
    let share = capacity.div_ceil((shards * tables) as u64);
    usize::try_from(share).unwrap_or(usize::MAX)
}

/// The table key of a block: scopes get disjoint key spaces (a replica's
/// scope is also checked on every answer, so a cross-scope key collision
/// could never leak a replica).
pub(crate) fn entry_key(scope: ScopeId, fp: Fingerprint) -> u64 {
    salted_key(scope_salt(scope), fp)
}

/// What [`entry_key`] mixes into each fingerprint of `scope` (worked out
/// once a walk, not once a block).
#[inline]
pub(crate) fn scope_salt(scope: ScopeId) -> u64 {
    u64::from(scope).wrapping_mul(0xd6e8_feb8_6659_fd93)
}

/// [`entry_key`] of `fp` in the scope whose [`scope_salt`] is `salt`.
#[inline(always)]
pub(crate) fn salted_key(salt: u64, fp: Fingerprint) -> u64 {
    fp.0 ^ salt
}

/// Advances a replica's last-seen time. Only the writer (whose lock the
/// caller holds) advances it, so a load and a store do: no atomic
/// read-modify-write per event.
fn seen(meta: &ReplicaMeta, now_ms: i64) {
    if meta.last_seen_ms.load(Ordering::Relaxed) < now_ms {
        meta.last_seen_ms.store(now_ms, Ordering::Relaxed);
    }
}

/// Writer-side facts about a replica slot.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    entries: u64,
    t1: u64,
    last_event_ms: Option<i64>,
    block_size: u32,
    tier2: Option<(u64, u64)>,
}

#[derive(Debug)]
struct Writer {
    /// By replica slot.
    counts: Vec<Counts>,
    /// Slots ever allocated (the registry's length).
    slots: u32,
    free_slots: Vec<ReplicaIdx>,
    /// Eviction clock: the current epoch, stores into it so far, and live
    /// entries per epoch.
    epoch: u32,
    epoch_fill: u64,
    epoch_size: u64,
    epoch_entries: Vec<u64>,
    /// The replicas the last events came from, as resolved then (at most
    /// [`RECENT`], replaced in turn): engines report in bursts, and
    /// comparing names is cheaper than hashing them into the registry's
    /// maps under its lock. Cleared whenever the registry changes (only
    /// the writer changes it).
    recent: Vec<(ReplicaIdx, Arc<ReplicaMeta>)>,
    recent_next: usize,
    /// The registry's scope list, by id, as the writer made it (read to
    /// compare a scope's names without the registry's lock).
    scope_names: Vec<Scope>,
    /// Working lists of one stored chain, kept so that an event allocates
    /// none.
    scratch: ChainScratch,
}

/// The blocks of a chain and what storing each did.
#[derive(Debug, Default)]
struct ChainScratch {
    blocks: Vec<Block>,
    results: Vec<Result<Stored, u32>>,
}

/// Chains longer than this do not leave their working lists behind (a
/// resync's chunk would keep tens of bytes per block of it).
const SCRATCH_KEEP: usize = 256;

impl ChainScratch {
    fn heap_bytes(&self) -> usize {
        self.blocks.capacity() * size_of::<Block>()
            + self.results.capacity() * size_of::<Result<Stored, u32>>()
    }

    /// Keeps the lists for the next chain unless they grew large.
    fn keep(blocks: Vec<Block>, results: Vec<Result<Stored, u32>>) -> Self {
        if blocks.capacity() > SCRATCH_KEEP {
            return Self::default();
        }
        Self { blocks, results }
    }
}

/// Replicas [`Writer::recent`] keeps resolved.
const RECENT: usize = 8;

impl Writer {
    /// The recently resolved replica with these names: its slot and facts.
    fn recent(
        &self,
        key: &ReplicaKey,
        scope: &Scope,
        address: &str,
    ) -> Option<(ReplicaIdx, &ReplicaMeta)> {
        self.recent
            .iter()
            .find(|(_, m)| {
                // Rank first: it is what differs most often.
                m.key.dp_rank == key.dp_rank
                    && m.key == *key
                    && m.address == address
                    && self.scope_names.get(m.scope as usize) == Some(scope)
            })
            .map(|(idx, m)| (*idx, &**m))
    }

    /// Keeps `meta`, in slot `idx`, resolved.
    fn remember(&mut self, idx: ReplicaIdx, meta: &Arc<ReplicaMeta>) {
        let entry = (idx, Arc::clone(meta));
        if self.recent.len() < RECENT {
            self.recent.push(entry);
        } else {
            self.recent[self.recent_next] = entry;
            self.recent_next = (self.recent_next + 1) % RECENT;
        }
    }

    /// Forgets what was resolved (the registry changed).
    fn forget_resolved(&mut self) {
        self.recent.clear();
        self.recent_next = 0;
    }
}

impl Writer {
    fn heap_bytes(&self) -> usize {
        self.counts.capacity() * size_of::<Counts>()
            + self.free_slots.capacity() * size_of::<ReplicaIdx>()
            + self.epoch_entries.capacity() * size_of::<u64>()
            + self.scratch.heap_bytes()
            + self.recent.capacity() * size_of::<(ReplicaIdx, Arc<ReplicaMeta>)>()
            + self.scope_names.capacity() * size_of::<Scope>()
            + self
                .scope_names
                .iter()
                .map(|s| s.tenant.capacity() + s.model.capacity() + s.adapter.capacity())
                .sum::<usize>()
    }

    fn counts(&mut self, idx: ReplicaIdx) -> &mut Counts {
        let i = idx as usize;
        if self.counts.len() <= i {
            self.counts.resize(i + 1, Counts::default());
        }
        &mut self.counts[i]
    }
}

/// Sizing of the index.
#[derive(Clone, Copy, Debug)]
pub struct IndexConfig {
    /// Most (replica, block) entries held; beyond it the least recently
    /// stored are evicted.
    pub capacity_entries: u64,
    /// Number of key-table lock shards (rounded up to a power of two).
    pub shards: usize,
    /// Most replicas (tenant, replica id, data-parallel rank) known at once
    /// (at most [`MAX_REPLICA_SLOTS`]); a batch of one more is refused
    /// with [`ContentError::TooManyReplicas`] until one is forgotten.
    pub max_replicas: u32,
    /// Most scopes (tenant, model, hash scheme, adapter) ever named; they
    /// are kept for good, so one more is refused with
    /// [`ContentError::TooManyScopes`].
    pub max_scopes: u32,
}

/// Most replica slots the index can name (its packed holders' bits).
pub const MAX_REPLICA_SLOTS: u32 = MAX_REPLICAS;

/// [`IndexConfig::max_replicas`] by default: 16,384 engines of 16 ranks.
pub const DEFAULT_MAX_REPLICAS: u32 = 1 << 18;

/// [`IndexConfig::max_scopes`] by default.
pub const DEFAULT_MAX_SCOPES: u32 = 1 << 16;

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            capacity_entries: 10_000_000,
            shards: 32,
            max_replicas: DEFAULT_MAX_REPLICAS,
            max_scopes: DEFAULT_MAX_SCOPES,
        }
    }
}

/// The prefix index.
#[derive(Debug)]
pub struct Index {
    config: IndexConfig,
    pub(crate) registry: RwLock<Registry>,
    pub(crate) store: Store,
    writer: Mutex<Writer>,
    entries: AtomicU64,
    capacity_evictions: AtomicU64,
    /// Entries the store clock retired (not stored again for a turn, met
    /// near capacity).
    clock_evictions: AtomicU64,
    /// Chains not (wholly) stored for want of record space.
    out_of_space: AtomicU64,
    /// Scope ids handed out (the registry's scope list's length; ids are
    /// never reused), readable without the registry's lock.
    pub(crate) scopes_known: AtomicU32,
}

impl Index {
    /// An empty index.
    pub fn new(mut config: IndexConfig) -> Self {
        let n = config.shards.clamp(1, 1024).next_power_of_two();
        config.capacity_entries = config.capacity_entries.min(MAX_CAPACITY);
        // One slot stays free beyond the bound for a resync's fresh state.
        config.max_replicas = config.max_replicas.clamp(1, MAX_REPLICAS - 1);
        config.max_scopes = config.max_scopes.max(1);
        let tables = tables_per_shard(config.capacity_entries, n);
        Self {
            config,
            registry: RwLock::default(),
            store: Store::with_records(
                n,
                tables,
                table_keys(config.capacity_entries, n, tables),
                usize::try_from(config.capacity_entries).unwrap_or(usize::MAX),
            ),
            writer: Mutex::new(Writer {
                counts: Vec::new(),
                slots: 0,
                free_slots: Vec::new(),
                epoch: 0,
                epoch_fill: 0,
                epoch_size: (config.capacity_entries / 16).max(1),
                epoch_entries: vec![0; EPOCHS as usize],
                recent: Vec::new(),
                recent_next: 0,
                scope_names: Vec::new(),
                scratch: ChainScratch::default(),
            }),
            entries: AtomicU64::new(0),
            capacity_evictions: AtomicU64::new(0),
            clock_evictions: AtomicU64::new(0),
            out_of_space: AtomicU64::new(0),
            scopes_known: AtomicU32::new(0),
        }
    }

    /// The replica and scope bounds it was built with, as clamped.
    pub fn bounds(&self) -> (u32, u32) {
        (self.config.max_replicas, self.config.max_scopes)
    }

    /// Replicas known now and scopes kept, against [`Index::bounds`].
    /// Takes the registry's read lock: for scrapes.
    pub fn known(&self) -> (u64, u64) {
        let replicas = self.registry.read().by_key.len() as u64;
        (
            replicas,
            u64::from(self.scopes_known.load(Ordering::Acquire)),
        )
    }

    /// Resident (replica, block) entries.
    pub fn len(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    /// Whether the index holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records moved by compaction (of pages under half live), since start.
    pub fn records_relocated(&self) -> u64 {
        self.store.relocations()
    }

    /// Heap bytes held by the index, counted from what its structures
    /// allocated (exact for records and key tables; hash maps estimated
    /// from their capacity). Walks every page and key shard, taking one
    /// lock at a time: meant for metric scrapes, not per request.
    pub fn memory(&self) -> IndexMemory {
        let (records, key_tables) = self.store.heap_bytes();
        // One lock at a time: the writer takes its mutex before the
        // registry, so holding the registry while waiting for the writer
        // could deadlock.
        let registry = self.registry.read().heap_bytes();
        let replicas = registry + self.writer.lock().heap_bytes();
        IndexMemory {
            records: records as u64,
            key_tables: key_tables as u64,
            replicas: replicas as u64,
        }
    }

    /// Rebuilds of the first-block filter since start: each drops the
    /// bits of first blocks no longer held, in one pass over the record
    /// pages while stores wait (see `store/firsts.rs`).
    pub fn first_filter_rebuilds(&self) -> u64 {
        self.store.firsts_rebuilds()
    }

    /// Heap bytes of the first-block filter: derived from the record
    /// capacity at start (half a bit per record, 512 B to 1 MiB), not a
    /// limit of its own; counted in [`IndexMemory::key_tables`] too.
    pub fn first_filter_bytes(&self) -> u64 {
        self.store.firsts_bytes() as u64
    }

    /// Entries evicted to stay within capacity, since start.
    pub fn capacity_evictions(&self) -> u64 {
        self.capacity_evictions.load(Ordering::Relaxed)
    }

    /// Entries retired by the store clock since start: not stored again
    /// within 64 capacities' worth of stores (1,024 epochs of 1/16 of
    /// capacity) and met by the clock while the index was within an epoch
    /// (1/16) of capacity; below that they are kept. Not counted in
    /// [`Index::capacity_evictions`].
    pub fn clock_evictions(&self) -> u64 {
        self.clock_evictions.load(Ordering::Relaxed)
    }

    /// Chains left unstored, from the run that failed onward, because the
    /// record space was exhausted ([`ContentError::OutOfSpace`]), since start.
    pub fn chains_out_of_space(&self) -> u64 {
        self.out_of_space.load(Ordering::Relaxed)
    }

    /// Keys that found no room in their key-table buckets now: they sit in
    /// per-table overflow slots a search reads too (a few per table at
    /// most; many means the tables are sized too small or keys share tags).
    /// Walks every table: for scrapes.
    pub fn key_table_overflow_keys(&self) -> u64 {
        self.store.overflowed_keys() as u64
    }

    /// The block size learned for a scope from its events.
    pub fn block_size(&self, scope: &Scope) -> Option<u32> {
        let reg = self.registry.read();
        let id = reg.scopes.get(scope)?;
        Some(reg.block_size(*id)).filter(|&b| b > 0)
    }

    // === replicas ===

    /// Registers (or refreshes) a replica; returns whether it is new or
    /// changed scope (in which case its previous holdings were dropped).
    pub fn touch(&self, key: &ReplicaKey, scope: &Scope, address: &str, now_ms: i64) -> bool {
        let mut writer = self.writer.lock();
        self.touch_locked(&mut writer, key, scope, address, now_ms)
            .is_ok_and(|(_, _, changed)| changed)
    }

    fn new_slot(&self, writer: &mut Writer, reg: &mut Registry) -> Option<ReplicaIdx> {
        if let Some(i) = writer.free_slots.pop() {
            *writer.counts(i) = Counts::default();
            return Some(i);
        }
        if writer.slots >= MAX_REPLICAS {
            return None;
        }
        let i = writer.slots;
        writer.slots += 1;
        reg.replicas.push(None);
        *writer.counts(i) = Counts::default();
        Some(i)
    }

    /// The replica's (slot, scope id, whether it is new or moved scope);
    /// the bound reached when it is a replica or scope too many (nothing
    /// is kept of it then).
    fn touch_locked(
        &self,
        writer: &mut Writer,
        key: &ReplicaKey,
        scope: &Scope,
        address: &str,
        now_ms: i64,
    ) -> Result<(ReplicaIdx, ScopeId, bool), ContentError> {
        if let Some((idx, meta)) = writer.recent(key, scope, address) {
            seen(meta, now_ms);
            return Ok((idx, meta.scope, false));
        }
        {
            let reg = self.registry.read();
            if let Some(&idx) = reg.by_key.get(key)
                && let Some(Some(meta)) = reg.replicas.get(idx as usize)
                && reg.scopes.get(scope) == Some(&meta.scope)
                && meta.address == address
            {
                seen(meta, now_ms);
                writer.remember(idx, meta);
                return Ok((idx, meta.scope, false));
            }
        }
        writer.forget_resolved();
        let mut reg = self.registry.write();
        let existing = reg.by_key.get(key).copied();
        if existing.is_none() && reg.by_key.len() >= self.config.max_replicas as usize {
            return Err(ContentError::TooManyReplicas);
        }
        let scope_id = match reg.scopes.get(scope) {
            Some(&id) => id,
            None if reg.scope_list.len() >= self.config.max_scopes as usize => {
                return Err(ContentError::TooManyScopes);
            }
            None => {
                let id = ScopeId::try_from(reg.scope_list.len()).unwrap_or(ScopeId::MAX);
                reg.scopes.insert(scope.clone(), id);
                reg.scope_list.push(scope.clone());
                writer.scope_names.push(scope.clone());
                self.scopes_known.store(
                    u32::try_from(reg.scope_list.len()).unwrap_or(u32::MAX),
                    Ordering::Release,
                );
                id
            }
        };
        let old_scope = existing.and_then(|i| reg.replicas[i as usize].as_ref().map(|m| m.scope));
        let idx = match existing {
            Some(idx) => idx,
            None => {
                let idx = self
                    .new_slot(writer, &mut reg)
                    .ok_or(ContentError::TooManyReplicas)?;
                reg.by_key.insert(key.clone(), idx);
                idx
            }
        };
        let changed_scope = old_scope != Some(scope_id);
        reg.set_replica(
            idx,
            Some(Arc::new(ReplicaMeta::new(
                key.clone(),
                scope_id,
                address.to_owned(),
                now_ms,
            ))),
        );
        drop(reg);
        if changed_scope && old_scope.is_some() {
            // Its entries were filed under the old scope.
            self.drop_where(writer, idx, None);
            *writer.counts(idx) = Counts::default();
        }
        Ok((idx, scope_id, changed_scope))
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
        let (idx, scope_id, _) = match self.touch_locked(&mut writer, key, scope, address, now_ms) {
            Ok(slot) => slot,
            Err(full) => return vec![full],
        };
        let errors = self.apply_locked(&mut writer, idx, scope_id, changes, now_ms);
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
        let (old, scope_id, _) = match self.touch_locked(&mut writer, key, scope, address, now_ms) {
            Ok(slot) => slot,
            Err(full) => return vec![full],
        };
        if writer.counts(old).entries == 0 {
            // Nothing to hide: build in place.
            let errors = self.apply_locked(&mut writer, old, scope_id, changes, now_ms);
            self.enforce_capacity(&mut writer);
            return errors;
        }
        // Build the new state under a slot lookups cannot see yet.
        writer.forget_resolved();
        let Some(fresh) = self.new_slot(&mut writer, &mut self.registry.write()) else {
            return vec![ContentError::TooManyReplicas];
        };
        let carried = *writer.counts(old);
        writer.counts(fresh).tier2 = carried.tier2;
        let errors = self.apply_locked(&mut writer, fresh, scope_id, changes, now_ms);
        {
            let mut reg = self.registry.write();
            let meta = reg.replicas[old as usize].clone();
            reg.set_replica(old, None);
            reg.set_replica(fresh, meta);
            reg.by_key.insert(key.clone(), fresh);
        }
        // The old slot is invisible now; purge it and free it.
        self.drop_where(&mut writer, old, None);
        *writer.counts(old) = Counts::default();
        writer.free_slots.push(old);
        self.enforce_capacity(&mut writer);
        errors
    }

    /// Forgets a replica (drained or gone).
    pub fn remove_replica(&self, key: &ReplicaKey) -> bool {
        let mut writer = self.writer.lock();
        writer.forget_resolved();
        let idx = {
            let mut reg = self.registry.write();
            let Some(idx) = reg.by_key.remove(key) else {
                return false;
            };
            reg.set_replica(idx, None);
            idx
        };
        self.drop_where(&mut writer, idx, None);
        *writer.counts(idx) = Counts::default();
        writer.free_slots.push(idx);
        self.store.compact();
        true
    }

    /// The replicas of `scope` a lookup may answer (in `candidates` when
    /// given, seen since `fresh_since_ms` when given), with their serving
    /// addresses, in registry order.
    pub fn replicas_in(
        &self,
        scope: &Scope,
        candidates: Option<&std::collections::HashSet<String>>,
        fresh_since_ms: Option<i64>,
    ) -> Vec<(ReplicaKey, String)> {
        let Some(members) = self.members(scope) else {
            return Vec::new();
        };
        members
            .iter()
            .filter(|m| m.answers(candidates, fresh_since_ms))
            .map(|m| (m.key.clone(), m.address.clone()))
            .collect()
    }

    /// The visible replicas of `scope`, in registry order, without copying
    /// them.
    pub(crate) fn members(&self, scope: &Scope) -> Option<Members> {
        let reg = self.registry.read();
        let scope_id = reg.scopes.get(scope)?;
        reg.members.get(scope_id).cloned()
    }

    /// The scope of the replica serving at `address` in `tenant` under
    /// `hash_scheme`, if the index has heard from one.
    pub fn scope_at(&self, tenant: &str, hash_scheme: HashScheme, address: &str) -> Option<Scope> {
        let reg = self.registry.read();
        reg.replicas.iter().flatten().find_map(|m| {
            let scope = reg.scope_list.get(m.scope as usize)?;
            (m.address == address && scope.tenant == tenant && scope.hash_scheme == hash_scheme)
                .then(|| scope.clone())
        })
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
        if let Some(idx) = self.registry.read().by_key.get(key).copied() {
            writer.counts(idx).tier2 = tier2;
        }
    }

    // === dump ===

    /// Holds every write off (for a consistent [`crate::dump::Dump`]).
    pub(crate) fn hold_writes(&self) -> WritesHeld<'_> {
        WritesHeld(self.writer.lock())
    }

    // === snapshot ===

    /// Every replica with its counts, sorted by key.
    pub fn snapshot(&self) -> Vec<ReplicaSnapshot> {
        let mut writer = self.writer.lock();
        let reg = self.registry.read();
        let mut out: Vec<ReplicaSnapshot> = reg
            .replicas
            .iter()
            .enumerate()
            .filter_map(|(i, meta)| {
                let meta = meta.as_ref()?;
                let c = *writer.counts(ReplicaIdx::try_from(i).ok()?);
                Some(ReplicaSnapshot {
                    key: meta.key.clone(),
                    scope: reg.scope_list.get(meta.scope as usize)?.clone(),
                    address: meta.address.clone(),
                    prefix_count: c.entries,
                    t1_count: c.t1,
                    last_seen_ms: meta.last_seen_ms.load(Ordering::Relaxed),
                    last_event_ms: c.last_event_ms,
                    block_size: c.block_size,
                    tier2: c.tier2,
                })
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

/// The writer lock, held while a dump reads the store.
pub(crate) struct WritesHeld<'a>(parking_lot::MutexGuard<'a, Writer>);

impl WritesHeld<'_> {
    /// Slot `idx`'s block size and tier-2 counters.
    pub(crate) fn slot_facts(&self, idx: usize) -> (u32, Option<(u64, u64)>) {
        self.0
            .counts
            .get(idx)
            .map_or((0, None), |c| (c.block_size, c.tier2))
    }
}
