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

/// Why an entry's claimed size is refused (`POST /events` stays open for
/// LMCache's MP servers, so one event may not claim more than the bounds).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// Larger than the capacity the instance declared for the compartment.
    #[error(
        "size_bytes {size} exceeds the capacity {capacity} that {instance} declared for {tier}/{backend}"
    )]
    OverCapacity {
        /// Entry index in the batch.
        entry: usize,
        /// Claimed size.
        size: u64,
        /// Declared capacity.
        capacity: u64,
        /// Reporter.
        instance: String,
        /// Tier.
        tier: &'static str,
        /// Backend.
        backend: String,
    },
    /// Larger than `--max-event-entry-bytes`.
    #[error(
        "size_bytes {size} exceeds the largest an entry may claim ({max}, --max-event-entry-bytes)"
    )]
    OverMax {
        /// Entry index in the batch.
        entry: usize,
        /// Claimed size.
        size: u64,
        /// The bound.
        max: u64,
    },
}

impl ClaimError {
    /// Index of the refused entry.
    pub fn entry(&self) -> usize {
        match self {
            Self::OverCapacity { entry, .. } | Self::OverMax { entry, .. } => *entry,
        }
    }

    /// Metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::OverCapacity { .. } => "over_declared_capacity",
            Self::OverMax { .. } => "over_max_entry_bytes",
        }
    }
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

    /// Checks what a store batch's entries claim: none may exceed
    /// `max_entry` nor the capacity the reporter declared for the batch's
    /// compartment (when it declared one).
    pub fn check_claims(&self, batch: &Batch, max_entry: Option<u64>) -> Result<(), ClaimError> {
        if batch.event_type != EventType::Store {
            return Ok(());
        }
        let capacity = self
            .declarations
            .get(&batch.instance_id)
            .and_then(|d| d.compartments.get(&(batch.tier, batch.backend.clone())))
            .map_or(0, |c| c.capacity_bytes);
        for (entry, e) in batch.entries.iter().enumerate() {
            if let Some(max) = max_entry
                && e.size_bytes > max
            {
                return Err(ClaimError::OverMax {
                    entry,
                    size: e.size_bytes,
                    max,
                });
            }
            if capacity > 0 && e.size_bytes > capacity {
                return Err(ClaimError::OverCapacity {
                    entry,
                    size: e.size_bytes,
                    capacity,
                    instance: batch.instance_id.clone(),
                    tier: batch.tier.as_str(),
                    backend: batch.backend.clone(),
                });
            }
        }
        Ok(())
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
