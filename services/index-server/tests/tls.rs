//! The index server's TLS and connection limits, real binary: the gRPC port
//! serves only TLS with the configured pair, picks up a rotated pair
//! without a restart (and keeps the old one when the new files are
//! broken), closes connections that stay silent, and counts each of these.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read as _;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use ic_e2e::ServiceProcess;
use ic_e2e::tls::TestCa;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

async fn metric(admin: SocketAddr, line: &str) -> f64 {
    let body = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(line).map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0.0)
}

/// Waits (up to 20 s) until `line`'s value is at least `at_least`.
async fn wait_metric(admin: SocketAddr, line: &str, at_least: f64) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let value = metric(admin, line).await;
        if value >= at_least || Instant::now() > deadline {
            return value;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `grpc.health.v1` over TLS trusting `ca_pem`: the error text when the
/// call fails.
async fn health(grpc: SocketAddr, ca_pem: Option<&str>) -> Result<(), String> {
    let scheme = if ca_pem.is_some() { "https" } else { "http" };
    let endpoint = ic_proto::channel::endpoint(
        &format!("{scheme}://127.0.0.1:{}", grpc.port()),
        ca_pem.map(str::as_bytes),
        "test",
    )?
    .timeout(Duration::from_secs(5));
    let channel = endpoint.connect().await.map_err(|e| format!("{e:?}"))?;
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|_| ())
        .map_err(|s| format!("{s:?}"))
}

/// The real binary serving `cert`/`key`, plus `extra` flags.
fn start(cert: &std::path::Path, key: &std::path::Path, extra: &[&str]) -> ServiceProcess {
    let mut args = vec![
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ServiceProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-index-server")),
        &args,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_port_serves_tls_and_follows_a_rotated_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let first = TestCa::new();
    let (cert, key, _) = first.write_loopback(dir.path());
    let mut server = start(&cert, &key, &["--tls-reload-interval-seconds", "1"]);
    let grpc = server.addr("grpc");
    let admin = server.admin_addr();

    health(grpc, Some(&first.pem())).await.unwrap();
    let plaintext = health(grpc, None).await;
    assert!(plaintext.is_err(), "a plaintext client must not be served");
    let stranger = TestCa::new();
    let untrusted = health(grpc, Some(&stranger.pem())).await;
    assert!(
        untrusted.is_err(),
        "a certificate from another CA must fail verification"
    );
    let failures = "inferencecache_index_tls_handshake_failures_total ";
    assert!(wait_metric(admin, failures, 2.0).await >= 2.0);

    // A half-written rotation (new certificate, old key) is refused and
    // the first pair keeps serving.
    let second = TestCa::new();
    let (cert2, key2) = second.issue(&["localhost", "127.0.0.1"]);
    std::fs::write(&cert, &cert2).unwrap();
    let refused = "inferencecache_index_tls_reloads_total{result=\"failure\"} ";
    assert_eq!(wait_metric(admin, refused, 1.0).await, 1.0);
    health(grpc, Some(&first.pem())).await.unwrap();

    // The key lands: the new pair is served, the old CA no longer verifies.
    std::fs::write(&key, &key2).unwrap();
    let reloaded = "inferencecache_index_tls_reloads_total{result=\"success\"} ";
    assert_eq!(wait_metric(admin, reloaded, 1.0).await, 1.0);
    health(grpc, Some(&second.pem())).await.unwrap();
    assert!(health(grpc, Some(&first.pem())).await.is_err());
    assert!(server.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_on_every_port() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (cert, key, _) = ca.write_loopback(dir.path());
    let mut server = start(
        &cert,
        &key,
        &[
            "--connection-idle-timeout-seconds",
            "1",
            "--tls-handshake-timeout-seconds",
            "3",
        ],
    );
    let grpc = server.addr("grpc");
    let admin = server.admin_addr();

    // A plaintext HTTP connection that never sends a request is closed by
    // the idle limit; one that never finishes its TLS handshake on the gRPC
    // port is closed by the handshake deadline (3 s here).
    let started = Instant::now();
    let silent_http = std::thread::spawn(move || closed_within(admin, Duration::from_secs(15)));
    let silent_tls = std::thread::spawn(move || closed_within(grpc, Duration::from_secs(30)));
    let http_took = silent_http
        .join()
        .unwrap()
        .expect("the silent HTTP connection was closed");
    let tls_took = silent_tls
        .join()
        .unwrap()
        .expect("the silent TLS connection was closed");
    assert!(
        http_took >= Duration::from_millis(900),
        "closed after {http_took:?}"
    );
    assert!(
        tls_took >= Duration::from_millis(2900),
        "closed after {tls_took:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));

    // A connection that keeps making requests is not cut.
    let endpoint = ic_proto::channel::endpoint(
        &format!("https://127.0.0.1:{}", grpc.port()),
        Some(ca.pem().as_bytes()),
        "test",
    )
    .unwrap();
    let mut client = HealthClient::new(endpoint.connect().await.unwrap());
    for _ in 0..6 {
        client
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let idle = "inferencecache_index_idle_connections_closed_total ";
    assert!(wait_metric(admin, idle, 1.0).await >= 1.0);
    let handshakes = "inferencecache_index_tls_handshake_failures_total ";
    assert!(wait_metric(admin, handshakes, 1.0).await >= 1.0);
    assert!(server.stop().success());
}

/// Connects to `addr`, sends nothing, and returns how long the server took
/// to close the connection (`None` if it was still open after `limit`).
fn closed_within(addr: SocketAddr, limit: Duration) -> Option<Duration> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(limit)).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Some(started.elapsed()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(started.elapsed());
            }
            Err(_) => return None,
        }
    }
}
