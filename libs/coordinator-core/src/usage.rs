//! The usage view: bytes rolled up per tenant and per module, and joined to
//! declared capacity for `GET /instances/usage`. The bytes of each placement
//! live once, in the key directory; this view keeps only the rollups and
//! moves them by the sizes the directory reports replaced or removed.

use std::collections::{BTreeMap, BTreeSet};

use crate::FastMap;

use serde::Serialize;

use crate::StorageLevel;
use crate::capacity::CapacityRegistry;
use crate::directory::{KeyDirectory, Placement};
use crate::events::{Batch, EventType};
use crate::key::ObjectKey;

fn tier_index(tier: StorageLevel) -> usize {
    match tier {
        StorageLevel::L1 => 0,
        StorageLevel::L2 => 1,
    }
}

/// Owner of a placement's bytes: `""` for a shared pool.
fn owner_of(p: &Placement) -> &str {
    if p.shared { "" } else { &p.instance_id }
}

/// The usage view.
#[derive(Clone, Debug, Default)]
pub struct UsageView {
    /// Bytes per tenant, indexed by tier (L1, L2).
    by_salt: [FastMap<String, u64>; 2],
    /// Bytes per owner (`""` = shared pools), then tier (L1, L2), then backend.
    by_module: BTreeMap<String, [BTreeMap<String, u64>; 2]>,
}

/// One compartment of `GET /instances/usage`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModuleStatus {
    /// StorageLevel.
    pub tier: StorageLevel,
    /// Backend.
    pub backend: String,
    /// Shared pool.
    pub shared: bool,
    /// Bytes reported.
    pub used_bytes: u64,
    /// Declared capacity, 0 if none.
    pub capacity_bytes: u64,
    /// used / capacity, or null without a capacity. Not clamped.
    pub usage_ratio: Option<f64>,
}

impl ModuleStatus {
    fn new(tier: StorageLevel, backend: &str, shared: bool, used: u64, capacity: u64) -> Self {
        Self {
            tier,
            backend: backend.to_owned(),
            shared,
            used_bytes: used,
            capacity_bytes: capacity,
            #[allow(clippy::cast_precision_loss)]
            usage_ratio: (capacity > 0).then(|| used as f64 / capacity as f64),
        }
    }
}

/// One instance of `GET /instances/usage`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InstanceUsage {
    /// Id.
    pub instance_id: String,
    /// In the registry now.
    pub registered: bool,
    /// Declared anything (shared compartments included).
    pub declared_capacity: bool,
    /// Private compartments.
    pub modules: Vec<ModuleStatus>,
}

/// Body of `GET /instances/usage`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FleetUsage {
    /// Per instance, sorted by id.
    pub instances: Vec<InstanceUsage>,
    /// Shared pools holding bytes.
    pub shared_modules: Vec<ModuleStatus>,
}

impl UsageView {
    /// An empty view.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies an admitted batch, given what [`KeyDirectory::apply`]
    /// returned for it (the bytes each entry replaced or removed).
    pub fn apply(&mut self, batch: &Batch, old_sizes: &[u64]) {
        let owner = if batch.shared {
            ""
        } else {
            batch.instance_id.as_str()
        };
        let new_size = |size: u64| match batch.event_type {
            EventType::Store => size,
            _ => 0,
        };
        if !matches!(batch.event_type, EventType::Store | EventType::Delete) {
            return;
        }
        // Owner, tier and backend are the batch's; the salt is an entry's,
        // and entries come in runs of one salt: each run moves its rollups
        // once (three map probes a run instead of an entry). While no rollup
        // has saturated, a run's sums move it as its entries one by one
        // would; see `adjust` for when they differ.
        let mut run: Option<(&str, u64, u64)> = None;
        for (e, &old) in batch.entries.iter().zip(old_sizes) {
            let (salt, new) = (e.key.cache_salt.as_str(), new_size(e.size_bytes));
            match &mut run {
                Some((s, removed, added)) if *s == salt => {
                    *removed = removed.saturating_add(old);
                    *added = added.saturating_add(new);
                }
                _ => {
                    if let Some((s, removed, added)) = run.replace((salt, old, new)) {
                        self.adjust(batch.tier, s, owner, &batch.backend, removed, added);
                    }
                }
            }
        }
        if let Some((s, removed, added)) = run {
            self.adjust(batch.tier, s, owner, &batch.backend, removed, added);
        }
    }

    /// The rollups of every placement in `directory` (restore).
    pub fn rebuild(directory: &KeyDirectory) -> Self {
        let mut usage = Self::new();
        for (salt, tier, owner, backend, bytes) in directory.placement_rollups() {
            usage.adjust(tier, salt, owner, backend, 0, bytes);
        }
        usage
    }

    /// Drops the bytes of a key's placements (a key the directory dropped
    /// for its bound).
    pub fn forget(&mut self, key: &ObjectKey, placements: &[Placement]) {
        for p in placements {
            self.adjust(
                p.tier,
                &key.cache_salt,
                owner_of(p),
                &p.backend,
                p.size_bytes,
                0,
            );
        }
    }

    fn adjust(
        &mut self,
        tier: StorageLevel,
        salt: &str,
        owner: &str,
        backend: &str,
        old: u64,
        new: u64,
    ) {
        if old == new {
            return;
        }
        // Look up by borrowed keys first: allocate only for a new entry.
        let t = tier_index(tier);
        let salts = &mut self.by_salt[t];
        let slot = match salts.get_mut(salt) {
            Some(slot) => slot,
            None => salts.entry(salt.to_owned()).or_insert(0),
        };
        // Saturating: a rollup never wraps, whatever order callers keep.
        // Added before removed: while the slot has not saturated, a run's
        // sums then roll up as its entries one by one would (a key stored
        // twice in a run removes bytes the run itself added). Once it has
        // (sizes summing past u64::MAX, nonsense input, where the rollup is
        // no longer exact anyway) they can differ: a slot clamped at MAX,
        // then a run that replaces MAX bytes by 1 and adds 5 more, ends at
        // 0 where entries one by one end at 5.
        *slot = slot.saturating_add(new).saturating_sub(old);
        if *slot == 0 {
            salts.remove(salt);
        }
        let tiers = match self.by_module.get_mut(owner) {
            Some(tiers) => tiers,
            None => self.by_module.entry(owner.to_owned()).or_default(),
        };
        let backends = &mut tiers[t];
        let slot = match backends.get_mut(backend) {
            Some(slot) => slot,
            None => backends.entry(backend.to_owned()).or_insert(0),
        };
        *slot = slot.saturating_add(new).saturating_sub(old);
        if *slot == 0 {
            backends.remove(backend);
            if tiers.iter().all(BTreeMap::is_empty) {
                self.by_module.remove(owner);
            }
        }
    }

    /// An owner's bytes per (tier, backend), sorted.
    fn modules_of(&self, owner: &str) -> impl Iterator<Item = (StorageLevel, &String, u64)> {
        self.by_module.get(owner).into_iter().flat_map(|tiers| {
            [StorageLevel::L1, StorageLevel::L2]
                .into_iter()
                .flat_map(move |tier| {
                    tiers[tier_index(tier)]
                        .iter()
                        .map(move |(b, used)| (tier, b, *used))
                })
        })
    }

    /// Drops an owner's private L1 bytes (restart, timeout, deregistration).
    /// Call it before [`KeyDirectory::fence`]: the bytes are read from the
    /// placements that fence removes.
    pub fn fence(&mut self, owner: &str, directory: &KeyDirectory) {
        for (salt, backend, size) in directory.l1_placements(owner) {
            self.adjust(StorageLevel::L1, &salt, owner, &backend, size, 0);
        }
    }

    /// Bytes of one tenant on one tier.
    pub fn salt_bytes(&self, tier: StorageLevel, salt: &str) -> u64 {
        self.by_salt[tier_index(tier)]
            .get(salt)
            .copied()
            .unwrap_or(0)
    }

    /// Tenants with bytes on `tier`, sorted, with their bytes.
    pub fn salts(&self, tier: StorageLevel) -> BTreeMap<String, u64> {
        self.by_salt[tier_index(tier)]
            .iter()
            .map(|(s, b)| (s.clone(), *b))
            .collect()
    }

    /// Owners holding bytes (shared pools excluded).
    pub fn owners(&self) -> BTreeSet<String> {
        self.by_module
            .keys()
            .filter(|o| !o.is_empty())
            .cloned()
            .collect()
    }

    /// Whether an owner holds any bytes.
    pub fn owner_has_bytes(&self, owner: &str) -> bool {
        self.by_module.contains_key(owner)
    }

    /// Joins bytes with declarations for one instance.
    pub fn instance_usage(
        &self,
        id: &str,
        registered: bool,
        capacity: &CapacityRegistry,
    ) -> InstanceUsage {
        let declared = capacity.compartments(id);
        let mut modules: BTreeMap<(StorageLevel, String), ModuleStatus> = BTreeMap::new();
        for (tier, backend, used) in self.modules_of(id) {
            let cap = declared
                .and_then(|d| d.get(&(tier, backend.clone())))
                .filter(|c| !c.shared)
                .map_or(0, |c| c.capacity_bytes);
            modules.insert(
                (tier, backend.clone()),
                ModuleStatus::new(tier, backend, false, used, cap),
            );
        }
        for ((tier, backend), c) in declared.into_iter().flatten() {
            if !c.shared {
                modules.entry((*tier, backend.clone())).or_insert_with(|| {
                    ModuleStatus::new(*tier, backend, false, 0, c.capacity_bytes)
                });
            }
        }
        InstanceUsage {
            instance_id: id.to_owned(),
            registered,
            declared_capacity: declared.is_some_and(|d| !d.is_empty()),
            modules: modules.into_values().collect(),
        }
    }

    /// Whether `GET /instances/{id}/usage` knows the id.
    pub fn knows(&self, id: &str, registered: bool, capacity: &CapacityRegistry) -> bool {
        registered || self.owner_has_bytes(id) || capacity.compartments(id).is_some()
    }

    /// The whole fleet: registered ids, owners with bytes and declarers.
    pub fn fleet_usage(
        &self,
        registered: &BTreeSet<String>,
        capacity: &CapacityRegistry,
    ) -> FleetUsage {
        let mut ids: BTreeSet<String> = registered.clone();
        ids.extend(self.owners());
        ids.extend(capacity.declarers().cloned());
        let instances = ids
            .iter()
            .map(|id| self.instance_usage(id, registered.contains(id), capacity))
            .collect();
        let shared_modules = self
            .modules_of("")
            .map(|(tier, backend, used)| {
                ModuleStatus::new(
                    tier,
                    backend,
                    true,
                    used,
                    capacity.shared_capacity(tier, backend),
                )
            })
            .collect();
        FleetUsage {
            instances,
            shared_modules,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{batch, key};

    /// Applies a batch as ingest does: directory first, usage from its sizes.
    fn feed(d: &mut KeyDirectory, u: &mut UsageView, b: &Batch) {
        let old = d.apply(b);
        u.apply(b, &old);
    }

    #[test]
    fn rollups_match_a_rebuild_from_the_directory() {
        let (mut d, mut u) = (KeyDirectory::new(), UsageView::new());
        // The same key twice in one batch, a re-store with a new size, a
        // shared pool, a delete of nothing and a fence.
        let script = [
            batch(
                "a",
                EventType::Store,
                StorageLevel::L1,
                "dram",
                false,
                &[(key(1, "t"), 10), (key(1, "t"), 30), (key(2, ""), 7)],
            ),
            batch(
                "a",
                EventType::Store,
                StorageLevel::L2,
                "fs",
                false,
                &[(key(1, "t"), 100)],
            ),
            batch(
                "b",
                EventType::Store,
                StorageLevel::L2,
                "s3",
                true,
                &[(key(3, "u"), 40)],
            ),
            batch(
                "c",
                EventType::Store,
                StorageLevel::L2,
                "s3",
                true,
                &[(key(3, "u"), 45)],
            ),
            batch(
                "b",
                EventType::Delete,
                StorageLevel::L2,
                "fs",
                false,
                &[(key(1, "t"), 0), (key(9, "t"), 0)],
            ),
        ];
        for b in &script {
            feed(&mut d, &mut u, b);
        }
        assert_eq!(u.salt_bytes(StorageLevel::L1, "t"), 30);
        assert_eq!(
            u.salt_bytes(StorageLevel::L2, "u"),
            45,
            "shared pool counted once"
        );
        u.fence("a", &d);
        d.fence("a");
        let rebuilt = UsageView::rebuild(&d);
        for tier in [StorageLevel::L1, StorageLevel::L2] {
            assert_eq!(u.salts(tier), rebuilt.salts(tier), "{tier:?}");
        }
        assert_eq!(u.by_module, rebuilt.by_module);
        assert!(u.salts(StorageLevel::L1).is_empty());
        assert_eq!(u.salt_bytes(StorageLevel::L2, "t"), 100);
    }

    /// A batch's runs of one salt roll up as its entries one at a time do:
    /// repeats and re-stores within a run, runs that come back, a delete.
    /// The one exception, a rollup saturated at u64::MAX, is pinned at the
    /// end: neither path panics or wraps, and where they part is the
    /// documented case.
    #[test]
    fn a_batch_rolls_up_as_its_entries_one_by_one() {
        let entries = [
            (key(1, "t"), 10),
            (key(1, "t"), 30),
            (key(2, "t"), 5),
            (key(3, "u"), 7),
            (key(2, "t"), 1),
            (key(4, "t"), 9),
            (key(3, "u"), 2),
            (key(5, ""), 4),
        ];
        let (mut d, mut whole) = (KeyDirectory::new(), UsageView::new());
        let (mut d1, mut single) = (KeyDirectory::new(), UsageView::new());
        let mk = |event, entries: &[(ObjectKey, u64)]| {
            batch("a", event, StorageLevel::L1, "dram", false, entries)
        };
        for (event, entries) in [
            (EventType::Store, &entries[..]),
            (EventType::Store, &entries[2..6]),
            (EventType::Delete, &entries[1..4]),
        ] {
            feed(&mut d, &mut whole, &mk(event, entries));
            for e in entries {
                feed(&mut d1, &mut single, &mk(event, std::slice::from_ref(e)));
            }
            assert_eq!(
                whole.salts(StorageLevel::L1),
                single.salts(StorageLevel::L1)
            );
            assert_eq!(whole.by_module, single.by_module);
        }
        assert_eq!(whole.salt_bytes(StorageLevel::L1, "t"), 9);
        assert_eq!(whole.salt_bytes(StorageLevel::L1, "u"), 0);
        assert_eq!(whole.salt_bytes(StorageLevel::L1, ""), 4);

        // The exception: two keys of one salt at u64::MAX bytes clamp the
        // rollup (both paths agree there), then [A: MAX -> 1, C: 0 -> 5].
        let (a, b, c) = (key(11, "s"), key(12, "s"), key(13, "s"));
        let saturate = [(a.clone(), u64::MAX), (b, u64::MAX)];
        let after = [(a, 1), (c, 5)];
        for (entries, whole_bytes, single_bytes) in
            [(&saturate[..], u64::MAX, u64::MAX), (&after[..], 0, 5)]
        {
            feed(&mut d, &mut whole, &mk(EventType::Store, entries));
            for e in entries {
                let one = mk(EventType::Store, std::slice::from_ref(e));
                feed(&mut d1, &mut single, &one);
            }
            assert_eq!(whole.salt_bytes(StorageLevel::L1, "s"), whole_bytes);
            assert_eq!(single.salt_bytes(StorageLevel::L1, "s"), single_bytes);
        }
    }

    #[test]
    fn rollups_follow_store_and_delete() {
        let (mut d, mut u) = (KeyDirectory::new(), UsageView::new());
        feed(
            &mut d,
            &mut u,
            &batch(
                "a",
                EventType::Store,
                StorageLevel::L2,
                "fs",
                false,
                &[(key(1, "t"), 100), (key(2, "t"), 50)],
            ),
        );
        feed(
            &mut d,
            &mut u,
            &batch(
                "a",
                EventType::Store,
                StorageLevel::L2,
                "fs",
                false,
                &[(key(1, "t"), 70)],
            ),
        );
        assert_eq!(u.salt_bytes(StorageLevel::L2, "t"), 120);
        feed(
            &mut d,
            &mut u,
            &batch(
                "a",
                EventType::Delete,
                StorageLevel::L2,
                "fs",
                false,
                &[(key(2, "t"), 0)],
            ),
        );
        assert_eq!(u.salt_bytes(StorageLevel::L2, "t"), 70);
        feed(
            &mut d,
            &mut u,
            &batch(
                "a",
                EventType::Delete,
                StorageLevel::L2,
                "fs",
                false,
                &[(key(1, "t"), 0)],
            ),
        );
        assert!(u.salts(StorageLevel::L2).is_empty());
        assert!(u.owners().is_empty());
    }

    #[test]
    fn shared_pool_counted_once_and_never_fenced() {
        let (mut d, mut u) = (KeyDirectory::new(), UsageView::new());
        feed(
            &mut d,
            &mut u,
            &batch(
                "a",
                EventType::Store,
                StorageLevel::L2,
                "s3",
                true,
                &[(key(1, ""), 100)],
            ),
        );
        feed(
            &mut d,
            &mut u,
            &batch(
                "b",
                EventType::Store,
                StorageLevel::L2,
                "s3",
                true,
                &[(key(1, ""), 100)],
            ),
        );
        feed(
            &mut d,
            &mut u,
            &batch(
                "a",
                EventType::Store,
                StorageLevel::L1,
                "dram",
                false,
                &[(key(1, ""), 10)],
            ),
        );
        assert_eq!(u.salt_bytes(StorageLevel::L2, ""), 100);
        u.fence("a", &d);
        d.fence("a");
        assert_eq!(u.salt_bytes(StorageLevel::L1, ""), 0);
        assert_eq!(u.salt_bytes(StorageLevel::L2, ""), 100);
        let fleet = u.fleet_usage(&BTreeSet::new(), &CapacityRegistry::new());
        assert!(fleet.instances.is_empty());
        assert_eq!(fleet.shared_modules.len(), 1);
        assert_eq!(fleet.shared_modules[0].used_bytes, 100);
        assert_eq!(fleet.shared_modules[0].usage_ratio, None);
    }

    #[test]
    fn fleet_usage_joins_capacity() {
        let (mut d, mut u) = (KeyDirectory::new(), UsageView::new());
        let mut caps = CapacityRegistry::new();
        let mut cfg = batch("a", EventType::Config, StorageLevel::L1, "dram", false, &[]);
        cfg.capacity_bytes = 2_097_152;
        caps.apply(&cfg);
        let mut cfg = batch("a", EventType::Config, StorageLevel::L2, "fs", false, &[]);
        cfg.capacity_bytes = 33_554_432;
        caps.apply(&cfg);
        feed(
            &mut d,
            &mut u,
            &batch(
                "a",
                EventType::Store,
                StorageLevel::L1,
                "dram",
                false,
                &[(key(1, ""), 300)],
            ),
        );
        feed(
            &mut d,
            &mut u,
            &batch(
                "ghost",
                EventType::Store,
                StorageLevel::L2,
                "fs",
                false,
                &[(key(1, ""), 8)],
            ),
        );
        let registered: BTreeSet<String> = ["a".to_owned(), "idle".to_owned()].into();
        let fleet = u.fleet_usage(&registered, &caps);
        let ids: Vec<&str> = fleet
            .instances
            .iter()
            .map(|i| i.instance_id.as_str())
            .collect();
        assert_eq!(ids, vec!["a", "ghost", "idle"]);
        let a = &fleet.instances[0];
        assert!(a.registered && a.declared_capacity);
        assert_eq!(a.modules.len(), 2);
        assert_eq!(a.modules[0].used_bytes, 300);
        assert_eq!(a.modules[0].usage_ratio, Some(300.0 / 2_097_152.0));
        assert_eq!(
            a.modules[1].used_bytes, 0,
            "declared empty compartment listed"
        );
        assert!(!fleet.instances[1].registered);
        assert!(!fleet.instances[2].declared_capacity);
        assert!(!u.knows("nobody", false, &caps));
        assert!(u.knows("ghost", false, &caps));
    }
}
