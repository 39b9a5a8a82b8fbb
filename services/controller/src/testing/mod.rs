//! Test support shipped with the library so integration tests (and other
//! crates' tests) can drive the controller against an API server: an
//! in-memory stateful fake (see [`fake_api`]).

pub mod fake_api;

pub use fake_api::{FakeApi, RecordedRequest};
