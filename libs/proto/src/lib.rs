//! The `inferencecache.index.v1` gRPC contract, generated from
//! `proto/inferencecache/index/v1/index.proto` at build time.
//!
//! The `.proto` file is the source of truth and documents every message and
//! field; this crate only re-exports the generated types.

#![allow(missing_docs, unreachable_pub, clippy::all)]

/// `inferencecache.index.v1`: LookupRoute, IngestEvents, SetPolicies.
pub mod index_v1 {
    tonic::include_proto!("inferencecache.index.v1");
}

pub use index_v1::index_service_client::IndexServiceClient;
pub use index_v1::index_service_server::{IndexService, IndexServiceServer};
