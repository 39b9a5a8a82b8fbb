//! `ic-sim`: what runs the InferenceCache data plane without real engines,
//! shared by the tools (`ic-local-fleet`, `ic-loadgen`) and the tests
//! (`ic-e2e` re-exports it):
//!
//! * [`engine`]: a stand-in engine speaking the real KV-event wire (ZMQ
//!   PUB and replay ROUTER), and a publisher of garbage frames;
//! * [`process`]: the real binaries as child processes, with the addresses
//!   they bound read back from their `--listen-report` file;
//! * [`freeze`]: SIGSTOP and SIGCONT that return once every thread of the
//!   process has stopped, or runs again;
//! * [`ext_proc`]: what a gateway sends an endpoint picker;
//! * [`ingest`]: IngestEvents batches as a subscriber sends them;
//! * [`tansu`]: where the Kafka-protocol broker the tests run is found.
//!
//! The helpers panic on failure: their callers are tests and tools whose
//! run cannot go on without the process or socket they asked for.

pub mod engine;
pub mod ext_proc;
pub mod freeze;
pub mod ingest;
pub mod process;
pub mod tansu;

pub use process::{PROCESS_TIMEOUT, ServiceProcess, http_get, metric_value};
