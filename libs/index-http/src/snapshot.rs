//! The index server's `GET /snapshot` body: one definition, written by the
//! index server and read by the controller's poller and by `icctl`.
//!
//! Every field the server always writes is required when reading, so a
//! renamed or missing field fails the parse (and the poller reports an
//! error) instead of silently reading as zero. Fields a newer server adds
//! are ignored by older readers.

use serde::{Deserialize, Serialize};

/// The whole snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// When the server built it (RFC 3339, UTC, second precision).
    pub generated_at: String,
    /// Entries in the whole index.
    pub entries: u64,
    /// One row per (tenant, replica, dp rank, scope).
    pub replicas: Vec<SnapshotReplica>,
}

/// One replica row.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotReplica {
    /// Engine pod namespace.
    pub tenant: String,
    /// Engine pod name.
    pub replica_id: String,
    /// Data-parallel rank.
    pub dp_rank: u32,
    /// Engine serving address.
    pub address: String,
    /// Model served.
    pub model: String,
    /// Fingerprint domain (`vllm`, `sglang`).
    pub hash_scheme: String,
    /// LoRA adapter of the scope (empty: the base model).
    pub adapter: String,
    /// Entries held, all tiers.
    pub prefix_count: u64,
    /// Entries held at tier 1.
    pub t1_count: u64,
    /// Block size last reported.
    pub block_size: u32,
    /// Latest KV change (RFC 3339), null before the first.
    pub last_event_at: Option<String>,
    /// Latest anything from the replica (RFC 3339).
    pub last_seen_at: String,
    /// Engine KV memory in bytes, null when the engine does not export it
    /// (the pod's total, on its rank-0 row).
    pub cache_memory_bytes: Option<u64>,
    /// Tokens the engine's KV cache holds, null when not exported (the
    /// pod's total, on its rank-0 row). Absent from older servers.
    #[serde(default)]
    pub cache_capacity_tokens: Option<u64>,
    /// The subscriber's view misses batches at the start of the engine's
    /// stream that no replay could deliver: the replica holds blocks the
    /// index does not credit it with. Absent from older servers.
    #[serde(default)]
    pub history_incomplete: bool,
    /// Whether hit-rate statistics are reported.
    pub hit_rate_reported: bool,
    /// Cumulative tier-2 hits, null when the engine exports none.
    pub tier2_hits: Option<u64>,
    /// Cumulative tier-2 queries, null when the engine exports none.
    pub tier2_queries: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_field_fails_the_parse_and_an_added_one_is_ignored() {
        let row = SnapshotReplica {
            tenant: "ns".into(),
            replica_id: "pod".into(),
            prefix_count: 7,
            last_seen_at: "2026-12-01T00:00:00Z".into(),
            ..SnapshotReplica::default()
        };
        let snapshot = Snapshot {
            generated_at: "2026-12-01T00:00:01Z".into(),
            entries: 7,
            replicas: vec![row],
        };
        let mut wire = serde_json::to_value(&snapshot).unwrap_or_default();
        assert_eq!(wire["replicas"][0]["prefixCount"], 7);
        assert_eq!(
            serde_json::from_value::<Snapshot>(wire.clone()).ok(),
            Some(snapshot.clone())
        );
        wire["replicas"][0]["addedByANewerServer"] = serde_json::json!(1);
        assert_eq!(
            serde_json::from_value::<Snapshot>(wire.clone()).ok(),
            Some(snapshot)
        );
        if let Some(row) = wire["replicas"][0].as_object_mut() {
            let count = row.remove("prefixCount");
            row.insert("prefixes".into(), count.unwrap_or_default());
        }
        let err = serde_json::from_value::<Snapshot>(wire)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref().is_some_and(|e| e.contains("prefixCount")),
            "{err:?}"
        );
    }
}
