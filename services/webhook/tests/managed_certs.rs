//! Managed certificates on the real `ic-webhook` binary against the fake API
//! server over HTTP: the webhook creates its CA and serving certificate in a
//! Secret, writes the CA into its webhook configurations, serves a
//! certificate that bundle verifies for the Service's DNS name, renews the
//! serving certificate and then the CA without a restart, and two replicas
//! converge on one certificate.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ic_fake_apiserver::{FakeApi, write_kubeconfig};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::json;

const NAMESPACE: &str = "ic-system";
const SERVICE: &str = "inferencecache-webhook";
const CONFIG: &str = "inferencecache-webhook";

fn seed_configurations(fake: &FakeApi) {
    let client = |path: &str| json!({"service": {"name": SERVICE, "namespace": NAMESPACE, "path": path, "port": 443}});
    fake.insert(&json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [
            {"name": "mcachebackend.inferencecache.io", "clientConfig": client("/mutate-cachebackend"),
             "sideEffects": "None", "admissionReviewVersions": ["v1"]},
            {"name": "mpod.inferencecache.io", "clientConfig": client("/mutate-pod"),
             "sideEffects": "None", "admissionReviewVersions": ["v1"]},
        ],
    }));
    fake.insert(&json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [
            {"name": "vcachebackend.inferencecache.io", "clientConfig": client("/validate-cachebackend"),
             "sideEffects": "None", "admissionReviewVersions": ["v1"]},
        ],
    }));
}

/// The CA bundle every webhook of both configurations carries, once they
/// all carry the same one.
fn ca_bundle(fake: &FakeApi) -> Option<String> {
    let m: MutatingWebhookConfiguration = fake.get(
        "admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        "",
        CONFIG,
    )?;
    let v: ValidatingWebhookConfiguration = fake.get(
        "admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        "",
        CONFIG,
    )?;
    let bundles: Vec<Option<Vec<u8>>> = m
        .webhooks
        .iter()
        .flatten()
        .map(|w| w.client_config.ca_bundle.clone().map(|b| b.0))
        .chain(
            v.webhooks
                .iter()
                .flatten()
                .map(|w| w.client_config.ca_bundle.clone().map(|b| b.0)),
        )
        .collect();
    let first = bundles.first()?.clone()?;
    bundles
        .iter()
        .all(|b| b.as_ref() == Some(&first))
        .then(|| String::from_utf8(first).unwrap())
}

/// Connects to `addr` trusting only `bundle`, for the Service's DNS name, as
/// the API server does.
async fn tls(
    addr: SocketAddr,
    bundle: &str,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(bundle.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(format!("{SERVICE}.{NAMESPACE}.svc")).unwrap();
    connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}

async fn served_leaf(addr: SocketAddr, bundle: &str) -> Result<Vec<u8>, String> {
    let tls = tls(addr, bundle).await?;
    let (_, session) = tls.get_ref();
    Ok(session.peer_certificates().unwrap()[0].to_vec())
}

/// POSTs `body` to `path` over a verified TLS connection; returns the status line.
async fn post(addr: SocketAddr, bundle: &str, path: &str, body: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = tls(addr, bundle).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {SERVICE}.{NAMESPACE}.svc\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(body).await.unwrap();
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await.ok();
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned()
}

struct Replica {
    process: ic_e2e::ServiceProcess,
    https: SocketAddr,
}

fn start_replica(kubeconfig: &std::path::Path, serving: u64, ca: u64) -> Replica {
    let serving = serving.to_string();
    let ca = ca.to_string();
    let mut process = ic_e2e::ServiceProcess::start(
        &ic_e2e::workspace_binary("ic-webhook"),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--https-addr",
            "127.0.0.1:0",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--certificates",
            "managed",
            "--cert-secret",
            "webhook-tls",
            "--cert-namespace",
            NAMESPACE,
            "--cert-service",
            SERVICE,
            "--mutating-webhook-configuration",
            CONFIG,
            "--validating-webhook-configuration",
            CONFIG,
            "--serving-cert-validity-seconds",
            &serving,
            "--ca-validity-seconds",
            &ca,
            "--cert-check-interval-seconds",
            "1",
            "--drain-seconds",
            "0",
        ],
    );
    let https = process.addr("https");
    Replica { process, https }
}

async fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_certificates_are_created_served_and_renewed_without_a_restart() {
    let fake = FakeApi::new();
    seed_configurations(&fake);
    let served = fake.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), served.addr, "webhook-sa", NAMESPACE).unwrap();
    // Serving certificates live 12 s (renewed with 4 s left), the CA 24 s
    // (renewed with 8 s left): both rotate within the test.
    let mut one = start_replica(&kubeconfig, 12, 24);
    let pid = one.process.pid();

    let secret: Secret = fake
        .get("v1", "secrets", NAMESPACE, "webhook-tls")
        .expect("the Secret was created");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.unwrap();
    for key in ["tls.crt", "tls.key", "ca.crt", "ca.key"] {
        assert!(data.contains_key(key), "{key} missing");
    }
    let bundle = ca_bundle(&fake).expect("every webhook carries the CA");
    assert_eq!(bundle.as_bytes(), data["ca.crt"].0.as_slice());
    let first = served_leaf(one.https, &bundle)
        .await
        .expect("the served certificate verifies for the Service name");

    // A second replica adopts the stored certificate rather than issuing one.
    let mut two = start_replica(&kubeconfig, 12, 24);
    assert_eq!(served_leaf(two.https, &bundle).await.unwrap(), first);

    // The serving certificate is renewed under the same CA.
    let renewed = wait_for(
        "a renewed serving certificate",
        Duration::from_secs(30),
        async || {
            let leaf = served_leaf(one.https, &bundle).await.ok()?;
            (leaf != first).then_some(leaf)
        },
    )
    .await;
    assert_eq!(one.process.pid(), pid, "no restart");
    assert_eq!(ca_bundle(&fake).unwrap(), bundle, "same CA");
    // Both replicas end up serving it.
    wait_for(
        "the second replica to serve the renewed certificate",
        Duration::from_secs(10),
        async || {
            let leaf = served_leaf(two.https, &bundle).await.ok()?;
            (leaf != first).then_some(())
        },
    )
    .await;
    let _ = renewed;

    // Then the CA rolls over: the bundle holds the new CA and the old one,
    // and the served certificate chains to the new one.
    let rolled = wait_for("a CA rollover", Duration::from_secs(30), async || {
        let b = ca_bundle(&fake)?;
        (CertificateDer::pem_slice_iter(b.as_bytes()).count() == 2).then_some(b)
    })
    .await;
    let old_ca: Vec<_> = CertificateDer::pem_slice_iter(bundle.as_bytes())
        .map(Result::unwrap)
        .collect();
    let new_cas: Vec<_> = CertificateDer::pem_slice_iter(rolled.as_bytes())
        .map(Result::unwrap)
        .collect();
    assert_eq!(new_cas[1], old_ca[0], "the old CA stays trusted");
    let new_ca_only = ic_webhook::certs::authority::pem_of(&new_cas[0]);
    wait_for(
        "a certificate signed by the new CA",
        Duration::from_secs(10),
        async || served_leaf(one.https, &new_ca_only).await.ok(),
    )
    .await;
    assert_eq!(one.process.pid(), pid, "still no restart");

    let (status, metrics) = ic_e2e::http_get(one.process.admin_addr(), "/metrics");
    assert_eq!(status, 200);
    for series in [
        "inferencecache_webhook_certificate_renewals_total{what=\"created\"}",
        "inferencecache_webhook_certificate_expiry_timestamp_seconds{what=\"serving\"}",
        "inferencecache_webhook_ca_bundle_writes_total",
    ] {
        assert!(metrics.contains(series), "{series} missing from /metrics");
    }
    assert!(one.process.stop().success());
    assert!(two.process.stop().success());
}

#[tokio::test]
async fn without_the_api_the_webhook_is_live_but_never_ready() {
    // Nothing listens where the kubeconfig points: no certificate can be
    // set up, so the webhook must not claim readiness (nor serve HTTPS).
    let dir = tempfile::tempdir().unwrap();
    let unused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), unused, "t", NAMESPACE).unwrap();
    let mut process = ic_e2e::ServiceProcess::start(
        &ic_e2e::workspace_binary("ic-webhook"),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--https-addr",
            "127.0.0.1:0",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--certificates",
            "managed",
        ],
    );
    let admin = process.admin_addr();
    process.wait_for_log("cannot set up the webhook certificates yet");
    assert_eq!(ic_e2e::http_get(admin, "/live").0, 200);
    assert_eq!(ic_e2e::http_get(admin, "/ready").0, 503);
    assert!(
        process.stop().success(),
        "stops cleanly on SIGTERM while waiting"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_calls_exactly_what_its_rbac_file_grants() {
    let fake = FakeApi::new();
    seed_configurations(&fake);
    fake.insert(
        &json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
        "metadata": {"name": "cb", "namespace": "team-a", "uid": "uid-cb"},
        "spec": {"runtime": "VLLM", "engineSelector": {"matchLabels": {"app": "engine"}},
                 "observation": {"modelID": "m"}}}),
    );
    let served = fake.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), served.addr, "webhook-sa", NAMESPACE).unwrap();
    let mut webhook = start_replica(&kubeconfig, 3600, 7200);
    let bundle = wait_for("the CA bundle", Duration::from_secs(10), async || {
        ca_bundle(&fake)
    })
    .await;
    // One pod admission (which lists the namespace's CacheBackends).
    let review = serde_json::to_vec(&common_fixture("pod-create-vllm.json")).unwrap();
    let status = post(webhook.https, &bundle, "/mutate-pod", &review).await;
    assert!(status.contains(" 200"), "{status}");
    // A Secret broken from outside is repaired on the next check (an update).
    let mut secret: Secret = fake.get("v1", "secrets", NAMESPACE, "webhook-tls").unwrap();
    secret
        .data
        .as_mut()
        .unwrap()
        .insert("tls.key".into(), k8s_openapi::ByteString(b"junk".to_vec()));
    fake.insert(&secret);
    wait_for(
        "the Secret to be repaired",
        Duration::from_secs(10),
        async || {
            let secret: Secret = fake.get("v1", "secrets", NAMESPACE, "webhook-tls")?;
            (secret.data?["tls.key"].0 != b"junk").then_some(())
        },
    )
    .await;
    assert!(
        served_leaf(webhook.https, &bundle).await.is_ok(),
        "still serving a verified certificate"
    );
    assert!(webhook.process.stop().success());
    let recorded = ic_fake_apiserver::rbac::permissions(&fake.requests());
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts/inference-cache/rbac/ic-webhook.txt");
    ic_fake_apiserver::rbac::check_contract(
        &file,
        "ic-webhook",
        "services/webhook/tests/managed_certs.rs",
        &recorded,
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

fn common_fixture(name: &str) -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}
