//! The producer loop against the real tansu broker (SQLite log, as the
//! e2e suite runs it), frozen with SIGSTOP past the delivery timeout: a
//! producer that had a failure must never be sent through again, since
//! librdkafka bumps such a producer's epoch itself and tansu 0.6's SQLite
//! store panics on an epoch it did not create; and a failed producer is
//! replaced at once only after a healthy interval.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use clap::Parser;
use ic_e2e::tansu::Broker;
use ic_kvevents::{ApplyStats, BlockStored, DecodedBatch, KvEvent, Medium, ReplicaConfig};

use super::*;

const TOPIC: &str = "subscriber-producer-test";
/// The producer's delivery timeout here: short, so the freeze fails records soon.
const DELIVERY_TIMEOUT_MS: &str = "2000";
/// Shorter still where a test needs many failures.
const SHORT_DELIVERY_TIMEOUT_MS: &str = "1000";
/// How long anything here may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(90);

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

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// Whether the loop has retired `p` (and chosen its replacement's wait).
fn retired(p: &Outcomes) -> bool {
    load(&p.replaced_after_ms) != u64::MAX
}

fn report(all: &[Arc<Outcomes>]) -> Vec<String> {
    all.iter()
        .map(|p| {
            format!(
                "sent {} delivered {} failures {} sent after failure {} offered after failure {} \
                 healthy for {:?} replaced after {}",
                load(&p.sent),
                load(&p.delivered),
                load(&p.failures),
                load(&p.sent_after_failure),
                load(&p.offered_after_failure),
                p.healthy_for(),
                match load(&p.replaced_after_ms) {
                    u64::MAX => "(in use)".to_owned(),
                    ms => format!("{ms} ms"),
                }
            )
        })
        .collect()
}

/// The real broker with one topic, and the producer loop on one engine's
/// outbox, every producer it creates observed.
struct Harness {
    broker: Broker,
    outbox: Arc<Mutex<Outbox>>,
    wakers: Arc<Wakers>,
    metrics: KafkaMetrics,
    shutdown: CancellationToken,
    seen: Producers,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    next: u64,
}

impl Harness {
    fn start(timing: Timing, delivery_timeout_ms: &str, extra: &[&str]) -> Self {
        let broker = Broker::start(ic_e2e::free_port());
        broker.create_topic(TOPIC, 1);
        let bootstrap = broker.bootstrap();
        let mut args = vec![
            "x",
            "--transport",
            "kafka",
            "--kafka-brokers",
            &bootstrap,
            "--kafka-topic",
            TOPIC,
            "--kafka-delivery-timeout-ms",
            delivery_timeout_ms,
        ];
        args.extend(extra);
        let settings = Cli::try_parse_from(args)
            .unwrap()
            .kafka
            .settings()
            .unwrap()
            .unwrap();
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
                    timing,
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
        Self {
            broker,
            outbox,
            wakers,
            metrics,
            shutdown,
            seen,
            task,
            next: 1,
        }
    }

    /// The engine stores one more block.
    fn publish(&mut self) {
        lock(&self.outbox).apply(0, &batch(self.next), &mut ApplyStats::default());
        self.next += 1;
        self.wakers.wake_all();
    }

    /// Every producer so far, oldest first.
    fn all(&self) -> Vec<Arc<Outcomes>> {
        self.seen.lock().unwrap().clone()
    }

    fn delivered(&self) -> u64 {
        self.all().iter().map(|p| load(&p.delivered)).sum()
    }

    /// The broker thawed: a producer created after the failures delivers
    /// what the engine publishes next (the broker took it; a bumped epoch
    /// would have killed tansu's storage and every later write).
    async fn delivers_again(&mut self) {
        let before = self.delivered();
        self.publish();
        until("a later producer delivers after the freeze", || {
            self.delivered() > before
        })
        .await;
        let before = self.delivered();
        self.publish();
        until("the broker still takes records", || {
            self.delivered() > before
        })
        .await;
    }

    /// Stops the loop; every producer it created.
    async fn stop(self) -> (Broker, KafkaMetrics, Vec<Arc<Outcomes>>) {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
        let all = self.seen.lock().unwrap().clone();
        (self.broker, self.metrics, all)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_that_had_a_failure_is_never_sent_through_again() {
    let mut h = Harness::start(Timing::default(), DELIVERY_TIMEOUT_MS, &[]);
    h.publish();
    until("the first producer delivers", || {
        h.all().first().is_some_and(|p| load(&p.delivered) >= 1)
    })
    .await;

    // Frozen: the connection stays open and silent. One more record
    // times out, and librdkafka bumps that producer's epoch.
    h.broker.freeze();
    h.publish();
    until("the first producer reports a failure", || {
        load(&h.all()[0].failures) >= 1
    })
    .await;
    // Still frozen, nothing new published: the failed producer is retired,
    // a new one is created (after a wait: the first had not delivered for
    // the healthy interval) and sends its resync, which times out in turn,
    // so it is retired too. Each of these sends and heartbeats is a chance
    // to hand a record to a failed producer.
    until(
        "a later producer sends during the freeze and fails in turn",
        || {
            let all = h.all();
            all.len() >= 2 && load(&all[1].sent) >= 1 && load(&all[1].failures) >= 1
        },
    )
    .await;
    until("the later producer is retired during the freeze", || {
        h.metrics.retired.get() >= 2
    })
    .await;
    h.broker.thaw();
    h.delivers_again().await;

    let (broker, metrics, all) = h.stop().await;
    let report = report(&all);
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
    broker.assert_no_panic("a producer frozen past its delivery timeout");
}

/// The wait before a new producer starts over only after a producer that
/// delivered for the healthy interval without a failure: one that got its
/// resync through and failed again soon after (a broker that takes a record
/// now and then and stalls again) makes the next one wait longer. Under
/// the old rule (any delivery reset the wait) that producer's replacement
/// was created at once. Two runs, each against its own broker: one with a
/// short healthy interval that the first producer outlasts, one with an
/// interval (an hour) that no producer here reaches however slow the
/// machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_producer_is_replaced_at_once_only_after_a_healthy_interval() {
    const HEALTHY: Duration = Duration::from_secs(3);
    let mut h = Harness::start(
        Timing::default(),
        DELIVERY_TIMEOUT_MS,
        &["--kafka-producer-healthy-seconds", "3"],
    );
    // The first producer delivers what the engine publishes for longer
    // than the healthy interval.
    let started = Instant::now();
    while h
        .all()
        .first()
        .and_then(|p| p.healthy_for())
        .is_none_or(|d| d < HEALTHY)
    {
        assert!(
            started.elapsed() < DEADLINE,
            "the first producer never delivered for {HEALTHY:?}: {:#?}",
            report(&h.all())
        );
        h.publish();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Frozen: it fails, and having been healthy, it is replaced at once.
    h.broker.freeze();
    h.publish();
    until("the healthy producer is retired", || retired(&h.all()[0])).await;
    let all = h.all();
    assert_eq!(
        load(&all[0].replaced_after_ms),
        0,
        "a healthy producer is replaced at once: {:#?}",
        report(&all)
    );
    // Its replacement's resync times out too: it delivered nothing, so the
    // next one waits the first step.
    until("the second producer fails and is retired", || {
        h.all().get(1).is_some_and(|p| retired(p))
    })
    .await;
    let all = h.all();
    assert_eq!(load(&all[1].delivered), 0, "{:#?}", report(&all));
    assert_eq!(
        Duration::from_millis(load(&all[1].replaced_after_ms)),
        REPLACE_FIRST,
        "{:#?}",
        report(&all)
    );
    h.broker.thaw();
    h.delivers_again().await;
    let (broker, _, all) = h.stop().await;
    eprintln!("producers (healthy for 3 s): {:#?}", report(&all));
    broker.assert_no_panic("a healthy producer replaced at once");

    // A healthy interval no producer here reaches: the producer that gets
    // its resync through and fails again is not healthy, whatever the
    // machine's speed.
    const NEVER: Duration = Duration::from_secs(3600);
    let mut h = Harness::start(
        Timing::default(),
        DELIVERY_TIMEOUT_MS,
        &["--kafka-producer-healthy-seconds", "3600"],
    );
    // Frozen from the start: the first producer delivers nothing and
    // waits the first step.
    h.broker.freeze();
    h.publish();
    until("the first producer fails and is retired", || {
        h.all().first().is_some_and(|p| retired(p))
    })
    .await;
    let all = h.all();
    assert_eq!(load(&all[0].delivered), 0, "{:#?}", report(&all));
    assert_eq!(
        Duration::from_millis(load(&all[0].replaced_after_ms)),
        REPLACE_FIRST,
        "{:#?}",
        report(&all)
    );

    // Back for a moment: the next producer gets its resync through, then
    // the broker stalls again.
    h.broker.thaw();
    until("a second producer delivers", || {
        h.all().get(1).is_some_and(|p| load(&p.delivered) >= 1)
    })
    .await;
    h.broker.freeze();
    h.publish();
    until("the second producer fails and is retired", || {
        retired(&h.all()[1])
    })
    .await;
    let all = h.all();
    let second = &all[1];
    assert!(
        second.healthy_for().is_some_and(|d| d < NEVER),
        "it delivered, within the interval: {:#?}",
        report(&all)
    );
    assert_eq!(
        Duration::from_millis(load(&second.replaced_after_ms)),
        REPLACE_FIRST * 2,
        "a producer that delivered, but not for the healthy interval, is replaced after a longer wait, not at once: {:#?}",
        report(&all)
    );
    assert!(
        h.metrics.delayed.get() >= 2,
        "the delayed replacements are counted: {}",
        h.metrics.delayed.get()
    );

    h.broker.thaw();
    h.delivers_again().await;
    let (broker, _, all) = h.stop().await;
    eprintln!("producers (healthy for an hour): {:#?}", report(&all));
    broker.assert_no_panic("a producer replaced after a healthy interval");
}

/// A failed producer is retired before the loop sends anything, heartbeats
/// included. Each round blocks the loop (the test holds the outbox) while
/// the current producer's record times out and a heartbeat comes due, so
/// that when the loop goes on, the failure and the heartbeat are due at
/// once: with the heartbeats sent before the failure check (the old
/// order), about one round in six offered the failed producer a heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
// Holding the outbox across the waits is the point: the loop blocks on it.
#[allow(clippy::await_holding_lock)]
async fn a_failed_producer_is_offered_no_heartbeat_when_both_are_due() {
    // tokio::select! starts polling at a random one of the loop's six
    // branches and takes the first ready: the heartbeat wins one start in
    // six over the failure, so 20 rounds catch the old order 97 times in
    // 100 (it failed 3 of 4 runs at 6 rounds).
    const ROUNDS: usize = 20;
    let timing = Timing {
        heartbeat: Duration::from_millis(300),
        replace_first: Duration::from_millis(200),
        replace_max: Duration::from_millis(400),
    };
    let mut h = Harness::start(timing, SHORT_DELIVERY_TIMEOUT_MS, &[]);
    // Heartbeats go only for ranks that sent something. (A first record
    // may time out while the broker sets the producer up: the next
    // producer delivers then.)
    h.publish();
    until("a producer delivers", || {
        h.all().iter().any(|p| load(&p.delivered) >= 1)
    })
    .await;
    h.broker.freeze();
    h.publish();
    let mut exercised = 0;
    for round in 0..ROUNDS {
        // The producer in use has a record out that the frozen broker
        // will not acknowledge (the first the record above, the later ones
        // their resync) and has not failed yet.
        let started = Instant::now();
        let producer = loop {
            let all = h.all();
            if let Some(p) = all.last()
                && load(&p.sent) > load(&p.delivered)
                && load(&p.failures) == 0
                && !retired(p)
            {
                break p.clone();
            }
            assert!(
                started.elapsed() < DEADLINE,
                "round {round}: no producer in use: {:#?}",
                report(&all)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        {
            let held = lock(&h.outbox);
            // The loop wakes and blocks on the outbox; meanwhile the
            // record times out (the failure is reported and wakes nobody
            // new) and, two heartbeat periods on, a heartbeat is due.
            h.wakers.wake_all();
            until("the producer's record times out", || {
                load(&producer.failures) >= 1
            })
            .await;
            tokio::time::sleep(timing.heartbeat * 2).await;
            drop(held);
        }
        until("the failed producer is retired", || retired(&producer)).await;
        exercised += 1;
    }
    h.broker.thaw();
    h.delivers_again().await;
    let (broker, _, all) = h.stop().await;
    let report = report(&all);
    eprintln!("producers: {report:#?}");
    assert_eq!(exercised, ROUNDS);
    assert!(
        all.iter()
            .all(|p| load(&p.offered_after_failure) == 0 && load(&p.sent_after_failure) == 0),
        "a failed producer was offered a record before it was retired: {report:#?}"
    );
    broker.assert_no_panic("heartbeats due with a failed producer");
}
