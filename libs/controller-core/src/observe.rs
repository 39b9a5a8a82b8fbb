//! What the engine pods say about a backend: the per-pod summary the
//! reconciler gathers ([`summarize_pod`]), the advisory conditions derived from
//! it (EngineKernelsHealthy, EngineCompatibility) and from the poller's
//! tier-2 hit rate (T2Degraded), and the engine-pod Events
//! (InjectedByCacheBackend / SkippedByOperator) of the pod-watching controller.

use std::collections::BTreeMap;

use ic_adapters::runtime::locate_engine_container;
use ic_api::cachebackend::Runtime;
use ic_api::consts::{annotations, events, is_truthy, kernel_check, reasons};
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, ContainerStatus, Pod};

use crate::event::{EventToRecord, EventType};

/// The kernel-check result of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCheck {
    /// Not finished yet.
    Pending,
    /// The native kernels loaded.
    Healthy,
    /// They did not; the detector's cause.
    Failed(String),
    /// The check ended without a recognisable result.
    Error(String),
}

/// One pod in the backend's namespace, reduced to what the decisions use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EnginePod {
    /// Pod name.
    pub name: String,
    /// The pod's labels satisfy a non-empty `spec.engineSelector.matchLabels`.
    pub matches_selector: bool,
    /// `injected-by` names this backend and `injected-by-uid` is its live UID.
    pub injected_by_this: bool,
    /// Deployment owning the pod (through its ReplicaSet), if any.
    pub owner_deployment: Option<String>,
    /// The kernel-check init container's result, when the pod has one.
    pub kernel_check: Option<KernelCheck>,
    /// The kernel-check mode the webhook admitted the pod with
    /// (`inferencecache.io/lmcache-kernel-check-mode`).
    pub admitted_kernel_mode: Option<String>,
    /// The engine container is waiting in CrashLoopBackOff.
    pub engine_crash_looping: bool,
    /// The kernel check's verdict on the remote tier's client library
    /// (`Some(Err(cause))`: it does not import in the engine image), when
    /// the pod's binding asked for one.
    pub remote_client: Option<Result<(), String>>,
}

/// Identity of the backend a pod is compared against.
#[derive(Debug, Clone, Copy)]
pub struct BackendRef<'a> {
    /// Namespace.
    pub namespace: &'a str,
    /// Name.
    pub name: &'a str,
    /// Live metadata.uid.
    pub uid: &'a str,
    /// `spec.engineSelector.matchLabels` (empty: no claim).
    pub match_labels: Option<&'a BTreeMap<String, String>>,
}

/// Whether `labels` satisfy a claim-capable selector (non-empty, subset).
pub fn selector_matches(
    match_labels: Option<&BTreeMap<String, String>>,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    let Some(want) = match_labels.filter(|m| !m.is_empty()) else {
        return false;
    };
    let empty = BTreeMap::new();
    let have = labels.unwrap_or(&empty);
    want.iter().all(|(k, v)| have.get(k) == Some(v))
}

/// Reduces a pod to an [`EnginePod`]. `owner_deployment` is derived from the
/// controlling ReplicaSet's name minus its `pod-template-hash` suffix; the
/// service may overwrite it after resolving the ReplicaSet for certain.
pub fn summarize_pod(pod: &Pod, backend: BackendRef<'_>) -> EnginePod {
    let meta = &pod.metadata;
    let ann = meta.annotations.as_ref();
    let get = |k: &str| ann.and_then(|a| a.get(k)).map(String::as_str);
    let expected_by = format!("{}/{}", backend.namespace, backend.name);
    let injected_by_this = get(annotations::INJECTED_BY) == Some(expected_by.as_str())
        && !backend.uid.is_empty()
        && get(annotations::INJECTED_BY_UID) == Some(backend.uid);
    let status = pod.status.as_ref();
    let check_status = status
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == kernel_check::CONTAINER_NAME));
    let kernel_check = check_status.map(kernel_check_from_status);
    let remote_client = check_status.and_then(remote_client_from_status);
    let engine_name = engine_container_name(pod);
    let engine_crash_looping = match (
        engine_name,
        status.and_then(|s| s.container_statuses.as_ref()),
    ) {
        (Some(name), Some(cs)) => cs.iter().any(|c| {
            c.name == name
                && c.state
                    .as_ref()
                    .and_then(|s| s.waiting.as_ref())
                    .and_then(|w| w.reason.as_deref())
                    == Some("CrashLoopBackOff")
        }),
        _ => false,
    };
    EnginePod {
        name: meta.name.clone().unwrap_or_default(),
        matches_selector: selector_matches(backend.match_labels, meta.labels.as_ref()),
        injected_by_this,
        owner_deployment: owner_deployment(pod),
        kernel_check,
        admitted_kernel_mode: get(annotations::LMCACHE_KERNEL_CHECK_MODE).map(str::to_owned),
        engine_crash_looping,
        remote_client,
    }
}

/// The engine container, chosen by the webhook's own rule
/// ([`ic_adapters::runtime::locate_engine_container`]): among the containers
/// not carrying the injected marker env (the kvevent-subscriber and every
/// other injected container carry it), the only one, else the one named
/// `vllm` or `sglang` (the pod does not say which runtime wired it).
pub fn engine_container_name(pod: &Pod) -> Option<&str> {
    let spec = pod.spec.as_ref()?;
    locate_engine_container(spec, &[Runtime::Vllm, Runtime::SGLang])
        .map(|i| spec.containers[i].name.as_str())
}

fn owner_deployment(pod: &Pod) -> Option<String> {
    let rs = pod
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "ReplicaSet" && o.controller == Some(true))?;
    let hash = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("pod-template-hash"))?;
    rs.name
        .strip_suffix(hash.as_str())
        .and_then(|s| s.strip_suffix('-'))
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

/// The last finished run of the kernel-check container: the current state,
/// or, while the kubelet backs off a failing strict check, the last state.
fn last_finished(status: &ContainerStatus) -> Option<ContainerStateTerminated> {
    let finished = |s: Option<&ContainerState>| s.and_then(|s| s.terminated.clone());
    finished(status.state.as_ref()).or_else(|| {
        let waiting = status.state.as_ref().is_some_and(|s| s.waiting.is_some());
        if waiting {
            finished(status.last_state.as_ref())
        } else {
            None
        }
    })
}

/// Classifies the kernel-check init container from its termination
/// message's `LMCACHE_KERNELS=ok|failed|inconclusive` line.
pub fn kernel_check_from_status(status: &ContainerStatus) -> KernelCheck {
    match last_finished(status) {
        None => KernelCheck::Pending,
        Some(t) => classify_terminated(&t),
    }
}

/// The remote-client verdict (`LMCACHE_REMOTE=...`) of a finished check,
/// when it reported one.
pub fn remote_client_from_status(status: &ContainerStatus) -> Option<Result<(), String>> {
    let t = last_finished(status)?;
    let (verdict, cause) = result_section(t.message.as_deref()?, kernel_check::REMOTE_KEY)?;
    Some(match verdict.as_str() {
        kernel_check::RESULT_OK => Ok(()),
        _ if cause.is_empty() => Err("the remote tier's client library does not import".into()),
        _ => Err(cause),
    })
}

/// The value of `key=` in a check's termination message and the cause
/// lines under it (up to the next result line), joined with "; ".
fn result_section(message: &str, key: &str) -> Option<(String, String)> {
    fn result_line(line: &str) -> Option<(&'static str, &str)> {
        [kernel_check::RESULT_KEY, kernel_check::REMOTE_KEY]
            .into_iter()
            .find_map(|k| {
                line.strip_prefix(k)
                    .and_then(|r| r.strip_prefix('='))
                    .map(|v| (k, v.trim()))
            })
    }
    let mut lines = message.lines().map(str::trim);
    let verdict = lines.by_ref().find_map(|line| match result_line(line) {
        Some((k, v)) if k == key => Some(v.to_owned()),
        _ => None,
    })?;
    let cause: Vec<&str> = lines
        .take_while(|line| result_line(line).is_none())
        .filter(|line| !line.is_empty())
        .collect();
    Some((verdict, cause.join("; ")))
}

fn classify_terminated(t: &ContainerStateTerminated) -> KernelCheck {
    let message = t.message.as_deref().unwrap_or_default();
    let (verdict, cause) = result_section(message, kernel_check::RESULT_KEY).unzip();
    let cause = cause.unwrap_or_default();
    match verdict.as_deref() {
        Some(kernel_check::RESULT_OK) => KernelCheck::Healthy,
        Some(kernel_check::RESULT_FAILED) => KernelCheck::Failed(if cause.is_empty() {
            "lmcache native kernels failed to load".to_owned()
        } else {
            cause
        }),
        Some(kernel_check::RESULT_INCONCLUSIVE) => KernelCheck::Error(format!(
            "kernel check inconclusive: {}",
            if cause.is_empty() {
                "no cause given"
            } else {
                &cause
            }
        )),
        // The whole container was killed before the check could write.
        _ if t.reason.as_deref() == Some("OOMKilled") => KernelCheck::Error(format!(
            "kernel check was OOM-killed at its memory limit (exit {}); it needs about 690 MiB to import torch",
            t.exit_code
        )),
        _ => KernelCheck::Error(format!(
            "kernel check exited {} without a recognised result{}",
            t.exit_code,
            t.reason
                .as_deref()
                .map(|r| format!(" (reason {r})"))
                .unwrap_or_default()
        )),
    }
}

// === advisory conditions ===

/// A condition verdict: `(status, reason, message)`.
pub type Verdict = (&'static str, &'static str, String);

/// EngineKernelsHealthy over the pods this backend injected: `None` when no
/// such pod runs the check. Also returns whether Ready must be downgraded
/// (a failed check on a pod admitted in strict mode) and its message.
pub fn engine_kernels(pods: &[EnginePod]) -> (Option<Verdict>, Option<String>) {
    let checked: Vec<(&EnginePod, &KernelCheck)> = pods
        .iter()
        .filter(|p| p.injected_by_this)
        .filter_map(|p| p.kernel_check.as_ref().map(|k| (p, k)))
        .collect();
    if checked.is_empty() {
        return (None, None);
    }
    let failed: Vec<String> = checked
        .iter()
        .filter_map(|(p, k)| match k {
            KernelCheck::Failed(cause) => Some(format!("{}: {cause}", p.name)),
            _ => None,
        })
        .collect();
    let strict_failed: Vec<&str> = checked
        .iter()
        .filter(|(p, k)| {
            matches!(k, KernelCheck::Failed(_))
                && p.admitted_kernel_mode.as_deref() == Some(kernel_check::STRICT)
        })
        .map(|(p, _)| p.name.as_str())
        .collect();
    let downgrade = (!strict_failed.is_empty()).then(|| {
        format!(
            "lmcache native kernels failed to load on strict-mode engine pod(s) {}; see EngineKernelsHealthy",
            strict_failed.join(", ")
        )
    });
    if !failed.is_empty() {
        return (
            Some((
                "False",
                reasons::KERNEL_LOAD_FAILED,
                format!(
                    "lmcache native kernels failed to load on {}",
                    failed.join("; ")
                ),
            )),
            downgrade,
        );
    }
    let errors: Vec<String> = checked
        .iter()
        .filter_map(|(p, k)| match k {
            KernelCheck::Error(m) => Some(format!("{}: {m}", p.name)),
            _ => None,
        })
        .collect();
    if !errors.is_empty() {
        return (
            Some(("Unknown", reasons::KERNEL_CHECK_ERROR, errors.join("; "))),
            None,
        );
    }
    let pending: Vec<&str> = checked
        .iter()
        .filter(|(_, k)| matches!(k, KernelCheck::Pending))
        .map(|(p, _)| p.name.as_str())
        .collect();
    if !pending.is_empty() {
        return (
            Some((
                "Unknown",
                reasons::KERNEL_CHECK_PENDING,
                format!("kernel check still running on {}", pending.join(", ")),
            )),
            None,
        );
    }
    (
        Some((
            "True",
            reasons::KERNELS_HEALTHY,
            // The check runs in a CPU-only init container: it proves the
            // extension links against the image's torch, not that it runs
            // on the node's GPU and driver.
            format!(
                "lmcache native kernels load against the image's torch on {} engine pod(s) \
                 (a CPU-only import check: it does not prove they run on the node's GPU and driver)",
                checked.len()
            ),
        )),
        None,
    )
}

/// EngineCompatibility: False/InjectedEngineCrashLooping while an engine this
/// backend injected is in CrashLoopBackOff, else False/RemoteClientMissing
/// while an injected engine image lacks the bound remote tier's client;
/// `None` (absent) otherwise.
pub fn engine_compatibility(pods: &[EnginePod]) -> Option<Verdict> {
    let looping: Vec<&str> = pods
        .iter()
        .filter(|p| p.injected_by_this && p.engine_crash_looping)
        .map(|p| p.name.as_str())
        .collect();
    let missing: Vec<String> = pods
        .iter()
        .filter(|p| p.injected_by_this)
        .filter_map(|p| match &p.remote_client {
            Some(Err(cause)) => Some(format!("{}: {cause}", p.name)),
            _ => None,
        })
        .collect();
    if looping.is_empty() && !missing.is_empty() {
        return Some((
            "False",
            reasons::REMOTE_CLIENT_MISSING,
            format!("tier 2 does nothing on {}", missing.join("; ")),
        ));
    }
    (!looping.is_empty()).then(|| {
        (
            "False",
            reasons::INJECTED_ENGINE_CRASH_LOOPING,
            format!(
                "injected engine pod(s) {} are in CrashLoopBackOff after KV-connector injection; check the engine logs. \
                 If the model is hybrid-attention (e.g. Qwen3-Next, Mamba/Jamba), set spec.integration.mode: EventsOnly",
                looping.join(", ")
            ),
        )
    })
}

/// How to read `indexParticipation.t2HitRate`.
#[derive(Debug, Clone, PartialEq)]
pub enum T2Verdict {
    /// Unset: tier 2 never exercised; the condition is absent.
    Absent,
    /// A verdict to publish.
    Publish(Verdict),
    /// Not a number: keep whatever was published.
    Unreadable,
}

/// T2Degraded from the tier-2 hit rate.
pub fn t2_degraded(t2_hit_rate: Option<&str>) -> T2Verdict {
    let Some(raw) = t2_hit_rate else {
        return T2Verdict::Absent;
    };
    match raw.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate <= 0.0 => T2Verdict::Publish((
            "True",
            reasons::T2_ZERO_HIT_RATE,
            "tier 2 was queried but served zero reloads (store/connection failure, under-sized remote server, or a hash mismatch)".to_owned(),
        )),
        Ok(rate) if rate.is_finite() => T2Verdict::Publish((
            "False",
            reasons::T2_SERVING,
            format!("tier 2 is serving reloads (hit rate {raw})"),
        )),
        _ => T2Verdict::Unreadable,
    }
}

// === engine-pod events ===

/// The `(namespace, name)` an injected pod's `injected-by` names.
pub fn injected_by(annotations_: Option<&BTreeMap<String, String>>) -> Option<(String, String)> {
    let value = annotations_?.get(annotations::INJECTED_BY)?;
    let (ns, name) = value.split_once('/')?;
    (!ns.is_empty() && !name.is_empty()).then(|| (ns.to_owned(), name.to_owned()))
}

/// The Event the pod-watching controller records on an engine pod.
/// `live_uid` is the metadata.uid of the CacheBackend that `injected-by`
/// names, `None` when it was not found. InjectedByCacheBackend requires the
/// UID annotation to equal it; SkippedByOperator requires both a truthy
/// skip-inject and the webhook's skipped marker.
pub fn engine_pod_event(
    annotations_: Option<&BTreeMap<String, String>>,
    live_uid: Option<&str>,
) -> Option<EventToRecord> {
    let ann = annotations_?;
    let skip = ann
        .get(annotations::SKIP_INJECT)
        .is_some_and(|v| is_truthy(v));
    let marker = ann.get(annotations::INJECT_SKIPPED).map(String::as_str)
        == Some(annotations::INJECT_SKIPPED_BY_ANNOTATION);
    if skip && marker {
        return Some(EventToRecord {
            type_: EventType::Normal,
            reason: events::SKIPPED_BY_OPERATOR.to_owned(),
            message: "cache wiring skipped: the pod opts out with inferencecache.io/skip-inject"
                .to_owned(),
        });
    }
    let by = ann.get(annotations::INJECTED_BY)?;
    injected_by(Some(ann))?;
    let uid = ann.get(annotations::INJECTED_BY_UID)?;
    let live = live_uid?;
    (!uid.is_empty() && uid == live).then(|| EventToRecord {
        type_: EventType::Normal,
        reason: events::INJECTED_BY_CACHE_BACKEND.to_owned(),
        message: format!("engine wired to CacheBackend {by}"),
    })
}
