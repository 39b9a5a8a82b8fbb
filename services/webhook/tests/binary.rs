//! The real binary starts, answers --help, serves its admin endpoints and
//! stops cleanly on SIGTERM, after draining: not ready at once, admissions
//! still answered for the drain period, then it exits by itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{FakeApi, Webhook, fixture};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ic-webhook"))
}

#[test]
fn binary_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = common::TestCa::new().write_pair(dir.path(), "ic-webhook");
    // Nothing listens there: start-up does not contact the API.
    let kubeconfig = common::write_kubeconfig(
        dir.path(),
        format!("127.0.0.1:{}", ic_e2e::free_port())
            .parse()
            .unwrap(),
    );
    ic_e2e::assert_service_lifecycle(
        binary(),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--https-addr",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--drain-seconds",
            "0",
        ],
        &[
            "--https-addr",
            "--tls-cert",
            "--tls-key",
            "--kvevent-subscriber-image",
            "--index-server",
            "--index-server-discovery",
            "--kubeconfig",
            "--max-request-bytes",
            "--request-timeout-ms",
            "--drain-seconds",
        ],
    );
}

/// Polls `path` on the admin port until it answers `status`.
fn wait_for(admin: std::net::SocketAddr, path: &str, status: u16) {
    let deadline = Instant::now() + ic_e2e::PROCESS_TIMEOUT;
    while ic_e2e::http_get(admin, path).0 != status {
        assert!(Instant::now() < deadline, "{path} never answered {status}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// The API server keeps calling a terminating replica until the endpoint
// removal reaches it; a webhook that stopped at once would fail those calls
// (a denied CacheBackend write, an engine pod admitted unwired). The drain
// (20 s) only has to outlast the few requests below, sent right after the
// signal; the test does not time it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_not_ready_at_once_still_admitting_then_exits() {
    let api = FakeApi::default();
    // A backend selects the fixture pod: admissions during the drain must
    // still wire it, not merely answer (an unwired answer is a fail-open
    // no counter of ours would see).
    api.set(
        "inference",
        serde_json::from_value(fixture("cachebackends-inference.json")).unwrap(),
    );
    let api_addr = api.serve().await;
    let webhook = Webhook::start(binary(), api_addr, &["--drain-seconds", "20"]);
    webhook.wait_store_synced().await;
    let (admin, https) = (webhook.admin, webhook.https);
    wait_for(admin, "/ready", 200);
    let review = fixture("pod-create-vllm.json");
    let uid = review["request"]["uid"].clone();
    // A kept-alive connection, as the API server holds one.
    let mut kept = webhook.client().await;
    let (status, answer) = kept.review("/mutate-pod", &review).await;
    assert_eq!(
        (status, &answer["response"]["uid"]),
        (200, &uid),
        "{answer}"
    );
    assert!(
        answer["response"]["patch"].is_string(),
        "not wired: {answer}"
    );
    let connector = webhook.connector();

    // SIGTERM, then wait for the exit on another thread meanwhile.
    let mut process = webhook.process;
    let stopped = tokio::task::spawn_blocking(move || {
        let status = process.stop();
        (status, process.logs().join("\n"))
    });
    wait_for(admin, "/ready", 503);
    // Alive, not ready, and still admitting: on the open connection and on
    // a new one, pods (still wired: the backend store keeps serving) and
    // CacheBackends alike.
    assert_eq!(ic_e2e::http_get(admin, "/live").0, 200);
    let (status, answer) = kept.review("/mutate-pod", &review).await;
    assert_eq!(
        (status, &answer["response"]["uid"]),
        (200, &uid),
        "{answer}"
    );
    assert!(
        answer["response"]["patch"].is_string(),
        "not wired during the drain: {answer}"
    );
    assert_eq!(
        answer["response"]["auditAnnotations"]["outcome"], "patched:injected",
        "{answer}"
    );
    let mut fresh = common::Client::connect(https, &connector).await;
    let backend = fixture("cachebackend-create.json");
    let (status, answer) = fresh.review("/mutate-cachebackend", &backend).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["response"]["uid"], backend["request"]["uid"]);
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(ic_e2e::http_get(admin, "/ready").0, 503);
    assert!(!stopped.is_finished(), "exited during the drain");

    // Then it stops by itself, cleanly, and closes its ports.
    let (status, logs) = stopped.await.unwrap();
    assert!(status.success(), "{status:?}: {logs}");
    assert!(logs.contains("SIGTERM"), "{logs}");
    assert!(std::net::TcpStream::connect(https).is_err());
}
