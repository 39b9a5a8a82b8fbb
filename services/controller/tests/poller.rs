//! The CacheIndex poller against the real index server on loopback (fed
//! through IngestEvents like a subscriber would) and the fake API server.

#![allow(clippy::unwrap_used)]

mod common;

use ic_api::cachebackend::CacheBackend;
use ic_api::cacheindex::{CacheIndex, CacheIndexSpec};
use ic_api::consts::annotations;
use ic_controller::poller::Poller;
use ic_fake_apiserver::FakeApi;
use serde_json::json;

const V: &str = "inferencecache.io/v1alpha1";

/// A CacheIndex named `name` for the server whose /snapshot is `snapshot_url`.
fn cache_index(name: &str, snapshot_url: &str, poll_interval_seconds: i32) -> CacheIndex {
    CacheIndex::new(
        name,
        CacheIndexSpec {
            server_url: snapshot_url.trim_end_matches("/snapshot").into(),
            grpc_address: None,
            poll_interval_seconds,
        },
    )
}

#[tokio::test]
async fn scrape_attributes_writes_only_changes_and_survives_outages() {
    let server = common::IndexServer::start();
    server.ingest("team-a", "engine-0", 3, Some((1, 4))).await;
    server.ingest("team-a", "engine-1", 2, None).await;
    server.ingest("team-a", "drained", 5, None).await;

    let fake = FakeApi::new();
    fake.insert(&common::backend("team-a", "cache", &[("app", "llm")]));
    fake.insert(&common::backend("team-a", "pinned", &[("app", "other")]));
    fake.insert(&common::backend("team-a", "idle", &[("app", "idle")]));
    fake.insert(&common::pod("team-a", "engine-0", &[("app", "llm")], &[]));
    // The annotation wins over the selector that would pick "cache".
    fake.insert(&common::pod(
        "team-a",
        "engine-1",
        &[("app", "llm")],
        &[(annotations::INJECTED_BY, "team-a/pinned")],
    ));
    fake.insert(&cache_index("default", &server.snapshot_url(), 15));

    let (registry, metrics) = common::metrics();
    let clock = common::clock();
    let watched = common::watched(&fake, &metrics).await;
    let poller = Poller::new(
        fake.client(),
        reqwest::Client::new(),
        server.snapshot_url(),
        metrics,
        clock.clone(),
        watched.stores.clone(),
    );
    watched.settle(&fake).await;
    let report = poller.poll_once().await.unwrap();
    assert_eq!(report.backends_written, ["team-a/cache", "team-a/pinned"]);
    assert_eq!(report.indexes_written, 1);

    let cache: CacheBackend = fake.get(V, "cachebackends", "team-a", "cache").unwrap();
    let ip = cache.status.unwrap().index_participation.unwrap();
    assert_eq!(ip.prefix_count, 3);
    assert!(ip.last_event_at.is_some());
    assert_eq!(ip.hit_rate, None);
    assert_eq!(ip.t2_hit_rate.as_deref(), Some("0.25"));
    let pinned: CacheBackend = fake.get(V, "cachebackends", "team-a", "pinned").unwrap();
    let ip = pinned.status.unwrap().index_participation.unwrap();
    assert_eq!((ip.prefix_count, ip.t2_hit_rate), (2, None));
    let idle: CacheBackend = fake.get(V, "cachebackends", "team-a", "idle").unwrap();
    assert!(idle.status.is_none(), "never named by a scrape: left unset");

    // The exact write: SSA on the status subresource with the poller's manager.
    let write = fake
        .writes()
        .into_iter()
        .find(|r| r.path.ends_with("/cachebackends/cache/status"))
        .unwrap();
    assert_eq!(write.method, http::Method::PATCH);
    assert_eq!(
        write.path,
        "/apis/inferencecache.io/v1alpha1/namespaces/team-a/cachebackends/cache/status"
    );
    assert_eq!(
        write.query.get("fieldManager").unwrap(),
        "ic-controller-index-poller"
    );
    assert_eq!(write.query.get("force").unwrap(), "true");
    assert_eq!(
        write.content_type.as_deref(),
        Some("application/apply-patch+yaml")
    );
    assert_eq!(write.body["apiVersion"], V);
    assert_eq!(write.body["kind"], "CacheBackend");
    assert_eq!(write.body["status"]["indexParticipation"]["prefixCount"], 3);
    assert_eq!(
        write.body["status"]["indexParticipation"]["t2HitRate"],
        "0.25"
    );
    assert!(
        write.body["status"].get("conditions").is_none(),
        "the poller writes nothing else"
    );

    let index: CacheIndex = fake.get(V, "cacheindexes", "", "default").unwrap();
    let st = index.status.unwrap();
    assert_eq!((st.replica_count, st.prefix_count), (3, 10));
    assert!(st.tenants.iter().all(|t| t.memory_used == 0));
    assert_eq!(st.tenants[0].replica_count, 3);
    assert_eq!(st.conditions[0].type_, "Available");
    assert_eq!(st.conditions[0].status, "True");

    let exported = registry.encode();
    assert!(
        exported.contains(r#"inferencecache_backend_t2_hit_rate{backend="team-a/cache"} 0.25"#),
        "{exported}"
    );
    assert!(
        !exported.contains(r#"backend="team-a/pinned""#),
        "{exported}"
    );

    // Nothing changed: no writes at all.
    fake.clear_requests();
    watched.settle(&fake).await;
    let report = poller.poll_once().await.unwrap();
    assert!(report.backends_written.is_empty());
    assert_eq!(report.indexes_written, 0);
    assert!(fake.writes().is_empty(), "{:?}", fake.writes());

    // The index server goes away: state is kept, only Available flips.
    let mut process = server.process;
    assert!(process.stop().success());
    watched.settle(&fake).await;
    assert!(poller.poll_once().await.is_err());
    let cache: CacheBackend = fake.get(V, "cachebackends", "team-a", "cache").unwrap();
    assert_eq!(
        cache
            .status
            .unwrap()
            .index_participation
            .unwrap()
            .prefix_count,
        3
    );
    let index: CacheIndex = fake.get(V, "cacheindexes", "", "default").unwrap();
    let st = index.status.unwrap();
    assert_eq!(st.replica_count, 3, "soft state survives a failed scrape");
    assert_eq!(st.conditions[0].status, "False");
    assert_eq!(st.conditions[0].reason, "RemoteError");
    assert!(registry.encode().contains(
        r#"inferencecache_controller_snapshot_scrapes_total{controller="cacheindex",result="error"} 1"#
    ));
}

#[tokio::test]
async fn a_drained_backend_resets_to_zero() {
    let server = common::IndexServer::start();
    server.ingest("team-b", "engine-0", 4, Some((0, 3))).await;
    let fake = FakeApi::new();
    fake.insert(&common::backend("team-b", "cache", &[("app", "llm")]));
    fake.insert(&common::pod("team-b", "engine-0", &[("app", "llm")], &[]));
    let (registry, metrics) = common::metrics();
    let watched = common::watched(&fake, &metrics).await;
    let poller = Poller::new(
        fake.client(),
        reqwest::Client::new(),
        server.snapshot_url(),
        metrics,
        common::clock(),
        watched.stores.clone(),
    );
    watched.settle(&fake).await;
    poller.poll_once().await.unwrap();
    let cache: CacheBackend = fake.get(V, "cachebackends", "team-b", "cache").unwrap();
    let ip = cache.status.unwrap().index_participation.unwrap();
    assert_eq!(ip.t2_hit_rate.as_deref(), Some("0"), "queried, never hit");
    assert!(
        registry
            .encode()
            .contains(r#"inferencecache_backend_t2_hit_rate{backend="team-b/cache"} 0.0"#)
    );

    // The pod is gone: its row no longer counts for the backend.
    assert!(fake.remove("v1", "pods", "team-b", "engine-0"));
    watched.settle(&fake).await;
    poller.poll_once().await.unwrap();
    let raw: serde_json::Value = fake.get(V, "cachebackends", "team-b", "cache").unwrap();
    assert_eq!(
        raw["status"]["indexParticipation"],
        json!({"prefixCount": 0})
    );
    assert!(!registry.encode().contains(r#"backend="team-b/cache""#));
}

#[tokio::test]
async fn an_index_naming_another_server_is_scraped_at_its_own_pace() {
    let server = common::IndexServer::start();
    server.ingest("team-c", "engine-0", 2, None).await;
    let fake = FakeApi::new();
    fake.insert(&cache_index("default", &server.snapshot_url(), 15));
    // Nothing listens on port 1: this index's own server is down.
    fake.insert(&cache_index("elsewhere", "http://127.0.0.1:1/snapshot", 60));
    let (_registry, metrics) = common::metrics();
    let clock = common::clock();
    let watched = common::watched(&fake, &metrics).await;
    let poller = Poller::new(
        fake.client(),
        reqwest::Client::new(),
        server.snapshot_url(),
        metrics,
        clock.clone(),
        watched.stores.clone(),
    );
    let available = |name: &str| {
        let index: CacheIndex = fake.get(V, "cacheindexes", "", name).unwrap();
        let st = index.status.unwrap();
        (
            st.replica_count,
            st.conditions[0].status.clone(),
            st.conditions[0].message.clone(),
        )
    };

    watched.settle(&fake).await;

    let report = poller.poll_once().await.unwrap();
    assert_eq!(report.indexes_written, 2);
    let (replicas, status, message) = available("default");
    assert_eq!((replicas, status.as_str()), (1, "True"));
    assert!(message.contains(&server.snapshot_url()), "{message}");
    let (replicas, status, message) = available("elsewhere");
    assert_eq!((replicas, status.as_str()), (0, "False"));
    assert!(message.contains("127.0.0.1:1/snapshot"), "{message}");

    // Within its 60 s interval the other server is not scraped again.
    server.ingest("team-c", "engine-1", 2, None).await;
    clock.advance(std::time::Duration::from_secs(30));
    fake.clear_requests();
    watched.settle(&fake).await;
    let report = poller.poll_once().await.unwrap();
    assert_eq!(report.indexes_written, 1, "only the main index changed");
    assert_eq!(available("default").0, 2);
    assert!(
        fake.writes().iter().all(|w| !w.path.contains("elsewhere")),
        "{:?}",
        fake.writes()
    );
}
