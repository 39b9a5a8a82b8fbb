//! IngestEvents as a subscriber sends it, for tests and benchmarks that
//! feed an index server directly: one replica's full resync in one batch.

use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;

/// The replica a batch reports for.
#[derive(Clone, Copy, Debug)]
pub struct Replica<'a> {
    /// Index tenant (the engine's namespace).
    pub tenant: &'a str,
    /// Model as the engine reports it.
    pub model: &'a str,
    /// Pod name.
    pub replica_id: &'a str,
    /// Serving address, `ip:port`.
    pub address: &'a str,
    /// Data-parallel rank.
    pub dp_rank: u32,
}

/// `fingerprints` stored from the start of a prompt at `tier`.
pub fn stored(fingerprints: Vec<u64>, block_size: u32, tier: pb::Tier) -> pb::IndexEvent {
    pb::IndexEvent {
        kind: Some(pb::index_event::Kind::Stored(pb::BlocksStored {
            parent_fingerprint: 0,
            start_depth: 0,
            fingerprints,
            block_size,
            tier: tier as i32,
            at_unix_ms: 0,
        })),
    }
}

/// A whole resync of `replica` (vLLM fingerprints, incarnation 1,
/// sequence 1) holding what `events` store.
pub fn resync(replica: &Replica<'_>, events: Vec<pb::IndexEvent>) -> pb::IngestBatch {
    pb::IngestBatch {
        replica: Some(pb::ReplicaIdentity {
            scope: Some(pb::IndexScope {
                tenant: replica.tenant.into(),
                model: replica.model.into(),
                hash_scheme: pb::HashScheme::Vllm as i32,
                adapter: String::new(),
            }),
            replica_id: replica.replica_id.into(),
            address: replica.address.into(),
            dp_rank: replica.dp_rank,
            incarnation: 1,
        }),
        seq: 1,
        resync_begin: true,
        resync_end: true,
        events,
        tier2_stats: None,
        sent_at_unix_ms: 0,
        engine_load: None,
        engine_cache: None,
        history_incomplete: false,
        trace_context: std::collections::HashMap::new(),
    }
}

/// Sends `batch` on its own IngestEvents stream to the server at `grpc`
/// (`http://ip:port`) and panics unless it was applied.
pub async fn ingest(grpc: &str, batch: pb::IngestBatch) {
    let mut client = IndexServiceClient::connect(grpc.to_owned())
        .await
        .unwrap_or_else(|e| panic!("cannot reach the index server at {grpc}: {e}"));
    let ack = client
        .ingest_events(futures::stream::iter(vec![batch]))
        .await
        .unwrap_or_else(|e| panic!("IngestEvents failed: {e}"))
        .into_inner();
    assert!(!ack.resync_required, "batch not applied: {ack:?}");
}

/// An observe-only `LookupRoute` for `tokens` in `tenant`'s `model` (vLLM
/// hashing): asks who holds the prompt without counting a pick.
pub fn token_lookup(tenant: &str, model: &str, tokens: Vec<u32>) -> pb::LookupRouteRequest {
    pb::LookupRouteRequest {
        scope: Some(pb::IndexScope {
            tenant: tenant.into(),
            model: model.into(),
            hash_scheme: pb::HashScheme::Vllm as i32,
            adapter: String::new(),
        }),
        key: Some(pb::lookup_route_request::Key::TokenIds(pb::TokenIds {
            ids: tokens,
        })),
        observe_only: true,
        ..Default::default()
    }
}
