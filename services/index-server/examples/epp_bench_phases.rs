//! The endpoint picker's decision split into phases, one request at a time,
//! in this process (no sockets, no other thread): the real `IndexCore`
//! holding the same 64 conversations of ~2,000 tokens as `epp_bench` (8
//! replicas), each request timed phase by phase:
//!
//! * `tokenize`: the chat template and the tokenizer (`encode_chat`);
//! * `hash`: the prompt's block fingerprints (`chain_fingerprints`);
//! * `decide`: the core's whole decision on the token ids
//!   (`IndexCore::route`, LookupRoute's purpose), which hashes again, walks
//!   the index and ranks.
//!
//! Orders, alternating request by request so the machine's drift falls on
//! all alike, each on its own prompts (no decision follows one of the same
//! prompt): `warm` (a decision right after the previous one, as
//! LookupRoute's and the token-id picks' run back to back), `chat` (the
//! decision right after tokenizing its prompt, as a chat pick's), and
//! `chat+hash` (after tokenizing, the fingerprints alone, then the
//! decision: how much of the cost after tokenizing is the hashing's).
//! `fast`: as `chat`, the tokenizer library's `encode_fast` (no offsets)
//! on the rendered text instead of `encode`.
//! `IC_PHASES_ORDERS=warm,chat,...` runs only those (for a profiler).
//! `IC_PHASES_EVICT_KB=N` adds `evict`: N KiB of memory written after the
//! decision before the next (what part of the cost after tokenizing a plain
//! cache eviction of that size explains).
//!
//! `cargo run --release -p ic-index-server --example epp_bench_phases -- [rounds]`

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ic_index::{HashScheme, Index, IndexConfig, Scope};
use ic_index_server::index_core::{IndexCore, Prompt, Purpose, RouteRequest, Routed};
use ic_index_server::ingest::IngestStream;
use ic_index_server::metrics::Metrics;
use ic_index_server::tokenize::{ChatPrompt, Tokenizers};
use ic_proto::index_v1 as pb;
use ic_telemetry::MetricsRegistry;

#[path = "common/conversations.rs"]
mod conversations;
use conversations::messages;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat");

/// Per-phase totals of one order.
#[derive(Default)]
struct Phases {
    n: u32,
    tokenize: Duration,
    hash: Duration,
    decide: Vec<Duration>,
}

impl Phases {
    fn line(&mut self, name: &str) -> String {
        self.decide.sort_unstable();
        let n = self.n.max(1);
        let mean = self.decide.iter().sum::<Duration>() / n;
        let p50 = self.decide.get(self.decide.len() / 2).copied();
        format!(
            "{name:>9}: decide mean {:6.2} µs p50 {:6.2} µs; hash {:6.2} µs; tokenize {:7.1} µs ({} requests)",
            mean.as_secs_f64() * 1e6,
            p50.unwrap_or_default().as_secs_f64() * 1e6,
            (self.hash / n).as_secs_f64() * 1e6,
            (self.tokenize / n).as_secs_f64() * 1e6,
            self.n
        )
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(3_000, |a| a.parse().unwrap());
    let evict_kb: usize = std::env::var("IC_PHASES_EVICT_KB")
        .ok()
        .map_or(0, |v| v.parse().expect("IC_PHASES_EVICT_KB: KiB"));
    let spec = ic_index_server::TokenizerSpec {
        model: "tiny-chat".into(),
        path: Path::new(FIXTURES).join("tokenizer.json"),
    };
    let tokenizers = Tokenizers::load(std::slice::from_ref(&spec)).unwrap();
    let registry = MetricsRegistry::new("inferencecache", "bench");
    let core = IndexCore::new(
        Arc::new(Index::new(IndexConfig::default())),
        16,
        Metrics::register(&registry),
    )
    .with_tokenizers(Tokenizers::load(&[spec]).unwrap());
    let conversations: Vec<ChatPrompt> = (0..64).map(|c| messages(c, &tokenizers)).collect();
    let prompts: Vec<Vec<u32>> = conversations
        .iter()
        .map(|m| tokenizers.encode_chat("tiny-chat", m).unwrap())
        .collect();
    // Each of 8 replicas holds 8 of the 64 conversations, as in epp_bench.
    for r in 0..8 {
        let events = prompts
            .iter()
            .enumerate()
            .filter(|(c, _)| c % 8 == r)
            .map(|(_, tokens)| {
                ic_e2e::ingest::stored(
                    ic_kvevents::Fingerprint::to_raw(ic_kvevents::chain_fingerprints(
                        None, tokens, 16,
                    )),
                    16,
                    pb::Tier::T1,
                )
            })
            .collect();
        let replica_id = format!("engine-{r}");
        let address = format!("10.0.0.{}:8000", r + 1);
        let batch = ic_e2e::ingest::resync(
            &ic_e2e::ingest::Replica {
                tenant: "bench",
                model: "tiny-chat",
                replica_id: &replica_id,
                address: &address,
                dp_rank: 0,
            },
            events,
        );
        let mut stream = IngestStream::default();
        let step = stream.accept(batch).expect("a valid batch");
        core.ingest(step, None).expect("applied");
    }
    let scope = Scope {
        tenant: "bench".into(),
        model: "tiny-chat".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    };
    let decide = |tokens: &[u32]| -> Duration {
        let started = Instant::now();
        let routed = core.route(&RouteRequest {
            scope: &scope,
            prompt: Prompt::Tokens(tokens),
            candidates: None,
            extras: None,
            received: started,
            purpose: Purpose::Hint { record_pick: true },
        });
        let took = started.elapsed();
        match routed {
            Ok(Routed::Hint(r)) => assert!(r.destination().is_some(), "held: a hint"),
            other => panic!("not a hint: {other:?}"),
        }
        took
    };
    let mut evicted = vec![0u8; evict_kb * 1024];
    let library =
        tokenizers::Tokenizer::from_file(Path::new(FIXTURES).join("tokenizer.json")).unwrap();
    let all = ["warm", "chat", "chat+hash", "fast", "evict"];
    let only = std::env::var("IC_PHASES_ORDERS").unwrap_or_default();
    let orders: Vec<&str> = all
        .into_iter()
        .filter(|o| only.is_empty() || only.split(',').any(|x| x == *o))
        .collect();
    let mut phases: Vec<Phases> = orders.iter().map(|_| Phases::default()).collect();
    for round in 0..rounds * orders.len() {
        let order = round % orders.len();
        // Each order decides its own prompt, none the one just decided: a
        // decision never follows one of the same prompt (as in epp_bench).
        let c = (round / orders.len() + 16 * order) % conversations.len();
        let p = &mut phases[order];
        match orders[order] {
            "warm" => p.decide.push(decide(&prompts[c])),
            "chat" | "chat+hash" => {
                let t = Instant::now();
                let tokens = tokenizers
                    .encode_chat("tiny-chat", &conversations[c])
                    .unwrap();
                p.tokenize += t.elapsed();
                if orders[order] == "chat+hash" {
                    let t = Instant::now();
                    std::hint::black_box(ic_kvevents::chain_fingerprints(None, &tokens, 16));
                    p.hash += t.elapsed();
                }
                p.decide.push(decide(&tokens));
            }
            "fast" => {
                let t = Instant::now();
                let text = tokenizers
                    .render_chat("tiny-chat", &conversations[c])
                    .unwrap();
                let tokens = library
                    .encode_fast(text.as_str(), false)
                    .unwrap()
                    .get_ids()
                    .to_vec();
                p.tokenize += t.elapsed();
                assert_eq!(tokens, prompts[c], "encode_fast: the same ids");
                p.decide.push(decide(&tokens));
            }
            _ => {
                if evicted.is_empty() {
                    continue;
                }
                for (i, b) in evicted.iter_mut().enumerate().step_by(64) {
                    *b = b.wrapping_add(i as u8);
                }
                std::hint::black_box(&evicted);
                p.decide.push(decide(&prompts[c]));
            }
        }
        p.n += 1;
    }
    // The hash alone, warm (back to back), for the `hash` column's reference.
    let t = Instant::now();
    for c in 0..rounds {
        std::hint::black_box(ic_kvevents::chain_fingerprints(
            None,
            &prompts[c % prompts.len()],
            16,
        ));
    }
    let warm_hash = t.elapsed() / u32::try_from(rounds).unwrap();
    for (order, p) in orders.iter().zip(&mut phases) {
        if p.n > 0 {
            println!("{}", p.line(order));
        }
    }
    println!(
        "hash alone, back to back: {:.2} µs; evict: {evict_kb} KiB written before each decision",
        warm_hash.as_secs_f64() * 1e6
    );
}
