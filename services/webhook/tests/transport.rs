//! The HTTPS transport of the real binary: hostile input, size limits,
//! HTTP/2 by ALPN, certificate rotation without restart, start-up errors.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{FakeApi, Webhook, connector, fixture, tls_connect};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ic-webhook"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_gets_clean_errors_and_the_server_keeps_serving() {
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &[]);
    let mut client = webhook.client().await;

    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "malformed JSON",
            b"{\"apiVersion\": \"admission.k8s.io/v1\", ".to_vec(),
        ),
        ("not JSON at all", b"\x00\xff\xfe binary".to_vec()),
        (
            "non-AdmissionReview JSON",
            br#"{"hello": "world"}"#.to_vec(),
        ),
        (
            "missing request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
        ),
        (
            "v1beta1 review",
            serde_json::to_vec(&{
                let mut r = fixture("pod-create-vllm.json");
                r["apiVersion"] = json!("admission.k8s.io/v1beta1");
                r
            })
            .unwrap(),
        ),
        (
            "unknown operation",
            serde_json::to_vec(&{
                let mut r = fixture("pod-create-vllm.json");
                r["request"]["operation"] = json!("EXPLODE");
                r
            })
            .unwrap(),
        ),
        ("empty body", Vec::new()),
    ];
    for path in [
        "/mutate-pod",
        "/mutate-cachebackend",
        "/validate-cachebackend",
    ] {
        for (name, body) in &cases {
            let (status, answer) = client.request("POST", path, body.clone()).await;
            assert_eq!(status, 400, "{name} on {path}: {answer:?}");
            let error: serde_json::Value = serde_json::from_slice(&answer).unwrap();
            assert!(error["error"].is_string(), "{name}: {error}");
        }
    }

    // A CacheBackend review whose object is a Pod: denied as a bad request.
    let mut wrong = fixture("cachebackend-create.json");
    wrong["request"]["object"] = fixture("pod-create-vllm.json")["request"]["object"].clone();
    let (status, answer) = client.review("/validate-cachebackend", &wrong).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(answer["response"]["status"]["code"], 400);
    assert_eq!(answer["response"]["uid"], wrong["request"]["uid"]);

    // Over the 3 MiB limit: 413.
    let mut huge = fixture("pod-create-vllm.json");
    huge["request"]["object"]["metadata"]["annotations"]["filler"] =
        json!("x".repeat(3 * 1024 * 1024 + 1));
    let mut fresh = webhook.client().await;
    let (status, _) = fresh
        .request("POST", "/mutate-pod", serde_json::to_vec(&huge).unwrap())
        .await;
    assert_eq!(status, 413);

    // Wrong method and unknown path.
    let (status, _) = client.request("GET", "/mutate-pod", Vec::new()).await;
    assert_eq!(status, 405);
    let (status, _) = client.request("POST", "/nope", Vec::new()).await;
    assert_eq!(status, 404);

    // A truncated body: the client promises more than it sends, then closes.
    let mut tls = tls_connect(webhook.https, &webhook.connector()).await;
    tls.write_all(
        b"POST /mutate-pod HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
          content-length: 5000\r\n\r\n{\"apiVersion\":\"admission.k8s.io/v1\"",
    )
    .await
    .unwrap();
    tls.shutdown().await.unwrap();
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 400"),
        "truncated body answered {text:?}"
    );

    // A client that is not speaking TLS at all.
    let mut plain = tokio::net::TcpStream::connect(webhook.https).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut sink = Vec::new();
    let _ = plain.read_to_end(&mut sink).await;

    // Still serving, on old and new connections.
    let (status, body) = client.request("GET", "/healthz", Vec::new()).await;
    assert_eq!((status, &body[..]), (200, &b"ok\n"[..]));
    let review = fixture("pod-create-vllm.json");
    let (status, answer) = webhook.client().await.review("/mutate-pod", &review).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], true);

    let metrics = webhook.metrics();
    for line in [
        r#"inferencecache_webhook_rejected_requests_total{reason="malformed"}"#,
        r#"inferencecache_webhook_rejected_requests_total{reason="wrong_type"} 6"#,
        r#"inferencecache_webhook_rejected_requests_total{reason="missing_request"} 3"#,
        r#"inferencecache_webhook_rejected_requests_total{reason="too_large"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert!(webhook.process.stop().success());
}

/// An HTTP/2 connection to `webhook`, negotiated by ALPN.
async fn h2_sender(
    webhook: &Webhook,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let tls = tls_connect(webhook.https, &connector(&webhook.ca.pem(), &[b"h2"])).await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(connection);
    sender
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_is_negotiated_by_alpn() {
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &[]);
    let mut sender = h2_sender(&webhook).await;
    let review = fixture("cachebackend-create.json");
    let request = hyper::Request::post("https://localhost/mutate-cachebackend")
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            serde_json::to_vec(&review).unwrap(),
        )))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.version(), hyper::Version::HTTP_2);
    use http_body_util::BodyExt as _;
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["response"]["uid"], review["request"]["uid"]);
    assert!(webhook.process.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_send_a_request_are_closed() {
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(
        binary(),
        api_addr,
        &["--connection-idle-timeout-seconds", "1"],
    );
    // HTTP/1.1 with not a byte after the handshake; HTTP/2 with only the
    // connection preface and an empty SETTINGS frame, then silence.
    let h1 = tls_connect(webhook.https, &connector(&webhook.ca.pem(), &[b"http/1.1"])).await;
    let mut h2 = tls_connect(webhook.https, &connector(&webhook.ca.pem(), &[b"h2"])).await;
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    for (name, mut tls) in [("http/1.1", h1), ("h2", h2)] {
        // Read whatever the server sends (its SETTINGS, a GOAWAY) until it
        // closes the connection; without the bound it never would.
        let mut sink = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut sink)).await;
        assert!(closed.is_ok(), "{name}: an idle connection stayed open");
    }
    let metrics = webhook.metrics();
    assert!(
        metrics.contains("inferencecache_webhook_idle_connections_closed_total 2"),
        "{metrics}"
    );
    assert!(webhook.process.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trickling_its_headers_is_cut_by_the_header_deadline() {
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(
        binary(),
        api_addr,
        &[
            "--header-read-timeout-seconds",
            "2",
            "--connection-idle-timeout-seconds",
            "60",
        ],
    );
    let mut tls = tls_connect(webhook.https, &connector(&webhook.ca.pem(), &[b"http/1.1"])).await;
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // One header byte every 500 ms: never idle, never done.
    let started = Instant::now();
    let mut cut = false;
    while started.elapsed() < Duration::from_secs(20) {
        if tls.write_all(b"X").await.is_err() {
            cut = true;
            break;
        }
        let mut buf = [0u8; 512];
        // Anything read (a 408, or the end of the stream) is the cut.
        if tokio::time::timeout(Duration::from_millis(500), tls.read(&mut buf))
            .await
            .is_ok()
        {
            cut = true;
            break;
        }
    }
    assert!(cut, "a trickling client kept its connection");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "cut near the deadline"
    );
    let metrics = webhook.metrics();
    assert!(
        metrics.contains("inferencecache_webhook_header_read_timeouts_total 1"),
        "{metrics}"
    );
    assert!(webhook.process.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_finishes_its_handshake_is_cut_and_counted() {
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(
        binary(),
        api_addr,
        &[
            "--tls-handshake-timeout-seconds",
            "2",
            "--connection-idle-timeout-seconds",
            "60",
        ],
    );
    // TCP only, not a byte of TLS.
    let mut silent = tokio::net::TcpStream::connect(webhook.https).await.unwrap();
    let started = Instant::now();
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(20), silent.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "a silent TLS connection stayed open");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(10),
        "closed after {took:?}"
    );
    let metrics = webhook.metrics();
    assert!(
        metrics.contains("inferencecache_webhook_tls_handshake_failures_total 1"),
        "{metrics}"
    );
    assert!(webhook.process.stop().success());
}

/// The certificate served by a fresh handshake.
async fn served_certificate(webhook: &Webhook) -> Vec<u8> {
    let tls = tls_connect(webhook.https, &webhook.connector()).await;
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_are_served_without_restart() {
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &["--tls-reload-interval-seconds", "1"]);
    assert_eq!(served_certificate(&webhook).await, webhook.cert_der);

    // A broken rotation (garbage key) keeps the old certificate and counts a failure.
    let key = webhook.dir.path().join("tls.key");
    let good_key = std::fs::read(&key).unwrap();
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nbm9wZQ==\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    webhook
        .process
        .wait_for_log("serving certificate reload failed; keeping the previous certificate");
    assert_eq!(served_certificate(&webhook).await, webhook.cert_der);
    std::fs::write(&key, good_key).unwrap();

    // A real rotation: the new pair is served on new connections.
    let (cert, key, new_der) = webhook.ca.serving_pair("ic-webhook-2");
    let dir = webhook.dir.path().to_owned();
    std::fs::write(dir.join("tls.key"), key).unwrap();
    std::fs::write(dir.join("tls.crt"), cert).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while served_certificate(&webhook).await != new_der {
        assert!(
            Instant::now() < deadline,
            "rotated certificate never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut client = webhook.client().await;
    let (status, _) = client.request("GET", "/healthz", Vec::new()).await;
    assert_eq!(status, 200);

    let metrics = webhook.metrics();
    assert!(
        metrics.contains(r#"inferencecache_webhook_tls_reloads_total{result="success"}"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"inferencecache_webhook_tls_reloads_total{result="failure"}"#),
        "{metrics}"
    );
    assert!(webhook.process.stop().success());
}

#[test]
fn unreadable_certificate_fails_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.crt");
    let mut process = ic_e2e::ServiceProcess::start(
        binary(),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--https-addr",
            "127.0.0.1:0",
            "--tls-cert",
            missing.to_str().unwrap(),
            "--tls-key",
            missing.to_str().unwrap(),
        ],
    );
    let status = process.wait_exit();
    assert!(!status.success(), "{status:?}");
    let logs = process.logs().join("\n");
    assert!(
        logs.contains("--tls-cert") && logs.contains("missing.crt"),
        "{logs}"
    );
}

/// With tracing on, the API server sends webhooks its `traceparent`: the
/// review's span continues the write's trace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_joins_the_api_servers_trace() {
    let receiver = ic_e2e::otlp::Receiver::start();
    let endpoint = receiver.endpoint();
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(
        binary(),
        api_addr,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-export-interval-seconds",
            "1",
        ],
    );
    let mut sender = h2_sender(&webhook).await;
    let trace = "5b8aa5a2d2c872e8321cf37308d69df2";
    let apiserver_span = "051581bf3cb55c13";
    let request = hyper::Request::post("https://localhost/validate-cachebackend")
        .header("content-type", "application/json")
        .header(
            "traceparent",
            ic_e2e::otlp::traceparent(trace, apiserver_span),
        )
        .body(http_body_util::Full::new(bytes::Bytes::from(
            serde_json::to_vec(&fixture("cachebackend-create.json")).unwrap(),
        )))
        .unwrap();
    assert_eq!(sender.send_request(request).await.unwrap().status(), 200);
    let span = receiver.wait_for("the admission span", Duration::from_secs(30), |r| {
        r["service"] == "ic-webhook" && r["name"] == "admission" && r["trace_id"] == trace
    });
    assert_eq!(span["parent_span_id"], apiserver_span, "{span}");
    assert_eq!(span["kind"], 2, "SPAN_KIND_SERVER: {span}");
    assert_eq!(
        span["attributes"]["kind"], "cachebackend_validate",
        "{span}"
    );
    assert_eq!(span["attributes"]["result"], "allowed", "{span}");
    receiver.wait_for("the webhook's metrics", Duration::from_secs(30), |r| {
        r["service"] == "ic-webhook" && r["name"] == "inferencecache_webhook_admissions"
    });
    assert!(webhook.process.stop().success());
}
