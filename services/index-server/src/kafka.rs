//! `--transport kafka`: this replica consumes every partition of the topic
//! on its own (manual assignment: no consumer group, no shared commits)
//! and feeds each batch through the same ingest path as IngestEvents
//! ([`IngestStream::accept`], then [`IndexCore::ingest`]), with one
//! ingest session per partition, since a partition carries many replicas.
//!
//! A batch of a rank the session does not know (no resync seen since this
//! replica started, or its sequence broke) is skipped and counted until the
//! rank's next resync, which every subscriber sends periodically
//! (`--kafka-resync-interval-seconds`). Snapshots ([`crate::snapshot`])
//! let a restarted replica replay only the log's tail; without one it
//! reads from the earliest retained offset. A position the log no longer
//! holds (retention passed it, or the broker lost the log) goes back to
//! the earliest offset, counted. Ready when the lag over all partitions is
//! at most `--kafka-ready-lag-messages`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use ic_index::ingest::{IngestLimits, Step};
use ic_kafka_client::probe::{BrokerProbe, ProbeCursor, ProbeTimes};
use ic_proto::index_v1 as pb;
use ic_telemetry::MetricsRegistry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use rdkafka::consumer::{BaseConsumer, Consumer as _};
use rdkafka::message::Message as _;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::index_core::{IndexCore, StepEnd};
use crate::ingest::{IngestStream, engine_facts, rank_of};
use crate::snapshot::{self, Snapshot};

/// The index server's Kafka flags.
#[derive(Clone, Debug, clap::Args)]
pub struct KafkaConsumerFlags {
    /// Brokers, topic, TLS and SASL (shared with the subscriber).
    #[command(flatten)]
    pub client: ic_kafka_client::KafkaFlags,

    /// Directory (a volume) for snapshots of the index and the consumed
    /// offsets; without it a restart replays the whole retained log.
    #[arg(long, env = "IC_KAFKA_SNAPSHOT_DIR")]
    pub kafka_snapshot_dir: Option<PathBuf>,

    /// Seconds between snapshots.
    #[arg(long, env = "IC_KAFKA_SNAPSHOT_INTERVAL_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub kafka_snapshot_interval_seconds: u64,

    /// Ready only while the consumer is at most this many messages behind
    /// the end of the topic (all partitions together).
    #[arg(long, env = "IC_KAFKA_READY_LAG_MESSAGES", default_value_t = 1000)]
    pub kafka_ready_lag_messages: u64,

    /// Brokers the lag and partition queries go to (default:
    /// --kafka-brokers). Hidden: tests point it at a listener that never
    /// answers to show that reading does not wait on those queries.
    #[arg(long, env = "IC_KAFKA_PROBE_BROKERS", hide = true)]
    pub kafka_probe_brokers: Option<String>,
}

const CLIENT_ID: &str = "ic-index-server";
/// How long a poll waits for a record.
const POLL: Duration = Duration::from_millis(100);
/// Records handled between the loop's other duties.
const BURST: usize = 1000;
/// How often the lag (and the broker) is checked.
const WATERMARKS_EVERY: Duration = Duration::from_secs(1);
/// How often the topic's partitions are looked up.
const METADATA_EVERY: Duration = Duration::from_secs(30);
/// A broker call's timeout.
const BROKER_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the partitions' sessions are swept for silent ranks.
const RANK_SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Batch outcome labels (fixed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    /// `applied`, `buffered`, `skipped_unknown`, `skipped_gap`,
    /// `refused`, `invalid`, `undecodable`.
    outcome: &'static str,
}

/// Snapshot outcome labels (fixed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SnapshotLabel {
    /// `written`, `failed`, `loaded`, `load_skipped`, `busy`.
    outcome: &'static str,
}

/// The consumer's metrics (prefixed `inferencecache_index_kafka_`).
#[derive(Clone, Debug, Default)]
struct KafkaMetrics {
    lag: Gauge,
    ready: Gauge,
    batches: Family<OutcomeLabel, Counter>,
    offset_resets: Counter,
    errors: Counter,
    snapshots: Family<SnapshotLabel, Counter>,
    snapshot_age: Gauge,
    snapshot_duration_ms: Gauge,
    snapshot_bytes: Gauge,
    snapshot_entries: Gauge,
    silent_ranks_forgotten: Counter,
}

impl KafkaMetrics {
    fn register(registry: &MetricsRegistry) -> Self {
        let m = Self::default();
        registry.register_with(|r| {
            let r = r.sub_registry_with_prefix("index_kafka");
            r.register(
                "consumer_lag_messages",
                "Messages between this replica's positions and the ends of the topic's partitions, summed",
                m.lag.clone(),
            );
            r.register(
                "consumer_ready",
                "1 while the lag is within --kafka-ready-lag-messages",
                m.ready.clone(),
            );
            r.register(
                "batches",
                "Batches read from the topic, by outcome",
                m.batches.clone(),
            );
            r.register(
                "silent_ranks_forgotten",
                "Ranks a partition's session forgot after --replica-gc-after-seconds without a batch, with any resync they left unfinished",
                m.silent_ranks_forgotten.clone(),
            );
            r.register(
                "offset_resets",
                "Partitions whose position the log no longer held (retention or a lost log), restarted from the earliest offset",
                m.offset_resets.clone(),
            );
            r.register(
                "consumer_errors",
                "Errors talking to the brokers",
                m.errors.clone(),
            );
            r.register(
                "snapshots",
                "Snapshots written or loaded, by outcome",
                m.snapshots.clone(),
            );
            r.register(
                "snapshot_age_seconds",
                "Seconds since the newest snapshot written or loaded was taken (-1: none)",
                m.snapshot_age.clone(),
            );
            r.register(
                "snapshot_duration_milliseconds",
                "How long the last snapshot took: dump, encode and write",
                m.snapshot_duration_ms.clone(),
            );
            r.register(
                "snapshot_bytes",
                "Size of the last snapshot file written or loaded",
                m.snapshot_bytes.clone(),
            );
            r.register(
                "snapshot_entries",
                "Index entries in the last snapshot written or loaded",
                m.snapshot_entries.clone(),
            );
        });
        m.snapshot_age.set(-1);
        m
    }

    fn batch(&self, outcome: &'static str) {
        self.batches.get_or_create(&OutcomeLabel { outcome }).inc();
    }

    fn snapshot(&self, outcome: &'static str) {
        self.snapshots
            .get_or_create(&SnapshotLabel { outcome })
            .inc();
    }
}

/// The consumer's settings, checked.
#[derive(Debug)]
pub struct Settings {
    client: rdkafka::ClientConfig,
    /// The lag/metadata client's configuration (brokers may differ).
    probe: rdkafka::ClientConfig,
    topic: String,
    snapshot_dir: Option<PathBuf>,
    snapshot_every: Duration,
    ready_lag: u64,
    /// A rank of a partition's session not heard from for this long is
    /// forgotten (`--replica-gc-after-seconds`; `None`: never).
    rank_silence: Option<Duration>,
}

impl Settings {
    /// Forgets a partition's ranks silent for longer than `after` (the
    /// replica GC's silence, so a rank goes when its replica does).
    #[must_use]
    pub fn forgetting_ranks_after(self, after: Option<Duration>) -> Self {
        Self {
            rank_silence: after,
            ..self
        }
    }
}

impl KafkaConsumerFlags {
    /// The checked settings, or `None` with `--transport grpc`.
    pub fn settings(&self) -> Result<Option<Settings>, ic_kafka_client::ConfigError> {
        if !self.client.enabled() {
            return Ok(None);
        }
        let mut client = self.client.client_config(CLIENT_ID)?;
        // Every replica reads every partition from its own positions: a
        // group id is required by librdkafka, but nothing is committed and
        // partitions are assigned, never balanced.
        client
            .set("group.id", format!("{CLIENT_ID}-{}", std::process::id()))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            // A position the log no longer holds goes on from the
            // earliest retained offset; `handle` counts the jump.
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            // A broker that holds a fetch for its whole wait even when
            // records arrive (tansu 0.6 does) would add this much to every
            // event's way into the index.
            .set("fetch.wait.max.ms", "100")
            .set(
                "fetch.message.max.bytes",
                ic_kafka_client::MAX_MESSAGE_BYTES.to_string(),
            );
        let mut probe = client.clone();
        if let Some(brokers) = &self.kafka_probe_brokers {
            probe.set("bootstrap.servers", brokers);
        }
        Ok(Some(Settings {
            client,
            probe,
            topic: self.client.kafka_topic.clone(),
            snapshot_dir: self.kafka_snapshot_dir.clone(),
            snapshot_every: Duration::from_secs(self.kafka_snapshot_interval_seconds),
            ready_lag: self.kafka_ready_lag_messages,
            rank_silence: None,
        }))
    }
}

/// A partition's ingest session bounds, from IngestEvents': a partition
/// carries many replicas' ranks, so it may hold as many as the index and
/// buffer as much unfinished resync as the whole server (the shared budget
/// still bounds every stream and partition together).
pub fn limits(grpc: &IngestLimits) -> IngestLimits {
    IngestLimits {
        max_ranks: usize::MAX,
        max_stream_resync_bytes: grpc.budget.limit(),
        budget: grpc.budget.clone(),
        max_name_bytes: grpc.max_name_bytes,
        max_dp_ranks: grpc.max_dp_ranks,
    }
}

/// One partition's position and ingest session.
#[derive(Debug)]
struct Partition {
    /// Next offset to read; `None`: the earliest retained.
    next: Option<i64>,
    session: IngestStream,
    /// Latest (low, high) watermarks.
    marks: Option<(i64, i64)>,
}

/// The running consumer (one blocking thread).
#[allow(missing_debug_implementations)] // rdkafka clients are not Debug.
pub struct KafkaConsumer {
    core: Arc<IndexCore>,
    consumer: BaseConsumer,
    probe: BrokerProbe,
    seen: ProbeCursor,
    /// The partitions assigned to `consumer`, sorted.
    assigned: Vec<i32>,
    settings: Settings,
    limits: IngestLimits,
    partitions: BTreeMap<i32, Partition>,
    metrics: KafkaMetrics,
    ready: watch::Sender<bool>,
    /// When the newest snapshot written or loaded was taken (Unix ms; 0: none).
    snapshot_taken_ms: Arc<AtomicI64>,
    writing: Option<std::thread::JoinHandle<()>>,
    next_snapshot: Instant,
    next_rank_sweep: Instant,
}

/// What [`start`] hands back.
#[derive(Debug)]
pub struct Started {
    /// Whether the consumer is caught up (lag within the threshold).
    pub ready: watch::Receiver<bool>,
    /// The consumer thread; it ends after `shutdown`.
    pub task: tokio::task::JoinHandle<()>,
}

/// Creates the clients (a bad configuration fails here; nothing connects
/// yet) and starts consuming on a blocking thread until `shutdown`. The
/// newest snapshot is loaded first, on that thread.
pub fn start(
    settings: Settings,
    core: Arc<IndexCore>,
    limits: IngestLimits,
    registry: &MetricsRegistry,
    shutdown: CancellationToken,
) -> anyhow::Result<Started> {
    use anyhow::Context as _;
    let consumer: BaseConsumer = settings
        .client
        .create()
        .context("cannot create the Kafka consumer")?;
    let probe: BaseConsumer = settings
        .probe
        .create()
        .context("cannot create the Kafka metadata client")?;
    let probe = BrokerProbe::start(
        probe,
        settings.topic.clone(),
        ProbeTimes {
            watermarks_every: WATERMARKS_EVERY,
            metadata_every: METADATA_EVERY,
            timeout: BROKER_TIMEOUT,
            backoff_max: Duration::from_secs(10),
        },
    )
    .context("cannot start the Kafka lag thread")?;
    let (ready, ready_rx) = watch::channel(false);
    let now = Instant::now();
    let mut this = KafkaConsumer {
        core,
        consumer,
        probe,
        seen: ProbeCursor::default(),
        assigned: Vec::new(),
        next_snapshot: now + settings.snapshot_every,
        next_rank_sweep: now + RANK_SWEEP_EVERY,
        settings,
        limits,
        partitions: BTreeMap::new(),
        metrics: KafkaMetrics::register(registry),
        ready,
        snapshot_taken_ms: Arc::new(AtomicI64::new(0)),
        writing: None,
    };
    let task = tokio::task::spawn_blocking(move || {
        this.load_snapshot();
        this.run(&shutdown);
        if let Some(w) = this.writing.take() {
            let _ = w.join();
        }
    });
    Ok(Started {
        ready: ready_rx,
        task,
    })
}

impl KafkaConsumer {
    fn new_session(&self) -> IngestStream {
        IngestStream::with_limits(self.limits.clone())
    }

    /// Loads the newest valid snapshot, if any: the index, the sessions
    /// and the positions to resume from.
    fn load_snapshot(&mut self) {
        let Some(dir) = self.settings.snapshot_dir.clone() else {
            return;
        };
        let started = Instant::now();
        let metrics = self.metrics.clone();
        let loaded = snapshot::load_newest(&dir, &self.settings.topic, |error| {
            metrics.snapshot("load_skipped");
            tracing::warn!(%error, "snapshot not used");
        });
        let Some((snap, path, bytes)) = loaded else {
            tracing::info!(dir = %dir.display(), "no snapshot: reading the topic from its earliest offset");
            return;
        };
        let errors = self.core.index().restore(&snap.index, self.core.now_ms());
        self.core.metrics().set_index_size(self.core.index());
        for (partition, next) in &snap.offsets {
            let session = self.new_session();
            self.partitions.insert(
                *partition,
                Partition {
                    next: Some(*next),
                    session,
                    marks: None,
                },
            );
        }
        let mut left_out = 0;
        for (partition, ranks) in snap.sessions {
            let mut session = self.new_session();
            left_out += session.session_mut().import(ranks).len();
            self.partitions
                .entry(partition)
                .or_insert(Partition {
                    next: None,
                    session: IngestStream::default(),
                    marks: None,
                })
                .session = session;
        }
        self.snapshot_taken_ms
            .store(snap.taken_unix_ms, Ordering::Relaxed);
        self.metrics.snapshot("loaded");
        self.metrics
            .snapshot_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.metrics
            .snapshot_entries
            .set(i64::try_from(snap.index.entries()).unwrap_or(i64::MAX));
        tracing::info!(
            path = %path.display(),
            bytes,
            entries = snap.index.entries(),
            replicas = snap.index.replicas.len(),
            content_errors = errors.len(),
            ranks_left_out = left_out,
            load_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "snapshot loaded; replaying the topic from its offsets"
        );
    }

    fn run(&mut self, shutdown: &CancellationToken) {
        let mut backoff =
            ic_clock::Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        while !shutdown.is_cancelled() {
            match self.step() {
                // Records consumed (or a clean round): read again at once.
                Ok(()) => backoff.reset(),
                Err(error) => {
                    self.metrics.errors.inc();
                    let delay = backoff.next_delay();
                    tracing::warn!(%error, retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "Kafka consumer");
                    let until = Instant::now() + delay;
                    while Instant::now() < until && !shutdown.is_cancelled() {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        }
    }

    /// One round: what the lag thread learnt (new partitions, the lag),
    /// a burst of records, a snapshot when due. The lag and partition
    /// queries run on their own thread ([`BrokerProbe`]): a slow broker
    /// delays the lag figure (readiness stays as it was), never the
    /// records. Only a fatal consumer error, or no partitions to read,
    /// returns `Err` (the caller backs off).
    fn step(&mut self) -> Result<(), String> {
        let news = self.probe.news(&mut self.seen);
        if news.failures > 0 {
            self.metrics.errors.inc_by(news.failures);
            if let Some(error) = &news.last_error {
                tracing::warn!(kind = error.kind, error = %error.message, failures = news.failures, "Kafka lag or metadata query failed; the last readiness holds and reading goes on");
            }
        }
        if let Some(ids) = news.partitions {
            self.adopt_partitions(&ids)?;
        }
        if self.assigned.is_empty() {
            // Nothing to read yet: ask with the reading client too, so a
            // lag thread that cannot reach its brokers does not keep the
            // replica from reading.
            let ids = ic_kafka_client::probe::topic_partitions(
                &self.consumer,
                &self.settings.topic,
                BROKER_TIMEOUT,
            )?;
            self.adopt_partitions(&ids)?;
        }
        if let Some(marks) = news.watermarks {
            self.update_lag(&marks);
        }
        let mut timeout = POLL;
        for _ in 0..BURST {
            match self.consumer.poll(timeout) {
                None => break,
                Some(Ok(msg)) => {
                    let (partition, offset) = (msg.partition(), msg.offset());
                    let recorded_ms = msg.timestamp().to_millis();
                    let batch = ic_kafka_client::decode(msg.payload());
                    drop(msg);
                    self.handle(partition, offset, recorded_ms, batch);
                    timeout = Duration::ZERO;
                }
                Some(Err(error)) => {
                    if ic_kafka_client::probe::is_fatal(&self.consumer, &error) {
                        return Err(format!("consume (fatal): {error}"));
                    }
                    // librdkafka retries on its own: count it, poll on.
                    self.metrics.errors.inc();
                    tracing::warn!(%error, "Kafka consumer error; polling on");
                    break;
                }
            }
        }
        if Instant::now() >= self.next_snapshot {
            self.next_snapshot = Instant::now() + self.settings.snapshot_every;
            self.take_snapshot();
        }
        if Instant::now() >= self.next_rank_sweep {
            self.next_rank_sweep = Instant::now() + RANK_SWEEP_EVERY;
            self.forget_silent_ranks();
        }
        Ok(())
    }

    /// Forgets the ranks of every partition's session silent for longer
    /// than the replica GC's silence, with what their unfinished resyncs
    /// held of the shared budget.
    fn forget_silent_ranks(&mut self) {
        let Some(after) = self.settings.rank_silence else {
            return;
        };
        let now_ms = self.core.now_ms();
        let silent_ms = i64::try_from(after.as_millis()).unwrap_or(i64::MAX);
        for (partition, p) in &mut self.partitions {
            let gone = p.session.session_mut().forget_silent(now_ms, silent_ms);
            if !gone.is_empty() {
                self.metrics
                    .silent_ranks_forgotten
                    .inc_by(gone.len() as u64);
                tracing::info!(
                    partition,
                    ranks = gone.len(),
                    "forgot ranks silent past --replica-gc-after-seconds"
                );
            }
        }
    }

    /// Assigns every partition of the topic at its position when the set
    /// changed (a local call: nothing waits on the broker).
    fn adopt_partitions(&mut self, ids: &[i32]) -> Result<(), String> {
        if ids == self.assigned.as_slice() {
            return Ok(());
        }
        for id in ids {
            if !self.partitions.contains_key(id) {
                let session = self.new_session();
                self.partitions.insert(
                    *id,
                    Partition {
                        next: None,
                        session,
                        marks: None,
                    },
                );
            }
        }
        self.assign()?;
        self.assigned = ids.to_vec();
        tracing::info!(topic = %self.settings.topic, partitions = ?ids, "Kafka partitions assigned");
        Ok(())
    }

    /// (Re)assigns every partition at its position.
    fn assign(&mut self) -> Result<(), String> {
        let mut list = TopicPartitionList::new();
        for (id, p) in &self.partitions {
            let offset = p.next.map_or(Offset::Beginning, Offset::Offset);
            list.add_partition_offset(&self.settings.topic, *id, offset)
                .map_err(|e| format!("assign: {e}"))?;
        }
        self.consumer
            .assign(&list)
            .map_err(|e| format!("assign: {e}"))
    }

    /// The lag and readiness from the lag thread's newest watermarks.
    fn update_lag(&mut self, marks: &BTreeMap<i32, (i64, i64)>) {
        let mut lag: u64 = 0;
        for (id, p) in &mut self.partitions {
            let Some(&(low, high)) = marks.get(id) else {
                continue;
            };
            p.marks = Some((low, high));
            // Beyond the end counts as caught up: a broker may report a
            // high watermark below the last record (tansu 0.6 reports the
            // last batch's base offset + 1), and a lost log is noticed when
            // its records arrive (see `handle`).
            let position = p.next.unwrap_or(low).max(low);
            lag += u64::try_from(high.saturating_sub(position)).unwrap_or(0);
        }
        self.metrics.lag.set(i64::try_from(lag).unwrap_or(i64::MAX));
        let ready = lag <= self.settings.ready_lag;
        self.metrics.ready.set(i64::from(ready));
        self.ready
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
        let taken = self.snapshot_taken_ms.load(Ordering::Relaxed);
        if taken > 0 {
            let age = (self.core.now_ms() - taken).max(0) / 1000;
            self.metrics.snapshot_age.set(age);
        }
    }

    /// One record: through the ingest path, or skipped and counted. Until
    /// the consumer has caught up, a record is history, as of the time the
    /// log recorded it (else when its subscriber sent it).
    fn handle(
        &mut self,
        partition: i32,
        offset: i64,
        recorded_ms: Option<i64>,
        batch: Result<pb::IngestBatch, ic_kafka_client::DecodeError>,
    ) {
        let core = self.core.clone();
        let catching_up = !*self.ready.borrow();
        let metrics = self.metrics.clone();
        let session = self.new_session();
        let p = self.partitions.entry(partition).or_insert(Partition {
            next: None,
            session,
            marks: None,
        });
        if let Some(next) = p.next
            && offset != next
        {
            // The log no longer held our position (retention passed it, or
            // the broker lost the log) and librdkafka went on from the
            // earliest offset; ranks whose sequence broke wait for their
            // next resync.
            metrics.offset_resets.inc();
            tracing::warn!(
                partition,
                expected = next,
                offset,
                "the log no longer held this position: reading on from the earliest offset"
            );
        }
        p.next = Some(offset + 1);
        let batch = match batch {
            Ok(batch) => batch,
            Err(error) => {
                metrics.batch("undecodable");
                tracing::warn!(partition, offset, %error, "skipping a record");
                return;
            }
        };
        let rank = rank_of(&batch);
        let facts = engine_facts(&batch);
        let replayed_at = catching_up
            .then(|| recorded_ms.or((batch.sent_at_unix_ms > 0).then_some(batch.sent_at_unix_ms)))
            .flatten();
        let step = match p.session.accept(batch) {
            Ok(step) => step,
            Err(error) => {
                metrics.batch("invalid");
                core.metrics().ingest_batch("invalid");
                tracing::warn!(partition, offset, error = %error.0, "skipping an invalid batch");
                return;
            }
        };
        if let Some(rank) = &rank {
            p.session.session_mut().heard(rank, core.now_ms());
        }
        let buffered = matches!(step, Step::Buffered);
        let applied = match replayed_at {
            Some(at) => core.ingest_replayed(step, facts, at),
            None => core.ingest(step, facts),
        };
        match applied {
            Ok(()) => {
                metrics.batch(if buffered { "buffered" } else { "applied" });
                if !buffered {
                    core.metrics().ingest_batch("applied");
                }
            }
            Err(StepEnd::Resync(detail)) => {
                // Unknown rank, broken sequence or a new incarnation
                // without its resync: wait for the rank's next resync.
                let known = rank
                    .as_ref()
                    .is_some_and(|r| p.session.session_mut().forget(r));
                metrics.batch(if known {
                    "skipped_gap"
                } else {
                    "skipped_unknown"
                });
                tracing::debug!(partition, offset, %detail, "skipping until the replica resyncs");
            }
            Err(StepEnd::Refused(limit, detail)) => {
                if let Some(r) = &rank {
                    p.session.session_mut().forget(r);
                }
                metrics.batch("refused");
                core.metrics().ingest_refused(limit.label());
                tracing::warn!(partition, offset, %detail, limit = limit.label(), "a resync over the bounds was dropped; waiting for the next");
            }
        }
    }

    /// Dumps the index, the sessions and the positions at this point of
    /// the log (ingest waits meanwhile, lookups do not), and writes the
    /// file on another thread.
    fn take_snapshot(&mut self) {
        let Some(dir) = self.settings.snapshot_dir.clone() else {
            return;
        };
        if self.writing.as_ref().is_some_and(|w| !w.is_finished()) {
            self.metrics.snapshot("busy");
            return;
        }
        if let Some(w) = self.writing.take() {
            let _ = w.join();
        }
        let started = Instant::now();
        let taken_unix_ms = self.core.now_ms();
        let snap = Snapshot {
            topic: self.settings.topic.clone(),
            taken_unix_ms,
            offsets: self
                .partitions
                .iter()
                .filter_map(|(id, p)| p.next.map(|n| (*id, n)))
                .collect(),
            sessions: self
                .partitions
                .iter_mut()
                .map(|(id, p)| (*id, p.session.session_mut().export()))
                .collect(),
            index: self.core.index().dump(),
        };
        let metrics = self.metrics.clone();
        let taken = self.snapshot_taken_ms.clone();
        self.writing = Some(std::thread::spawn(move || {
            let bytes = snap.encode();
            match snapshot::write(&dir, taken_unix_ms, &bytes) {
                Ok(path) => {
                    let ms = started.elapsed().as_millis();
                    metrics.snapshot("written");
                    metrics
                        .snapshot_duration_ms
                        .set(i64::try_from(ms).unwrap_or(i64::MAX));
                    metrics
                        .snapshot_bytes
                        .set(i64::try_from(bytes.len()).unwrap_or(i64::MAX));
                    metrics
                        .snapshot_entries
                        .set(i64::try_from(snap.index.entries()).unwrap_or(i64::MAX));
                    taken.store(taken_unix_ms, Ordering::Relaxed);
                    tracing::info!(
                        path = %path.display(),
                        bytes = bytes.len(),
                        entries = snap.index.entries(),
                        duration_ms = u64::try_from(ms).unwrap_or(u64::MAX),
                        "snapshot written"
                    );
                }
                Err(error) => {
                    metrics.snapshot("failed");
                    tracing::warn!(%error, "snapshot not written");
                }
            }
        }));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use clap::{CommandFactory as _, Parser};

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        kafka: KafkaConsumerFlags,
    }

    #[test]
    fn the_flags_parse_and_check() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert!(cli.kafka.settings().unwrap().is_none(), "gRPC by default");
        let cli = Cli::try_parse_from(["x", "--transport", "kafka"]).unwrap();
        assert!(
            cli.kafka
                .settings()
                .unwrap_err()
                .to_string()
                .starts_with("--kafka-brokers: required")
        );
        let cli = Cli::try_parse_from([
            "x",
            "--transport",
            "kafka",
            "--kafka-brokers",
            "127.0.0.1:9092",
            "--kafka-snapshot-dir",
            "/tmp/s",
        ])
        .unwrap();
        let settings = cli.kafka.settings().unwrap().unwrap();
        assert_eq!(settings.client.get("auto.offset.reset"), Some("earliest"));
        assert_eq!(settings.client.get("enable.auto.commit"), Some("false"));
        assert_eq!(settings.snapshot_every, Duration::from_secs(60));
    }
}
