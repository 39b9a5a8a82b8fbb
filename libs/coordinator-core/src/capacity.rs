//! Declared capacity per instance, from `config` batches.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::StorageLevel;
use crate::events::{Batch, EventType};

/// One declared compartment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compartment {
    /// Capacity, 0 = no cap.
    pub capacity_bytes: u64,
    /// A shared pool.
    pub shared: bool,
}

/// An instance's declaration.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Declaration {
    /// `(incarnation, revision)` that produced it.
    pub stamp: (u64, u64),
    /// Compartments by (tier, backend).
    pub compartments: BTreeMap<(StorageLevel, String), Compartment>,
}

/// All declarations.
#[derive(Clone, Debug, Default)]
pub struct CapacityRegistry {
    declarations: HashMap<String, Declaration>,
}

impl CapacityRegistry {
    /// Empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies an admitted batch (only `config` matters): a newer stamp
    /// replaces the declaration, an equal one adds a compartment, an older one
    /// is ignored.
    pub fn apply(&mut self, batch: &Batch) {
        if batch.event_type != EventType::Config {
            return;
        }
        let stamp = (batch.incarnation, batch.capacity_revision);
        let decl = self
            .declarations
            .entry(batch.instance_id.clone())
            .or_default();
        if stamp < decl.stamp {
            return;
        }
        if stamp > decl.stamp {
            decl.stamp = stamp;
            decl.compartments.clear();
        }
        decl.compartments.insert(
            (batch.tier, batch.backend.clone()),
            Compartment {
                capacity_bytes: batch.capacity_bytes,
                shared: batch.shared,
            },
        );
    }

    /// Forgets an instance (explicit deregistration).
    pub fn forget(&mut self, id: &str) {
        self.declarations.remove(id);
    }

    /// An instance's compartments.
    pub fn compartments(&self, id: &str) -> Option<&BTreeMap<(StorageLevel, String), Compartment>> {
        self.declarations.get(id).map(|d| &d.compartments)
    }

    /// Ids with a declaration.
    pub fn declarers(&self) -> impl Iterator<Item = &String> {
        self.declarations.keys()
    }

    /// Every declaration (checkpoint).
    pub fn declarations(&self) -> &HashMap<String, Declaration> {
        &self.declarations
    }

    /// Restores one declaration.
    pub fn restore(&mut self, id: String, decl: Declaration) {
        self.declarations.insert(id, decl);
    }

    /// Capacity of a shared pool: what its declarers agree on, else 0.
    pub fn shared_capacity(&self, tier: StorageLevel, backend: &str) -> u64 {
        let mut agreed: Option<u64> = None;
        for decl in self.declarations.values() {
            if let Some(c) = decl.compartments.get(&(tier, backend.to_owned()))
                && c.shared
            {
                match agreed {
                    None => agreed = Some(c.capacity_bytes),
                    Some(v) if v != c.capacity_bytes => return 0,
                    Some(_) => {}
                }
            }
        }
        agreed.unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::batch;

    fn config(
        id: &str,
        inc: u64,
        rev: u64,
        tier: StorageLevel,
        backend: &str,
        cap: u64,
        shared: bool,
    ) -> Batch {
        let mut b = batch(id, EventType::Config, tier, backend, shared, &[]);
        b.incarnation = inc;
        b.capacity_revision = rev;
        b.capacity_bytes = cap;
        b
    }

    #[test]
    fn stamps_replace_add_or_ignore() {
        let mut c = CapacityRegistry::new();
        c.apply(&config("a", 1, 0, StorageLevel::L1, "dram", 10, false));
        c.apply(&config("a", 1, 0, StorageLevel::L2, "fs", 20, false));
        assert_eq!(c.compartments("a").unwrap().len(), 2);
        c.apply(&config("a", 1, 1, StorageLevel::L1, "dram", 11, false));
        assert_eq!(
            c.compartments("a").unwrap().len(),
            1,
            "newer stamp replaces"
        );
        c.apply(&config("a", 1, 0, StorageLevel::L2, "fs", 99, false));
        assert_eq!(c.compartments("a").unwrap().len(), 1, "older stamp ignored");
        c.forget("a");
        assert!(c.compartments("a").is_none());
    }

    #[test]
    fn shared_capacity_requires_agreement() {
        let mut c = CapacityRegistry::new();
        c.apply(&config("a", 1, 0, StorageLevel::L2, "s3", 100, true));
        c.apply(&config("b", 1, 0, StorageLevel::L2, "s3", 100, true));
        assert_eq!(c.shared_capacity(StorageLevel::L2, "s3"), 100);
        c.apply(&config("c", 1, 0, StorageLevel::L2, "s3", 50, true));
        assert_eq!(c.shared_capacity(StorageLevel::L2, "s3"), 0);
    }
}
