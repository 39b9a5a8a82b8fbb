//! The key directory: where every cached key lives.

use std::collections::{BTreeMap, HashSet};
use std::hash::{Hash, Hasher};

use serde::Serialize;

use crate::LevelFilter;
use crate::StorageLevel;
use crate::events::{Batch, EventType};
use crate::key::{ObjectKey, SharedKey};
use crate::{FastMap, FastSet};

/// An instance id or backend name, interned: every placement of one
/// reporter shares one allocation.
pub type Name = std::sync::Arc<str>;

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

impl Placement {
    /// Whether `self` is the placement an event for (instance, tier, backend,
    /// shared) addresses. A shared placement is identified without its owner.
    fn same_identity(
        &self,
        instance_id: &str,
        tier: StorageLevel,
        backend: &str,
        shared: bool,
    ) -> bool {
        self.tier == tier
            && *self.backend == *backend
            && self.shared == shared
            && (shared || *self.instance_id == *instance_id)
    }
}

/// Per-key state.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyEntry {
    /// Insertion order (for paging).
    order: u64,
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

/// A key filed by its chunk hash alone (hash and equality see only
/// `chunk_hash`), so the keys of one chunk (other groups, other ranks) meet
/// in one slot without a second copy of the hash.
#[derive(Clone, Debug)]
struct ByHash(SharedKey);

impl Hash for ByHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As `[u8]` hashes, so lookups by `&[u8]` find it.
        self.0.chunk_hash.as_slice().hash(state);
    }
}

impl PartialEq for ByHash {
    fn eq(&self, other: &Self) -> bool {
        self.0.chunk_hash == other.0.chunk_hash
    }
}

impl Eq for ByHash {}

impl std::borrow::Borrow<[u8]> for ByHash {
    fn borrow(&self) -> &[u8] {
        &self.0.chunk_hash
    }
}

/// The other keys of a chunk hash; boxed so the common case (none) costs
/// one pointer in the slot.
type Siblings = Option<Box<Vec<SharedKey>>>;

/// The directory.
#[derive(Clone, Debug, Default)]
pub struct KeyDirectory {
    keys: FastMap<SharedKey, KeyEntry>,
    order: BTreeMap<u64, SharedKey>,
    next_order: u64,
    /// Every key by its chunk hash: one key files the slot, the others of
    /// that hash (usually none, and then nothing is allocated) ride in it.
    by_hash: FastMap<ByHash, Siblings>,
    bindings: FastMap<Vec<u8>, Binding>,
    l1_by_instance: FastMap<String, FastSet<SharedKey>>,
    totals: [TierTotals; 2],
    /// Most keys held; a new key beyond it drops the oldest (`None`: no
    /// bound).
    max_keys: Option<usize>,
    /// Keys dropped to stay within `max_keys`.
    dropped_for_capacity: u64,
    /// Keys dropped for the bound since the last [`Self::take_dropped`],
    /// with the placements they had, so the other views forget them too.
    dropped: Vec<(SharedKey, Vec<Placement>)>,
    /// Instance ids and backends the placements share.
    names: FastSet<Name>,
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
    /// every placement.
    pub fn apply(&mut self, batch: &Batch) -> Vec<u64> {
        if !self.l1_by_instance.contains_key(&batch.instance_id) {
            self.l1_by_instance
                .insert(batch.instance_id.clone(), FastSet::default());
        }
        let mut old_sizes = Vec::new();
        match batch.event_type {
            EventType::Store => {
                let (instance_id, backend) =
                    (self.intern(&batch.instance_id), self.intern(&batch.backend));
                old_sizes.reserve_exact(batch.entries.len());
                for e in &batch.entries {
                    let old = self.store(
                        &e.key,
                        Placement {
                            instance_id: instance_id.clone(),
                            incarnation: batch.incarnation,
                            tier: batch.tier,
                            backend: backend.clone(),
                            size_bytes: e.size_bytes,
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
                for e in &batch.entries {
                    old_sizes.push(self.remove_placement(&e.key, |p| {
                        p.same_identity(
                            &batch.instance_id,
                            batch.tier,
                            &batch.backend,
                            batch.shared,
                        )
                    }));
                }
            }
            EventType::Access => {
                for e in &batch.entries {
                    if let Some(entry) = self.keys.get_mut(&e.key) {
                        entry.access_count += 1;
                        entry.last_access = batch.ts;
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
    pub fn set_max_keys(&mut self, max: Option<usize>) {
        self.max_keys = max;
        if let Some(max) = max {
            while self.keys.len() > max {
                self.drop_oldest();
            }
        }
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
        let Some((_, key)) = self.order.first_key_value() else {
            return;
        };
        let key = key.clone();
        let placements = self
            .keys
            .get(&key)
            .map(|e| e.placements.clone())
            .unwrap_or_default();
        self.remove_placement(&key, |_| true);
        self.dropped_for_capacity += 1;
        self.dropped.push((key, placements));
    }

    /// Keys dropped for the bound since the last call, with the placements
    /// they had (the caller drops those bytes from the usage view, and the
    /// keys not present again from the LRU, so memory is bounded by the
    /// directory's bound everywhere). A key that came back since is listed
    /// too: its old placements' bytes still leave the usage view.
    pub fn take_dropped(&mut self) -> Vec<(SharedKey, Vec<Placement>)> {
        std::mem::take(&mut self.dropped)
    }

    /// Makes room for `additional` more keys at once (restore), so the maps
    /// are not rehashed as they grow.
    pub fn reserve(&mut self, additional: usize) {
        self.keys.reserve(additional);
        self.by_hash.reserve(additional);
    }

    /// The shared copy of `name` (placements built outside `apply`).
    pub fn intern(&mut self, name: &str) -> Name {
        if let Some(n) = self.names.get(name) {
            return n.clone();
        }
        let n: Name = name.into();
        self.names.insert(n.clone());
        n
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &ObjectKey) -> bool {
        self.keys.contains_key(key)
    }

    /// The directory's own shared copy of `key`, so a view restored beside
    /// it keeps no second copy.
    pub fn shared_key(&self, key: &ObjectKey) -> Option<&SharedKey> {
        self.keys.get_key_value(key).map(|(k, _)| k)
    }

    /// Keys holding a private L1 placement of `instance_id`.
    pub fn l1_keys(&self, instance_id: &str) -> impl Iterator<Item = &SharedKey> {
        self.l1_by_instance.get(instance_id).into_iter().flatten()
    }

    /// Inserts or replaces one placement (restore uses it too); returns the
    /// bytes of the placement it replaced, 0 if none.
    pub fn store(&mut self, key: &SharedKey, placement: Placement) -> u64 {
        if let Some(max) = self.max_keys
            && !self.keys.contains_key(key)
        {
            while self.keys.len() >= max.max(1) {
                self.drop_oldest();
            }
        }
        if placement.tier == StorageLevel::L1 && !placement.shared {
            let id: &str = &placement.instance_id;
            match self.l1_by_instance.get_mut(id) {
                Some(set) => set,
                None => self.l1_by_instance.entry(id.to_owned()).or_default(),
            }
            .insert(key.clone());
        }
        let t = &mut self.totals[tier_index(placement.tier)];
        // One hash of the key whether it is new or not.
        let entry = match self.keys.entry(key.clone()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let order = self.next_order;
                self.next_order += 1;
                self.order.insert(order, key.clone());
                match self.by_hash.get_mut(key.chunk_hash.as_slice()) {
                    Some(others) => others.get_or_insert_default().push(key.clone()),
                    None => {
                        self.by_hash.insert(ByHash(key.clone()), None);
                    }
                }
                v.insert(KeyEntry {
                    order,
                    // Most keys have one copy: a first push would reserve four.
                    placements: Vec::with_capacity(1),
                    access_count: 0,
                    last_access: 0.0,
                })
            }
        };
        match entry.placements.iter_mut().find(|p| {
            p.same_identity(
                &placement.instance_id,
                placement.tier,
                &placement.backend,
                placement.shared,
            )
        }) {
            Some(existing) => {
                let old = existing.size_bytes;
                t.bytes = t.bytes - old + placement.size_bytes;
                *existing = placement;
                old
            }
            None => {
                t.count += 1;
                t.bytes += placement.size_bytes;
                entry.placements.push(placement);
                0
            }
        }
    }

    /// Removes the placements `matches` picks; returns their bytes.
    fn remove_placement(&mut self, key: &ObjectKey, matches: impl Fn(&Placement) -> bool) -> u64 {
        let Some(entry) = self.keys.get_mut(key) else {
            return 0;
        };
        let mut removed_bytes = 0;
        let mut removed_private_l1 = HashSet::new();
        entry.placements.retain(|p| {
            if matches(p) {
                let t = &mut self.totals[tier_index(p.tier)];
                t.count -= 1;
                t.bytes -= p.size_bytes;
                removed_bytes += p.size_bytes;
                if p.tier == StorageLevel::L1 && !p.shared {
                    removed_private_l1.insert(p.instance_id.clone());
                }
                false
            } else {
                true
            }
        });
        for instance in removed_private_l1 {
            let still_there = entry
                .placements
                .iter()
                .any(|p| p.tier == StorageLevel::L1 && !p.shared && p.instance_id == instance);
            if !still_there && let Some(set) = self.l1_by_instance.get_mut(&*instance) {
                set.remove(key);
            }
        }
        if entry.placements.is_empty() {
            self.drop_key(key);
        }
        removed_bytes
    }

    fn drop_key(&mut self, key: &ObjectKey) {
        if let Some(entry) = self.keys.remove(key) {
            self.order.remove(&entry.order);
            let hash = key.chunk_hash.as_slice();
            if let Some((filed, others)) = self.by_hash.remove_entry(hash) {
                let mut others = others.map(|b| *b).unwrap_or_default();
                let boxed = |v: Vec<SharedKey>| (!v.is_empty()).then(|| Box::new(v));
                if filed.0.as_ref() == key {
                    match others.pop() {
                        Some(next) => {
                            self.by_hash.insert(ByHash(next), boxed(others));
                        }
                        // The token binding leaves with the hash's last key.
                        None => {
                            self.bindings.remove(hash);
                        }
                    }
                } else {
                    others.retain(|k| k.as_ref() != key);
                    self.by_hash.insert(filed, boxed(others));
                }
            }
        }
    }

    /// Drops every private L1 placement `instance_id` reported and its entry
    /// in the per-instance L1 index. L2 and shared placements stay.
    pub fn fence(&mut self, instance_id: &str) {
        let Some(keys) = self.l1_by_instance.remove(instance_id) else {
            return;
        };
        for key in keys {
            self.remove_placement(&key, |p| {
                p.tier == StorageLevel::L1 && !p.shared && *p.instance_id == *instance_id
            });
        }
        // remove_placement may not recreate it, but be explicit.
        self.l1_by_instance.remove(instance_id);
    }

    /// A key's state, if present.
    pub fn get(&self, key: &ObjectKey) -> Option<&KeyEntry> {
        self.keys.get(key)
    }

    /// Tokens bound to a chunk hash (empty if none).
    pub fn tokens_for_hash(&self, chunk_hash: &[u8]) -> &[u32] {
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
        if let Some(e) = self.keys.get_mut(key) {
            e.access_count = access_count;
            e.last_access = last_access;
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
        let Some((filed, rest)) = self.by_hash.get_key_value(key.chunk_hash.as_slice()) else {
            return vec![key.clone()];
        };
        let mut others: Vec<&ObjectKey> = std::iter::once(&filed.0)
            .chain(rest.as_deref().into_iter().flatten())
            .map(|k| k.as_ref())
            .filter(|k| {
                k.object_group_id != key.object_group_id
                    && k.model_name == key.model_name
                    && k.kv_rank == key.kv_rank
                    && k.cache_salt == key.cache_salt
            })
            .collect();
        others.sort_by_key(|k| k.object_group_id);
        std::iter::once(key.clone())
            .chain(others.into_iter().cloned())
            .collect()
    }

    /// Whether any L2 placement of `key` is left.
    pub fn has_l2(&self, key: &ObjectKey) -> bool {
        self.keys
            .get(key)
            .is_some_and(|e| e.placements.iter().any(|p| p.tier == StorageLevel::L2))
    }

    /// A page of keys with at least one placement matching `filter`, and the
    /// total of such keys.
    pub fn list(
        &self,
        filter: &KeyFilter<'_>,
        offset: usize,
        limit: usize,
    ) -> (u64, Vec<ListedKey>) {
        let mut total = 0u64;
        let mut page = Vec::new();
        for key in self.order.values() {
            let Some(entry) = self.keys.get(key) else {
                continue;
            };
            let matching: Vec<&Placement> = entry
                .placements
                .iter()
                .filter(|p| {
                    filter.tier.matches(p.tier)
                        && (filter.instance_id.is_empty() || *p.instance_id == *filter.instance_id)
                        && (filter.backend.is_empty() || *p.backend == *filter.backend)
                })
                .collect();
            if matching.is_empty() {
                continue;
            }
            let index = usize::try_from(total).unwrap_or(usize::MAX);
            total += 1;
            if index >= offset && page.len() < limit {
                page.push(ListedKey {
                    key: ObjectKey::clone(key),
                    placements: matching.into_iter().cloned().collect(),
                    num_tokens: self.tokens_for_hash(&key.chunk_hash).len(),
                    access_count: entry.access_count,
                });
            }
        }
        (total, page)
    }

    /// Every key with its state, in insertion order (checkpoint).
    pub fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &KeyEntry)> {
        self.order
            .values()
            .filter_map(|k| self.keys.get(k).map(|e| (k.as_ref(), e)))
    }

    /// Every token binding (checkpoint).
    pub fn bindings(&self) -> impl Iterator<Item = (&Vec<u8>, &Binding)> {
        self.bindings.iter()
    }

    /// Instances in the L1 index with their L1 keys (checkpoint).
    pub fn l1_index(&self) -> impl Iterator<Item = (&String, &FastSet<SharedKey>)> {
        self.l1_by_instance.iter()
    }

    /// Counts for stats and metrics; cheap (no walk of the keys).
    pub fn stats(&self) -> DirectoryStats {
        DirectoryStats {
            num_keys: self.keys.len() as u64,
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
        self.keys.len()
    }

    /// Whether no key is present.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests;
