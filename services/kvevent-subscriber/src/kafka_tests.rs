//! The producer loop against the real tansu broker (SQLite log, as the
//! e2e suite runs it), frozen with SIGSTOP past the delivery timeout: a
//! producer that had a failure must never be sent through again, since
//! librdkafka bumps such a producer's epoch itself and tansu 0.6's SQLite
//! store panics on an epoch it did not create.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use ic_kvevents::{ApplyStats, BlockStored, DecodedBatch, KvEvent, Medium, ReplicaConfig};

use super::*;

const TOPIC: &str = "subscriber-producer-test";
/// The producer's delivery timeout here: short, so the freeze fails records soon.
const DELIVERY_TIMEOUT_MS: &str = "2000";
/// How long anything here may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(90);

/// tansu on a free loopback port, its log in a SQLite file; killed and its
/// directory removed on drop.
struct Broker {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Broker {
    fn start() -> Self {
        let port = ic_e2e::free_port();
        let dir =
            std::env::temp_dir().join(format!("ic-subscriber-kafka-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = ic_e2e::tansu::binary();
        let log = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("broker.log"))
                .unwrap()
        };
        let child = ic_e2e::tansu::broker_command(&bin, port, ic_e2e::tansu::Storage::Sqlite(&dir))
            // tansu's tracing goes to stdout: both into the log the test reads.
            .stdout(Stdio::from(log()))
            .stderr(Stdio::from(log()))
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start tansu: {e}; {}", ic_e2e::tansu::INSTALL));
        let mut broker = Self { child, port, dir };
        let log_path = broker.dir.join("broker.log");
        ic_e2e::tansu::wait_listening(&mut broker.child, port, || {
            std::fs::read_to_string(&log_path).unwrap_or_default()
        });
        ic_e2e::tansu::create_topic(&bin, port, TOPIC, 1);
        broker
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} the broker");
    }

    /// Every panic in the broker's log.
    fn panics(&self) -> Vec<String> {
        ic_e2e::tansu::panics(&self.dir.join("broker.log"))
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        // A frozen broker must be woken to die.
        let _ = self.child.kill();
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    kafka: KafkaProducerFlags,
}

fn batch(hash: u64) -> DecodedBatch {
    DecodedBatch {
        ts: 1.0,
        events: vec![KvEvent::BlockStored(BlockStored {
            block_hashes: vec![ic_kvevents::EngineHash(hash)],
            parent_block_hash: None,
            token_ids: vec![hash as u32; 4],
            block_size: 4,
            lora_id: None,
            medium: Medium::Gpu,
            lora_name: None,
            group_idx: None,
            kv_cache_spec_kind: None,
            cache_salt: None,
            extra_keys: None,
        })],
        ..DecodedBatch::default()
    }
}

/// Waits (up to [`DEADLINE`]) until `done` holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < DEADLINE,
            "{what}: not within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

type Producers = Arc<Mutex<Vec<Arc<Outcomes>>>>;

fn producers(p: &Producers) -> Vec<Arc<Outcomes>> {
    p.lock().unwrap().clone()
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_that_had_a_failure_is_never_sent_through_again() {
    let broker = Broker::start();
    let cli = Cli::try_parse_from([
        "x",
        "--transport",
        "kafka",
        "--kafka-brokers",
        &format!("127.0.0.1:{}", broker.port),
        "--kafka-topic",
        TOPIC,
        "--kafka-delivery-timeout-ms",
        DELIVERY_TIMEOUT_MS,
    ])
    .unwrap();
    let settings = cli.kafka.settings().unwrap().unwrap();
    let outbox = Arc::new(Mutex::new(Outbox::new(1, 10_000, ReplicaConfig::default())));
    lock(&outbox).set_ready(0);
    let wakers = Wakers::new();
    let metrics = KafkaMetrics::default();
    let shutdown = CancellationToken::new();
    let seen: Producers = Arc::default();
    let identity = Identity {
        scope: pb::IndexScope::default(),
        replica_id: "engine-0".into(),
        address: "127.0.0.1:8000".into(),
        incarnation: 1,
    };
    let task = tokio::spawn({
        let (outbox, wakers, metrics, shutdown, seen) = (
            outbox.clone(),
            wakers.clone(),
            metrics.clone(),
            shutdown.clone(),
            seen.clone(),
        );
        async move {
            run_observed(
                settings,
                identity,
                outbox,
                wakers,
                metrics,
                shutdown,
                move |o: &Arc<Outcomes>| seen.lock().unwrap().push(o.clone()),
            )
            .await
        }
    });
    let mut next = 1u64;
    let mut publish = || {
        lock(&outbox).apply(0, &batch(next), &mut ApplyStats::default());
        next += 1;
        wakers.wake_all();
    };

    publish();
    until("the first producer delivers", || {
        producers(&seen)
            .first()
            .is_some_and(|p| load(&p.delivered) >= 1)
    })
    .await;

    // Frozen: the connection stays open and silent. One more record
    // times out, and librdkafka bumps that producer's epoch.
    broker.signal("-STOP");
    publish();
    until("the first producer reports a failure", || {
        load(&producers(&seen)[0].failures) >= 1
    })
    .await;
    // Still frozen, nothing new published: the failed producer is retired,
    // a new one is created at once (the first had delivered) and sends its
    // resync, which times out in turn, so it is retired too. Each of these
    // sends and heartbeats is a chance to hand a record to a failed
    // producer (the heartbeat went first once, before the failure check).
    until(
        "a later producer sends during the freeze and fails in turn",
        || {
            let all = producers(&seen);
            all.len() >= 2 && load(&all[1].sent) >= 1 && load(&all[1].failures) >= 1
        },
    )
    .await;
    until("the later producer is retired during the freeze", || {
        metrics.retired.get() >= 2
    })
    .await;
    broker.signal("-CONT");

    // Back: the engine goes on, and a producer created after the failure
    // delivers (the broker took it; a bumped epoch would have killed
    // tansu's storage and every later write).
    let delivered_before: u64 = producers(&seen).iter().map(|p| load(&p.delivered)).sum();
    publish();
    until("a later producer delivers after the freeze", || {
        let all = producers(&seen);
        all.iter().skip(1).any(|p| load(&p.delivered) >= 1)
            && all.iter().map(|p| load(&p.delivered)).sum::<u64>() > delivered_before
    })
    .await;
    publish();
    let before_last: u64 = producers(&seen).iter().map(|p| load(&p.delivered)).sum();
    until("the broker still takes records", || {
        producers(&seen)
            .iter()
            .map(|p| load(&p.delivered))
            .sum::<u64>()
            > before_last
    })
    .await;

    shutdown.cancel();
    task.await.unwrap().unwrap();
    let all = producers(&seen);
    let report: Vec<String> = all
        .iter()
        .map(|p| {
            format!(
                "sent {} delivered {} failures {} sent after failure {}",
                load(&p.sent),
                load(&p.delivered),
                load(&p.failures),
                load(&p.sent_after_failure)
            )
        })
        .collect();
    eprintln!("producers: {report:#?}");
    assert!(
        all.iter().all(|p| load(&p.sent_after_failure) == 0),
        "a producer that had a failure was sent through again: {report:#?}"
    );
    assert!(
        all.len() >= 2,
        "the failed producer was replaced: {report:#?}"
    );
    // Every producer that failed was retired, and only those.
    let failed = all.iter().filter(|p| p.failed()).count() as u64;
    assert!(
        metrics.retired.get() == failed && failed >= 2,
        "retired {}, producers that failed {failed}: {report:#?}",
        metrics.retired.get(),
    );
    let panics = broker.panics();
    assert!(panics.is_empty(), "the broker panicked: {panics:#?}");
}
