//! The compact key table behind the directory: every key once, in a slab of
//! fixed-size records addressed by `u32` ids. Strings shared by many keys
//! (models, salts, instances, backends) are interned to ids; chunk hashes
//! live in one byte pool per hash length; the insertion order, the LRU and
//! the keys of one chunk hash are lists threaded through the records, and
//! the two hash tables hold ids (each with half of its hash). A key costs one record (112 B), its
//! hash bytes and a few bytes of table, where a map of owned keys cost
//! ~470 B (`git show bf2f2007:docs/benchmarks.md`, "Coordinator memory
//! and restart"; the current figures are in that section of
//! docs/benchmarks.md).

use std::hash::BuildHasher;

use hashbrown::HashTable;

use crate::StorageLevel;
use crate::key::ObjectKey;

mod pools;
pub(crate) use pools::{Hashes, Interner};
#[cfg(test)]
mod tests;

/// A record's id.
pub(crate) type Id = u32;
/// No record (end of a list).
pub(crate) const NIL: Id = u32::MAX;

/// An instance id or backend name, interned: every placement of one
/// reporter shares one allocation.
pub type Name = std::sync::Arc<str>;

type Hasher = foldhash::fast::RandomState;

/// A key's parts (chunk hash, model, rank, group, salt): what it is hashed
/// and compared by.
type Parts<'a> = (&'a [u8], &'a str, i64, i64, &'a str);

/// `key`'s [`Parts`].
fn key_parts(key: &ObjectKey) -> Parts<'_> {
    (
        &key.chunk_hash,
        &key.model_name,
        key.kv_rank,
        key.object_group_id,
        &key.cache_salt,
    )
}

/// The parts of a table a key's hash and equality read, borrowed beside
/// the id tables (whose inserts call back for the hashes of ids).
#[derive(Clone, Copy)]
struct KeyView<'a> {
    recs: &'a [Rec],
    hashes: &'a Hashes,
    strings: &'a Interner,
    hasher: &'a Hasher,
}

impl<'a> KeyView<'a> {
    fn chunk(self, id: Id) -> &'a [u8] {
        let r = &self.recs[id as usize];
        self.hashes.get(r.hash_class(), r.hash_place)
    }

    fn parts(self, id: Id) -> Parts<'a> {
        let r = &self.recs[id as usize];
        (
            self.chunk(id),
            self.strings.name(r.model),
            r.kv_rank,
            r.object_group_id,
            self.strings.name(r.salt),
        )
    }

    /// A record's key hash (the one [`Table::find_parts`] computes from
    /// the parts).
    fn key_hash(self, id: Id) -> u64 {
        self.hasher.hash_one(self.parts(id))
    }

    /// A record's chunk-hash hash.
    fn chunk_hash(self, id: Id) -> u64 {
        self.hasher.hash_one(self.chunk(id))
    }

    /// Whether `id` holds the key of these parts: the one definition of key
    /// equality, for lookups and for a load's check of a key held twice.
    fn is_key(self, id: Id, (hash, model, rank, group, salt): Parts<'_>) -> bool {
        let r = &self.recs[id as usize];
        r.kv_rank == rank
            && r.object_group_id == group
            && self.chunk(id) == hash
            && **self.strings.name(r.model) == *model
            && **self.strings.name(r.salt) == *salt
    }

    /// Whether records `a` and `b` hold one key.
    fn same_key(self, a: Id, b: Id) -> bool {
        self.is_key(a, self.parts(b))
    }
}

/// An id as the id tables file it: with the high half of its key's (or
/// chunk hash's) hash beside it, so a table that grows moves its slots by
/// what they hold instead of reading every record and its hash bytes
/// again. Doubling a table of 917 k keys that way was a stall of about
/// half a second for the request that filled it (and for every lookup
/// behind it), one per table; a key costs 4 more bytes of table for it.
#[derive(Clone, Copy, Debug)]
struct Filed {
    id: Id,
    tag: u32,
}

/// The half of a hash a [`Filed`] keeps.
fn tag_of(h: u64) -> u32 {
    let tag = (h >> 32) as u32;
    // This crate's tests keep 12 bits of it: keys whose tags collide (some
    // 12 k pairs among 10 M keys) then meet in every test of the tables.
    if cfg!(test) { tag & 0xFFF } else { tag }
}

/// The hash the id tables file `tag` by: an odd multiple, so its low bits
/// (the bucket) are a one-to-one function of the tag's low bits at every
/// size up to 2^32 buckets, and its top bits (hashbrown's control byte)
/// mix all of them.
fn spread(tag: u32) -> u64 {
    u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// What a growing id table rehashes a slot by.
fn refiled(f: &Filed) -> u64 {
    spread(f.tag)
}

/// log2 of the buckets of a hashbrown table of `capacity` (7/8 of its
/// buckets, a power of two, from 8 up).
fn bucket_bits(capacity: usize) -> u32 {
    if capacity < 8 {
        return 3;
    }
    (capacity.saturating_mul(8) / 7)
        .next_power_of_two()
        .trailing_zeros()
}

// === Records ===

/// One placement, its names as interned ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) size_bytes: u64,
    pub(crate) incarnation: u64,
    pub(crate) instance: u32,
    pub(crate) backend: u32,
    pub(crate) tier: StorageLevel,
    pub(crate) shared: bool,
}

impl Place {
    /// Whether `self` is the placement an event for (instance, tier,
    /// backend, shared) addresses. A shared placement is identified without
    /// its owner. Names are interned, so ids compare as the strings would.
    pub(crate) fn same_identity(&self, other: &Place) -> bool {
        self.tier == other.tier
            && self.backend == other.backend
            && self.shared == other.shared
            && (self.shared || self.instance == other.instance)
    }

    pub(crate) fn private_l1(&self) -> bool {
        self.tier == StorageLevel::L1 && !self.shared
    }
}

/// One key and its state. Dead records (freed ids) chain through
/// `order_next`.
#[derive(Clone, Debug)]
pub(crate) struct Rec {
    pub(crate) kv_rank: i64,
    pub(crate) object_group_id: i64,
    pub(crate) access_count: u64,
    pub(crate) last_access: f64,
    /// The first placement; every live key has one.
    pub(crate) first: Place,
    /// The others, in the order they were first reported (usually none).
    /// Boxed: one pointer in every record, where a `Vec` would be three.
    #[allow(clippy::box_collection)]
    pub(crate) more: Option<Box<Vec<Place>>>,
    /// The hash's pool ([`Self::hash_class`]) and, in the top bit
    /// ([`IN_LRU`]), whether the key is in its tenant's LRU: one word for
    /// both keeps the record at 112 B with the chain's back link.
    class_lru: u32,
    pub(crate) hash_place: u32,
    pub(crate) model: u32,
    pub(crate) salt: u32,
    pub(crate) order_prev: Id,
    pub(crate) order_next: Id,
    pub(crate) lru_prev: Id,
    pub(crate) lru_next: Id,
    /// The next and previous keys of the same chunk hash (the first has no
    /// previous): doubly linked, so a key leaves its chain in O(1).
    pub(crate) same_hash_next: Id,
    pub(crate) same_hash_prev: Id,
}

/// The top bit of [`Rec::class_lru`]. A pool per hash length cannot reach
/// 2^31 pools: a key's length is bounded by the request or record holding it.
const IN_LRU: u32 = 1 << 31;

impl Rec {
    /// The pool of the key's chunk hash.
    pub(crate) fn hash_class(&self) -> u32 {
        self.class_lru & !IN_LRU
    }

    /// Whether the key is in its tenant's L2 LRU.
    pub(crate) fn in_lru(&self) -> bool {
        self.class_lru & IN_LRU != 0
    }

    pub(crate) fn set_in_lru(&mut self, on: bool) {
        self.class_lru = if on {
            self.class_lru | IN_LRU
        } else {
            self.class_lru & !IN_LRU
        };
    }

    pub(crate) fn places(&self) -> impl Iterator<Item = &Place> {
        std::iter::once(&self.first).chain(self.more.as_deref().into_iter().flatten())
    }

    pub(crate) fn places_mut(&mut self) -> impl Iterator<Item = &mut Place> {
        std::iter::once(&mut self.first).chain(self.more.as_deref_mut().into_iter().flatten())
    }

    pub(crate) fn push_place(&mut self, p: Place) {
        self.more.get_or_insert_default().push(p);
    }

    /// Keeps the placements `keep` accepts, in order; returns the removed
    /// ones and whether none is left (then `first` is stale: the caller
    /// drops the record).
    pub(crate) fn retain_places(
        &mut self,
        mut keep: impl FnMut(&Place) -> bool,
    ) -> (Vec<Place>, bool) {
        let mut removed = Vec::new();
        if self.more.is_none() {
            if !keep(&self.first) {
                removed.push(self.first);
                return (removed, true);
            }
            return (removed, false);
        }
        let mut all: Vec<Place> = self.places().copied().collect();
        all.retain(|p| {
            let k = keep(p);
            if !k {
                removed.push(*p);
            }
            k
        });
        match all.split_first() {
            Some((&first, rest)) => {
                self.first = first;
                self.more = (!rest.is_empty()).then(|| Box::new(rest.to_vec()));
                (removed, false)
            }
            None => {
                self.more = None;
                (removed, true)
            }
        }
    }
}

/// A key's parts, its model and salt as interned ids.
pub(crate) struct KeyParts<'a> {
    pub(crate) hash: &'a [u8],
    pub(crate) model: u32,
    pub(crate) salt: u32,
    pub(crate) kv_rank: i64,
    pub(crate) object_group_id: i64,
}

/// A doubly linked list through the records (insertion order, one LRU
/// bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct List {
    pub(crate) head: Id,
    pub(crate) tail: Id,
    pub(crate) len: usize,
}

impl Default for List {
    fn default() -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }
}

/// Which links a list uses.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Links {
    Order,
    Lru,
}

impl Links {
    fn get(self, r: &Rec) -> (Id, Id) {
        match self {
            Links::Order => (r.order_prev, r.order_next),
            Links::Lru => (r.lru_prev, r.lru_next),
        }
    }

    fn set_prev(self, r: &mut Rec, v: Id) {
        match self {
            Links::Order => r.order_prev = v,
            Links::Lru => r.lru_prev = v,
        }
    }

    fn set_next(self, r: &mut Rec, v: Id) {
        match self {
            Links::Order => r.order_next = v,
            Links::Lru => r.lru_next = v,
        }
    }
}

/// The slab, the interned strings, the hash pools and the two id tables.
#[derive(Clone, Debug, Default)]
pub(crate) struct Table {
    pub(crate) recs: Vec<Rec>,
    free: Id,
    has_free: bool,
    pub(crate) hashes: Hashes,
    /// Models and salts (released with their keys).
    pub(crate) strings: Interner,
    /// Instance ids and backends (kept).
    pub(crate) names: Interner,
    /// Every live id, by the whole key.
    by_key: HashTable<Filed>,
    /// The first id of each chunk hash, by the hash bytes.
    by_hash: HashTable<Filed>,
    hasher: Hasher,
    live: usize,
}

impl Table {
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    pub(crate) fn rec(&self, id: Id) -> &Rec {
        &self.recs[id as usize]
    }

    pub(crate) fn rec_mut(&mut self, id: Id) -> &mut Rec {
        &mut self.recs[id as usize]
    }

    pub(crate) fn hash_of(&self, id: Id) -> &[u8] {
        let r = self.rec(id);
        self.hashes.get(r.hash_class(), r.hash_place)
    }

    /// The records and pools, for a key's hash and equality.
    fn view(&self) -> KeyView<'_> {
        KeyView {
            recs: &self.recs,
            hashes: &self.hashes,
            strings: &self.strings,
            hasher: &self.hasher,
        }
    }

    /// The id tables, mutable, beside the view their inserts and rehashes
    /// call back into.
    fn split(&mut self) -> (&mut HashTable<Filed>, &mut HashTable<Filed>, KeyView<'_>) {
        let view = KeyView {
            recs: &self.recs,
            hashes: &self.hashes,
            strings: &self.strings,
            hasher: &self.hasher,
        };
        (&mut self.by_key, &mut self.by_hash, view)
    }

    /// The id of `key`, if present.
    pub(crate) fn find(&self, key: &ObjectKey) -> Option<Id> {
        self.find_hashed(key, self.key_hash(key))
    }

    /// What `key` is filed by in the id table: a store computes it once
    /// for [`Self::find_hashed`] and [`Self::insert_hashed`].
    pub(crate) fn key_hash(&self, key: &ObjectKey) -> u64 {
        self.hasher.hash_one(key_parts(key))
    }

    /// [`Self::find`] with `key`'s [`Self::key_hash`].
    pub(crate) fn find_hashed(&self, key: &ObjectKey, h: u64) -> Option<Id> {
        self.find_filed(h, key_parts(key))
    }

    /// The id of the key of `parts`, whose hash is `h`.
    fn find_filed(&self, h: u64, parts: Parts<'_>) -> Option<Id> {
        let (tag, view) = (tag_of(h), self.view());
        self.by_key
            .find(spread(tag), |f| f.tag == tag && view.is_key(f.id, parts))
            .map(|f| f.id)
    }

    /// The id of the key of these parts, if present.
    pub(crate) fn find_parts(
        &self,
        hash: &[u8],
        model: &str,
        rank: i64,
        group: i64,
        salt: &str,
    ) -> Option<Id> {
        let parts = (hash, model, rank, group, salt);
        self.find_filed(self.hasher.hash_one(parts), parts)
    }

    /// The first id of a chunk hash.
    pub(crate) fn first_of_hash(&self, h: &[u8]) -> Option<Id> {
        let view = self.view();
        let tag = tag_of(self.hasher.hash_one(h));
        self.by_hash
            .find(spread(tag), |f| f.tag == tag && view.chunk(f.id) == h)
            .map(|f| f.id)
    }

    /// The key of `id`, as an owned value.
    pub(crate) fn key(&self, id: Id) -> ObjectKey {
        let r = self.rec(id);
        ObjectKey {
            chunk_hash: self.hashes.get(r.hash_class(), r.hash_place).to_vec(),
            model_name: self.strings.name(r.model).to_string(),
            kv_rank: r.kv_rank,
            object_group_id: r.object_group_id,
            cache_salt: self.strings.name(r.salt).to_string(),
        }
    }

    pub(crate) fn salt(&self, id: Id) -> &str {
        self.strings.name(self.rec(id).salt)
    }

    /// Makes room for `additional` keys.
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.recs.reserve(additional);
        self.by_key.reserve(additional, refiled);
        self.by_hash.reserve(additional, refiled);
    }

    /// Adds a key (absent) with its first placement; returns its id. The
    /// lists are the caller's to link.
    #[cfg(test)]
    pub(crate) fn insert(&mut self, key: &ObjectKey, first: Place) -> Id {
        self.insert_hashed(key, first, self.key_hash(key))
    }

    /// Adds a key (absent, whose [`Self::key_hash`] is `h`) with its first
    /// placement; returns its id. The lists are the caller's to link.
    pub(crate) fn insert_hashed(&mut self, key: &ObjectKey, first: Place, h: u64) -> Id {
        let model = self.strings.acquire(&key.model_name);
        let salt = self.strings.acquire(&key.cache_salt);
        let parts = KeyParts {
            hash: &key.chunk_hash,
            model,
            salt,
            kv_rank: key.kv_rank,
            object_group_id: key.object_group_id,
        };
        let id = self.push_rec(&parts, first);
        self.file(id, h, &key.chunk_hash);
        id
    }

    /// Adds a key's record without filing it in the id tables (a load files
    /// every record at the end, [`Self::file_all`]).
    pub(crate) fn push_unfiled(&mut self, k: &KeyParts<'_>, first: Place) -> Id {
        self.push_rec(k, first)
    }

    fn push_rec(&mut self, k: &KeyParts<'_>, first: Place) -> Id {
        let (hash_class, hash_place) = self.hashes.insert(k.hash);
        debug_assert_eq!(hash_class & IN_LRU, 0, "a pool per hash length");
        let (model, salt) = (k.model, k.salt);
        let rec = Rec {
            kv_rank: k.kv_rank,
            object_group_id: k.object_group_id,
            access_count: 0,
            last_access: 0.0,
            first,
            more: None,
            class_lru: hash_class,
            hash_place,
            model,
            salt,
            order_prev: NIL,
            order_next: NIL,
            lru_prev: NIL,
            lru_next: NIL,
            same_hash_next: NIL,
            same_hash_prev: NIL,
        };
        let id = if self.has_free {
            let id = self.free;
            let next = self.recs[id as usize].order_next;
            self.has_free = next != NIL;
            self.free = next;
            self.recs[id as usize] = rec;
            id
        } else {
            self.recs.push(rec);
            u32::try_from(self.recs.len() - 1).unwrap_or(NIL)
        };
        self.live += 1;
        id
    }

    /// Files `id` (whose key hashes to `h`) in the two id tables.
    fn file(&mut self, id: Id, h: u64, chunk: &[u8]) {
        let (by_key, by_hash, view) = self.split();
        let tag = tag_of(h);
        by_key.insert_unique(spread(tag), Filed { id, tag }, refiled);
        // File it by its chunk hash: first of the hash, or second in the
        // chain behind the first.
        let tag = tag_of(view.hasher.hash_one(chunk));
        let head = by_hash
            .find(spread(tag), |f| f.tag == tag && view.chunk(f.id) == chunk)
            .map(|f| f.id);
        match head {
            Some(head) => {
                let next = self.rec(head).same_hash_next;
                if next != NIL {
                    self.rec_mut(next).same_hash_prev = id;
                }
                let r = self.rec_mut(id);
                r.same_hash_next = next;
                r.same_hash_prev = head;
                self.rec_mut(head).same_hash_next = id;
            }
            None => {
                by_hash.insert_unique(spread(tag), Filed { id, tag }, refiled);
            }
        }
    }

    /// Files every record (all live, none filed: a load) in the two id
    /// tables, in the order of the tables' buckets, so the inserts walk the
    /// tables' memory in sequence instead of missing the cache twice a key
    /// (what made a 10 M-key restore take seconds). Each key is hashed once
    /// here; a key held twice is found as a neighbour in that order.
    /// `false` when two records hold the same key.
    pub(crate) fn file_all(&mut self) -> bool {
        let n = self.recs.len();
        debug_assert!(self.by_key.is_empty() && self.by_hash.is_empty());
        let ids = || (0..n).map(|i| u32::try_from(i).unwrap_or(NIL));
        // hashbrown finds a slot from the hash's low bits (bucket mask):
        // sorting by them first is sorting by bucket.
        // Each id with the order of its filed hash and its tag.
        let sorted = |capacity: usize, hash: &dyn Fn(Id) -> u64| {
            let shift = bucket_bits(capacity);
            let mut v: Vec<(u64, u32, Id)> = ids()
                .map(|id| {
                    let tag = tag_of(hash(id));
                    (spread(tag).rotate_right(shift), tag, id)
                })
                .collect();
            v.sort_unstable();
            v
        };
        let chunked = {
            let (by_key, by_hash, view) = self.split();
            // Reserved once to the final size, so the inserts below do not
            // rehash.
            by_key.reserve(n, refiled);
            by_hash.reserve(n, refiled);
            let keyed = sorted(by_key.capacity(), &|id| view.key_hash(id));
            for &(_, tag, id) in &keyed {
                by_key.insert_unique(spread(tag), Filed { id, tag }, refiled);
            }
            // A key held twice has one hash, so one tag: its copies are in
            // one run of equal tags. A run of more than one is a collision
            // of 32 bits of a random-seeded hash (some 12 k pairs at 10 M
            // keys), so the pairwise check stays cheap.
            for run in keyed.chunk_by(|a, b| a.1 == b.1) {
                for (i, &(_, _, a)) in run.iter().enumerate() {
                    if run[i + 1..].iter().any(|&(_, _, b)| view.same_key(a, b)) {
                        return false;
                    }
                }
            }
            drop(keyed);
            // Sorted by (bucket order, id), the keys of one chunk hash are
            // one run however many they are (an emitter may report any
            // number of groups, ranks and salts under one chunk), linked in
            // one pass: the lowest id is filed, the rest chained behind it
            // in id order.
            let mut chunked = sorted(by_hash.capacity(), &|id| view.chunk_hash(id));
            let bytes = |id: Id| view.chunk(id);
            for run in chunked.chunk_by_mut(|a, b| a.1 == b.1) {
                // A run of one tag is one chunk hash unless 32 bits of the
                // hash collided: then sorted by (bytes, id) so each chunk
                // hash's keys are together.
                if run.windows(2).any(|w| bytes(w[0].2) != bytes(w[1].2)) {
                    run.sort_unstable_by(|a, b| bytes(a.2).cmp(bytes(b.2)).then(a.2.cmp(&b.2)));
                }
                for same in run.chunk_by_mut(|a, b| bytes(a.2) == bytes(b.2)) {
                    let (_, tag, head) = same[0];
                    by_hash.insert_unique(spread(tag), Filed { id: head, tag }, refiled);
                    // Marks the run's first for the linking pass below (the
                    // records are borrowed here).
                    same[0].0 = 0;
                    for e in &mut same[1..] {
                        e.0 = 1;
                    }
                }
            }
            chunked
        };
        for w in chunked.windows(2) {
            if w[1].0 == 1 {
                self.rec_mut(w[0].2).same_hash_next = w[1].2;
                self.rec_mut(w[1].2).same_hash_prev = w[0].2;
            }
        }
        true
    }

    /// Removes `id` (already unlinked from the order and LRU lists) from the
    /// tables; returns whether it was the last key of its chunk hash.
    pub(crate) fn remove(&mut self, id: Id) -> bool {
        let view = self.view();
        let (h, hh) = (
            spread(tag_of(view.key_hash(id))),
            spread(tag_of(view.chunk_hash(id))),
        );
        if let Ok(e) = self.by_key.find_entry(h, |f| f.id == id) {
            e.remove();
        }
        // Out of its chunk hash's chain in O(1) whatever the chain's length
        // (an emitter may report any number of groups and ranks of a chunk).
        let (prev, next) = {
            let r = self.rec(id);
            (r.same_hash_prev, r.same_hash_next)
        };
        if next != NIL {
            self.rec_mut(next).same_hash_prev = prev;
        }
        let last_of_hash = prev == NIL && next == NIL;
        if prev != NIL {
            self.rec_mut(prev).same_hash_next = next;
        } else if next == NIL {
            // The first and only key: the hash leaves the table.
            if let Ok(e) = self.by_hash.find_entry(hh, |f| f.id == id) {
                e.remove();
            }
        } else if let Some(slot) = self.by_hash.find_mut(hh, |f| f.id == id) {
            // The first: the next (of the same chunk hash, so the same
            // tag) takes its slot.
            slot.id = next;
        }
        let (class, place, model, salt) = {
            let r = self.rec(id);
            (r.hash_class(), r.hash_place, r.model, r.salt)
        };
        self.hashes.remove(class, place);
        self.strings.release(model);
        self.strings.release(salt);
        let free = if self.has_free { self.free } else { NIL };
        let r = self.rec_mut(id);
        r.more = None;
        r.order_next = free;
        r.same_hash_next = NIL;
        r.same_hash_prev = NIL;
        self.free = id;
        self.has_free = true;
        self.live -= 1;
        last_of_hash
    }

    /// Ids of the keys of a chunk hash.
    pub(crate) fn same_hash(&self, h: &[u8]) -> impl Iterator<Item = Id> + '_ {
        let mut cur = self.first_of_hash(h).unwrap_or(NIL);
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let id = cur;
                cur = self.rec(id).same_hash_next;
                id
            })
        })
    }

    // === lists ===

    pub(crate) fn push_back(&mut self, list: &mut List, links: Links, id: Id) {
        let tail = list.tail;
        {
            let r = self.rec_mut(id);
            links.set_prev(r, tail);
            links.set_next(r, NIL);
        }
        if tail == NIL {
            list.head = id;
        } else {
            links.set_next(self.rec_mut(tail), id);
        }
        list.tail = id;
        list.len += 1;
    }

    pub(crate) fn unlink(&mut self, list: &mut List, links: Links, id: Id) {
        let (prev, next) = links.get(self.rec(id));
        if prev == NIL {
            list.head = next;
        } else {
            links.set_next(self.rec_mut(prev), next);
        }
        if next == NIL {
            list.tail = prev;
        } else {
            links.set_prev(self.rec_mut(next), prev);
        }
        let r = self.rec_mut(id);
        links.set_prev(r, NIL);
        links.set_next(r, NIL);
        list.len -= 1;
    }

    /// The ids of a list, head first.
    pub(crate) fn walk(&self, list: &List, links: Links) -> impl Iterator<Item = Id> + '_ {
        let mut cur = list.head;
        std::iter::from_fn(move || {
            (cur != NIL).then(|| {
                let id = cur;
                cur = links.get(self.rec(id)).1;
                id
            })
        })
    }
}
