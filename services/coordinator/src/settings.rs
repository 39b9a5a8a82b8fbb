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
    /// Most `POST /events` requests queued for the event writer.
    pub max_pending_event_requests: usize,
    /// How much one token request (a lookup, a pin) may ask for.
    pub request_limits: ic_coordinator_core::resolve::RequestLimits,
    /// Timeout of every call to an MP server.
    pub mp_timeout: Duration,
    /// Largest request body accepted (413 past it).
    pub max_body_bytes: usize,
}

/// Resident memory one directory key may cost with its usage and LRU
/// entries at the worst moment, rounded up: a restart of 10 M keys peaks
/// at 176 B a key (the release server, 2026-12-06; 239–243 B in process
/// before the checkpoint was read as decoded; docs/benchmarks.md,
/// "Coordinator memory and restart"), and a checkpoint holds its
/// ~94 B-a-key image in memory while it is written; so the bound also
/// survives a restart and a checkpoint.
pub const DIRECTORY_KEY_BYTES: u64 = 400;

/// The default `--max-directory-keys`: half the memory limit's worth of
/// keys (the rest is the process, requests in flight and a checkpoint's
/// copy), or 10 M without a limit.
pub fn default_directory_keys(memory_limit: Option<u64>) -> usize {
    match memory_limit {
        Some(limit) => {
            usize::try_from((limit / 2 / DIRECTORY_KEY_BYTES).max(1)).unwrap_or(usize::MAX)
        }
        None => 10_000_000,
    }
}

/// The container's memory limit from its cgroup (v2 `memory.max`, else v1
/// `memory.limit_in_bytes`); `None` when unlimited or unreadable.
pub fn memory_limit_bytes() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let raw = read("/sys/fs/cgroup/memory.max")
        .or_else(|| read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))?;
    // "max" (v2) or a huge page-rounded number (v1) means no limit.
    raw.trim().parse::<u64>().ok().filter(|&b| b < 1 << 60)
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
            max_pending_event_requests: 128,
            request_limits: ic_coordinator_core::resolve::RequestLimits::default(),
            mp_timeout: crate::mp::MP_TIMEOUT,
            max_body_bytes: crate::http::MAX_BODY_BYTES,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_bound_follows_the_memory_limit() {
        // The chart's 1 GiB limit: half of it at 400 B a key.
        let keys = default_directory_keys(Some(1 << 30));
        assert_eq!(keys, 1_342_177);
        assert!(keys as u64 * DIRECTORY_KEY_BYTES <= (1 << 30) / 2);
        assert_eq!(default_directory_keys(None), 10_000_000);
        assert_eq!(default_directory_keys(Some(10)), 1);
    }
}
