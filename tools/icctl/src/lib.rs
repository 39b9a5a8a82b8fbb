//! `icctl`: the operator CLI. Talks to the index server (gRPC LookupRoute,
//! HTTP /snapshot) and the coordinator (its REST API), prints tables for
//! people and JSON for machines (`-o json`).

pub mod check;
pub mod cli;
pub mod coordinator;
pub mod index;
pub mod parse;
pub mod table;
