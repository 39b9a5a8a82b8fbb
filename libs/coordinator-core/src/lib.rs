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
pub mod lax;
pub mod lookup;
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

/// An LMCache storage level as its events name it (their `tier` field):
/// `l1` memory, `l2` storage. Not an engine replica's tier
/// (T1/T2); `all` exists only as a filter ([`LevelFilter`]).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum StorageLevel {
    /// Process memory of a node (`dram`, `devdax`, `gds`).
    L1,
    /// Storage behind a node (`fs`, `s3`, ...), possibly shared.
    L2,
}

impl TryFrom<String> for StorageLevel {
    type Error = String;

    // Through a string so every serde format (JSON, msgpack values) reads it.
    fn try_from(s: String) -> Result<Self, Self::Error> {
        match s.as_str() {
            "l1" => Ok(StorageLevel::L1),
            "l2" => Ok(StorageLevel::L2),
            other => Err(format!("unknown tier {other:?}; expected 'l1' or 'l2'")),
        }
    }
}

impl StorageLevel {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            StorageLevel::L1 => "l1",
            StorageLevel::L2 => "l2",
        }
    }
}

/// A level selector in queries (the API's `tier` parameter): one level
/// or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LevelFilter {
    /// Only L1.
    L1,
    /// Only L2.
    L2,
    /// Both tiers.
    #[default]
    All,
}

impl LevelFilter {
    /// Whether `tier` passes the filter.
    pub fn matches(self, tier: StorageLevel) -> bool {
        match self {
            LevelFilter::All => true,
            LevelFilter::L1 => tier == StorageLevel::L1,
            LevelFilter::L2 => tier == StorageLevel::L2,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            LevelFilter::L1 => "l1",
            LevelFilter::L2 => "l2",
            LevelFilter::All => "all",
        }
    }

    /// Whether the filter includes L2.
    pub fn touches_l2(self) -> bool {
        self != LevelFilter::L1
    }
}
