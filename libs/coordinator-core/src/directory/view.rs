//! A lookup's probe: a present key's state lent from the table, nothing
//! materialized (no `Vec` of placements, no interned name's reference
//! count touched per answer).

use super::table::Id;
use super::{KeyDirectory, ObjectKey};
use crate::StorageLevel;

/// One copy of a key as [`KeyView::placements`] lends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementRef<'a> {
    /// Reporter (for a shared placement, the latest one).
    pub instance_id: &'a str,
    /// Reporter's incarnation.
    pub incarnation: u64,
    /// StorageLevel.
    pub tier: StorageLevel,
    /// Backend.
    pub backend: &'a str,
    /// Reported size.
    pub size_bytes: u64,
    /// In a pool several instances mount.
    pub shared: bool,
}

/// A present key's state, borrowed from the directory
/// ([`KeyDirectory::probe`]).
#[derive(Clone, Copy, Debug)]
pub struct KeyView<'a> {
    pub(super) dir: &'a KeyDirectory,
    pub(super) id: Id,
}

impl<'a> KeyView<'a> {
    /// Copies, in the order they were first reported.
    pub fn placements(&self) -> impl Iterator<Item = PlacementRef<'a>> + 'a {
        let names = &self.dir.table.names;
        self.dir
            .table
            .rec(self.id)
            .places()
            .map(move |p| PlacementRef {
                instance_id: names.name(p.instance),
                incarnation: p.incarnation,
                tier: p.tier,
                backend: names.name(p.backend),
                size_bytes: p.size_bytes,
                shared: p.shared,
            })
    }

    /// Access events seen.
    pub fn access_count(&self) -> u64 {
        self.dir.table.rec(self.id).access_count
    }

    /// Emitter time of the last access (0 if none).
    pub fn last_access(&self) -> f64 {
        self.dir.table.rec(self.id).last_access
    }

    /// Tokens bound to the key's chunk hash (empty if none).
    pub fn tokens(&self) -> &'a [u32] {
        let dir = self.dir;
        if dir.bindings.is_empty() {
            return &[];
        }
        dir.tokens_for_hash(dir.table.hash_of(self.id))
    }
}

impl KeyDirectory {
    /// A key's state borrowed from the table (a lookup's probe: nothing
    /// allocated, no name's reference count touched), if present.
    pub fn probe(&self, key: &ObjectKey) -> Option<KeyView<'_>> {
        let id = self.table.find(key)?;
        Some(KeyView { dir: self, id })
    }

    /// [`Self::probe`] by a key's parts (a lookup's request read in place:
    /// no `ObjectKey` built).
    pub fn probe_parts(
        &self,
        chunk_hash: &[u8],
        model_name: &str,
        kv_rank: i64,
        object_group_id: i64,
        cache_salt: &str,
    ) -> Option<KeyView<'_>> {
        let id =
            self.table
                .find_parts(chunk_hash, model_name, kv_rank, object_group_id, cache_salt)?;
        Some(KeyView { dir: self, id })
    }
}

impl<'a> KeyView<'a> {
    /// The placements in the order a lookup answer lists them (instance,
    /// tier, backend); a key with one placement (the usual case) costs no
    /// allocation and no sort.
    pub fn placements_by_owner(&self) -> ByOwner<'a> {
        let rec = self.dir.table.rec(self.id);
        if rec.more.is_none() {
            return ByOwner(Order::One(self.placements().next()));
        }
        let mut all: Vec<PlacementRef<'a>> = self.placements().collect();
        all.sort_by(|a, b| {
            (a.instance_id, a.tier, a.backend).cmp(&(b.instance_id, b.tier, b.backend))
        });
        ByOwner(Order::Many(all.into_iter()))
    }
}

/// [`KeyView::placements_by_owner`]'s iterator.
#[derive(Debug)]
pub struct ByOwner<'a>(Order<'a>);

#[derive(Debug)]
enum Order<'a> {
    One(Option<PlacementRef<'a>>),
    Many(std::vec::IntoIter<PlacementRef<'a>>),
}

impl<'a> Iterator for ByOwner<'a> {
    type Item = PlacementRef<'a>;

    fn next(&mut self) -> Option<PlacementRef<'a>> {
        match &mut self.0 {
            Order::One(p) => p.take(),
            Order::Many(it) => it.next(),
        }
    }
}
