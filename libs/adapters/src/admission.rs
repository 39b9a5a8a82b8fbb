//! The admission-facing API of the adapters: the pod-mutation decision and
//! the full CacheBackend validation. The webhook service only does I/O
//! around these (decode, list backends, diff into a JSON patch, metrics).

use k8s_openapi::api::core::v1::Pod;

use ic_api::CacheBackend;
use ic_api::validate::FieldError;

/// Webhook-level settings the injection needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InjectionConfig {
    /// Image of the kvevent-subscriber sidecar; `None` injects no subscriber.
    pub subscriber_image: Option<String>,
    /// Index server gRPC URL the injected subscriber dials.
    pub index_server: String,
}

/// Why a pod was admitted unwired. `label()` values are the `reason` label
/// of the webhook's admission metrics, so they are stable identifiers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FailOpenReason {
    /// The request could not be decoded into a Pod.
    Decode,
    /// Listing the namespace's CacheBackends failed.
    ListFailed,
    /// No CacheBackend's engineSelector matches the pod.
    NoMatch,
    /// A remote binding is required but its endpoint is unknown (Managed
    /// without status.endpoint yet, or External without a valid endpoint).
    MissingEndpoint,
    /// No runtime adapter is registered for the (runtime, type) pair.
    NoAdapter,
    /// The adapter refused the pod (reserved-name squatting, HiCache
    /// conflicts, unsupported binding, ...); the detail says why.
    AdapterRejected(String),
    /// Re-encoding the mutated pod failed.
    Encode,
}

impl FailOpenReason {
    /// Stable metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Decode => "decode",
            Self::ListFailed => "list_failed",
            Self::NoMatch => "no_match",
            Self::MissingEndpoint => "missing_endpoint",
            Self::NoAdapter => "no_adapter",
            Self::AdapterRejected(_) => "adapter_rejected",
            Self::Encode => "encode",
        }
    }
}

/// What happened to the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodOutcome {
    /// Wired to the backend `<namespace>/<name>` (connector + sidecars).
    Injected {
        /// `<namespace>/<name>` of the backend.
        backend: String,
    },
    /// Events-only backend: only the kvevent-subscriber was wired.
    EventsOnly {
        /// `<namespace>/<name>` of the backend.
        backend: String,
    },
    /// The pod opted out with `inferencecache.io/skip-inject`.
    Skipped,
    /// Admitted unwired.
    FailOpen(FailOpenReason),
}

/// The decision for one pod: the pod to admit (the webhook diffs it against
/// the original), what happened, and admission warnings to return.
#[derive(Clone, Debug, PartialEq)]
pub struct PodAdmission {
    /// The pod as it should be admitted.
    pub pod: Pod,
    /// What happened.
    pub outcome: PodOutcome,
    /// Admission warnings (e.g. failOpen=false, Mooncake without engineHostNetwork).
    pub warnings: Vec<String>,
}

/// Decides how to admit `pod` given the live CacheBackends of its
/// namespace (in list order): first match by engineSelector, skip-inject
/// opt-out, events-only, binding resolution, adapter injection with
/// engineOverrides, sidecars, decision annotations. Never fails: every
/// error is a [`PodOutcome::FailOpen`] with stale decision annotations
/// stripped.
pub fn admit_pod(pod: &Pod, backends: &[CacheBackend], config: &InjectionConfig) -> PodAdmission {
    let _ = (backends, config);
    fail_open(pod, FailOpenReason::NoMatch)
}

/// The pod to admit when wiring is abandoned for `reason`: unchanged except
/// that stale decision annotations are stripped.
pub fn fail_open(pod: &Pod, reason: FailOpenReason) -> PodAdmission {
    PodAdmission {
        pod: pod.clone(),
        outcome: PodOutcome::FailOpen(reason),
        warnings: Vec::new(),
    }
}

/// Every validating-webhook violation of `backend` (namespace from its
/// metadata): the ordered structural rules of `ic_api::validate`, then the
/// registry-backed runtime/cache-pair check, the reserved engineOverrides
/// check, the provider-resource checks and the kernel-check annotation.
/// For UPDATE the webhook filters with `ic_api::validate::introduced`.
pub fn validate_backend(backend: &CacheBackend) -> Vec<FieldError> {
    let namespace = backend.metadata.namespace.as_deref().unwrap_or_default();
    ic_api::validate::validate(&ic_api::validate::Subject {
        namespace,
        spec: &backend.spec,
    })
}

/// Admission warnings for an admitted CacheBackend (e.g. failOpen=false).
pub fn backend_warnings(backend: &CacheBackend) -> Vec<String> {
    let _ = backend;
    Vec::new()
}
