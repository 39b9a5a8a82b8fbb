//! One fuzz target per kind of untrusted input the binaries read, each
//! driving the same code the binary runs on it (not a copy of a parser):
//!
//! | target | input | what runs |
//! |---|---|---|
//! | `kv_event_batch` | an engine's msgpack payload | `wire::decode_batch`, then the subscriber's replica state applies it |
//! | `zmq_frames` | a multipart message (see [`split_frames`]) | live-message and replay-reply framing, then the payload decoder |
//! | `pod_review` | an AdmissionReview body | the pod webhook's `mutate` against fixed CacheBackends |
//! | `cachebackend_review` | an AdmissionReview body | the CacheBackend webhook's defaulting and validation |
//! | `coordinator_body` | route selector byte + JSON body | the coordinator's whole HTTP router, in process |
//! | `checkpoint_file` | a checkpoint (v1 or v2) or metadata file | `checkpoint::decode_file` and `metadata::decode` |
//! | `trace_file` | a `.lct` trace | the trace reader, to its end |
//! | `lookup_route` | a protobuf `LookupRouteRequest` | the index server's lookup over a populated index |
//! | `ingest_events` | length-delimited protobuf `IngestBatch`es | one ingest stream applying them to an index |
//!
//! A target returns normally for every input; a panic, an abort or a hang
//! is a finding. `tests/corpora.rs` replays every committed input of
//! `corpus/<target>/` in the default suite; `./dev.sh fuzz` runs the
//! targets under libFuzzer (`fuzz/libfuzzer/`).

use std::sync::{Arc, OnceLock};

use ic_proto::index_v1 as pb;

/// A fuzz target: takes any bytes, returns normally.
pub type Target = fn(&[u8]);

/// Every target by name (the directory names under `corpus/`).
pub const TARGETS: &[(&str, Target)] = &[
    ("kv_event_batch", kv_event_batch),
    ("zmq_frames", zmq_frames),
    ("pod_review", pod_review),
    ("cachebackend_review", cachebackend_review),
    ("coordinator_body", coordinator_body),
    ("checkpoint_file", checkpoint_file),
    ("trace_file", trace_file),
    ("lookup_route", lookup_route),
    ("ingest_events", ingest_events),
];

/// Splits fuzz input into at most 8 frames: the first byte is the frame
/// count (mod 8), then each frame is a little-endian `u16` length and its
/// bytes (a length past the end takes what is left).
pub fn split_frames(data: &[u8]) -> Vec<&[u8]> {
    let Some((&count, mut rest)) = data.split_first() else {
        return Vec::new();
    };
    let mut frames = Vec::new();
    for _ in 0..count % 8 {
        let (len, tail) = match rest {
            [a, b, tail @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), tail),
            _ => (0, &[][..]),
        };
        let len = len.min(tail.len());
        frames.push(&tail[..len]);
        rest = &tail[len..];
    }
    frames
}

/// The inverse of [`split_frames`], for seeding corpora.
pub fn join_frames(frames: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![u8::try_from(frames.len()).unwrap_or(0)];
    for frame in frames {
        let len = u16::try_from(frame.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&frame[..usize::from(len)]);
    }
    out
}

/// A KV-event payload: decoded, then applied to a replica's state as the
/// subscriber does, and the resulting snapshot taken.
pub fn kv_event_batch(data: &[u8]) {
    let Ok(batch) = ic_kvevents::wire::decode_batch(data) else {
        return;
    };
    let mut replica = ic_kvevents::ReplicaState::new(ic_kvevents::ReplicaConfig::default());
    let (mut changes, mut stats) = (Vec::new(), ic_kvevents::ApplyStats::default());
    replica.apply_batch(&batch, &mut changes, &mut stats);
    // The same batch again exercises the paths for blocks already held.
    replica.apply_batch(&batch, &mut changes, &mut stats);
    let _ = replica.snapshot();
}

/// A multipart message read from the engine's PUB socket or its replay
/// ROUTER.
pub fn zmq_frames(data: &[u8]) {
    let frames = split_frames(data);
    if let Ok(message) = ic_kvevents::frames::parse_event_message(&frames) {
        kv_event_batch(message.payload);
    }
    if let Ok(ic_kvevents::frames::ReplayReply::Batch { payload, .. }) =
        ic_kvevents::frames::parse_replay_reply(&frames)
    {
        kv_event_batch(payload);
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a tokio runtime for the fuzz targets: {e}"))
    })
}

/// CacheBackends the pod webhook sees in every namespace.
#[derive(Debug)]
struct FixedBackends(Vec<ic_api::CacheBackend>);

impl ic_webhook::pod::BackendSource for FixedBackends {
    fn list<'a>(&'a self, _namespace: &'a str) -> ic_webhook::pod::ListFuture<'a> {
        Box::pin(async move { Ok(self.0.clone()) })
    }
}

fn fixed_backends() -> &'static FixedBackends {
    static BACKENDS: OnceLock<FixedBackends> = OnceLock::new();
    BACKENDS.get_or_init(|| {
        let backends: Vec<ic_api::CacheBackend> =
            serde_json::from_str(include_str!("../data/cachebackends.json"))
                .unwrap_or_else(|e| panic!("fuzz/data/cachebackends.json: {e}"));
        FixedBackends(backends)
    })
}

/// An AdmissionReview for the pod webhook (`/mutate-pod`).
pub fn pod_review(data: &[u8]) {
    let Ok(request) = ic_webhook::review::AdmissionReview::parse(data) else {
        return;
    };
    let config = ic_adapters::admission::InjectionConfig {
        subscriber_image: Some("registry.example/ic-kvevent-subscriber:fuzz".into()),
        index_server: "https://inferencecache-index-server.inferencecache:9090".into(),
        index_server_audience: Some("inferencecache-index-server".into()),
        index_server_ca_pem: Some(
            "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n".into(),
        ),
        subscriber_otlp_endpoint: Some("http://$(HOST_IP):4317".into()),
        index_server_discovery: Default::default(),
        image_pull_secrets: Vec::new(),
        subscriber_kafka: None,
    };
    let decision = runtime().block_on(ic_webhook::pod::mutate(&request, fixed_backends(), &config));
    let _ = decision.response.into_review();
}

/// An AdmissionReview for the CacheBackend webhooks (defaulting and
/// validation).
pub fn cachebackend_review(data: &[u8]) {
    let Ok(request) = ic_webhook::review::AdmissionReview::parse(data) else {
        return;
    };
    let _ = ic_webhook::cachebackend::default(&request)
        .response
        .into_review();
    let _ = ic_webhook::cachebackend::validate(&request)
        .response
        .into_review();
}

/// The coordinator's routes that read a body or a path from the caller;
/// the first input byte picks one (mod the count).
pub const COORDINATOR_ROUTES: &[(&str, &str)] = &[
    ("POST", "/instances"),
    ("PUT", "/instances/i-0/heartbeat"),
    ("DELETE", "/instances/i-0"),
    ("POST", "/events"),
    ("POST", "/directory/lookup"),
    ("POST", "/directory/blend-lookup"),
    ("PUT", "/quota/config"),
    ("PUT", "/quota/salt-a"),
    ("DELETE", "/quota/salt-a"),
    ("POST", "/cache/pins"),
    ("DELETE", "/cache/pins"),
    ("POST", "/cache/delete"),
    ("POST", "/cache/prefetches"),
    ("GET", "/directory/keys?limit=5&offset=0"),
    ("GET", "/cache/pins?limit=5"),
];

#[derive(Debug, clap::Parser)]
struct CoordinatorCli {
    #[command(flatten)]
    config: ic_coordinator::Config,
}

fn coordinator_router() -> &'static axum::Router {
    static ROUTER: OnceLock<axum::Router> = OnceLock::new();
    ROUTER.get_or_init(|| {
        use clap::Parser;
        // Background loops off: every request is handled on its own.
        let cli = CoordinatorCli::parse_from([
            "ic-coordinator",
            "--health-check-interval",
            "0",
            "--eviction-check-interval",
            "0",
        ]);
        let clock = Arc::new(ic_coordinator::clock::ManualClock::at_second(1_700_000_000));
        let app = ic_coordinator::build(&cli.config, clock)
            .unwrap_or_else(|e| panic!("an in-process coordinator: {e:#}"));
        ic_coordinator::http::router(app)
    })
}

/// One request to the coordinator's HTTP API: route selector byte, then
/// the body (sent as JSON).
pub fn coordinator_body(data: &[u8]) {
    use tower::ServiceExt;
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let (method, path) = COORDINATOR_ROUTES[usize::from(selector) % COORDINATOR_ROUTES.len()];
    let Ok(request) = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_vec()))
    else {
        return;
    };
    runtime().block_on(async {
        let Ok(response) = coordinator_router().clone().oneshot(request).await;
        // A handler that panicked would have unwound through here; a 5xx
        // for malformed input is a finding as well. 502 is not: it is the
        // API's answer when an instance a request is relayed to (prefetch)
        // cannot be reached, and fuzz inputs register instances that do
        // not exist.
        let status = response.status();
        let body = http_body_util::BodyExt::collect(response.into_body()).await;
        assert!(
            !status.is_server_error() || status == axum::http::StatusCode::BAD_GATEWAY,
            "{method} {path} answered {status}: {:?}",
            body.map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        );
    });
}

/// A checkpoint (version 1 or 2, as the coordinator reads it at start-up)
/// or a metadata file.
pub fn checkpoint_file(data: &[u8]) {
    let _ = ic_coordinator_core::checkpoint::decode_file(data);
    let _ = ic_coordinator_core::metadata::decode(data);
}

/// A `.lct` trace replayed by `ic-coordinator replay`.
pub fn trace_file(data: &[u8]) {
    let Ok(reader) = ic_coordinator_core::trace::TraceReader::open(data) else {
        return;
    };
    // The reader stops after the first error; cap the walk regardless.
    for event in reader.take(100_000) {
        if event.is_err() {
            break;
        }
    }
}

const TENANT: &str = "team-a";
const MODEL: &str = "meta-llama/Llama-3.1-8B";

fn scope_pb() -> pb::IndexScope {
    pb::IndexScope {
        tenant: TENANT.into(),
        model: MODEL.into(),
        hash_scheme: pb::HashScheme::Vllm as i32,
        adapter: String::new(),
    }
}

fn index_server() -> ic_index_server::grpc::IndexServer {
    let index = Arc::new(ic_index::Index::new(ic_index::IndexConfig {
        capacity_entries: 100_000,
        shards: 4,
        ..ic_index::IndexConfig::default()
    }));
    let registry = ic_telemetry::MetricsRegistry::new("inferencecache", "fuzz");
    let metrics = ic_index_server::metrics::Metrics::register(&registry);
    ic_index_server::grpc::IndexServer::new(index, 16, metrics)
}

/// A whole resync of `replica` holding the chain of the tokens 0..64·16.
pub fn seed_resync(replica: &str) -> pb::IngestBatch {
    let tokens: Vec<u32> = (0..64 * 16).collect();
    let fingerprints = ic_kvevents::chain_fingerprints(None, &tokens, 16);
    ic_sim::ingest::resync(
        &ic_sim::ingest::Replica {
            tenant: TENANT,
            model: MODEL,
            replica_id: replica,
            address: "10.0.0.1:8000",
            dp_rank: 0,
        },
        vec![ic_sim::ingest::stored(
            ic_kvevents::Fingerprint::to_raw(fingerprints),
            16,
            pb::Tier::T1,
        )],
    )
}

fn populated_index_server() -> &'static ic_index_server::grpc::IndexServer {
    static SERVER: OnceLock<ic_index_server::grpc::IndexServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let server = index_server();
        for replica in ["engine-0", "engine-1"] {
            let mut stream = ic_index_server::ingest::IngestStream::with_limits(Default::default());
            server
                .apply_batch(&mut stream, seed_resync(replica))
                .unwrap_or_else(|e| panic!("seeding the fuzz index: {e}"));
        }
        server
    })
}

/// A LookupRoute request from a gateway.
pub fn lookup_route(data: &[u8]) {
    let Ok(request) = <pb::LookupRouteRequest as prost::Message>::decode(data) else {
        return;
    };
    // Lookups that route (not observe-only) change load and speculation
    // state; a shared server keeps that state across inputs, as in
    // production.
    let _ = populated_index_server().lookup(&request);
}

/// An IngestEvents stream: length-delimited batches on one stream, into
/// a fresh index.
pub fn ingest_events(data: &[u8]) {
    let server = index_server();
    let mut stream = ic_index_server::ingest::IngestStream::with_limits(Default::default());
    let mut rest = data;
    for _ in 0..64 {
        if rest.is_empty() {
            break;
        }
        let Ok(batch) = <pb::IngestBatch as prost::Message>::decode_length_delimited(&mut rest)
        else {
            break;
        };
        if server.apply_batch(&mut stream, batch).is_err() {
            break;
        }
    }
    let _ = server.lookup(&pb::LookupRouteRequest {
        scope: Some(scope_pb()),
        key: Some(pb::lookup_route_request::Key::TokenIds(pb::TokenIds {
            ids: (0..64 * 16).collect(),
        })),
        observe_only: true,
        ..Default::default()
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first campaign's one finding (fuzz/regressions/coordinator_body):
    /// a prefetch relayed to a registered instance that refuses the
    /// connection is answered 502, as the API says, not taken for a fault.
    #[test]
    fn a_prefetch_to_an_unreachable_instance_is_answered_502_not_a_finding() {
        let register = br#"{"instance_id":"i-0","ip":"127.0.0.1","http_port":1}"#;
        coordinator_body(&[[0u8].as_slice(), register].concat());
        let found = std::fs::read(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("regressions/coordinator_body/prefetch-to-an-unreachable-instance"),
        )
        .unwrap_or_default();
        assert_eq!(
            COORDINATOR_ROUTES[usize::from(found[0]) % COORDINATOR_ROUTES.len()],
            ("POST", "/cache/prefetches")
        );
        coordinator_body(&found);
    }

    #[test]
    fn frames_round_trip() {
        let frames: [&[u8]; 3] = [b"kv-events", &7u64.to_be_bytes(), b"\x93\x00\x90\xc0"];
        assert_eq!(split_frames(&join_frames(&frames)), frames);
        assert!(split_frames(&[]).is_empty());
        // Truncated lengths take what is left.
        assert_eq!(split_frames(&[2, 9, 0, b'a']), vec![&b"a"[..], &b""[..]]);
    }

    #[test]
    fn the_seed_index_answers_its_own_prompt() {
        let response = populated_index_server()
            .lookup(&pb::LookupRouteRequest {
                scope: Some(scope_pb()),
                key: Some(pb::lookup_route_request::Key::TokenIds(pb::TokenIds {
                    ids: (0..64 * 16).collect(),
                })),
                observe_only: true,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            response.best.as_ref().map(|b| b.matched_blocks),
            Some(64),
            "{response:?}"
        );
    }
}
