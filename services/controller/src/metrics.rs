//! The controller's Prometheus metrics, registered once. Labels come from
//! fixed sets (controller names, results, error reasons) except `backend`,
//! which is a CacheBackend's `namespace/name` — bounded by the objects an
//! operator creates, never by traffic.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use parking_lot::Mutex;

use ic_telemetry::MetricsRegistry;

/// `{controller}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    /// `cachebackend`, `enginepod`, `cacheindex`, `cachepolicy`, `cachetenant`.
    pub controller: &'static str,
}

/// `{controller, result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// Which loop.
    pub controller: &'static str,
    /// `success` or `error`.
    pub result: &'static str,
}

/// `{controller, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Which loop.
    pub controller: &'static str,
    /// A fixed error class (`kube_api`, `remote`, `decode`, ...).
    pub reason: &'static str,
}

/// `{kind}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// A watched kind (`Pod`, `CacheBackend`, ...).
    pub kind: &'static str,
}

/// `{state}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// A fixed state name.
    pub state: &'static str,
}

/// `{backend}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendLabel {
    /// `namespace/name` of the CacheBackend.
    pub backend: String,
}

/// `{backend, reason}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BackendReasonLabels {
    /// `namespace/name` of the CacheBackend.
    pub backend: String,
    /// The Degraded condition's reason (`NoKVEventsObserved`, ...).
    pub reason: String,
}

/// Every metric the controller exports.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Reconciles / sync passes by result.
    pub reconciles: Family<ResultLabels, Counter>,
    /// Errors by reason.
    pub errors: Family<ReasonLabels, Counter>,
    /// Duration of one reconcile / sync pass.
    pub reconcile_duration: Family<ControllerLabel, Histogram>,
    /// Objects waiting for their next reconcile (scheduled requeues and
    /// objects being processed).
    pub queue_depth: Family<ControllerLabel, Gauge>,
    /// Query-weighted tier-2 hit rate per backend (from /snapshot).
    pub backend_t2_hit_rate: Family<BackendLabel, Gauge<f64, AtomicU64>>,
    /// 1 per CacheBackend whose Degraded condition is True, labelled with its
    /// reason (CR status is not scraped; alerts need a series).
    pub backend_degraded: Family<BackendReasonLabels, Gauge>,
    /// The reason each backend is exported with, so a changed or cleared
    /// reason removes the old series.
    degraded_reasons: Arc<Mutex<HashMap<String, String>>>,
    /// 1 while this instance holds the leader lease.
    pub leader: Gauge,
    /// Scrapes of /snapshot by result.
    pub snapshot_scrapes: Family<ResultLabels, Counter>,
    /// Objects held in the watch-fed stores, by kind.
    pub watched_objects: Family<KindLabel, Gauge>,
    /// Index servers the CachePolicy pusher pushes to: `current` (they
    /// accepted the current policies) or `behind`.
    pub policy_index_servers: Family<StateLabel, Gauge>,
}

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Metrics {
    /// Registers every metric in `registry`.
    pub fn register(registry: &MetricsRegistry) -> Self {
        let metrics = Self {
            reconciles: Family::default(),
            errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(duration_histogram),
            queue_depth: Family::default(),
            backend_t2_hit_rate: Family::default(),
            backend_degraded: Family::default(),
            degraded_reasons: Arc::default(),
            leader: Gauge::default(),
            snapshot_scrapes: Family::default(),
            watched_objects: Family::default(),
            policy_index_servers: Family::default(),
        };
        registry.register_with(|r| {
            r.register(
                "controller_reconciles",
                "Reconciles and sync passes, by controller and result",
                metrics.reconciles.clone(),
            );
            r.register(
                "controller_errors",
                "Reconcile and sync errors, by controller and reason",
                metrics.errors.clone(),
            );
            r.register(
                "controller_reconcile_duration_seconds",
                "Duration of one reconcile or sync pass",
                metrics.reconcile_duration.clone(),
            );
            r.register(
                "controller_queue_depth",
                "Objects queued for reconcile (scheduled requeues plus in flight)",
                metrics.queue_depth.clone(),
            );
            r.register(
                "backend_t2_hit_rate",
                "Query-weighted tier-2 reload hit rate per CacheBackend, in [0,1]; absent until tier 2 is queried",
                metrics.backend_t2_hit_rate.clone(),
            );
            r.register(
                "backend_degraded",
                "1 per CacheBackend whose Degraded condition is True, by its reason; absent otherwise",
                metrics.backend_degraded.clone(),
            );
            r.register(
                "controller_leader",
                "1 while this controller instance holds the leader lease",
                metrics.leader.clone(),
            );
            r.register(
                "controller_snapshot_scrapes",
                "Scrapes of the index server's /snapshot, by result",
                metrics.snapshot_scrapes.clone(),
            );
            r.register(
                "controller_watched_objects",
                "Objects held in the controller's watch-fed stores, by kind",
                metrics.watched_objects.clone(),
            );
            r.register(
                "controller_policy_index_servers",
                "Index servers the CachePolicy pusher pushes to, by state: current (holding the current policies) or behind",
                metrics.policy_index_servers.clone(),
            );
        });
        metrics
    }

    /// Counts one pass of `controller` that took `seconds`.
    pub fn observe(&self, controller: &'static str, ok: bool, seconds: f64) {
        self.reconciles
            .get_or_create(&ResultLabels {
                controller,
                result: if ok { "success" } else { "error" },
            })
            .inc();
        self.reconcile_duration
            .get_or_create(&ControllerLabel { controller })
            .observe(seconds);
    }

    /// Counts one pass of `controller` that started at `started` and ended
    /// with `result`, and its error reason if it failed.
    pub fn pass<T, E>(
        &self,
        controller: &'static str,
        started: std::time::Instant,
        result: &Result<T, E>,
        reason: impl FnOnce(&E) -> &'static str,
    ) {
        self.observe(controller, result.is_ok(), started.elapsed().as_secs_f64());
        if let Err(e) = result {
            self.error(controller, reason(e));
        }
    }

    /// Exports `backend`'s Degraded condition: `Some(reason)` while it is
    /// True, `None` when it is False, absent or the backend is gone.
    pub fn set_backend_degraded(&self, backend: &str, degraded: Option<&str>) {
        let mut reasons = self.degraded_reasons.lock();
        let previous = reasons.get(backend).map(String::as_str);
        if previous == degraded {
            return;
        }
        if let Some(old) = previous {
            self.backend_degraded.remove(&BackendReasonLabels {
                backend: backend.to_owned(),
                reason: old.to_owned(),
            });
        }
        match degraded {
            Some(reason) => {
                self.backend_degraded
                    .get_or_create(&BackendReasonLabels {
                        backend: backend.to_owned(),
                        reason: reason.to_owned(),
                    })
                    .set(1);
                reasons.insert(backend.to_owned(), reason.to_owned());
            }
            None => {
                reasons.remove(backend);
            }
        }
    }

    /// Drops the Degraded series of every backend not in `live`.
    pub fn retain_degraded_backends(&self, live: &std::collections::BTreeSet<String>) {
        let gone: Vec<String> = self
            .degraded_reasons
            .lock()
            .keys()
            .filter(|b| !live.contains(*b))
            .cloned()
            .collect();
        for backend in gone {
            self.set_backend_degraded(&backend, None);
        }
    }

    /// Counts one error of `controller`.
    pub fn error(&self, controller: &'static str, reason: &'static str) {
        self.errors
            .get_or_create(&ReasonLabels { controller, reason })
            .inc();
    }
}
