//! The Kafka event transport (`--event-transport kafka`).
//!
//! One blocking thread owns an rdkafka consumer. It assigns every partition
//! of the topic itself and seeks each to one past the offset in the views'
//! [`Position`](ic_coordinator_core::kafka::Position), the same position the
//! checkpoint carries. The consumer group is never asked where to start and
//! nothing is committed to it, so the restored views and the resume point
//! cannot disagree. Each record goes through [`Ingest::ingest_record`](crate::ingest::Ingest::ingest_record),
//! which offers it to the gate and advances the position under the views
//! lock; malformed records advance the position too, so one bad record never
//! stalls its partition.
//!
//! librdkafka reconnects on its own; this loop adds backoff around the calls
//! that need the broker (metadata, watermarks) so a dead broker costs a few
//! requests a second at most, and it reports every failure in metrics and
//! `/status`. Those calls go through a second client that never fetches:
//! on the consuming client they would queue behind its long-poll fetches and
//! take up to `fetch.wait.max.ms` each.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use ic_coordinator_core::kafka::{self, Backoff};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::ingest::RecordOutcome;
use crate::metrics::{KindLabel, PartitionLabel, ReasonLabel, ResultLabel};
use crate::state::App;

/// `client.id` the reference coordinator uses.
pub const CLIENT_ID: &str = "lmcache-coordinator";

/// How long one poll blocks; also bounds how late a stop is noticed.
const POLL: Duration = Duration::from_millis(100);
/// Records taken per step before the periodic work gets a turn.
const BURST: usize = 1000;
/// Broker round-trips (metadata, watermarks) give up after this.
const BROKER_TIMEOUT: Duration = Duration::from_secs(2);
/// New partitions of the topic are picked up this often.
const METADATA_REFRESH: Duration = Duration::from_secs(30);
/// High watermarks (lag, readiness) are refreshed this often.
const WATERMARK_REFRESH: Duration = Duration::from_millis(500);
/// First and largest delay between attempts while the broker fails.
const BACKOFF_INITIAL: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

pub use crate::kafka_state::{KafkaSettings, KafkaState, KafkaStatus};

/// The two clients: one consumes, one asks the broker for metadata and
/// watermarks.
#[allow(missing_debug_implementations)] // rdkafka clients are not Debug.
pub struct Clients {
    consumer: BaseConsumer,
    probe: BaseConsumer,
}

/// Builds the clients; only a bad configuration fails here (nothing
/// connects yet), so boot errors are configuration errors.
pub fn clients(settings: &KafkaSettings) -> anyhow::Result<Clients> {
    Ok(Clients {
        consumer: client(settings)?,
        probe: client(settings)?,
    })
}

fn client(settings: &KafkaSettings) -> anyhow::Result<BaseConsumer> {
    ClientConfig::new()
        .set("bootstrap.servers", &settings.bootstrap_servers)
        .set("group.id", &settings.group_id)
        .set("client.id", CLIENT_ID)
        // The checkpoint is the only cursor: never commit, never store.
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("enable.partition.eof", "false")
        .set("reconnect.backoff.ms", "100")
        .set("reconnect.backoff.max.ms", "10000")
        .create()
        .context("cannot create the Kafka consumer")
}

/// Readiness under `--max-ready-lag`.
pub fn ready(app: &App) -> bool {
    match (&app.settings.kafka, &app.kafka) {
        (
            Some(KafkaSettings {
                max_ready_lag: Some(_),
                ..
            }),
            Some(state),
        ) => state.status.lock().caught_up,
        _ => true,
    }
}

/// The `/status` section.
pub fn status_json(app: &App) -> Value {
    let (Some(settings), Some(state)) = (&app.settings.kafka, &app.kafka) else {
        return Value::Null;
    };
    let status = state.status.lock();
    let lasts: Vec<Option<i64>> = app.views.read(|views| {
        status
            .assigned
            .iter()
            .map(|p| views.kafka.last_offset(&settings.topic, *p))
            .collect()
    });
    let partitions: Vec<Value> = status
        .assigned
        .iter()
        .zip(lasts)
        .map(|(p, last)| {
            let marks = status.watermarks.get(p);
            json!({"partition": p, "last_offset": last,
                   "low_watermark": marks.map(|m| m.0), "high_watermark": marks.map(|m| m.1),
                   "lag": marks.map(|(lo, hi)| kafka::lag(last, *lo, *hi))})
        })
        .collect();
    json!({
        "bootstrap_servers": settings.bootstrap_servers,
        "topic": settings.topic,
        "group_id": settings.group_id,
        "connected": status.connected,
        "last_error": status.last_error,
        "failures": status.failures,
        "max_ready_lag": settings.max_ready_lag,
        "caught_up": status.caught_up,
        "partitions": partitions,
    })
}

/// Consumes until `stop`; run it on a blocking thread.
pub fn run(app: App, clients: Clients, stop: CancellationToken) {
    let Some(settings) = app.settings.kafka.clone() else {
        return;
    };
    let mut session = Session {
        app,
        consumer: clients.consumer,
        probe: clients.probe,
        topic: settings.topic,
        max_ready_lag: settings.max_ready_lag,
        backoff: Backoff::new(BACKOFF_INITIAL, BACKOFF_MAX),
        assigned: Vec::new(),
        next_metadata: Instant::now(),
        next_watermarks: Instant::now(),
    };
    tracing::info!(topic = %session.topic, "Kafka consumer started");
    while !stop.is_cancelled() {
        if let Err(error) = session.step() {
            session.failed(error.0, &error.1);
            let delay = session.backoff.next_delay();
            wait(&stop, delay);
        }
    }
    tracing::info!(topic = %session.topic, "Kafka consumer stopped");
}

/// Sleeps up to `delay`, returning early on stop.
fn wait(stop: &CancellationToken, delay: Duration) {
    let until = Instant::now() + delay;
    while !stop.is_cancelled() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(POLL));
    }
}

/// A failed broker call: fixed metric kind and the message.
struct Failure(&'static str, String);

struct Session {
    app: App,
    consumer: BaseConsumer,
    probe: BaseConsumer,
    topic: String,
    max_ready_lag: Option<u64>,
    backoff: Backoff,
    assigned: Vec<i32>,
    next_metadata: Instant,
    next_watermarks: Instant,
}

impl Session {
    fn step(&mut self) -> Result<(), Failure> {
        // After a failure the metadata call doubles as the reconnect probe.
        let connected = self.app.kafka_status(|s| s.connected);
        if self.assigned.is_empty() || !connected || Instant::now() >= self.next_metadata {
            self.refresh_partitions()?;
            self.next_metadata = Instant::now() + METADATA_REFRESH;
        }
        if Instant::now() >= self.next_watermarks {
            self.refresh_watermarks()?;
            self.next_watermarks = Instant::now() + WATERMARK_REFRESH;
        }
        let mut timeout = POLL;
        for _ in 0..BURST {
            match self.consumer.poll(timeout) {
                None => break,
                Some(Ok(msg)) => {
                    self.apply(
                        msg.topic(),
                        msg.partition(),
                        msg.offset(),
                        msg.key(),
                        msg.payload(),
                    );
                    // Drain what is already buffered without waiting.
                    timeout = Duration::ZERO;
                }
                Some(Err(error)) => return Err(Failure("consume", error.to_string())),
            }
        }
        if timeout.is_zero() {
            self.succeeded();
        }
        Ok(())
    }

    /// Assigns every partition of the topic, each at its resume point, when
    /// the set of partitions changed (first call, or the topic grew).
    fn refresh_partitions(&mut self) -> Result<(), Failure> {
        let metadata = self
            .probe
            .fetch_metadata(Some(&self.topic), BROKER_TIMEOUT)
            .map_err(|e| Failure("metadata", e.to_string()))?;
        let topic = metadata
            .topics()
            .iter()
            .find(|t| t.name() == self.topic)
            .ok_or_else(|| {
                Failure(
                    "metadata",
                    format!("topic {:?} not in metadata", self.topic),
                )
            })?;
        if let Some(error) = topic.error() {
            let error = rdkafka::error::RDKafkaErrorCode::from(error);
            return Err(Failure(
                "metadata",
                format!("topic {:?}: {error}", self.topic),
            ));
        }
        let mut partitions: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
        partitions.sort_unstable();
        if partitions.is_empty() {
            return Err(Failure(
                "metadata",
                format!("topic {:?} has no partitions", self.topic),
            ));
        }
        if partitions == self.assigned {
            return Ok(());
        }
        let mut list = TopicPartitionList::new();
        {
            // This thread is the only writer of the position, so the resume
            // points cannot move before the assignment below. Buffered
            // records of a previous assignment are dropped by librdkafka and
            // read again from exactly here.
            let starts: Vec<kafka::StartAt> = self.app.views.read(|views| {
                partitions
                    .iter()
                    .map(|p| views.kafka.resume_at(&self.topic, *p))
                    .collect()
            });
            for (p, start) in partitions.iter().zip(starts) {
                let offset = match start {
                    kafka::StartAt::Earliest => Offset::Beginning,
                    kafka::StartAt::Offset(o) => Offset::Offset(o),
                };
                list.add_partition_offset(&self.topic, *p, offset)
                    .map_err(|e| Failure("assign", e.to_string()))?;
            }
        }
        self.consumer
            .assign(&list)
            .map_err(|e| Failure("assign", e.to_string()))?;
        tracing::info!(topic = %self.topic, partitions = ?partitions, "Kafka partitions assigned");
        self.assigned = partitions;
        self.app
            .kafka_status(|s| s.assigned = self.assigned.clone());
        self.succeeded();
        Ok(())
    }

    /// Fetches high watermarks: lag metrics, the readiness gate, and a
    /// cheap probe of the broker while no records arrive.
    fn refresh_watermarks(&mut self) -> Result<(), Failure> {
        let mut marks = BTreeMap::new();
        for p in &self.assigned {
            let m = self
                .probe
                .fetch_watermarks(&self.topic, *p, BROKER_TIMEOUT)
                .map_err(|e| Failure("watermarks", e.to_string()))?;
            marks.insert(*p, m);
        }
        let lasts: Vec<Option<i64>> = self.app.views.read(|views| {
            marks
                .keys()
                .map(|p| views.kafka.last_offset(&self.topic, *p))
                .collect()
        });
        let lags: Vec<u64> = marks
            .values()
            .zip(&lasts)
            .map(|((lo, hi), last)| kafka::lag(*last, *lo, *hi))
            .collect();
        let m = &self.app.metrics.metrics;
        for ((p, lag), last) in marks.keys().zip(&lags).zip(&lasts) {
            let label = PartitionLabel { partition: *p };
            m.kafka_lag
                .get_or_create(&label)
                .set(i64::try_from(*lag).unwrap_or(i64::MAX));
            // Also after a restart, before the first new record arrives.
            if let Some(last) = last {
                m.kafka_last_offset.get_or_create(&label).set(*last);
            }
        }
        let caught_up = self
            .max_ready_lag
            .is_some_and(|max| kafka::caught_up(max, &lags));
        let newly = self.app.kafka_status(|s| {
            s.watermarks = marks;
            let newly = caught_up && !s.caught_up;
            s.caught_up |= caught_up;
            newly
        });
        if newly {
            m.kafka_caught_up.set(1);
            tracing::info!(topic = %self.topic, lags = ?lags, "Kafka consumer caught up; ready");
        }
        self.succeeded();
        Ok(())
    }

    fn apply(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) {
        let decoded = kafka::decode_and_validate(key, value.unwrap_or_default());
        // The same claim bounds as POST /events: a record over them is skipped.
        let refused = decoded.as_ref().ok().and_then(|b| {
            let max = self.app.settings.max_event_entry_bytes;
            self.app
                .views
                .read(|v| v.capacity.check_claims(b, max).err())
        });
        if let Some(e) = &refused {
            tracing::warn!(topic, partition, offset, reason = e.reason(), %e, "skipping Kafka record: entry refused");
            self.app
                .metrics
                .metrics
                .event_entries_refused
                .get_or_create(&ReasonLabel { reason: e.reason() })
                .inc();
        }
        if let Err(error) = &decoded {
            tracing::warn!(
                topic,
                partition,
                offset,
                kind = error.kind(),
                %error,
                "skipping malformed Kafka record"
            );
        }
        let outcome = self.app.ingest.ingest_record(
            topic,
            partition,
            offset,
            decoded.as_ref().ok().filter(|_| refused.is_none()),
        );
        let result = match outcome {
            RecordOutcome::AlreadyConsumed => "already_consumed",
            RecordOutcome::Malformed => "malformed",
            RecordOutcome::Offered(o) => o.as_str(),
        };
        let m = &self.app.metrics.metrics;
        m.kafka_records.get_or_create(&ResultLabel { result }).inc();
        m.kafka_last_offset
            .get_or_create(&PartitionLabel { partition })
            .set(offset);
    }

    fn succeeded(&mut self) {
        self.backoff.reset();
        let was = self.app.kafka_status(|s| {
            let was = s.connected;
            s.connected = true;
            s.last_error = None;
            was
        });
        if !was {
            self.app.metrics.metrics.kafka_connected.set(1);
            tracing::info!(topic = %self.topic, "Kafka broker reachable");
        }
    }

    fn failed(&mut self, kind: &'static str, error: &str) {
        let m = &self.app.metrics.metrics;
        m.kafka_errors.get_or_create(&KindLabel { kind }).inc();
        m.kafka_connected.set(0);
        self.app.kafka_status(|s| {
            s.connected = false;
            s.failures += 1;
            s.last_error = Some(format!("{kind}: {error}"));
        });
        tracing::warn!(topic = %self.topic, kind, error, "Kafka broker call failed; retrying with backoff");
    }
}
