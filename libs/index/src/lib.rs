//! The prefix index: which replica holds which content-fingerprinted block,
//! and which replica holds the longest prefix of a prompt; [`route`] turns a
//! lookup into a routing decision under a namespace's policy, and
//! [`ingest`] holds the stream protocol (resync and sequence) every ingest
//! front end shares; [`pick`] scores the replicas by prefix and [`load`],
//! counting recent picks as [`speculative`] holders; [`pod_scores`]
//! answers llm-d's remote indexer API from the same matches. Pure: no I/O, no
//! clocks (callers pass times in), safe to share between threads.
//!
//! Entries are keyed by `(scope, fingerprint)`, where the scope is
//! `(tenant, model, hash_scheme, adapter)`. Replicas belong to exactly one
//! scope, so a lookup can only ever see replicas of its own tenant, model,
//! scheme and adapter — isolation is structural, not a filter that could be
//! forgotten.
//!
//! Blocks are stored as records in the order engines reported them, so a
//! lookup walking a prompt mostly reads the record right after the last one
//! (see `store`); ingest holds one page or key-shard lock at a time,
//! mostly for a few records, so lookups do not wait for ingest batches.

mod arena;
pub mod dump;
mod holders;
mod index;
pub mod ingest;
mod keys;
pub mod load;
mod lookup;
pub mod pick;
pub mod pod_scores;
mod prefetch;
mod registry;
pub mod route;
pub mod sharded;
pub mod speculative;
mod store;
mod types;

pub use index::{DEFAULT_MAX_REPLICAS, DEFAULT_MAX_SCOPES, Index, IndexConfig, MAX_REPLICA_SLOTS};
pub use types::{
    Candidate, Change, ContentError, Deadline, Fingerprint, HashScheme, IndexMemory, LookupOutcome,
    LookupView, Match, NoDeadline, ReplicaKey, ReplicaSnapshot, Scope, ScopeHandle, Tier,
};

#[cfg(test)]
mod route_tests;
#[cfg(test)]
mod tests;
