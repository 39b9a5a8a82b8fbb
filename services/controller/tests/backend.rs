//! CacheBackend reconciler stories on the fake API server with a manual
//! clock (no sleeps), and the real index server's /probe where a story
//! needs it.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use ic_api::cachebackend::CacheBackend;
use ic_controller::backend::{self, BackendContext};
use ic_controller::kubeutil;
use ic_controller::stores::StoreWriters;
use ic_controller_core::clock::{Clock, ClockExt, ManualClock};
use ic_fake_apiserver::FakeApi;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};

const V: &str = "inferencecache.io/v1alpha1";
const NS: &str = "team-a";

fn managed_backend() -> CacheBackend {
    let mut b: CacheBackend = serde_json::from_value(json!({
        "apiVersion": V, "kind": "CacheBackend",
        "metadata": {"name": "cache", "namespace": NS},
        "spec": {"runtime": "VLLM", "type": "LMCache",
                 "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
                 "integration": {"mode": "Offload", "role": "ReadWrite", "failOpen": true},
                 "observation": {"modelID": "m", "firstEventTimeout": "5m"},
                 "engineSelector": {"matchLabels": {"app": "llm"}}}
    }))
    .unwrap();
    b.metadata.namespace = Some(NS.into());
    b
}

struct Story {
    fake: FakeApi,
    clock: Arc<ManualClock>,
    ctx: Arc<BackendContext>,
    writers: parking_lot::Mutex<StoreWriters>,
}

impl Story {
    fn new(probe_url: &str, token_path: std::path::PathBuf) -> Self {
        let fake = FakeApi::new();
        let clock = common::clock();
        let (_registry, metrics) = common::metrics();
        let client = fake.client();
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "ic-controller".into(),
                instance: None,
            },
        );
        let dyn_clock: Arc<dyn Clock> = clock.clone();
        let (stores, writers) = ic_controller::stores::detached();
        let ctx = Arc::new(BackendContext::new(
            client,
            recorder,
            metrics,
            dyn_clock,
            reqwest::Client::new(),
            probe_url.into(),
            token_path,
            true,
            stores,
        ));
        Self {
            fake,
            clock,
            ctx,
            writers: parking_lot::Mutex::new(writers),
        }
    }

    fn backend(&self) -> CacheBackend {
        self.fake.get(V, "cachebackends", NS, "cache").unwrap()
    }

    async fn reconcile(&self) -> CacheBackend {
        common::refill(&mut self.writers.lock(), &self.fake);
        backend::reconcile(Arc::new(self.backend()), self.ctx.clone())
            .await
            .unwrap();
        self.backend()
    }

    fn deployment_name(&self) -> String {
        ic_adapters::providers::object_name("cache", ic_api::cachebackend::StorageProvider::Redis)
    }

    /// The provider Deployment reports a complete rollout of its replicas.
    fn roll_out(&self) {
        let name = self.deployment_name();
        let mut d: Value = self.fake.get("apps/v1", "deployments", NS, &name).unwrap();
        let generation = d["metadata"]["generation"].clone();
        let n = d["spec"]["replicas"].as_i64().unwrap_or(1);
        d["status"] = json!({"replicas": n, "readyReplicas": n, "updatedReplicas": n,
            "availableReplicas": n, "observedGeneration": generation,
            "conditions": [{"type": "Available", "status": "True"}]});
        self.fake.insert(&d);
    }

    /// The poller reports a KV event for the backend.
    async fn first_event(&self) {
        let api: Api<CacheBackend> = Api::namespaced(self.fake.client(), NS);
        let at = ic_controller_core::clock::to_time(self.clock.now());
        kubeutil::apply_status(
            &api,
            "cache",
            kubeutil::POLLER_MANAGER,
            &json!({"indexParticipation": {"prefixCount": 1, "lastEventAt": at}}),
        )
        .await
        .unwrap();
    }

    fn event_reasons(&self) -> Vec<String> {
        let events: Vec<k8s_openapi::api::events::v1::Event> = self.fake.list("events");
        events.into_iter().filter_map(|e| e.reason).collect()
    }
}

fn condition(b: &CacheBackend, t: &str) -> (String, String) {
    let c = b
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.type_ == t)
        .unwrap_or_else(|| panic!("no {t} condition in {:?}", b.status));
    (c.status.clone(), c.reason.clone())
}

fn pair(s: &str, r: &str) -> (String, String) {
    (s.into(), r.into())
}

#[tokio::test]
async fn rollout_then_first_event_is_ready_and_writes_are_exact() {
    let story = Story::new("", "/nonexistent".into());
    story.fake.insert(&managed_backend());
    story
        .fake
        .insert(&common::pod(NS, "engine-0", &[("app", "llm")], &[]));

    let b = story.reconcile().await;
    let d: Deployment = story
        .fake
        .get("apps/v1", "deployments", NS, &story.deployment_name())
        .unwrap();
    assert_eq!(
        d.metadata.owner_references.unwrap()[0].uid,
        b.metadata.uid.clone().unwrap(),
        "owned by the backend"
    );
    let _svc: Service = story
        .fake
        .get("v1", "services", NS, &story.deployment_name())
        .unwrap();
    assert_eq!(condition(&b, "Ready").0, "False");
    assert_eq!(b.status.as_ref().unwrap().matched_engine_pods, Some(1));
    assert!(b.status.as_ref().unwrap().endpoint.is_some());

    // Every child and the status go through SSA with the controller's manager.
    for w in story
        .fake
        .writes()
        .iter()
        .filter(|w| w.method == http::Method::PATCH)
    {
        assert_eq!(
            w.query.get("fieldManager").map(String::as_str),
            Some("ic-controller"),
            "{w:?}"
        );
        assert_eq!(
            w.query.get("force").map(String::as_str),
            Some("true"),
            "{w:?}"
        );
        assert_eq!(
            w.content_type.as_deref(),
            Some("application/apply-patch+yaml")
        );
    }
    let status_write = story
        .fake
        .writes()
        .into_iter()
        .find(|w| w.path.ends_with("/cachebackends/cache/status"))
        .unwrap();
    assert!(
        status_write.body["status"]
            .get("indexParticipation")
            .is_none()
    );

    story.roll_out();
    let b = story.reconcile().await;
    assert_eq!(
        condition(&b, "Ready"),
        pair("False", "AwaitingFirstKVEvent")
    );
    assert!(b.status.as_ref().unwrap().first_available_at.is_some());

    // Nothing changed: no status write on a steady reconcile.
    story.fake.clear_requests();
    let _ = story.reconcile().await;
    assert!(
        !story
            .fake
            .writes()
            .iter()
            .any(|w| w.path.ends_with("/status")),
        "{:?}",
        story.fake.writes()
    );

    story.first_event().await;
    let b = story.reconcile().await;
    assert_eq!(condition(&b, "Ready"), pair("True", "KVEventsObserved"));
    assert_eq!(condition(&b, "Degraded").0, "False");
    assert!(
        b.status
            .as_ref()
            .unwrap()
            .first_kv_event_observed_at
            .is_some()
    );
    assert!(
        b.status.as_ref().unwrap().index_participation.is_some(),
        "the poller's field survives the reconciler's status apply"
    );
    let reasons = story.event_reasons();
    assert!(
        reasons.contains(&"KVEventsObserved".to_owned()),
        "{reasons:?}"
    );
}

#[tokio::test]
async fn timeout_degrades_then_an_event_recovers() {
    let story = Story::new("", "/nonexistent".into());
    story.fake.insert(&managed_backend());
    story.reconcile().await;
    story.roll_out();
    let b = story.reconcile().await;
    assert_eq!(
        condition(&b, "Ready"),
        pair("False", "AwaitingFirstKVEvent")
    );

    story.clock.advance(Duration::from_secs(6 * 60));
    let b = story.reconcile().await;
    assert_eq!(condition(&b, "Ready"), pair("False", "NoKVEventsObserved"));
    assert_eq!(
        condition(&b, "Degraded"),
        pair("True", "NoKVEventsObserved")
    );
    assert!(
        story
            .event_reasons()
            .contains(&"NoKVEventsObserved".to_owned())
    );

    story.first_event().await;
    let b = story.reconcile().await;
    assert_eq!(condition(&b, "Ready"), pair("True", "KVEventsObserved"));
    assert_eq!(condition(&b, "Degraded").0, "False");
}

#[tokio::test]
async fn a_deleted_degraded_backend_takes_its_degraded_series_along() {
    let story = Story::new("", "/nonexistent".into());
    story.fake.insert(&managed_backend());
    story.reconcile().await;
    story.roll_out();
    story.reconcile().await;
    story.clock.advance(Duration::from_secs(6 * 60));
    let b = story.reconcile().await;
    assert_eq!(
        condition(&b, "Degraded"),
        pair("True", "NoKVEventsObserved")
    );
    let series = ic_controller::metrics::BackendReasonLabels {
        backend: format!("{NS}/cache"),
        reason: "NoKVEventsObserved".into(),
    };
    let degraded = |story: &Story| {
        story
            .ctx
            .metrics
            .backend_degraded
            .get(&series)
            .map(|g| g.get())
    };
    assert_eq!(degraded(&story), Some(1));
    // Deleted while no snapshot poll prunes it (index server unreachable).
    story.ctx.forget_deleted(&std::collections::HashSet::new());
    assert_eq!(degraded(&story), None);
}

#[tokio::test]
async fn deleted_backends_are_forgotten() {
    let story = Story::new("", "/nonexistent".into());
    story.fake.insert(&managed_backend());
    story.reconcile().await;
    assert_eq!(story.ctx.tracked_backends(), 1);
    let live: std::collections::HashSet<String> = [format!("{NS}/cache")].into();
    story.ctx.forget_deleted(&live);
    assert_eq!(story.ctx.tracked_backends(), 1, "a live backend is kept");
    story.ctx.forget_deleted(&std::collections::HashSet::new());
    assert_eq!(story.ctx.tracked_backends(), 0);
}

#[tokio::test]
async fn mode_flip_sheds_provider_objects() {
    let story = Story::new("", "/nonexistent".into());
    story.fake.insert(&managed_backend());
    story.reconcile().await;
    let name = story.deployment_name();
    assert!(
        story
            .fake
            .get::<Deployment>("apps/v1", "deployments", NS, &name)
            .is_some()
    );

    let mut b: Value = story.fake.get(V, "cachebackends", NS, "cache").unwrap();
    b["spec"]["integration"]["mode"] = json!("EventsOnly");
    b["spec"].as_object_mut().unwrap().remove("remoteStorage");
    story.fake.insert(&b);
    let b = story.reconcile().await;
    assert!(
        story
            .fake
            .get::<Deployment>("apps/v1", "deployments", NS, &name)
            .is_none()
    );
    assert!(
        story
            .fake
            .get::<Service>("v1", "services", NS, &name)
            .is_none()
    );
    assert_eq!(b.status.as_ref().unwrap().endpoint, None);
    assert!(
        b.status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .all(|c| c.type_ != "FunctionalProbeOK"),
        "{:?}",
        b.status
    );
}

#[tokio::test]
async fn probe_failure_is_sticky_across_a_transport_error() {
    let server = common::IndexServer::start();
    let token =
        std::env::temp_dir().join(format!("ic-controller-probe-token-{}", std::process::id()));
    std::fs::write(&token, common::PROBE_TOKEN).unwrap();
    // Break the server's routing stage for the probe's synthetic tenant.
    let mut grpc = ic_proto::IndexServiceClient::connect(server.grpc_url())
        .await
        .unwrap();
    grpc.set_policies(ic_proto::index_v1::SetPoliciesRequest {
        policies: vec![ic_proto::index_v1::NamespacePolicy {
            namespace: "~probe".into(),
            lookup_timeout_ms: 20,
            minimum_prefix_tokens: 1_000_000,
            replica_stale_after_seconds: 120,
            allow_tier2_matches: true,
            ..Default::default()
        }],
        ..Default::default()
    })
    .await
    .unwrap();
    // An open gRPC connection would hold the server's graceful shutdown.
    drop(grpc);

    let story = Story::new(&server.probe_url(), token.clone());
    story.fake.insert(&managed_backend());
    story.reconcile().await;
    story.roll_out();
    story.first_event().await;
    let b = story.reconcile().await;
    assert_eq!(
        condition(&b, "FunctionalProbeOK"),
        pair("False", "ProbeRoutingFailed")
    );
    assert_eq!(condition(&b, "Ready"), pair("False", "ProbeRoutingFailed"));

    // The server goes away; past the rate-limit window the probe errors, and
    // the known failure stays.
    let mut process = server.process;
    assert!(process.stop().success());
    story.clock.advance(Duration::from_secs(31));
    let b = story.reconcile().await;
    assert_eq!(
        condition(&b, "FunctionalProbeOK"),
        pair("False", "ProbeRoutingFailed")
    );
    assert_eq!(condition(&b, "Ready").0, "False");
    let _ = std::fs::remove_file(token);
}

fn server_pod(story: &Story, name: &str, uid: &str) -> Value {
    let d: Deployment = story
        .fake
        .get("apps/v1", "deployments", NS, &story.deployment_name())
        .unwrap();
    let container = d.spec.unwrap().template.spec.unwrap().containers[0]
        .name
        .clone();
    let labels = ic_adapters::providers::selector_labels(
        "cache",
        ic_api::cachebackend::StorageProvider::Redis,
    );
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NS, "uid": uid, "labels": labels},
           "spec": {"containers": [{"name": container}]},
           "status": {"conditions": [{"type": "Ready", "status": "True"}],
                      "containerStatuses": [{"name": container, "restartCount": 0, "ready": true,
                                             "image": "redis", "imageID": ""}]}})
}

fn restart_trigger(story: &Story) -> Option<String> {
    let d: Deployment = story
        .fake
        .get("apps/v1", "deployments", NS, "engine")
        .unwrap();
    d.spec
        .unwrap()
        .template
        .metadata
        .and_then(|m| m.annotations)
        .and_then(|a| {
            a.get(ic_api::consts::annotations::CACHE_SERVER_RESTART_TRIGGER)
                .cloned()
        })
}

#[tokio::test]
async fn cascade_on_replacement_but_not_on_a_rolling_midpoint() {
    let story = Story::new("", "/nonexistent".into());
    story.fake.insert(&managed_backend());
    let b = story.reconcile().await;
    let uid = b.metadata.uid.clone().unwrap();
    story.roll_out();
    // The engine fleet: one Deployment whose pod was injected by this backend.
    story
        .fake
        .insert(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "engine", "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llm"}},
                 "template": {"metadata": {"labels": {"app": "llm"}},
                              "spec": {"containers": [{"name": "vllm"}]}}}}));
    story.fake.insert(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "engine-5d8f7c9b6-abcde", "namespace": NS,
                     "labels": {"app": "llm", "pod-template-hash": "5d8f7c9b6"},
                     "annotations": {"inferencecache.io/injected-by": "team-a/cache",
                                     "inferencecache.io/injected-by-uid": uid},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                          "name": "engine-5d8f7c9b6", "uid": "rs", "controller": true}]},
        "spec": {"containers": [{"name": "vllm"}]}}));
    story.fake.insert(&server_pod(&story, "redis-a", "uid-a"));
    let b = story.reconcile().await;
    assert_eq!(
        b.status
            .as_ref()
            .unwrap()
            .observed_server_instance
            .as_deref(),
        Some("uid-a:0"),
        "first Ready pod: baseline, no cascade"
    );
    assert_eq!(restart_trigger(&story), None);

    // Rolling-update midpoint: a second Ready pod while the Deployment still
    // reports one replica. No cascade, baseline pinned.
    story.fake.insert(&server_pod(&story, "redis-b", "uid-b"));
    let b = story.reconcile().await;
    assert_eq!(restart_trigger(&story), None);
    assert_eq!(
        b.status
            .as_ref()
            .unwrap()
            .observed_server_instance
            .as_deref(),
        Some("uid-a:0")
    );

    // The old pod is gone: a replacement. Engines restart.
    story.fake.remove("v1", "pods", NS, "redis-a");
    let b = story.reconcile().await;
    let trigger = restart_trigger(&story).expect("engine Deployment restarted");
    assert!(trigger.contains("uid-b:0"), "{trigger}");
    assert_eq!(
        b.status
            .as_ref()
            .unwrap()
            .observed_server_instance
            .as_deref(),
        Some("uid-b:0")
    );
    let patch = story
        .fake
        .writes()
        .into_iter()
        .find(|w| w.path.ends_with("/deployments/engine"))
        .unwrap();
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
}

#[tokio::test]
async fn one_events_only_reconcile_makes_only_its_writes() {
    let story = Story::new("", "/nonexistent".into());
    let mut b: Value = serde_json::to_value(managed_backend()).unwrap();
    b["spec"]["integration"]["mode"] = json!("EventsOnly");
    b["spec"].as_object_mut().unwrap().remove("remoteStorage");
    story.fake.insert(&b);
    story.reconcile().await;
    let seen: Vec<String> = story
        .fake
        .requests()
        .iter()
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let g = "/apis/inferencecache.io/v1alpha1/namespaces/team-a";
    // Everything it reads comes from the stores: no LIST, no GET.
    let expected = vec![
        format!("PATCH {g}/cachebackends/cache/status"),
        format!("POST /apis/events.k8s.io/v1/namespaces/{NS}/events"),
        format!("POST /apis/events.k8s.io/v1/namespaces/{NS}/events"),
    ];
    assert_eq!(seen, expected);
    let mut reasons = story.event_reasons();
    reasons.sort();
    assert_eq!(reasons, ["AwaitingFirstKVEvent", "EngineSelectorUnmatched"]);
    let requests = story.fake.requests();
    let status = &requests[expected.len() - 3];
    assert_eq!(status.query.get("fieldManager").unwrap(), "ic-controller");
    assert_eq!(status.body["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(
        status.body["status"]["conditions"][0]["reason"],
        "AwaitingFirstKVEvent"
    );
    assert!(status.body["status"].get("endpoint").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_reconcile_is_a_span_when_export_is_on() {
    let receiver = ic_e2e::otlp::Receiver::start();
    common::export_to(&receiver);
    let story = Story::new("", "/nonexistent".into());
    story.fake.insert(&managed_backend());
    story.reconcile().await;
    // Exported as it ends, which can be a moment after reconcile returns (a
    // span ends when the last task holding it lets go): flushing at once
    // (what run_service does at exit) could close the queue before it.
    let span = receiver.wait_for("the reconcile span", Duration::from_secs(30), |r| {
        r["service"] == "ic-controller" && r["name"] == "reconcile"
    });
    assert_eq!(
        span["attributes"]["controller"],
        backend::CONTROLLER,
        "{span}"
    );
    assert_eq!(span["attributes"]["ns"], NS, "{span}");
    assert_eq!(span["attributes"]["name"], "cache", "{span}");
    assert_eq!(
        span["parent_span_id"], "",
        "a reconcile starts its trace: {span}"
    );
    ic_telemetry::otel::shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_refused_provider_object_is_said_on_the_backend_and_recovers() {
    let story = Story::new("", "/nonexistent".into());
    story.fake.insert(&managed_backend());
    story.reconcile().await;
    story.roll_out();
    story.first_event().await;
    let b = story.reconcile().await;
    assert_eq!(condition(&b, "Ready"), pair("True", "KVEventsObserved"));
    let endpoint = b.status.as_ref().unwrap().endpoint.clone();
    assert!(endpoint.is_some());

    // A new generation whose Deployment a policy webhook denies.
    let mut edited: Value = story.fake.get(V, "cachebackends", NS, "cache").unwrap();
    edited["spec"]["replicas"] = json!(2);
    story.fake.insert(&edited);
    let denial = "admission webhook \"validate.policy.example\" denied the request: \
                  replicas above 1 need a PodDisruptionBudget";
    story.fake.refuse(
        http::Method::PATCH,
        "/deployments/",
        400,
        "BadRequest",
        denial,
        1,
    );
    common::refill(&mut story.writers.lock(), &story.fake);
    let error = backend::reconcile(Arc::new(story.backend()), story.ctx.clone())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("denied the request"), "{error}");
    let b = story.backend();
    let status = b.status.as_ref().unwrap();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "ProvisioningFailed")
    );
    assert!(
        ready
            .message
            .starts_with("the API server refused Deployment ")
            && ready.message.contains(denial),
        "{}",
        ready.message
    );
    assert_eq!(ready.observed_generation, b.metadata.generation);
    assert_eq!(
        condition(&b, "Progressing"),
        pair("False", "ProvisioningFailed")
    );
    // The objects of the last good spec still serve: the endpoint stays.
    assert_eq!(status.endpoint, endpoint);
    assert!(
        story
            .event_reasons()
            .contains(&"ProvisioningFailed".to_owned())
    );

    // The denial lifted: applied and rolling out, then Ready again.
    let b = story.reconcile().await;
    assert_eq!(condition(&b, "Ready"), pair("False", "RolloutInProgress"));
    story.roll_out();
    let b = story.reconcile().await;
    assert_eq!(condition(&b, "Ready"), pair("True", "KVEventsObserved"));
}
