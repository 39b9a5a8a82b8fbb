//! LookupRoute and SetPolicies through the real handlers (no network):
//! every key form, every NO_HINT reason, invalid requests naming the field.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use ic_index::{Change, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};
use ic_index_server::grpc::IndexServer;
use ic_index_server::index_core::IndexCore;
use ic_index_server::metrics::{IndexMemoryCollector, Metrics};
use ic_index_server::policy::Policies;
use ic_index_server::tokenize::Tokenizers;
use ic_kvevents::chain_fingerprints;
use ic_proto::IndexService;
use ic_proto::index_v1 as pb;
use ic_proto::index_v1::lookup_route_request::Key;

fn server() -> IndexServer {
    let registry = ic_telemetry::MetricsRegistry::new("inferencecache", "test");
    IndexServer::new(
        Arc::new(Index::new(IndexConfig::default())),
        16,
        Metrics::register(&registry),
    )
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
        s.index()
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
        observe_only: false,
        ..Default::default()
    }
}

fn tokens() -> Key {
    Key::TokenIds(pb::TokenIds { ids: prompt() })
}

#[test]
fn every_key_form_finds_the_same_best_replica() {
    let fps = ic_kvevents::Fingerprint::to_raw(chain_fingerprints(None, &prompt(), 16));
    for key in [
        tokens(),
        Key::BlockHashes(pb::BlockHashes {
            hashes: fps.clone(),
        }),
        Key::PrefixHash(fps[3]),
    ] {
        // A fresh server each time: a pick counts as load, and a repeated
        // prompt would be sent elsewhere by the load bound.
        let s = server();
        hold(&s, "a", 4, Tier::T1);
        hold(&s, "b", 2, Tier::T1);
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
        ..Default::default()
    };
    s.core()
        .set_policies(Policies::from_push(&[push(32, true)]).unwrap());
    assert_eq!(
        reason(s.lookup(&request(tokens())).unwrap()),
        pb::NoHintReason::BelowMinimumPrefix
    );
    hold(&s, "cold", 4, Tier::T2);
    s.core()
        .set_policies(Policies::from_push(&[push(0, false)]).unwrap());
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
    assert!(message.contains("--tokenizer m="), "{message}");
    // Fingerprints carry the adapter: naming one in the scope as well is
    // refused, not silently dropped; with token ids it is the key's part.
    for key in [
        Key::PrefixHash(7),
        Key::BlockHashes(pb::BlockHashes { hashes: vec![7] }),
    ] {
        let mut with_adapter = request(key);
        with_adapter.scope.as_mut().unwrap().adapter = "sql-lora".into();
        let (code, message) = code_and_message(with_adapter);
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(message.starts_with("scope.adapter:"), "{message}");
    }
    let mut tokens_with_adapter = request(tokens());
    tokens_with_adapter.scope.as_mut().unwrap().adapter = "sql-lora".into();
    assert!(s.lookup(&tokens_with_adapter).is_ok());
    for tenant in ["Team-A", "a_b", "~probe", "-a"] {
        let mut bad_tenant = request(tokens());
        bad_tenant.scope.as_mut().unwrap().tenant = tenant.into();
        let (code, message) = code_and_message(bad_tenant);
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert!(message.starts_with("scope.tenant:"), "{message}");
    }
}

#[test]
fn lookups_past_the_size_bounds_are_refused_naming_the_flag_and_counted() {
    let mut s = server();
    s.limits = ic_index_server::grpc::LookupLimits {
        max_prompt_blocks: 4,
        max_prompt_tokens: 8,
        max_candidates: 2,
        max_prompt_text_bytes: 16,
        max_extra_entries: 2,
        max_extra_key_bytes: 8,
    };
    let refused = |req: pb::LookupRouteRequest| {
        let e = s.lookup(&req).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        e.message().to_owned()
    };
    let blocks = |n| request(Key::BlockHashes(pb::BlockHashes { hashes: vec![7; n] }));
    assert!(s.lookup(&blocks(4)).is_ok());
    assert_eq!(
        refused(blocks(5)),
        "block_hashes.hashes: at most 4 blocks (--max-prompt-blocks)"
    );
    let ids = |n| request(Key::TokenIds(pb::TokenIds { ids: vec![1; n] }));
    assert!(s.lookup(&ids(8)).is_ok());
    assert_eq!(
        refused(ids(9)),
        "token_ids.ids: at most 8 tokens (--max-prompt-tokens)"
    );
    let mut named = blocks(1);
    named.candidate_replicas = vec!["a".into(), "b".into(), "c".into()];
    assert_eq!(
        refused(named),
        "candidate_replicas: at most 2 entries (--max-candidates)"
    );
    let text = |n| request(Key::PromptText("a".repeat(n)));
    assert_eq!(
        refused(text(17)),
        "prompt_text: at most 16 bytes (--max-prompt-text-bytes)"
    );
    let salted = |salt: &str| pb::LookupRouteRequest {
        cache_salt: salt.into(),
        ..ids(1)
    };
    assert!(s.lookup(&salted("12345678")).is_ok());
    assert_eq!(
        refused(salted("123456789")),
        "cache_salt: longer than 8 bytes (--max-extra-key-bytes)"
    );
    let item = |identifier: &str| pb::MediaItem {
        identifier: identifier.into(),
        offset: 0,
        length: 1,
    };
    let with_media = pb::LookupRouteRequest {
        media: vec![item("x"), item("y"), item("z")],
        ..ids(1)
    };
    assert_eq!(
        refused(with_media),
        "media: at most 2 items (--max-extra-entries)"
    );
    let key = |k: &str| pb::ExtraKeyValue {
        kind: Some(pb::extra_key_value::Kind::Key(k.into())),
    };
    // Two blocks, but three keys in all.
    let keyed = pb::LookupRouteRequest {
        block_extra_keys: vec![
            pb::BlockExtraKeys {
                keys: vec![key("a"), key("b")],
            },
            pb::BlockExtraKeys {
                keys: vec![key("c")],
            },
        ],
        ..ids(1)
    };
    assert_eq!(
        refused(keyed),
        "block_extra_keys[].keys: at most 2 keys in all (--max-extra-entries)"
    );
    let counted = |limit| {
        s.core()
            .metrics()
            .lookups_refused
            .get(&ic_index_server::metrics::LimitLabel { limit })
            .map(|c| c.get())
    };
    assert_eq!(counted("prompt_blocks"), Some(1));
    assert_eq!(counted("prompt_tokens"), Some(1));
    assert_eq!(counted("candidates"), Some(1));
    assert_eq!(counted("prompt_text_bytes"), Some(1));
    assert_eq!(counted("extra_key_bytes"), Some(1));
    assert_eq!(counted("extra_entries"), Some(2));
}

/// A server with the fixture tokenizer for model "m" and, for tenant "t",
/// a lookup budget no loaded test machine runs past: the default 20 ms
/// includes tokenizing, slow in a debug build on busy cores, and a lookup
/// past it answers NO_HINT (LOOKUP_TIMEOUT) instead of the match asserted.
fn with_tokenizer() -> IndexServer {
    let spec: ic_index_server::TokenizerSpec = format!(
        "m={}/tests/fixtures/tokenizer.json",
        env!("CARGO_MANIFEST_DIR")
    )
    .parse()
    .unwrap();
    let registry = ic_telemetry::MetricsRegistry::new("inferencecache", "test");
    let s = IndexServer::over(Arc::new(
        IndexCore::new(
            Arc::new(Index::new(IndexConfig::default())),
            16,
            Metrics::register(&registry),
        )
        .with_tokenizers(Tokenizers::load(&[spec]).unwrap()),
    ));
    let generous = pb::NamespacePolicy {
        namespace: "t".into(),
        lookup_timeout_ms: 10_000,
        allow_tier2_matches: true,
        ..Default::default()
    };
    s.core()
        .set_policies(Policies::from_push(&[generous]).unwrap());
    s
}

#[test]
fn prompt_text_is_tokenized_like_the_engine() {
    let s = with_tokenizer();
    // The fixture is a word-level vocabulary ("wN" -> N) that prepends
    // <s> (id 0): the engine's prompt is [0, 2, 3, ...].
    let words: Vec<String> = (2..66).map(|i| format!("w{i}")).collect();
    let mut ids = vec![0u32];
    ids.extend(2..66u32);
    let scope = Scope {
        tenant: "t".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    };
    let key = ReplicaKey {
        tenant: "t".into(),
        replica_id: "a".into(),
        dp_rank: 0,
    };
    let fps = chain_fingerprints(None, &ids, 16);
    let change = Change::Stored {
        start_depth: 0,
        fingerprints: fps.clone(),
        block_size: 16,
        tier: Tier::T1,
    };
    s.index().apply(&key, &scope, "a:8000", &[change], now_ms());
    let r = s
        .lookup(&request(Key::PromptText(words.join(" "))))
        .unwrap();
    assert_eq!(
        r.outcome,
        pb::LookupOutcome::PrefixMatch as i32,
        "no_hint_reason {:?}",
        pb::NoHintReason::try_from(r.no_hint_reason)
    );
    let best = r.best.unwrap();
    assert_eq!(best.replica.unwrap().replica_id, "a");
    assert_eq!(best.matched_blocks, 4);
    assert_eq!(r.prompt_blocks, 4);
    // Same answer as the token ids the gateway could have sent instead.
    let by_ids = s
        .lookup(&request(Key::TokenIds(pb::TokenIds { ids })))
        .unwrap();
    assert_eq!(by_ids.best.unwrap().matched_blocks, 4);
    // A model without a tokenizer is a precondition failure, not a miss.
    let mut other = request(Key::PromptText("w2 w3".into()));
    other.scope.as_mut().unwrap().model = "other".into();
    assert_eq!(
        s.lookup(&other).unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    // Oversized text is refused naming the field.
    let huge = "w2 ".repeat(2 << 20);
    let e = s.lookup(&request(Key::PromptText(huge))).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().starts_with("prompt_text"), "{}", e.message());
}

#[test]
fn bad_tokenizer_files_fail_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("tokenizer.json");
    std::fs::write(&bad, "{\"not\": \"a tokenizer\"}").unwrap();
    for path in [bad.clone(), dir.path().join("missing.json")] {
        let spec: ic_index_server::TokenizerSpec = format!("m={}", path.display()).parse().unwrap();
        let e = Tokenizers::load(&[spec]).unwrap_err().to_string();
        assert!(e.starts_with("--tokenizer m="), "{e}");
    }
}

#[test]
fn memory_gauge_reports_each_part_of_the_index() {
    let registry = ic_telemetry::MetricsRegistry::new("inferencecache", "test");
    let s = IndexServer::new(
        Arc::new(Index::new(IndexConfig::default())),
        16,
        Metrics::register(&registry),
    );
    IndexMemoryCollector::register(&registry, s.index().clone());
    let gauge = |text: &str, part: &str| -> u64 {
        let name = format!("inferencecache_index_memory_bytes{{part=\"{part}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&name))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .parse()
            .unwrap()
    };
    let empty = registry.encode();
    assert!(
        empty.contains("# TYPE inferencecache_index_memory_bytes gauge"),
        "{empty}"
    );
    assert_eq!(gauge(&empty, "records"), 0);
    hold(&s, "a", 4, Tier::T1);
    // Read at scrape time: the new page shows without any refresh call.
    let held = registry.encode();
    let memory = s.index().memory();
    assert!(memory.records > 0);
    assert_eq!(gauge(&held, "records"), memory.records);
    assert_eq!(gauge(&held, "key_tables"), memory.key_tables);
    assert_eq!(gauge(&held, "replicas"), memory.replicas);
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
        ..Default::default()
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
        ..Default::default()
    };
    let r = s.set_policies(tonic::Request::new(good)).await.unwrap();
    assert_eq!(r.into_inner().applied, 1);
    assert_eq!(s.core().policy("t").minimum_prefix_tokens, 128);
}

#[test]
fn observing_lookups_do_not_count_as_routed_requests() {
    let s = server();
    hold(&s, "a", 4, Tier::T1);
    hold(&s, "b", 2, Tier::T1);
    let best = |observe_only| {
        let r = s
            .lookup(&pb::LookupRouteRequest {
                observe_only,
                ..request(tokens())
            })
            .unwrap();
        r.best.unwrap().replica.unwrap().replica_id
    };
    // Asked again and again by a tool: the same answer, no load added.
    for _ in 0..5 {
        assert_eq!(best(true), "a");
    }
    // Routed: the holder takes the request; a second one in a row goes over
    // its bound (two replicas, 1.25 × fair share), so the partial holder
    // gets it.
    assert_eq!(best(false), "a");
    assert_eq!(best(false), "b");
}

/// With a static token, LookupRoute is answered without awaiting anything
/// (the caller is known at once), and refusals are still refused, named
/// and counted as the awaited path counts them.
#[tokio::test]
async fn a_static_token_lookup_is_answered_at_once_and_refusals_are_counted() {
    let registry = ic_telemetry::MetricsRegistry::new("inferencecache", "test");
    let mut s = IndexServer::new(
        Arc::new(Index::new(IndexConfig::default())),
        16,
        Metrics::register(&registry),
    );
    s.access = Arc::new(ic_index_server::access::ApiAccess::Static("s3cret".into()));
    hold(&s, "a", 4, Tier::T1);
    let call = |token: Option<&str>| {
        let mut r = tonic::Request::new(request(tokens()));
        if let Some(t) = token {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        r
    };
    let r = s.lookup_route(call(Some("s3cret"))).await.unwrap();
    let best = r.into_inner().best.unwrap().replica.unwrap().replica_id;
    assert_eq!(best, "a");
    for token in [Some("nope"), None] {
        let status = s.lookup_route(call(token)).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated, "{token:?}");
    }
    let refused = registry
        .encode()
        .lines()
        .find(|l| l.contains("access_refusals") && l.contains("path=\"lookup\""))
        .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned());
    assert_eq!(refused.as_deref(), Some("2"));
}
