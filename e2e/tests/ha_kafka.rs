//! Active-active index servers over Kafka, with the real binaries on
//! loopback and the real tansu broker: engines publishing the real vLLM
//! wire, `ic-kvevent-subscriber --transport kafka` producing every batch to
//! one topic, and `ic-index-server --transport kafka` replicas each
//! consuming every partition on their own. Replicas are killed and
//! restarted (from their snapshot plus the log's tail), started late
//! (from the earliest offset), subscribers restarted, the broker frozen
//! past the delivery timeout and killed and restarted on its log; every
//! scenario ends with every replica equal to what the engines hold (its
//! `/snapshot` block count per replica and a full-length `LookupRoute`
//! match on each engine's newest prompt) and all replicas giving the same
//! LookupRoute answers.
//!
//! Times are printed as `kafka figure:` lines; nothing asserts a duration
//! beyond the generous "it converges at all" deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use ic_e2e::tansu::INSTALL;
use ic_e2e::{ServiceProcess, http_get, workspace_binary};
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use nix::sys::signal::Signal;

#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/gateway.rs"]
mod gateway;

use fleet::{Engine, MODEL, TENANT, metric, rounds};
use gateway::{Endpoint, Gateway, WORKERS};

const TOPIC: &str = "inferencecache.index-events";
const PARTITIONS: u32 = 3;
/// How long any scenario may take to converge before the test fails.
const CONVERGE: Duration = Duration::from_secs(120);

/// A tansu broker on a fixed loopback port (a restart takes the same one),
/// its log in a SQLite file as a Kafka broker keeps its log on disk, so a
/// restart comes back with the topic and its records. Stopped on drop.
struct Broker {
    child: Child,
    bin: PathBuf,
    port: u16,
    /// Holds the log across restarts; removed on drop.
    dir: tempfile::TempDir,
}

impl Broker {
    fn start_on(port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let bin = ic_e2e::tansu::binary();
        let child = Self::spawn(&bin, port, dir.path());
        let mut broker = Self {
            child,
            bin,
            port,
            dir,
        };
        broker.wait_listening();
        broker.create_topic();
        broker
    }

    fn spawn(bin: &Path, port: u16, dir: &Path) -> Child {
        ic_e2e::tansu::broker_command(bin, port, ic_e2e::tansu::Storage::Sqlite(dir))
            // tansu's tracing goes to stdout, a panic to stderr: both into
            // its log, warnings only (at info it logs every span, load on
            // the broker under test).
            .stdout(Self::log_file(dir))
            .stderr(Self::log_file(dir))
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}; {INSTALL}", bin.display()))
    }

    /// The broker's own log, kept beside its data across restarts.
    fn log_file(dir: &Path) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("broker.log"))
            .unwrap()
    }

    fn wait_listening(&mut self) {
        let log = self.dir.path().join("broker.log");
        let logs = || {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            format!("; its log:\n{text}")
        };
        ic_e2e::tansu::wait_listening(&mut self.child, self.port, logs);
    }

    /// SIGTERM, as a broker pod's restart or a node drain stops it. (After
    /// kill -9, tansu 0.6's SQLite store panics on the producers' next
    /// idempotent write and stops answering: a bug of the test broker, see
    /// docs/scaling.md.)
    fn stop(&mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap()),
            Signal::SIGTERM,
        )
        .unwrap();
        let _ = self.child.wait();
    }

    /// Start again on the same port and log after [`Broker::stop`].
    fn start_again(&mut self) {
        self.child = Self::spawn(&self.bin, self.port, self.dir.path());
        self.wait_listening();
    }

    /// tansu does not create topics on its own.
    fn create_topic(&self) {
        ic_e2e::tansu::create_topic(&self.bin, self.port, TOPIC, PARTITIONS);
    }

    fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Every panic in the broker's whole log (`ic_e2e::tansu::panics`).
    fn panics(&self) -> Vec<String> {
        ic_e2e::tansu::panics(&self.dir.path().join("broker.log"))
    }

    /// Fails the test when the broker panicked.
    fn assert_no_panic(&self, what: &str) {
        let panics = self.panics();
        assert!(
            panics.is_empty(),
            "{what}: the broker panicked:\n{}",
            panics.join("\n")
        );
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One index-server replica consuming the topic, its endpoint picker
/// serving the gateway.
struct Replica {
    process: ServiceProcess,
    grpc: u16,
    epp: u16,
    http: SocketAddr,
}

impl Replica {
    fn endpoint(&self) -> Endpoint {
        Endpoint {
            epp_port: self.epp,
            http: self.http,
        }
    }
}

/// The picker's tokenizer and the engines' addresses (as `fleet` names them).
const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../services/index-server/tests/fixtures/chat/tokenizer.json"
);
const ENGINES: u64 = 3;

fn replica(broker: &str, snapshots: Option<&Path>) -> Replica {
    replica_with(broker, snapshots, &[])
}

fn replica_with(broker: &str, snapshots: Option<&Path>, extra: &[&str]) -> Replica {
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
fn kafka_flags(broker: &str) -> Vec<&str> {
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
const NO_INDEX_SERVER: &str = "http://127.0.0.1:9";

/// GET from a replica; when it cannot answer, fail with its logs.
fn get(r: &mut Replica, path: &str) -> (u16, String) {
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

fn snapshot_blocks(r: &mut Replica) -> Option<BTreeMap<String, u64>> {
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
type Answers = Vec<(i32, Vec<(String, u32)>)>;

async fn answers(grpc: u16, engines: &[Engine]) -> Result<Answers, String> {
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
async fn matches_engines(r: &mut Replica, engines: &[Engine]) -> Result<Answers, String> {
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
async fn converge(
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
fn metrics_under(http: SocketAddr, prefix: &str) -> String {
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
fn diagnose(replicas: &[&mut Replica], sidecars: &mut [ServiceProcess], broker: &Broker) -> String {
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
    let log = std::fs::read_to_string(broker.dir.path().join("broker.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(40).collect();
    out += "broker log tail:\n";
    for line in tail.into_iter().rev() {
        out += line;
        out += "\n";
    }
    out
}

/// Producers the subscribers created and retired after failures, summed.
fn producers(sidecars: &mut [ServiceProcess]) -> String {
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
fn records_dropped(sidecars: &mut [ServiceProcess]) -> f64 {
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
async fn event_to_visible(engine: &mut Engine, grpc: u16, n: usize) -> (Duration, Duration) {
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

fn figure(scenario: &str, value: impl std::fmt::Display) {
    eprintln!("kafka figure: {scenario}: {value}");
}

/// Two replicas consuming; one killed with -9 and restarted from its
/// snapshot plus the tail; a third started late from the earliest offset;
/// a subscriber killed and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_survive_kills_late_starts_and_subscriber_restarts() {
    let broker = Broker::start_on(ic_e2e::free_port());
    let bootstrap = broker.bootstrap();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut a = replica(&bootstrap, Some(dirs[0].path()));
    let mut b = replica(&bootstrap, Some(dirs[1].path()));
    let (mut engines, mut sidecars) =
        fleet::fleet(3, NO_INDEX_SERVER, &kafka_flags(&bootstrap)).await;
    rounds(&mut engines, 20).await;
    let took = converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "two replicas",
    )
    .await;
    figure(
        "two replicas, 3 engines",
        format!("converged in {} ms", took.as_millis()),
    );
    let gateway = Gateway::start([a.endpoint(), b.endpoint()]);
    gateway.wait_ready(0, "at start").await;
    gateway.wait_ready(1, "at start").await;

    let (p50, p99) = event_to_visible(&mut engines[0], a.grpc, 40).await;
    figure(
        "event to visible in LookupRoute through Kafka, 40 events",
        format!("p50 {} ms, p99 {} ms", p50.as_millis(), p99.as_millis()),
    );

    // kill -9 one replica once it has written a snapshot; the engines go on.
    a.process.wait_for_log("snapshot written");
    a.process.signal(Signal::SIGKILL);
    assert!(!a.process.wait_exit().success());
    rounds(&mut engines, 20).await;
    let restarted_at = Instant::now();
    let mut a = replica(&bootstrap, Some(dirs[0].path()));
    gateway.replace(0, a.endpoint());
    let loaded = a
        .process
        .wait_for_log("snapshot loaded; replaying the topic from its offsets");
    assert!(
        loaded["fields"]["entries"].as_u64().unwrap_or(0) > 0,
        "the restarted replica loaded a non-empty snapshot: {loaded}"
    );
    rounds(&mut engines, 5).await;
    converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "after kill -9 and restart",
    )
    .await;
    figure(
        "replica kill -9, restart from snapshot + tail",
        format!(
            "converged {} ms after the restart",
            restarted_at.elapsed().as_millis()
        ),
    );
    assert!(metric(a.http, "inferencecache_index_kafka_snapshots_total") >= 1.0);
    gateway.wait_ready(0, "after kill -9 and restart").await;
    let (_, failed_at_kill) = gateway.counts();
    assert!(
        failed_at_kill <= WORKERS as u64,
        "a kill -9 costs at most the picks in flight ({WORKERS}): {failed_at_kill} failed, {:?}",
        gateway.failures.lock()
    );

    // A replica started late reads the whole retained log.
    let started = Instant::now();
    let mut c = replica(&bootstrap, None);
    gateway.add(c.endpoint());
    converge(
        &mut [&mut a, &mut b, &mut c],
        &engines,
        &broker,
        &mut sidecars,
        "a late replica",
    )
    .await;
    gateway.wait_ready(2, "a late replica").await;
    figure(
        "replica started late (no snapshot)",
        format!("converged {} ms after start", started.elapsed().as_millis()),
    );

    // A subscriber killed and replaced: the new one resyncs its engine.
    sidecars[0].signal(Signal::SIGKILL);
    assert!(!sidecars[0].wait_exit().success());
    rounds(&mut engines, 5).await;
    sidecars[0] = fleet::subscriber(&engines[0], NO_INDEX_SERVER, &kafka_flags(&bootstrap));
    engines[0].engine.wait_for_subscriber().await;
    rounds(&mut engines, 5).await;
    let took = converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "after a subscriber restart",
    )
    .await;
    figure(
        "subscriber kill -9",
        format!(
            "converged {} ms after the new sidecar subscribed",
            took.as_millis()
        ),
    );
    let (ok, failed, failures) = gateway.stop().await;
    figure(
        "gateway picks through the kill, the late replica and the subscriber restart",
        format!("{ok} made, {failed} failed"),
    );
    assert_eq!(
        failed, failed_at_kill,
        "only the kill -9 may cost picks: {failures:?}"
    );
    assert!(ok > 0, "the gateway picked at all");
    assert!(c.process.stop().success());
    broker.assert_no_panic("kills, late start, subscriber restart");

    for mut s in sidecars {
        assert!(s.stop().success());
    }
    assert!(a.process.stop().success());
    assert!(b.process.stop().success());
}

/// The broker stops answering for longer than the producers' delivery
/// timeout (frozen with SIGSTOP: the connections stay open and silent, the
/// harder case for a client). The subscribers drop
/// what does not reach it, count it and resync; the replicas keep serving
/// their last view meanwhile and converge once the broker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_converge_after_a_broker_outage() {
    let broker = Broker::start_on(ic_e2e::free_port());
    let bootstrap = broker.bootstrap();
    let mut a = replica(&bootstrap, None);
    let mut b = replica(&bootstrap, None);
    let (mut engines, mut sidecars) =
        fleet::fleet(3, NO_INDEX_SERVER, &kafka_flags(&bootstrap)).await;
    rounds(&mut engines, 20).await;
    converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "before the outage",
    )
    .await;
    let before = snapshot_blocks(&mut a).unwrap();

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(broker.child.id()).unwrap()),
        Signal::SIGSTOP,
    )
    .unwrap();
    rounds(&mut engines, 5).await;
    // Longer than --kafka-delivery-timeout-ms: what was sent is dropped.
    tokio::time::sleep(Duration::from_secs(6)).await;
    // The replicas kept their view and kept answering.
    assert_eq!(snapshot_blocks(&mut a).unwrap(), before);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(broker.child.id()).unwrap()),
        Signal::SIGCONT,
    )
    .unwrap();
    let back = Instant::now();
    rounds(&mut engines, 5).await;
    converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "after the outage",
    )
    .await;
    figure(
        "broker frozen 6 s (deliveries timed out)",
        format!(
            "converged {} ms after it came back",
            back.elapsed().as_millis()
        ),
    );
    let dropped = records_dropped(&mut sidecars);
    assert!(
        dropped >= 1.0,
        "the outage dropped records and counted them"
    );
    figure("broker frozen 6 s: producers", producers(&mut sidecars));
    // sqlite:// panics on a producer epoch it did not create (memory://
    // would only fence it): our producers never send one.
    broker.assert_no_panic("after the outage");
    for mut s in sidecars {
        assert!(s.stop().success());
    }
    assert!(a.process.stop().success());
    assert!(b.process.stop().success());
}

/// The broker is stopped and started again on its log while the engines
/// keep publishing: producers and consumers reconnect on their own,
/// what did not reach the broker in time is dropped, counted and resynced,
/// and the replicas, which kept serving their last view, converge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_converge_after_a_broker_restart() {
    let mut broker = Broker::start_on(ic_e2e::free_port());
    let bootstrap = broker.bootstrap();
    let mut a = replica(&bootstrap, None);
    let mut b = replica(&bootstrap, None);
    let (mut engines, mut sidecars) =
        fleet::fleet(3, NO_INDEX_SERVER, &kafka_flags(&bootstrap)).await;
    rounds(&mut engines, 20).await;
    converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "before the restart",
    )
    .await;
    let before = snapshot_blocks(&mut a).unwrap();
    let gateway = Gateway::start([a.endpoint(), b.endpoint()]);
    gateway.wait_ready(0, "before the restart").await;
    gateway.wait_ready(1, "before the restart").await;

    broker.stop();
    rounds(&mut engines, 5).await;
    // Longer than --kafka-delivery-timeout-ms: what was sent is dropped.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        snapshot_blocks(&mut a).unwrap(),
        before,
        "a replica keeps serving its last view while the broker is down"
    );
    broker.start_again();
    let back = Instant::now();
    rounds(&mut engines, 5).await;
    converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "after the restart",
    )
    .await;
    figure(
        "broker stopped, down 4 s, restarted on its log",
        format!(
            "converged {} ms after it came back",
            back.elapsed().as_millis()
        ),
    );
    let dropped = records_dropped(&mut sidecars);
    assert!(
        dropped >= 1.0,
        "the restart dropped records and counted them"
    );
    figure("broker restart: producers", producers(&mut sidecars));
    broker.assert_no_panic("after the restart");
    let (ok, failed, failures) = gateway.stop().await;
    figure(
        "gateway picks through the broker restart",
        format!("{ok} made, {failed} failed"),
    );
    assert_eq!(failed, 0, "a broker restart costs no pick: {failures:?}");
    assert!(ok > 0, "the gateway picked at all");
    for mut s in sidecars {
        assert!(s.stop().success());
    }
    assert!(a.process.stop().success());
    assert!(b.process.stop().success());
}

/// What the webhook injects with `--subscriber-transport kafka` is enough
/// for a subscriber to produce to the topic: the sidecar is started with
/// exactly the injected arguments and the downward-API env (nothing
/// added but a loopback admin address), and an index replica that no
/// subscriber can reach over gRPC converges on the engine from the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_with_the_injected_kafka_arguments_feeds_the_replicas() {
    use ic_adapters::admission::{InjectionConfig, SubscriberKafka, admit_pod};
    use serde_json::json;
    let broker = Broker::start_on(ic_e2e::free_port());
    let bootstrap = broker.bootstrap();
    let mut a = replica(&bootstrap, None);
    let engine =
        ic_e2e::engine::FakeEngine::start(ic_kvevents::encode::Era::VllmMap, "kv-events").await;
    let port = |endpoint: String| endpoint.rsplit_once(':').unwrap().1.to_owned();
    let events = json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": format!("tcp://*:{}", port(engine.events_endpoint())),
        "replay_endpoint": format!("tcp://*:{}", port(engine.replay_endpoint())),
        "topic": "kv-events",
    });
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "engine-0", "namespace": TENANT, "labels": {"app": "engine"}},
        "spec": {"containers": [{
            "name": "server",
            "image": "vllm/vllm-openai:v0.11.0",
            "args": ["--model", MODEL, "--kv-events-config", events.to_string()],
            "ports": [{"containerPort": 8000, "name": "http"}],
        }]},
    }))
    .unwrap();
    let backend: ic_api::CacheBackend = serde_json::from_value(json!({
        "apiVersion": "inferencecache.io/v1alpha1",
        "kind": "CacheBackend",
        "metadata": {"name": "events", "namespace": TENANT, "uid": "uid-events"},
        "spec": {
            "runtime": "VLLM",
            "type": "LMCache",
            "engineSelector": {"matchLabels": {"app": "engine"}},
            "integration": {"mode": "EventsOnly"},
            "observation": {"modelID": MODEL},
        },
    }))
    .unwrap();
    let config = InjectionConfig {
        subscriber_image: Some("ghcr.io/inferencecache/kvevent-subscriber:test".into()),
        // What the chart sets; the Kafka transport must not dial it.
        index_server: "http://127.0.0.1:9".into(),
        index_server_audience: Some("inferencecache-index-server".into()),
        subscriber_kafka: Some(SubscriberKafka {
            brokers: bootstrap.clone(),
            topic: TOPIC.into(),
            security_protocol: "plaintext".into(),
            ..SubscriberKafka::default()
        }),
        ..InjectionConfig::default()
    };
    let admitted = admit_pod(&pod, std::slice::from_ref(&backend), &config);
    let sidecar = admitted
        .pod
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .find(|c| c.name == "kvevent-subscriber")
        .unwrap_or_else(|| panic!("no subscriber injected: {:?}", admitted.warnings))
        .clone();
    let mut args = sidecar.args.clone().unwrap();
    assert!(args.contains(&"--transport=kafka".to_owned()), "{args:?}");
    args.extend(["--admin-addr".to_owned(), "127.0.0.1:0".to_owned()]);
    // The downward API's values for the env the container declares.
    let downward = [
        ("POD_NAME", "engine-0"),
        ("POD_NAMESPACE", TENANT),
        ("POD_IP", "10.0.0.0"),
    ];
    for e in sidecar.env.iter().flatten() {
        assert!(
            e.value.is_some() || downward.iter().any(|(n, _)| *n == e.name) || e.name == "HOST_IP",
            "an env the test cannot give: {e:?}"
        );
    }
    let mut env: Vec<(&str, &str)> = downward.to_vec();
    let literal: Vec<(String, String)> = sidecar
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
        .collect();
    env.extend(literal.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut subscriber =
        ServiceProcess::start_with_env(&workspace_binary("ic-kvevent-subscriber"), &args, &env);
    let mut engines = vec![Engine {
        engine,
        replica: "engine-0".into(),
        index: 0,
        chains: BTreeMap::new(),
        next_chain: 0,
    }];
    engines[0].engine.wait_for_subscriber().await;
    rounds(&mut engines, 10).await;
    let took = converge(
        &mut [&mut a],
        &engines,
        &broker,
        std::slice::from_mut(&mut subscriber),
        "injected Kafka arguments",
    )
    .await;
    figure(
        "a subscriber with the webhook's injected Kafka arguments",
        format!("replica converged in {} ms", took.as_millis()),
    );
    let admin = subscriber.admin_addr();
    assert!(
        metric(
            admin,
            "inferencecache_subscriber_kafka_records_delivered_total"
        ) >= 1.0,
        "the sidecar produced to the topic"
    );
    broker.assert_no_panic("injected Kafka arguments");
    assert!(subscriber.stop().success());
    assert!(a.process.stop().success());
}

/// The replica's lag and partition queries go to a loopback listener that
/// accepts and never answers (the hidden --kafka-probe-brokers), its
/// reading client to the real broker: every lag query hangs until its
/// timeout and fails, yet the records are read and applied all along (the
/// replica comes to equal the engines), the failed queries are counted and
/// the replica, its lag unknown, stays not ready. With the lag check on the
/// reading thread and a failed query ending the round, the first failed query kept
/// the replica from reading at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_reads_while_its_lag_queries_fail() {
    let broker = Broker::start_on(ic_e2e::free_port());
    let bootstrap = broker.bootstrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    // Holds every connection open, unanswered, until the test ends.
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().filter_map(Result::ok).collect();
        drop(held);
    });
    let mut a = replica_with(
        &bootstrap,
        None,
        &["--kafka-probe-brokers", silent_addr.as_str()],
    );
    let (mut engines, mut sidecars) =
        fleet::fleet(3, NO_INDEX_SERVER, &kafka_flags(&bootstrap)).await;
    rounds(&mut engines, 20).await;
    let started = Instant::now();
    loop {
        match matches_engines(&mut a, &engines).await {
            Ok(_) => break,
            Err(why) if started.elapsed() >= CONVERGE => panic!(
                "the replica did not apply the records while its lag queries hung: {why}\n{}",
                diagnose(&[&mut a], &mut sidecars, &broker)
            ),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let errors = "inferencecache_index_kafka_consumer_errors_total";
    while metric(a.http, errors) < 1.0 {
        assert!(
            started.elapsed() < CONVERGE,
            "the hung lag queries were never counted\n{}",
            diagnose(&[&mut a], &mut sidecars, &broker)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // More records while the queries keep failing: still applied.
    rounds(&mut engines, 5).await;
    loop {
        match matches_engines(&mut a, &engines).await {
            Ok(_) => break,
            Err(why) if started.elapsed() >= CONVERGE => {
                panic!("later records were not applied: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert_eq!(
        metric(a.http, "inferencecache_index_kafka_consumer_ready"),
        0.0,
        "no lag known: not ready"
    );
    assert_ne!(get(&mut a, "/ready").0, 200, "no lag known: /ready fails");
    broker.assert_no_panic("with the lag queries failing");
    for mut s in sidecars {
        assert!(s.stop().success());
    }
    assert!(a.process.stop().success());
}
