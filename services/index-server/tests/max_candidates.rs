//! LookupRoute's `max_candidates`: a shorter answer, the same ranking.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ic_index::{Change, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};
use ic_index_server::grpc::IndexServer;
use ic_index_server::metrics::Metrics;
use ic_kvevents::chain_fingerprints;
use ic_proto::index_v1 as pb;
use ic_proto::index_v1::lookup_route_request::Key;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[test]
fn max_candidates_shortens_the_list_and_keeps_best_and_order() {
    let registry = ic_telemetry::MetricsRegistry::new("inferencecache", "test");
    let s = IndexServer::new(
        Arc::new(Index::new(IndexConfig::default())),
        16,
        Metrics::register(&registry),
    );
    let tokens: Vec<u32> = (0..64).collect();
    let fps = chain_fingerprints(None, &tokens, 16);
    let scope = Scope {
        tenant: "t".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    };
    // Four holders of 4, 3, 2 and 1 blocks.
    for (id, blocks) in [("a", 4), ("b", 3), ("c", 2), ("d", 1)] {
        let key = ReplicaKey {
            tenant: "t".into(),
            replica_id: id.into(),
            dp_rank: 0,
        };
        let change = Change::Stored {
            start_depth: 0,
            fingerprints: fps[..blocks].to_vec(),
            block_size: 16,
            tier: Tier::T1,
        };
        assert!(
            s.index()
                .apply(&key, &scope, &format!("{id}:8000"), &[change], now_ms())
                .is_empty()
        );
    }
    let lookup = |max_candidates: u32| {
        s.lookup(&pb::LookupRouteRequest {
            scope: Some(pb::IndexScope {
                tenant: "t".into(),
                model: "m".into(),
                hash_scheme: pb::HashScheme::Vllm as i32,
                adapter: String::new(),
            }),
            key: Some(Key::BlockHashes(pb::BlockHashes {
                hashes: ic_kvevents::Fingerprint::to_raw(fps.clone()),
            })),
            // Not counted as picks: every lookup sees the same loads.
            observe_only: true,
            max_candidates,
            ..Default::default()
        })
        .unwrap()
    };
    let all = lookup(0);
    assert_eq!(all.outcome, pb::LookupOutcome::PrefixMatch as i32);
    assert_eq!(all.candidates.len(), 4);
    for n in [1, 2, 3, 4, 5, u32::MAX] {
        let short = lookup(n);
        let kept = all.candidates.len().min(n as usize);
        assert_eq!(
            short.candidates,
            all.candidates[..kept],
            "max_candidates {n}"
        );
        assert_eq!(short.best, all.best, "max_candidates {n}");
        assert_eq!(
            (short.outcome, short.prompt_blocks, short.block_size),
            (all.outcome, all.prompt_blocks, all.block_size)
        );
    }
}
