//! LookupRoute and SetPolicies through the real handlers (no network):
//! every key form, every NO_HINT reason, invalid requests naming the field.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ic_index::{Change, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};
use ic_index_server::grpc::IndexServer;
use ic_index_server::metrics::Metrics;
use ic_index_server::policy::Policies;
use ic_kvevents::chain_fingerprints;
use ic_proto::IndexService;
use ic_proto::index_v1 as pb;
use ic_proto::index_v1::lookup_route_request::Key;
use parking_lot::RwLock;

fn server() -> IndexServer {
    let registry = ic_telemetry::MetricsRegistry::new("inferencecache", "test");
    IndexServer {
        index: Arc::new(Index::new(IndexConfig::default())),
        policies: Arc::new(RwLock::new(Policies::default())),
        default_block_size: 16,
        metrics: Metrics::register(&registry),
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn prompt() -> Vec<u32> {
    (0..64).collect()
}

/// Replica `id` of tenant "t" holds the first `blocks` blocks of `prompt()` at `tier`.
fn hold(s: &IndexServer, id: &str, blocks: usize, tier: Tier) {
    let fps = chain_fingerprints(None, &prompt(), 16);
    let scope = Scope {
        tenant: "t".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    };
    let key = ReplicaKey {
        tenant: "t".into(),
        replica_id: id.into(),
        dp_rank: 0,
    };
    let change = Change::Stored {
        start_depth: 0,
        fingerprints: fps[..blocks].to_vec(),
        block_size: 16,
        tier,
    };
    assert!(
        s.index
            .apply(&key, &scope, &format!("{id}:8000"), &[change], now_ms())
            .is_empty()
    );
}

fn request(key: Key) -> pb::LookupRouteRequest {
    pb::LookupRouteRequest {
        scope: Some(pb::IndexScope {
            tenant: "t".into(),
            model: "m".into(),
            hash_scheme: pb::HashScheme::Vllm as i32,
            adapter: String::new(),
        }),
        key: Some(key),
        candidate_replicas: vec![],
    }
}

fn tokens() -> Key {
    Key::TokenIds(pb::TokenIds { ids: prompt() })
}

#[test]
fn every_key_form_finds_the_same_best_replica() {
    let s = server();
    hold(&s, "a", 4, Tier::T1);
    hold(&s, "b", 2, Tier::T1);
    let fps = chain_fingerprints(None, &prompt(), 16);
    for key in [
        tokens(),
        Key::BlockHashes(pb::BlockHashes {
            hashes: fps.clone(),
        }),
        Key::PrefixHash(fps[3]),
    ] {
        let r = s.lookup(&request(key)).unwrap();
        assert_eq!(r.outcome, pb::LookupOutcome::PrefixMatch as i32);
        let best = r.best.unwrap();
        assert_eq!(best.replica.unwrap().replica_id, "a");
        assert_eq!((best.matched_blocks, best.matched_tokens), (4, 64));
    }
}

#[test]
fn no_hint_reasons() {
    let s = server();
    let reason = |r: pb::LookupRouteResponse| {
        assert_eq!(r.outcome, pb::LookupOutcome::NoHint as i32);
        pb::NoHintReason::try_from(r.no_hint_reason).unwrap()
    };
    assert_eq!(
        reason(s.lookup(&request(tokens())).unwrap()),
        pb::NoHintReason::UnknownModel
    );
    hold(&s, "a", 1, Tier::T1);
    let other: Vec<u32> = (1000..1064).collect();
    assert_eq!(
        reason(
            s.lookup(&request(Key::TokenIds(pb::TokenIds { ids: other })))
                .unwrap()
        ),
        pb::NoHintReason::NoEntry
    );
    assert_eq!(
        reason(
            s.lookup(&request(Key::TokenIds(pb::TokenIds { ids: vec![1, 2, 3] })))
                .unwrap()
        ),
        pb::NoHintReason::PromptTooShort
    );
    let push = |minimum_prefix_tokens, allow_tier2_matches| pb::NamespacePolicy {
        namespace: "t".into(),
        lookup_timeout_ms: 50,
        minimum_prefix_tokens,
        replica_stale_after_seconds: 0,
        allow_tier2_matches,
    };
    *s.policies.write() = Policies::from_push(&[push(32, true)]).unwrap();
    assert_eq!(
        reason(s.lookup(&request(tokens())).unwrap()),
        pb::NoHintReason::BelowMinimumPrefix
    );
    hold(&s, "cold", 4, Tier::T2);
    *s.policies.write() = Policies::from_push(&[push(0, false)]).unwrap();
    let r = s.lookup(&request(tokens())).unwrap();
    assert_eq!(
        r.best.unwrap().replica.unwrap().replica_id,
        "a",
        "T2-only replica excluded"
    );
}

#[test]
fn candidates_restrict_and_tenants_are_isolated() {
    let s = server();
    hold(&s, "a", 4, Tier::T1);
    hold(&s, "b", 2, Tier::T1);
    let mut req = request(tokens());
    req.candidate_replicas = vec!["b".into()];
    let r = s.lookup(&req).unwrap();
    assert_eq!(r.best.unwrap().replica.unwrap().replica_id, "b");
    let mut req = request(tokens());
    req.scope.as_mut().unwrap().tenant = "intruder".into();
    req.candidate_replicas = vec!["a".into(), "b".into()];
    assert_eq!(
        s.lookup(&req).unwrap().outcome,
        pb::LookupOutcome::NoHint as i32
    );
}

#[test]
fn invalid_requests_name_the_field() {
    let s = server();
    let code_and_message = |req: pb::LookupRouteRequest| {
        let e = s.lookup(&req).unwrap_err();
        (e.code(), e.message().to_owned())
    };
    let mut no_scope = request(tokens());
    no_scope.scope = None;
    assert_eq!(
        code_and_message(no_scope),
        (tonic::Code::InvalidArgument, "scope: required".into())
    );
    let mut no_tenant = request(tokens());
    no_tenant.scope.as_mut().unwrap().tenant.clear();
    assert_eq!(code_and_message(no_tenant).1, "scope.tenant: required");
    let mut bad_scheme = request(tokens());
    bad_scheme.scope.as_mut().unwrap().hash_scheme = 99;
    assert!(
        code_and_message(bad_scheme)
            .1
            .starts_with("scope.hash_scheme")
    );
    let mut no_key = request(tokens());
    no_key.key = None;
    assert!(code_and_message(no_key).1.starts_with("key:"));
    let huge = request(Key::BlockHashes(pb::BlockHashes {
        hashes: vec![0; 70_000],
    }));
    assert!(code_and_message(huge).1.starts_with("block_hashes.hashes"));
    let (code, message) = code_and_message(request(Key::PromptText("hello".into())));
    assert_eq!(code, tonic::Code::FailedPrecondition);
    assert!(message.contains("tokenizer"), "{message}");
}

#[tokio::test]
async fn set_policies_validates_the_whole_push() {
    let s = server();
    let bad = pb::SetPoliciesRequest {
        policies: vec![pb::NamespacePolicy {
            namespace: String::new(),
            lookup_timeout_ms: 5,
            ..Default::default()
        }],
    };
    let e = s.set_policies(tonic::Request::new(bad)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("policies[0].namespace"),
        "{}",
        e.message()
    );
    let good = pb::SetPoliciesRequest {
        policies: vec![pb::NamespacePolicy {
            namespace: "t".into(),
            lookup_timeout_ms: 5,
            minimum_prefix_tokens: 128,
            ..Default::default()
        }],
    };
    let r = s.set_policies(tonic::Request::new(good)).await.unwrap();
    assert_eq!(r.into_inner().applied, 1);
    assert_eq!(s.policies.read().get("t").minimum_prefix_tokens, 128);
}
