//! Pure logic of the LMCache-compatible fleet coordinator.
//!
//! Everything here is deterministic and free of I/O so each rule of the
//! contract can be unit-tested directly: the wire schema of cache events and
//! keys, token → key resolution, the event gate, the shared views (registry,
//! key directory, usage and declared capacity), the eviction planner with its
//! quotas and pins, and the on-disk formats (checkpoint, metadata, `.lct`
//! traces). The service crate wraps these in locks, HTTP and timers.

pub mod capacity;
pub mod checkpoint;
pub mod directory;
pub mod events;
pub mod eviction;
pub mod gate;
pub mod kafka;
pub mod key;
pub mod metadata;
pub mod pins;
pub mod registry;
pub mod resolve;
pub mod trace;
pub mod usage;

#[cfg(test)]
mod testutil;

pub use key::{KeyError, ObjectKey, SharedKey, WireKey};

/// Hash map of the hot views: keys are not attacker-chosen in a way that
/// matters here (emitters are trusted MP servers), so a fast hasher is used.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// Hash set companion of [`FastMap`].
pub type FastSet<T> = std::collections::HashSet<T, foldhash::fast::RandomState>;

/// A cache tier as events name it. `all` exists only as a filter ([`TierFilter`]).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum Tier {
    /// Process memory of a node (`dram`, `devdax`, `gds`).
    L1,
    /// Storage behind a node (`fs`, `s3`, ...), possibly shared.
    L2,
}

impl TryFrom<String> for Tier {
    type Error = String;

    // Through a string so every serde format (JSON, msgpack values) reads it.
    fn try_from(s: String) -> Result<Self, Self::Error> {
        match s.as_str() {
            "l1" => Ok(Tier::L1),
            "l2" => Ok(Tier::L2),
            other => Err(format!("unknown tier {other:?}; expected 'l1' or 'l2'")),
        }
    }
}

impl Tier {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::L1 => "l1",
            Tier::L2 => "l2",
        }
    }
}

/// A tier selector in queries: one tier or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierFilter {
    /// Only L1.
    L1,
    /// Only L2.
    L2,
    /// Both tiers.
    #[default]
    All,
}

impl TierFilter {
    /// Whether `tier` passes the filter.
    pub fn matches(self, tier: Tier) -> bool {
        match self {
            TierFilter::All => true,
            TierFilter::L1 => tier == Tier::L1,
            TierFilter::L2 => tier == Tier::L2,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TierFilter::L1 => "l1",
            TierFilter::L2 => "l2",
            TierFilter::All => "all",
        }
    }

    /// Whether the filter includes L2.
    pub fn touches_l2(self) -> bool {
        self != TierFilter::L1
    }
}
