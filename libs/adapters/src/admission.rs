//! The admission-facing API of the adapters: the pod-mutation decision and
//! the full CacheBackend validation. The webhook service only does I/O
//! around these (decode, list backends, diff into a JSON patch, metrics).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use ic_api::CacheBackend;
use ic_api::cachebackend::{CacheType, IntegrationMode, Runtime};
use ic_api::consts::{annotations, is_truthy, labels};
use ic_api::validate::FieldError;

use crate::binding::{self, Protocol};
use crate::registry::Registry;
use crate::runtime::{InjectContext, RuntimeAdapter, engine_port, find_engine_container};
use crate::sidecars::{
    self, KERNEL_CHECK_CONTAINER, KernelCheckMode, SUBSCRIBER_CONTAINER, SubscriberPlan,
};
pub use crate::sidecars::{IndexServerDiscovery, InjectionConfig, SecretKeyRef, SubscriberKafka};
use crate::{kv_events, overrides, validation};

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
    /// Events-only backend whose subscriber gate is unmet (no subscriber
    /// image configured on the webhook, or no spec.observation.modelID):
    /// there is nothing to wire.
    EventsOnlyUnwired,
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
            Self::EventsOnlyUnwired => "events_only_unwired",
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

/// Annotations a fail-open admission strips: the decision markers (and the
/// kernel-check mode, which only means something on a wired pod).
const DECISION_ANNOTATIONS: [&str; 4] = [
    annotations::INJECTED_BY,
    annotations::INJECTED_BY_UID,
    annotations::INJECT_SKIPPED,
    annotations::LMCACHE_KERNEL_CHECK_MODE,
];

/// Decides how to admit `pod` given the live CacheBackends of its
/// namespace (in list order): first match by engineSelector, skip-inject
/// opt-out, events-only, binding resolution, adapter injection with
/// engineOverrides, sidecars, decision annotations. Never fails: every
/// error is a [`PodOutcome::FailOpen`] with stale decision annotations
/// stripped.
pub fn admit_pod(pod: &Pod, backends: &[CacheBackend], config: &InjectionConfig) -> PodAdmission {
    let Some(backend) = backends.iter().find(|b| selects(b, pod)) else {
        return fail_open(pod, FailOpenReason::NoMatch);
    };
    let skip = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::SKIP_INJECT))
        .is_some_and(|v| is_truthy(v));
    if skip {
        let mut out = pod.clone();
        strip(
            &mut out,
            &[
                annotations::INJECTED_BY,
                annotations::INJECTED_BY_UID,
                annotations::LMCACHE_KERNEL_CHECK_MODE,
            ],
        );
        strip_wired_label(&mut out);
        out.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                annotations::INJECT_SKIPPED.to_owned(),
                annotations::INJECT_SKIPPED_BY_ANNOTATION.to_owned(),
            );
        return PodAdmission {
            pod: out,
            outcome: PodOutcome::Skipped,
            warnings: Vec::new(),
        };
    }
    match wire(pod, backend, config) {
        Ok(admission) => admission,
        Err((reason, warnings)) => {
            let mut admission = fail_open(pod, reason);
            admission.warnings = warnings;
            admission
        }
    }
}

/// The pod to admit when wiring is abandoned for `reason`: unchanged except
/// that stale decision annotations are stripped.
pub fn fail_open(pod: &Pod, reason: FailOpenReason) -> PodAdmission {
    let mut out = pod.clone();
    strip(&mut out, &DECISION_ANNOTATIONS);
    strip_wired_label(&mut out);
    PodAdmission {
        pod: out,
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
    validation::validate_backend(backend)
}

/// Admission warnings for an admitted CacheBackend (e.g. failOpen=false).
pub fn backend_warnings(backend: &CacheBackend) -> Vec<String> {
    validation::backend_warnings(backend)
}

// === selection and annotations ===

/// A non-empty matchLabels that is a subset of the pod's labels; an empty
/// or absent selector never matches (it would claim every pod).
fn selects(backend: &CacheBackend, pod: &Pod) -> bool {
    let Some(sel) = backend.spec.engine_selector.as_ref() else {
        return false;
    };
    if sel.match_labels.is_empty() {
        return false;
    }
    let labels = pod.metadata.labels.as_ref();
    sel.match_labels
        .iter()
        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
}

fn strip(pod: &mut Pod, keys: &[&str]) {
    if let Some(a) = pod.metadata.annotations.as_mut() {
        for k in keys {
            a.remove(*k);
        }
    }
}

/// Removes the wired label from a pod admitted unwired.
fn strip_wired_label(pod: &mut Pod) {
    if let Some(l) = pod.metadata.labels.as_mut() {
        l.remove(labels::WIRED);
    }
}

fn backend_id(backend: &CacheBackend, pod: &Pod) -> String {
    let ns = backend
        .metadata
        .namespace
        .as_deref()
        .or(pod.metadata.namespace.as_deref())
        .unwrap_or_default();
    format!(
        "{ns}/{}",
        backend.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Admission warnings for an engine whose KV events the subscriber will not hear.
fn silent_publisher_warnings(problems: &[String]) -> Vec<String> {
    problems
        .iter()
        .map(|p| {
            format!(
                "InferenceCache wired this pod, but its kvevent-subscriber will hear no KV events: {p}; \
                 LookupRoute has no routing hints for this pod until the engine publishes them"
            )
        })
        .collect()
}

fn stamp_injected(pod: &mut Pod, backend: &CacheBackend, id: &str) {
    pod.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(labels::WIRED.to_owned(), "true".to_owned());
    let a = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    a.insert(annotations::INJECTED_BY.to_owned(), id.to_owned());
    match backend.metadata.uid.as_deref() {
        Some(uid) => {
            a.insert(annotations::INJECTED_BY_UID.to_owned(), uid.to_owned());
        }
        None => {
            a.remove(annotations::INJECTED_BY_UID);
        }
    }
    a.remove(annotations::INJECT_SKIPPED);
}

// === wiring ===

type WireError = (FailOpenReason, Vec<String>);

fn rejected(detail: String) -> WireError {
    let warning = format!("InferenceCache admitted this pod without cache wiring: {detail}");
    (FailOpenReason::AdapterRejected(detail), vec![warning])
}

fn model_id(backend: &CacheBackend) -> Option<&str> {
    backend
        .spec
        .observation
        .as_ref()
        .and_then(|o| o.model_id.as_deref())
        .map(str::trim)
        .filter(|m| !m.is_empty())
}

fn subscriber_image(config: &InjectionConfig) -> Option<&str> {
    config
        .subscriber_image
        .as_deref()
        .map(str::trim)
        .filter(|i| !i.is_empty())
}

fn wire(
    pod: &Pod,
    backend: &CacheBackend,
    config: &InjectionConfig,
) -> Result<PodAdmission, WireError> {
    let spec = &backend.spec;
    let id = backend_id(backend, pod);
    let adapter = Registry
        .select(spec.runtime, spec.r#type)
        .ok_or((FailOpenReason::NoAdapter, Vec::new()))?;
    let pod_spec = pod
        .spec
        .as_ref()
        .ok_or_else(|| rejected("the pod has no spec".into()))?;
    let engine = find_engine_container(pod_spec, spec.runtime).map_err(rejected)?;
    let subscriber = match (subscriber_image(config), model_id(backend)) {
        (Some(image), Some(model)) => Some((image, model)),
        _ => None,
    };
    if spec.integration_mode() == IntegrationMode::EventsOnly {
        let Some((image, model)) = subscriber else {
            return Err((FailOpenReason::EventsOnlyUnwired, Vec::new()));
        };
        sidecars::check_squatting(pod_spec, SUBSCRIBER_CONTAINER).map_err(rejected)?;
        let mut out = pod.clone();
        let out_spec = out.spec.get_or_insert_with(Default::default);
        let engine_c = &out_spec.containers[engine];
        let events = kv_events::read(engine_c, spec.runtime);
        let port = engine_port(engine_c, adapter.default_engine_port());
        let plan = SubscriberPlan {
            model_id: model.to_owned(),
            hash_scheme: adapter.hash_scheme(),
            // No tier keeps an evicted block: a removal is a real eviction.
            ignore_block_removed: false,
            engine_port: port,
            engine_metrics_url: adapter
                .serves_metrics_as_written(engine_c.args.as_deref().unwrap_or_default())
                .then(|| format!("http://127.0.0.1:{port}/metrics")),
            publisher: events.publisher,
        };
        let guaranteed = sidecars::is_guaranteed(pod_spec);
        let container = sidecars::subscriber_container(image, config, &plan, guaranteed);
        sidecars::converge(
            &mut out_spec.containers,
            SUBSCRIBER_CONTAINER,
            Some(container),
        );
        sidecars::converge_token_volume(&mut out_spec.volumes, config.token_audience());
        sidecars::converge_kafka_sasl_volume(&mut out_spec.volumes, config.kafka_sasl_secret());
        sidecars::converge_opt(&mut out_spec.init_containers, KERNEL_CHECK_CONTAINER, None);
        sidecars::add_pull_secrets(out_spec, &config.image_pull_secrets);
        strip(&mut out, &[annotations::LMCACHE_KERNEL_CHECK_MODE]);
        stamp_injected(&mut out, backend, &id);
        return Ok(PodAdmission {
            pod: out,
            outcome: PodOutcome::EventsOnly { backend: id },
            warnings: silent_publisher_warnings(&events.problems),
        });
    }

    let binding = binding::resolve(backend).map_err(|e| {
        (
            FailOpenReason::MissingEndpoint,
            vec![format!(
                "InferenceCache admitted this pod without cache wiring: CacheBackend {id}: {e}"
            )],
        )
    })?;
    let protocol = binding.as_ref().map(|b| b.protocol);
    if !adapter.supports_binding(protocol) {
        return Err(rejected(format!(
            "the {} adapter does not accept a {} binding",
            adapter.display_name(),
            protocol.map_or("host-only", Protocol::name)
        )));
    }
    let ctx = InjectContext {
        backend,
        binding: binding.as_ref(),
    };
    if subscriber.is_some() {
        sidecars::check_squatting(pod_spec, SUBSCRIBER_CONTAINER).map_err(rejected)?;
    }
    let engine_image = pod_spec.containers[engine]
        .image
        .clone()
        .filter(|i| !i.trim().is_empty());
    let kernel_mode = match &engine_image {
        Some(_) if adapter.provides_kernel_check() => {
            sidecars::kernel_check_mode(backend, &pod_spec.containers[engine])
        }
        _ => KernelCheckMode::Off,
    };
    if kernel_mode != KernelCheckMode::Off {
        sidecars::check_squatting(pod_spec, KERNEL_CHECK_CONTAINER).map_err(rejected)?;
    }
    adapter.check_pod(&ctx, pod, engine).map_err(rejected)?;

    let mut out = pod.clone();
    let out_spec = out.spec.get_or_insert_with(Default::default);
    inject(adapter, &ctx, out_spec, engine).map_err(rejected)?;

    let mut warnings = Vec::new();
    if protocol == Some(Protocol::MooncakeStore) {
        let host_network = spec
            .integration
            .as_ref()
            .and_then(|i| i.engine_host_network)
            == Some(true);
        if host_network {
            sidecars::apply_host_network(out_spec);
        } else {
            warnings.push(format!(
                "CacheBackend {id} binds Mooncake but spec.integration.engineHostNetwork is not true: this pod stays on the pod network and cannot join the Mooncake transfer mesh (zero KV transferred)"
            ));
        }
    }
    if binding.is_none()
        && adapter.pair() == (Runtime::Vllm, CacheType::LMCache)
        && local_cpu_disabled(&out_spec.containers[engine])
    {
        warnings.push(format!(
            "CacheBackend {id} binds no remote tier and this pod's template sets LMCACHE_LOCAL_CPU to false: \
             LMCache then keeps nothing (set it true, or bind spec.remoteStorage)"
        ));
    }
    let guaranteed = sidecars::is_guaranteed(pod_spec);
    let subscriber_container = subscriber.map(|(image, model)| {
        let port = engine_port(&out_spec.containers[engine], adapter.default_engine_port());
        let events = kv_events::read(&out_spec.containers[engine], spec.runtime);
        warnings.extend(silent_publisher_warnings(&events.problems));
        let plan = SubscriberPlan {
            model_id: model.to_owned(),
            hash_scheme: adapter.hash_scheme(),
            ignore_block_removed: adapter.retains_evicted_blocks(),
            engine_port: port,
            engine_metrics_url: adapter
                .exports_engine_metrics()
                .then(|| format!("http://127.0.0.1:{port}/metrics")),
            publisher: events.publisher,
        };
        sidecars::subscriber_container(image, config, &plan, guaranteed)
    });
    let wired = subscriber_container.is_some();
    let token_audience = config.token_audience().filter(|_| wired);
    let sasl_secret = config.kafka_sasl_secret().filter(|_| wired);
    sidecars::converge(
        &mut out_spec.containers,
        SUBSCRIBER_CONTAINER,
        subscriber_container,
    );
    sidecars::converge_token_volume(&mut out_spec.volumes, token_audience);
    sidecars::converge_kafka_sasl_volume(&mut out_spec.volumes, sasl_secret);
    let kernel_container = match (&engine_image, kernel_mode) {
        (Some(image), KernelCheckMode::ReportOnly | KernelCheckMode::Strict) => {
            Some(sidecars::kernel_check_container(
                &out_spec.containers[engine],
                image,
                kernel_mode,
                guaranteed,
                binding.as_ref().map(|b| b.protocol),
            ))
        }
        _ => None,
    };
    sidecars::converge_opt(
        &mut out_spec.init_containers,
        KERNEL_CHECK_CONTAINER,
        kernel_container,
    );
    // The injected images may come from a private registry.
    sidecars::add_pull_secrets(out_spec, &config.image_pull_secrets);

    stamp_injected(&mut out, backend, &id);
    if adapter.provides_kernel_check() {
        out.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(
                annotations::LMCACHE_KERNEL_CHECK_MODE.to_owned(),
                kernel_mode.as_str().to_owned(),
            );
    } else {
        strip(&mut out, &[annotations::LMCACHE_KERNEL_CHECK_MODE]);
    }
    if !spec.fail_open() {
        warnings.push(format!(
            "CacheBackend {id} sets spec.integration.failOpen=false: the cache is a serving dependency of this pod"
        ));
    }
    Ok(PodAdmission {
        pod: out,
        outcome: PodOutcome::Injected { backend: id },
        warnings,
    })
}

/// Whether the engine's own env turns LMCache's CPU tier off (the adapter
/// sets it true only when the template leaves it unset).
fn local_cpu_disabled(engine: &k8s_openapi::api::core::v1::Container) -> bool {
    engine
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|e| e.name == "LMCACHE_LOCAL_CPU")
        .and_then(|e| e.value.as_deref())
        .is_some_and(|v| {
            matches!(
                v.trim().to_ascii_lowercase().as_str(),
                "false" | "0" | "no" | "off"
            )
        })
}

/// The adapter's engine injection, engineOverrides over its diff, then its
/// pod-level wiring.
fn inject(
    adapter: &dyn RuntimeAdapter,
    ctx: &InjectContext<'_>,
    spec: &mut k8s_openapi::api::core::v1::PodSpec,
    engine: usize,
) -> Result<(), String> {
    let before = spec.containers[engine].clone();
    adapter.inject_engine_config(ctx, &mut spec.containers[engine])?;
    let engine_overrides = ctx
        .backend
        .spec
        .integration
        .as_ref()
        .and_then(|i| i.engine_overrides.as_ref());
    overrides::apply(
        &before,
        &mut spec.containers[engine],
        engine_overrides,
        adapter,
        ctx.binding.map(|b| b.protocol),
    );
    adapter.inject_pod(ctx, spec, engine)
}
