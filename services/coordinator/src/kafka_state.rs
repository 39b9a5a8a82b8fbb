//! What the Kafka consumer (`kafka.rs`) and the rest of the coordinator
//! share: the resolved Kafka flags and the consumer's status. Kept apart so
//! the coordinator's state depends on these types only, and the consumer
//! loop depends on the state — one way.

use std::collections::BTreeMap;

use parking_lot::Mutex;

/// Kafka flags, resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaSettings {
    /// `bootstrap.servers`.
    pub bootstrap_servers: String,
    /// Topic of cache events.
    pub topic: String,
    /// `group.id` (identifies the client to the broker; never a cursor).
    pub group_id: String,
    /// `/ready` stays false until every partition is within this many
    /// records of its high watermark (`None`: ready at once).
    pub max_ready_lag: Option<u64>,
}

/// What the consumer last saw, for `/status` and `/ready`.
#[derive(Debug, Default)]
pub struct KafkaStatus {
    /// The last broker call succeeded.
    pub connected: bool,
    /// The last failure, kept until the next success.
    pub last_error: Option<String>,
    /// Failed broker calls since start.
    pub failures: u64,
    /// Partitions currently assigned.
    pub assigned: Vec<i32>,
    /// `(low, high)` watermark per partition, as last fetched.
    pub watermarks: BTreeMap<i32, (i64, i64)>,
    /// Set once every partition was within `--max-ready-lag`; readiness is
    /// a startup gate, so a later burst does not pull the pod out of service.
    pub caught_up: bool,
}

/// Shared between the consumer thread and HTTP handlers.
#[derive(Debug, Default)]
pub struct KafkaState {
    /// Latest consumer status.
    pub status: Mutex<KafkaStatus>,
}
