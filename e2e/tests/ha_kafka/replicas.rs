//! The `ha_kafka` scenarios' parts: index-server replicas consuming the
//! topic, subscribers producing to it, and the checks that every replica
//! equals what the engines hold and answers alike (with a dump of every
//! Kafka metric and the broker's log when they do not).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use ic_e2e::tansu::Broker;
use ic_e2e::{ServiceProcess, http_get, workspace_binary};
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;

use crate::TOPIC;
use crate::fleet::{self, Engine, MODEL, TENANT, metric};
use crate::gateway::Endpoint;

/// How long any scenario may take to converge before the test fails.
pub const CONVERGE: Duration = Duration::from_secs(120);

/// One index-server replica consuming the topic, its endpoint picker
/// serving the gateway.
pub struct Replica {
    pub process: ServiceProcess,
    pub grpc: u16,
    pub epp: u16,
    pub http: SocketAddr,
}

impl Replica {
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            epp_port: self.epp,
            http: self.http,
        }
    }
}

/// The picker's tokenizer and the engines' addresses (as `fleet` names them).
pub const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../services/index-server/tests/fixtures/chat/tokenizer.json"
);
pub const ENGINES: u64 = 3;

pub fn replica(broker: &str, snapshots: Option<&Path>) -> Replica {
    replica_with(broker, snapshots, &[])
}

pub fn replica_with(broker: &str, snapshots: Option<&Path>, extra: &[&str]) -> Replica {
    let mut args: Vec<String> = [
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--transport",
        "kafka",
        "--kafka-brokers",
        broker,
        "--kafka-topic",
        TOPIC,
        "--kafka-ready-lag-messages",
        "0",
        "--kafka-snapshot-interval-seconds",
        "1",
        "--epp-addr",
        "127.0.0.1:0",
        "--epp-tenant",
        TENANT,
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.push("--epp-endpoint".into());
    args.push(
        (0..ENGINES)
            .map(|i| format!("10.0.0.{i}:8000"))
            .collect::<Vec<_>>()
            .join(","),
    );
    args.push("--tokenizer".into());
    args.push(format!("{MODEL}={TOKENIZER}"));
    if let Some(dir) = snapshots {
        args.push("--kafka-snapshot-dir".into());
        args.push(dir.display().to_string());
    }
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut process = ServiceProcess::start(&workspace_binary("ic-index-server"), &args);
    let grpc = process.addr("grpc").port();
    let epp = process.addr("epp").port();
    let http = process.admin_addr();
    Replica {
        process,
        grpc,
        epp,
        http,
    }
}

/// What makes a subscriber publish to the topic instead of streaming.
pub fn kafka_flags(broker: &str) -> Vec<&str> {
    vec![
        "--transport",
        "kafka",
        "--kafka-brokers",
        broker,
        "--kafka-topic",
        TOPIC,
        "--kafka-resync-interval-seconds",
        "20",
        "--kafka-delivery-timeout-ms",
        "3000",
    ]
}

/// Not dialled with `--transport kafka`.
pub const NO_INDEX_SERVER: &str = "http://127.0.0.1:9";

/// GET from a replica; when it cannot answer, fail with its logs.
pub fn get(r: &mut Replica, path: &str) -> (u16, String) {
    let http = r.http;
    match std::panic::catch_unwind(|| http_get(http, path)) {
        Ok(answer) => answer,
        Err(_) => {
            // Let the last lines of its log arrive.
            std::thread::sleep(Duration::from_secs(1));
            let status = r.process.wait_exit();
            panic!(
                "GET {path}: the replica stopped serving ({status}); its logs:\n{}",
                r.process.logs().join("\n")
            );
        }
    }
}

pub fn snapshot_blocks(r: &mut Replica) -> Option<BTreeMap<String, u64>> {
    let (status, body) = get(r, "/snapshot");
    if status != 200 {
        return None;
    }
    let mut blocks = fleet::blocks_of_snapshot(&body)?;
    blocks.retain(|_, n| *n > 0);
    Some(blocks)
}

/// What LookupRoute answers for each engine's newest prompt, observe-only
/// (so asking leaves no pick behind): the outcome and each candidate's
/// replica and matched blocks.
pub type Answers = Vec<(i32, Vec<(String, u32)>)>;

pub async fn answers(grpc: u16, engines: &[Engine]) -> Result<Answers, String> {
    let mut client = IndexServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for engine in engines {
        let Some((tokens, _)) = engine.newest() else {
            continue;
        };
        let mut request = ic_e2e::ingest::token_lookup(TENANT, MODEL, tokens);
        request.observe_only = true;
        let r = client
            .lookup_route(request)
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let mut candidates: Vec<(String, u32)> = r
            .candidates
            .iter()
            .map(|c| {
                (
                    c.replica
                        .as_ref()
                        .map_or(String::new(), |id| id.replica_id.clone()),
                    c.matched_blocks,
                )
            })
            .collect();
        candidates.sort();
        out.push((r.outcome, candidates));
    }
    Ok(out)
}

/// Whether one replica holds exactly what the engines hold.
pub async fn matches_engines(r: &mut Replica, engines: &[Engine]) -> Result<Answers, String> {
    let want: BTreeMap<String, u64> = engines
        .iter()
        .filter(|e| e.blocks() > 0)
        .map(|e| (e.replica.clone(), e.blocks()))
        .collect();
    let have = snapshot_blocks(r).ok_or("no snapshot")?;
    if have != want {
        return Err(format!("snapshot {have:?}, engines hold {want:?}"));
    }
    let answers = answers(r.grpc, engines).await?;
    for (engine, (outcome, candidates)) in engines
        .iter()
        .filter(|e| e.newest().is_some())
        .zip(&answers)
    {
        let blocks = engine.newest().map(|(_, b)| b);
        let held = candidates
            .iter()
            .find(|(id, _)| *id == engine.replica)
            .map(|(_, n)| *n);
        if *outcome != pb::LookupOutcome::PrefixMatch as i32 || held != blocks {
            return Err(format!(
                "{}'s newest prompt ({blocks:?} blocks): outcome {outcome}, {candidates:?}",
                engine.replica
            ));
        }
    }
    Ok(answers)
}

/// Waits until every replica equals the engines, all answer alike and all
/// are ready; returns how long it took. On failure it names every
/// replica's state and dumps what tells a slow broker's causes apart: each
/// replica's Kafka metrics, each subscriber's, the broker's panics (from
/// its whole log) and its log's tail.
pub async fn converge(
    replicas: &mut [&mut Replica],
    engines: &[Engine],
    broker: &Broker,
    sidecars: &mut [ServiceProcess],
    what: &str,
) -> Duration {
    let started = Instant::now();
    loop {
        let mut states = Vec::new();
        let mut first: Option<Answers> = None;
        for (i, r) in replicas.iter_mut().enumerate() {
            let state = match matches_engines(r, engines).await {
                Ok(a) => match &first {
                    None => {
                        first = Some(a);
                        Ok(())
                    }
                    Some(f) if *f != a => Err(format!("answers {a:?}, replica 0 {f:?}")),
                    Some(_) => Ok(()),
                },
                Err(why) => Err(why),
            };
            let (status, _) = get(r, "/ready");
            states.push(match state {
                Ok(()) if status == 200 => Ok(()),
                Ok(()) => Err(format!("replica {i}: /ready {status}")),
                Err(why) => Err(format!("replica {i} (/ready {status}): {why}")),
            });
        }
        if states.iter().all(Result::is_ok) {
            return started.elapsed();
        }
        if started.elapsed() >= CONVERGE {
            let why: Vec<String> = states
                .into_iter()
                .map(|s| s.err().unwrap_or_else(|| "converged".into()))
                .collect();
            let dump = diagnose(replicas, sidecars, broker);
            panic!(
                "{what}: the replicas did not converge within {CONVERGE:?}:\n{}\n{dump}",
                why.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The lines of `/metrics` under `prefix`, or why there are none.
pub fn metrics_under(http: SocketAddr, prefix: &str) -> String {
    match std::panic::catch_unwind(|| http_get(http, "/metrics")) {
        Ok((_, text)) => text
            .lines()
            .filter(|l| l.starts_with(prefix))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(_) => format!("(no /metrics from {http})"),
    }
}

/// Each replica's Kafka batches, consumer errors and lag; each
/// subscriber's produced, delivered, dropped and resync counts and its
/// producers created and retired; the broker's panics and log tail.
pub fn diagnose(
    replicas: &[&mut Replica],
    sidecars: &mut [ServiceProcess],
    broker: &Broker,
) -> String {
    let mut out = String::new();
    for (i, r) in replicas.iter().enumerate() {
        out += &format!(
            "replica {i}:\n{}\n",
            metrics_under(r.http, "inferencecache_index_kafka_")
        );
    }
    for (i, s) in sidecars.iter_mut().enumerate() {
        out += &format!(
            "subscriber {i}:\n{}\n",
            metrics_under(s.admin_addr(), "inferencecache_subscriber_kafka_")
        );
    }
    let panics = broker.panics();
    out += &format!("broker panics ({}):\n{}\n", panics.len(), panics.join("\n"));
    let log = std::fs::read_to_string(broker.log_path()).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    out += "broker log tail:\n";
    for line in tail.into_iter().rev() {
        out += line;
        out += "\n";
    }
    out
}

/// Producers the subscribers created and retired after failures, summed.
pub fn producers(sidecars: &mut [ServiceProcess]) -> String {
    let (mut created, mut retired) = (0.0, 0.0);
    for s in sidecars.iter_mut() {
        let admin = s.admin_addr();
        created += metric(
            admin,
            "inferencecache_subscriber_kafka_producers_created_total",
        );
        retired += metric(
            admin,
            "inferencecache_subscriber_kafka_producers_retired_total",
        );
    }
    format!("{created} created, {retired} retired")
}

/// Records the subscribers could not deliver in time, summed.
pub fn records_dropped(sidecars: &mut [ServiceProcess]) -> f64 {
    sidecars
        .iter_mut()
        .map(|s| {
            let admin = s.admin_addr();
            metric(
                admin,
                "inferencecache_subscriber_kafka_records_dropped_total",
            )
        })
        .sum()
}

/// Publishes `n` new prompts one at a time and measures, for each, how long
/// until replica `grpc` answers it with a full match; (p50, p99).
pub async fn event_to_visible(engine: &mut Engine, grpc: u16, n: usize) -> (Duration, Duration) {
    let mut client = IndexServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .unwrap();
    let mut took = Vec::new();
    for _ in 0..n {
        engine.store(3).await;
        let started = Instant::now();
        let (tokens, blocks) = engine.newest().unwrap();
        loop {
            let mut request = ic_e2e::ingest::token_lookup(TENANT, MODEL, tokens.clone());
            request.observe_only = true;
            let r = client.lookup_route(request).await.unwrap().into_inner();
            if r.best.as_ref().is_some_and(|b| b.matched_blocks == blocks) {
                took.push(started.elapsed());
                break;
            }
            assert!(
                started.elapsed() < CONVERGE,
                "an event never became visible"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    took.sort();
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
    (at(0.5), at(0.99))
}

pub fn figure(scenario: &str, value: impl std::fmt::Display) {
    eprintln!("kafka figure: {scenario}: {value}");
}
