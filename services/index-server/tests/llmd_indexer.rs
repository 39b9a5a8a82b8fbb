//! llm-d's remote indexer API (`indexer.v1.IndexerService/GetPodScores`),
//! called on the real `ic-index-server` binary with a client generated from
//! the wire-identical `proto/llmd/indexer.proto`. The index is fed through
//! the real IngestEvents stream; prompts are tokenized with the shipped
//! fixture tokenizer, as the server does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use ic_e2e::ServiceProcess;
use ic_e2e::ingest::{self, Replica};
use ic_index_server::tokenize::Tokenizers;
use ic_proto::index_v1 as pb;
use ic_proto::llmd_indexer_v1::indexer_service_client::IndexerServiceClient;
use ic_proto::llmd_indexer_v1::{GetPodScoresRequest, PodScore};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat");
const PROMPT: &str = "You are a helpful assistant. What is a KV cache and why does prefix \
                      reuse matter for the latency of long conversations?";

fn prompt_blocks() -> Vec<u64> {
    let tokenizers = Tokenizers::load(&[ic_index_server::TokenizerSpec {
        model: "tiny-chat".into(),
        path: Path::new(FIXTURES).join("tokenizer.json"),
    }])
    .unwrap();
    let tokens = tokenizers.encode("tiny-chat", PROMPT).unwrap();
    let fps = ic_kvevents::Fingerprint::to_raw(ic_kvevents::chain_fingerprints(None, &tokens, 4));
    assert!(fps.len() >= 8, "the prompt spans several blocks");
    fps
}

fn start(extra: &[&str]) -> (ServiceProcess, String) {
    let tokenizer = format!("tiny-chat={FIXTURES}/tokenizer.json");
    let mut args = vec![
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--tokenizer",
        &tokenizer,
        "--engine-block-size",
        "4",
    ];
    args.extend_from_slice(extra);
    let mut process =
        ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_ic-index-server")), &args);
    let grpc = format!("http://{}", process.addr("grpc"));
    (process, grpc)
}

/// A lookup budget no loaded test machine runs past: the default 20 ms is
/// counted from the request's arrival and includes tokenizing, slow in a
/// debug build on busy cores, and a lookup past it scores nobody. The
/// scores asserted are then decided by the index, never by a timeout.
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

/// One engine (rank) reports holding `fps` at `tier`.
async fn feed(
    grpc: &str,
    replica_id: &str,
    address: &str,
    dp_rank: u32,
    fps: &[u64],
    tier: pb::Tier,
) {
    let replica = Replica {
        tenant: "team-a",
        model: "tiny-chat",
        replica_id,
        address,
        dp_rank,
    };
    let event = ingest::stored(fps.to_vec(), 4, tier);
    ingest::ingest(grpc, ingest::resync(&replica, vec![event])).await;
}

fn request(ids: &[&str]) -> GetPodScoresRequest {
    GetPodScoresRequest {
        prompt: PROMPT.into(),
        model_name: "tiny-chat".into(),
        pod_identifiers: ids.iter().map(|s| (*s).to_owned()).collect(),
    }
}

fn sorted(mut scores: Vec<PodScore>) -> Vec<(String, f64, Option<i32>)> {
    scores.sort_by(|a, b| (&a.pod, a.data_parallel_rank).cmp(&(&b.pod, b.data_parallel_rank)));
    scores
        .into_iter()
        .map(|s| (s.pod, s.score, s.data_parallel_rank))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_pod_scores_answers_llm_d_routers_from_the_index() {
    let (mut process, grpc) = start(&["--llmd-indexer-tenant", "team-a"]);
    generous_budget(&grpc).await;
    let fps = prompt_blocks();
    let n = fps.len();
    feed(&grpc, "engine-a", "10.0.0.1:8000", 0, &fps, pb::Tier::T1).await;
    feed(
        &grpc,
        "engine-b",
        "10.0.0.2:8000",
        0,
        &fps[..5],
        pb::Tier::T2,
    )
    .await;
    feed(
        &grpc,
        "engine-dp",
        "10.0.0.5:8000",
        0,
        &fps[..1],
        pb::Tier::T1,
    )
    .await;
    feed(
        &grpc,
        "engine-dp",
        "10.0.0.5:8000",
        1,
        &fps[..3],
        pb::Tier::T1,
    )
    .await;

    let mut client = IndexerServiceClient::connect(grpc.clone()).await.unwrap();
    // As llm-d's scorer names pods: by address, here in every accepted form.
    let scores = client
        .get_pod_scores(request(&[
            "10.0.0.1",
            "10.0.0.2:8000",
            "10.0.0.5",
            "10.0.0.9",
        ]))
        .await
        .unwrap()
        .into_inner()
        .scores;
    assert_eq!(
        sorted(scores),
        vec![
            ("10.0.0.1".to_owned(), n as f64, None),
            // Five blocks at T2, each worth 0.8.
            ("10.0.0.2:8000".to_owned(), 4.0, None),
            // A data-parallel pod: one entry, its best rank (llm-d's Go
            // client keys a map by pod; two entries would keep the last).
            ("10.0.0.5".to_owned(), 3.0, Some(1)),
        ],
        "10.0.0.9 is unknown: left out"
    );

    // One rank, by llm-d's `@dpN` (even the weaker one), and a pod by its
    // name.
    let scores = client
        .get_pod_scores(request(&["10.0.0.5@dp0", "10.0.0.5@dp1", "engine-a"]))
        .await
        .unwrap()
        .into_inner()
        .scores;
    assert_eq!(
        sorted(scores),
        vec![
            ("10.0.0.5".to_owned(), 1.0, Some(0)),
            ("10.0.0.5".to_owned(), 3.0, Some(1)),
            ("engine-a".to_owned(), n as f64, None),
        ]
    );

    // No identifiers: every holder once, named as llm-d's index names
    // pods (ip:port).
    let scores = client
        .get_pod_scores(request(&[]))
        .await
        .unwrap()
        .into_inner()
        .scores;
    let pods: Vec<String> = sorted(scores).into_iter().map(|s| s.0).collect();
    assert_eq!(pods, ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.5:8000"]);

    // A prompt nobody holds scores nobody.
    let mut cold = request(&["10.0.0.1"]);
    cold.prompt = "Entirely different words that no engine has seen before today.".into();
    let scores = client
        .get_pod_scores(cold)
        .await
        .unwrap()
        .into_inner()
        .scores;
    assert!(scores.is_empty(), "{scores:?}");

    // Bad input: a clear error naming the field.
    let mut no_model = request(&[]);
    no_model.model_name.clear();
    let e = client.get_pod_scores(no_model).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("model_name"), "{e:?}");
    let mut unknown = request(&[]);
    unknown.model_name = "no-such-model".into();
    let e = client.get_pod_scores(unknown).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(e.message().contains("model_name"), "{e:?}");
    let mut empty = request(&[]);
    empty.prompt.clear();
    let e = client.get_pod_scores(empty).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("prompt"), "{e:?}");
    let many: Vec<String> = (0..5000)
        .map(|i| format!("10.1.{}.{}", i / 256, i % 256))
        .collect();
    let e = client
        .get_pod_scores(GetPodScoresRequest {
            pod_identifiers: many,
            ..request(&[])
        })
        .await
        .unwrap_err();
    assert!(e.message().contains("pod_identifiers"), "{e:?}");

    // The index kept what it had, and the calls are counted.
    let scores = client
        .get_pod_scores(request(&["10.0.0.1"]))
        .await
        .unwrap()
        .into_inner()
        .scores;
    assert_eq!(scores.len(), 1);
    let metrics = ic_e2e::http_get(process.admin_addr(), "/metrics").1;
    for line in [
        "inferencecache_index_llmd_pod_scores_total{outcome=\"scored\"} 4",
        "inferencecache_index_llmd_pod_scores_total{outcome=\"no_match\"} 1",
        "inferencecache_index_llmd_pod_scores_total{outcome=\"invalid\"} 3",
        "inferencecache_index_llmd_pod_scores_total{outcome=\"no_tokenizer\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    // Scoring is not a pick: no speculative holder was recorded.
    assert!(
        metrics.contains("inferencecache_index_speculative_entries 0"),
        "{metrics}"
    );
}

/// A match whose blocks sit at different tiers weighs each block by its
/// own tier, as llm-d's longest-prefix scorer does: GPU, GPU, CPU, GPU,
/// GPU is 1 + 1 + 0.8 + 1 + 1, not five blocks at the coldest tier's 0.8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_tier_match_weighs_block_by_block() {
    let (_process, grpc) = start(&["--llmd-indexer-tenant", "team-a"]);
    generous_budget(&grpc).await;
    let fps = prompt_blocks();
    let replica = Replica {
        tenant: "team-a",
        model: "tiny-chat",
        replica_id: "engine-m",
        address: "10.0.0.7:8000",
        dp_rank: 0,
    };
    // One chain, its middle block held only in the offload tier.
    let part = |from: usize, to: usize, tier: pb::Tier| pb::IndexEvent {
        kind: Some(pb::index_event::Kind::Stored(pb::BlocksStored {
            parent_fingerprint: if from == 0 { 0 } else { fps[from - 1] },
            start_depth: u32::try_from(from).unwrap(),
            fingerprints: fps[from..to].to_vec(),
            block_size: 4,
            tier: tier as i32,
            at_unix_ms: 0,
        })),
    };
    let events = vec![
        part(0, 2, pb::Tier::T1),
        part(2, 3, pb::Tier::T2),
        part(3, 5, pb::Tier::T1),
    ];
    ingest::ingest(&grpc, ingest::resync(&replica, events)).await;
    feed(
        &grpc,
        "engine-g",
        "10.0.0.8:8000",
        0,
        &fps[..4],
        pb::Tier::T1,
    )
    .await;
    let mut client = IndexerServiceClient::connect(grpc).await.unwrap();
    let scores = client
        .get_pod_scores(request(&["10.0.0.7", "10.0.0.8"]))
        .await
        .unwrap()
        .into_inner()
        .scores;
    let scores = sorted(scores);
    assert_eq!(scores.len(), 2, "{scores:?}");
    assert_eq!(scores[0].0, "10.0.0.7");
    assert!((scores[0].1 - 4.8).abs() < 1e-9, "{scores:?}");
    assert_eq!(scores[1], ("10.0.0.8".to_owned(), 4.0, None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_pod_scores_is_off_unless_a_tenant_is_configured() {
    let (_process, grpc) = start(&[]);
    let mut client = IndexerServiceClient::connect(grpc).await.unwrap();
    let e = client.get_pod_scores(request(&[])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{e:?}");
}

#[test]
fn a_bad_tier_weight_or_empty_tenant_is_refused_at_start() {
    for (args, expected) in [
        (&["--llmd-indexer-tenant", " "][..], "--llmd-indexer-tenant"),
        (&["--llmd-t2-weight", "1.5"][..], "--llmd-t2-weight"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ic-index-server"))
            .args(["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// The bytes llm-d's Go client and server exchange, written out by hand
/// from llm-d-kv-cache's `indexer.proto` field numbers and types (not from
/// our copy of it), decode and encode as our generated types do.
#[test]
fn the_wire_format_is_llm_ds() {
    use prost::Message;
    // prompt = 1 (string), model_name = 2 (string), pod_identifiers = 3.
    let request = [
        &[0x0a, 2][..],
        b"hi",
        &[0x12, 1],
        b"m",
        &[0x1a, 8],
        b"10.0.0.1",
        &[0x1a, 3],
        b"a@1",
    ]
    .concat();
    let decoded = GetPodScoresRequest::decode(request.as_slice()).unwrap();
    assert_eq!(decoded.prompt, "hi");
    assert_eq!(decoded.model_name, "m");
    assert_eq!(decoded.pod_identifiers, ["10.0.0.1", "a@1"]);
    // scores = 1 (message PodScore: pod = 1 string, score = 2 double,
    // data_parallel_rank = 3 optional int32).
    let response = ic_proto::llmd_indexer_v1::GetPodScoresResponse {
        scores: vec![PodScore {
            pod: "p".into(),
            score: 2.0,
            data_parallel_rank: Some(1),
        }],
    };
    let score = [
        &[0x0a, 1][..],
        b"p",
        &[0x11],
        &2.0f64.to_le_bytes(),
        &[0x18, 1],
    ]
    .concat();
    let expected = [&[0x0a, u8::try_from(score.len()).unwrap()][..], &score].concat();
    assert_eq!(response.encode_to_vec(), expected);
    // The gRPC path llm-d's client calls.
    assert_eq!(
        <ic_proto::llmd_indexer_v1::indexer_service_server::IndexerServiceServer<
            ic_index_server::llmd::LlmdIndexer,
        > as tonic::server::NamedService>::NAME,
        "indexer.v1.IndexerService"
    );
}
