//! The key directory: where every cached key lives, and the L2 LRU order
//! per tenant that fleet eviction walks. Keys are held once, in the compact
//! table of [`table`]; everything the directory answers is materialized
//! from it on demand.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::LevelFilter;
use crate::StorageLevel;
use crate::events::{Batch, EventType};
use crate::key::{ObjectKey, SharedKey};
use crate::{FastMap, FastSet};

mod image;
mod table;
mod view;

pub use image::ImageError;
pub use table::Name;
use table::{Id, Links, List, Place, Table};
pub use view::{ByOwner, KeyView, PlacementRef};

/// Most keys a directory holds whatever its configured bound (none
/// included): record ids are `u32` and `u32::MAX` ends a list.
pub const MAX_KEYS: usize = u32::MAX as usize - 1;

fn serialize_name<S: serde::Serializer>(name: &Name, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(name)
}

/// One copy of a key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// Reporter (for a shared placement, the latest one).
    #[serde(serialize_with = "serialize_name")]
    pub instance_id: Name,
    /// Reporter's incarnation.
    pub incarnation: u64,
    /// StorageLevel.
    pub tier: StorageLevel,
    /// Backend.
    #[serde(serialize_with = "serialize_name")]
    pub backend: Name,
    /// Reported size.
    pub size_bytes: u64,
    /// In a pool several instances mount.
    pub shared: bool,
}

/// A key's state, as [`KeyDirectory::get`] materializes it.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyEntry {
    /// Copies, in the order they were first reported.
    pub placements: Vec<Placement>,
    /// Access events seen.
    pub access_count: u64,
    /// Emitter time of the last access (0 if none).
    pub last_access: f64,
}

/// Tokens bound to a chunk hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// Position of the chunk, -1 if unknown.
    pub token_offset: i64,
    /// The chunk's tokens.
    pub tokens: Vec<u32>,
}

/// Counts kept up to date as events apply, so stats never walk the index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TierTotals {
    /// Placements.
    pub count: u64,
    /// Reported bytes.
    pub bytes: u64,
}

/// Snapshot for `GET /directory/stats` and metrics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DirectoryStats {
    /// Keys with at least one placement.
    pub num_keys: u64,
    /// Placements.
    pub num_placements: u64,
    /// L1 keys per instance.
    pub l1_keys_by_instance: BTreeMap<String, u64>,
    /// L1 totals.
    pub l1: TierTotals,
    /// L2 totals.
    pub l2: TierTotals,
}

/// One key as a page of `GET /directory/keys` shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ListedKey {
    /// The key.
    pub key: ObjectKey,
    /// Placements matching the filters, in directory order.
    pub placements: Vec<Placement>,
    /// Tokens bound to the chunk hash.
    pub num_tokens: usize,
    /// Access count.
    pub access_count: u64,
}

/// Filters of `GET /directory/keys`.
#[derive(Clone, Debug, Default)]
pub struct KeyFilter<'a> {
    /// StorageLevel selector.
    pub tier: LevelFilter,
    /// Owner, empty for any.
    pub instance_id: &'a str,
    /// Backend, empty for any.
    pub backend: &'a str,
}

/// The directory.
#[derive(Clone, Debug, Default)]
pub struct KeyDirectory {
    table: Table,
    /// Every key, oldest first (paging, the bound, the checkpoint).
    order: List,
    /// L2 keys per tenant (salt id), least recently used first.
    lru: FastMap<u32, List>,
    bindings: FastMap<Vec<u8>, Binding>,
    l1_by_instance: FastMap<String, FastSet<Id>>,
    totals: [TierTotals; 2],
    /// Most keys held; a new key beyond it drops the oldest (`None`: no
    /// bound).
    max_keys: Option<usize>,
    /// Keys dropped to stay within `max_keys`.
    dropped_for_capacity: u64,
    /// Keys dropped for the bound since the last [`Self::take_dropped`],
    /// with the placements they had, so the other views forget them too.
    dropped: Vec<(SharedKey, Vec<Placement>)>,
}

fn tier_index(tier: StorageLevel) -> usize {
    match tier {
        StorageLevel::L1 => 0,
        StorageLevel::L2 => 1,
    }
}

impl KeyDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies an admitted batch. Returns, per entry of a store or delete,
    /// the bytes of the placement it replaced or removed (0 for none): the
    /// usage view rolls its totals up from these instead of keeping a copy of
    /// every placement. Keeps the L2 LRU too: an L2 store files a key at the
    /// recent end if it is not filed, an access moves a filed key there, and
    /// a key leaves when its last L2 placement does.
    pub fn apply(&mut self, batch: &Batch) -> Vec<u64> {
        if !self.l1_by_instance.contains_key(&batch.instance_id) {
            self.l1_by_instance
                .insert(batch.instance_id.clone(), FastSet::default());
        }
        let mut old_sizes = Vec::new();
        match batch.event_type {
            EventType::Store => {
                let instance = self.table.names.acquire_kept(&batch.instance_id);
                let backend = self.table.names.acquire_kept(&batch.backend);
                old_sizes.reserve_exact(batch.entries.len());
                for e in &batch.entries {
                    let old = self.store_place(
                        &e.key,
                        Place {
                            size_bytes: e.size_bytes,
                            incarnation: batch.incarnation,
                            instance,
                            backend,
                            tier: batch.tier,
                            shared: batch.shared,
                        },
                    );
                    old_sizes.push(old);
                    if !e.token_ids.is_empty() {
                        self.bindings.insert(
                            e.key.chunk_hash.clone(),
                            Binding {
                                token_offset: e.token_offset,
                                tokens: e.token_ids.clone(),
                            },
                        );
                    }
                }
            }
            EventType::Delete => {
                old_sizes.reserve_exact(batch.entries.len());
                let names = &self.table.names;
                // An instance never seen can still address a shared
                // placement (identified without its owner); a backend never
                // seen has no placement at all.
                let instance = names.get(&batch.instance_id).unwrap_or(table::NIL);
                let target = names.get(&batch.backend).map(|backend| Place {
                    size_bytes: 0,
                    incarnation: 0,
                    instance,
                    backend,
                    tier: batch.tier,
                    shared: batch.shared,
                });
                for e in &batch.entries {
                    let removed = match (target, self.table.find(&e.key)) {
                        (Some(t), Some(id)) => self.remove_places(id, |p| p.same_identity(&t)),
                        _ => 0,
                    };
                    old_sizes.push(removed);
                }
            }
            EventType::Access => {
                for e in &batch.entries {
                    if let Some(id) = self.table.find(&e.key) {
                        let r = self.table.rec_mut(id);
                        r.access_count += 1;
                        r.last_access = batch.ts;
                        if r.in_lru() {
                            let salt = r.salt;
                            let mut list = self.lru.get(&salt).copied().unwrap_or_default();
                            self.table.unlink(&mut list, Links::Lru, id);
                            self.table.push_back(&mut list, Links::Lru, id);
                            self.lru.insert(salt, list);
                        }
                    }
                }
            }
            EventType::Config => {}
        }
        old_sizes
    }

    /// Bounds the directory to `max` keys (`None`: unbounded), dropping the
    /// oldest keys at once if it holds more. The directory is a hint: a
    /// dropped key is only a lookup the coordinator cannot answer, and the
    /// instance still holds (and evicts) the chunk itself.
    /// Whatever `max` says, the bound is at most [`MAX_KEYS`] (a `u32`
    /// record id, one value kept as the list terminator).
    pub fn set_max_keys(&mut self, max: Option<usize>) {
        self.max_keys = max;
        let bound = self.key_bound();
        while self.table.len() > bound {
            self.drop_oldest();
        }
    }

    /// The bound in force: [`Self::set_max_keys`]'s, capped at [`MAX_KEYS`].
    pub fn key_bound(&self) -> usize {
        self.max_keys.map_or(MAX_KEYS, |m| m.min(MAX_KEYS))
    }

    /// The bound set by [`Self::set_max_keys`].
    pub fn max_keys(&self) -> Option<usize> {
        self.max_keys
    }

    /// Keys dropped to stay within the bound since start.
    pub fn dropped_for_capacity(&self) -> u64 {
        self.dropped_for_capacity
    }

    fn drop_oldest(&mut self) {
        let id = self.order.head;
        if id == table::NIL {
            return;
        }
        let key = SharedKey::new(self.table.key(id));
        let placements = self.placements_of(id);
        self.remove_places(id, |_| true);
        self.dropped_for_capacity += 1;
        self.dropped.push((key, placements));
    }

    /// Keys dropped for the bound since the last call, with the placements
    /// they had (the caller drops those bytes from the usage view, and the
    /// keys not present again from the controllers' state, so memory is
    /// bounded by the directory's bound everywhere). A key that came back
    /// since is listed too: its old placements' bytes still leave the usage
    /// view.
    pub fn take_dropped(&mut self) -> Vec<(SharedKey, Vec<Placement>)> {
        std::mem::take(&mut self.dropped)
    }

    /// Makes room for `additional` more keys at once (restore), so the
    /// tables are not rehashed as they grow.
    pub fn reserve(&mut self, additional: usize) {
        self.table.reserve(additional);
    }

    /// Makes room for `additional` more chunk hashes of `len` bytes.
    pub fn reserve_hashes(&mut self, len: usize, additional: usize) {
        self.table.hashes.reserve(len, additional);
    }

    /// The shared copy of an instance or backend name (placements built
    /// outside `apply`).
    pub fn intern(&mut self, name: &str) -> Name {
        let id = self.table.names.acquire_kept(name);
        self.table.names.name(id).clone()
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &ObjectKey) -> bool {
        self.table.find(key).is_some()
    }

    fn placement(&self, p: &Place) -> Placement {
        Placement {
            instance_id: self.table.names.name(p.instance).clone(),
            incarnation: p.incarnation,
            tier: p.tier,
            backend: self.table.names.name(p.backend).clone(),
            size_bytes: p.size_bytes,
            shared: p.shared,
        }
    }

    fn placements_of(&self, id: Id) -> Vec<Placement> {
        self.table
            .rec(id)
            .places()
            .map(|p| self.placement(p))
            .collect()
    }

    /// Inserts or replaces one placement (restore uses it too); returns the
    /// bytes of the placement it replaced, 0 if none.
    pub fn store(&mut self, key: &ObjectKey, placement: Placement) -> u64 {
        let place = Place {
            size_bytes: placement.size_bytes,
            incarnation: placement.incarnation,
            instance: self.table.names.acquire_kept(&placement.instance_id),
            backend: self.table.names.acquire_kept(&placement.backend),
            tier: placement.tier,
            shared: placement.shared,
        };
        self.store_place(key, place)
    }

    fn store_place(&mut self, key: &ObjectKey, place: Place) -> u64 {
        let t = &mut self.totals[tier_index(place.tier)];
        // Hashed once for the probe and, when absent, the insert.
        let h = self.table.key_hash(key);
        let (id, old) = match self.table.find_hashed(key, h) {
            Some(id) => {
                let r = self.table.rec_mut(id);
                if let Some(existing) = r.places_mut().find(|p| p.same_identity(&place)) {
                    let old = existing.size_bytes;
                    t.bytes = t.bytes.saturating_sub(old).saturating_add(place.size_bytes);
                    *existing = place;
                    (id, old)
                } else {
                    t.count += 1;
                    t.bytes = t.bytes.saturating_add(place.size_bytes);
                    r.push_place(place);
                    (id, 0)
                }
            }
            None => {
                let bound = self.key_bound().max(1);
                while self.table.len() >= bound {
                    self.drop_oldest();
                }
                let t = &mut self.totals[tier_index(place.tier)];
                t.count += 1;
                t.bytes = t.bytes.saturating_add(place.size_bytes);
                let id = self.table.insert_hashed(key, place, h);
                self.table.push_back(&mut self.order, Links::Order, id);
                (id, 0)
            }
        };
        if place.private_l1() {
            let name = self.table.names.name(place.instance);
            match self.l1_by_instance.get_mut(&**name) {
                Some(set) => set,
                None => self.l1_by_instance.entry(name.to_string()).or_default(),
            }
            .insert(id);
        }
        if place.tier == StorageLevel::L2 && !self.table.rec(id).in_lru() {
            let salt = self.table.rec(id).salt;
            let mut list = self.lru.get(&salt).copied().unwrap_or_default();
            self.table.push_back(&mut list, Links::Lru, id);
            self.lru.insert(salt, list);
            self.table.rec_mut(id).set_in_lru(true);
        }
        old
    }

    /// Removes the placements `matches` picks; returns their bytes. Drops
    /// the key with its last placement, and from the LRU with its last L2
    /// one.
    fn remove_places(&mut self, id: Id, matches: impl Fn(&Place) -> bool) -> u64 {
        let (removed, everything) = self.table.rec_mut(id).retain_places(|p| !matches(p));
        if removed.is_empty() {
            return 0;
        }
        let mut removed_bytes = 0;
        for p in &removed {
            let t = &mut self.totals[tier_index(p.tier)];
            t.count -= 1;
            t.bytes = t.bytes.saturating_sub(p.size_bytes);
            removed_bytes = u64::saturating_add(removed_bytes, p.size_bytes);
        }
        for p in removed.iter().filter(|p| p.private_l1()) {
            let still_there = !everything
                && self
                    .table
                    .rec(id)
                    .places()
                    .any(|q| q.private_l1() && q.instance == p.instance);
            if !still_there
                && let Some(set) = self
                    .l1_by_instance
                    .get_mut(&**self.table.names.name(p.instance))
            {
                set.remove(&id);
            }
        }
        let l2_left = !everything
            && self
                .table
                .rec(id)
                .places()
                .any(|p| p.tier == StorageLevel::L2);
        if !l2_left && self.table.rec(id).in_lru() {
            self.lru_unlink(id);
        }
        if everything {
            self.drop_key(id);
        }
        removed_bytes
    }

    fn lru_unlink(&mut self, id: Id) {
        let salt = self.table.rec(id).salt;
        if let Some(mut list) = self.lru.get(&salt).copied() {
            self.table.unlink(&mut list, Links::Lru, id);
            if list.len == 0 {
                self.lru.remove(&salt);
            } else {
                self.lru.insert(salt, list);
            }
        }
        self.table.rec_mut(id).set_in_lru(false);
    }

    fn drop_key(&mut self, id: Id) {
        self.table.unlink(&mut self.order, Links::Order, id);
        let hash = self.table.hash_of(id).to_vec();
        // The token binding leaves with the hash's last key.
        if self.table.remove(id) {
            self.bindings.remove(&hash);
        }
    }

    /// Drops every private L1 placement `instance_id` reported and its entry
    /// in the per-instance L1 index. L2 and shared placements stay.
    pub fn fence(&mut self, instance_id: &str) {
        let Some(ids) = self.l1_by_instance.remove(instance_id) else {
            return;
        };
        let Some(instance) = self.table.names.get(instance_id) else {
            return;
        };
        for id in ids {
            self.remove_places(id, |p| p.private_l1() && p.instance == instance);
        }
        // remove_places may not recreate it, but be explicit.
        self.l1_by_instance.remove(instance_id);
    }

    /// The private L1 placements of `instance_id`, as (salt, backend,
    /// bytes) — what a fence of it removes.
    pub fn l1_placements(&self, instance_id: &str) -> Vec<(String, Name, u64)> {
        let (Some(ids), Some(instance)) = (
            self.l1_by_instance.get(instance_id),
            self.table.names.get(instance_id),
        ) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for &id in ids {
            let salt = self.table.salt(id);
            for p in self.table.rec(id).places() {
                if p.private_l1() && p.instance == instance {
                    out.push((
                        salt.to_owned(),
                        self.table.names.name(p.backend).clone(),
                        p.size_bytes,
                    ));
                }
            }
        }
        out
    }

    /// A key's state, if present.
    pub fn get(&self, key: &ObjectKey) -> Option<KeyEntry> {
        let id = self.table.find(key)?;
        let r = self.table.rec(id);
        Some(KeyEntry {
            placements: self.placements_of(id),
            access_count: r.access_count,
            last_access: r.last_access,
        })
    }

    /// Tokens bound to a chunk hash (empty if none).
    pub fn tokens_for_hash(&self, chunk_hash: &[u8]) -> &[u32] {
        // Most fleets bind no tokens (keys form): skip hashing the chunk.
        if self.bindings.is_empty() {
            return &[];
        }
        self.bindings.get(chunk_hash).map_or(&[], |b| &b.tokens)
    }

    /// Binding of a chunk hash.
    pub fn binding(&self, chunk_hash: &[u8]) -> Option<&Binding> {
        self.bindings.get(chunk_hash)
    }

    /// Sets a binding directly (restore).
    pub fn bind(&mut self, chunk_hash: Vec<u8>, binding: Binding) {
        self.bindings.insert(chunk_hash, binding);
    }

    /// Restores access statistics of a present key.
    pub fn set_access(&mut self, key: &ObjectKey, access_count: u64, last_access: f64) {
        if let Some(id) = self.table.find(key) {
            let r = self.table.rec_mut(id);
            r.access_count = access_count;
            r.last_access = last_access;
        }
    }

    /// Marks an instance as seen (restore of an empty L1 index entry).
    pub fn touch_instance(&mut self, instance_id: &str) {
        self.l1_by_instance
            .entry(instance_id.to_owned())
            .or_default();
    }

    /// `key` followed by every present key that differs from it only in
    /// `object_group_id`, sorted by group.
    pub fn expand_groups(&self, key: &ObjectKey) -> Vec<ObjectKey> {
        let model = self.table.strings.get(&key.model_name);
        let salt = self.table.strings.get(&key.cache_salt);
        let (Some(model), Some(salt)) = (model, salt) else {
            return vec![key.clone()];
        };
        let mut others: Vec<Id> = self
            .table
            .same_hash(&key.chunk_hash)
            .filter(|&id| {
                let r = self.table.rec(id);
                r.object_group_id != key.object_group_id
                    && r.model == model
                    && r.kv_rank == key.kv_rank
                    && r.salt == salt
            })
            .collect();
        others.sort_by_key(|&id| self.table.rec(id).object_group_id);
        std::iter::once(key.clone())
            .chain(others.into_iter().map(|id| self.table.key(id)))
            .collect()
    }

    /// Whether any L2 placement of `key` is left.
    pub fn has_l2(&self, key: &ObjectKey) -> bool {
        self.table.find(key).is_some_and(|id| {
            self.table
                .rec(id)
                .places()
                .any(|p| p.tier == StorageLevel::L2)
        })
    }

    /// A page of keys with at least one placement matching `filter`, and the
    /// total of such keys.
    pub fn list(
        &self,
        filter: &KeyFilter<'_>,
        offset: usize,
        limit: usize,
    ) -> (u64, Vec<ListedKey>) {
        let names = &self.table.names;
        // A name never interned matches nothing.
        let instance = (!filter.instance_id.is_empty()).then(|| names.get(filter.instance_id));
        let backend = (!filter.backend.is_empty()).then(|| names.get(filter.backend));
        if matches!(instance, Some(None)) || matches!(backend, Some(None)) {
            return (0, Vec::new());
        }
        let (instance, backend) = (instance.flatten(), backend.flatten());
        let mut total = 0u64;
        let mut page = Vec::new();
        for id in self.table.walk(&self.order, Links::Order) {
            let r = self.table.rec(id);
            let mut matching = r.places().filter(|p| {
                filter.tier.matches(p.tier)
                    && instance.is_none_or(|i| p.instance == i)
                    && backend.is_none_or(|b| p.backend == b)
            });
            let Some(first) = matching.next() else {
                continue;
            };
            let index = usize::try_from(total).unwrap_or(usize::MAX);
            total += 1;
            if index >= offset && page.len() < limit {
                let key = self.table.key(id);
                page.push(ListedKey {
                    num_tokens: self.tokens_for_hash(&key.chunk_hash).len(),
                    key,
                    placements: std::iter::once(first)
                        .chain(matching)
                        .map(|p| self.placement(p))
                        .collect(),
                    access_count: r.access_count,
                });
            }
        }
        (total, page)
    }

    /// Every key with its state, in insertion order (checkpoint).
    pub fn iter(&self) -> impl Iterator<Item = (ObjectKey, KeyEntry)> + '_ {
        self.table.walk(&self.order, Links::Order).map(|id| {
            let r = self.table.rec(id);
            (
                self.table.key(id),
                KeyEntry {
                    placements: self.placements_of(id),
                    access_count: r.access_count,
                    last_access: r.last_access,
                },
            )
        })
    }

    /// Every placement with its key's salt, in insertion order (the usage
    /// rollups), without materializing the keys.
    pub fn salted_placements(&self) -> impl Iterator<Item = (&str, Placement)> + '_ {
        self.table
            .walk(&self.order, Links::Order)
            .flat_map(move |id| {
                let salt = self.table.salt(id);
                self.table
                    .rec(id)
                    .places()
                    .map(move |p| (salt, self.placement(p)))
            })
    }

    /// The bytes of every placement summed per (salt, tier, owner,
    /// backend), the owner `""` for a shared placement: the usage view's
    /// rollups (restore), summed by ids before any name is looked at.
    pub fn placement_rollups(&self) -> Vec<(&str, StorageLevel, &str, &str, u64)> {
        let mut sums: FastMap<(u32, StorageLevel, Id, u32), u64> = FastMap::default();
        for r in self
            .table
            .walk(&self.order, Links::Order)
            .map(|id| self.table.rec(id))
        {
            for p in r.places() {
                let owner = if p.shared { table::NIL } else { p.instance };
                let sum = sums.entry((r.salt, p.tier, owner, p.backend)).or_default();
                *sum = sum.saturating_add(p.size_bytes);
            }
        }
        sums.into_iter()
            .map(|((salt, tier, owner, backend), bytes)| {
                let owner = if owner == table::NIL {
                    ""
                } else {
                    &**self.table.names.name(owner)
                };
                (
                    &**self.table.strings.name(salt),
                    tier,
                    owner,
                    &**self.table.names.name(backend),
                    bytes,
                )
            })
            .collect()
    }

    /// Every token binding (checkpoint).
    pub fn bindings(&self) -> impl Iterator<Item = (&Vec<u8>, &Binding)> {
        self.bindings.iter()
    }

    /// Instances in the L1 index with their L1 keys (checkpoint).
    pub fn l1_index(&self) -> impl Iterator<Item = (&String, Vec<ObjectKey>)> {
        self.l1_by_instance
            .iter()
            .map(|(id, set)| (id, set.iter().map(|&k| self.table.key(k)).collect()))
    }

    /// Counts for stats and metrics; cheap (no walk of the keys).
    pub fn stats(&self) -> DirectoryStats {
        DirectoryStats {
            num_keys: self.table.len() as u64,
            num_placements: self.totals[0].count + self.totals[1].count,
            l1_keys_by_instance: self
                .l1_by_instance
                .iter()
                .map(|(id, keys)| (id.clone(), keys.len() as u64))
                .collect(),
            l1: self.totals[0],
            l2: self.totals[1],
        }
    }

    /// Totals of one tier.
    pub fn totals(&self, tier: StorageLevel) -> TierTotals {
        self.totals[tier_index(tier)]
    }

    /// Keys present.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether no key is present.
    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }

    // === the L2 LRU ===

    /// Keys in the LRU overall.
    pub fn lru_len(&self) -> usize {
        self.lru.values().map(|l| l.len).sum()
    }

    /// Keys in one tenant's LRU.
    pub fn lru_bucket_len(&self, salt: &str) -> usize {
        self.table
            .strings
            .get(salt)
            .and_then(|s| self.lru.get(&s))
            .map_or(0, |l| l.len)
    }

    /// Tenants with LRU keys, sorted, with how many.
    pub fn lru_salts(&self) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = self
            .lru
            .iter()
            .map(|(&s, l)| (self.table.strings.name(s).to_string(), l.len))
            .collect();
        out.sort();
        out
    }

    /// One tenant's LRU keys, least recently used first.
    pub fn lru_oldest(&self, salt: &str) -> impl Iterator<Item = ObjectKey> + '_ {
        let list = self
            .table
            .strings
            .get(salt)
            .and_then(|s| self.lru.get(&s))
            .copied()
            .unwrap_or_default();
        let mut cur = list.head;
        std::iter::from_fn(move || {
            (cur != table::NIL).then(|| {
                let id = cur;
                cur = self.table.rec(id).lru_next;
                self.table.key(id)
            })
        })
    }

    /// Moves a key filed in the LRU to its recent end (restoring a saved
    /// order: touch its keys oldest first). A key not filed is ignored.
    pub fn lru_touch(&mut self, key: &ObjectKey) {
        if let Some(id) = self.table.find(key)
            && self.table.rec(id).in_lru()
        {
            let salt = self.table.rec(id).salt;
            let mut list = self.lru.get(&salt).copied().unwrap_or_default();
            self.table.unlink(&mut list, Links::Lru, id);
            self.table.push_back(&mut list, Links::Lru, id);
            self.lru.insert(salt, list);
        }
    }
}

#[cfg(test)]
mod tests;
