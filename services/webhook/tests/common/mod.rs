//! Shared by the HTTPS tests and the load bench: a test CA and serving
//! certificates, an HTTPS client trusting the CA, a fake Kubernetes API
//! (the shared ic-fake-apiserver over HTTP), and the real `ic-webhook` binary started
//! against them.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

pub fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// === certificates ===

/// A test CA that signs serving certificates for localhost / 127.0.0.1.
pub struct TestCa {
    issuer: rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
}

impl TestCa {
    pub fn new() -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "ic-webhook test CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let key = rcgen::KeyPair::generate().unwrap();
        Self {
            issuer: rcgen::CertifiedIssuer::self_signed(params, key).unwrap(),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A fresh serving pair (cert PEM, key PEM) and the cert's DER.
    pub fn serving_pair(&self, common_name: &str) -> (String, String, Vec<u8>) {
        let mut params = rcgen::CertificateParams::new(vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "ic-webhook.inferencecache-system.svc".to_owned(),
        ])
        .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &*self.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().to_vec())
    }

    /// Writes a serving pair into `dir` and returns (cert path, key path, DER).
    pub fn write_pair(&self, dir: &Path, common_name: &str) -> (PathBuf, PathBuf, Vec<u8>) {
        let (cert, key, der) = self.serving_pair(common_name);
        let (cert_path, key_path) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert_path, cert).unwrap();
        std::fs::write(&key_path, key).unwrap();
        (cert_path, key_path, der)
    }
}

// === HTTPS client ===

/// A TLS connector trusting only `ca_pem`, offering `alpn`.
pub fn connector(ca_pem: &str, alpn: &[&[u8]]) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

pub async fn tls_connect(addr: SocketAddr, connector: &TlsConnector) -> TlsStream<TcpStream> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// A kept-alive HTTP/1.1 connection to the webhook.
pub struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Client {
    pub async fn connect(addr: SocketAddr, connector: &TlsConnector) -> Self {
        let tls = tls_connect(addr, connector).await;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        tokio::spawn(connection);
        Self { sender }
    }

    pub async fn request(&mut self, method: &str, path: &str, body: Vec<u8>) -> (u16, Bytes) {
        self.sender.ready().await.unwrap();
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = self.sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, body)
    }

    /// POSTs a review and returns the HTTP status and the JSON answer.
    pub async fn review(&mut self, path: &str, review: &Value) -> (u16, Value) {
        let (status, body) = self
            .request("POST", path, serde_json::to_vec(review).unwrap())
            .await;
        let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        (status, value)
    }
}

// === fake Kubernetes API ===

/// The shared fake API server (`ic-fake-apiserver`) over HTTP, with the
/// helpers these tests use: CacheBackends by namespace, namespaces whose
/// list fails with 500, and how many lists it answered.
#[derive(Clone, Default)]
pub struct FakeApi {
    pub api: ic_fake_apiserver::FakeApi,
    served: Arc<Mutex<Vec<ic_fake_apiserver::Served>>>,
}

impl FakeApi {
    /// Serves on a loopback port (until this value and its clones drop);
    /// returns its address.
    pub async fn serve(&self) -> SocketAddr {
        let served = self
            .api
            .serve("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = served.addr;
        self.served.lock().unwrap().push(served);
        addr
    }

    /// Stores `items` (CacheBackend objects) in `namespace`.
    pub fn set(&self, namespace: &str, items: Vec<Value>) {
        for mut item in items {
            item["metadata"]["namespace"] = json!(namespace);
            self.api.insert(&item);
        }
    }

    /// Every CacheBackend list in `namespace` fails with 500 from now on.
    pub fn fail(&self, namespace: &str) {
        self.api.fail(
            http::Method::GET,
            &format!("/namespaces/{namespace}/cachebackends"),
            500,
            usize::MAX,
        );
    }

    /// Every CacheBackend request (lists, watches) fails with 500 from now
    /// on: the webhook's store never syncs.
    pub fn fail_all(&self) {
        self.api
            .fail(http::Method::GET, "/cachebackends", 500, usize::MAX);
    }

    /// How many namespaced CacheBackend LISTs were answered (the live
    /// path of pod admission).
    pub fn lists(&self) -> usize {
        self.cachebackend_gets(true)
    }

    /// How many cluster-wide CacheBackend LISTs were answered (the store's).
    pub fn cluster_lists(&self) -> usize {
        self.cachebackend_gets(false)
    }

    fn cachebackend_gets(&self, namespaced: bool) -> usize {
        self.api
            .requests()
            .iter()
            .filter(|r| r.method == http::Method::GET && r.path.ends_with("/cachebackends"))
            .filter(|r| r.query.get("watch").is_none_or(|w| w != "true"))
            .filter(|r| r.path.contains("/namespaces/") == namespaced)
            .count()
    }
}

/// A kubeconfig pointing at a plain-HTTP API server on `addr`.
pub fn write_kubeconfig(dir: &Path, addr: SocketAddr) -> PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{addr}\n\
             users:\n- name: u\n  user:\n    token: ic-webhook-sa-token\n\
             contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    path
}

// === the binary ===

pub const SUBSCRIBER_IMAGE: &str = "ghcr.io/inferencecache/kvevent-subscriber:test";
pub const INDEX_SERVER: &str = "http://ic-index-server.inferencecache-system:9090";
/// The audience the chart gives the index server's access control.
pub const INDEX_SERVER_AUDIENCE: &str = "inferencecache";

/// The real `ic-webhook` with a CA-signed serving pair in a temp dir.
pub struct Webhook {
    pub process: ic_e2e::ServiceProcess,
    pub https: SocketAddr,
    pub admin: SocketAddr,
    pub ca: TestCa,
    pub dir: tempfile::TempDir,
    pub cert_der: Vec<u8>,
}

impl Webhook {
    pub fn start(binary: &Path, api: SocketAddr, extra: &[&str]) -> Self {
        let ca = TestCa::new();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key, cert_der) = ca.write_pair(dir.path(), "ic-webhook-1");
        let kubeconfig = write_kubeconfig(dir.path(), api);
        let mut args = vec![
            "--admin-addr",
            "127.0.0.1:0",
            "--https-addr",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--kvevent-subscriber-image",
            SUBSCRIBER_IMAGE,
            "--index-server",
            INDEX_SERVER,
            "--index-server-audience",
            INDEX_SERVER_AUDIENCE,
        ];
        // Stop at once on SIGTERM unless a test is about the drain.
        if !extra.iter().any(|a| a.starts_with("--drain-seconds")) {
            args.extend_from_slice(&["--drain-seconds", "0"]);
        }
        args.extend_from_slice(extra);
        let mut process = ic_e2e::ServiceProcess::start_with_env(
            binary,
            &args,
            &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
        );
        let https = process.addr("https");
        let admin = process.admin_addr();
        Self {
            process,
            https,
            admin,
            ca,
            dir,
            cert_der,
        }
    }

    pub fn connector(&self) -> TlsConnector {
        connector(&self.ca.pem(), &[b"http/1.1"])
    }

    pub async fn client(&self) -> Client {
        Client::connect(self.https, &self.connector()).await
    }

    /// Waits until the CacheBackend store has synced (admissions then read
    /// it instead of listing).
    pub async fn wait_store_synced(&self) {
        for _ in 0..200 {
            if self
                .metrics()
                .contains("inferencecache_webhook_backend_store_synced 1")
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        panic!("the webhook's CacheBackend store did not sync in 5 s");
    }

    /// The admin /metrics text.
    pub fn metrics(&self) -> String {
        let (status, body) = ic_e2e::http_get(self.admin, "/metrics");
        assert_eq!(status, 200);
        body
    }
}
