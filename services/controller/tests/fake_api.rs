//! The in-memory fake API server behaves like the real one for what the
//! controller relies on, driven through a real kube client.

#![allow(clippy::unwrap_used)]

mod common;

use ic_api::cachebackend::{CacheBackend, IndexParticipation};
use ic_controller::kubeutil;
use ic_fake_apiserver::FakeApi;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test]
async fn crud_status_generation_and_conflicts() {
    let fake = FakeApi::new();
    let client = fake.client();
    let api: Api<CacheBackend> = Api::namespaced(client.clone(), "team-a");
    let created = api
        .create(
            &PostParams::default(),
            &common::backend("team-a", "cache", &[("app", "llm")]),
        )
        .await
        .unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    let rv1 = created.metadata.resource_version.clone().unwrap();

    // Status writes do not move generation; spec writes do.
    let status =
        json!({"indexParticipation": {"prefixCount": 3, "lastEventAt": "2026-01-01T00:00:00Z"}});
    let after = kubeutil::apply_status(&api, "cache", "poller", &status)
        .await
        .unwrap();
    assert_eq!(after.metadata.generation, Some(1));
    assert_ne!(
        after.metadata.resource_version.as_deref(),
        Some(rv1.as_str())
    );
    assert_eq!(
        after
            .status
            .unwrap()
            .index_participation
            .unwrap()
            .prefix_count,
        3
    );

    // SSA: a field the same manager stops sending is removed.
    let after = kubeutil::apply_status(
        &api,
        "cache",
        "poller",
        &json!({"indexParticipation": IndexParticipation::default()}),
    )
    .await
    .unwrap();
    let ip = after.status.unwrap().index_participation.unwrap();
    assert_eq!((ip.prefix_count, ip.last_event_at), (0, None));

    // Another manager's status apply leaves the poller's field alone.
    let after = kubeutil::apply_status(
        &api,
        "cache",
        "reconciler",
        &json!({"observedGeneration": 1}),
    )
    .await
    .unwrap();
    let st = after.status.unwrap();
    assert!(st.index_participation.is_some());
    assert_eq!(st.observed_generation, Some(1));

    // A spec merge patch bumps generation and never touches status.
    let after = api
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 3}, "status": {"observedGeneration": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(after.metadata.generation, Some(2));
    assert_eq!(after.status.unwrap().observed_generation, Some(1));

    // Stale resourceVersion on replace: 409.
    let mut stale = created.clone();
    stale.spec.replicas = 5;
    let err = api
        .replace("cache", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert_eq!(kubeutil::reason(&err), "conflict");

    // Label-selected lists, 404s, deletes.
    let listed = api
        .list(&ListParams::default().labels("x=y"))
        .await
        .unwrap();
    assert!(listed.items.is_empty());
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    assert!(api.get_opt("missing").await.unwrap().is_none());
    api.delete("cache", &Default::default()).await.unwrap();
    assert!(api.get_opt("cache").await.unwrap().is_none());

    // The request log records verbs, paths and SSA parameters.
    let apply = fake
        .requests()
        .into_iter()
        .find(|r| r.method == http::Method::PATCH)
        .unwrap();
    assert_eq!(
        apply.path,
        "/apis/inferencecache.io/v1alpha1/namespaces/team-a/cachebackends/cache/status"
    );
    assert_eq!(
        apply.query.get("fieldManager").map(String::as_str),
        Some("poller")
    );
    assert_eq!(apply.query.get("force").map(String::as_str), Some("true"));
    assert_eq!(
        apply.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
}

#[tokio::test]
async fn leases_and_events_and_injected_failures() {
    let fake = FakeApi::new();
    let leases: Api<Lease> = Api::namespaced(fake.client(), "sys");
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}}))
    .unwrap();
    let created = leases.create(&PostParams::default(), &lease).await.unwrap();
    assert_eq!(created.metadata.namespace.as_deref(), Some("sys"));
    let err = leases
        .create(&PostParams::default(), &lease)
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 409));

    fake.fail(http::Method::GET, "/leases/l", 500, 1);
    assert!(leases.get("l").await.is_err());
    assert!(leases.get("l").await.is_ok());

    let recorder = kube::runtime::events::Recorder::new(
        fake.client(),
        kube::runtime::events::Reporter {
            controller: "ic-controller".into(),
            instance: None,
        },
    );
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        kind: Some("CacheBackend".into()),
        namespace: Some("team-a".into()),
        name: Some("cache".into()),
        ..Default::default()
    };
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Normal,
        reason: "KVEventsObserved".into(),
        note: Some("first event".into()),
        action: "Reconcile".into(),
        secondary: None,
    };
    recorder.publish(&event, &reference).await.unwrap();
    recorder.publish(&event, &reference).await.unwrap();
    let events: Vec<k8s_openapi::api::events::v1::Event> = fake.list("events");
    assert_eq!(
        events.len(),
        1,
        "the repeat is a series patch, not a new Event"
    );
    assert_eq!(events[0].reason.as_deref(), Some("KVEventsObserved"));
    assert_eq!(events[0].series.as_ref().map(|s| s.count), Some(2));
}
