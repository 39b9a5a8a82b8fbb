//! Endpoint-picker decision latency and throughput on loopback: the real
//! `ic-index-server` binary (build it first, same profile), 8 replicas in
//! its index, and concurrent gateways sending `/v1/chat/completions` bodies
//! of about 2,000 tokens (rendered with the fixture chat template and
//! tokenized by the picker) in BUFFERED mode, as Envoy does.
//!
//! Then, on the same server, alternating with the picks: LookupRoute with
//! the same prompts as token ids (tokenized by the client), the decision
//! without parsing, template and tokenizing; and, in this process, the
//! picker's tokenizing of a body (template + tokenizer) against the
//! tokenizer library alone on the rendered text (its `encode`, and its
//! `encode_fast`, without offsets, which the picker calls). Last, the same prompts
//! as token ids to the picker (a completions body, nothing to tokenize)
//! alternating with LookupRoute: the decision without a tokenizer run just
//! before it. Beside each kind of phase, the server's context switches and
//! CPU migrations per request, summed over its threads from
//! `/proc/<pid>/task/*/sched` around the phases.
//!
//! `cargo run --release -p ic-index-server --example epp_bench -- [concurrency] [seconds]`
//! (`EPP_BENCH_LOOKUP_TIMEOUT_MS=N`: the tenant's lookup budget, for runs
//! under valgrind; `EPP_BENCH_ENVOY_ORDER=1`: each gateway sends the body
//! only once the headers are answered, as Envoy does in BUFFERED mode,
//! instead of both at once)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use ic_index_server::tokenize::{ChatPrompt, Tokenizers};
use ic_proto::index_v1 as pb;

#[path = "common/conversations.rs"]
mod conversations;
use conversations::messages;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat");
const CHAT: &str = "/v1/chat/completions";

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
    let conversations: Vec<ChatPrompt> = (0..64).map(|c| messages(c, &tokenizers)).collect();
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
    if let Some(ms) = std::env::var("EPP_BENCH_LOOKUP_TIMEOUT_MS").ok().map(|v| {
        v.parse::<u32>()
            .expect("EPP_BENCH_LOOKUP_TIMEOUT_MS: milliseconds")
    }) {
        // Under valgrind the default 20 ms budget (tokenizing inside it)
        // expires on every request, so the walk and the ranking never run.
        pb::index_service_client::IndexServiceClient::connect(grpc.clone())
            .await
            .unwrap()
            .set_policies(pb::SetPoliciesRequest {
                policies: vec![pb::NamespacePolicy {
                    namespace: "bench".into(),
                    lookup_timeout_ms: ms,
                    allow_tier2_matches: true,
                    ..Default::default()
                }],
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let bodies: Vec<Vec<u8>> = conversations
        .iter()
        .map(|m| {
            serde_json::to_vec(
                &serde_json::json!({"model": "tiny-chat", "messages": m.messages, "stream": true}),
            )
            .unwrap()
        })
        .collect();
    let prompts: Vec<Vec<u32>> = conversations
        .iter()
        .map(|m| tokenizers.encode_chat("tiny-chat", m).unwrap())
        .collect();
    let mut picks = Vec::new();
    let mut lookups = Vec::new();
    let server = process.pid();
    let (mut chat_sched, mut lookup_sched) = (Scheduled::default(), Scheduled::default());
    // Alternating, half the time each, twice: the box's load drifts.
    let half = Duration::from_secs(seconds).max(Duration::from_secs(2)) / 2;
    for _ in 0..2 {
        let before = threads(server);
        let phase = pick_phase(&epp, CHAT, &bodies, concurrency, half).await;
        chat_sched.add(server, &before, phase.len());
        picks.extend(phase);
        let before = threads(server);
        let phase = lookup_phase(&grpc, &prompts, concurrency, half).await;
        lookup_sched.add(server, &before, phase.len());
        lookups.extend(phase);
    }
    let measured = 2.0 * half.as_secs_f64();
    let metrics = ic_e2e::http_get(process.admin_addr(), "/metrics").1;
    let prefix = metrics
        .lines()
        .find(|l| l.starts_with("inferencecache_index_epp_picks_total{by=\"prefix\"}"))
        .unwrap_or("none");
    let (pick_p50, pick_p99) = (pct(&mut picks, 50.0), pct(&mut picks, 99.0));
    let (lookup_p50, lookup_p99) = (pct(&mut lookups, 50.0), pct(&mut lookups, 99.0));
    println!(
        "{} picks in {measured} s with {concurrency} gateways: {:.0} picks/s; per pick (ext_proc round trip, \
         chat template + tokenizing ~2,000 tokens + lookup) p50 {} µs, p99 {} µs; {prefix}",
        picks.len(),
        picks.len() as f64 / measured,
        pick_p50.as_micros(),
        pick_p99.as_micros(),
    );
    println!(
        "{} LookupRoute (the same prompts as token ids) in {measured} s: {:.0}/s; p50 {} µs, p99 {} µs",
        lookups.len(),
        lookups.len() as f64 / measured,
        lookup_p50.as_micros(),
        lookup_p99.as_micros(),
    );
    // The server's own timers, side by side: the picker's decision less
    // its tokenizing, and LookupRoute's handler with the same token ids.
    let (decision, lookup) = (
        histogram(
            &metrics,
            "inferencecache_index_epp_decision_without_tokenizing_seconds",
        ),
        histogram(&metrics, "inferencecache_index_lookup_duration_seconds"),
    );
    println!(
        "in the server: the picker's decision without tokenizing mean {:.1} µs, p50 ≤ {:.0} µs \
         ({} picks); LookupRoute's handler mean {:.1} µs, p50 ≤ {:.0} µs ({} lookups); \
         decision / lookup {:.2}",
        decision.mean * 1e6,
        decision.p50_bound * 1e6,
        decision.count,
        lookup.mean * 1e6,
        lookup.p50_bound * 1e6,
        lookup.count,
        decision.mean / lookup.mean,
    );
    println!(
        "the server's threads in those phases: per chat pick {chat_sched}; per LookupRoute {lookup_sched}"
    );
    // Like for like: LookupRoute's timer starts with its token ids decoded,
    // this one with the picker's body read (older servers lack it).
    let name = "inferencecache_index_epp_decision_without_reading_or_tokenizing_seconds";
    if metrics.contains(&format!("{name}_count ")) {
        let from_read = histogram(&metrics, name);
        println!(
            "in the server: the picker's decision less reading the body and tokenizing mean \
             {:.1} µs, p50 ≤ {:.0} µs; decision less reading / lookup {:.2}",
            from_read.mean * 1e6,
            from_read.p50_bound * 1e6,
            from_read.mean / lookup.mean,
        );
    }
    // The same prompts sent to the picker as token ids (a completions body:
    // no template, no tokenizing), alternating with LookupRoute, each
    // phase's share of the server's timers taken from /metrics around it:
    // the decision with no tokenizer run before it, against the lookup.
    if metrics.contains(&format!("{name}_count ")) {
        let token_bodies: Vec<Vec<u8>> = prompts
            .iter()
            .map(|ids| {
                serde_json::to_vec(&serde_json::json!({"model": "tiny-chat", "prompt": ids}))
                    .unwrap()
            })
            .collect();
        let lookup_name = "inferencecache_index_lookup_duration_seconds";
        let (mut decided, mut looked) = ((0.0, 0.0), (0.0, 0.0));
        let (mut token_sched, mut lookup_sched) = (Scheduled::default(), Scheduled::default());
        for _ in 0..2 {
            let before = sum_count(process.admin_addr(), name);
            let threads_before = threads(server);
            let phase = pick_phase(
                &epp,
                "/v1/completions",
                &token_bodies,
                concurrency,
                half / 2,
            )
            .await;
            token_sched.add(server, &threads_before, phase.len());
            let after = sum_count(process.admin_addr(), name);
            decided = (
                decided.0 + after.0 - before.0,
                decided.1 + after.1 - before.1,
            );
            let before = sum_count(process.admin_addr(), lookup_name);
            let threads_before = threads(server);
            let phase = lookup_phase(&grpc, &prompts, concurrency, half / 2).await;
            lookup_sched.add(server, &threads_before, phase.len());
            let after = sum_count(process.admin_addr(), lookup_name);
            looked = (looked.0 + after.0 - before.0, looked.1 + after.1 - before.1);
        }
        let (d, l) = (decided.0 / decided.1, looked.0 / looked.1);
        println!(
            "the same prompts as token ids to the picker (/v1/completions, nothing to tokenize), \
             alternating with LookupRoute: the decision less reading the body mean {:.1} µs \
             ({} picks) against LookupRoute's handler {:.1} µs ({} lookups); decision / lookup {:.2}",
            d * 1e6,
            decided.1,
            l * 1e6,
            looked.1,
            d / l,
        );
        println!(
            "the server's threads in those phases: per token-id pick {}; per LookupRoute {}",
            token_sched, lookup_sched,
        );
    }
    // Tokenizing, in this process, one thread: the picker's path (template
    // + tokenizer) and the tokenizer library alone on the rendered text.
    let library =
        tokenizers::Tokenizer::from_file(Path::new(FIXTURES).join("tokenizer.json")).unwrap();
    let rendered: Vec<String> = conversations
        .iter()
        .map(|m| tokenizers.render_chat("tiny-chat", m).unwrap())
        .collect();
    let rounds = 3 * conversations.len();
    let mut alone = Duration::ZERO;
    let mut fast = Duration::ZERO;
    let mut picker = Duration::ZERO;
    for round in 0..3 * rounds {
        let c = round % conversations.len();
        let t = Instant::now();
        match round % 3 {
            0 => {
                std::hint::black_box(library.encode(rendered[c].as_str(), false).unwrap());
                alone += t.elapsed();
            }
            1 => {
                std::hint::black_box(library.encode_fast(rendered[c].as_str(), false).unwrap());
                fast += t.elapsed();
            }
            _ => {
                std::hint::black_box(
                    tokenizers
                        .encode_chat("tiny-chat", &conversations[c])
                        .unwrap(),
                );
                picker += t.elapsed();
            }
        }
    }
    let tokens: usize = prompts.iter().map(Vec::len).sum::<usize>() / prompts.len();
    let body_bytes: usize = bodies.iter().map(Vec::len).sum::<usize>() / bodies.len();
    let per = |d: Duration| d / u32::try_from(rounds).unwrap();
    println!(
        "tokenizing one ~{tokens}-token chat body ({body_bytes} bytes of JSON): the picker's path \
         (template + tokenizer) {} µs, \
         the tokenizer library alone {} µs ({:.1} M tokens/s; without offsets, `encode_fast`, \
         {} µs); the pick p50 less the picker's tokenizing {} µs against LookupRoute's p50 {} µs",
        per(picker).as_micros(),
        per(alone).as_micros(),
        tokens as f64 / per(alone).as_secs_f64() / 1e6,
        per(fast).as_micros(),
        pick_p50.saturating_sub(per(picker)).as_micros(),
        lookup_p50.as_micros(),
    );
    assert!(process.stop().success());
}

/// Each thread of process `pid` by id: its context switches and its moves
/// between CPUs so far (`/proc/<pid>/task/<tid>/sched`; empty where the
/// kernel keeps no such file).
fn threads(pid: u32) -> HashMap<u64, [u64; 2]> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return HashMap::new();
    };
    let mut all = HashMap::new();
    for task in tasks.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let Ok(sched) = std::fs::read_to_string(task.path().join("sched")) else {
            continue;
        };
        let mut counts = [0; 2];
        for (name, value) in sched.lines().filter_map(|l| l.split_once(':')) {
            let slot = match name.trim() {
                "nr_switches" => 0,
                "se.nr_migrations" => 1,
                _ => continue,
            };
            counts[slot] = value.trim().parse().unwrap_or(0);
        }
        all.insert(tid, counts);
    }
    all
}

/// The server's context switches and CPU migrations over some phases, and
/// the requests they served.
#[derive(Default)]
struct Scheduled {
    switches: u64,
    migrations: u64,
    requests: usize,
}

impl Scheduled {
    /// Adds a phase of `requests` that began with `before` (a thread that
    /// ended during the phase is not counted; one that began, all of it).
    fn add(&mut self, pid: u32, before: &HashMap<u64, [u64; 2]>, requests: usize) {
        for (tid, [switches, migrations]) in threads(pid) {
            let [s0, m0] = before.get(&tid).copied().unwrap_or_default();
            self.switches += switches.saturating_sub(s0);
            self.migrations += migrations.saturating_sub(m0);
        }
        self.requests += requests;
    }
}

impl std::fmt::Display for Scheduled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.requests.max(1) as f64;
        write!(
            f,
            "{:.2} context switches, {:.2} CPU migrations ({} requests)",
            self.switches as f64 / n,
            self.migrations as f64 / n,
            self.requests
        )
    }
}

/// A histogram of the server's /metrics: its mean and the upper bound of
/// the bucket holding its median.
struct Histogram {
    count: u64,
    mean: f64,
    p50_bound: f64,
}

fn histogram(metrics: &str, name: &str) -> Histogram {
    let value = |suffix: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}_{suffix} ")))
            .unwrap_or_else(|| panic!("{name}_{suffix} missing from /metrics"))
            .parse()
            .unwrap()
    };
    let count = value("count");
    let bucket_prefix = format!("{name}_bucket{{le=\"");
    let p50_bound = metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&bucket_prefix))
        .filter_map(|l| l.split_once("\"} "))
        .find(|(_, n)| n.parse::<f64>().unwrap() * 2.0 >= count)
        .map_or(f64::INFINITY, |(le, _)| le.parse().unwrap_or(f64::INFINITY));
    Histogram {
        count: count as u64,
        mean: value("sum") / count,
        p50_bound,
    }
}

/// A histogram's sum and count on the server's /metrics now.
fn sum_count(admin: std::net::SocketAddr, name: &str) -> (f64, f64) {
    let metrics = ic_e2e::http_get(admin, "/metrics").1;
    let value = |suffix: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}_{suffix} ")))
            .map_or(0.0, |v| v.parse().unwrap())
    };
    (value("sum"), value("count"))
}

fn pct(all: &mut [Duration], p: f64) -> Duration {
    all.sort_unstable();
    all[((p / 100.0 * all.len() as f64).ceil() as usize).clamp(1, all.len()) - 1]
}

/// Picks over ext_proc for `phase`, `concurrency` gateways; the latency of each.
async fn pick_phase(
    epp: &str,
    path: &'static str,
    bodies: &[Vec<u8>],
    concurrency: usize,
    phase: Duration,
) -> Vec<Duration> {
    let deadline = Instant::now() + phase;
    let envoy_order = std::env::var_os("EPP_BENCH_ENVOY_ORDER").is_some();
    let mut tasks = Vec::new();
    for g in 0..concurrency {
        let epp = epp.to_owned();
        let bodies = bodies.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut client = ExternalProcessorClient::connect(epp).await.unwrap();
            let mut latencies = Vec::new();
            let mut i = g;
            while Instant::now() < deadline {
                let started = Instant::now();
                let [headers, body]: [_; 2] =
                    ic_e2e::ext_proc::buffered(path, &bodies[i % bodies.len()])
                        .try_into()
                        .unwrap();
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                tx.send(headers).unwrap();
                // The body, then the gateway's half-close.
                let mut send_body = Some(move || tx.send(body).unwrap());
                if !envoy_order {
                    send_body.take().unwrap()();
                }
                let mut responses = client
                    .process(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
                    .await
                    .unwrap()
                    .into_inner();
                // With EPP_BENCH_ENVOY_ORDER, as Envoy in BUFFERED mode: the
                // body once the headers are answered (its
                // `send_body_without_waiting_for_header_response` applies to
                // STREAMED only). By default both at once, as before.
                let mut n = 0;
                while let Some(_r) = responses.message().await.unwrap() {
                    n += 1;
                    if let Some(send) = send_body.take() {
                        send();
                    }
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
    all
}

/// LookupRoute calls with `prompts` as token ids for `phase`.
async fn lookup_phase(
    grpc: &str,
    prompts: &[Vec<u32>],
    concurrency: usize,
    phase: Duration,
) -> Vec<Duration> {
    use pb::index_service_client::IndexServiceClient;
    let deadline = Instant::now() + phase;
    let mut tasks = Vec::new();
    for g in 0..concurrency {
        let grpc = grpc.to_owned();
        let prompts = prompts.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut client = IndexServiceClient::connect(grpc).await.unwrap();
            let mut latencies = Vec::new();
            let mut i = g;
            while Instant::now() < deadline {
                let request = pb::LookupRouteRequest {
                    scope: Some(pb::IndexScope {
                        tenant: "bench".into(),
                        model: "tiny-chat".into(),
                        hash_scheme: pb::HashScheme::Vllm as i32,
                        ..Default::default()
                    }),
                    key: Some(pb::lookup_route_request::Key::TokenIds(pb::TokenIds {
                        ids: prompts[i % prompts.len()].clone(),
                    })),
                    ..Default::default()
                };
                let started = Instant::now();
                let answer = client.lookup_route(request).await.unwrap().into_inner();
                latencies.push(started.elapsed());
                assert_eq!(
                    answer.outcome,
                    pb::LookupOutcome::PrefixMatch as i32,
                    "the same prompts are held"
                );
                i += concurrency;
            }
            latencies
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}
