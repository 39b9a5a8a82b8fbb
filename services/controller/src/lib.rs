//! `ic-controller`: CacheBackend reconciliation, the CacheIndex poller and
//! the CachePolicy / CacheTenant pushers.
//!
//! This build serves the admin endpoints and fixes the flag contract; the
//! reconcilers are not running yet.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use tokio_util::sync::CancellationToken;

/// Binary name.
pub const BINARY: &str = "ic-controller";

/// Controller flags.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Admin listen address (/live, /ready, /metrics).
    #[arg(long, env = "IC_ADMIN_ADDR", default_value = "0.0.0.0:8082")]
    pub admin_addr: SocketAddr,
    /// Index server /probe URL; empty disables the functional-probe gate.
    #[arg(
        long,
        env = "IC_SERVER_PROBE_URL",
        default_value = "http://inferencecache-index-server.inferencecache-system:8081/probe"
    )]
    pub server_probe_url: String,
    /// Index server /snapshot URL read by the CacheIndex poller.
    #[arg(
        long,
        env = "IC_SNAPSHOT_URL",
        default_value = "http://inferencecache-index-server.inferencecache-system:8081/snapshot"
    )]
    pub snapshot_url: String,
    /// Coordinator base URL for CacheTenant quotas and pins; unset disables the pusher.
    #[arg(long, env = "IC_COORDINATOR_URL")]
    pub coordinator_url: Option<String>,
    /// kvevent-subscriber image the webhook injects (gates readiness expectations).
    #[arg(long, env = "IC_KVEVENT_SUBSCRIBER_IMAGE")]
    pub kvevent_subscriber_image: Option<String>,
    /// Projected service-account token presented to /probe.
    #[arg(
        long,
        env = "IC_PROBE_TOKEN_PATH",
        default_value = "/var/run/secrets/inferencecache.io/controller-token/token"
    )]
    pub probe_token_path: PathBuf,
}

/// Runs the controller until `shutdown` is cancelled.
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
    tracing::info!(snapshot_url = %config.snapshot_url, "controller started (reconcilers not running in this build)");
    health.set_ready(true);
    admin.serve(shutdown).await.context("admin server")?;
    tracing::info!("controller stopped");
    Ok(())
}
