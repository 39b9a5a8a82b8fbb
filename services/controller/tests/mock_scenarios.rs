//! Single passes against the tower-test mock API server: every request is
//! asserted exactly (method, path, query, body), in order.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::mock::{Exchange, scenario};
use ic_controller::backend::{self, BackendContext};
use ic_controller::enginepod::{self, PodEventsContext};
use ic_controller::poller::Poller;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::json;

#[tokio::test]
async fn engine_pod_event_looks_up_the_backend_then_records_once() {
    let (client, task) = scenario(vec![
        Exchange::new(
            "GET",
            "/apis/inferencecache.io/v1alpha1/namespaces/team-a/cachebackends/cache",
            200,
            json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
                   "metadata": {"name": "cache", "namespace": "team-a", "uid": "u-1"},
                   "spec": {"runtime": "VLLM"}}),
        ),
        Exchange::new(
            "POST",
            "/apis/events.k8s.io/v1/namespaces/team-a/events?",
            201,
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                   "metadata": {"name": "e", "namespace": "team-a"}, "eventTime": null}),
        )
        .content_type("application/json"),
        // The second reconcile of the same pod only looks the backend up again.
        Exchange::new(
            "GET",
            "/apis/inferencecache.io/v1alpha1/namespaces/team-a/cachebackends/cache",
            200,
            json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
                   "metadata": {"name": "cache", "namespace": "team-a", "uid": "u-1"},
                   "spec": {"runtime": "VLLM"}}),
        ),
    ]);
    let (_registry, metrics) = common::metrics();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "ic-controller".into(),
            instance: None,
        },
    );
    let ctx = Arc::new(PodEventsContext::new(client, recorder, metrics));
    let mut pod = common::pod(
        "team-a",
        "engine-0",
        &[],
        &[
            ("inferencecache.io/injected-by", "team-a/cache"),
            ("inferencecache.io/injected-by-uid", "u-1"),
        ],
    );
    pod.metadata.uid = Some("pod-uid".into());
    let pod = Arc::new(pod);
    enginepod::reconcile(pod.clone(), ctx.clone())
        .await
        .unwrap();
    enginepod::reconcile(pod, ctx).await.unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn failed_scrape_marks_cache_index_unavailable_and_nothing_else() {
    let (client, task) = scenario(vec![
        Exchange::new(
            "GET",
            "/apis/inferencecache.io/v1alpha1/cacheindexes?",
            200,
            json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheIndexList",
                   "metadata": {"resourceVersion": "5"},
                   "items": [{"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheIndex",
                              "metadata": {"name": "default", "generation": 2},
                              "spec": {"serverURL": "http://127.0.0.1:9"},
                              "status": {"replicaCount": 2, "prefixCount": 9}}]}),
        ),
        Exchange::new(
            "PATCH",
            "/apis/inferencecache.io/v1alpha1/cacheindexes/default/status?&force=true&fieldManager=ic-controller-index-poller",
            200,
            json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheIndex",
                   "metadata": {"name": "default"}, "spec": {"serverURL": "http://127.0.0.1:9"}}),
        )
        .content_type("application/apply-patch+yaml")
        .body(json!({
            "apiVersion": "inferencecache.io/v1alpha1",
            "kind": "CacheIndex",
            "status": {
                "replicaCount": 2,
                "prefixCount": 9,
                "observedGeneration": 2,
                "conditions": [{
                    "type": "Available",
                    "status": "False",
                    "reason": "RemoteError",
                    "message": "scraping http://127.0.0.1:9/snapshot: error sending request for url (http://127.0.0.1:9/snapshot)",
                    "observedGeneration": 2,
                    "lastTransitionTime": "2027-01-15T08:00:00Z"
                }]
            }
        })),
    ]);
    let (_registry, metrics) = common::metrics();
    let poller = Poller::new(
        client,
        reqwest::Client::new(),
        "http://127.0.0.1:9/snapshot".into(),
        metrics,
        common::clock(),
    );
    assert!(poller.poll_once().await.is_err());
    task.await.unwrap();
}

fn empty_list(kind: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": []})
}

#[tokio::test]
async fn one_events_only_backend_reconcile() {
    let managed = "?&labelSelector=app.kubernetes.io%2Fmanaged-by%3Dinferencecache";
    let backend_json = json!({
        "apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
        "metadata": {"name": "cache", "namespace": "team-a", "uid": "u-1", "generation": 1},
        "spec": {"runtime": "VLLM", "type": "LMCache",
                 "integration": {"mode": "EventsOnly", "role": "ReadWrite", "failOpen": true},
                 "observation": {"modelID": "m", "firstEventTimeout": "5m"}}
    });
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                       "metadata": {"name": "e", "namespace": "team-a"}, "eventTime": null});
    let (client, task) = scenario(vec![
        Exchange::new("GET", format!("/apis/apps/v1/namespaces/team-a/deployments{managed}"), 200, empty_list("DeploymentList")),
        Exchange::new("GET", format!("/apis/apps/v1/namespaces/team-a/statefulsets{managed}"), 200, empty_list("StatefulSetList")),
        Exchange::new("GET", format!("/api/v1/namespaces/team-a/services{managed}"), 200, empty_list("ServiceList")),
        Exchange::new(
            "GET",
            format!("/apis/autoscaling/v2/namespaces/team-a/horizontalpodautoscalers{managed}"),
            200,
            empty_list("HorizontalPodAutoscalerList"),
        ),
        Exchange::new("GET", "/api/v1/namespaces/team-a/pods?", 200, empty_list("PodList")),
        Exchange::new("GET", "/apis/apps/v1/namespaces/team-a/deployments?", 200, empty_list("DeploymentList")),
        Exchange::new(
            "PATCH",
            "/apis/inferencecache.io/v1alpha1/namespaces/team-a/cachebackends/cache/status?&force=true&fieldManager=ic-controller",
            200,
            backend_json.clone(),
        )
        .content_type("application/apply-patch+yaml"),
        Exchange::new("POST", "/apis/events.k8s.io/v1/namespaces/team-a/events?", 201, event),
    ]);
    let (_registry, metrics) = common::metrics();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "ic-controller".into(),
            instance: None,
        },
    );
    let clock: Arc<dyn ic_controller_core::clock::Clock> = common::clock();
    let ctx = Arc::new(BackendContext::new(
        client,
        recorder,
        metrics,
        clock,
        reqwest::Client::new(),
        String::new(),
        "/nonexistent".into(),
        true,
    ));
    let backend: ic_api::CacheBackend = serde_json::from_value(backend_json).unwrap();
    let action = backend::reconcile(Arc::new(backend), ctx).await.unwrap();
    // Within the first-event window: come back before it closes.
    assert!(
        format!("{action:?}").contains("requeue_after"),
        "{action:?}"
    );
    task.await.unwrap();
}
