//! The usage view: bytes per placement, rolled up per tenant and per module,
//! and joined to declared capacity for `GET /instances/usage`.

use std::collections::{BTreeMap, BTreeSet};

use crate::{FastMap, FastSet};

use serde::Serialize;

use crate::StorageLevel;
use crate::capacity::CapacityRegistry;
use crate::events::{Batch, EventType};
use crate::key::SharedKey;

fn tier_index(tier: StorageLevel) -> usize {
    match tier {
        StorageLevel::L1 => 0,
        StorageLevel::L2 => 1,
    }
}

/// Identity of a byte count: shared placements have the owner `""`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UsageKey {
    /// StorageLevel.
    pub tier: StorageLevel,
    /// Key.
    pub key: SharedKey,
    /// Owner, `""` for a shared pool.
    pub owner: String,
    /// Backend.
    pub backend: String,
}

/// The usage view.
#[derive(Clone, Debug, Default)]
pub struct UsageView {
    placements: FastMap<UsageKey, u64>,
    /// Bytes per tenant, indexed by tier (L1, L2).
    by_salt: [FastMap<String, u64>; 2],
    /// Bytes per owner (`""` = shared pools), then tier (L1, L2), then backend.
    by_module: BTreeMap<String, [BTreeMap<String, u64>; 2]>,
    /// Private L1 placements per owner, so a fence touches only its own.
    l1_by_owner: FastMap<String, FastSet<(SharedKey, String)>>,
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

    /// Applies an admitted batch.
    pub fn apply(&mut self, batch: &Batch) {
        let owner = if batch.shared {
            ""
        } else {
            batch.instance_id.as_str()
        };
        match batch.event_type {
            EventType::Store => {
                for e in &batch.entries {
                    self.set(batch.tier, &e.key, owner, &batch.backend, e.size_bytes);
                }
            }
            EventType::Delete => {
                for e in &batch.entries {
                    self.remove(&UsageKey {
                        tier: batch.tier,
                        key: e.key.clone(),
                        owner: owner.to_owned(),
                        backend: batch.backend.clone(),
                    });
                }
            }
            EventType::Access | EventType::Config => {}
        }
    }

    /// Sets the bytes of one placement (restore uses it too).
    pub fn set(
        &mut self,
        tier: StorageLevel,
        key: &SharedKey,
        owner: &str,
        backend: &str,
        size: u64,
    ) {
        let ukey = UsageKey {
            tier,
            key: key.clone(),
            owner: owner.to_owned(),
            backend: backend.to_owned(),
        };
        let old = self.placements.insert(ukey, size).unwrap_or(0);
        if tier == StorageLevel::L1 && !owner.is_empty() {
            self.l1_by_owner
                .entry(owner.to_owned())
                .or_default()
                .insert((key.clone(), backend.to_owned()));
        }
        self.adjust(tier, &key.cache_salt, owner, backend, old, size);
    }

    /// Drops the bytes of a key's placements (a key the directory dropped
    /// for its bound).
    pub fn forget(&mut self, key: &SharedKey, placements: &[crate::directory::Placement]) {
        for p in placements {
            let owner = if p.shared { "" } else { p.instance_id.as_str() };
            self.remove(&UsageKey {
                tier: p.tier,
                key: key.clone(),
                owner: owner.to_owned(),
                backend: p.backend.clone(),
            });
        }
    }

    fn remove(&mut self, ukey: &UsageKey) {
        if let Some(old) = self.placements.remove(ukey) {
            if ukey.tier == StorageLevel::L1
                && let Some(set) = self.l1_by_owner.get_mut(&ukey.owner)
            {
                set.remove(&(ukey.key.clone(), ukey.backend.clone()));
                if set.is_empty() {
                    self.l1_by_owner.remove(&ukey.owner);
                }
            }
            self.adjust(
                ukey.tier,
                &ukey.key.cache_salt,
                &ukey.owner,
                &ukey.backend,
                old,
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
        // Look up by borrowed keys first: allocate only for a new entry.
        let t = tier_index(tier);
        let salts = &mut self.by_salt[t];
        let slot = match salts.get_mut(salt) {
            Some(slot) => slot,
            None => salts.entry(salt.to_owned()).or_insert(0),
        };
        *slot = *slot - old + new;
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
        *slot = *slot - old + new;
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
    pub fn fence(&mut self, owner: &str) {
        let Some(doomed) = self.l1_by_owner.remove(owner) else {
            return;
        };
        for (key, backend) in doomed {
            self.remove(&UsageKey {
                tier: StorageLevel::L1,
                key,
                owner: owner.to_owned(),
                backend,
            });
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

    /// Every placement's bytes (checkpoint).
    pub fn placements(&self) -> impl Iterator<Item = (&UsageKey, u64)> {
        self.placements.iter().map(|(k, v)| (k, *v))
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

    #[test]
    fn rollups_follow_store_and_delete() {
        let mut u = UsageView::new();
        u.apply(&batch(
            "a",
            EventType::Store,
            StorageLevel::L2,
            "fs",
            false,
            &[(key(1, "t"), 100), (key(2, "t"), 50)],
        ));
        u.apply(&batch(
            "a",
            EventType::Store,
            StorageLevel::L2,
            "fs",
            false,
            &[(key(1, "t"), 70)],
        ));
        assert_eq!(u.salt_bytes(StorageLevel::L2, "t"), 120);
        u.apply(&batch(
            "a",
            EventType::Delete,
            StorageLevel::L2,
            "fs",
            false,
            &[(key(2, "t"), 0)],
        ));
        assert_eq!(u.salt_bytes(StorageLevel::L2, "t"), 70);
        u.apply(&batch(
            "a",
            EventType::Delete,
            StorageLevel::L2,
            "fs",
            false,
            &[(key(1, "t"), 0)],
        ));
        assert!(u.salts(StorageLevel::L2).is_empty());
        assert!(u.owners().is_empty());
    }

    #[test]
    fn shared_pool_counted_once_and_never_fenced() {
        let mut u = UsageView::new();
        u.apply(&batch(
            "a",
            EventType::Store,
            StorageLevel::L2,
            "s3",
            true,
            &[(key(1, ""), 100)],
        ));
        u.apply(&batch(
            "b",
            EventType::Store,
            StorageLevel::L2,
            "s3",
            true,
            &[(key(1, ""), 100)],
        ));
        u.apply(&batch(
            "a",
            EventType::Store,
            StorageLevel::L1,
            "dram",
            false,
            &[(key(1, ""), 10)],
        ));
        assert_eq!(u.salt_bytes(StorageLevel::L2, ""), 100);
        u.fence("a");
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
        let mut u = UsageView::new();
        let mut caps = CapacityRegistry::new();
        let mut cfg = batch("a", EventType::Config, StorageLevel::L1, "dram", false, &[]);
        cfg.capacity_bytes = 2_097_152;
        caps.apply(&cfg);
        let mut cfg = batch("a", EventType::Config, StorageLevel::L2, "fs", false, &[]);
        cfg.capacity_bytes = 33_554_432;
        caps.apply(&cfg);
        u.apply(&batch(
            "a",
            EventType::Store,
            StorageLevel::L1,
            "dram",
            false,
            &[(key(1, ""), 300)],
        ));
        u.apply(&batch(
            "ghost",
            EventType::Store,
            StorageLevel::L2,
            "fs",
            false,
            &[(key(1, ""), 8)],
        ));
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
