//! `ic-webhook`: CacheBackend defaulting/validation and engine Pod wiring.
//!
//! The HTTPS admission server ([`server`]) answers `AdmissionReview` v1
//! requests on `/mutate-cachebackend`, `/validate-cachebackend` and
//! `/mutate-pod`; the decisions themselves are pure functions here
//! ([`cachebackend`], [`pod`]) over the rules in `ic-api` and the adapters in
//! `ic-adapters`. The admin server (`/live`, `/ready`, `/metrics`) is the
//! shared one from `ic-telemetry`. On SIGTERM the webhook drains
//! (`ic_telemetry::drain`): not ready at once, still answering for
//! `--drain-seconds`, then it stops.

pub mod cachebackend;
pub mod certs;
pub mod kafka;
pub mod metrics;
pub mod pod;
pub mod review;
pub mod server;
pub mod store;
/// The serving certificate store, shared with the index server.
pub use ic_telemetry::tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ic_adapters::admission::{IndexServerDiscovery, InjectionConfig};
use ic_adapters::providers::images::ProviderImageDefaults;
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use tokio_util::sync::CancellationToken;

use crate::certs::{ManagedCertificates, ManagedConfig};
use crate::metrics::Metrics;
use crate::pod::KubeBackends;
use crate::server::{AppState, HttpsServer};
use crate::store::StoreBackends;
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
    /// Where the serving certificate comes from: `files` (--tls-cert and
    /// --tls-key, reloaded when they change: cert-manager or your own
    /// Secret) or `managed` (the webhook keeps its own CA and certificate in
    /// --cert-secret, renews them and writes the CA into its webhook
    /// configurations).
    #[arg(long, env = "IC_CERTIFICATES", value_enum, default_value_t = CertificateMode::Files)]
    pub certificates: CertificateMode,
    /// PEM certificate chain (reloaded on rotation).
    #[arg(long, env = "IC_TLS_CERT", default_value = "/tls/tls.crt")]
    pub tls_cert: PathBuf,
    /// PEM private key (reloaded on rotation).
    #[arg(long, env = "IC_TLS_KEY", default_value = "/tls/tls.key")]
    pub tls_key: PathBuf,
    /// How often the certificate files are checked for rotation, seconds.
    #[arg(long, env = "IC_TLS_RELOAD_INTERVAL_SECONDS", default_value_t = 5)]
    pub tls_reload_interval_seconds: u64,
    /// Managed mode: the Secret holding the CA and serving certificate.
    #[arg(
        long,
        env = "IC_CERT_SECRET",
        default_value = "inferencecache-webhook-tls"
    )]
    pub cert_secret: String,
    /// Managed mode: the Secret's namespace (the webhook's own).
    #[arg(
        long,
        env = "IC_CERT_NAMESPACE",
        default_value = "inferencecache-system"
    )]
    pub cert_namespace: String,
    /// Managed mode: the webhook Service the certificate is for (its DNS
    /// names in --cert-namespace go into the certificate).
    #[arg(
        long,
        env = "IC_CERT_SERVICE",
        default_value = "inferencecache-webhook"
    )]
    pub cert_service: String,
    /// Managed mode: the cluster's DNS domain.
    #[arg(long, env = "IC_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,
    /// Managed mode: MutatingWebhookConfigurations to write the CA into
    /// (comma-separated or repeated).
    #[arg(
        long,
        env = "IC_MUTATING_WEBHOOK_CONFIGURATION",
        value_delimiter = ',',
        default_value = "inferencecache-webhook"
    )]
    pub mutating_webhook_configuration: Vec<String>,
    /// Managed mode: ValidatingWebhookConfigurations to write the CA into.
    #[arg(
        long,
        env = "IC_VALIDATING_WEBHOOK_CONFIGURATION",
        value_delimiter = ',',
        default_value = "inferencecache-webhook"
    )]
    pub validating_webhook_configuration: Vec<String>,
    /// Managed mode: lifetime of a serving certificate, seconds (renewed
    /// with a third left).
    #[arg(long, env = "IC_SERVING_CERT_VALIDITY_SECONDS", default_value_t = 90 * 24 * 3600,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub serving_cert_validity_seconds: u64,
    /// Managed mode: lifetime of the CA, seconds (renewed with a third left;
    /// the old CA stays trusted until it expires).
    #[arg(long, env = "IC_CA_VALIDITY_SECONDS", default_value_t = 10 * 365 * 24 * 3600,
          value_parser = clap::value_parser!(u64).range(10..))]
    pub ca_validity_seconds: u64,
    /// Managed mode: seconds between checks of the Secret and the webhook
    /// configurations.
    #[arg(long, env = "IC_CERT_CHECK_INTERVAL_SECONDS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub cert_check_interval_seconds: u64,
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
    /// How the injected subscribers find the index-server replicas
    /// (their --index-server-discovery): `static` streams to the
    /// --index-server URL as one destination; `dns` re-resolves its host (a
    /// headless Service) and streams to every replica address.
    #[arg(long, env = "IC_INDEX_SERVER_DISCOVERY", value_enum, default_value_t = Discovery::Static)]
    pub index_server_discovery: Discovery,
    /// Audience of the projected service-account token the injected
    /// subscriber presents to the index server (its --api-audience); unset
    /// mounts no token.
    #[arg(long, env = "IC_INDEX_SERVER_AUDIENCE")]
    pub index_server_audience: Option<String>,
    /// CA bundle (PEM file) of an `https://` --index-server, injected into
    /// each subscriber; read at start (a new CA needs a webhook restart,
    /// and pods admitted before it keep the old one until they restart).
    #[arg(long, env = "IC_INDEX_SERVER_CA_FILE")]
    pub index_server_ca_file: Option<PathBuf>,
    /// OTLP collector the injected subscribers export to (their
    /// --otlp-endpoint), e.g. `http://$(HOST_IP):4317` for a collector agent
    /// on each node; unset, sidecars export nothing.
    #[arg(long, env = "IC_SUBSCRIBER_OTLP_ENDPOINT")]
    pub subscriber_otlp_endpoint: Option<String>,
    /// `--subscriber-transport` and the `--subscriber-kafka-*` settings:
    /// injected subscribers produce to the index's Kafka topic.
    #[command(flatten)]
    pub subscriber_kafka: kafka::SubscriberKafkaFlags,
    /// Pull secrets added to every pod the webhook wires, unless the pod
    /// names them already (comma-separated or repeated): the injected
    /// subscriber then pulls from the same private registry. They are
    /// Secrets of the engine pod's namespace.
    #[arg(
        long = "image-pull-secret",
        env = "IC_IMAGE_PULL_SECRETS",
        value_delimiter = ','
    )]
    pub image_pull_secrets: Vec<String>,
    /// Registry replacing `docker.io` in the default images of managed
    /// providers (Redis, LMCache server, Mooncake): the defaulting webhook
    /// writes the re-homed image, and the --image-pull-secret names, into
    /// each Managed CacheBackend that sets no image of its own.
    #[arg(long, env = "IC_PROVIDER_IMAGE_REGISTRY")]
    pub provider_image_registry: Option<String>,
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
    /// Close an HTTPS connection that moved no bytes for this many seconds
    /// (one that never sends a request, or an idle keep-alive or HTTP/2
    /// connection; the API server reconnects when it needs to).
    #[arg(long, env = "IC_CONNECTION_IDLE_TIMEOUT_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub connection_idle_timeout_seconds: u64,
    /// The deadline of a request's headers.
    #[command(flatten)]
    pub header_deadline: ic_telemetry::serving::HeaderDeadlineFlags,
    /// Close a connection whose TLS handshake has not finished this many
    /// seconds after it was accepted (`tls_handshake_failures_total`).
    #[arg(long, env = "IC_TLS_HANDSHAKE_TIMEOUT_SECONDS", default_value_t = ic_telemetry::serving::HANDSHAKE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub tls_handshake_timeout_seconds: u64,
    /// Deadline for listing a namespace's CacheBackends, ms; beyond it the
    /// pod is admitted unwired (reason list_failed).
    #[arg(long, env = "IC_LIST_TIMEOUT_MS", default_value_t = 3000)]
    pub list_timeout_ms: u64,
    /// After SIGTERM: /ready fails at once and admissions are answered for
    /// this long (the API server calls a terminating replica until it sees
    /// the endpoint go), then the servers stop.
    #[command(flatten)]
    pub drain: ic_telemetry::drain::DrainFlags,
}

/// `--index-server-discovery`, as the subscriber spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Discovery {
    /// The URL is one destination.
    Static,
    /// The URL's host is re-resolved; every address is a destination.
    Dns,
}

impl From<Discovery> for IndexServerDiscovery {
    fn from(d: Discovery) -> Self {
        match d {
            Discovery::Static => Self::Static,
            Discovery::Dns => Self::Dns,
        }
    }
}

/// Where the serving certificate comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CertificateMode {
    /// PEM files, reloaded when they change.
    Files,
    /// The webhook's own CA and certificate, kept in a Secret.
    Managed,
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

fn managed_config(config: &Config) -> ManagedConfig {
    ManagedConfig {
        secret: config.cert_secret.clone(),
        namespace: config.cert_namespace.clone(),
        mutating: config.mutating_webhook_configuration.clone(),
        validating: config.validating_webhook_configuration.clone(),
        settings: certs::Settings {
            service: config.cert_service.clone(),
            namespace: config.cert_namespace.clone(),
            cluster_domain: config.cluster_domain.clone(),
            serving_validity: Duration::from_secs(config.serving_cert_validity_seconds),
            ca_validity: Duration::from_secs(config.ca_validity_seconds),
        },
    }
}

/// Runs the webhook until `signal` (SIGTERM) is cancelled and the drain
/// period after it has passed.
pub async fn run(config: Config, signal: CancellationToken) -> anyhow::Result<()> {
    let registry = MetricsRegistry::new("inferencecache", BINARY);
    let metrics = Metrics::register(&registry);
    let health = Health::new();
    // The servers stop on this: `--drain-seconds` after the signal, with
    // /ready failing from the signal on.
    let shutdown =
        ic_telemetry::drain::drain(signal.clone(), health.clone(), config.drain.period());
    // The admin server answers /live from the start; /ready waits for a
    // serving certificate and the HTTPS listener.
    let admin = AdminServer::bind(
        config.admin_addr,
        health.clone(),
        registry,
        axum::Router::new(),
    )
    .await
    .context("starting admin server")?;
    let admin = tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let result = admin.serve(shutdown.clone()).await;
            // Whichever server stops first (an error, or the signal) stops the other.
            shutdown.cancel();
            result
        }
    });
    let served = serve_admissions(&config, &metrics, &health, &signal, &shutdown).await;
    health.set_ready(false);
    shutdown.cancel();
    let admin = admin.await.context("admin server task")?;
    served?;
    admin.context("admin server")?;
    tracing::info!("webhook stopped");
    Ok(())
}

/// Sets up the serving certificate, then serves admission requests until
/// `shutdown`. A `signal` before anything is served stops it at once:
/// there is nothing to drain.
async fn serve_admissions(
    config: &Config,
    metrics: &Metrics,
    health: &Health,
    signal: &CancellationToken,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    // A broken certificate file is reported before anything else.
    let files = match config.certificates {
        CertificateMode::Files => Some(
            CertStore::load(&config.tls_cert, &config.tls_key).with_context(|| {
                format!(
                    "loading the serving certificate (--tls-cert {}, --tls-key {})",
                    config.tls_cert.display(),
                    config.tls_key.display()
                )
            })?,
        ),
        CertificateMode::Managed => None,
    };
    let index_server_ca_pem = match &config.index_server_ca_file {
        Some(path) => {
            let pem = ic_telemetry::tls::read_ca_file(path)
                .with_context(|| format!("--index-server-ca-file {}", path.display()))?;
            Some(String::from_utf8(pem).with_context(|| {
                format!("--index-server-ca-file {}: not PEM text", path.display())
            })?)
        }
        None => None,
    };
    let subscriber_kafka = config
        .subscriber_kafka
        .injection()
        .context("the subscribers' Kafka settings")?;
    let client = kube_client(config).await?;
    let (certs, managed) = match files {
        Some(store) => (Arc::new(store), None),
        None => {
            let store = Arc::new(CertStore::empty());
            let managed = ManagedCertificates::new(
                client.clone(),
                managed_config(config),
                store.clone(),
                metrics.clone(),
            );
            // Serve nothing until a certificate is in place.
            let report = match managed.first_sync(signal).await {
                Ok(report) => report,
                // Stopped while waiting for the API server: a clean stop.
                Err(_) if signal.is_cancelled() => return Ok(()),
                Err(e) => return Err(e).context("setting up the managed webhook certificates"),
            };
            tracing::info!(
                secret = %format!("{}/{}", config.cert_namespace, config.cert_secret),
                renewed = report.renewed.map(|r| r.label()),
                ca_bundles_written = report.ca_bundles_written,
                missing_configurations = ?report.missing_configurations,
                "managed webhook certificates in place"
            );
            (store, Some(managed))
        }
    };
    let state = Arc::new(AppState {
        metrics: metrics.clone(),
        backends: Arc::new(StoreBackends::start(
            client.clone(),
            KubeBackends::new(
                client,
                Duration::from_millis(config.list_timeout_ms),
                metrics.clone(),
            ),
            metrics.clone(),
            shutdown.clone(),
        )),
        injection: InjectionConfig {
            subscriber_image: config.kvevent_subscriber_image.clone(),
            index_server: config.index_server.clone(),
            index_server_audience: config
                .index_server_audience
                .clone()
                .filter(|a| !a.trim().is_empty()),
            index_server_ca_pem,
            subscriber_otlp_endpoint: config
                .subscriber_otlp_endpoint
                .clone()
                .filter(|e| !e.trim().is_empty()),
            index_server_discovery: config.index_server_discovery.into(),
            image_pull_secrets: config.image_pull_secrets.clone(),
            subscriber_kafka,
        },
        provider_images: ProviderImageDefaults {
            registry: config
                .provider_image_registry
                .clone()
                .filter(|r| !r.trim().is_empty()),
            pull_secrets: config.image_pull_secrets.clone(),
        },
        max_body_bytes: config.max_request_bytes,
        request_timeout: Duration::from_millis(config.request_timeout_ms),
    });
    let limits = server::ConnectionLimits {
        idle: (
            Duration::from_secs(config.connection_idle_timeout_seconds),
            metrics.idle_connections_closed.clone(),
        ),
        header_read: (
            config.header_deadline.timeout(),
            metrics.header_read_timeouts.clone(),
        ),
        handshake: (
            Duration::from_secs(config.tls_handshake_timeout_seconds),
            metrics.tls_handshake_failures.clone(),
        ),
    };
    let https = HttpsServer::bind(
        config.https_addr,
        certs.clone(),
        server::router(state),
        limits,
    )
    .await
    .with_context(|| format!("binding --https-addr {}", config.https_addr))?;
    let watcher = match managed {
        Some(managed) => tokio::spawn(managed.run(
            Duration::from_secs(config.cert_check_interval_seconds),
            shutdown.clone(),
        )),
        None => {
            let metrics = metrics.clone();
            tokio::spawn(certs.watch(
                Duration::from_secs(config.tls_reload_interval_seconds.max(1)),
                move |ok| metrics.tls_reload(ok),
                shutdown.clone(),
            ))
        }
    };
    health.set_ready(true);
    let served = https.serve(shutdown.clone()).await;
    shutdown.cancel();
    let _ = watcher.await;
    served.context("admission server")
}
