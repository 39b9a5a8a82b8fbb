//! Restart-to-ready of an index replica holding many entries, end to end
//! (process start → `/ready` 200 with every entry back), two ways:
//!
//! * **resync**: a new replica is filled by the subscribers' resyncs, here
//!   the ingest client replaying every engine's whole state as the
//!   subscribers of `ENGINES` engines would (8 streams at once), started the
//!   moment the replica's gRPC port is bound;
//! * **snapshot + tail** (`--transport kafka`, the real tansu broker): the
//!   replica restarts from the snapshot it wrote of the same index and
//!   replays the topic's tail (empty here, so this is the snapshot's cost;
//!   the tail's is the consumer's replay rate, docs/benchmarks.md).
//!
//! Both must come back whole: the entry count equals what was fed, and the
//! replica is ready. The figures (`restart figure:` lines) go to
//! docs/benchmarks.md; nothing asserts a duration. `IC_RESTART_ENTRIES`
//! sets the entries (default 200,000 for the suite; the benchmark uses
//! 10,000,000), `IC_RESTART_BIN_DIR` a directory holding a release
//! `ic-index-server` (default: the workspace's build of the tests).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use ic_e2e::{ServiceProcess, free_port, http_get, workspace_binary};
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;

#[path = "support/fleet.rs"]
mod fleet;

const TOPIC: &str = "inferencecache.index-events";
/// Engines whose state the index holds.
const ENGINES: u64 = 100;
/// Blocks per prompt chain.
const CHAIN: u64 = 32;
/// Blocks per ingest batch (a subscriber cuts a resync into batches too).
const BATCH_BLOCKS: u64 = 4_096;
/// How long a restart may take before the test fails.
const READY_WITHIN: Duration = Duration::from_secs(900);

fn entries() -> u64 {
    std::env::var("IC_RESTART_ENTRIES")
        .ok()
        .map(|v| v.parse().expect("IC_RESTART_ENTRIES: a number"))
        .unwrap_or(200_000)
}

fn server_binary() -> PathBuf {
    std::env::var_os("IC_RESTART_BIN_DIR").map_or_else(
        || workspace_binary("ic-index-server"),
        |dir| PathBuf::from(dir).join("ic-index-server"),
    )
}

fn figure(what: &str, value: impl std::fmt::Display) {
    eprintln!("restart figure: {what}: {value}");
}

/// Engine `e`'s whole state as one resync, in batches.
fn resync_batches(e: u64, per_engine: u64) -> Vec<pb::IngestBatch> {
    let chains = per_engine.div_ceil(CHAIN);
    let mut events = Vec::new();
    for c in 0..chains {
        let len = CHAIN.min(per_engine - c * CHAIN);
        events.push(pb::IndexEvent {
            kind: Some(pb::index_event::Kind::Stored(pb::BlocksStored {
                parent_fingerprint: 0,
                start_depth: 0,
                fingerprints: (0..len).map(|b| (e << 40) | (c << 8) | (b + 1)).collect(),
                block_size: fleet::BLOCK,
                tier: pb::Tier::T1 as i32,
                at_unix_ms: 0,
            })),
        });
    }
    let per_batch = usize::try_from(BATCH_BLOCKS / CHAIN).unwrap();
    let batches: Vec<Vec<pb::IndexEvent>> = events.chunks(per_batch).map(<[_]>::to_vec).collect();
    let n = batches.len();
    batches
        .into_iter()
        .enumerate()
        .map(|(i, events)| pb::IngestBatch {
            replica: Some(pb::ReplicaIdentity {
                scope: Some(pb::IndexScope {
                    tenant: fleet::TENANT.into(),
                    model: fleet::MODEL.into(),
                    hash_scheme: pb::HashScheme::Vllm as i32,
                    adapter: String::new(),
                }),
                replica_id: format!("engine-{e}"),
                address: format!("10.0.{}.{}:8000", e / 250, e % 250),
                dp_rank: 0,
                incarnation: 1,
            }),
            seq: i as u64 + 1,
            resync_begin: i == 0,
            resync_end: i + 1 == n,
            events,
            ..Default::default()
        })
        .collect()
}

/// Every engine's resync into the replica at `grpc`, 8 streams at once.
async fn replay(grpc: SocketAddr, total: u64) {
    let per_engine = total / ENGINES;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let results: Vec<()> = futures::stream::iter(0..ENGINES)
        .map(|e| {
            let mut client = IndexServiceClient::new(channel.clone())
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20);
            async move {
                let ack = client
                    .ingest_events(futures::stream::iter(resync_batches(e, per_engine)))
                    .await
                    .unwrap()
                    .into_inner();
                assert!(!ack.resync_required, "engine {e}: {}", ack.detail);
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    assert_eq!(results.len() as u64, ENGINES);
}

/// Waits until the replica is ready and holds `want` entries; the time
/// since `started`.
fn ready_and_whole(server: &mut ServiceProcess, want: u64, started: Instant) -> Duration {
    let http = server.admin_addr();
    loop {
        let held = fleet::metric(http, "inferencecache_index_entries");
        if held as u64 == want && http_get(http, "/ready").0 == 200 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < READY_WITHIN,
            "not ready and whole within {READY_WITHIN:?}: {held} of {want} entries; logs:\n{}",
            server.logs().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn start(args: &[&str]) -> ServiceProcess {
    let mut all = vec![
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--ready-warmup-seconds",
        "0",
        "--drain-seconds",
        "0",
        "--capacity-entries",
        "1073741824",
    ];
    all.extend_from_slice(args);
    ServiceProcess::start(&server_binary(), &all)
}

/// A tansu broker with in-memory storage on loopback, stopped on drop.
struct Broker(Child);

impl Broker {
    fn start(port: u16, dir: &Path) -> Self {
        let bin = ic_e2e::tansu::binary();
        let log = dir.join("broker.log");
        let mut child = ic_e2e::tansu::broker_command(&bin, port, ic_e2e::tansu::Storage::Memory)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e}; {}",
                    bin.display(),
                    ic_e2e::tansu::INSTALL
                )
            });
        ic_e2e::tansu::wait_listening(&mut child, port, || {
            std::fs::read_to_string(&log).unwrap_or_default()
        });
        ic_e2e::tansu::create_topic(&bin, port, TOPIC, 3);
        Self(child)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarts_whole_from_resyncs_and_from_a_snapshot() {
    let total = entries() / ENGINES * ENGINES;
    figure("entries", total);

    // Resync: a new replica filled by every engine's resync.
    let started = Instant::now();
    let mut fresh = start(&[]);
    let grpc = fresh.addr("grpc");
    let bound = started.elapsed();
    replay(grpc, total).await;
    let took = ready_and_whole(&mut fresh, total, started);
    figure(
        "resync: process start to ready and whole",
        format!(
            "{} ms (gRPC port bound after {} ms)",
            took.as_millis(),
            bound.as_millis()
        ),
    );
    assert!(fresh.stop().success());

    // Snapshot + tail: the same index written to a snapshot, then a restart.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let _broker = Broker::start(port, dir.path());
    let snapshots = dir.path().join("snapshots");
    std::fs::create_dir_all(&snapshots).unwrap();
    let brokers = format!("127.0.0.1:{port}");
    let kafka = [
        "--transport",
        "kafka",
        "--kafka-brokers",
        &brokers,
        "--kafka-topic",
        TOPIC,
        "--kafka-ready-lag-messages",
        "0",
        "--kafka-snapshot-dir",
        snapshots.to_str().unwrap(),
        "--kafka-snapshot-interval-seconds",
        "1",
    ];
    let mut first = start(&kafka);
    let grpc = first.addr("grpc");
    replay(grpc, total).await;
    ready_and_whole(&mut first, total, Instant::now());
    let http = first.admin_addr();
    let written = Instant::now();
    while (fleet::metric(http, "inferencecache_index_kafka_snapshot_entries") as u64) != total {
        assert!(
            written.elapsed() < READY_WITHIN,
            "no snapshot of the whole index"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    figure(
        "snapshot size",
        format!(
            "{} bytes",
            fleet::metric(http, "inferencecache_index_kafka_snapshot_bytes")
        ),
    );
    assert!(first.stop().success());

    let started = Instant::now();
    let mut restarted = start(&kafka);
    let took = ready_and_whole(&mut restarted, total, started);
    figure(
        "snapshot + tail: process start to ready and whole",
        format!("{} ms", took.as_millis()),
    );
    assert!(restarted.stop().success());
}
