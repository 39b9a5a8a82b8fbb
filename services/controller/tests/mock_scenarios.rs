//! Single passes against the tower-test mock API server: every request is
//! asserted exactly (method, path, query, body), in order. The loops read
//! the cluster from their stores, so a pass makes no LIST and no GET: the
//! only requests are the writes it decides on.

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
async fn engine_pod_event_reads_the_backend_from_the_store_and_records_once() {
    let (client, task) = scenario(vec![
        Exchange::new(
            "POST",
            "/apis/events.k8s.io/v1/namespaces/team-a/events?",
            201,
            json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                   "metadata": {"name": "e", "namespace": "team-a"}, "eventTime": null}),
        )
        .content_type("application/json"),
        // The second reconcile of the same pod sends nothing.
    ]);
    let (stores, mut writers) = ic_controller::stores::detached();
    ic_controller::stores::replace_all(
        &mut writers.backends,
        vec![
            serde_json::from_value(
                json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
            "metadata": {"name": "cache", "namespace": "team-a", "uid": "u-1"},
            "spec": {"runtime": "VLLM"}}),
            )
            .unwrap(),
        ],
    );
    let (_registry, metrics) = common::metrics();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "ic-controller".into(),
            instance: None,
        },
    );
    let ctx = Arc::new(PodEventsContext::new(
        client,
        recorder,
        metrics,
        stores.backends.clone(),
    ));
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
    enginepod::reconcile(pod, ctx.clone()).await.unwrap();
    task.await.unwrap();
    assert_eq!(ctx.recorded(), 1);
    // The pod is deleted: what was recorded for it goes too.
    ctx.forget_deleted(&stores.pods);
    assert_eq!(ctx.recorded(), 0);
}

#[tokio::test]
async fn failed_scrape_marks_cache_index_unavailable_and_nothing_else() {
    let (stores, mut writers) = ic_controller::stores::detached();
    ic_controller::stores::replace_all(
        &mut writers.indexes,
        vec![
            serde_json::from_value(
                json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheIndex",
            "metadata": {"name": "default", "generation": 2},
            "spec": {"serverURL": "http://127.0.0.1:9"},
            "status": {"replicaCount": 2, "prefixCount": 9}}),
            )
            .unwrap(),
        ],
    );
    let (client, task) = scenario(vec![
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
        stores,
    );
    assert!(poller.poll_once().await.is_err());
    task.await.unwrap();
}

#[tokio::test]
async fn one_events_only_backend_reconcile() {
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
        ic_controller::stores::detached().0,
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
