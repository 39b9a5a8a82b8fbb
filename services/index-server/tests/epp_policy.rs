//! The endpoint picker under the namespace's policy and the cluster's
//! InferenceObjectives, and one picker serving several InferencePools,
//! against the real `ic-index-server` binary with an ext_proc client built
//! from Envoy's protos in the message order Envoy sends. The policies are
//! pushed through the real SetPolicies, as the controller pushes them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    ProcessingRequest, ProcessingResponse, external_processor_client::ExternalProcessorClient,
    processing_request, processing_response,
};
use ic_e2e::ServiceProcess;
use ic_e2e::ext_proc::{buffered, headers};
use ic_proto::index_v1 as pb;

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";
const TOKENS: [u32; 16] = [7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];

struct Server {
    process: ServiceProcess,
    epp: String,
    grpc: String,
}

fn start(extra: &[&str]) -> Server {
    let mut args = vec![
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--epp-addr",
        "127.0.0.1:0",
        "--engine-block-size",
        "4",
    ];
    args.extend_from_slice(extra);
    let mut process =
        ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_ic-index-server")), &args);
    let epp = format!("http://{}", process.addr("epp"));
    let grpc = format!("http://{}", process.addr("grpc"));
    Server { process, epp, grpc }
}

async fn set_policies(grpc: &str, request: pb::SetPoliciesRequest) {
    pb::index_service_client::IndexServiceClient::connect(grpc.to_owned())
        .await
        .unwrap()
        .set_policies(request)
        .await
        .unwrap();
}

/// team-a's policy: a lookup budget no loaded machine runs past, and
/// `change` on top.
fn team_a(change: impl FnOnce(&mut pb::NamespacePolicy)) -> pb::NamespacePolicy {
    let mut p = pb::NamespacePolicy {
        namespace: "team-a".into(),
        lookup_timeout_ms: 10_000,
        allow_tier2_matches: true,
        ..Default::default()
    };
    change(&mut p);
    p
}

fn objective(pool: &str, name: &str, priority: i32) -> pb::ObjectivePriority {
    pb::ObjectivePriority {
        namespace: "team-a".into(),
        pool: pool.into(),
        name: name.into(),
        priority,
    }
}

/// The engine at `address` reports holding TOKENS' blocks.
async fn holds(grpc: &str, replica_id: &str, address: &str) {
    let fps = ic_kvevents::Fingerprint::to_raw(ic_kvevents::chain_fingerprints(None, &TOKENS, 4));
    let replica = ic_e2e::ingest::Replica {
        tenant: "team-a",
        model: "m",
        replica_id,
        address,
        dp_rank: 0,
    };
    let event = ic_e2e::ingest::stored(fps, 4, pb::Tier::T1);
    ic_e2e::ingest::ingest(grpc, ic_e2e::ingest::resync(&replica, vec![event])).await;
}

fn with_objective(mut m: ProcessingRequest, objective: &str) -> ProcessingRequest {
    if let Some(processing_request::Request::RequestHeaders(h)) = &mut m.request {
        h.headers.as_mut().unwrap().headers.push(HeaderValue {
            key: "x-gateway-inference-objective".into(),
            raw_value: objective.as_bytes().to_vec(),
            ..HeaderValue::default()
        });
    }
    m
}

/// One ext_proc stream: `messages` sent, `expect` answers read, the
/// stream (and so a pick's in-flight count) kept open until dropped. The
/// call carries `pool` as its `x-inferencecache-pool` metadata, as Envoy's
/// `grpc_initial_metadata` does.
struct Open {
    _tx: tokio::sync::mpsc::Sender<ProcessingRequest>,
    answers: Vec<ProcessingResponse>,
}

async fn open(
    epp: &str,
    pool: Option<&str>,
    messages: Vec<ProcessingRequest>,
    expect: usize,
) -> Open {
    let mut client = ExternalProcessorClient::connect(epp.to_owned())
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    for m in messages {
        tx.send(m).await.unwrap();
    }
    let mut call = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(pool) = pool {
        call.metadata_mut()
            .insert("x-inferencecache-pool", pool.parse().unwrap());
    }
    let mut responses = client.process(call).await.unwrap().into_inner();
    let mut answers = Vec::new();
    while answers.len() < expect {
        let next = tokio::time::timeout(Duration::from_secs(10), responses.message())
            .await
            .expect("the picker answered in time")
            .unwrap()
            .expect("a response, not the end of the stream");
        answers.push(next);
    }
    tokio::spawn(async move { while let Ok(Some(_)) = responses.message().await {} });
    Open { _tx: tx, answers }
}

/// The pick of a headers-only request (naming `objective`), or the status
/// of its refusal.
async fn pick(epp: &str, pool: Option<&str>, objective: Option<&str>) -> Result<String, i32> {
    let mut m = headers("/v1/completions", true);
    if let Some(o) = objective {
        m = with_objective(m, o);
    }
    let o = open(epp, pool, vec![m], 1).await;
    outcome(&o.answers[0])
}

fn outcome(r: &ProcessingResponse) -> Result<String, i32> {
    if let Some(processing_response::Response::ImmediateResponse(i)) = &r.response {
        return Err(i.status.as_ref().unwrap().code);
    }
    let list = ic_e2e::ext_proc::destinations(r).expect("a destination");
    Ok(list.split(',').next().unwrap().to_owned())
}

/// A BUFFERED completion of TOKENS, held open after its pick.
async fn tokens_request(epp: &str) -> Open {
    let body = serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": TOKENS})).unwrap();
    open(epp, None, buffered("/v1/completions", &body), 2).await
}

/// Sheddable requests are refused once the least busy endpoint has one
/// request; the request's priority comes from the pushed InferenceObjective
/// over `--epp-objective`, the thresholds from the namespace's policy over
/// the flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objectives_and_shedding_come_from_the_pushed_policy_over_the_flags() {
    let endpoints = format!("{A},{B}");
    let s = start(&[
        "--epp-tenant",
        "team-a",
        "--epp-endpoint",
        &endpoints,
        "--epp-objective",
        "batch=5,flagged=-1",
        "--epp-shed-at-requests",
        "1",
        "--pick-half-life-ms",
        "1",
    ]);
    // One request in flight on each endpoint.
    let _busy = [
        open(&s.epp, None, vec![headers("/v1/completions", true)], 1).await,
        open(&s.epp, None, vec![headers("/v1/completions", true)], 1).await,
    ];
    // The flags alone: "flagged" is sheddable, "batch" critical.
    assert_eq!(pick(&s.epp, None, Some("flagged")).await, Err(429));
    assert!(pick(&s.epp, None, Some("batch")).await.is_ok());

    // The cluster's objective wins over the flag for the same name; the
    // flag still answers for the names the cluster does not have.
    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(|_| {})],
            objectives: vec![objective("any-pool", "batch", -2)],
        },
    )
    .await;
    assert_eq!(pick(&s.epp, None, Some("batch")).await, Err(429));
    assert_eq!(pick(&s.epp, None, Some("flagged")).await, Err(429));
    assert!(
        pick(&s.epp, None, None).await.is_ok(),
        "standard: never shed"
    );

    // The namespace's CachePolicy: standard requests shed at 1 too, and
    // sheddable ones never (0), whatever the flags say.
    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(|p| {
                p.shed_sheddable_at_requests = Some(1);
                p.shed_standard_at_requests = Some(1);
                p.shed_critical_at_requests = Some(0);
            })],
            objectives: vec![],
        },
    )
    .await;
    assert_eq!(pick(&s.epp, None, None).await, Err(429));
    assert!(
        pick(&s.epp, None, Some("batch")).await.is_ok(),
        "critical again: the objective is gone from the cluster, the flag's 5 holds"
    );
    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(|p| {
                p.shed_sheddable_at_requests = Some(0);
                p.shed_standard_at_requests = Some(0);
                p.shed_critical_at_requests = Some(0);
            })],
            objectives: vec![],
        },
    )
    .await;
    assert!(
        pick(&s.epp, None, Some("flagged")).await.is_ok(),
        "never shed"
    );
}

/// The namespace's scoring weights decide the pick: with one request in
/// flight on the endpoint holding the prompt, the default weights (prefix
/// 2, load 1) keep the prompt there; a policy that weighs the prefix at 0
/// sends it to the idle endpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_s_scoring_weights_decide_the_pick() {
    let endpoints = format!("{A},{B}");
    let s = start(&[
        "--epp-tenant",
        "team-a",
        "--epp-endpoint",
        &endpoints,
        "--load-bound=0",
        "--epp-fallback-endpoints",
        "0",
    ]);
    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(|_| {})],
            objectives: vec![],
        },
    )
    .await;
    holds(&s.grpc, "engine-b", B).await;
    let first = tokens_request(&s.epp).await;
    assert_eq!(outcome(&first.answers[1]), Ok(B.into()), "the holder");
    let again = tokens_request(&s.epp).await;
    assert_eq!(outcome(&again.answers[1]), Ok(B.into()), "default weights");
    drop(again);

    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(|p| p.score_prefix_weight = Some(0.0))],
            objectives: vec![],
        },
    )
    .await;
    let moved = tokens_request(&s.epp).await;
    assert_eq!(outcome(&moved.answers[1]), Ok(A.into()), "prefix weighs 0");
}

/// LookupRoute under the namespace's load bound: a second lookup of the
/// same prompt is over the default bound (1.25) with two replicas, and
/// within it once the policy turns the bound off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_route_follows_the_namespace_s_load_bound() {
    let s = start(&["--epp-tenant", "team-a", "--epp-endpoint", A]);
    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(|_| {})],
            objectives: vec![],
        },
    )
    .await;
    holds(&s.grpc, "engine-a", A).await;
    let fps =
        ic_kvevents::Fingerprint::to_raw(ic_kvevents::chain_fingerprints(None, &[9, 9, 9, 9], 4));
    let other = ic_e2e::ingest::Replica {
        tenant: "team-a",
        model: "m",
        replica_id: "engine-b",
        address: B,
        dp_rank: 0,
    };
    let event = ic_e2e::ingest::stored(fps, 4, pb::Tier::T1);
    ic_e2e::ingest::ingest(&s.grpc, ic_e2e::ingest::resync(&other, vec![event])).await;
    let client = pb::index_service_client::IndexServiceClient::connect(s.grpc.clone())
        .await
        .unwrap();
    let lookup = || {
        // A gateway following the answer: each lookup counts as a pick.
        let request = pb::LookupRouteRequest {
            observe_only: false,
            ..ic_e2e::ingest::token_lookup("team-a", "m", TOKENS.to_vec())
        };
        let mut client = client.clone();
        async move { client.lookup_route(request).await.unwrap().into_inner() }
    };
    let first = lookup().await;
    assert_eq!(first.outcome, pb::LookupOutcome::PrefixMatch as i32);
    let second = lookup().await;
    assert_eq!(
        second.no_hint_reason,
        pb::NoHintReason::LoadBound as i32,
        "{second:?}"
    );
    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(|p| p.load_bound = Some(0.0))],
            objectives: vec![],
        },
    )
    .await;
    let third = lookup().await;
    assert_eq!(
        third.outcome,
        pb::LookupOutcome::PrefixMatch as i32,
        "{third:?}"
    );
}

/// One picker, two pools: each stream's `x-inferencecache-pool` metadata
/// chooses the pool its request is picked from (and whose objectives
/// apply); a stream naming none, or a pool not served, is refused with 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_picker_serves_several_pools_chosen_by_the_call_s_metadata() {
    let chat = format!("chat={A}");
    let batch = format!("team-a/batch={B}");
    let mut s = start(&[
        "--epp-tenant",
        "team-a",
        "--epp-pool-endpoint",
        &chat,
        "--epp-pool-endpoint",
        &batch,
        "--epp-shed-at-requests",
        "1",
        "--pick-half-life-ms",
        "1",
    ]);
    for _ in 0..3 {
        assert_eq!(pick(&s.epp, Some("chat"), None).await, Ok(A.into()));
        assert_eq!(pick(&s.epp, Some("team-a/batch"), None).await, Ok(B.into()));
    }
    assert_eq!(pick(&s.epp, None, None).await, Err(503), "which pool?");
    assert_eq!(pick(&s.epp, Some("other"), None).await, Err(503));
    assert_eq!(pick(&s.epp, Some("team-b/chat"), None).await, Err(503));
    // A BUFFERED request: the refusal answers its first message.
    let body = serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": "hi"})).unwrap();
    let r = open(&s.epp, None, buffered("/v1/completions", &body), 1).await;
    assert_eq!(outcome(&r.answers[0]), Err(503));

    // An objective applies to its own pool only.
    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(|_| {})],
            objectives: vec![objective("batch", "bulk", -1)],
        },
    )
    .await;
    let _busy_chat = open(
        &s.epp,
        Some("chat"),
        vec![headers("/v1/completions", true)],
        1,
    )
    .await;
    let _busy_batch = open(
        &s.epp,
        Some("batch"),
        vec![headers("/v1/completions", true)],
        1,
    )
    .await;
    assert_eq!(pick(&s.epp, Some("batch"), Some("bulk")).await, Err(429));
    assert_eq!(pick(&s.epp, Some("chat"), Some("bulk")).await, Ok(A.into()));
    let metrics = ic_e2e::http_get(s.process.admin_addr(), "/metrics").1;
    assert!(
        metrics.contains("inferencecache_index_epp_refusals_total{reason=\"unknown_pool\"} 4"),
        "{metrics}"
    );
}

const C: &str = "10.0.0.3:8000";

/// The engine at `address` reports `running` requests and `kv_usage`,
/// holding one block of a prompt of its own (so the index knows it).
async fn reports(grpc: &str, replica_id: &str, address: &str, running: u32, kv_usage: f32) {
    let own: Vec<u32> = (0..4).map(|t| 1_000 + t + running * 10).collect();
    let fps = ic_kvevents::Fingerprint::to_raw(ic_kvevents::chain_fingerprints(None, &own, 4));
    let replica = ic_e2e::ingest::Replica {
        tenant: "team-a",
        model: "m",
        replica_id,
        address,
        dp_rank: 0,
    };
    let event = ic_e2e::ingest::stored(fps, 4, pb::Tier::T1);
    let mut batch = ic_e2e::ingest::resync(&replica, vec![event]);
    batch.engine_load = Some(pb::EngineLoad {
        waiting: 0,
        running,
        kv_usage,
    });
    ic_e2e::ingest::ingest(grpc, batch).await;
}

/// Flags weighing requests alone; the policies pushed in these tests
/// weigh KV usage alone, so the two rank B (busy, empty cache) and C
/// (idle, full cache) in opposite orders.
const BY_REQUESTS: [&str; 5] = [
    // Scored by the weights, not by predicted TTFT.
    "--ttft-prefill-tokens-per-second=0",
    "--score-load-weight=1",
    "--score-kv-usage-weight=0",
    "--load-bound=0",
    "--epp-tenant=team-a",
];

fn by_kv_usage(p: &mut pb::NamespacePolicy) {
    p.score_load_weight = Some(0.0);
    p.score_kv_usage_weight = Some(1.0);
}

/// The fallbacks after the pick are ranked by load as the pick is: under
/// the namespace's CachePolicy scoring over the flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallbacks_rank_by_the_namespace_s_scoring() {
    let endpoints = format!("{A},{B},{C}");
    let mut args = BY_REQUESTS.to_vec();
    args.extend([
        "--epp-endpoint",
        &endpoints,
        "--epp-fallback-endpoints",
        "2",
    ]);
    let s = start(&args);
    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(|_| {})],
            objectives: vec![],
        },
    )
    .await;
    holds(&s.grpc, "engine-a", A).await;
    reports(&s.grpc, "engine-b", B, 6, 0.0).await;
    reports(&s.grpc, "engine-c", C, 0, 0.95).await;
    let list = |o: &Open| ic_e2e::ext_proc::destinations(&o.answers[1]).expect("a destination");
    let flags = tokens_request(&s.epp).await;
    assert_eq!(list(&flags), format!("{A},{C},{B}"), "by requests (flags)");
    drop(flags);

    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(by_kv_usage)],
            objectives: vec![],
        },
    )
    .await;
    let policy = tokens_request(&s.epp).await;
    assert_eq!(
        list(&policy),
        format!("{A},{B},{C}"),
        "by KV usage (the namespace's CachePolicy)"
    );
}

/// Shedding before tokenizing counts requests whatever the namespace's
/// scoring ranks first: by KV usage the busy A (6 requests) is the pick,
/// but the idle C is under the threshold, so nothing is shed until every
/// endpoint is at it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedding_counts_requests_whatever_the_scoring_ranks_first() {
    let endpoints = format!("{A},{B},{C}");
    let mut args = BY_REQUESTS.to_vec();
    args.extend([
        "--epp-endpoint",
        &endpoints,
        "--epp-shed-at-requests",
        "3",
        "--epp-shed-standard-at-requests",
        "3",
    ]);
    let s = start(&args);
    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(|_| {})],
            objectives: vec![],
        },
    )
    .await;
    reports(&s.grpc, "engine-a", A, 6, 0.0).await;
    reports(&s.grpc, "engine-b", B, 7, 0.1).await;
    reports(&s.grpc, "engine-c", C, 0, 0.95).await;
    assert_eq!(pick(&s.epp, None, None).await, Ok(C.into()), "by requests");

    set_policies(
        &s.grpc,
        pb::SetPoliciesRequest {
            policies: vec![team_a(by_kv_usage)],
            objectives: vec![],
        },
    )
    .await;
    assert_eq!(
        pick(&s.epp, None, None).await,
        Ok(A.into()),
        "by KV usage A is the pick, over the threshold, and C (0 requests) is under it"
    );
    reports(&s.grpc, "engine-c", C, 5, 0.95).await;
    assert_eq!(
        pick(&s.epp, None, None).await,
        Err(429),
        "every endpoint has at least 3 requests"
    );
}
