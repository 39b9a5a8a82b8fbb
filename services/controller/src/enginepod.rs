//! The engine-pod events controller: after a pod is created, records
//! `InjectedByCacheBackend` (the pod's injected-by-uid matches the live
//! CacheBackend) or `SkippedByOperator` (explicit opt-out plus the webhook's
//! marker) on the pod, once per pod, as decided by
//! `ic_controller_core::observe::engine_pod_event`. The live backend comes
//! from the CacheBackend store (a GET only when the store has not seen it
//! yet); what was recorded is pruned to the pods the Pod store still holds.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use ic_api::cachebackend::CacheBackend;
use ic_controller_core::event::EventType;
use ic_controller_core::observe;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType as KubeEventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;

use crate::kubeutil;
use crate::metrics::Metrics;

/// Metric label of this controller.
pub const CONTROLLER: &str = "enginepod";

/// Shared state.
pub struct PodEventsContext {
    /// API client.
    pub client: kube::Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Metrics,
    backends: Store<CacheBackend>,
    recorded: Mutex<HashSet<(String, String)>>,
}

impl std::fmt::Debug for PodEventsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodEventsContext").finish_non_exhaustive()
    }
}

impl PodEventsContext {
    /// A context that has recorded nothing yet.
    pub fn new(
        client: kube::Client,
        recorder: Recorder,
        metrics: Metrics,
        backends: Store<CacheBackend>,
    ) -> Self {
        Self {
            client,
            recorder,
            metrics,
            backends,
            recorded: Mutex::new(HashSet::new()),
        }
    }

    /// How many (pod, reason) Events this context remembers.
    pub fn recorded(&self) -> usize {
        self.recorded.lock().len()
    }

    /// Forgets the Events of pods `pods` no longer holds (deleted pods never
    /// reach reconcile, so without this the set would only grow).
    pub fn forget_deleted(&self, pods: &Store<Pod>) {
        let live: HashSet<String> = pods
            .state()
            .iter()
            .map(|p| p.metadata.uid.clone().unwrap_or_else(|| p.name_any()))
            .collect();
        self.recorded.lock().retain(|(uid, _)| live.contains(uid));
    }

    /// The uid of the live CacheBackend `ns/name`.
    async fn live_uid(&self, ns: &str, name: &str) -> Result<Option<String>, kube::Error> {
        if let Some(b) = self.backends.get(&ObjectRef::new(name).within(ns)) {
            return Ok(b.metadata.uid.clone());
        }
        // Created moments before the pod and not yet watched: ask once.
        Ok(Api::<CacheBackend>::namespaced(self.client.clone(), ns)
            .get_opt(name)
            .await?
            .and_then(|b| b.metadata.uid))
    }
}

/// Reconciles one pod: records its Event once. Non-NotFound lookup errors
/// are returned so the controller retries with backoff.
pub async fn reconcile(pod: Arc<Pod>, ctx: Arc<PodEventsContext>) -> Result<Action, kube::Error> {
    let started = Instant::now();
    let result = reconcile_inner(&pod, &ctx).await;
    ctx.metrics
        .observe(CONTROLLER, result.is_ok(), started.elapsed().as_secs_f64());
    result
}

#[tracing::instrument(name = "reconcile", level = "debug", skip_all, fields(controller = CONTROLLER, ns = pod.metadata.namespace.as_deref().unwrap_or_default(), name = pod.metadata.name.as_deref().unwrap_or_default()))]
async fn reconcile_inner(pod: &Pod, ctx: &PodEventsContext) -> Result<Action, kube::Error> {
    let annotations = pod.metadata.annotations.as_ref();
    let live_uid = match observe::injected_by(annotations) {
        Some((ns, name)) => ctx.live_uid(&ns, &name).await?,
        None => None,
    };
    let Some(decision) = observe::engine_pod_event(annotations, live_uid.as_deref()) else {
        return Ok(Action::await_change());
    };
    let key = (
        pod.metadata.uid.clone().unwrap_or_else(|| pod.name_any()),
        decision.reason.clone(),
    );
    if !ctx.recorded.lock().insert(key.clone()) {
        return Ok(Action::await_change());
    }
    let event = Event {
        type_: match decision.type_ {
            EventType::Normal => KubeEventType::Normal,
            EventType::Warning => KubeEventType::Warning,
        },
        reason: decision.reason,
        note: Some(decision.message),
        action: "Admission".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &pod.object_ref(&())).await {
        ctx.recorded.lock().remove(&key);
        return Err(e);
    }
    Ok(Action::await_change())
}

/// Counts the error and retries.
pub fn error_policy(_pod: Arc<Pod>, error: &kube::Error, ctx: Arc<PodEventsContext>) -> Action {
    ctx.metrics.error(CONTROLLER, kubeutil::reason(error));
    Action::requeue(std::time::Duration::from_secs(10))
}
