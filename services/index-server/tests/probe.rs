//! The functional probe: its stages in process (including failures), and
//! `POST /probe` on the real binary with static-token and TokenReview
//! authentication (TokenReviews answered by the fake API server over HTTP on
//! loopback, standing in for the Kubernetes API server).

#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;

use ic_e2e::ServiceProcess;
use ic_index::{Index, IndexConfig};
use ic_index_server::grpc::IndexServer;
use ic_index_server::metrics::Metrics;
use ic_index_server::policy::Policies;
use ic_index_server::probe::{ProbeRequest, Prober, StageOutcome};
use ic_proto::index_v1 as pb;
use serde_json::{Value, json};

fn server(capacity_entries: u64) -> IndexServer {
    let registry = ic_telemetry::MetricsRegistry::new("inferencecache", "test");
    IndexServer::new(
        Arc::new(Index::new(IndexConfig {
            capacity_entries,
            ..IndexConfig::default()
        })),
        16,
        Metrics::register(&registry),
    )
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn request() -> ProbeRequest {
    ProbeRequest {
        namespace: "team-a".into(),
        backend: "cache".into(),
    }
}

fn outcomes(report: &ic_index_server::probe::ProbeReport) -> Vec<(&'static str, StageOutcome)> {
    report.stages.iter().map(|s| (s.stage, s.outcome)).collect()
}

#[test]
fn healthy_server_passes_and_leaves_nothing_behind() {
    let s = server(1000);
    let prober = Prober::new(s.core().clone());
    for _ in 0..3 {
        let report = prober.run(&request(), now_ms());
        assert!(report.ok, "{report:?}");
        assert_eq!(
            outcomes(&report),
            [
                ("ingest", StageOutcome::Ok),
                ("routing", StageOutcome::Ok),
                ("t2", StageOutcome::Skipped)
            ]
        );
    }
    assert_eq!(s.index().len(), 0);
    assert!(s.index().snapshot().is_empty());
}

#[test]
fn broken_ingest_fails_the_ingest_stage_and_skips_routing() {
    // An index that can hold nothing: the synthesized event never lands.
    let report = Prober::new(server(0).core().clone()).run(&request(), now_ms());
    assert!(!report.ok);
    assert_eq!(
        outcomes(&report),
        [
            ("ingest", StageOutcome::Failed),
            ("routing", StageOutcome::Skipped),
            ("t2", StageOutcome::Skipped)
        ]
    );
    assert!(
        report.stages[0].message.contains("not in index"),
        "{}",
        report.stages[0].message
    );
}

#[test]
fn broken_routing_fails_the_routing_stage() {
    // Routing that refuses every match of the probe's size.
    let s = server(1000);
    s.core().set_policies(
        Policies::from_push(&[pb::NamespacePolicy {
            namespace: "~probe".into(),
            lookup_timeout_ms: 20,
            minimum_prefix_tokens: 1_000_000,
            replica_stale_after_seconds: 120,
            allow_tier2_matches: true,
            ..Default::default()
        }])
        .unwrap(),
    );
    let report = Prober::new(s.core().clone()).run(&request(), now_ms());
    assert!(!report.ok);
    assert_eq!(report.stages[0].outcome, StageOutcome::Ok);
    assert_eq!(report.stages[1].outcome, StageOutcome::Failed);
    assert!(
        report.stages[1].message.contains("BELOW_MINIMUM_PREFIX"),
        "{}",
        report.stages[1].message
    );
    assert_eq!(s.index().len(), 0, "the failed probe still cleaned up");
}

// === the real binary ===

async fn post_probe(
    addr: SocketAddr,
    token: Option<&str>,
    body: &str,
) -> (u16, Value, Option<String>) {
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}/probe"))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    (status, body, challenge)
}

fn start(extra: &[&str], env: &[(&str, &str)]) -> (ServiceProcess, SocketAddr) {
    let mut args = vec!["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut p = ServiceProcess::start_with_env(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-index-server")),
        &args,
        env,
    );
    let addr = p.admin_addr();
    (p, addr)
}

const GOOD: &str = r#"{"namespace": "team-a", "backend": "cache"}"#;

#[tokio::test]
async fn static_token_guards_probe_and_bad_bodies_are_refused() {
    let (mut p, addr) = start(&["--probe-static-token", "s3cret"], &[]);

    let (status, body, challenge) = post_probe(addr, None, GOOD).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(challenge.as_deref(), Some("Bearer"));
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("missing bearer token")
    );
    let (status, body, _) = post_probe(addr, Some("wrong"), GOOD).await;
    assert_eq!(status, 401, "{body}");

    let (status, body, _) = post_probe(addr, Some("s3cret"), GOOD).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], true);
    assert_eq!(body["namespace"], "team-a");
    let stages: Vec<(&str, &str)> = body["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["stage"].as_str().unwrap(), s["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        stages,
        [("ingest", "ok"), ("routing", "ok"), ("t2", "skipped")]
    );

    for (bad, field) in [
        ("not json", "body must be JSON"),
        (r#"{"namespace": "team-a"}"#, "backend"),
        (
            r#"{"namespace": "team-a", "backend": "c", "extra": 1}"#,
            "unknown field",
        ),
        (r#"{"namespace": "Team_A", "backend": "c"}"#, "namespace:"),
        (r#"{"namespace": "a", "backend": ""}"#, "backend:"),
        (r#"{"namespace": 7, "backend": "c"}"#, "invalid type"),
    ] {
        let (status, body, _) = post_probe(addr, Some("s3cret"), bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains(field),
            "{bad}: {body}"
        );
    }
    let huge = format!(
        r#"{{"namespace": "a", "backend": "{}"}}"#,
        "b".repeat(64 * 1024)
    );
    assert_eq!(post_probe(addr, Some("s3cret"), &huge).await.0, 413);

    // The synthetic replica never shows in the snapshot; refusals counted.
    let (_, snapshot) = ic_e2e::http_get(addr, "/snapshot");
    let snapshot: Value = serde_json::from_str(&snapshot).unwrap();
    assert_eq!(snapshot["replicas"], json!([]));
    assert_eq!(snapshot["entries"], 0);
    let (_, metrics) = ic_e2e::http_get(addr, "/metrics");
    assert!(
        metrics.contains(r#"inferencecache_index_probe_refusals_total{reason="missing_token"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics
            .contains(r#"inferencecache_index_probe_stages_total{stage="routing",outcome="ok"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"inferencecache_index_memory_bytes{part="key_tables"} "#),
        "{metrics}"
    );
    assert!(p.stop().success());
}

#[tokio::test]
async fn probe_is_disabled_without_auth_configured() {
    let (mut p, addr) = start(&[], &[]);
    let (status, body, _) = post_probe(addr, Some("anything"), GOOD).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("--probe-static-token")
    );
    assert!(p.stop().success());
}

/// A kubeconfig pointing at an API server on `addr` (plain HTTP).
fn write_kubeconfig(dir: &std::path::Path, addr: SocketAddr) -> std::path::PathBuf {
    ic_fake_apiserver::write_kubeconfig(dir, addr, "index-server-sa-token", "default").unwrap()
}

#[tokio::test]
async fn token_review_authenticates_against_the_audience() {
    // The controller's projected token is valid for the "inferencecache"
    // audience only; another service's token is valid for another audience.
    let fake = ic_fake_apiserver::FakeApi::new();
    fake.add_token(
        "controller-token",
        ic_fake_apiserver::TokenIdentity {
            username: "system:serviceaccount:ic-system:ic-controller".into(),
            audiences: vec!["inferencecache".into()],
            ..Default::default()
        },
    );
    // A subscriber's pod-bound token carries the same audience (the chart
    // gives both one): a valid token, but not the controller's.
    fake.add_token(
        "engine-token",
        ic_fake_apiserver::TokenIdentity::new(
            "system:serviceaccount:team-a:default",
            "inferencecache",
            Some("vllm-0"),
        ),
    );
    fake.add_token(
        "other-audience-token",
        ic_fake_apiserver::TokenIdentity {
            username: "system:serviceaccount:x:other".into(),
            audiences: vec!["some-other-service".into()],
            ..Default::default()
        },
    );
    let served = fake.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), served.addr);
    let (mut p, addr) = start(
        &[
            "--probe-audience",
            "inferencecache",
            "--probe-allowed-identity",
            "system:serviceaccount:ic-system:ic-controller",
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );

    let (status, body, _) = post_probe(addr, Some("controller-token"), GOOD).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["ok"], true);
    // Accepted tokens are cached briefly: a second probe asks no one.
    assert_eq!(
        post_probe(addr, Some("controller-token"), GOOD).await.0,
        200
    );
    let (status, body, _) = post_probe(addr, Some("engine-token"), GOOD).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("--probe-allowed-identity"),
        "{body}"
    );
    let (status, body, _) = post_probe(addr, Some("stolen"), GOOD).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("invalid bearer token"),
        "{body}"
    );
    // A refused token is refused again without another TokenReview.
    for _ in 0..3 {
        assert_eq!(post_probe(addr, Some("stolen"), GOOD).await.0, 401);
    }
    let metrics = ic_e2e::http_get(addr, "/metrics").1;
    assert!(
        metrics.contains("inferencecache_index_token_refusals_cached_total 3"),
        "{metrics}"
    );
    let (status, body, _) = post_probe(addr, Some("other-audience-token"), GOOD).await;
    assert_eq!(status, 401, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("audience"),
        "{body}"
    );
    assert_eq!(post_probe(addr, None, GOOD).await.0, 401);

    let seen: Vec<(String, Vec<String>)> = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/tokenreviews"))
        .map(|r| {
            let token = r.body["spec"]["token"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let audiences = r.body["spec"]["audiences"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            (token, audiences)
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                "controller-token".to_owned(),
                vec!["inferencecache".to_owned()]
            ),
            ("engine-token".to_owned(), vec!["inferencecache".to_owned()]),
            ("stolen".to_owned(), vec!["inferencecache".to_owned()]),
            (
                "other-audience-token".to_owned(),
                vec!["inferencecache".to_owned()]
            ),
        ]
    );
    assert!(p.stop().success());
    // The chart's RBAC for these calls is checked by tests/access.rs, whose
    // scenario makes every kind of call the server makes.
}

#[tokio::test]
async fn unreachable_api_server_is_a_503_not_a_pass() {
    let dir = tempfile::tempdir().unwrap();
    let dead = ic_e2e::free_port();
    let kubeconfig = write_kubeconfig(dir.path(), format!("127.0.0.1:{dead}").parse().unwrap());
    let (mut p, addr) = start(
        &[
            "--probe-audience",
            "inferencecache",
            "--probe-allowed-identity",
            "system:serviceaccount:ic-system:ic-controller",
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let (status, body, _) = post_probe(addr, Some("controller-token"), GOOD).await;
    assert_eq!(status, 503, "{body}");
    // The API server's absence is not a verdict: nothing is cached.
    assert_eq!(
        post_probe(addr, Some("controller-token"), GOOD).await.0,
        503
    );
    assert!(
        body["error"].as_str().unwrap().contains("cannot verify"),
        "{body}"
    );
    assert!(p.stop().success());
}

/// The audience alone admits every pod whose token carries it: without the
/// identity allowed to probe, the server refuses to start, naming the flag.
#[test]
fn a_probe_audience_without_an_allowed_identity_refuses_to_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ic-index-server"))
        .args([
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--probe-audience",
            "inferencecache",
        ])
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--probe-allowed-identity"), "{stderr}");
}
