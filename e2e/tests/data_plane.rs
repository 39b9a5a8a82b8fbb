//! The assembled data plane on loopback: an engine publishing the real vLLM
//! wire over ZMQ, the real `ic-kvevent-subscriber` and `ic-index-server`
//! binaries, and a gateway calling `LookupRoute` over gRPC.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use ic_e2e::engine::FakeEngine;
use ic_e2e::{ServiceProcess, workspace_binary};
use ic_kvevents::Medium;
use ic_kvevents::chain_fingerprints;
use ic_kvevents::encode::{Era, gpu_store, removal};
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;

fn scope(tenant: &str) -> Option<pb::IndexScope> {
    Some(pb::IndexScope {
        tenant: tenant.into(),
        model: "meta-llama/Llama-3.1-8B".into(),
        hash_scheme: pb::HashScheme::Vllm as i32,
        adapter: String::new(),
    })
}

fn by_tokens(tenant: &str, tokens: Vec<u32>) -> pb::LookupRouteRequest {
    pb::LookupRouteRequest {
        scope: scope(tenant),
        key: Some(pb::lookup_route_request::Key::TokenIds(pb::TokenIds {
            ids: tokens,
        })),
        candidate_replicas: vec![],
        // Polled and repeated: not requests a gateway routed.
        observe_only: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_events_route_a_prompt_to_the_replica_holding_it() {
    let mut server = ServiceProcess::start(
        &workspace_binary("ic-index-server"),
        &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
    );
    let grpc = server.addr("grpc").to_string();
    let http = server.admin_addr();

    // Two engines; each gets its own sidecar.
    let mut engines = Vec::new();
    let mut sidecars = Vec::new();
    for (i, name) in ["llama-0", "llama-1"].iter().enumerate() {
        let engine = FakeEngine::start(Era::VllmMap, "kv-events").await;
        let args = engine.subscriber_args(
            &format!("http://{grpc}"),
            name,
            "team-a",
            "meta-llama/Llama-3.1-8B",
            &format!("10.0.0.{i}:8000"),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        sidecars.push(ServiceProcess::start(
            &workspace_binary("ic-kvevent-subscriber"),
            &args,
        ));
        engines.push(engine);
    }
    for engine in &mut engines {
        engine.wait_for_subscriber().await;
    }
    // llama-0 caches a 4-block prompt; llama-1 only its first block.
    let prompt: Vec<u32> = (0..64).map(|t| 1000 + t).collect();
    engines[0]
        .publish(&[gpu_store(vec![11, 12, 13, 14], None, prompt.clone(), 16)])
        .await;
    engines[1]
        .publish(&[gpu_store(vec![21], None, prompt[..16].to_vec(), 16)])
        .await;

    let mut client = IndexServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let response = loop {
        let r = client
            .lookup_route(by_tokens("team-a", prompt.clone()))
            .await
            .unwrap()
            .into_inner();
        if r.candidates.len() == 2 {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "index never learned both replicas: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(response.outcome, pb::LookupOutcome::PrefixMatch as i32);
    let best = response.best.unwrap();
    assert_eq!(best.replica.as_ref().unwrap().replica_id, "llama-0");
    assert_eq!(best.replica.as_ref().unwrap().address, "10.0.0.0:8000");
    assert_eq!((best.matched_blocks, best.matched_tokens), (4, 64));
    assert_eq!(best.tier, pb::Tier::T1 as i32);
    assert_eq!(response.candidates[1].matched_blocks, 1);

    // A gateway computing fingerprints itself gets the same answer.
    let fps = chain_fingerprints(None, &prompt, 16);
    let by_hashes = client
        .lookup_route(pb::LookupRouteRequest {
            scope: scope("team-a"),
            key: Some(pb::lookup_route_request::Key::BlockHashes(
                pb::BlockHashes {
                    hashes: ic_kvevents::Fingerprint::to_raw(fps.clone()),
                },
            )),
            candidate_replicas: vec![],
            observe_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Same replica and match; the score is left out because the stand-in
    // engine's KV-usage report may land between the two lookups and move it.
    let routed = |c: &pb::CandidateScore| {
        (
            c.replica.clone(),
            c.matched_blocks,
            c.matched_tokens,
            c.tier,
            c.speculative,
        )
    };
    assert_eq!(by_hashes.best.as_ref().map(routed), Some(routed(&best)));

    // Another tenant asking for the same prompt learns nothing.
    let other = client
        .lookup_route(by_tokens("team-b", prompt.clone()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(other.outcome, pb::LookupOutcome::NoHint as i32);
    assert_eq!(other.no_hint_reason, pb::NoHintReason::UnknownModel as i32);

    // llama-0 evicts its last two blocks: the match shrinks to 2 blocks.
    engines[0]
        .publish(&[removal(vec![13, 14], Medium::Gpu)])
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = client
            .lookup_route(by_tokens("team-a", prompt.clone()))
            .await
            .unwrap()
            .into_inner();
        if r.best.as_ref().is_some_and(|b| b.matched_blocks == 2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "eviction never reached the index: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The snapshot the controller reads shows both replicas.
    let (status, body) = ic_e2e::http_get(http, "/snapshot");
    assert_eq!(status, 200);
    let snapshot: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = snapshot["replicas"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{snapshot}");
    assert_eq!(rows[0]["replicaId"], "llama-0");
    assert_eq!(rows[0]["prefixCount"], 2);
    assert_eq!(rows[1]["prefixCount"], 1);

    for mut sidecar in sidecars {
        assert!(sidecar.stop().success());
    }
    assert!(server.stop().success());
}

/// Blocks an engine hashed with more than their tokens (a LoRA adapter,
/// images, a cache salt, prompt embeddings), published with the engines'
/// own msgspec structs, are found only by lookups that name the same keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_keyed_blocks_match_only_lookups_with_the_same_keys() {
    let check = std::process::Command::new("python3")
        .args(["-c", "import zmq, msgspec"])
        .output()
        .expect("python3 is required for this test");
    assert!(
        check.status.success(),
        "this test needs pyzmq and msgspec (`./dev.sh test` installs them)"
    );
    let mut server = ServiceProcess::start(
        &workspace_binary("ic-index-server"),
        &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
    );
    let grpc = server.addr("grpc").to_string();
    let port = ic_e2e::free_port();
    let mut sidecar = ServiceProcess::start(
        &workspace_binary("ic-kvevent-subscriber"),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--engine-endpoint",
            &format!("tcp://127.0.0.1:{port}"),
            "--index-server",
            &format!("http://{grpc}"),
            "--model-id",
            "meta-llama/Llama-3.1-8B",
            "--replica-id",
            "llama-0",
            "--tenant",
            "team-a",
            "--address",
            "10.0.0.1:8000",
        ],
    );
    let admin = sidecar.admin_addr();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../libs/kvevents/tests/fixtures/publish_extra_keys.py");
    let publisher = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(script)
            .args(["--port", &port.to_string()])
            .output()
            .expect("run publisher")
    });
    let prompt = |k: u32, n: u32| -> Vec<u32> { (1000 * k..1000 * k + n).collect() };
    let mut client = IndexServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    // The plain block arrives last: once it is there, everything is.
    let deadline = Instant::now() + Duration::from_secs(60);
    while client
        .lookup_route(by_tokens("team-a", prompt(7, 16)))
        .await
        .unwrap()
        .into_inner()
        .outcome
        != pb::LookupOutcome::PrefixMatch as i32
    {
        assert!(
            Instant::now() < deadline,
            "the publisher's blocks never arrived"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = publisher.await.unwrap();
    assert!(
        out.status.success(),
        "publisher failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let media = |id: &str, offset: u32, length: u32| pb::MediaItem {
        identifier: id.into(),
        offset,
        length,
    };
    let digest = |b: Vec<u8>| pb::ExtraKeyValue {
        kind: Some(pb::extra_key_value::Kind::Digest(b)),
    };
    let cases: Vec<(&str, pb::LookupRouteRequest, u32)> = vec![
        (
            "adapter blocks, base scope",
            by_tokens("team-a", prompt(1, 32)),
            0,
        ),
        (
            "adapter blocks, adapter scope",
            {
                let mut r = by_tokens("team-a", prompt(1, 32));
                r.scope.as_mut().unwrap().adapter = "sql-lora".into();
                r
            },
            2,
        ),
        (
            "adapter blocks, another adapter",
            {
                let mut r = by_tokens("team-a", prompt(1, 32));
                r.scope.as_mut().unwrap().adapter = "chat-lora".into();
                r
            },
            0,
        ),
        (
            "base block, adapter scope",
            {
                let mut r = by_tokens("team-a", prompt(7, 16));
                r.scope.as_mut().unwrap().adapter = "sql-lora".into();
                r
            },
            0,
        ),
        (
            "image blocks, no media",
            by_tokens("team-a", prompt(2, 32)),
            0,
        ),
        (
            "image blocks, the image",
            pb::LookupRouteRequest {
                media: vec![media("img-a", 4, 20)],
                ..by_tokens("team-a", prompt(2, 32))
            },
            2,
        ),
        (
            "image blocks, another image",
            pb::LookupRouteRequest {
                media: vec![media("img-z", 4, 20)],
                ..by_tokens("team-a", prompt(2, 32))
            },
            0,
        ),
        (
            "image blocks, the image only in block 0",
            pb::LookupRouteRequest {
                media: vec![media("img-a", 4, 8)],
                ..by_tokens("team-a", prompt(2, 32))
            },
            1,
        ),
        (
            "salted block, no salt",
            by_tokens("team-a", prompt(3, 16)),
            0,
        ),
        (
            "salted block, the salt",
            pb::LookupRouteRequest {
                cache_salt: "tenant-salt".into(),
                ..by_tokens("team-a", prompt(3, 16))
            },
            1,
        ),
        (
            "bare-identifier image",
            pb::LookupRouteRequest {
                media: vec![media("img-b", 0, 16)],
                ..by_tokens("team-a", prompt(4, 16))
            },
            1,
        ),
        (
            "SGLang salted store, the salt",
            pb::LookupRouteRequest {
                cache_salt: "s1".into(),
                ..by_tokens("team-a", prompt(5, 16))
            },
            1,
        ),
        (
            "SGLang salted store, another salt",
            pb::LookupRouteRequest {
                cache_salt: "s2".into(),
                ..by_tokens("team-a", prompt(5, 16))
            },
            0,
        ),
        (
            "embeddings block, no digest",
            by_tokens("team-a", prompt(6, 16)),
            0,
        ),
        (
            "embeddings block, the digest",
            pb::LookupRouteRequest {
                block_extra_keys: vec![pb::BlockExtraKeys {
                    keys: vec![digest((0..32).collect())],
                }],
                ..by_tokens("team-a", prompt(6, 16))
            },
            1,
        ),
        (
            "plain block with a salt",
            pb::LookupRouteRequest {
                cache_salt: "tenant-salt".into(),
                ..by_tokens("team-a", prompt(7, 16))
            },
            0,
        ),
    ];
    for (what, request, want) in cases {
        let r = client.lookup_route(request).await.unwrap().into_inner();
        let got = r.best.map_or(0, |b| b.matched_blocks);
        assert_eq!(got, want, "{what}: {}", r.detail);
    }

    // Extra keys with fingerprints the gateway computed are refused, by field.
    let err = client
        .lookup_route(pb::LookupRouteRequest {
            scope: scope("team-a"),
            key: Some(pb::lookup_route_request::Key::PrefixHash(1)),
            cache_salt: "s".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with("cache_salt:"),
        "{}",
        err.message()
    );
    let err = client
        .lookup_route(pb::LookupRouteRequest {
            media: vec![media("", 0, 1)],
            ..by_tokens("team-a", prompt(2, 32))
        })
        .await
        .unwrap_err();
    assert!(
        err.message().starts_with("media[0].identifier:"),
        "{}",
        err.message()
    );

    let (_, metrics) = ic_e2e::http_get(admin, "/metrics");
    assert!(
        metrics.contains("inferencecache_subscriber_adapter_blocks{adapter=\"sql-lora\"} 2"),
        "{metrics}"
    );
    assert!(sidecar.stop().success());
    assert!(server.stop().success());
}

/// The engine's KV cache size, scraped from its real Prometheus page by the
/// subscriber, reaches the index server's /snapshot (which the controller
/// copies into CacheIndex `replicas[].cacheMemoryBytes`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_cache_size_reaches_the_snapshot() {
    // An SGLang 0.5.17+ page: two DP ranks of 1.5 GiB each.
    let page = "# TYPE sglang:kv_cache_memory_usage_gb gauge\n\
        sglang:kv_cache_memory_usage_gb{model_name=\"m\",dp_rank=\"0\"} 1.5\n\
        sglang:kv_cache_memory_usage_gb{model_name=\"m\",dp_rank=\"1\"} 1.5\n\
        sglang:max_total_num_tokens{model_name=\"m\"} 500000\n";
    let app =
        axum::Router::new().route("/metrics", axum::routing::get(move || async move { page }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut server = ServiceProcess::start(
        &workspace_binary("ic-index-server"),
        &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
    );
    let grpc = server.addr("grpc").to_string();
    let http = server.admin_addr();
    let mut engine = FakeEngine::start(Era::VllmMap, "kv-events").await;
    let mut args = engine.subscriber_args(
        &format!("http://{grpc}"),
        "llama-0",
        "team-a",
        "meta-llama/Llama-3.1-8B",
        "10.0.0.1:8000",
    );
    args.extend([
        "--engine-metrics-url".to_owned(),
        format!("http://{metrics_addr}/metrics"),
        "--tier2-scrape-interval-seconds".to_owned(),
        "1".to_owned(),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut sidecar = ServiceProcess::start(&workspace_binary("ic-kvevent-subscriber"), &args);
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1], None, (0..16).collect(), 16)])
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let row = loop {
        let (status, body) = ic_e2e::http_get(http, "/snapshot");
        assert_eq!(status, 200, "{body}");
        let snapshot: ic_index_http::Snapshot = serde_json::from_str(&body).unwrap();
        if let Some(row) = snapshot
            .replicas
            .into_iter()
            .find(|r| r.cache_memory_bytes.is_some())
        {
            break row;
        }
        assert!(Instant::now() < deadline, "no cache size in {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(row.replica_id, "llama-0");
    assert_eq!(row.cache_memory_bytes, Some(3 << 30));
    assert_eq!(row.cache_capacity_tokens, Some(500_000));
    assert!(sidecar.stop().success());
    assert!(server.stop().success());
}
