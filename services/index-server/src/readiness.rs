//! When a replica may take gateway traffic.
//!
//! A replica that has just started holds an empty index: picks made from
//! it are blind. It is ready only once
//! * the warm-up is over (`--ready-warmup-seconds`): by then every live
//!   subscriber has found it (they resolve the headless Service every few
//!   seconds and reconnect with at most 5 s of backoff) and begun its resync;
//! * until it has first been ready, no ingest stream is in the middle of
//!   a resync it began less than `--ready-resync-wait-seconds` ago (the
//!   replica is still filling in what some engine holds). Once ready, a
//!   resync no longer takes it out of the Service: it only adds to what
//!   the replica answers from (a resync is swapped in at its end), and
//!   every subscriber resyncs every replica at once, so holding readiness
//!   back then would take every replica away together, and a stream that
//!   never ended its resync would keep the replica out for good;
//! * every gate another part registered is open (the Kafka consumer's:
//!   its lag is small);
//! * when the controller pushes policies (`--ready-policies-seconds`), the
//!   first push has arrived, or that many seconds have passed (a replica
//!   whose controller is down still serves, with default policies, rather
//!   than never);
//! * and it is not draining (SIGTERM: [`ic_telemetry::drain`]).
//!
//! `/ready` (the kubelet's probe, so the Service's endpoints) and the
//! grpc.health.v1 status of the gRPC and endpoint-picker ports follow it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ic_telemetry::Health;
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use tokio_util::sync::CancellationToken;

/// How often readiness is evaluated.
const EVERY: Duration = Duration::from_millis(200);

/// The replica's readiness conditions.
#[derive(Debug)]
pub struct Readiness {
    started: Instant,
    warmup: Duration,
    /// Resyncs under way (until the replica was first ready).
    resyncs: Mutex<Vec<Resync>>,
    next_resync: AtomicUsize,
    /// How long readiness waits for one resync.
    resync_wait: Mutex<Duration>,
    /// Resyncs readiness stopped waiting for.
    resyncs_not_waited_for: Mutex<Counter>,
    /// Set once the replica was ready: resyncs no longer hold it back.
    filled: AtomicBool,
    gates: Mutex<Vec<(&'static str, Arc<AtomicBool>)>>,
    /// How long readiness waits for the first policy push (zero: not at
    /// all).
    policies_bound: Mutex<Duration>,
    policies_pushed: AtomicBool,
}

/// One named condition; closed until set.
#[derive(Clone, Debug)]
pub struct Gate(Arc<AtomicBool>);

impl Gate {
    /// Opens (`true`) or closes the gate.
    pub fn set(&self, ok: bool) {
        self.0.store(ok, Ordering::Release);
    }
}

/// Why a replica is not ready, for the log and `/ready`'s callers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotReady {
    /// The warm-up is not over.
    WarmingUp,
    /// This many ingest streams are in the middle of a resync.
    Resyncing(usize),
    /// This gate is closed.
    Gate(&'static str),
}

/// A resync readiness waits for.
#[derive(Debug)]
struct Resync {
    id: usize,
    began: Instant,
    /// Past the wait: counted once, no longer waited for.
    given_up: bool,
}

/// Default of `--ready-resync-wait-seconds`.
pub const DEFAULT_RESYNC_WAIT: Duration = Duration::from_secs(60);

impl Readiness {
    /// Conditions for a replica started now with this warm-up.
    pub fn new(warmup: Duration) -> Arc<Self> {
        Arc::new(Self {
            started: Instant::now(),
            warmup,
            resyncs: Mutex::new(Vec::new()),
            next_resync: AtomicUsize::new(0),
            resync_wait: Mutex::new(DEFAULT_RESYNC_WAIT),
            resyncs_not_waited_for: Mutex::new(Counter::default()),
            filled: AtomicBool::new(false),
            gates: Mutex::new(Vec::new()),
            policies_bound: Mutex::new(Duration::ZERO),
            policies_pushed: AtomicBool::new(false),
        })
    }

    /// Not ready (gate `policies`) until the first policy push, for at
    /// most `bound` after start.
    pub fn wait_for_policies(&self, bound: Duration) {
        *self.policies_bound.lock() = bound;
    }

    /// The controller pushed policies (SetPolicies).
    pub fn policies_pushed(&self) {
        self.policies_pushed.store(true, Ordering::Release);
    }

    /// Whether readiness gave up waiting for a policy push.
    fn policies_given_up(&self) -> bool {
        let bound = *self.policies_bound.lock();
        !bound.is_zero()
            && !self.policies_pushed.load(Ordering::Acquire)
            && self.started.elapsed() >= bound
    }

    /// Registers a condition, closed until its [`Gate::set`] opens it.
    pub fn gate(&self, name: &'static str) -> Gate {
        let flag = Arc::new(AtomicBool::new(false));
        self.gates.lock().push((name, flag.clone()));
        Gate(flag)
    }

    /// Waits at most `bound` for any one resync (from its first batch),
    /// counting those it stops waiting for in `given_up`.
    pub fn wait_for_resyncs(&self, bound: Duration, given_up: Counter) {
        *self.resync_wait.lock() = bound;
        *self.resyncs_not_waited_for.lock() = given_up;
    }

    /// Marks a resync under way until the returned guard drops (waited
    /// for only until the replica is first ready).
    pub fn resync_begun(self: &Arc<Self>) -> ResyncUnderWay {
        let id = self.next_resync.fetch_add(1, Ordering::Relaxed);
        if !self.filled.load(Ordering::Acquire) {
            self.resyncs.lock().push(Resync {
                id,
                began: Instant::now(),
                given_up: false,
            });
        }
        ResyncUnderWay(self.clone(), id)
    }

    /// Resyncs under way that readiness still waits for.
    fn resyncs_waited_for(&self) -> usize {
        let wait = *self.resync_wait.lock();
        let mut resyncs = self.resyncs.lock();
        let mut waited = 0;
        for r in resyncs.iter_mut() {
            if r.began.elapsed() < wait {
                waited += 1;
            } else if !r.given_up {
                r.given_up = true;
                self.resyncs_not_waited_for.lock().inc();
                tracing::warn!(
                    after_seconds = r.began.elapsed().as_secs_f64(),
                    "a resync has not ended within --ready-resync-wait-seconds: \
                     readiness no longer waits for it"
                );
            }
        }
        waited
    }

    /// `Ok` when the replica may take traffic (drain aside).
    pub fn check(&self) -> Result<(), NotReady> {
        if self.started.elapsed() < self.warmup {
            return Err(NotReady::WarmingUp);
        }
        if !self.filled.load(Ordering::Acquire) {
            match self.resyncs_waited_for() {
                0 => {}
                n => return Err(NotReady::Resyncing(n)),
            }
        }
        if let Some((name, _)) = self
            .gates
            .lock()
            .iter()
            .find(|(_, ok)| !ok.load(Ordering::Acquire))
        {
            return Err(NotReady::Gate(name));
        }
        let bound = *self.policies_bound.lock();
        if !self.policies_pushed.load(Ordering::Acquire) && self.started.elapsed() < bound {
            return Err(NotReady::Gate("policies"));
        }
        if !self.filled.swap(true, Ordering::AcqRel) {
            self.resyncs.lock().clear();
        }
        Ok(())
    }
}

/// A resync some stream began; dropping it (the resync ended, or the
/// stream did) no longer holds readiness back.
#[derive(Debug)]
pub struct ResyncUnderWay(Arc<Readiness>, usize);

impl Drop for ResyncUnderWay {
    fn drop(&mut self) {
        self.0.resyncs.lock().retain(|r| r.id != self.1);
    }
}

/// The grpc.health.v1 services whose status follows readiness.
#[derive(Clone)]
pub struct HealthReporters {
    /// Reporter and service names.
    pub reporters: Vec<(tonic_health::server::HealthReporter, Vec<&'static str>)>,
}

impl std::fmt::Debug for HealthReporters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.reporters.iter().map(|(_, names)| names))
            .finish()
    }
}

/// Keeps `/ready` and the gRPC health statuses equal to
/// [`Readiness::check`] (and not ready once draining) until `stop`.
pub async fn publish(
    readiness: Arc<Readiness>,
    health: Arc<Health>,
    grpc: HealthReporters,
    stop: CancellationToken,
) {
    let mut last: Option<Result<(), NotReady>> = None;
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        let now = if health.is_draining() {
            Err(NotReady::Gate("draining"))
        } else {
            readiness.check()
        };
        if last.as_ref() == Some(&now) {
            continue;
        }
        match &now {
            Ok(()) if readiness.policies_given_up() => tracing::warn!(
                after_seconds = readiness.started.elapsed().as_secs_f64(),
                "ready without a policy push within --ready-policies-seconds: \
                 taking traffic with default policies"
            ),
            Ok(()) => tracing::info!(
                after_seconds = readiness.started.elapsed().as_secs_f64(),
                "ready: taking traffic"
            ),
            Err(why) => tracing::info!(reason = ?why, "not ready"),
        }
        health.set_ready(now.is_ok());
        let status = if now.is_ok() {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        for (reporter, names) in &grpc.reporters {
            for name in names {
                reporter.set_service_status(*name, status).await;
            }
        }
        last = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_after_the_warm_up_with_no_resync_under_way_and_every_gate_open() {
        let readiness = Readiness::new(Duration::ZERO);
        let one = readiness.resync_begun();
        let two = readiness.resync_begun();
        assert_eq!(readiness.check(), Err(NotReady::Resyncing(2)));
        drop(one);
        assert_eq!(readiness.check(), Err(NotReady::Resyncing(1)));
        drop(two);
        assert_eq!(readiness.check(), Ok(()));
        // Once ready, a resync adds to what it answers from: it stays in.
        let later = readiness.resync_begun();
        assert_eq!(readiness.check(), Ok(()));
        drop(later);
        let kafka = readiness.gate("kafka");
        assert_eq!(readiness.check(), Err(NotReady::Gate("kafka")));
        kafka.set(true);
        assert_eq!(readiness.check(), Ok(()));
        kafka.set(false);
        assert_eq!(readiness.check(), Err(NotReady::Gate("kafka")));
    }

    #[test]
    fn waits_for_the_first_policy_push_within_its_bound() {
        let readiness = Readiness::new(Duration::ZERO);
        readiness.wait_for_policies(Duration::from_secs(3600));
        assert_eq!(readiness.check(), Err(NotReady::Gate("policies")));
        readiness.policies_pushed();
        assert_eq!(readiness.check(), Ok(()));
        assert!(!readiness.policies_given_up());

        // No controller: ready once the bound has passed.
        let alone = Readiness::new(Duration::ZERO);
        alone.wait_for_policies(Duration::from_nanos(1));
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(alone.check(), Ok(()));
        assert!(alone.policies_given_up());
    }

    #[test]
    fn a_resync_that_does_not_end_is_waited_for_only_within_its_bound() {
        let readiness = Readiness::new(Duration::ZERO);
        let given_up = Counter::default();
        readiness.wait_for_resyncs(Duration::from_millis(50), given_up.clone());
        let endless = readiness.resync_begun();
        assert_eq!(readiness.check(), Err(NotReady::Resyncing(1)));
        std::thread::sleep(Duration::from_millis(60));
        let fresh = readiness.resync_begun();
        assert_eq!(readiness.check(), Err(NotReady::Resyncing(1)));
        assert_eq!(given_up.get(), 1);
        drop(fresh);
        assert_eq!(readiness.check(), Ok(()));
        assert_eq!(given_up.get(), 1, "counted once");
        drop(endless);
    }

    #[test]
    fn not_ready_while_warming_up() {
        let readiness = Readiness::new(Duration::from_secs(3600));
        assert_eq!(readiness.check(), Err(NotReady::WarmingUp));
    }
}
