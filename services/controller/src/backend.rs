//! The CacheBackend reconciler: renders and server-side applies the managed
//! provider objects (`ic_adapters::providers`), sheds the ones the spec no
//! longer asks for, gathers what `ic_controller_core::status::decide` needs
//! (workload rollout, Service endpoint, cache-server pods, engine pods,
//! probe outcome), then applies its decision: cascade restarts, the status
//! (only when changed, without the poller-owned indexParticipation), Events,
//! and the requeue hint.
//!
//! Reads come from the watch-fed [`Stores`] (read → decide → write): pods
//! and Deployments from their namespace- and label-keyed index, shed
//! candidates by name. The only API calls a reconcile makes are the writes
//! it decides on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ic_adapters::providers::{self, ObjectRef, OwnedKind, Workload};
use ic_api::cachebackend::CacheBackend;
use ic_controller_core::cascade::CascadeRateLimiter;
use ic_controller_core::clock::{Clock, ClockExt};
use ic_controller_core::event::EventType;
use ic_controller_core::gates::{self, ProbeOutcome, ProbeRateLimiter};
use ic_controller_core::k8s;
use ic_controller_core::observe::{self, BackendRef};
use ic_controller_core::status::{
    self, BackendShape, EngineObservation, Observed, ServerPods, WorkloadState,
};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType as KubeEventType, Recorder};
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::kubeutil::{self, MANAGER};
use crate::metrics::{ControllerLabel, Metrics};
use crate::stores::Stores;
use kube::runtime::reflector::{self, Store};

/// Metric label of this controller.
pub const CONTROLLER: &str = "cachebackend";

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The API server refused a read or write.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The provider objects could not be rendered.
    #[error("rendering provider objects: {0}")]
    Render(#[from] providers::RenderError),
    /// The API server refused a provider object as rendered (an admission
    /// policy, a quota, a field it rejects): retrying as is cannot help.
    #[error("the API server refused {kind} {name}: {message}")]
    Refused {
        /// The object's kind.
        kind: String,
        /// Its name.
        name: String,
        /// What the API server said.
        message: String,
    },
    /// An object lacks namespace or name.
    #[error("object has no namespace or name")]
    Unnamed,
}

impl ReconcileError {
    /// Fixed metric reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Kube(e) => kubeutil::reason(e),
            Self::Render(_) => "render",
            Self::Refused { .. } => "refused",
            Self::Unnamed => "invalid_object",
        }
    }

    /// Whether the backend's current spec cannot be provisioned as it is
    /// (published on its status), rather than a failure worth retrying
    /// quietly.
    fn refuses_the_spec(&self) -> bool {
        matches!(self, Self::Render(_) | Self::Refused { .. })
    }
}

/// What the reconciler shares across reconciles.
pub struct BackendContext {
    /// API client.
    pub client: kube::Client,
    /// Event recorder.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Metrics,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// HTTP client for /probe.
    pub http: reqwest::Client,
    /// `/probe` URL; empty disables the functional-probe gate.
    pub probe_url: String,
    /// Bearer token file for /probe.
    pub probe_token_path: std::path::PathBuf,
    /// `--kvevent-subscriber-image` is set.
    pub subscriber_image_configured: bool,
    /// The watch-fed view of the cluster.
    pub stores: Stores,
    probes: Mutex<ProbeRateLimiter>,
    cascades: Mutex<CascadeRateLimiter>,
    shapes: Mutex<HashMap<String, BackendShape>>,
}

impl std::fmt::Debug for BackendContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendContext")
            .field("probe_url", &self.probe_url)
            .finish_non_exhaustive()
    }
}

impl BackendContext {
    /// A context with empty limiters.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: kube::Client,
        recorder: Recorder,
        metrics: Metrics,
        clock: Arc<dyn Clock>,
        http: reqwest::Client,
        probe_url: String,
        probe_token_path: std::path::PathBuf,
        subscriber_image_configured: bool,
        stores: Stores,
    ) -> Self {
        Self {
            client,
            recorder,
            metrics,
            clock,
            http,
            probe_url,
            probe_token_path,
            subscriber_image_configured,
            stores,
            probes: Mutex::new(ProbeRateLimiter::default()),
            cascades: Mutex::new(CascadeRateLimiter::default()),
            shapes: Mutex::new(HashMap::new()),
        }
    }
}

impl BackendContext {
    /// How many backends this context holds per-backend memory for.
    pub fn tracked_backends(&self) -> usize {
        self.shapes.lock().len()
    }

    /// Drops the per-backend memory (rate limiters, last shape) of every
    /// backend not in `live` (`<namespace>/<name>` keys): deletions never
    /// reach `reconcile`, so without this the maps would only ever grow.
    pub fn forget_deleted(&self, live: &std::collections::HashSet<String>) {
        let gone: Vec<String> = self
            .shapes
            .lock()
            .keys()
            .filter(|k| !live.contains(*k))
            .cloned()
            .collect();
        for key in &gone {
            self.shapes.lock().remove(key);
            self.probes.lock().forget(key);
            self.cascades.lock().forget(key);
        }
        // A deleted Degraded backend's series goes with it, whether or not
        // the index server's snapshot (whose poll also prunes it) answers.
        self.metrics
            .retain_degraded_backends(&live.iter().cloned().collect());
    }
}

/// Server-side applies `object`; a refusal of the object itself (400 Bad
/// Request, 403 Forbidden, 422 Invalid: an admission webhook's denial, an
/// exceeded quota, a field the API server rejects) is told apart from a
/// failure to reach the API server.
async fn apply<K>(api: &Api<K>, object: &K) -> Result<K, ReconcileError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let name = object.meta().name.clone().unwrap_or_default();
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(|e| match e {
        kube::Error::Api(status) if matches!(status.code, 400 | 403 | 422) => {
            ReconcileError::Refused {
                kind: K::kind(&()).into_owned(),
                name,
                message: status.message,
            }
        }
        other => ReconcileError::Kube(other),
    })
}

/// The objects of one kind named in `names` that this backend owns (a
/// same-named object someone else created is left alone), as the store
/// shows them: controller-managed, in `ns`, owned by `owner_uid`; sorted by
/// name. Looked up by name: the names are all a backend could own.
pub fn shed_candidates<K>(
    store: &Store<K>,
    ns: &str,
    names: &[&str],
    owner_uid: &str,
) -> Vec<String>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut names = names.to_vec();
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .filter(|name| {
            let Some(object) = store.get(&reflector::ObjectRef::new(name).within(ns)) else {
                return false;
            };
            let meta = object.meta();
            let managed = meta
                .labels
                .as_ref()
                .and_then(|l| l.get(ic_api::consts::labels::MANAGED_BY))
                .is_some_and(|v| v == ic_api::consts::labels::MANAGED_BY_VALUE);
            let owned = meta
                .owner_references
                .as_ref()
                .is_some_and(|o| o.iter().any(|r| r.uid == owner_uid));
            managed && owned
        })
        .map(str::to_owned)
        .collect()
}

/// Deletes the [`shed_candidates`] of one kind.
async fn shed_kind<K>(
    api: Api<K>,
    store: &Store<K>,
    ns: &str,
    names: &[&str],
    owner_uid: &str,
) -> Result<Vec<String>, kube::Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug + 'static,
{
    let mut deleted = Vec::new();
    for name in shed_candidates(store, ns, names, owner_uid) {
        match api.delete(&name, &DeleteParams::background()).await {
            Ok(_) => deleted.push(name),
            Err(e) if kubeutil::is_not_found(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(deleted)
}

async fn shed(
    client: &kube::Client,
    stores: &Stores,
    ns: &str,
    uid: &str,
    refs: &[ObjectRef],
) -> Result<(), kube::Error> {
    for kind in OwnedKind::ALL {
        let names: Vec<&str> = refs
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| r.name.as_str())
            .collect();
        if names.is_empty() {
            continue;
        }
        let c = client.clone();
        let deleted = match kind {
            OwnedKind::Deployment => {
                let api = Api::<Deployment>::namespaced(c, ns);
                shed_kind(api, &stores.deployments, ns, &names, uid).await?
            }
            OwnedKind::StatefulSet => {
                let api = Api::<StatefulSet>::namespaced(c, ns);
                shed_kind(api, &stores.statefulsets, ns, &names, uid).await?
            }
            OwnedKind::Service => {
                let api = Api::<Service>::namespaced(c, ns);
                shed_kind(api, &stores.services, ns, &names, uid).await?
            }
            OwnedKind::HorizontalPodAutoscaler => {
                let api = Api::<HorizontalPodAutoscaler>::namespaced(c, ns);
                shed_kind(api, &stores.hpas, ns, &names, uid).await?
            }
        };
        for name in deleted {
            tracing::info!(ns = %ns, kind = kind.kind(), name = %name, "shed a provider object");
        }
    }
    Ok(())
}

/// Applies the managed objects; returns the live workload, the Service
/// endpoint and the cache-server pods.
async fn provision(
    ctx: &BackendContext,
    backend: &CacheBackend,
    ns: &str,
    name: &str,
) -> Result<(Option<WorkloadState>, Option<String>, Option<ServerPods>), ReconcileError> {
    let rendered = providers::render(backend)?;
    let uid = backend.metadata.uid.clone().unwrap_or_default();
    shed(&ctx.client, &ctx.stores, ns, &uid, &rendered.shed).await?;
    let Some(managed) = rendered.managed else {
        return Ok((None, None, None));
    };
    let c = ctx.client.clone();
    let (state, template_containers) = match &managed.workload {
        Workload::Deployment(d) => {
            let live = apply(&Api::<Deployment>::namespaced(c.clone(), ns), d).await?;
            (
                k8s::workload_from_deployment(&live),
                k8s::template_containers(d.spec.as_ref().map(|s| &s.template)),
            )
        }
        Workload::StatefulSet(s) => {
            let live = apply(&Api::<StatefulSet>::namespaced(c.clone(), ns), s).await?;
            (
                k8s::workload_from_statefulset(&live),
                k8s::template_containers(s.spec.as_ref().map(|s| &s.template)),
            )
        }
    };
    let service = apply(&Api::<Service>::namespaced(c.clone(), ns), &managed.service).await?;
    if let Some(hpa) = &managed.hpa {
        apply(
            &Api::<HorizontalPodAutoscaler>::namespaced(c.clone(), ns),
            hpa,
        )
        .await?;
    }
    let selector = providers::selector_labels(name, managed.provider);
    let pods = ctx.stores.index.pods.matching(ns, Some(&selector));
    let server_pods = Some(k8s::server_pods(template_containers, &pods));
    Ok((
        Some(state),
        providers::service_endpoint(&service),
        server_pods,
    ))
}

/// Engine pods of the namespace that match the selector or were injected by
/// this backend, plus the desired replicas of matching engine Deployments.
pub fn engines(stores: &Stores, backend: &CacheBackend, ns: &str) -> EngineObservation {
    let uid = backend.metadata.uid.clone().unwrap_or_default();
    let name = backend.name_any();
    let labels = backend
        .spec
        .engine_selector
        .as_ref()
        .map(|s| &s.match_labels);
    let r = BackendRef {
        namespace: ns,
        name: &name,
        uid: &uid,
        match_labels: labels,
    };
    let injected_by = format!("{ns}/{name}");
    let pods = stores
        .index
        .pods
        .matching_or_injected(ns, labels, &injected_by)
        .iter()
        .map(|p| observe::summarize_pod(p, r))
        .filter(|p| p.matches_selector || p.injected_by_this)
        .collect();
    let deployments = stores.index.deployments.matching(ns, labels);
    EngineObservation {
        pods,
        expected_replicas: k8s::expected_engine_replicas(labels, &deployments),
    }
}

/// The controller's token for the index server: a small projected-token
/// file, read again on every call so the kubelet's rotation is picked up.
pub fn read_token(path: &std::path::Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_owned())
        .map_err(|e| format!("reading the token {}: {e}", path.display()))
}

/// Calls `/probe` for one backend.
pub async fn call_probe(ctx: &BackendContext, ns: &str, name: &str) -> ProbeOutcome {
    let token = match read_token(&ctx.probe_token_path) {
        Ok(t) => t,
        Err(e) => return ProbeOutcome::TransportError(e),
    };
    let response = ctx
        .http
        .post(&ctx.probe_url)
        .bearer_auth(token)
        .json(&json!({"namespace": ns, "backend": name}))
        .timeout(Duration::from_secs(10))
        .send()
        .await;
    match response {
        Ok(r) => {
            let code = r.status().as_u16();
            match r.bytes().await {
                Ok(body) => gates::parse_probe_response(code, &body),
                Err(e) => ProbeOutcome::TransportError(e.to_string()),
            }
        }
        Err(e) => ProbeOutcome::TransportError(e.to_string()),
    }
}

/// Reconciles one CacheBackend.
pub async fn reconcile(
    backend: Arc<CacheBackend>,
    ctx: Arc<BackendContext>,
) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let depth = ctx
        .metrics
        .queue_depth
        .get_or_create(&ControllerLabel {
            controller: CONTROLLER,
        })
        .clone();
    depth.inc();
    let result = reconcile_inner(&backend, &ctx).await;
    depth.dec();
    ctx.metrics
        .observe(CONTROLLER, result.is_ok(), started.elapsed().as_secs_f64());
    result
}

#[tracing::instrument(name = "reconcile", skip_all, fields(controller = CONTROLLER, ns = backend.namespace().unwrap_or_default(), name = %backend.name_any()))]
async fn reconcile_inner(
    backend: &CacheBackend,
    ctx: &BackendContext,
) -> Result<Action, ReconcileError> {
    let (Some(ns), Some(name)) = (
        backend.metadata.namespace.clone(),
        backend.metadata.name.clone(),
    ) else {
        return Err(ReconcileError::Unnamed);
    };
    let key = format!("{ns}/{name}");
    // The CacheBackend store is ready before the first reconcile; the
    // others may still be on their first LIST.
    if ctx.stores.synced().await.is_err() {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let (workload, service_endpoint, server_pods) = match provision(ctx, backend, &ns, &name).await
    {
        Ok(provisioned) => provisioned,
        Err(error) => {
            if error.refuses_the_spec() {
                // Said on the backend itself; the error backoff retries.
                let decision =
                    status::provisioning_failed(backend, ctx.clock.now(), &error.to_string());
                publish(ctx, backend, &ns, &name, &decision).await?;
            }
            return Err(error);
        }
    };
    let engines = Some(engines(&ctx.stores, backend, &ns));
    let now = ctx.clock.now();
    let mut observed = Observed {
        now,
        workload,
        service_endpoint,
        server_pods,
        engines,
        probe: gates::ProbeInput {
            enabled: !ctx.probe_url.is_empty(),
            outcome: None,
            next_allowed_at: ctx.probes.lock().next_allowed(&key),
        },
        subscriber_image_configured: ctx.subscriber_image_configured,
        previous_shape: ctx.shapes.lock().get(&key).copied(),
        cascade_not_before: ctx.cascades.lock().not_before(&key),
    };
    let mut decision = status::decide(backend, &observed);
    if decision.probe_wanted && ctx.probes.lock().try_acquire(&key, now).is_ok() {
        observed.probe.outcome = Some(call_probe(ctx, &ns, &name).await);
        observed.probe.next_allowed_at = ctx.probes.lock().next_allowed(&key);
        decision = status::decide(backend, &observed);
    }
    if let Some(plan) = &decision.cascade {
        let api = Api::<Deployment>::namespaced(ctx.client.clone(), &ns);
        for deployment in &plan.deployments {
            let patch = json!({"spec": {"template": {"metadata": {"annotations": {plan.annotation: plan.trigger}}}}});
            api.patch(deployment, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            tracing::info!(ns = %ns, name = %name, deployment = %deployment, "cascade-restarted an engine Deployment");
        }
        ctx.cascades.lock().record(&key, now);
    }
    publish(ctx, backend, &ns, &name, &decision).await?;
    ctx.shapes.lock().insert(key.clone(), decision.shape);
    if decision.shape != BackendShape::Managed {
        ctx.probes.lock().forget(&key);
        ctx.cascades.lock().forget(&key);
    }
    Ok(Action::requeue(decision.requeue_after))
}

/// Writes the decision's status (when it changed) and records its Events.
async fn publish(
    ctx: &BackendContext,
    backend: &CacheBackend,
    ns: &str,
    name: &str,
    decision: &status::Decision,
) -> Result<(), ReconcileError> {
    let degraded = decision
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == ic_api::consts::conditions::DEGRADED && c.status == "True")
        .map(|c| c.reason.as_str());
    ctx.metrics
        .set_backend_degraded(&format!("{ns}/{name}"), degraded);
    if status::status_changed(backend.status.as_ref(), &decision.status) {
        let mut body = serde_json::to_value(&decision.status).unwrap_or_default();
        if let Some(m) = body.as_object_mut() {
            // The poller's field: never claimed by this manager.
            m.remove("indexParticipation");
        }
        let api = Api::<CacheBackend>::namespaced(ctx.client.clone(), ns);
        kubeutil::apply_status(&api, name, MANAGER, &body).await?;
    }
    let reference = backend.object_ref(&());
    for e in &decision.events {
        let event = Event {
            type_: match e.type_ {
                EventType::Normal => KubeEventType::Normal,
                EventType::Warning => KubeEventType::Warning,
            },
            reason: e.reason.clone(),
            note: Some(e.message.clone()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(err) = ctx.recorder.publish(&event, &reference).await {
            tracing::warn!(error = %err, reason = %e.reason, "recording an Event failed");
        }
    }
    Ok(())
}

/// Counts the error and retries after a short backoff.
pub fn error_policy(
    backend: Arc<CacheBackend>,
    error: &ReconcileError,
    ctx: Arc<BackendContext>,
) -> Action {
    ctx.metrics.error(CONTROLLER, error.reason());
    tracing::warn!(error = %error, ns = backend.namespace().unwrap_or_default(), name = %backend.name_any(), "reconcile failed");
    Action::requeue(Duration::from_secs(10))
}
