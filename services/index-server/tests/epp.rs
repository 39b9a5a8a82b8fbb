//! The endpoint picker, driven through the real `ic-index-server` binary by
//! a real ext_proc client built from Envoy's protos, with the message
//! sequences Envoy sends: headers only, a buffered body, a full-duplex
//! streamed body, the gateway's subset hint, and no endpoint to pick.
//! The index is fed through the real IngestEvents stream; chat prompts are
//! tokenized with the shipped fixture tokenizer and its chat template.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    ProcessingRequest, ProcessingResponse, body_mutation,
    external_processor_client::ExternalProcessorClient, processing_request, processing_response,
};
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use ic_e2e::ServiceProcess;
use ic_e2e::ext_proc::{body, headers, with_mode};
use ic_index_server::tokenize::{ChatMessage, ChatPrompt, Tokenizers};
use ic_proto::index_v1 as pb;

const HOLDER: &str = "10.0.0.2:8000";
const OTHER: &str = "10.0.0.1:8000";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat");

fn chat_body() -> serde_json::Value {
    serde_json::json!({
        "model": "tiny-chat",
        "stream": true,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is a KV cache and why does prefix reuse matter for latency?"},
        ],
    })
}

/// The chat prompt's token ids, as the engine computes them.
fn chat_tokens() -> Vec<u32> {
    let tokenizers = Tokenizers::load(&[ic_index_server::TokenizerSpec {
        model: "tiny-chat".into(),
        path: Path::new(FIXTURES).join("tokenizer.json"),
    }])
    .unwrap();
    let body = chat_body();
    let messages: Vec<ChatMessage> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    tokenizers
        .encode_chat("tiny-chat", &ChatPrompt::new(messages))
        .unwrap()
}

struct Picker {
    process: ServiceProcess,
    epp: String,
    grpc: String,
}

fn start() -> Picker {
    start_with(&[])
}

fn start_with(extra: &[&str]) -> Picker {
    let tokenizer = format!("tiny-chat={FIXTURES}/tokenizer.json");
    let endpoints = format!("{OTHER},{HOLDER}");
    let mut args = vec![
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--epp-addr",
        "127.0.0.1:0",
        "--epp-tenant",
        "team-a",
        "--epp-endpoint",
        &endpoints,
        "--tokenizer",
        &tokenizer,
        "--engine-block-size",
        "4",
        // Two endpoints and repeated prompts: the load bound would send
        // every other request away from the holder (libs/index tests it).
        "--load-bound=0",
    ];
    args.extend_from_slice(extra);
    let mut process =
        ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_ic-index-server")), &args);
    let epp = format!("http://{}", process.addr("epp"));
    let grpc = format!("http://{}", process.addr("grpc"));
    Picker { process, epp, grpc }
}

/// A lookup budget no loaded test machine runs past (the default 20 ms
/// includes tokenizing, slow in a debug build on busy cores): picks are
/// decided by the prefix, never by a timeout.
async fn generous_budget(grpc: &str) {
    let mut client = pb::index_service_client::IndexServiceClient::connect(grpc.to_owned())
        .await
        .unwrap();
    client
        .set_policies(pb::SetPoliciesRequest {
            policies: vec![pb::NamespacePolicy {
                namespace: "team-a".into(),
                lookup_timeout_ms: 10_000,
                allow_tier2_matches: true,
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();
}

/// The engine at HOLDER reports holding the chat prompt's blocks.
async fn feed_holder(grpc: &str) {
    generous_budget(grpc).await;
    let tokens = chat_tokens();
    assert!(tokens.len() >= 32, "the prompt spans several blocks");
    hold(grpc, "tiny-chat", "engine-holder", HOLDER, &tokens).await;
}

/// The engine `replica_id` at `address` reports holding `tokens`' blocks
/// (4 tokens a block) of `model`.
async fn hold(grpc: &str, model: &str, replica_id: &str, address: &str, tokens: &[u32]) {
    let fps = ic_kvevents::Fingerprint::to_raw(ic_kvevents::chain_fingerprints(None, tokens, 4));
    let replica = ic_e2e::ingest::Replica {
        tenant: "team-a",
        model,
        replica_id,
        address,
        dp_rank: 0,
    };
    let event = ic_e2e::ingest::stored(fps, 4, pb::Tier::T1);
    ic_e2e::ingest::ingest(grpc, ic_e2e::ingest::resync(&replica, vec![event])).await;
}

fn with_subset(mut m: ProcessingRequest, endpoints: &[&str]) -> ProcessingRequest {
    let list = Value {
        kind: Some(Kind::ListValue(ListValue {
            values: endpoints
                .iter()
                .map(|e| Value {
                    kind: Some(Kind::StringValue((*e).into())),
                })
                .collect(),
        })),
    };
    m.metadata_context = Some(Metadata {
        filter_metadata: [(
            "envoy.lb.subset_hint".to_owned(),
            Struct {
                fields: [("x-gateway-destination-endpoint-subset".to_owned(), list)].into(),
            },
        )]
        .into(),
        ..Metadata::default()
    });
    m
}

/// Sends `messages` on one ext_proc stream and reads `expect` responses.
async fn exchange(
    epp: &str,
    messages: Vec<ProcessingRequest>,
    expect: usize,
) -> Vec<ProcessingResponse> {
    let mut client = ExternalProcessorClient::connect(epp.to_owned())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for m in messages {
        tx.send(m).await.unwrap();
    }
    let mut responses = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while out.len() < expect {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), responses.message())
            .await
            .expect("the picker answered in time")
            .unwrap();
        match next {
            Some(r) => out.push(r),
            None => break,
        }
    }
    // Half-close and read to the end, as Envoy does: the picker then ends
    // the stream itself (a stream still open would hang here).
    drop(tx);
    let rest = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        let mut n = 0;
        while let Ok(Some(_)) = responses.message().await {
            n += 1;
        }
        n
    })
    .await
    .expect("the picker ends the stream once the gateway half-closes");
    assert_eq!(rest, 0, "no response beyond the expected ones");
    out
}

/// The endpoint a response picked: its header and its `envoy.lb` metadata
/// must agree.
fn picked(r: &ProcessingResponse) -> Option<String> {
    let header = ic_e2e::ext_proc::destinations(r)?;
    let lb = &r.dynamic_metadata.as_ref().unwrap().fields["envoy.lb"];
    let Some(Kind::StructValue(lb)) = &lb.kind else {
        panic!("envoy.lb is not a struct: {lb:?}");
    };
    let Some(Kind::StringValue(meta)) = &lb.fields["x-gateway-destination-endpoint"].kind else {
        panic!("no endpoint in envoy.lb");
    };
    assert_eq!(&header, meta, "header and metadata agree");
    // The pick, then its fallbacks.
    Some(header.split(',').next().unwrap().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_message_sequences_get_the_endpoint_holding_the_prompt() {
    let mut picker = start();
    feed_holder(&picker.grpc).await;
    let chat = serde_json::to_vec(&chat_body()).unwrap();

    // Buffered body: headers continue, the body response carries the pick.
    let r = buffered(&picker.epp, &chat).await;
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(picked(&r[0]), None, "headers pass without a pick");
    assert_eq!(picked(&r[1]).as_deref(), Some(HOLDER), "{r:?}");

    // Full-duplex streamed, three chunks: the headers response comes at the
    // end with the pick, then the chunks in order, the last one ending.
    let (a, rest) = chat.split_at(10);
    let (b, c) = rest.split_at(rest.len() / 2);
    let r = exchange(
        &picker.epp,
        vec![
            with_mode(
                headers("/v1/chat/completions", false),
                BodySendMode::FullDuplexStreamed,
            ),
            body(a, false),
            body(b, false),
            body(c, true),
        ],
        4,
    )
    .await;
    assert_eq!(r.len(), 4, "{r:?}");
    assert!(matches!(
        r[0].response,
        Some(processing_response::Response::RequestHeaders(_))
    ));
    assert_eq!(picked(&r[0]).as_deref(), Some(HOLDER));
    let mut echoed = Vec::new();
    for (i, resp) in r[1..].iter().enumerate() {
        let Some(processing_response::Response::RequestBody(b)) = &resp.response else {
            panic!("expected a body response: {resp:?}");
        };
        let mutation = b.response.as_ref().unwrap().body_mutation.as_ref().unwrap();
        let Some(body_mutation::Mutation::StreamedResponse(s)) = &mutation.mutation else {
            panic!("expected a streamed body: {mutation:?}");
        };
        echoed.extend_from_slice(&s.body);
        assert_eq!(s.end_of_stream, i == 2);
    }
    assert_eq!(echoed, chat, "the body goes on unchanged");

    // The gateway's subset wins over the prefix.
    let r = exchange(
        &picker.epp,
        vec![
            with_subset(
                with_mode(
                    headers("/v1/chat/completions", false),
                    BodySendMode::Buffered,
                ),
                &[OTHER],
            ),
            body(&chat, true),
        ],
        2,
    )
    .await;
    assert_eq!(picked(&r[1]).as_deref(), Some(OTHER));

    // Headers only: picked by load, at once.
    let r = exchange(&picker.epp, vec![headers("/v1/models", true)], 1).await;
    let endpoint = picked(&r[0]).unwrap();
    assert!(endpoint == HOLDER || endpoint == OTHER);

    // A subset with no endpoint of the pool: 503, as the protocol asks.
    let r = exchange(
        &picker.epp,
        vec![with_subset(
            headers("/v1/completions", true),
            &["10.9.9.9:8000"],
        )],
        1,
    )
    .await;
    let Some(processing_response::Response::ImmediateResponse(i)) = &r[0].response else {
        panic!("expected an immediate response: {r:?}");
    };
    assert_eq!(i.status.as_ref().unwrap().code, 503);

    // An unreadable body is still routed (by load), and counted.
    let r = exchange(
        &picker.epp,
        vec![
            with_mode(headers("/v1/completions", false), BodySendMode::Buffered),
            body(b"{not json", true),
        ],
        2,
    )
    .await;
    assert!(picked(&r[1]).is_some());

    let metrics = ic_e2e::http_get(picker.process.admin_addr(), "/metrics").1;
    for line in [
        "inferencecache_index_epp_picks_total{by=\"prefix\"} 2",
        "inferencecache_index_epp_refusals_total{reason=\"no_endpoint\"} 1",
        "inferencecache_index_epp_unread_total{reason=\"body\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    // Every pick is timed twice: whole, and less its tokenizing.
    let count = |name: &str| {
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!("inferencecache_index_epp_{name}_seconds_count "))
            })
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
            .to_owned()
    };
    assert_eq!(
        count("decision_without_tokenizing"),
        count("decision_duration")
    );
    assert_ne!(count("decision_without_tokenizing"), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_picker_is_live_at_once_ready_after_its_warm_up_and_not_ready_while_draining() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let picker = start_with(&["--ready-warmup-seconds", "2", "--drain-seconds", "30"]);
    let channel = tonic::transport::Channel::from_shared(picker.epp.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let mut status = async |service: &str| {
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status
    };
    assert_eq!(status("liveness").await, ServingStatus::Serving as i32);
    // An empty index makes blind picks: not ready during the warm-up.
    assert_eq!(status("readiness").await, ServingStatus::NotServing as i32);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    for service in ["readiness", ""] {
        while status(service).await != ServingStatus::Serving as i32 {
            assert!(
                std::time::Instant::now() < deadline,
                "{service} never ready"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    // SIGTERM: not ready at once, still live and answering while it drains.
    picker.process.signal(nix::sys::signal::Signal::SIGTERM);
    while status("readiness").await != ServingStatus::NotServing as i32 {
        assert!(std::time::Instant::now() < deadline, "readiness never fell");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(status("liveness").await, ServingStatus::Serving as i32);
    assert_eq!(status("").await, ServingStatus::NotServing as i32);
    let r = buffered(&picker.epp, b"{not json").await;
    assert!(picked(&r[1]).is_some(), "picks are still answered: {r:?}");
}

#[test]
fn the_picker_refuses_incomplete_flags() {
    for (args, expect) in [
        (vec!["--epp-addr", "127.0.0.1:0"], "--epp-tenant"),
        (
            vec!["--epp-addr", "127.0.0.1:0", "--epp-tenant", "t"],
            "--epp-endpoint",
        ),
        (
            vec![
                "--epp-addr",
                "127.0.0.1:0",
                "--epp-tenant",
                "t",
                "--epp-endpoint",
                "pod-a",
            ],
            "expected ip:port",
        ),
        (vec!["--epp-tenant", "t"], "need --epp-addr"),
        (
            vec![
                "--epp-addr",
                "127.0.0.1:0",
                "--epp-tenant",
                "t",
                "--epp-endpoint",
                "10.0.0.1:8000",
                "--epp-max-held-body-bytes",
                "1048576",
            ],
            "--epp-max-held-body-bytes must be at least --epp-max-body-bytes",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ic-index-server"))
            .args(["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
}

fn engine_pod(name: &str, ip: &str, ready: bool) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "labels": {"app": "vllm"}},
        "status": {"podIP": ip, "conditions": [
            {"type": "Ready", "status": if ready { "True" } else { "False" }}]},
    })
}

/// Headers-only requests until one is picked (the pool's endpoints arrive
/// through the watch): the endpoint.
async fn first_pick(epp: &str, subset: Option<&[&str]>) -> String {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut m = headers("/v1/models", true);
        if let Some(s) = subset {
            m = with_subset(m, s);
        }
        let r = exchange(epp, vec![m], 1).await;
        if let Some(endpoint) = picked(&r[0]) {
            return endpoint;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no pick from the pool: {r:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inference_pool_s_ready_pods_are_the_endpoints() {
    let fake = ic_fake_apiserver::FakeApi::new();
    fake.insert(&serde_json::json!({
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "chat", "namespace": "team-a"},
        "spec": {
            "selector": {"matchLabels": {"app": "vllm"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "inferencecache-epp", "port": {"number": 9002}},
        },
    }));
    fake.insert(&engine_pod("vllm-0", "10.1.0.1", true));
    fake.insert(&engine_pod("vllm-1", "10.1.0.2", false));
    let served = fake.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = ic_fake_apiserver::write_kubeconfig(
        dir.path(),
        served.addr,
        "index-server-token",
        "default",
    )
    .unwrap();
    let mut process = ServiceProcess::start_with_env(
        Path::new(env!("CARGO_BIN_EXE_ic-index-server")),
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--epp-addr",
            "127.0.0.1:0",
            "--epp-tenant",
            "team-a",
            "--epp-pool",
            "chat",
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let epp = format!("http://{}", process.addr("epp"));
    // Only the ready pod, at the pool's target port.
    assert_eq!(first_pick(&epp, None).await, "10.1.0.1:8000");
    // The second pod becomes ready: the watch brings it in.
    fake.insert(&engine_pod("vllm-1", "10.1.0.2", true));
    assert_eq!(
        first_pick(&epp, Some(&["10.1.0.2:8000"])).await,
        "10.1.0.2:8000"
    );
    assert!(process.stop().success());
    // What the picker called is what the chart grants it.
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts/inference-cache/rbac/ic-index-server-epp.txt");
    ic_fake_apiserver::rbac::check_contract(
        &file,
        "ic-index-server (endpoint picker, --epp-pool)",
        "services/index-server/tests/epp.rs",
        &ic_fake_apiserver::rbac::permissions(&fake.requests()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

/// Opens an ext_proc stream whose headers-only request is picked at once,
/// and keeps it (the HTTP request) open: the pick stays in flight.
async fn open_request(
    epp: &str,
) -> (
    tokio::sync::mpsc::Sender<ProcessingRequest>,
    ProcessingResponse,
) {
    let mut client = ExternalProcessorClient::connect(epp.to_owned())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(headers("/v1/completions", true)).await.unwrap();
    let mut responses = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), responses.message())
        .await
        .expect("the picker answered in time")
        .unwrap()
        .expect("a response");
    // Keep reading in the background so the stream stays healthy.
    tokio::spawn(async move { while let Ok(Some(_)) = responses.message().await {} });
    (tx, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_pool_sheds_with_429_until_a_request_ends() {
    let mut picker = start_with(&[
        "--epp-shed-at-requests",
        "1",
        "--epp-shed-standard-at-requests",
        "1",
    ]);
    // One request in flight on each endpoint: the pool is saturated.
    let (first, r1) = open_request(&picker.epp).await;
    let (_second, r2) = open_request(&picker.epp).await;
    let mut busy = [picked(&r1).unwrap(), picked(&r2).unwrap()];
    busy.sort();
    assert_eq!(busy, [OTHER, HOLDER], "one request on each endpoint");

    let r = exchange(&picker.epp, vec![headers("/v1/completions", true)], 1).await;
    let Some(processing_response::Response::ImmediateResponse(i)) = &r[0].response else {
        panic!("expected a 429: {r:?}");
    };
    assert_eq!(i.status.as_ref().unwrap().code, 429);
    assert!(i.details.contains("saturated"), "{i:?}");

    // One request ends: its endpoint takes the next one.
    let freed = picked(&r1).unwrap();
    drop(first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = exchange(&picker.epp, vec![headers("/v1/completions", true)], 1).await;
        if let Some(endpoint) = picked(&r[0]) {
            assert_eq!(endpoint, freed);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the freed endpoint never took a request"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let metrics = ic_e2e::http_get(picker.process.admin_addr(), "/metrics").1;
    assert!(
        metrics.contains("inferencecache_index_epp_refusals_total{reason=\"saturated\"}"),
        "{metrics}"
    );
}

/// One chat request with a buffered body: the headers' and the body's
/// responses.
async fn buffered(epp: &str, chat: &[u8]) -> Vec<ProcessingResponse> {
    exchange(
        epp,
        vec![
            with_mode(
                headers("/v1/chat/completions", false),
                BodySendMode::Buffered,
            ),
            body(chat, true),
        ],
        2,
    )
    .await
}

/// The endpoint picked for a buffered chat request with body `body_json`.
async fn pick_for(epp: &str, body_json: &serde_json::Value) -> Option<String> {
    let r = buffered(epp, &serde_json::to_vec(body_json).unwrap()).await;
    picked(&r[1])
}

/// vLLM serves a LoRA adapter under its own model name: the picker takes a
/// request for it as the adapter of the pool's base model, finds the blocks
/// stored under the adapter, and never the base model's; a request's
/// cache salt likewise selects the salted blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_and_salted_requests_go_to_their_own_caches() {
    let mut picker = start();
    generous_budget(&picker.grpc).await;
    let tokens = chat_tokens();
    let domain = |adapter: &str, salt: &str| {
        ic_kvevents::Fingerprint::to_raw(ic_kvevents::keyed_chain_fingerprints(
            &tokens,
            4,
            &ic_kvevents::PromptExtras {
                adapter: adapter.into(),
                cache_salt: salt.into(),
                ..Default::default()
            },
        ))
    };
    let replica = |replica_id, address| ic_e2e::ingest::Replica {
        tenant: "team-a",
        model: "tiny-chat",
        replica_id,
        address,
        dp_rank: 0,
    };
    // HOLDER has the prompt under the adapter and under a salt; OTHER has
    // it for the base model only.
    let holder = vec![
        ic_e2e::ingest::stored(domain("sql-lora", ""), 4, pb::Tier::T1),
        ic_e2e::ingest::stored(domain("", "tenant-a"), 4, pb::Tier::T1),
    ];
    ic_e2e::ingest::ingest(
        &picker.grpc,
        ic_e2e::ingest::resync(&replica("engine-holder", HOLDER), holder),
    )
    .await;
    let base = vec![ic_e2e::ingest::stored(domain("", ""), 4, pb::Tier::T1)];
    ic_e2e::ingest::ingest(
        &picker.grpc,
        ic_e2e::ingest::resync(&replica("engine-other", OTHER), base),
    )
    .await;

    let mut request = chat_body();
    assert_eq!(
        pick_for(&picker.epp, &request).await.as_deref(),
        Some(OTHER)
    );
    request["model"] = "sql-lora".into();
    assert_eq!(
        pick_for(&picker.epp, &request).await.as_deref(),
        Some(HOLDER)
    );
    let mut salted = chat_body();
    salted["cache_salt"] = "tenant-a".into();
    assert_eq!(
        pick_for(&picker.epp, &salted).await.as_deref(),
        Some(HOLDER)
    );
    // Both decisions were prefix matches, not load.
    let (_, metrics) = ic_e2e::http_get(picker.process.admin_addr(), "/metrics");
    assert!(
        metrics.contains("inferencecache_index_epp_picks_total{by=\"prefix\"} 3"),
        "{metrics}"
    );
    assert!(picker.process.stop().success());
}

/// A gateway that traces its requests: the pick's span joins the client
/// request's trace (its `traceparent` header), or the ext_proc call's own
/// span when the gateway sends one in the stream's metadata.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pick_joins_the_gateways_trace() {
    let receiver = ic_e2e::otlp::Receiver::start();
    let endpoint = receiver.endpoint();
    let picker = start_with(&[
        "--otlp-endpoint",
        &endpoint,
        "--otlp-export-interval-seconds",
        "1",
    ]);
    feed_holder(&picker.grpc).await;
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let client_span = "b7ad6b7169203331";
    let mut request = headers("/v1/chat/completions", false);
    if let Some(processing_request::Request::RequestHeaders(h)) = &mut request.request {
        h.headers.as_mut().unwrap().headers.push(HeaderValue {
            key: "traceparent".into(),
            raw_value: ic_e2e::otlp::traceparent(trace, client_span).into_bytes(),
            ..HeaderValue::default()
        });
    }
    let chat = serde_json::to_vec(&chat_body()).unwrap();
    let r = exchange(
        &picker.epp,
        vec![
            with_mode(request, BodySendMode::Buffered),
            body(&chat, true),
        ],
        2,
    )
    .await;
    assert_eq!(picked(&r[1]).as_deref(), Some(HOLDER));
    let span = receiver.wait_for("the pick's span", std::time::Duration::from_secs(30), |r| {
        r["service"] == "ic-index-server" && r["name"] == "pick_endpoint" && r["trace_id"] == trace
    });
    assert_eq!(span["parent_span_id"], client_span, "{span}");
    assert_eq!(span["attributes"]["outcome"], "picked", "{span}");
    assert_eq!(span["attributes"]["replica"], "engine-holder", "{span}");
    assert_eq!(span["attributes"]["path"], "/v1/chat/completions", "{span}");
}

/// A tool-calling conversation (tools offered, an assistant's tool calls,
/// their results) is rendered as vLLM renders it, so the pick finds the
/// engine holding the blocks of the token ids vLLM computed for it (the
/// goldens of tests/fixtures/chat-tools, made by the real vLLM), not the
/// one holding the conversation rendered without its tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_calling_conversation_goes_to_the_engine_holding_it() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat-tools");
    let tokenizer = format!("tiny-tools={dir}/tokenizer.json");
    let mut picker = start_with(&["--tokenizer", &tokenizer]);
    generous_budget(&picker.grpc).await;
    let goldens: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{dir}/goldens.json")).unwrap())
            .unwrap();
    let golden = goldens
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "tool_call_round_trip")
        .unwrap();
    // The body as the client sent it (its key order is what the template prints).
    let body = golden["body"].as_str().unwrap().as_bytes();
    let tokens: Vec<u32> = golden["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| u32::try_from(t.as_u64().unwrap()).unwrap())
        .collect();
    // The same conversation rendered without its tools.
    let tokenizers = Tokenizers::load(&[ic_index_server::TokenizerSpec {
        model: "tiny-tools".into(),
        path: Path::new(dir).join("tokenizer.json"),
    }])
    .unwrap();
    let Some(ic_index_server::openai::Prompt::Chat(mut chat)) =
        ic_index_server::openai::parse("/v1/chat/completions", body)
            .unwrap()
            .prompt
    else {
        panic!("not a chat prompt");
    };
    chat.tools = None;
    let without_tools = tokenizers.encode_chat("tiny-tools", &chat).unwrap();
    assert_ne!(without_tools[..16], tokens[..16]);
    hold(&picker.grpc, "tiny-tools", "engine-holder", HOLDER, &tokens).await;
    hold(
        &picker.grpc,
        "tiny-tools",
        "engine-other",
        OTHER,
        &without_tools,
    )
    .await;
    let r = buffered(&picker.epp, body).await;
    assert_eq!(picked(&r[1]).as_deref(), Some(HOLDER));
    let (_, metrics) = ic_e2e::http_get(picker.process.admin_addr(), "/metrics");
    assert!(
        metrics.contains("inferencecache_index_epp_picks_total{by=\"prefix\"} 1"),
        "{metrics}"
    );
    assert!(picker.process.stop().success());
}

/// The picker holds at most `--epp-max-held-body-bytes` of bodies across
/// its streams: a stream whose chunk finds no room is routed by load at
/// once (its chunks handed back), counted; a stream that goes away gives
/// its share back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_held_across_streams_stay_within_the_budget() {
    let mut picker = start_with(&[
        "--epp-max-body-bytes",
        "1048576",
        "--epp-max-held-body-bytes",
        "1048576",
    ]);
    let admin = picker.process.admin_addr();
    let held = move || {
        let (_, metrics) = ic_e2e::http_get(admin, "/metrics");
        ic_e2e::metric_value(&metrics, "inferencecache_index_epp_held_body_bytes")
    };
    // Stream A holds 700,000 bytes of a body still coming.
    let mut client = ExternalProcessorClient::connect(picker.epp.clone())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mode = with_mode(
        headers("/v1/chat/completions", false),
        BodySendMode::FullDuplexStreamed,
    );
    tx.send(mode.clone()).await.unwrap();
    tx.send(body(&vec![b' '; 700_000], false)).await.unwrap();
    let stream_a = client
        .process(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while held() != Some(700_000.0) {
        assert!(std::time::Instant::now() < deadline, "held {:?}", held());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Stream B's 400,000 bytes find no room: picked by load at once, its
    // chunk handed back.
    let chunk = vec![b' '; 400_000];
    let r = exchange(&picker.epp, vec![mode, body(&chunk, false)], 2).await;
    assert!(picked(&r[0]).is_some(), "{:?}", r[0]);
    let (_, metrics) = ic_e2e::http_get(picker.process.admin_addr(), "/metrics");
    assert!(
        metrics.contains("inferencecache_index_epp_unread_total{reason=\"held_body_budget\"} 1"),
        "{metrics}"
    );
    assert_eq!(held(), Some(700_000.0), "B gave its share back");
    // Stream A goes away: its share comes back.
    drop((stream_a, tx));
    while held() != Some(0.0) {
        assert!(std::time::Instant::now() < deadline, "held {:?}", held());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(picker.process.stop().success());
}
