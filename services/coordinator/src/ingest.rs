//! The ingest handle: offers batches to the gate in order and broadcasts the
//! admitted ones to the views and to every consuming controller. Both
//! transports (`POST /events`, Kafka) go through here.
//!
//! `POST /events` applies one request at a time, in arrival order
//! ([`Ingest::submit`]): every request joins a bounded queue that one
//! writer thread drains (never applied on a runtime worker: see
//! `Writer`). Each is answered as soon as its own batches are applied, and no request waits
//! for a lock handed around between eight writers (which is what made
//! `/events` p99 grow with concurrency). The
//! views lock is taken once per batch (`ViewStore::change`), so a lookup
//! waits for at most one batch's apply and never for a checkpoint's capture
//! (docs/coordinator.md). A deregistration goes through the same queue,
//! behind the events already queued.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use ic_coordinator_core::capacity::ClaimError;
use ic_coordinator_core::events::{Batch, EventType, EventsResponse};
use ic_coordinator_core::gate::Verdict;
use tokio::sync::oneshot;

use crate::controller::Controller;
use crate::metrics::{ConsumerLabel, MetricsSet, inc};
use crate::views::{ViewStore, Views};

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

/// The write path into the views.
#[derive(Debug)]
pub struct Ingest {
    apply: Applier,
    /// Batches received and not yet applied (the `event_bus` gauges).
    pub queue: Arc<EventQueue>,
    /// The writer's queue (the thread starts with the coordinator).
    writer: Arc<Writer>,
    /// Its bound, `--max-pending-event-requests`.
    max_pending: usize,
}

/// What applies batches: the views and the consuming controllers.
#[derive(Clone, Debug)]
struct Applier {
    views: Arc<ViewStore>,
    controllers: Arc<[Arc<dyn Controller>]>,
    metrics: Arc<MetricsSet>,
}

/// The requests waiting for the writer thread, which applies one job at a
/// time in arrival order (the order requests take the state lock).
///
/// A request never applies on its own thread, even with the writer idle:
/// that blocks a runtime worker for the apply (or for as long as the
/// views are held), and a task parked in that worker's LIFO slot cannot be
/// stolen meanwhile — `events_queue_for_one_writer_and_are_refused_when_full`
/// hung that way. Measured before it was taken out: `/events` p50 at one
/// in flight 0.25–0.33 ms with it (`git show 81cafa9c:docs/benchmarks.md`,
/// "Request path, 2026-12-05 16:00–17:15").
#[derive(Default)]
struct Writer {
    state: parking_lot::Mutex<WriterState>,
    work: parking_lot::Condvar,
}

#[derive(Default)]
struct WriterState {
    /// A job is being applied (by the writer thread or a request).
    busy: bool,
    jobs: std::collections::VecDeque<Job>,
    /// The ingest handle is gone: the thread ends once the queue drains.
    closed: bool,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock();
        f.debug_struct("Writer")
            .field("busy", &st.busy)
            .field("queued", &st.jobs.len())
            .finish()
    }
}

/// Ends a turn at applying (also when the apply unwinds): the next queued
/// job goes to the writer thread.
struct Turn<'a>(&'a Writer);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        st.busy = false;
        if !st.jobs.is_empty() {
            self.0.work.notify_one();
        }
    }
}

impl Writer {
    /// Queues `job` for the writer thread (refused past `bound`, if one
    /// is given).
    fn offer(&self, job: Job, bound: Option<usize>) -> Result<(), Job> {
        let mut st = self.state.lock();
        if bound.is_some_and(|b| st.jobs.len() >= b) {
            return Err(job);
        }
        st.jobs.push_back(job);
        self.work.notify_one();
        Ok(())
    }

    /// The writer thread: applies queued jobs in order, each in its turn.
    fn run(&self, apply: &Applier) {
        loop {
            let job = {
                let mut st = self.state.lock();
                loop {
                    if !st.busy
                        && let Some(job) = st.jobs.pop_front()
                    {
                        st.busy = true;
                        break job;
                    }
                    if st.closed && st.jobs.is_empty() {
                        return;
                    }
                    self.work.wait(&mut st);
                }
            };
            let _turn = Turn(self);
            apply.run(job);
        }
    }
}

/// What the writer thread runs, in arrival order.
enum Job {
    /// One `POST /events` request.
    Events(EventsJob),
    /// An instance's stream dropped (deregistration, liveness): after the
    /// events queued before it, so none of them applies without a cursor
    /// and brings its placements back.
    DropStream {
        instance_id: String,
        forget_capacity: bool,
        done: oneshot::Sender<()>,
    },
}

/// One `POST /events` request's batches, waiting for the writer.
struct EventsJob {
    batches: Vec<Batch>,
    max_entry_bytes: Option<u64>,
    /// Leaves the queue gauges once applied.
    queued: Queued,
    reply: oneshot::Sender<Result<EventsResponse, Refused>>,
}

/// A request the writer refused without applying any of it: an entry
/// claims more than the bound or its instance's declared capacity.
#[derive(Debug)]
pub struct Refused {
    /// Index of the batch in the request.
    pub batch: usize,
    /// Its instance.
    pub instance_id: String,
    /// What the entry claimed.
    pub error: ClaimError,
}

/// Why [`Ingest::submit`] has no answer.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// An entry's claim was refused; nothing was applied.
    #[error("batch {}: {}", .0.batch, .0.error)]
    Refused(Refused),
    /// The writer failed while applying the request (a bug: logged).
    #[error("the event writer failed while applying the request")]
    WriterFailed,
    /// `--max-pending-event-requests` requests already wait; nothing was
    /// queued.
    #[error(
        "the event queue is full: {0} requests already wait for the writer (--max-pending-event-requests); retry later"
    )]
    QueueFull(usize),
}

/// Event batches that arrived and wait for the views lock: what the
/// reference's event-bus queue-depth and drain-lag gauges describe.
#[derive(Debug, Default)]
pub struct EventQueue {
    inner: parking_lot::Mutex<QueueInner>,
}

#[derive(Debug, Default)]
struct QueueInner {
    next: u64,
    depth: usize,
    waiting: std::collections::BTreeMap<u64, (std::time::Instant, usize)>,
}

/// A request's place in the [`EventQueue`]; leaves it when dropped.
#[derive(Debug)]
pub struct Queued {
    queue: Arc<EventQueue>,
    id: u64,
}

impl EventQueue {
    /// Enters `batches` batches.
    pub fn enter(self: &Arc<Self>, batches: usize) -> Queued {
        let mut q = self.inner.lock();
        let id = q.next;
        q.next += 1;
        q.depth += batches;
        q.waiting.insert(id, (std::time::Instant::now(), batches));
        Queued {
            queue: self.clone(),
            id,
        }
    }

    /// Batches waiting, and seconds the oldest has waited.
    pub fn snapshot(&self) -> (usize, f64) {
        let q = self.inner.lock();
        let lag = q
            .waiting
            .values()
            .next()
            .map_or(0.0, |(t, _)| t.elapsed().as_secs_f64());
        (q.depth, lag)
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        let mut q = self.queue.inner.lock();
        if let Some((_, n)) = q.waiting.remove(&self.id) {
            q.depth -= n;
        }
    }
}

impl Ingest {
    /// Writes into `views` and feeds `controllers`.
    /// Also starts the writer thread: a coordinator that cannot is an error
    /// at start-up, not a 500 on every request.
    pub fn new(
        views: Arc<ViewStore>,
        controllers: Arc<[Arc<dyn Controller>]>,
        metrics: Arc<MetricsSet>,
        max_pending: usize,
    ) -> std::io::Result<Self> {
        let apply = Applier {
            views,
            controllers,
            metrics,
        };
        let max_pending = max_pending.max(1);
        let writer = Arc::new(Writer::default());
        let (run, thread_writer) = (apply.clone(), writer.clone());
        // The thread ends when this handle is dropped (and its queue drained).
        std::thread::Builder::new()
            .name("event-writer".to_owned())
            .spawn(move || thread_writer.run(&run))?;
        Ok(Self {
            apply,
            queue: Arc::default(),
            writer,
            max_pending,
        })
    }

    /// Applies one request's validated batches — on the caller's thread
    /// when the writer is idle, else queued for the writer thread — and
    /// waits until they are applied. At most `--max-pending-event-requests`
    /// requests wait; one that finds the queue full is refused at once
    /// ([`SubmitError::QueueFull`], counted in
    /// `lmcache_coordinator_events_queue_full_total`). The writer checks
    /// every entry's claim first (`max_entry_bytes`, the declared
    /// capacity): a refusal applies nothing.
    pub async fn submit(
        &self,
        batches: Vec<Batch>,
        max_entry_bytes: Option<u64>,
    ) -> Result<EventsResponse, SubmitError> {
        let (reply, answer) = oneshot::channel();
        let job = Job::Events(EventsJob {
            queued: self.queue.enter(batches.len()),
            batches,
            max_entry_bytes,
            reply,
        });
        match self.writer.offer(job, Some(self.max_pending)) {
            Ok(()) => {}
            Err(_) => {
                self.apply.metrics.metrics.event_queue_full.inc();
                return Err(SubmitError::QueueFull(self.max_pending));
            }
        }
        match answer.await {
            Ok(Ok(resp)) => Ok(resp),
            Ok(Err(refused)) => Err(SubmitError::Refused(refused)),
            Err(_) => Err(SubmitError::WriterFailed),
        }
    }

    /// Offers validated batches to the gate in order and broadcasts the
    /// admitted ones, on the caller's thread.
    pub fn ingest(&self, batches: &[Batch]) -> EventsResponse {
        self.apply.ingest(batches)
    }

    /// See [`Applier::ingest_record`].
    pub fn ingest_record(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        batch: Option<&Batch>,
    ) -> RecordOutcome {
        self.apply.ingest_record(topic, partition, offset, batch)
    }

    /// The writer's own state: a job being applied, and the jobs queued
    /// behind it. Tests wait on this, not on [`EventQueue`]: a request is
    /// counted there before it takes its place here, so a later request can
    /// overtake it between the two.
    #[doc(hidden)]
    pub fn writer_state(&self) -> (bool, usize) {
        let st = self.writer.state.lock();
        (st.busy, st.jobs.len())
    }

    /// Drops an instance's stream: fence, forget the cursor and, for an
    /// explicit deregistration, its capacity declaration. Queued behind the
    /// `POST /events` requests already waiting (past the bound rather than
    /// refused: there is one per instance at most), and done when this
    /// returns.
    pub async fn drop_stream(&self, instance_id: &str, forget_capacity: bool) {
        let (done, finished) = oneshot::channel();
        let job = Job::DropStream {
            instance_id: instance_id.to_owned(),
            forget_capacity,
            done,
        };
        let _ = self.writer.offer(job, None);
        if finished.await.is_err() {
            // The writer is gone (a bug, logged where it failed): drop the
            // stream here rather than keep it.
            self.apply.drop_stream(instance_id, forget_capacity);
        }
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        self.writer.state.lock().closed = true;
        self.writer.work.notify_all();
    }
}

// === impl Applier ===

impl Applier {
    /// One queued request: claims checked, then applied, under one hold of
    /// the views lock; the answer is sent at once.
    fn run(&self, job: Job) {
        let job = match job {
            Job::Events(job) => job,
            Job::DropStream {
                instance_id,
                forget_capacity,
                done,
            } => {
                let dropped = catch_unwind(AssertUnwindSafe(|| {
                    self.drop_stream(&instance_id, forget_capacity);
                }));
                if dropped.is_err() {
                    tracing::error!(%instance_id, "the event writer panicked while dropping a stream");
                }
                let _ = done.send(());
                return;
            }
        };
        let EventsJob {
            batches,
            max_entry_bytes,
            queued,
            reply,
        } = job;
        // One change, one step (views lock hold) per batch: a lookup waits
        // for at most one batch's apply, a checkpoint sees whole requests.
        let applied = catch_unwind(AssertUnwindSafe(|| {
            self.views.change(|change| {
                let refused = change.read(|views| {
                    // A request declaring capacity before it stores is
                    // checked as it will apply, each batch against the
                    // declarations the batches before it leave (declaring
                    // is rare: the copy is made only then).
                    let mut declared = batches
                        .iter()
                        .any(|b| b.event_type == EventType::Config)
                        .then(|| views.capacity.clone());
                    batches.iter().enumerate().find_map(|(i, b)| {
                        let capacity = declared.as_ref().unwrap_or(&views.capacity);
                        let refused = capacity.check_claims(b, max_entry_bytes).err();
                        if let Some(declared) = declared.as_mut() {
                            declared.apply(b);
                        }
                        refused.map(|error| Refused {
                            batch: i,
                            instance_id: b.instance_id.clone(),
                            error,
                        })
                    })
                });
                if let Some(r) = refused {
                    return Err(r);
                }
                let mut out = EventsResponse::default();
                for batch in &batches {
                    match change.step(|views| self.offer(views, batch)) {
                        GateOutcome::Applied => out.applied += 1,
                        GateOutcome::Duplicate => out.duplicates += 1,
                        GateOutcome::Stale => out.stale += 1,
                    }
                }
                Ok(out)
            })
        }));
        drop(queued);
        match applied {
            // The requester may have gone (client closed): nothing to do.
            Ok(answer) => {
                let _ = reply.send(answer);
            }
            Err(_) => {
                tracing::error!(
                    batches = batches.len(),
                    "the event writer panicked while applying a request"
                );
                // Dropping `reply` answers the request with a 500.
            }
        }
    }

    fn apply_all(&self, views: &mut Views, batches: &[Batch]) -> EventsResponse {
        let mut out = EventsResponse::default();
        for batch in batches {
            match self.offer(views, batch) {
                GateOutcome::Applied => out.applied += 1,
                GateOutcome::Duplicate => out.duplicates += 1,
                GateOutcome::Stale => out.stale += 1,
            }
        }
        out
    }

    fn ingest(&self, batches: &[Batch]) -> EventsResponse {
        self.views.write(|views| self.apply_all(views, batches))
    }

    /// Offers one Kafka record's batch (`None` when it was malformed) to the
    /// gate exactly as `POST /events` would, and advances the position in the
    /// same critical section, so a checkpoint never holds one without the
    /// other. A record at or below the position is not offered again.
    fn ingest_record(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        batch: Option<&Batch>,
    ) -> RecordOutcome {
        self.views.write(|views| {
            if !views.kafka.is_new(topic, partition, offset) {
                return RecordOutcome::AlreadyConsumed;
            }
            let outcome = match batch {
                Some(batch) => RecordOutcome::Offered(self.offer(views, batch)),
                None => RecordOutcome::Malformed,
            };
            views.kafka.advance(topic, partition, offset);
            outcome
        })
    }

    fn drop_stream(&self, instance_id: &str, forget_capacity: bool) {
        self.views.write(|views| {
            self.fence(views, instance_id);
            views.gate.forget(instance_id);
            if forget_capacity {
                views.capacity.forget(instance_id);
            }
        });
    }

    /// The gate and broadcaster path both transports share.
    fn offer(&self, views: &mut Views, batch: &Batch) -> GateOutcome {
        let m = &self.metrics.metrics;
        let verdict = views.gate.offer(
            &batch.instance_id,
            batch.incarnation,
            batch.seq,
            batch.dropped_events,
        );
        let outcome = match verdict {
            Verdict::Admit { fence, gap } => {
                if fence {
                    tracing::info!(
                        instance_id = %batch.instance_id,
                        incarnation = batch.incarnation,
                        "new incarnation; fencing L1 state"
                    );
                    m.event_fences.inc();
                    self.fence(views, &batch.instance_id);
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
        let mut old_sizes = Vec::new();
        self.guard("key_directory", || old_sizes = directory.apply(batch));
        self.guard("cache_usage", || usage.apply(batch, &old_sizes));
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
        self.forget_dropped(views);
    }

    /// Drops the keys the directory let go for its bound from every other
    /// view (usage, each controller's state).
    pub(crate) fn forget_dropped(&self, views: &mut Views) {
        let dropped = views.directory.take_dropped();
        if dropped.is_empty() {
            return;
        }
        for (key, placements) in &dropped {
            views.usage.forget(key, placements);
        }
        // A key stored again since it was dropped stays in the LRU.
        let keys: Vec<_> = dropped
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| !views.directory.contains(k))
            .collect();
        for c in self.controllers.iter() {
            let name = c.name();
            self.guard(name, || c.forget(&keys));
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

    fn fence(&self, views: &mut Views, instance_id: &str) {
        // Usage first: it reads the bytes of the placements the fence drops.
        views.usage.fence(instance_id, &views.directory);
        views.directory.fence(instance_id);
        for c in self.controllers.iter() {
            c.fence(instance_id);
        }
    }
}
