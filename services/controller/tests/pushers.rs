//! CachePolicy → SetPolicies against the real index server, and CacheTenant
//! → quotas and pins against the real coordinator, both on loopback, with
//! the fake API server holding the objects.

#![allow(clippy::unwrap_used)]

mod common;

use ic_api::cachepolicy::{CachePolicy, CachePolicySpec};
use ic_api::cachetenant::{CacheTenant, CacheTenantSpec, TenantPin, TenantQuota};
use ic_controller::metrics::Metrics;
use ic_controller::policy::PolicyPusher;
use ic_controller::tenant::TenantPusher;
use ic_fake_apiserver::FakeApi;
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

const V: &str = "inferencecache.io/v1alpha1";

fn policy(ns: &str, name: &str, created: i64, min_prefix: i32) -> CachePolicy {
    let mut p = CachePolicy::new(
        name,
        CachePolicySpec {
            minimum_prefix_tokens: min_prefix,
            ..CachePolicySpec::default()
        },
    );
    p.metadata.namespace = Some(ns.into());
    p.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
    ));
    p
}

async fn lookup(server: &common::IndexServer) -> pb::LookupRouteResponse {
    lookup_at(&server.grpc_url(), None).await
}

/// LookupRoute for team-a's first three blocks at `url` (`https://` trusting
/// `ca`).
async fn lookup_at(url: &str, ca: Option<&[u8]>) -> pb::LookupRouteResponse {
    let channel = ic_proto::channel::endpoint(url, ca, "test")
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = IndexServiceClient::new(channel);
    client
        .lookup_route(pb::LookupRouteRequest {
            scope: Some(pb::IndexScope {
                tenant: "team-a".into(),
                model: "m".into(),
                hash_scheme: pb::HashScheme::Vllm as i32,
                adapter: String::new(),
            }),
            key: Some(pb::lookup_route_request::Key::BlockHashes(
                pb::BlockHashes {
                    hashes: vec![1, 2, 3],
                },
            )),
            candidate_replicas: vec![],
            observe_only: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// A policy pusher reading `watched` and pushing anonymously to `server`.
fn policy_pusher(
    fake: &FakeApi,
    watched: &common::Watched,
    metrics: &Metrics,
    server: &common::IndexServer,
) -> PolicyPusher {
    policy_pusher_to(fake, watched, metrics, vec![server.grpc_url()])
}

/// A policy pusher reading `watched` and pushing anonymously to `urls`.
fn policy_pusher_to(
    fake: &FakeApi,
    watched: &common::Watched,
    metrics: &Metrics,
    urls: Vec<String>,
) -> PolicyPusher {
    PolicyPusher::new(
        fake.client(),
        urls,
        metrics.clone(),
        common::clock(),
        watched.stores.clone(),
    )
}

fn condition<'a>(
    conditions: &'a [k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    t: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    conditions.iter().find(|c| c.type_ == t).unwrap()
}

#[tokio::test]
async fn policies_reach_the_index_server_and_report_back() {
    let server = common::IndexServer::start();
    server.ingest("team-a", "engine-0", 3, None).await;
    assert_eq!(
        lookup(&server).await.outcome,
        pb::LookupOutcome::PrefixMatch as i32
    );

    let fake = FakeApi::new();
    fake.insert(&policy("team-a", "strict", 10, 1_000_000));
    fake.insert(&policy("team-a", "later", 20, 0));
    let (_registry, metrics) = common::metrics();
    let watched = common::watched(&fake, &metrics).await;
    let pusher = policy_pusher(&fake, &watched, &metrics, &server);
    watched.settle(&fake).await;
    assert_eq!(pusher.sync_once().await.unwrap(), 1);

    // The oldest policy is in force on the server.
    let answer = lookup(&server).await;
    assert_eq!(answer.outcome, pb::LookupOutcome::NoHint as i32);
    assert_eq!(
        answer.no_hint_reason,
        pb::NoHintReason::BelowMinimumPrefix as i32
    );

    let strict: CachePolicy = fake.get(V, "cachepolicies", "team-a", "strict").unwrap();
    let st = strict.status.unwrap();
    assert_eq!(condition(&st.conditions, "Active").reason, "PolicyActive");
    assert_eq!(condition(&st.conditions, "Pushed").status, "True");
    assert!(st.pushed_at.is_some());
    assert_eq!(st.observed_generation, Some(1));
    let later: CachePolicy = fake.get(V, "cachepolicies", "team-a", "later").unwrap();
    let st = later.status.unwrap();
    assert_eq!(condition(&st.conditions, "Active").status, "False");
    assert_eq!(condition(&st.conditions, "Active").reason, "Superseded");
    assert!(
        condition(&st.conditions, "Active")
            .message
            .contains("strict")
    );

    // A steady pass re-pushes (a restarted server converges) but writes nothing.
    fake.clear_requests();
    watched.settle(&fake).await;
    pusher.sync_once().await.unwrap();
    assert!(fake.writes().is_empty(), "{:?}", fake.writes());

    // Deleting the winner promotes the next one and the server follows.
    fake.remove(V, "cachepolicies", "team-a", "strict");
    watched.settle(&fake).await;
    pusher.sync_once().await.unwrap();
    assert_eq!(
        lookup(&server).await.outcome,
        pb::LookupOutcome::PrefixMatch as i32
    );
    let later: CachePolicy = fake.get(V, "cachepolicies", "team-a", "later").unwrap();
    assert_eq!(
        condition(&later.status.unwrap().conditions, "Active").status,
        "True"
    );

    // An unreachable server is reported, not hidden.
    let broken = policy_pusher_to(
        &fake,
        &watched,
        &metrics,
        vec![format!("http://127.0.0.1:{}", ic_e2e::free_port())],
    );
    watched.settle(&fake).await;
    assert!(broken.sync_once().await.is_err());
    let later: CachePolicy = fake.get(V, "cachepolicies", "team-a", "later").unwrap();
    let pushed = later.status.unwrap();
    let pushed = condition(&pushed.conditions, "Pushed");
    assert_eq!(
        (pushed.status.as_str(), pushed.reason.as_str()),
        ("False", "RemoteError")
    );
}

fn tenant(
    ns: &str,
    name: &str,
    salt: &str,
    limit: Option<&str>,
    pins: Vec<TenantPin>,
) -> CacheTenant {
    let mut t = CacheTenant::new(
        name,
        CacheTenantSpec {
            cache_salt: salt.into(),
            quota: limit.map(|l| TenantQuota {
                l2_limit: Quantity(l.into()),
            }),
            pins,
        },
    );
    t.metadata.namespace = Some(ns.into());
    t
}

fn pin(tokens: u32) -> TenantPin {
    TenantPin {
        model_name: "m".into(),
        world_size: 1,
        token_ids: (0..tokens).collect(),
    }
}

/// A tenant pusher to the coordinator at `base`, over `watched`'s stores.
fn pusher_to(
    fake: &FakeApi,
    base: &str,
    metrics: Metrics,
    watched: &common::Watched,
) -> TenantPusher {
    TenantPusher::new(
        fake.client(),
        reqwest::Client::new(),
        base.to_owned(),
        metrics,
        common::clock(),
        watched.stores.clone(),
    )
}

/// Tenant team-a/t (salt-a: a 1Gi quota and one pin) in a fake API, and a
/// pusher of it to `base`.
async fn one_tenant_pushed_to(base: &str) -> (FakeApi, common::Watched, TenantPusher) {
    let fake = FakeApi::new();
    fake.insert(&tenant(
        "team-a",
        "t",
        "salt-a",
        Some("1Gi"),
        vec![pin(512)],
    ));
    let (_registry, metrics) = common::metrics();
    let watched = common::watched(&fake, &metrics).await;
    let pusher = pusher_to(&fake, base, metrics, &watched);
    (fake, watched, pusher)
}

async fn get(url: String) -> Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

#[tokio::test]
async fn tenants_reach_the_coordinator_once() {
    let coordinator = common::Coordinator::start();
    let base = coordinator.url();
    let (fake, watched, pusher) = one_tenant_pushed_to(&base).await;
    watched.settle(&fake).await;
    assert_eq!(pusher.sync_once().await.unwrap(), 1);

    let quota = get(format!("{base}/quota/salt-a")).await;
    assert_eq!(quota["quota_exists"], true, "{quota}");
    assert_eq!(quota["quota_limit_gb"], 1.0, "{quota}");
    let pins = get(format!("{base}/cache/pins?cache_salt=salt-a")).await;
    let total = pins["total"].as_i64().unwrap();
    assert!(total > 0, "{pins}");
    let counts: Vec<i64> = pins["pins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pin_count"].as_i64().unwrap())
        .collect();
    assert!(counts.iter().all(|c| *c == 1), "{pins}");

    let t: CacheTenant = fake.get(V, "cachetenants", "team-a", "t").unwrap();
    let st = t.status.unwrap();
    assert_eq!(st.pinned_chunks, Some(total));
    assert_eq!(condition(&st.conditions, "Synced").status, "True");
    assert!(st.synced_at.is_some());

    // A second pass pins nothing twice.
    watched.settle(&fake).await;
    pusher.sync_once().await.unwrap();
    let pins = get(format!("{base}/cache/pins?cache_salt=salt-a")).await;
    assert!(
        pins["pins"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["pin_count"] == 1),
        "{pins}"
    );

    // Dropping the pin and the quota releases both.
    let mut edited: CacheTenant = fake.get(V, "cachetenants", "team-a", "t").unwrap();
    edited.spec.pins.clear();
    edited.spec.quota = None;
    fake.insert(&edited);
    watched.settle(&fake).await;
    pusher.sync_once().await.unwrap();
    let pins = get(format!("{base}/cache/pins?cache_salt=salt-a")).await;
    assert_eq!(pins["total"], 0, "{pins}");
    let quota = get(format!("{base}/quota/salt-a")).await;
    assert_eq!(quota["quota_exists"], false, "{quota}");

    // Coordinator down: Synced=False/RemoteError and an error.
    let mut process = coordinator.process;
    assert!(process.stop().success());
    watched.settle(&fake).await;
    assert!(pusher.sync_once().await.is_err());
    let t: CacheTenant = fake.get(V, "cachetenants", "team-a", "t").unwrap();
    let st = t.status.unwrap();
    let synced = condition(&st.conditions, "Synced");
    assert_eq!(
        (synced.status.as_str(), synced.reason.as_str()),
        ("False", "RemoteError")
    );
}

/// A coordinator guarding its operator endpoints refuses a pusher without
/// the token, and takes the one it reads from its token file.
#[tokio::test]
async fn the_pusher_presents_its_token_to_a_guarded_coordinator() {
    let coordinator = common::Coordinator::start_with(&["--api-static-token", "s3cret"]);
    let base = coordinator.url();
    let (fake, watched, pusher) = one_tenant_pushed_to(&base).await;
    watched.settle(&fake).await;
    let refused = pusher.sync_once().await.unwrap_err().to_string();
    assert!(refused.contains("401"), "{refused}");
    let quota = get(format!("{base}/quota/salt-a")).await;
    assert_eq!(quota["quota_exists"], false, "{quota}");

    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let pusher = pusher.with_token_path(Some(token));
    watched.settle(&fake).await;
    assert_eq!(pusher.sync_once().await.unwrap(), 1);
    let quota = get(format!("{base}/quota/salt-a")).await;
    assert_eq!(quota["quota_exists"], true, "{quota}");
}

#[tokio::test]
async fn a_tenant_deleted_while_the_controller_was_down_is_still_released() {
    let coordinator = common::Coordinator::start();
    let base = coordinator.url();
    let fake = FakeApi::new();
    fake.insert(&tenant(
        "team-a",
        "t",
        "salt-f",
        Some("1Gi"),
        vec![pin(256)],
    ));
    let (_registry, metrics) = common::metrics();
    let watched = common::watched(&fake, &metrics).await;
    let pusher = |metrics| {
        TenantPusher::new(
            fake.client(),
            reqwest::Client::new(),
            base.clone(),
            metrics,
            common::clock(),
            watched.stores.clone(),
        )
    };
    let first = pusher(metrics.clone());
    watched.settle(&fake).await;
    first.sync_once().await.unwrap();
    let t: Value = fake.get(V, "cachetenants", "team-a", "t").unwrap();
    assert_eq!(
        t["metadata"]["finalizers"],
        serde_json::json!(["inferencecache.io/coordinator-release"])
    );
    assert_eq!(
        get(format!("{base}/quota/salt-f")).await["quota_exists"],
        true
    );
    drop(first);

    // Deleted while no controller runs: the finalizer holds it.
    fake.remove(V, "cachetenants", "team-a", "t");
    let t: Value = fake.get(V, "cachetenants", "team-a", "t").unwrap();
    assert!(t["metadata"]["deletionTimestamp"].is_string(), "{t}");

    // A fresh controller (no memory of what it applied) releases it.
    let restarted = pusher(metrics);
    watched.settle(&fake).await;
    restarted.sync_once().await.unwrap();
    assert!(
        fake.get::<Value>(V, "cachetenants", "team-a", "t")
            .is_none(),
        "the finalizer was removed and the tenant went"
    );
    assert_eq!(
        get(format!("{base}/quota/salt-f")).await["quota_exists"],
        false
    );
    let pins = get(format!("{base}/cache/pins?cache_salt=salt-f")).await;
    assert_eq!(pins["total"], 0, "{pins}");
}

#[tokio::test]
async fn the_controller_presents_its_token_to_set_policies_and_snapshot() {
    let server = common::IndexServer::start_with(&["--api-static-token", "controller-secret"]);
    let fake = FakeApi::new();
    fake.insert(&policy("team-a", "strict", 10, 1_000_000));
    let (_registry, metrics) = common::metrics();
    let watched = common::watched(&fake, &metrics).await;
    watched.settle(&fake).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "controller-secret\n").unwrap();
    let anonymous = policy_pusher(&fake, &watched, &metrics, &server);
    let refused = anonymous.sync_once().await.unwrap_err().to_string();
    assert!(refused.contains("missing bearer token"), "{refused}");
    let pusher = anonymous.with_token_path(Some(token.clone()));
    assert_eq!(pusher.sync_once().await.unwrap(), 1);

    let (_registry, metrics) = common::metrics();
    let mut poller = ic_controller::poller::Poller::new(
        fake.client(),
        reqwest::Client::new(),
        server.snapshot_url(),
        metrics,
        common::clock(),
        watched.stores.clone(),
    );
    let refused = poller.scrape().await.unwrap_err().to_string();
    assert!(refused.contains("401"), "{refused}");
    poller.token_path = Some(token);
    poller.scrape().await.unwrap();
}

/// The policy push is one trace across the two processes: the controller's
/// `push_policies` span is the parent of the index server's `SetPolicies`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_push_is_traced_into_the_index_server() {
    let receiver = ic_e2e::otlp::Receiver::start();
    let endpoint = receiver.endpoint();
    common::export_to(&receiver);
    let server = common::IndexServer::start_with(&["--otlp-endpoint", &endpoint]);
    let fake = FakeApi::new();
    fake.insert(&policy("team-a", "strict", 10, 64));
    let (_registry, metrics) = common::metrics();
    let watched = common::watched(&fake, &metrics).await;
    let pusher = policy_pusher(&fake, &watched, &metrics, &server);
    watched.settle(&fake).await;
    assert_eq!(pusher.sync_once().await.unwrap(), 1);
    // Exported as it ends (not flushed at once: a span can end a moment
    // after the call returns, and a flush closes the queue).
    let wait = std::time::Duration::from_secs(30);
    let push = receiver.wait_for("the controller's push span", wait, |r| {
        r["service"] == "ic-controller" && r["name"] == "push_policies"
    });
    let applied = receiver.wait_for("the index server's SetPolicies span", wait, |r| {
        r["service"] == "ic-index-server" && r["name"] == "SetPolicies"
    });
    assert_eq!(applied["trace_id"], push["trace_id"], "{applied}");
    assert_eq!(applied["parent_span_id"], push["span_id"], "{applied}");
    ic_telemetry::otel::shutdown(std::time::Duration::from_secs(10)).await;
}

// === Several index-server replicas ===

/// Whether the index server at `url` enforces `strict` (a minimum prefix no
/// lookup reaches) on team-a.
async fn enforces_strict(url: &str, ca: Option<&[u8]>) -> bool {
    lookup_at(url, ca).await.no_hint_reason == pb::NoHintReason::BelowMinimumPrefix as i32
}

/// Waits (up to 30 s) until `check` holds; panics naming `what` otherwise.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "still not so after 30 s: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

fn remote_errors(metrics: &Metrics) -> i64 {
    let labels = ic_controller::metrics::ReasonLabels {
        controller: "cachepolicy",
        reason: "remote",
    };
    i64::try_from(metrics.errors.get_or_create(&labels).get()).unwrap()
}

fn index_servers_gauge(metrics: &Metrics, state: &'static str) -> i64 {
    metrics
        .policy_index_servers
        .get_or_create(&ic_controller::metrics::StateLabel { state })
        .get()
}

fn pushed_condition(fake: &FakeApi, name: &str) -> (String, String, String) {
    let p: CachePolicy = fake.get(V, "cachepolicies", "team-a", name).unwrap();
    let st = p.status.unwrap();
    let c = condition(&st.conditions, "Pushed");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// Three replicas listed statically, one of them not up yet: the pass
/// pushes to each on its own, reports the missing one (counted once per
/// failed push), and a catch-up pushes to that one alone once it is up.
#[tokio::test]
async fn every_listed_index_server_gets_the_policies_and_a_late_one_catches_up() {
    let a = common::IndexServer::start();
    let b = common::IndexServer::start();
    let late_port = ic_e2e::free_port();
    let late_url = format!("http://127.0.0.1:{late_port}");
    for server in [&a, &b] {
        server.ingest("team-a", "engine-0", 3, None).await;
    }
    let fake = FakeApi::new();
    fake.insert(&policy("team-a", "strict", 10, 1_000_000));
    let (_registry, metrics) = common::metrics();
    let watched = common::watched(&fake, &metrics).await;
    let pusher = policy_pusher_to(
        &fake,
        &watched,
        &metrics,
        vec![a.grpc_url(), b.grpc_url(), late_url.clone()],
    );
    watched.settle(&fake).await;

    let err = pusher.sync_once().await.unwrap_err().to_string();
    assert!(
        err.starts_with("1 of 3 index servers do not hold the current policies; SetPolicies on http://127.0.0.1:"),
        "{err}"
    );
    assert!(err.contains(&late_url), "{err}");
    assert!(enforces_strict(&a.grpc_url(), None).await);
    assert!(enforces_strict(&b.grpc_url(), None).await);
    let (status, reason, message) = pushed_condition(&fake, "strict");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "RemoteError"));
    assert!(message.contains(&late_url), "{message}");
    assert_eq!(remote_errors(&metrics), 1);
    assert_eq!(index_servers_gauge(&metrics, "current"), 2);
    assert_eq!(index_servers_gauge(&metrics, "behind"), 1);
    let states = pusher.index_servers().await;
    assert_eq!(states.len(), 3);
    for (destination, state) in &states {
        assert_eq!(destination.addr, None);
        assert_eq!(state.is_ok(), destination.url != late_url, "{destination}");
    }

    // A catch-up retries only the replica that lacks the policies: one
    // more failure, not three.
    watched.settle(&fake).await;
    assert!(pusher.catch_up().await.unwrap().is_err());
    assert_eq!(remote_errors(&metrics), 2);

    // The replica comes up (empty, as a new pod does): the catch-up gives
    // it the policies and every status turns Pushed=True.
    let late = common::IndexServer::start_at(&format!("127.0.0.1:{late_port}"), &[]);
    late.ingest("team-a", "engine-0", 3, None).await;
    assert!(!enforces_strict(&late_url, None).await);
    watched.settle(&fake).await;
    assert_eq!(pusher.catch_up().await.unwrap().unwrap(), 1);
    assert!(enforces_strict(&late_url, None).await);
    assert_eq!(remote_errors(&metrics), 2);
    assert_eq!(index_servers_gauge(&metrics, "current"), 3);
    assert_eq!(index_servers_gauge(&metrics, "behind"), 0);
    let (status, _, message) = pushed_condition(&fake, "strict");
    assert_eq!(status, "True", "{message}");
    assert!(pusher.index_servers().await.iter().all(|(_, s)| s.is_ok()));

    // Nothing lags: a catch-up has nothing to do.
    watched.settle(&fake).await;
    assert!(pusher.catch_up().await.is_none());
}

/// The running pusher (change-driven passes, resync an hour away): a
/// replica that appears after the first pass gets the policies from the
/// periodic catch-up, and an edit reaches all three.
#[tokio::test]
async fn the_running_pusher_reaches_a_late_replica_and_every_replica_follows_an_edit() {
    let a = common::IndexServer::start();
    let b = common::IndexServer::start();
    let late_port = ic_e2e::free_port();
    let late_url = format!("http://127.0.0.1:{late_port}");
    for server in [&a, &b] {
        server.ingest("team-a", "engine-0", 3, None).await;
    }
    let fake = FakeApi::new();
    fake.insert(&policy("team-a", "strict", 10, 1_000_000));
    let (_registry, metrics) = common::metrics();
    let watched = common::watched(&fake, &metrics).await;
    watched.settle(&fake).await;
    let urls = vec![a.grpc_url(), b.grpc_url(), late_url.clone()];
    let pusher = policy_pusher_to(&fake, &watched, &metrics, urls.clone()).with_discovery(
        ic_controller::discovery::DiscoveryMode::Static,
        std::time::Duration::from_millis(100),
    );
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(pusher.clone().run(
        std::time::Duration::from_secs(3600),
        watched.stores.changes.policies.clone(),
        stop.clone(),
    ));
    eventually("the first two replicas enforce the policy", || async {
        enforces_strict(&a.grpc_url(), None).await && enforces_strict(&b.grpc_url(), None).await
    })
    .await;

    let late = common::IndexServer::start_at(&format!("127.0.0.1:{late_port}"), &[]);
    late.ingest("team-a", "engine-0", 3, None).await;
    eventually("the late replica enforces the policy", || {
        enforces_strict(&late_url, None)
    })
    .await;
    eventually("Pushed=True once every replica holds it", || async {
        pushed_condition(&fake, "strict").0 == "True"
    })
    .await;

    // An edit (no minimum prefix) reaches every replica.
    let mut edited: CachePolicy = fake.get(V, "cachepolicies", "team-a", "strict").unwrap();
    edited.spec.minimum_prefix_tokens = 0;
    fake.insert(&edited);
    for url in &urls {
        eventually(&format!("{url} follows the edit"), || async {
            lookup_at(url, None).await.outcome == pb::LookupOutcome::PrefixMatch as i32
        })
        .await;
    }
    stop.cancel();
    running.await.unwrap();
    assert!(pusher.index_servers().await.iter().all(|(_, s)| s.is_ok()));
}

/// dns discovery over TLS: the pusher resolves `localhost`, dials each
/// address it names, and verifies the certificate against the name (it
/// carries `localhost` only, no IP address).
#[tokio::test]
async fn dns_discovery_pushes_to_each_address_and_verifies_the_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ic_e2e::tls::TestCa::new();
    let (cert, key) = ca.issue(&["localhost"]);
    let (cert_path, key_path, ca_path) = (
        dir.path().join("tls.crt"),
        dir.path().join("tls.key"),
        dir.path().join("ca.crt"),
    );
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    std::fs::write(&ca_path, ca.pem()).unwrap();
    let server = common::IndexServer::start_with(&[
        "--tls-cert-file",
        cert_path.to_str().unwrap(),
        "--tls-key-file",
        key_path.to_str().unwrap(),
    ]);
    let port = server.grpc.port();
    let url = format!("https://localhost:{port}");
    let ca_pem = ca.pem();
    // Ingest over TLS, as a subscriber would.
    let channel = ic_proto::channel::endpoint(&url, Some(ca_pem.as_bytes()), "test")
        .unwrap()
        .connect()
        .await
        .unwrap();
    let ack = IndexServiceClient::new(channel)
        .ingest_events(futures::stream::iter(vec![common::ingest_batch(
            "team-a", "engine-0", 3, None,
        )]))
        .await
        .unwrap()
        .into_inner();
    assert!(!ack.resync_required, "{ack:?}");

    let fake = FakeApi::new();
    fake.insert(&policy("team-a", "strict", 10, 1_000_000));
    let (_registry, metrics) = common::metrics();
    let watched = common::watched(&fake, &metrics).await;
    watched.settle(&fake).await;
    let pusher = policy_pusher_to(&fake, &watched, &metrics, vec![url.clone()])
        .with_discovery(
            ic_controller::discovery::DiscoveryMode::Dns,
            std::time::Duration::from_secs(5),
        )
        .with_ca_path(Some(ca_path));
    let result = pusher.sync_once().await;

    // `localhost` may also name ::1, where nothing listens here: that
    // address is a destination of its own (and fails alone).
    let states = pusher.index_servers().await;
    let served: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    assert!(!states.is_empty());
    for (destination, state) in &states {
        assert_eq!(destination.url, url);
        let addr = destination.addr.unwrap();
        assert!(addr.ip().is_loopback() && addr.port() == port, "{addr}");
        if addr == served {
            assert_eq!(state, &Ok(()), "{destination}");
        }
    }
    assert!(
        states.iter().any(|(d, _)| d.addr == Some(served)),
        "{states:?}"
    );
    if states.len() == 1 {
        assert_eq!(result.unwrap(), 1);
    }
    assert!(enforces_strict(&url, Some(ca_pem.as_bytes())).await);
}
