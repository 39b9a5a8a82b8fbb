//! Process plumbing shared by every InferenceCache binary.
//!
//! Each service needs the same things around its real work: flags for logging,
//! a tracing subscriber, a Prometheus registry, an admin HTTP server with
//! `/live`, `/ready` and `/metrics`, and a shutdown signal that fires on
//! SIGTERM/SIGINT, and a report of where it listens ([`listening`]). They
//! live here once so every binary behaves the same way for the platform team
//! operating it.

pub mod admin;
pub mod drain;
pub mod idle;
pub mod listening;
pub mod logging;
pub mod metrics;
pub mod otel;
pub mod process;
pub mod process_metrics;
pub mod repoll;
pub mod serving;
pub mod shutdown;
pub mod tls;

pub use admin::{AdminServer, Health};
pub use logging::{LogArgs, LogFormat};
pub use metrics::MetricsRegistry;
pub use process::{CHECK_ARGS_ENV, check_args_requested, run_service};
pub use shutdown::shutdown_token;
