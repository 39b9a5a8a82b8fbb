//! The coordinator's shared state: the views behind one lock (every
//! mutation is serialized, batches apply in order), the registry, the
//! enabled controllers, and the broadcaster that feeds them.

use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ic_coordinator_core::capacity::CapacityRegistry;
use ic_coordinator_core::checkpoint::{self, Sections};
use ic_coordinator_core::directory::KeyDirectory;
use ic_coordinator_core::events::{Batch, EventsResponse};
use ic_coordinator_core::eviction::EvictionSettings;
use ic_coordinator_core::gate::{Gate, Verdict};
use ic_coordinator_core::kafka::Position;
use ic_coordinator_core::metadata::{self, Metadata};
use ic_coordinator_core::registry::Registry;
use ic_coordinator_core::usage::UsageView;
use parking_lot::Mutex;

use crate::clock::Clock;
use crate::controller::Controller;
use crate::kafka_state::{KafkaSettings, KafkaState, KafkaStatus};
use crate::metrics::{ConsumerLabel, MetricsSet, inc};
use crate::mp::MpClient;
use crate::persist;

/// Shared handle to the coordinator.
pub type App = Arc<Coordinator>;

/// The views every controller reads.
#[derive(Debug, Default)]
pub struct Views {
    /// Admission cursors.
    pub gate: Gate,
    /// Where keys live.
    pub directory: KeyDirectory,
    /// Bytes per tenant and module.
    pub usage: UsageView,
    /// Declared capacity.
    pub capacity: CapacityRegistry,
    /// Kafka records the views include (Kafka transport only). Guarded by
    /// the same lock as the views so the two always agree.
    pub kafka: Position,
}

/// What became of one Kafka record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordOutcome {
    /// Its offset is at or below the position: the gate saw it already.
    AlreadyConsumed,
    /// It did not decode or validate; skipped, its offset still consumed.
    Malformed,
    /// Offered to the gate, with its verdict.
    Offered(GateOutcome),
}

/// The gate's verdict on one batch, as counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateOutcome {
    /// Admitted and broadcast.
    Applied,
    /// Seq at or below the cursor.
    Duplicate,
    /// Older incarnation.
    Stale,
}

impl GateOutcome {
    /// Metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Duplicate => "duplicate",
            Self::Stale => "stale",
        }
    }
}

/// Settings resolved from the flags.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Tokens per chunk.
    pub chunk_size: usize,
    /// Silence before an instance is dropped.
    pub instance_timeout: Duration,
    /// Liveness sweep period (`None` disables it).
    pub health_check_interval: Option<Duration>,
    /// Eviction sweep period (`None` disables it).
    pub eviction_check_interval: Option<Duration>,
    /// Watermark and ratio.
    pub eviction: EvictionSettings,
    /// Checkpoint file.
    pub checkpoint_path: Option<PathBuf>,
    /// Checkpoint period (`None` = only at a clean stop).
    pub checkpoint_interval: Option<Duration>,
    /// Metadata file.
    pub metadata_path: Option<PathBuf>,
    /// `/metrics` answers 404.
    pub disable_metrics: bool,
    /// Events come from Kafka instead of `POST /events`.
    pub kafka: Option<KafkaSettings>,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            chunk_size: 256,
            instance_timeout: Duration::from_secs(30),
            health_check_interval: Some(Duration::from_secs(10)),
            eviction_check_interval: Some(Duration::from_secs(5)),
            eviction: EvictionSettings::default(),
            checkpoint_path: None,
            checkpoint_interval: Some(Duration::from_secs(60)),
            metadata_path: None,
            disable_metrics: false,
            kafka: None,
        }
    }
}

/// The coordinator.
#[derive(Debug)]
pub struct Coordinator {
    /// Resolved flags.
    pub settings: Settings,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// The views; this lock serializes every mutation.
    pub views: Mutex<Views>,
    /// Registered instances.
    pub registry: Mutex<Registry>,
    /// Enabled controllers, in registration order.
    pub controllers: Vec<Arc<dyn Controller>>,
    /// The eviction controller by its type, when enabled (its state is
    /// read by tests and `/status`-like tools; controllers never reach each
    /// other through this).
    pub eviction: Option<Arc<crate::controllers::FleetEvictionController>>,
    /// Metrics.
    pub metrics: MetricsSet,
    /// Client for MP-server calls.
    pub mp: MpClient,
    /// Serializes metadata writes so the file never goes back in time.
    metadata_lock: Mutex<()>,
    /// Wall time of the last successful checkpoint.
    pub last_checkpoint: Mutex<Option<f64>>,
    /// Wall time each background loop last finished a pass (for `/status`).
    pub loop_passes: Mutex<std::collections::BTreeMap<&'static str, f64>>,
    /// Consumer status (Kafka transport only).
    pub kafka: Option<KafkaState>,
}

impl Coordinator {
    /// Builds the coordinator (restore happens separately, before serving).
    pub fn new(
        settings: Settings,
        clock: Arc<dyn Clock>,
        controllers: Vec<Arc<dyn Controller>>,
        eviction: Option<Arc<crate::controllers::FleetEvictionController>>,
        metrics: MetricsSet,
    ) -> Self {
        for c in &controllers {
            metrics
                .metrics
                .controller_up
                .get_or_create(&crate::metrics::ControllerLabel {
                    controller: c.name(),
                })
                .set(1);
        }
        let kafka = settings.kafka.as_ref().map(|_| KafkaState::default());
        Self {
            settings,
            clock,
            views: Mutex::new(Views::default()),
            registry: Mutex::new(Registry::new()),
            controllers,
            eviction,
            metrics,
            mp: MpClient::new(),
            metadata_lock: Mutex::new(()),
            last_checkpoint: Mutex::new(None),
            loop_passes: Mutex::new(std::collections::BTreeMap::new()),
            kafka,
        }
    }

    /// Offers validated batches to the gate in order and broadcasts the
    /// admitted ones.
    pub fn ingest(&self, batches: &[Batch]) -> EventsResponse {
        let mut out = EventsResponse::default();
        let mut views = self.views.lock();
        for batch in batches {
            match self.offer_locked(&mut views, batch) {
                GateOutcome::Applied => out.applied += 1,
                GateOutcome::Duplicate => out.duplicates += 1,
                GateOutcome::Stale => out.stale += 1,
            }
        }
        out
    }

    /// Offers one Kafka record's batch (`None` when it was malformed) to the
    /// gate exactly as `POST /events` would, and advances the position in the
    /// same critical section, so a checkpoint never holds one without the
    /// other. A record at or below the position is not offered again.
    pub fn ingest_record(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        batch: Option<&Batch>,
    ) -> RecordOutcome {
        let mut views = self.views.lock();
        if !views.kafka.is_new(topic, partition, offset) {
            return RecordOutcome::AlreadyConsumed;
        }
        let outcome = match batch {
            Some(batch) => RecordOutcome::Offered(self.offer_locked(&mut views, batch)),
            None => RecordOutcome::Malformed,
        };
        views.kafka.advance(topic, partition, offset);
        outcome
    }

    /// Runs `f` on the Kafka consumer status (a no-op default when the
    /// transport is HTTP).
    pub fn kafka_status<R: Default>(&self, f: impl FnOnce(&mut KafkaStatus) -> R) -> R {
        self.kafka
            .as_ref()
            .map(|k| f(&mut k.status.lock()))
            .unwrap_or_default()
    }

    /// The gate and broadcaster path both transports share.
    fn offer_locked(&self, views: &mut Views, batch: &Batch) -> GateOutcome {
        let m = &self.metrics.metrics;
        let outcome = {
            let verdict = views.gate.offer(
                &batch.instance_id,
                batch.incarnation,
                batch.seq,
                batch.dropped_events,
            );
            match verdict {
                Verdict::Admit { fence, gap } => {
                    if fence {
                        tracing::info!(
                            instance_id = %batch.instance_id,
                            incarnation = batch.incarnation,
                            "new incarnation; fencing L1 state"
                        );
                        m.event_fences.inc();
                        self.fence_locked(views, &batch.instance_id);
                    }
                    if gap {
                        tracing::warn!(instance_id = %batch.instance_id, seq = batch.seq, "event sequence gap");
                        m.event_gaps.inc();
                    }
                    if batch.dropped_events > 0 {
                        tracing::warn!(
                            instance_id = %batch.instance_id,
                            dropped_events = batch.dropped_events,
                            "emitter reports dropped events"
                        );
                        m.event_dropped.inc_by(batch.dropped_events);
                    }
                    self.broadcast(views, batch);
                    GateOutcome::Applied
                }
                Verdict::Duplicate => GateOutcome::Duplicate,
                Verdict::Stale => GateOutcome::Stale,
            }
        };
        inc(&m.event_batches, outcome.as_str());
        outcome
    }

    /// Delivers one admitted batch to every consumer in order; a consumer
    /// that fails is counted and the others still get the batch.
    fn broadcast(&self, views: &mut Views, batch: &Batch) {
        let Views {
            directory,
            usage,
            capacity,
            ..
        } = views;
        self.guard("key_directory", || directory.apply(batch));
        self.guard("cache_usage", || usage.apply(batch));
        self.guard("server_config", || capacity.apply(batch));
        for c in self.controllers.iter().filter(|c| c.consumes_events()) {
            let name = c.name();
            self.guard(name, || {
                if let Err(error) = c.consume(batch, views) {
                    tracing::error!(controller = name, %error, "controller failed to apply a batch");
                    self.count_failure(name);
                }
            });
        }
    }

    fn guard(&self, consumer: &'static str, apply: impl FnOnce()) {
        if catch_unwind(AssertUnwindSafe(apply)).is_err() {
            tracing::error!(consumer, "consumer panicked while applying a batch");
            self.count_failure(consumer);
        }
    }

    fn count_failure(&self, consumer: &'static str) {
        self.metrics
            .metrics
            .consumer_failures
            .get_or_create(&ConsumerLabel { consumer })
            .inc();
    }

    fn fence_locked(&self, views: &mut Views, instance_id: &str) {
        views.directory.fence(instance_id);
        views.usage.fence(instance_id);
        for c in &self.controllers {
            c.fence(instance_id);
        }
    }

    /// Drops an instance's stream: fence, forget the cursor and, for an
    /// explicit deregistration, its capacity declaration.
    pub fn drop_stream(&self, instance_id: &str, forget_capacity: bool) {
        let mut views = self.views.lock();
        self.fence_locked(&mut views, instance_id);
        views.gate.forget(instance_id);
        if forget_capacity {
            views.capacity.forget(instance_id);
        }
    }

    /// One liveness pass: deregisters silent instances and drops their
    /// streams (declarations are kept). Returns the removed ids.
    pub fn sweep_liveness(&self) -> Vec<String> {
        let now = self.clock.monotonic();
        let expired = self
            .registry
            .lock()
            .expire(now, self.settings.instance_timeout);
        for id in &expired {
            tracing::warn!(instance_id = %id, "instance missed its heartbeats; removing it");
            self.drop_stream(id, false);
            self.metrics.metrics.instances_expired.inc();
        }
        expired
    }

    /// Ids currently registered.
    pub fn registered_ids(&self) -> BTreeSet<String> {
        self.registry
            .lock()
            .records()
            .map(|r| r.instance_id.clone())
            .collect()
    }

    // === persistence ===

    /// Captures every section while ingest is paused (the views lock is
    /// held only for the copy).
    pub fn capture_checkpoint(&self) -> Sections {
        let views = self.views.lock();
        let mut sections = Sections {
            stream_cursors: Some(checkpoint::capture_gate(&views.gate)),
            key_directory: Some(checkpoint::capture_directory(&views.directory)),
            cache_usage: Some(checkpoint::capture_usage(&views.usage)),
            server_config: Some(checkpoint::capture_capacity(&views.capacity)),
            lru_order: None,
            kafka_stream_position: self
                .settings
                .kafka
                .as_ref()
                .map(|_| views.kafka.to_section()),
        };
        for c in &self.controllers {
            c.save_checkpoint(&mut sections);
        }
        sections
    }

    /// Writes a checkpoint if a path is configured. Failures are logged and
    /// counted; the next tick retries.
    pub fn write_checkpoint(&self) -> bool {
        let Some(path) = &self.settings.checkpoint_path else {
            return true;
        };
        let sections = self.capture_checkpoint();
        let result = checkpoint::encode(&sections)
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|bytes| persist::write_atomic(path, &bytes));
        match result {
            Ok(()) => {
                let now = self.clock.unix_seconds();
                *self.last_checkpoint.lock() = Some(now);
                self.metrics.metrics.checkpoint_last_success.set(now);
                inc(&self.metrics.metrics.checkpoint_writes, "ok");
                tracing::debug!(path = %path.display(), "checkpoint written");
                true
            }
            Err(error) => {
                inc(&self.metrics.metrics.checkpoint_writes, "failed");
                tracing::warn!(path = %path.display(), %error, "checkpoint write failed; will retry");
                false
            }
        }
    }

    /// Restores views and controller state from the checkpoint; a missing or
    /// unreadable file is a cold start.
    pub fn restore_checkpoint(&self) {
        let Some(path) = &self.settings.checkpoint_path else {
            return;
        };
        let raw = match std::fs::read(path) {
            Ok(raw) => raw,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::info!(path = %path.display(), "no checkpoint; cold start");
                return;
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "checkpoint unreadable; cold start");
                return;
            }
        };
        let sections = match checkpoint::decode(&raw) {
            Ok((sections, skipped)) => {
                for s in skipped {
                    tracing::warn!(path = %path.display(), section = %s.name, reason = %s.reason, "checkpoint section corrupt; that part starts cold");
                }
                sections
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "checkpoint corrupt; cold start");
                return;
            }
        };
        {
            let mut views = self.views.lock();
            if let Some(s) = &sections.stream_cursors {
                views.gate = checkpoint::restore_gate(s);
            }
            if let Some(s) = &sections.key_directory {
                views.directory = checkpoint::restore_directory(s);
            }
            if let Some(s) = &sections.cache_usage {
                views.usage = checkpoint::restore_usage(s);
            }
            if let Some(s) = &sections.server_config {
                views.capacity = checkpoint::restore_capacity(s);
            }
            if let Some(s) = &sections.kafka_stream_position {
                views.kafka = Position::from_section(s);
            }
        }
        for c in &self.controllers {
            c.restore_checkpoint(&sections);
        }
        let keys = self.views.lock().directory.len();
        tracing::info!(path = %path.display(), keys, "checkpoint restored");
    }

    /// Rewrites the metadata file from the controllers' operator intent. A
    /// failed write is logged and counted; the request still succeeds.
    pub fn save_metadata(&self) {
        let Some(path) = &self.settings.metadata_path else {
            return;
        };
        let _order = self.metadata_lock.lock();
        let mut meta = Metadata::default();
        for c in &self.controllers {
            c.save_metadata(&mut meta);
        }
        let bytes = metadata::encode(&meta, self.clock.unix_seconds());
        match persist::write_atomic(path, &bytes) {
            Ok(()) => inc(&self.metrics.metrics.metadata_writes, "ok"),
            Err(error) => {
                inc(&self.metrics.metrics.metadata_writes, "failed");
                tracing::warn!(path = %path.display(), %error, "metadata write failed");
            }
        }
    }

    /// Loads the metadata file; an invalid one is ignored with a warning.
    pub fn restore_metadata(&self) {
        let Some(path) = &self.settings.metadata_path else {
            return;
        };
        let raw = match std::fs::read(path) {
            Ok(raw) => raw,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "metadata unreadable; ignoring it");
                return;
            }
        };
        match metadata::decode(&raw) {
            Ok(meta) => {
                for c in &self.controllers {
                    c.restore_metadata(&meta);
                }
                tracing::info!(path = %path.display(), pins = meta.pins.len(), quotas = meta.quotas.limits.len(), "metadata restored");
            }
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "metadata invalid; ignoring it")
            }
        }
    }

    /// Counts a call to an MP server.
    pub fn count_mp(&self, op: &'static str, ok: bool) {
        self.metrics
            .metrics
            .mp_calls
            .get_or_create(&crate::metrics::MpCallLabels {
                op,
                outcome: if ok { "ok" } else { "failed" },
            })
            .inc();
    }

    /// Marks a loop pass.
    pub fn loop_pass(&self, name: &'static str) {
        self.loop_passes
            .lock()
            .insert(name, self.clock.unix_seconds());
        self.metrics
            .metrics
            .loop_last_pass
            .get_or_create(&crate::metrics::LoopLabel { r#loop: name })
            .set(self.clock.unix_seconds());
    }
}
