//! `ic-webhook`: CacheBackend defaulting/validation and engine Pod wiring.
//!
//! This build serves the admin endpoints and fixes the flag contract; the
//! HTTPS admission server is not served yet.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use tokio_util::sync::CancellationToken;

/// Binary name.
pub const BINARY: &str = "ic-webhook";

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
}

/// Runs the webhook until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let metrics = MetricsRegistry::new("inferencecache", BINARY);
    let health = Health::new();
    let admin = AdminServer::bind(
        config.admin_addr,
        health.clone(),
        metrics,
        axum::Router::new(),
    )
    .await
    .context("starting admin server")?;
    tracing::info!(https_addr = %config.https_addr, "webhook started (admission server not served in this build)");
    health.set_ready(true);
    admin.serve(shutdown).await.context("admin server")?;
    tracing::info!("webhook stopped");
    Ok(())
}
