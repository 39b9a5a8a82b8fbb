//! `--transport kafka`: the outbox's changes go to one Kafka topic instead
//! of gRPC streams. The producer is one more destination of the outbox,
//! with its own per-rank sequence, so its batches are exactly what a gRPC
//! stream would carry; every record is keyed by the engine pod
//! ([`ic_kafka_client::record_key`]), so one replica's batches stay in
//! order on one partition.
//!
//! Delivery: idempotent producer, `acks=all`, a bounded local queue
//! (`--kafka-queue-messages`) and a delivery timeout
//! (`--kafka-delivery-timeout-ms`). A record that cannot be queued or is
//! not delivered in time is dropped and counted, and the destination
//! resyncs: the index servers skip the broken sequence until that resync
//! arrives. A producer that had a failure is retired at once and never
//! sent through again (its records may carry an epoch it bumped itself,
//! which some brokers cannot take); the resync goes through a new one,
//! created at once if the retired one had been healthy (it delivered for
//! `--kafka-producer-healthy-seconds` without a failure), else after a
//! growing wait (1 s doubling to 15 s), so a broker that is slow, or takes
//! a record now and then and fails again, is not flooded with new
//! producers. Every `--kafka-resync-interval-seconds` the destination
//! resyncs anyway, so a replica replaying only the retained log still
//! finds every engine's full state in it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ic_proto::index_v1 as pb;
use ic_telemetry::MetricsRegistry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::ClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{
    BaseRecord, Producer as _, ProducerContext, PurgeConfig, ThreadedProducer,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::forwarder::{self, Identity};
use crate::outbox::{Outbox, Outgoing, Wakers, lock};

/// The subscriber's Kafka flags.
#[derive(Clone, Debug, clap::Args)]
pub struct KafkaProducerFlags {
    /// Brokers, topic, TLS and SASL (shared with the index server).
    #[command(flatten)]
    pub client: ic_kafka_client::KafkaFlags,

    /// Seconds between full resyncs sent to the topic, so that the
    /// retained log always holds every engine's whole state (the topic's
    /// retention must be longer; docs/scaling.md).
    #[arg(long, env = "IC_KAFKA_RESYNC_INTERVAL_SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub kafka_resync_interval_seconds: u64,

    /// A record not acknowledged by the brokers within this many
    /// milliseconds is dropped (counted; the replica resyncs).
    #[arg(long, env = "IC_KAFKA_DELIVERY_TIMEOUT_MS", default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..=i32::MAX as u64))]
    pub kafka_delivery_timeout_ms: u64,

    /// Records the producer holds locally, waiting for the brokers; beyond
    /// them new records are dropped (counted; the replica resyncs).
    #[arg(long, env = "IC_KAFKA_QUEUE_MESSAGES", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub kafka_queue_messages: u64,

    /// A failed producer is replaced at once only when it had delivered
    /// for at least this many seconds without a failure (its first to its
    /// last acknowledged record); otherwise the next one waits, 1 s
    /// doubling to 15 s, reset only after such a healthy producer (waits
    /// counted in replacements_delayed_total).
    #[arg(long, env = "IC_KAFKA_PRODUCER_HEALTHY_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub kafka_producer_healthy_seconds: u64,
}

const CLIENT_ID: &str = "ic-kvevent-subscriber";
/// Changes per record (a resync is split into records of this many).
const CHUNK: usize = 4096;
/// Records sent for ranks with nothing new, so the index servers know the
/// engine is alive (the gRPC streams' heartbeat period).
const HEARTBEAT: Duration = Duration::from_secs(5);
/// The first and the longest wait before the next producer while the
/// retired ones were not healthy.
const REPLACE_FIRST: Duration = Duration::from_secs(1);
const REPLACE_MAX: Duration = Duration::from_secs(15);
/// How long shutdown waits for queued records.
const FLUSH: Duration = Duration::from_secs(5);

/// Drop reason labels (fixed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    /// `queue_full`, `delivery_failed`, `too_large`, `other`.
    reason: &'static str,
}

/// The producer's metrics (prefixed `inferencecache_subscriber_kafka_`).
#[derive(Clone, Debug, Default)]
pub struct KafkaMetrics {
    produced: Counter,
    delivered: Counter,
    dropped: Family<ReasonLabel, Counter>,
    resyncs: Counter,
    in_flight: Gauge,
    producers: Counter,
    retired: Counter,
    delayed: Counter,
}

impl KafkaMetrics {
    /// Registers the producer's metrics.
    pub fn register(registry: &MetricsRegistry) -> Self {
        let m = Self::default();
        registry.register_with(|r| {
            let r = r.sub_registry_with_prefix("subscriber_kafka");
            r.register(
                "records_produced",
                "Batches handed to the producer",
                m.produced.clone(),
            );
            r.register(
                "records_delivered",
                "Batches the brokers acknowledged (acks=all)",
                m.delivered.clone(),
            );
            r.register(
                "records_dropped",
                "Batches dropped (the replica then resyncs to the topic), by reason",
                m.dropped.clone(),
            );
            r.register(
                "resyncs",
                "Full resyncs sent to the topic: the periodic ones and those after a drop",
                m.resyncs.clone(),
            );
            r.register(
                "records_in_flight",
                "Batches queued in the producer, not yet acknowledged",
                m.in_flight.clone(),
            );
            r.register(
                "producers_created",
                "Producers created: the first and each replacement of a retired one",
                m.producers.clone(),
            );
            r.register(
                "producers_retired",
                "Producers retired after a failure (a lost record, a fatal error, a refused record); never sent through again",
                m.retired.clone(),
            );
            r.register(
                "replacements_delayed",
                "Replacements of a retired producer that waited (1 s doubling to 15 s) because it had not delivered for --kafka-producer-healthy-seconds without a failure",
                m.delayed.clone(),
            );
        });
        m
    }

    fn dropped(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// One producer's delivery outcomes and what was handed to it. A producer
/// that had a failure is never sent through again: librdkafka's idempotent
/// producer bumps its own epoch once a record times out, and a broker that
/// did not create that epoch may fail on it (tansu 0.6's SQLite store
/// panics and stops answering; docs/reliability.md).
#[derive(Debug)]
struct Outcomes {
    created: std::time::Instant,
    /// Records the brokers did not take: timed out, refused, purged.
    failures: AtomicU64,
    /// Records the brokers acknowledged.
    delivered: AtomicU64,
    /// send() refused a record for the producer's sake (not a full queue,
    /// not an oversized record): a fatal error or a bad state.
    refused: AtomicU64,
    /// Records handed to this producer.
    sent: AtomicU64,
    /// Records handed to it after its first failure was reported: 0 unless
    /// a failure lands between the check and the send.
    sent_after_failure: AtomicU64,
    /// Records offered to it (send called) once it had failed, refused by
    /// the check in [`Instance::send`]: the loop retires a failed producer
    /// before it sends anything, so 0 unless a failure lands mid-round.
    offered_after_failure: AtomicU64,
    /// Milliseconds from `created` to its first and to its last
    /// acknowledged record before any failure, plus one (0: none yet).
    first_delivered: AtomicU64,
    last_delivered: AtomicU64,
    /// The wait chosen for its replacement when it was retired, in ms
    /// (`u64::MAX` while in use).
    replaced_after_ms: AtomicU64,
}

impl Outcomes {
    fn new() -> Self {
        Self {
            created: std::time::Instant::now(),
            failures: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            sent_after_failure: AtomicU64::new(0),
            offered_after_failure: AtomicU64::new(0),
            first_delivered: AtomicU64::new(0),
            last_delivered: AtomicU64::new(0),
            replaced_after_ms: AtomicU64::new(u64::MAX),
        }
    }

    /// An acknowledged record: the healthy span grows while no failure
    /// (lost or refused record) was seen.
    fn delivered(&self) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
        let at = u64::try_from(self.created.elapsed().as_millis())
            .unwrap_or(u64::MAX - 1)
            .saturating_add(1);
        let _ = self
            .first_delivered
            .compare_exchange(0, at, Ordering::Relaxed, Ordering::Relaxed);
        if !self.failed() {
            self.last_delivered.fetch_max(at, Ordering::Relaxed);
        }
    }

    /// How long it delivered without a failure (first to last
    /// acknowledgement); `None` when nothing was acknowledged.
    fn healthy_for(&self) -> Option<Duration> {
        let first = self.first_delivered.load(Ordering::Relaxed);
        let last = self.last_delivered.load(Ordering::Relaxed);
        (first > 0).then(|| Duration::from_millis(last.saturating_sub(first)))
    }

    fn failed(&self) -> bool {
        self.failures.load(Ordering::Relaxed) > 0 || self.refused.load(Ordering::Relaxed) > 0
    }
}

/// Counts deliveries, remembers failures and wakes the sending loop on
/// one, which retires the producer at once.
struct Delivery {
    metrics: KafkaMetrics,
    outcomes: Arc<Outcomes>,
    failed: Arc<Notify>,
}

impl ClientContext for Delivery {}

impl ProducerContext for Delivery {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, (): ()) {
        match result {
            Ok(_) => {
                self.metrics.delivered.inc();
                self.outcomes.delivered();
            }
            Err((error, _)) => {
                self.metrics.dropped("delivery_failed");
                let first = self.outcomes.failures.fetch_add(1, Ordering::Relaxed) == 0;
                if first {
                    self.failed.notify_one();
                    tracing::warn!(%error, "a batch was not delivered to Kafka; the producer is replaced and the replica resyncs");
                }
            }
        }
    }
}

/// The producer in use and its outcomes.
struct Instance {
    producer: ThreadedProducer<Delivery>,
    outcomes: Arc<Outcomes>,
}

/// Why a batch was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NotSent {
    /// Dropped and counted under this reason.
    Dropped(&'static str),
    /// The producer had failed: nothing more goes through it (not a drop:
    /// the resync that follows its replacement supersedes the batch).
    ProducerFailed,
}

impl Instance {
    fn failed(&self) -> bool {
        self.outcomes.failed() || self.producer.client().fatal_error().is_some()
    }

    /// Queues one batch, unless this producer has failed.
    fn send(
        &self,
        topic: &str,
        key: &str,
        batch: &pb::IngestBatch,
        metrics: &KafkaMetrics,
    ) -> Result<(), NotSent> {
        if self.outcomes.failed() {
            self.outcomes
                .offered_after_failure
                .fetch_add(1, Ordering::Relaxed);
            return Err(NotSent::ProducerFailed);
        }
        let value = ic_kafka_client::encode(batch);
        match self
            .producer
            .send(BaseRecord::to(topic).key(key).payload(&value))
        {
            Ok(()) => {
                metrics.produced.inc();
                self.outcomes.sent.fetch_add(1, Ordering::Relaxed);
                if self.outcomes.failures.load(Ordering::Relaxed) > 0 {
                    self.outcomes
                        .sent_after_failure
                        .fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                Err(NotSent::Dropped("queue_full"))
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {
                Err(NotSent::Dropped("too_large"))
            }
            Err((error, _)) => {
                // A producer refusing records for its own sake is replaced.
                self.outcomes.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "cannot queue a batch for Kafka; the producer is replaced");
                Err(NotSent::Dropped("other"))
            }
        }
    }

    /// Purges what it still holds (superseded by the resync) and drops it
    /// off the async threads (dropping waits for its threads).
    fn retire(self) {
        if let Some(error) = self.producer.client().fatal_error() {
            tracing::warn!(error = ?error, "the Kafka producer failed for good");
        }
        self.producer
            .purge(PurgeConfig::default().queue().inflight().non_blocking());
        tokio::task::spawn_blocking(move || drop(self));
    }
}

/// The producer's settings, checked.
#[allow(missing_debug_implementations)] // rdkafka's ClientConfig has no useful Debug here.
pub struct Settings {
    client: rdkafka::ClientConfig,
    topic: String,
    resync_every: Duration,
    healthy: Duration,
}

impl KafkaProducerFlags {
    /// The checked settings, or `None` with `--transport grpc`.
    pub fn settings(&self) -> Result<Option<Settings>, ic_kafka_client::ConfigError> {
        if !self.client.enabled() {
            return Ok(None);
        }
        let mut client = self.client.client_config(CLIENT_ID)?;
        client
            // No duplicates, no reordering within a partition, even
            // across retries.
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set(
                "queue.buffering.max.messages",
                self.kafka_queue_messages.to_string(),
            )
            .set(
                "delivery.timeout.ms",
                self.kafka_delivery_timeout_ms.to_string(),
            )
            .set(
                "message.max.bytes",
                ic_kafka_client::MAX_MESSAGE_BYTES.to_string(),
            )
            .set("linger.ms", "5");
        Ok(Some(Settings {
            client,
            topic: self.client.kafka_topic.clone(),
            resync_every: Duration::from_secs(self.kafka_resync_interval_seconds),
            healthy: Duration::from_secs(self.kafka_producer_healthy_seconds),
        }))
    }
}

/// Produces the outbox's work to the topic until `shutdown`.
pub async fn run(
    settings: Settings,
    identity: Identity,
    outbox: Arc<Mutex<Outbox>>,
    wakers: Arc<Wakers>,
    metrics: KafkaMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    run_observed(
        settings,
        Timing::default(),
        identity,
        outbox,
        wakers,
        metrics,
        shutdown,
        |_: &Arc<Outcomes>| {},
    )
    .await
}

/// The loop's periods (constants; the tests shorten them to make their
/// rounds quicker).
#[derive(Clone, Copy, Debug)]
struct Timing {
    heartbeat: Duration,
    replace_first: Duration,
    replace_max: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            heartbeat: HEARTBEAT,
            replace_first: REPLACE_FIRST,
            replace_max: REPLACE_MAX,
        }
    }
}

/// The wait before the producer that replaces a failed one: none when the
/// failed one had delivered for `healthy` without a failure (the broker
/// was fine until now: the failure is news), and the wait starts over;
/// otherwise the next, longer wait. A producer that got a record or two
/// through before failing does not count: a broker that takes a record
/// now and then and stalls again would get a new producer (one more
/// InitProducerId and a whole resync) after each.
fn replacement_delay(
    healthy_for: Option<Duration>,
    healthy: Duration,
    waits: &mut ic_clock::Backoff,
) -> Duration {
    if healthy_for.is_some_and(|d| d >= healthy) {
        waits.reset();
        Duration::ZERO
    } else {
        waits.next_delay()
    }
}

/// [`run`], telling `on_producer` about every producer it creates (the
/// tests count what each one was sent), with `timing`.
#[allow(clippy::too_many_arguments)] // run's arguments plus the tests' two hooks.
async fn run_observed(
    settings: Settings,
    timing: Timing,
    identity: Identity,
    outbox: Arc<Mutex<Outbox>>,
    wakers: Arc<Wakers>,
    metrics: KafkaMetrics,
    shutdown: CancellationToken,
    on_producer: impl Fn(&Arc<Outcomes>),
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let failed = Arc::new(Notify::new());
    // Each producer counts its own outcomes: the purged records of a
    // retired one must not count against the next.
    let create = || -> anyhow::Result<Instance> {
        let outcomes = Arc::new(Outcomes::new());
        let producer = settings
            .client
            .create_with_context(Delivery {
                metrics: metrics.clone(),
                outcomes: outcomes.clone(),
                failed: failed.clone(),
            })
            .context("cannot create the Kafka producer")?;
        metrics.producers.inc();
        on_producer(&outcomes);
        Ok(Instance { producer, outcomes })
    };
    let mut current = Some(create()?);
    // A slow broker times out a new producer's first records too: creating
    // the next one at once each time (one more InitProducerId and a whole
    // resync for that broker) would deliver little or nothing, so until a
    // producer was healthy the next one waits, longer each time.
    let mut replacements = ic_clock::Backoff::new(timing.replace_first, timing.replace_max);
    let mut create_at = tokio::time::Instant::now();
    let destination = lock(&outbox).add_destination();
    let notify = wakers.register();
    let key = ic_kafka_client::record_key(&pb::ReplicaIdentity {
        scope: Some(identity.scope.clone()),
        replica_id: identity.replica_id.clone(),
        ..Default::default()
    });
    tracing::info!(topic = %settings.topic, key = %key, "producing index batches to Kafka");
    let mut seqs: Vec<u64> = Vec::new();
    let mut heartbeat = tokio::time::interval(timing.heartbeat);
    let mut resync = tokio::time::interval(settings.resync_every);
    resync.tick().await;
    let mut wait = false;
    loop {
        let mut heartbeat_due = false;
        if wait {
            let creating = current.is_none();
            tokio::select! {
                () = notify.notified() => {}
                () = failed.notified() => {}
                _ = heartbeat.tick() => heartbeat_due = true,
                _ = resync.tick() => {
                    metrics.resyncs.inc();
                    lock(&outbox).mark_for_resync(destination);
                }
                () = tokio::time::sleep_until(create_at), if creating => {}
                () = shutdown.cancelled() => break,
            }
        }
        // Before anything is sent: a producer that had a failure is
        // retired at once, and the destination resyncs through the next.
        if current.as_ref().is_some_and(Instance::failed) {
            let Some(old) = current.take() else {
                continue;
            };
            let healthy_for = old.outcomes.healthy_for();
            let delay = replacement_delay(healthy_for, settings.healthy, &mut replacements);
            if !delay.is_zero() {
                metrics.delayed.inc();
            }
            create_at = tokio::time::Instant::now() + delay;
            let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX - 1);
            old.outcomes
                .replaced_after_ms
                .store(delay_ms, Ordering::Relaxed);
            tracing::info!(
                next_producer_in_ms = delay_ms,
                delivered_for_ms =
                    healthy_for.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                "retiring the Kafka producer after a failure"
            );
            old.retire();
            metrics.retired.inc();
            metrics.resyncs.inc();
            lock(&outbox).mark_for_resync(destination);
        }
        if current.is_none() && tokio::time::Instant::now() >= create_at {
            current = Some(create()?);
        }
        let Some(producer) = current.as_ref() else {
            // Until the next producer the destination stays marked for
            // resync: the outbox keeps no changes for it, nothing is lost.
            metrics.in_flight.set(0);
            wait = true;
            continue;
        };
        let mut ok = true;
        if heartbeat_due {
            ok = heartbeats(
                producer,
                &settings.topic,
                &key,
                &identity,
                &mut seqs,
                &outbox,
                &metrics,
            );
        }
        let work = if ok {
            let mut ob = lock(&outbox);
            let work = ob.take(destination, CHUNK);
            let ready: Vec<(u32, bool)> =
                (0..ob.ranks()).map(|r| (r, ob.is_incomplete(r))).collect();
            Some((work, (ob.tier2, ob.engine_load, ob.engine_cache), ready))
        } else {
            None
        };
        wait = work.as_ref().is_none_or(|(w, _, _)| w.is_empty());
        let mut not_sent = None;
        if let Some((work, stats, ready)) = work {
            let incomplete = |rank: u32| ready.iter().any(|&(r, i)| r == rank && i);
            'items: for item in work {
                let rank = match &item {
                    Outgoing::Resync { rank, .. } | Outgoing::Delta { rank, .. } => *rank,
                };
                for batch in forwarder::batches(&identity, &mut seqs, item, stats, incomplete(rank))
                {
                    if let Err(why) = producer.send(&settings.topic, &key, &batch, &metrics) {
                        not_sent = Some(why);
                        break 'items;
                    }
                }
            }
        } else {
            not_sent = Some(NotSent::ProducerFailed);
        }
        if let Some(why) = not_sent {
            // What follows would arrive after a hole anyway: resync (a
            // failed producer is retired at the top of the loop first).
            metrics.resyncs.inc();
            lock(&outbox).mark_for_resync(destination);
            if let NotSent::Dropped(reason) = why {
                metrics.dropped(reason);
                if !producer.failed() {
                    // The queue is full: let it drain a little.
                    tokio::select! {
                        () = tokio::time::sleep(Duration::from_millis(100)) => {}
                        () = shutdown.cancelled() => {}
                    }
                }
            }
            wait = false;
        }
        if let Some(producer) = current.as_ref() {
            metrics
                .in_flight
                .set(i64::from(producer.producer.in_flight_count()));
        }
        if shutdown.is_cancelled() {
            break;
        }
    }
    wakers.unregister(&notify);
    lock(&outbox).remove_destination(destination);
    if let Some(Instance { producer, .. }) = current {
        let flushed = tokio::task::spawn_blocking(move || producer.flush(FLUSH)).await;
        if let Ok(Err(error)) = flushed {
            tracing::warn!(%error, "not every batch reached Kafka before stopping");
        }
    }
    Ok(())
}

/// An empty batch for every rank that has sent something to the topic;
/// `false` when one was not sent (its rank's sequence has a hole).
fn heartbeats(
    producer: &Instance,
    topic: &str,
    key: &str,
    identity: &Identity,
    seqs: &mut Vec<u64>,
    outbox: &Mutex<Outbox>,
    metrics: &KafkaMetrics,
) -> bool {
    let (stats, ranks) = {
        let ob = lock(outbox);
        let ranks: Vec<(u32, bool)> = (0..ob.ranks())
            .filter(|r| ob.is_ready(*r))
            .map(|r| (r, ob.is_incomplete(r)))
            .collect();
        ((ob.tier2, ob.engine_load, ob.engine_cache), ranks)
    };
    for (rank, incomplete) in ranks {
        if seqs.get(rank as usize).is_none_or(|s| *s == 0) {
            continue;
        }
        let batch = forwarder::heartbeat(identity, seqs, rank, stats, incomplete);
        match producer.send(topic, key, &batch, metrics) {
            Ok(()) => {}
            Err(NotSent::Dropped(reason)) => {
                metrics.dropped(reason);
                return false;
            }
            Err(NotSent::ProducerFailed) => return false,
        }
    }
    true
}

#[cfg(test)]
mod broker_tests;

#[cfg(test)]
mod tests;
