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
//! librdkafka reconnects on its own. The calls that ask the broker about the
//! topic (metadata, watermarks) run on a thread of their own through a
//! second client that never fetches ([`ic_kafka_client::probe`], shared with
//! the index server), with backoff while they fail: a slow or failing broker
//! delays the lag figure, never the records, and every failure is reported
//! in metrics and `/status`. Only a fatal consumer error backs the reading
//! loop off.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use ic_coordinator_core::kafka::{self, Backoff};
use ic_kafka_client::probe::{BrokerProbe, ProbeCursor, ProbeTimes};
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
    let probe = match BrokerProbe::start(
        clients.probe,
        settings.topic.clone(),
        ProbeTimes {
            watermarks_every: WATERMARK_REFRESH,
            metadata_every: METADATA_REFRESH,
            timeout: BROKER_TIMEOUT,
            backoff_max: BACKOFF_MAX,
        },
    ) {
        Ok(probe) => probe,
        Err(error) => {
            tracing::error!(%error, "cannot start the Kafka lag thread; not consuming");
            return;
        }
    };
    let mut session = Session {
        app,
        consumer: clients.consumer,
        probe,
        seen: ProbeCursor::default(),
        topic: settings.topic,
        max_ready_lag: settings.max_ready_lag,
        backoff: Backoff::new(BACKOFF_INITIAL, BACKOFF_MAX),
        assigned: Vec::new(),
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
    probe: BrokerProbe,
    seen: ProbeCursor,
    topic: String,
    max_ready_lag: Option<u64>,
    backoff: Backoff,
    assigned: Vec<i32>,
}

impl Session {
    /// What the lag thread learnt, then a burst of records. Only a fatal
    /// consumer error returns `Err` (the caller backs off); a failed lag
    /// or metadata query is reported and reading goes on.
    fn step(&mut self) -> Result<(), Failure> {
        let news = self.probe.news(&mut self.seen);
        if news.failures > 0 {
            let m = &self.app.metrics.metrics;
            let error = news
                .last_error
                .clone()
                .unwrap_or(ic_kafka_client::probe::ProbeError {
                    kind: "metadata",
                    message: String::new(),
                });
            // Every failed call counted; the newest one logged and shown.
            m.kafka_errors
                .get_or_create(&KindLabel { kind: error.kind })
                .inc_by(news.failures - 1);
            self.failed(error.kind, &error.message);
        }
        if let Some(partitions) = news.partitions {
            self.assign_partitions(partitions)?;
        }
        if let Some(marks) = news.watermarks {
            self.update_lag(marks);
        }
        if self.assigned.is_empty() {
            // Nothing to read until the lag thread's first partition
            // lookup: wait for it without spinning.
            std::thread::sleep(POLL);
            return Ok(());
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
                Some(Err(error)) => {
                    if ic_kafka_client::probe::is_fatal(&self.consumer, &error) {
                        return Err(Failure("consume", error.to_string()));
                    }
                    // librdkafka retries on its own: reported, no backoff.
                    self.failed("consume", &error.to_string());
                    break;
                }
            }
        }
        if timeout.is_zero() {
            self.succeeded();
        }
        Ok(())
    }

    /// Assigns every partition of the topic, each at its resume point, when
    /// the set of partitions changed (first lookup, or the topic grew).
    fn assign_partitions(&mut self, partitions: Vec<i32>) -> Result<(), Failure> {
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

    /// Lag metrics and the readiness gate from the lag thread's newest
    /// watermarks.
    fn update_lag(&mut self, marks: BTreeMap<i32, (i64, i64)>) {
        let marks: BTreeMap<i32, (i64, i64)> = marks
            .into_iter()
            .filter(|(p, _)| self.assigned.contains(p))
            .collect();
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
        tracing::warn!(topic = %self.topic, kind, error, "Kafka broker call failed");
    }
}
