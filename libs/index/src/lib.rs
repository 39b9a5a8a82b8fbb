//! The prefix index: which replica holds which content-fingerprinted block,
//! and which replica holds the longest prefix of a prompt. Pure: no I/O, no
//! clocks (callers pass times in), safe to share between threads.
//!
//! Entries are keyed by `(scope, fingerprint)`, where the scope is
//! `(tenant, model, hash_scheme, adapter)`. Replicas belong to exactly one
//! scope, so a lookup can only ever see replicas of its own tenant, model,
//! scheme and adapter — isolation is structural, not a filter that could be
//! forgotten.
//!
//! The map is split into shards behind their own locks; ingest locks one
//! shard per block, so a lookup never waits for more than one block's write.

mod index;
mod slots;
mod table;
mod types;

pub use index::{Index, IndexConfig};
pub use types::{
    Candidate, Change, ContentError, Fingerprint, HashScheme, LookupOutcome, ReplicaKey,
    ReplicaSnapshot, Scope, Tier,
};

#[cfg(test)]
mod tests;
