//! The coordinator's settings, resolved from its flags (`Config::settings`
//! in lib.rs). A leaf: every handle reads them, none is read by them.

use std::path::PathBuf;
use std::time::Duration;

use ic_coordinator_core::eviction::EvictionSettings;

use crate::kafka_state::KafkaSettings;

/// Settings resolved from the flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Tokens per chunk.
    pub chunk_size: usize,
    /// Silence before an instance is dropped.
    pub instance_timeout: Duration,
    /// Liveness sweep period (`None` disables it).
    pub health_check_interval: Option<Duration>,
    /// Eviction sweep period (`None` disables it).
    pub eviction_check_interval: Option<Duration>,
    /// Watermark and ratio.
    pub eviction: EvictionSettings,
    /// Checkpoint file.
    pub checkpoint_path: Option<PathBuf>,
    /// Checkpoint period (`None` = only at a clean stop).
    pub checkpoint_interval: Option<Duration>,
    /// Metadata file.
    pub metadata_path: Option<PathBuf>,
    /// `/metrics` answers 404.
    pub disable_metrics: bool,
    /// Events come from Kafka instead of `POST /events`.
    pub kafka: Option<KafkaSettings>,
    /// Bound on the directory's keys (`None`: unbounded).
    pub max_directory_keys: Option<usize>,
    /// `POST /events` needs the operator credentials.
    pub events_require_auth: bool,
    /// Largest size one event entry may claim (`None`: only the declared
    /// capacity bounds it).
    pub max_event_entry_bytes: Option<u64>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            chunk_size: 256,
            instance_timeout: Duration::from_secs(30),
            health_check_interval: Some(Duration::from_secs(10)),
            eviction_check_interval: Some(Duration::from_secs(5)),
            eviction: EvictionSettings::default(),
            checkpoint_path: None,
            checkpoint_interval: Some(Duration::from_secs(60)),
            metadata_path: None,
            disable_metrics: false,
            kafka: None,
            max_directory_keys: Some(10_000_000),
            events_require_auth: false,
            max_event_entry_bytes: Some(1 << 30),
        }
    }
}
