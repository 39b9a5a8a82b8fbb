//! `ic-webhook`: CacheBackend defaulting/validation and engine Pod wiring.
//!
//! The HTTPS admission server ([`server`]) answers `AdmissionReview` v1
//! requests on `/mutate-cachebackend`, `/validate-cachebackend` and
//! `/mutate-pod`; the decisions themselves are pure functions here
//! ([`cachebackend`], [`pod`]) over the rules in `ic-api` and the adapters in
//! `ic-adapters`. The admin server (`/live`, `/ready`, `/metrics`) is the
//! shared one from `ic-telemetry`.

pub mod cachebackend;
pub mod metrics;
pub mod pod;
pub mod review;
pub mod server;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ic_adapters::admission::InjectionConfig;
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::pod::KubeBackends;
use crate::server::{AppState, HttpsServer};
use crate::tls::CertStore;

/// Binary name.
pub const BINARY: &str = "ic-webhook";

/// The API server's own request-size ceiling.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 3 * 1024 * 1024;

/// Webhook flags.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Admin listen address (/live, /ready, /metrics).
    #[arg(long, env = "IC_ADMIN_ADDR", default_value = "0.0.0.0:8084")]
    pub admin_addr: SocketAddr,
    /// HTTPS listen address for AdmissionReview requests.
    #[arg(long, env = "IC_HTTPS_ADDR", default_value = "0.0.0.0:9443")]
    pub https_addr: SocketAddr,
    /// PEM certificate chain (reloaded on rotation).
    #[arg(long, env = "IC_TLS_CERT", default_value = "/tls/tls.crt")]
    pub tls_cert: PathBuf,
    /// PEM private key (reloaded on rotation).
    #[arg(long, env = "IC_TLS_KEY", default_value = "/tls/tls.key")]
    pub tls_key: PathBuf,
    /// How often the certificate files are checked for rotation, seconds.
    #[arg(long, env = "IC_TLS_RELOAD_INTERVAL_SECONDS", default_value_t = 5)]
    pub tls_reload_interval_seconds: u64,
    /// Image of the kvevent-subscriber sidecar; unset injects no subscriber.
    #[arg(long, env = "IC_KVEVENT_SUBSCRIBER_IMAGE")]
    pub kvevent_subscriber_image: Option<String>,
    /// Index server gRPC URL the injected subscribers dial.
    #[arg(
        long,
        env = "IC_INDEX_SERVER",
        default_value = "http://inferencecache-index-server.inferencecache-system:9090"
    )]
    pub index_server: String,
    /// Kubeconfig to list CacheBackends with. Unset: the in-cluster service
    /// account, or $KUBECONFIG / ~/.kube/config.
    #[arg(long, env = "IC_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Largest AdmissionReview body accepted (larger ones get 413).
    #[arg(long, env = "IC_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,
    /// Deadline for reading and answering one admission request, ms.
    #[arg(long, env = "IC_REQUEST_TIMEOUT_MS", default_value_t = 8000)]
    pub request_timeout_ms: u64,
    /// Deadline for listing a namespace's CacheBackends, ms; beyond it the
    /// pod is admitted unwired (reason list_failed).
    #[arg(long, env = "IC_LIST_TIMEOUT_MS", default_value_t = 3000)]
    pub list_timeout_ms: u64,
}

async fn kube_client(config: &Config) -> anyhow::Result<kube::Client> {
    let kube_config = match &config.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default())
                .await
                .with_context(|| format!("using --kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer().await.context(
            "the pod webhook lists CacheBackends and needs Kubernetes API credentials \
             (in-cluster service account, KUBECONFIG, or --kubeconfig)",
        )?,
    };
    kube::Client::try_from(kube_config).context("building the Kubernetes client")
}

/// Runs the webhook until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let registry = MetricsRegistry::new("inferencecache", BINARY);
    let metrics = Metrics::register(&registry);
    let health = Health::new();

    let certs = Arc::new(
        CertStore::load(&config.tls_cert, &config.tls_key).with_context(|| {
            format!(
                "loading the serving certificate (--tls-cert {}, --tls-key {})",
                config.tls_cert.display(),
                config.tls_key.display()
            )
        })?,
    );
    let tls = certs.server_config()?;
    let client = kube_client(&config).await?;

    let state = Arc::new(AppState {
        metrics: metrics.clone(),
        backends: Arc::new(KubeBackends::new(
            client,
            Duration::from_millis(config.list_timeout_ms),
            metrics.clone(),
        )),
        injection: InjectionConfig {
            subscriber_image: config.kvevent_subscriber_image.clone(),
            index_server: config.index_server.clone(),
        },
        max_body_bytes: config.max_request_bytes,
        request_timeout: Duration::from_millis(config.request_timeout_ms),
    });
    let https = HttpsServer::bind(config.https_addr, tls, server::router(state))
        .await
        .with_context(|| format!("binding --https-addr {}", config.https_addr))?;
    let admin = AdminServer::bind(
        config.admin_addr,
        health.clone(),
        registry,
        axum::Router::new(),
    )
    .await
    .context("starting admin server")?;

    let watcher = tokio::spawn(certs.watch(
        Duration::from_secs(config.tls_reload_interval_seconds.max(1)),
        metrics,
        shutdown.clone(),
    ));
    health.set_ready(true);
    // Whichever server stops first (an error, or the signal) stops the other.
    let https = async {
        let result = https.serve(shutdown.clone()).await;
        shutdown.cancel();
        result
    };
    let admin = async {
        let result = admin.serve(shutdown.clone()).await;
        shutdown.cancel();
        result
    };
    let (https, admin) = tokio::join!(https, admin);
    health.set_ready(false);
    shutdown.cancel();
    let _ = watcher.await;
    https.context("admission server")?;
    admin.context("admin server")?;
    tracing::info!("webhook stopped");
    Ok(())
}
