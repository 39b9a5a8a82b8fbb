//! `ic-coordinator-client`: what talks to a running coordinator over its
//! REST API from outside it, kept apart from the service so a CLI can use
//! it without the service's Kafka, Kubernetes and HTTP-server stack.
//!
//! Its errors are `anyhow` chains: both callers are binaries that print
//! them with `{:#}`, and each step adds the file or call it was on.

pub mod replay;
