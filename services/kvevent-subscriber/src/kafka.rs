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
//! arrives. Every `--kafka-resync-interval-seconds` the destination
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
}

const CLIENT_ID: &str = "ic-kvevent-subscriber";
/// Changes per record (a resync is split into records of this many).
const CHUNK: usize = 4096;
/// Records sent for ranks with nothing new, so the index servers know the
/// engine is alive (the gRPC streams' heartbeat period).
const HEARTBEAT: Duration = Duration::from_secs(5);
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
        });
        m
    }

    fn dropped(&self, reason: &'static str) {
        self.dropped.get_or_create(&ReasonLabel { reason }).inc();
    }
}

/// Counts deliveries and remembers failures, which the sending loop turns
/// into a resync of the destination.
struct Delivery {
    metrics: KafkaMetrics,
    failures: Arc<AtomicU64>,
}

impl ClientContext for Delivery {}

impl ProducerContext for Delivery {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, (): ()) {
        match result {
            Ok(_) => {
                self.metrics.delivered.inc();
            }
            Err((error, _)) => {
                self.metrics.dropped("delivery_failed");
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%error, "a batch was not delivered to Kafka; the replica resyncs");
            }
        }
    }
}

/// The producer's settings, checked.
#[allow(missing_debug_implementations)] // rdkafka's ClientConfig has no useful Debug here.
pub struct Settings {
    client: rdkafka::ClientConfig,
    topic: String,
    resync_every: Duration,
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
    use anyhow::Context as _;
    // Each producer counts its own failures: the purged records of a
    // replaced one must not count against the new one.
    let create = |failures: &Arc<AtomicU64>| -> anyhow::Result<ThreadedProducer<Delivery>> {
        settings
            .client
            .create_with_context(Delivery {
                metrics: metrics.clone(),
                failures: failures.clone(),
            })
            .context("cannot create the Kafka producer")
    };
    let mut failures = Arc::new(AtomicU64::new(0));
    let mut producer = create(&failures)?;
    let destination = lock(&outbox).add_destination();
    let notify = wakers.register();
    let key = ic_kafka_client::record_key(&pb::ReplicaIdentity {
        scope: Some(identity.scope.clone()),
        replica_id: identity.replica_id.clone(),
        ..Default::default()
    });
    tracing::info!(topic = %settings.topic, key = %key, "producing index batches to Kafka");
    let mut seqs: Vec<u64> = Vec::new();
    let mut heartbeat = tokio::time::interval(HEARTBEAT);
    let mut resync = tokio::time::interval(settings.resync_every);
    resync.tick().await;
    let mut wait = false;
    loop {
        if wait {
            tokio::select! {
                () = notify.notified() => {}
                _ = heartbeat.tick() => {
                    if !heartbeats(&producer, &settings.topic, &key, &identity, &mut seqs, &outbox, &metrics) {
                        metrics.resyncs.inc();
                        lock(&outbox).mark_for_resync(destination);
                    }
                }
                _ = resync.tick() => {
                    metrics.resyncs.inc();
                    lock(&outbox).mark_for_resync(destination);
                }
                () = shutdown.cancelled() => break,
            }
        }
        if failures.load(Ordering::Relaxed) > 0 {
            // A fresh producer (a new producer id) after any lost record:
            // an idempotent producer whose records timed out must otherwise
            // renegotiate its epoch with the brokers, which not every
            // Kafka-protocol broker supports, or it stopped for good. What
            // the old one still holds is superseded by the resync.
            if let Some(error) = producer.client().fatal_error() {
                tracing::warn!(error = ?error, "the Kafka producer failed for good");
            }
            producer.purge(PurgeConfig::default().queue().inflight().non_blocking());
            failures = Arc::new(AtomicU64::new(0));
            let old = std::mem::replace(&mut producer, create(&failures)?);
            tokio::task::spawn_blocking(move || drop(old));
            metrics.resyncs.inc();
            lock(&outbox).mark_for_resync(destination);
        }
        let (work, stats, ready) = {
            let mut ob = lock(&outbox);
            let work = ob.take(destination, CHUNK);
            let ready: Vec<(u32, bool)> =
                (0..ob.ranks()).map(|r| (r, ob.is_incomplete(r))).collect();
            (work, (ob.tier2, ob.engine_load, ob.engine_cache), ready)
        };
        wait = work.is_empty();
        let incomplete = |rank: u32| ready.iter().any(|&(r, i)| r == rank && i);
        for item in work {
            let rank = match &item {
                Outgoing::Resync { rank, .. } | Outgoing::Delta { rank, .. } => *rank,
            };
            let batches = forwarder::batches(&identity, &mut seqs, item, stats, incomplete(rank));
            let mut sent = true;
            for batch in batches {
                if let Err(reason) = send(&producer, &settings.topic, &key, &batch, &metrics) {
                    metrics.dropped(reason);
                    sent = false;
                    break;
                }
            }
            if !sent {
                // What follows would arrive after a hole anyway: resync
                // once the queue has room again.
                metrics.resyncs.inc();
                lock(&outbox).mark_for_resync(destination);
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                    () = shutdown.cancelled() => {}
                }
                wait = false;
                break;
            }
        }
        metrics.in_flight.set(i64::from(producer.in_flight_count()));
        if shutdown.is_cancelled() {
            break;
        }
    }
    wakers.unregister(&notify);
    lock(&outbox).remove_destination(destination);
    let flushed = tokio::task::spawn_blocking(move || producer.flush(FLUSH)).await;
    if let Ok(Err(error)) = flushed {
        tracing::warn!(%error, "not every batch reached Kafka before stopping");
    }
    Ok(())
}

/// Queues one batch; `Err` names why it was dropped.
fn send(
    producer: &ThreadedProducer<Delivery>,
    topic: &str,
    key: &str,
    batch: &pb::IngestBatch,
    metrics: &KafkaMetrics,
) -> Result<(), &'static str> {
    let value = ic_kafka_client::encode(batch);
    match producer.send(BaseRecord::to(topic).key(key).payload(&value)) {
        Ok(()) => {
            metrics.produced.inc();
            Ok(())
        }
        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => Err("queue_full"),
        Err((KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _)) => {
            Err("too_large")
        }
        Err((error, _)) => {
            tracing::warn!(%error, "cannot queue a batch for Kafka");
            Err("other")
        }
    }
}

/// An empty batch for every rank that has sent something to the topic;
/// `false` when one was dropped (its rank's sequence has a hole).
fn heartbeats(
    producer: &ThreadedProducer<Delivery>,
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
        if let Err(reason) = send(producer, topic, key, &batch, metrics) {
            metrics.dropped(reason);
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use clap::{CommandFactory as _, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        kafka: KafkaProducerFlags,
    }

    #[test]
    fn the_flags_make_an_idempotent_bounded_producer() {
        Cli::command().debug_assert();
        assert!(
            Cli::try_parse_from(["x"])
                .unwrap()
                .kafka
                .settings()
                .unwrap()
                .is_none()
        );
        let cli = Cli::try_parse_from([
            "x",
            "--transport",
            "kafka",
            "--kafka-brokers",
            "127.0.0.1:9092",
            "--kafka-queue-messages",
            "50",
            "--kafka-delivery-timeout-ms",
            "1500",
        ])
        .unwrap();
        let s = cli.kafka.settings().unwrap().unwrap();
        assert_eq!(s.client.get("enable.idempotence"), Some("true"));
        assert_eq!(s.client.get("acks"), Some("all"));
        assert_eq!(s.client.get("queue.buffering.max.messages"), Some("50"));
        assert_eq!(s.client.get("delivery.timeout.ms"), Some("1500"));
        assert_eq!(s.resync_every, Duration::from_secs(600));
        assert!(
            Cli::try_parse_from(["x", "--kafka-queue-messages", "0"]).is_err(),
            "the queue holds at least one record"
        );
    }
}
