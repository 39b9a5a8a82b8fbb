//! The CacheBackend reconcile decision: from everything the reconciler
//! observed, the status to write, the Events to record, whether to call the
//! functional probe, which engine Deployments to cascade-restart, and when
//! to come back.
//!
//! Calling pattern for the service, once per reconcile:
//! 1. gather an [`Observed`] (probe outcome `None`; `next_allowed_at` from the
//!    probe limiter) and call [`decide`];
//! 2. if [`Decision::probe_wanted`] and the limiter grants a slot, call
//!    `/probe`, put the outcome (and the limiter's new `next_allowed_at`) into
//!    the observation and call [`decide`] again — use only the second decision;
//! 3. apply [`Decision::cascade`] (then record it in the cascade limiter);
//!    if that fails, return the error without writing status, so the
//!    baseline is not advanced past a cascade that did not happen;
//! 4. write the status if [`status_changed`], record [`Decision::events`], and
//!    requeue after [`Decision::requeue_after`];
//! 5. remember [`Decision::shape`] as the next reconcile's
//!    [`Observed::previous_shape`]; forget the limiters' entries when the shape
//!    is not [`BackendShape::Managed`].

use std::time::Duration;

use ic_api::cachebackend::{
    CacheBackend, CacheBackendSpec, CacheBackendStatus, CacheType, IntegrationMode, Ownership,
    Runtime,
};
use ic_api::consts::{annotations, conditions as types, is_truthy, reasons};

use crate::cascade::{self, CascadePlan, ServerPod, ServerRollout};
use crate::clock::{self, Timestamp};
use crate::conditions::{self, Builder};
use crate::endpoint;
use crate::event::EventToRecord;
use crate::gates::{self, KvGateInput, KvGateVerdict, ProbeInput};
use crate::observe::{self, EnginePod, T2Verdict};

/// Reconcile cadence in steady state.
pub const STEADY_REQUEUE: Duration = Duration::from_secs(30);
/// Reconcile cadence while the matched engine pod count is churning.
pub const CHURN_REQUEUE: Duration = Duration::from_secs(5);
/// Shortest requeue ever asked for.
pub const MIN_REQUEUE: Duration = Duration::from_secs(1);

// === inputs ===

/// Which lifecycle shape a backend has; decides the published conditions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendShape {
    /// Offload with a controller-provisioned provider workload.
    Managed,
    /// Offload with an operator-run provider (endpoint mirrored).
    External,
    /// Offload with no remote tier (LMCache host memory only).
    HostOnly,
    /// Routing only: no connector, no workload.
    EventsOnly,
    /// SGLang native HiCache: engine-local, no Ready contract yet.
    HiCache,
    /// A (runtime, type) pair no adapter supports.
    Unsupported,
}

impl BackendShape {
    /// Every shape, in declaration order.
    pub const ALL: [Self; 6] = [
        Self::Managed,
        Self::External,
        Self::HostOnly,
        Self::EventsOnly,
        Self::HiCache,
        Self::Unsupported,
    ];

    /// The name written to `status.observedMode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Managed => "Managed",
            Self::External => "External",
            Self::HostOnly => "HostOnly",
            Self::EventsOnly => "EventsOnly",
            Self::HiCache => "HiCache",
            Self::Unsupported => "Unsupported",
        }
    }

    /// The shape named `name` (as [`Self::as_str`] writes it).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Whether the KV-event gate and the availability anchor apply.
    pub fn gated(self) -> bool {
        matches!(self, Self::Managed | Self::HostOnly | Self::EventsOnly)
    }
    /// Whether the engine-side advisory conditions apply.
    pub fn engine_advisories(self) -> bool {
        matches!(self, Self::Managed | Self::HostOnly)
    }
}

/// The shape `spec` asks for.
pub fn shape(spec: &CacheBackendSpec) -> BackendShape {
    if spec.integration_mode() == IntegrationMode::EventsOnly {
        return BackendShape::EventsOnly;
    }
    match (spec.runtime, spec.r#type) {
        (Runtime::SGLang, CacheType::SGLangHiCache) => return BackendShape::HiCache,
        (_, CacheType::SGLangHiCache) => return BackendShape::Unsupported,
        _ => {}
    }
    match spec.remote_storage.as_ref().map(|r| r.ownership) {
        None => BackendShape::HostOnly,
        Some(Ownership::External) => BackendShape::External,
        Some(Ownership::Managed) => BackendShape::Managed,
    }
}

/// Rollout state of the managed provider Deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkloadState {
    /// `spec.replicas` of the Deployment (HPA-written when autoscaling).
    pub spec_replicas: i32,
    /// `status.readyReplicas`.
    pub ready_replicas: i32,
    /// `status.updatedReplicas`.
    pub updated_replicas: i32,
    /// `status.availableReplicas`.
    pub available_replicas: i32,
    /// `status.observedGeneration`.
    pub observed_generation: i64,
    /// `metadata.generation`.
    pub generation: i64,
    /// The Deployment's Available condition is True.
    pub available: bool,
}

/// The cache-server pods (for the cascade baseline).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerPods {
    /// Pods owned by the provider Deployment.
    pub pods: Vec<ServerPod>,
    /// Container names of the Deployment's pod template.
    pub own_containers: Vec<String>,
}

/// The engine pods in the backend's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineObservation {
    /// Every pod that matches the selector or was injected by this backend
    /// (others may be included; they are ignored).
    pub pods: Vec<EnginePod>,
    /// Sum of desired replicas of the Deployments whose pod-template labels
    /// match the selector; `None` when no Deployment matches.
    pub expected_replicas: Option<i32>,
}

/// Everything the reconciler gathered for one backend.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Observed {
    /// The reconcile instant (from the [`crate::clock::Clock`]).
    pub now: Timestamp,
    /// The managed provider Deployment; `None` when it does not exist (yet).
    pub workload: Option<WorkloadState>,
    /// `host:port` of the live managed Service.
    pub service_endpoint: Option<String>,
    /// Cache-server pods; `None` when not listed (baseline kept).
    pub server_pods: Option<ServerPods>,
    /// Engine pods; `None` when the pod list failed (engine-derived status
    /// and conditions are kept as they were).
    pub engines: Option<EngineObservation>,
    /// Functional-probe state.
    pub probe: ProbeInput,
    /// The controller runs with `--kvevent-subscriber-image` (message hint).
    pub subscriber_image_configured: bool,
    /// The shape of the previous reconcile (in-process memory); `None` falls
    /// back to inferring it from the previous status.
    pub previous_shape: Option<BackendShape>,
    /// The cascade limiter's `not_before` for this backend.
    pub cascade_not_before: Option<Timestamp>,
}

// === outputs ===

/// What to do after one reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The status to write (indexParticipation is the poller's, copied through).
    pub status: CacheBackendStatus,
    /// Events for the transitions this reconcile made.
    pub events: Vec<EventToRecord>,
    /// When to reconcile again.
    pub requeue_after: Duration,
    /// The backend's shape.
    pub shape: BackendShape,
    /// The probe gate would run now: call `/probe` if the limiter allows and
    /// decide again with the outcome.
    pub probe_wanted: bool,
    /// Engine Deployments to restart.
    pub cascade: Option<CascadePlan>,
}

/// Whether `new` differs from `old` in anything the controller writes
/// (everything but the poller-owned indexParticipation; conditions compared
/// by type, so order does not matter).
pub fn status_changed(old: Option<&CacheBackendStatus>, new: &CacheBackendStatus) -> bool {
    let Some(old) = old else {
        return true;
    };
    old.endpoint != new.endpoint
        || old.matched_engine_pods != new.matched_engine_pods
        || old.engine_selector_message != new.engine_selector_message
        || old.fail_open != new.fail_open
        || old.first_kv_event_observed_at != new.first_kv_event_observed_at
        || old.first_available_at != new.first_available_at
        || old.observed_server_instance != new.observed_server_instance
        || old.observed_generation != new.observed_generation
        || old.observed_mode != new.observed_mode
        || !conditions::same(&old.conditions, &new.conditions)
}

// === decide ===

type Triple = (&'static str, &'static str, String);

/// Computes the reconcile decision for `backend` (its spec, metadata and
/// previous status) given `observed`.
pub fn decide(backend: &CacheBackend, observed: &Observed) -> Decision {
    let spec = &backend.spec;
    let empty = CacheBackendStatus::default();
    let prev = backend.status.as_ref().unwrap_or(&empty);
    let now = observed.now;
    let shape = shape(spec);
    let generation = backend.metadata.generation;
    let annotations_ = backend.metadata.annotations.as_ref();
    let mut requeue = STEADY_REQUEUE;
    let wait_until = |at: Timestamp, requeue: &mut Duration| {
        *requeue = (*requeue).min(clock::since(at, now).max(MIN_REQUEUE));
    };

    let mut status = CacheBackendStatus {
        index_participation: prev.index_participation.clone(),
        fail_open: Some(spec.fail_open()),
        observed_generation: generation,
        first_kv_event_observed_at: prev.first_kv_event_observed_at.clone(),
        observed_mode: Some(shape.as_str().to_owned()),
        ..CacheBackendStatus::default()
    };

    // --- engine pods: matched count, selector message, churn cadence ---
    let (matched, message) = engine_selector(backend, observed, prev);
    status.matched_engine_pods = matched;
    status.engine_selector_message = message;
    match &observed.engines {
        None => requeue = requeue.min(CHURN_REQUEUE),
        Some(e) => {
            if let (Some(m), Some(want)) = (status.matched_engine_pods, e.expected_replicas)
                && m != want
            {
                requeue = requeue.min(CHURN_REQUEUE);
            }
        }
    }

    // --- endpoint ---
    let external = (shape == BackendShape::External).then(|| {
        let rs = spec.remote_storage.as_ref();
        let provider = rs.map(|r| r.provider);
        let raw = rs.and_then(|r| r.endpoint.as_deref());
        provider.map_or(Err(endpoint::EndpointError::Missing), |p| {
            endpoint::validate(p, raw)
        })
    });
    status.endpoint = match (&external, shape) {
        (Some(Ok(e)), _) => Some(e.clone()),
        (_, BackendShape::Managed) => observed.service_endpoint.clone(),
        _ => None,
    };

    // --- latches and the KV-event gate ---
    // In-process memory first, then the mode the status recorded (exact,
    // survives a controller restart), then an inference for statuses
    // written before observedMode existed.
    let previous_shape = observed
        .previous_shape
        .or_else(|| prev.observed_mode.as_deref().and_then(BackendShape::parse))
        .or_else(|| infer_shape(prev));
    let reanchor = previous_shape.is_some_and(|s| s != shape && s.gated() && shape.gated());
    let phase = phase(spec, shape, observed.workload.as_ref());
    let up = phase == Phase::Up;
    if shape.gated() {
        let kept = if reanchor {
            None
        } else {
            prev.first_available_at.clone()
        };
        status.first_available_at = kept.or_else(|| up.then(|| clock::to_time(now)));
        let has_event = prev
            .index_participation
            .as_ref()
            .is_some_and(|p| p.last_event_at.is_some());
        if status.first_kv_event_observed_at.is_none() && has_event {
            status.first_kv_event_observed_at = Some(clock::to_time(now));
        }
    }
    let gate_on = shape.gated() && !gates::kv_gate_opted_out(annotations_);
    let prev_degraded = conditions::find(&prev.conditions, types::DEGRADED);
    let gate = gate_on.then(|| {
        gates::kv_gate(&KvGateInput {
            up,
            anchor: status.first_available_at.as_ref().map(|t| t.0),
            ever_observed: status.first_kv_event_observed_at.is_some(),
            sticky_timed_out: !reanchor
                && previous_shape.is_none_or(|s| s == shape)
                && prev_degraded.is_some_and(|c| {
                    c.status == "True" && c.reason == reasons::NO_KV_EVENTS_OBSERVED
                }),
            timeout: gates::first_event_timeout(spec),
            now,
        })
    });
    if let Some(KvGateVerdict::Awaiting { deadline }) = gate {
        wait_until(deadline, &mut requeue);
    }

    // --- conditions ---
    let mut b = Builder::new(&prev.conditions, now, generation);
    let mut probe_wanted = false;
    match shape {
        BackendShape::External => {
            let (st, reason, msg) = match external {
                Some(Ok(e)) => (
                    "True",
                    reasons::EXTERNAL_ENDPOINT_ACCEPTED,
                    format!("external endpoint {e} accepted"),
                ),
                Some(Err(endpoint::EndpointError::Missing)) | None => (
                    "False",
                    reasons::EXTERNAL_ENDPOINT_MISSING,
                    "spec.remoteStorage.endpoint is empty; an External provider needs its endpoint"
                        .to_owned(),
                ),
                Some(Err(e)) => ("False", reasons::EXTERNAL_ENDPOINT_INVALID, e.to_string()),
            };
            b.set(types::READY, st, reason, msg.clone());
            b.set(types::PROGRESSING, "False", reason, msg);
        }
        BackendShape::Unsupported => {
            let msg = format!(
                "no installed adapter supports runtime {:?} with cache type {:?}; nothing is reconciled",
                spec.runtime, spec.r#type
            );
            b.set(
                types::READY,
                "False",
                reasons::UNSUPPORTED_RUNTIME_CACHE_PAIR,
                msg.clone(),
            );
            b.set(
                types::PROGRESSING,
                "False",
                reasons::UNSUPPORTED_RUNTIME_CACHE_PAIR,
                msg,
            );
        }
        BackendShape::HiCache => {}
        BackendShape::Managed | BackendShape::HostOnly | BackendShape::EventsOnly => {
            let hint = subscriber_hint(spec, observed.subscriber_image_configured);
            let (mut ready, degraded, progressing) = core_triple(shape, phase, gate, &hint);
            if shape == BackendShape::Managed {
                let bypass = annotations_
                    .and_then(|a| a.get(annotations::SKIP_FUNCTIONAL_PROBE))
                    .is_some_and(|v| is_truthy(v));
                let verdict = gates::functional_probe(
                    &observed.probe,
                    bypass,
                    conditions::find(&prev.conditions, types::FUNCTIONAL_PROBE_OK),
                );
                probe_wanted = observed.probe.enabled && !bypass && ready.0 == "True";
                if probe_wanted
                    && let Some(at) = observed.probe.next_allowed_at.filter(|at| *at > now)
                {
                    wait_until(at, &mut requeue);
                }
                if let (Some((reason, msg)), "True") = (&verdict.ready_downgrade, ready.0) {
                    ready = ("False", reason, msg.clone());
                }
                if let Some((st, reason, msg)) = verdict.condition {
                    b.set(types::FUNCTIONAL_PROBE_OK, st, reason, msg);
                }
            }
            if shape.engine_advisories() {
                match &observed.engines {
                    None => {
                        b.keep(types::ENGINE_KERNELS_HEALTHY);
                        b.keep(types::ENGINE_COMPATIBILITY);
                    }
                    Some(e) => {
                        let (kernels, downgrade) = observe::engine_kernels(&e.pods);
                        if let Some((st, reason, msg)) = kernels {
                            b.set(types::ENGINE_KERNELS_HEALTHY, st, reason, msg);
                        }
                        if let (Some(msg), "True") = (downgrade, ready.0) {
                            ready = ("False", reasons::ENGINE_KERNEL_DEGRADED, msg);
                        }
                        if let Some((st, reason, msg)) = observe::engine_compatibility(&e.pods) {
                            b.set(types::ENGINE_COMPATIBILITY, st, reason, msg);
                        }
                    }
                }
                let rate = prev
                    .index_participation
                    .as_ref()
                    .and_then(|p| p.t2_hit_rate.as_deref());
                match observe::t2_degraded(rate) {
                    T2Verdict::Absent => {}
                    T2Verdict::Unreadable => b.keep(types::T2_DEGRADED),
                    T2Verdict::Publish((st, reason, msg)) => {
                        b.set(types::T2_DEGRADED, st, reason, msg)
                    }
                }
            }
            b.set(types::READY, ready.0, ready.1, ready.2);
            b.set(types::DEGRADED, degraded.0, degraded.1, degraded.2);
            b.set(
                types::PROGRESSING,
                progressing.0,
                progressing.1,
                progressing.2,
            );
        }
    }
    status.conditions = b.finish();

    // --- cascade baseline ---
    let mut cascade_plan = None;
    if shape == BackendShape::Managed {
        status.observed_server_instance = prev.observed_server_instance.clone();
        if let Some(server) = &observed.server_pods {
            let current = cascade::server_instance(&server.pods, &server.own_containers);
            let ready_pods = server.pods.iter().filter(|p| p.ready).count();
            let converged = observed.workload.is_some_and(|w| {
                ServerRollout {
                    spec_replicas: w.spec_replicas,
                    ready_replicas: w.ready_replicas,
                    updated_replicas: w.updated_replicas,
                    observed_generation: w.observed_generation,
                    generation: w.generation,
                }
                .converged(ready_pods)
            });
            let verdict = cascade::evaluate(
                prev.observed_server_instance.as_deref(),
                &current,
                converged,
            );
            let held = observed.cascade_not_before.filter(|at| *at > now);
            match (verdict.replaced, held, &observed.engines) {
                (false, _, _) => status.observed_server_instance = verdict.baseline,
                (true, Some(at), _) => wait_until(at, &mut requeue),
                (true, None, None) => requeue = requeue.min(CHURN_REQUEUE),
                (true, None, Some(engines)) => {
                    let deployments = cascade::engine_deployments(&engines.pods);
                    if !deployments.is_empty() {
                        cascade_plan = Some(cascade::plan(deployments, &current, now));
                    }
                    status.observed_server_instance = verdict.baseline;
                }
            }
        }
    }

    let events = crate::narrate::events(prev, &status, gate_on);
    Decision {
        status,
        events,
        requeue_after: requeue,
        shape,
        probe_wanted,
        cascade: cascade_plan,
    }
}

/// The decision when the provider objects of the current spec could not be
/// rendered or the API server refused them (`message` says which and why):
/// everything observed before is kept, since what the last good spec made
/// keeps serving under the endpoint already published; Ready and
/// Progressing turn False with [`reasons::PROVISIONING_FAILED`] and the
/// message, for this generation. The caller retries on its error backoff.
pub fn provisioning_failed(backend: &CacheBackend, now: Timestamp, message: &str) -> Decision {
    let prev = backend.status.clone().unwrap_or_default();
    let shape = shape(&backend.spec);
    let mut b = Builder::new(&prev.conditions, now, backend.metadata.generation);
    for type_ in conditions::ORDER {
        b.keep(type_);
    }
    b.set(types::READY, "False", reasons::PROVISIONING_FAILED, message);
    b.set(
        types::PROGRESSING,
        "False",
        reasons::PROVISIONING_FAILED,
        message,
    );
    let status = CacheBackendStatus {
        conditions: b.finish(),
        observed_generation: backend.metadata.generation,
        ..prev.clone()
    };
    let gate_on = shape.gated() && !gates::kv_gate_opted_out(backend.metadata.annotations.as_ref());
    Decision {
        events: crate::narrate::events(&prev, &status, gate_on),
        status,
        requeue_after: STEADY_REQUEUE,
        shape,
        probe_wanted: false,
        cascade: None,
    }
}

fn engine_selector(
    backend: &CacheBackend,
    observed: &Observed,
    prev: &CacheBackendStatus,
) -> (Option<i32>, Option<String>) {
    let labels = backend
        .spec
        .engine_selector
        .as_ref()
        .map(|s| &s.match_labels)
        .filter(|m| !m.is_empty());
    let Some(labels) = labels else {
        return (None, None);
    };
    let Some(engines) = &observed.engines else {
        return (
            prev.matched_engine_pods,
            prev.engine_selector_message.clone(),
        );
    };
    let count = engines.pods.iter().filter(|p| p.matches_selector).count();
    let count = i32::try_from(count).unwrap_or(i32::MAX);
    let expected = engines.expected_replicas.is_none_or(|n| n > 0);
    let message = (count == 0 && expected).then(|| {
        let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!(
            "spec.engineSelector.matchLabels={{{}}} matches no Pods in namespace {}",
            pairs.join(","),
            backend.metadata.namespace.as_deref().unwrap_or_default()
        )
    });
    (Some(count), message)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Missing,
    ScaledToZero,
    Rolling,
    Unavailable,
    Up,
}

fn phase(spec: &CacheBackendSpec, shape: BackendShape, workload: Option<&WorkloadState>) -> Phase {
    if shape != BackendShape::Managed {
        return Phase::Up;
    }
    let Some(w) = workload else {
        return if spec.autoscaling.is_none() && spec.replicas == 0 {
            Phase::ScaledToZero
        } else {
            Phase::Missing
        };
    };
    let desired = if spec.autoscaling.is_some() {
        w.spec_replicas
    } else {
        spec.replicas
    };
    if desired == 0 {
        return Phase::ScaledToZero;
    }
    if w.observed_generation < w.generation
        || w.spec_replicas != desired
        || w.updated_replicas < desired
    {
        return Phase::Rolling;
    }
    if !w.available || w.available_replicas < 1 {
        return Phase::Unavailable;
    }
    Phase::Up
}

/// Why no event may ever come, appended to the gate's messages: the
/// subscriber is only injected with `--kvevent-subscriber-image` set and
/// `spec.observation.modelID` present.
fn subscriber_hint(spec: &CacheBackendSpec, image: bool) -> String {
    let model = spec
        .observation
        .as_ref()
        .and_then(|o| o.model_id.as_deref())
        .is_some();
    if !image {
        " (note: the controller runs without --kvevent-subscriber-image, so no kvevent-subscriber is injected)".to_owned()
    } else if !model {
        " (note: spec.observation.modelID is unset, so no kvevent-subscriber is injected)"
            .to_owned()
    } else {
        String::new()
    }
}

fn core_triple(
    shape: BackendShape,
    phase: Phase,
    gate: Option<KvGateVerdict>,
    hint: &str,
) -> (Triple, Triple, Triple) {
    let not_degraded = (
        "False",
        reasons::NOT_DEGRADED,
        "the backend is not in a terminal unhealthy state".to_owned(),
    );
    let (base, base_msg) = match shape {
        BackendShape::HostOnly => (reasons::HOST_ONLY_ACTIVE, "host-only LMCache is active"),
        BackendShape::EventsOnly => (reasons::EVENTS_ONLY_ACTIVE, "events-only routing is active"),
        _ => (reasons::BACKEND_READY, "the backend workload is available"),
    };
    match phase {
        Phase::Missing | Phase::Rolling => {
            let msg = if phase == Phase::Missing {
                "waiting for the provider workload to be created".to_owned()
            } else {
                "the provider workload is rolling out its current generation".to_owned()
            };
            (
                ("False", reasons::ROLLOUT_IN_PROGRESS, msg.clone()),
                not_degraded,
                ("True", reasons::ROLLOUT_IN_PROGRESS, msg),
            )
        }
        Phase::ScaledToZero => {
            let msg = "the provider workload is scaled to zero".to_owned();
            (
                ("False", reasons::SCALED_TO_ZERO, msg.clone()),
                not_degraded,
                ("False", reasons::SCALED_TO_ZERO, msg),
            )
        }
        Phase::Unavailable => {
            let msg = "the provider workload rolled out but has no available replicas".to_owned();
            (
                ("False", reasons::REPLICAS_UNAVAILABLE, msg.clone()),
                ("True", reasons::REPLICAS_UNAVAILABLE, msg.clone()),
                ("False", reasons::REPLICAS_UNAVAILABLE, msg),
            )
        }
        Phase::Up => match gate {
            None | Some(KvGateVerdict::NotUp) => (
                ("True", base, base_msg.to_owned()),
                not_degraded,
                ("False", reasons::SYNCED, "converged".to_owned()),
            ),
            Some(KvGateVerdict::Observed) => (
                (
                    "True",
                    reasons::KV_EVENTS_OBSERVED,
                    format!("{base_msg}; KV events have been observed"),
                ),
                not_degraded,
                ("False", reasons::SYNCED, "converged".to_owned()),
            ),
            Some(KvGateVerdict::Awaiting { .. }) => {
                let msg =
                    format!("{base_msg}; waiting for the first KV event from an engine pod{hint}");
                (
                    ("False", reasons::AWAITING_FIRST_KV_EVENT, msg.clone()),
                    not_degraded,
                    ("True", reasons::AWAITING_FIRST_KV_EVENT, msg),
                )
            }
            Some(KvGateVerdict::TimedOut) => {
                let msg = format!(
                    "no KV event observed within spec.observation.firstEventTimeout: check that engine pods are wired to this backend and that their --kv-events-config publisher is bound{hint}"
                );
                (
                    ("False", reasons::NO_KV_EVENTS_OBSERVED, msg.clone()),
                    ("True", reasons::NO_KV_EVENTS_OBSERVED, msg.clone()),
                    ("False", reasons::NO_KV_EVENTS_OBSERVED, msg),
                )
            }
        },
    }
}

/// Best-effort shape of the previous reconcile from the status alone (used
/// after a controller restart, when no in-process memory exists).
pub fn infer_shape(prev: &CacheBackendStatus) -> Option<BackendShape> {
    let ready = conditions::find(&prev.conditions, types::READY).map(|c| c.reason.as_str());
    let has = |t: &str| conditions::find(&prev.conditions, t).is_some();
    match ready {
        Some(r)
            if [
                reasons::EXTERNAL_ENDPOINT_ACCEPTED,
                reasons::EXTERNAL_ENDPOINT_MISSING,
                reasons::EXTERNAL_ENDPOINT_INVALID,
            ]
            .contains(&r) =>
        {
            return Some(BackendShape::External);
        }
        Some(reasons::EVENTS_ONLY_ACTIVE) => return Some(BackendShape::EventsOnly),
        Some(reasons::HOST_ONLY_ACTIVE) => return Some(BackendShape::HostOnly),
        Some(reasons::UNSUPPORTED_RUNTIME_CACHE_PAIR) => return Some(BackendShape::Unsupported),
        Some(r)
            if [
                reasons::BACKEND_READY,
                reasons::ROLLOUT_IN_PROGRESS,
                reasons::SCALED_TO_ZERO,
                reasons::REPLICAS_UNAVAILABLE,
            ]
            .contains(&r) =>
        {
            return Some(BackendShape::Managed);
        }
        _ => {}
    }
    if prev.observed_server_instance.is_some()
        || prev.endpoint.is_some()
        || has(types::FUNCTIONAL_PROBE_OK)
    {
        return Some(BackendShape::Managed);
    }
    None
}
