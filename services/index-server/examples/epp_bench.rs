//! Endpoint-picker decision latency and throughput on loopback: the real
//! `ic-index-server` binary (build it first, same profile), 8 replicas in
//! its index, and concurrent gateways sending `/v1/chat/completions` bodies
//! of about 2,000 tokens (rendered with the fixture chat template and
//! tokenized by the picker) in BUFFERED mode, as Envoy does.
//!
//! `cargo run --release -p ic-index-server --example epp_bench -- [concurrency] [seconds]`

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use ic_index_server::tokenize::{ChatMessage, Tokenizers};
use ic_proto::index_v1 as pb;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat");
const SENTENCES: [&str; 4] = [
    "What is a KV cache and why does prefix reuse matter for latency? ",
    "The key value cache stores attention keys and values for every token. ",
    "Routing a prompt to the engine that already holds its prefix saves prefill. ",
    "Summarize the conversation so far in three short sentences please. ",
];

fn messages(conversation: usize, tokenizers: &Tokenizers) -> Vec<ChatMessage> {
    let mut user = format!("Conversation {conversation}. ");
    loop {
        let m = vec![
            ChatMessage {
                role: "system".into(),
                content: "You are a helpful assistant.".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: user.clone(),
            },
        ];
        if tokenizers.encode_chat("tiny-chat", &m).unwrap().len() >= 2_000 {
            return m;
        }
        user.push_str(SENTENCES[user.len() % SENTENCES.len()]);
    }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let concurrency: usize = args.get(1).map_or(8, |a| a.parse().unwrap());
    let seconds: u64 = args.get(2).map_or(10, |a| a.parse().unwrap());
    let tokenizers = Tokenizers::load(&[ic_index_server::TokenizerSpec {
        model: "tiny-chat".into(),
        path: Path::new(FIXTURES).join("tokenizer.json"),
    }])
    .unwrap();
    let endpoints: Vec<String> = (1..=8).map(|i| format!("10.0.0.{i}:8000")).collect();
    let tokenizer = format!("tiny-chat={FIXTURES}/tokenizer.json");
    let mut process = ic_e2e::ServiceProcess::start(
        &ic_e2e::workspace_binary("ic-index-server"),
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--epp-addr",
            "127.0.0.1:0",
            "--epp-tenant",
            "bench",
            "--epp-endpoint",
            &endpoints.join(","),
            "--tokenizer",
            &tokenizer,
        ],
    );
    let epp = format!("http://{}", process.addr("epp"));
    let grpc = format!("http://{}", process.addr("grpc"));
    // Each replica holds 16 of the 64 conversations the gateways send.
    let conversations: Vec<Vec<ChatMessage>> = (0..64).map(|c| messages(c, &tokenizers)).collect();
    for (r, address) in endpoints.iter().enumerate() {
        let events = conversations
            .iter()
            .enumerate()
            .filter(|(c, _)| c % endpoints.len() == r)
            .map(|(_, m)| {
                let tokens = tokenizers.encode_chat("tiny-chat", m).unwrap();
                ic_e2e::ingest::stored(
                    ic_kvevents::Fingerprint::to_raw(ic_kvevents::chain_fingerprints(
                        None, &tokens, 16,
                    )),
                    16,
                    pb::Tier::T1,
                )
            })
            .collect();
        let replica_id = format!("engine-{r}");
        let replica = ic_e2e::ingest::Replica {
            tenant: "bench",
            model: "tiny-chat",
            replica_id: &replica_id,
            address,
            dp_rank: 0,
        };
        ic_e2e::ingest::ingest(&grpc, ic_e2e::ingest::resync(&replica, events)).await;
    }
    let bodies: Vec<Vec<u8>> = conversations
        .iter()
        .map(|m| {
            serde_json::to_vec(
                &serde_json::json!({"model": "tiny-chat", "messages": m, "stream": true}),
            )
            .unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for g in 0..concurrency {
        let epp = epp.clone();
        let bodies = bodies.clone();
        tasks.push(tokio::spawn(async move {
            let mut client = ExternalProcessorClient::connect(epp).await.unwrap();
            let mut latencies = Vec::new();
            let mut i = g;
            while Instant::now() < deadline {
                let started = Instant::now();
                let mut responses = client
                    .process(futures::stream::iter(ic_e2e::ext_proc::buffered(
                        "/v1/chat/completions",
                        &bodies[i % bodies.len()],
                    )))
                    .await
                    .unwrap()
                    .into_inner();
                let mut n = 0;
                while let Some(_r) = responses.message().await.unwrap() {
                    n += 1;
                }
                assert_eq!(n, 2, "headers and body answered");
                latencies.push(started.elapsed());
                i += concurrency;
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    let pct =
        |p: f64| all[((p / 100.0 * all.len() as f64).ceil() as usize).clamp(1, all.len()) - 1];
    let metrics = ic_e2e::http_get(process.admin_addr(), "/metrics").1;
    let prefix = metrics
        .lines()
        .find(|l| l.starts_with("inferencecache_index_epp_picks_total{by=\"prefix\"}"))
        .unwrap_or("none");
    println!(
        "{} picks in {seconds} s with {concurrency} gateways: {:.0} picks/s; per pick (ext_proc round trip, \
         chat template + tokenizing ~2,000 tokens + lookup) p50 {} µs, p99 {} µs; {prefix}",
        all.len(),
        all.len() as f64 / seconds as f64,
        pct(50.0).as_micros(),
        pct(99.0).as_micros(),
    );
    assert!(process.stop().success());
}
