//! The index server's HTTP contract, beside its gRPC one (`ic-proto`):
//! the wire shapes its admin endpoints answer with, defined once for the
//! server that writes them and every reader. Plain serde types, so a pure
//! crate (the controller's attribution) can read them without tonic or
//! kube.

pub mod snapshot;

pub use snapshot::{Snapshot, SnapshotReplica};
