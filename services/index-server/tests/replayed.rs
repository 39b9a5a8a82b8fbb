//! Batches replayed from a log while catching up (Kafka) are history: the
//! prefill work and load they report is not queued now, and their replica
//! counts as seen when the log recorded them, so a pod deleted since does
//! not come back into lookups. Live batches are unchanged.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use ic_clock::ManualClock;
use ic_index::ingest::{IngestBatch, IngestSession, Step};
use ic_index::load::{EngineLoad, LoadSettings};
use ic_index::pick::{ScoreWeights, TtftModel};
use ic_index::speculative::SpeculationSettings;
use ic_index::{Change, Fingerprint, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};
use ic_index_server::index_core::{EngineFacts, IndexCore};
use ic_index_server::metrics::Metrics;
use ic_index_server::routing::Routing;

const NOW_S: i64 = 1_800_000_000;

fn core() -> IndexCore {
    let registry = ic_telemetry::MetricsRegistry::new("inferencecache", "test");
    let weights = ScoreWeights {
        ttft: Some(TtftModel {
            tokens_per_ms: 1.0,
            overhead_ms: 0.0,
        }),
        ..ScoreWeights::default()
    };
    IndexCore::new(
        Arc::new(Index::new(IndexConfig::default())),
        16,
        Metrics::register(&registry),
    )
    .with_routing(Routing::new(
        weights,
        LoadSettings::default(),
        SpeculationSettings::default(),
    ))
    .with_clock(Arc::new(ManualClock::at_second(NOW_S)))
}

fn key(replica: &str) -> ReplicaKey {
    ReplicaKey {
        tenant: "t".into(),
        replica_id: replica.into(),
        dp_rank: 0,
    }
}

/// A replica's resync then one batch storing 64 blocks of 16 tokens, with
/// an engine load report: (the resync's step, the store's step, facts).
fn steps(replica: &str) -> (Step, Step, EngineFacts) {
    let mut stream = IngestSession::default();
    let batch = |seq, resync, changes| IngestBatch {
        key: key(replica),
        scope: Scope {
            tenant: "t".into(),
            model: "m".into(),
            hash_scheme: HashScheme::Vllm,
            adapter: String::new(),
        },
        address: format!("{replica}:8000"),
        incarnation: 1,
        seq,
        resync_begin: resync,
        resync_end: resync,
        changes,
        tier2: None,
    };
    let stored = Change::Stored {
        start_depth: 0,
        fingerprints: (1..=64).map(Fingerprint).collect(),
        block_size: 16,
        tier: Tier::T1,
    };
    let resync = stream.accept(batch(1, true, Vec::new()));
    let store = stream.accept(batch(2, false, vec![stored]));
    let facts = EngineFacts {
        key: key(replica),
        load: Some(EngineLoad {
            waiting: 7,
            running: 3,
            kv_usage: 0.5,
        }),
        cache: None,
        history_incomplete: false,
    };
    (resync, store, facts)
}

#[test]
fn replayed_batches_queue_no_work_and_keep_their_own_time() {
    let now_ms = NOW_S * 1000;
    let core = core();

    // Live: 1,024 prompt tokens of work queued now, the load reported, seen now.
    let (resync, store, facts) = steps("live");
    core.ingest(resync, None).unwrap();
    core.ingest(store, Some(facts)).unwrap();
    let live = core.routing().load_board().load("live", now_ms);
    assert!(live.queued_ms >= 1000.0, "{live:?}");
    assert!(live.requests >= 10.0, "{live:?}");

    // Replayed from ten minutes ago: nothing queued or reported, and seen
    // then, not now.
    let then = now_ms - 600_000;
    let (resync, store, facts) = steps("replayed");
    core.ingest_replayed(resync, None, then).unwrap();
    core.ingest_replayed(store, Some(facts), then).unwrap();
    let replayed = core.routing().load_board().load("replayed", now_ms);
    assert_eq!(replayed.queued_ms, 0.0, "{replayed:?}");
    assert_eq!(replayed.requests, 0.0, "{replayed:?}");
    let seen = |id: &str| {
        core.index()
            .snapshot()
            .into_iter()
            .find(|r| r.key.replica_id == id)
            .map(|r| r.last_seen_ms)
    };
    assert_eq!(seen("live"), Some(now_ms));
    assert_eq!(seen("replayed"), Some(then));
    // Silent since: the replica GC forgets it at its next pass.
    assert_eq!(core.forget_silent(Duration::from_secs(300)), 1);
    assert_eq!(seen("replayed"), None);
    assert_eq!(seen("live"), Some(now_ms));

    // A log timestamp ahead of the server's clock counts as now.
    let (resync, _, _) = steps("ahead");
    core.ingest_replayed(resync, None, now_ms + 60_000).unwrap();
    assert_eq!(seen("ahead"), Some(now_ms));
}
