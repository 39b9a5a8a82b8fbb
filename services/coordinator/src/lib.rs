//! `ic-coordinator`: the LMCache-compatible fleet coordinator.
//!
//! It takes the reference coordinator's own flags so an existing deployment
//! can swap the binary. This build serves `/healthz` and the admin endpoints
//! on the coordinator port; the REST API is not served yet.

use std::net::{IpAddr, SocketAddr};

use anyhow::Context;
use axum::routing::get;
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use tokio_util::sync::CancellationToken;

/// Binary name.
pub const BINARY: &str = "ic-coordinator";

/// Where cache events arrive from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EventTransport {
    /// `POST /events`.
    Http,
    /// The `lmcache-cache-events` Kafka topic.
    Kafka,
}

/// Coordinator flags (the reference coordinator's names and defaults).
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Listen host.
    #[arg(long, env = "IC_HOST", default_value = "0.0.0.0")]
    pub host: IpAddr,
    /// Listen port (REST API, /healthz, /metrics, /live, /ready).
    #[arg(long, env = "IC_PORT", default_value_t = 9300)]
    pub port: u16,
    /// HTTP keep-alive timeout, seconds.
    #[arg(long, env = "IC_TIMEOUT_KEEP_ALIVE", default_value_t = 10)]
    pub timeout_keep_alive: u64,
    /// Seconds without a heartbeat before an instance is dropped.
    #[arg(long, env = "IC_INSTANCE_TIMEOUT", default_value_t = 30.0)]
    pub instance_timeout: f64,
    /// Seconds between liveness sweeps (0 disables).
    #[arg(long, env = "IC_HEALTH_CHECK_INTERVAL", default_value_t = 10.0)]
    pub health_check_interval: f64,
    /// Seconds between quota eviction passes.
    #[arg(long, env = "IC_EVICTION_CHECK_INTERVAL", default_value_t = 5.0)]
    pub eviction_check_interval: f64,
    /// Fraction of a salt's usage evicted per pass once over quota.
    #[arg(long, env = "IC_EVICTION_RATIO", default_value_t = 0.2)]
    pub eviction_ratio: f64,
    /// Fraction of the quota that triggers eviction, in (0, 1].
    #[arg(long, env = "IC_TRIGGER_WATERMARK", default_value_t = 1.0)]
    pub trigger_watermark: f64,
    /// Tokens per chunk for token→key resolution.
    #[arg(long, env = "IC_CHUNK_SIZE", default_value_t = 256)]
    pub chunk_size: u32,
    /// Chunk hash algorithm.
    #[arg(long, env = "IC_HASH_ALGORITHM", default_value = "blake3")]
    pub hash_algorithm: String,
    /// Blend lookup (probe every stride-th chunk).
    #[arg(long, env = "IC_ENABLE_BLEND_LOOKUP", default_value_t = false)]
    pub enable_blend_lookup: bool,
    /// Stride of the blend probe.
    #[arg(long, env = "IC_BLEND_PROBE_STRIDE", default_value_t = 1)]
    pub blend_probe_stride: u32,
    /// Checkpoint file of derived state ("" disables).
    #[arg(long, env = "IC_CHECKPOINT_PATH", default_value = "")]
    pub checkpoint_path: String,
    /// Seconds between checkpoints.
    #[arg(long, env = "IC_CHECKPOINT_INTERVAL", default_value_t = 60.0)]
    pub checkpoint_interval: f64,
    /// Metadata file for quotas and pins ("" disables).
    #[arg(long, env = "IC_METADATA_PATH", default_value = "")]
    pub metadata_path: String,
    /// Extra JSON configuration (controller_packages, disabled_controllers).
    #[arg(long, env = "IC_EXTRA_CONFIG")]
    pub extra_config: Option<String>,
    /// Disable the metrics endpoint.
    #[arg(long, env = "IC_DISABLE_METRICS", default_value_t = false)]
    pub disable_metrics: bool,
    /// Event transport.
    #[arg(long, env = "IC_EVENT_TRANSPORT", value_enum, default_value_t = EventTransport::Http)]
    pub event_transport: EventTransport,
    /// Kafka bootstrap servers.
    #[arg(long, env = "IC_KAFKA_BOOTSTRAP_SERVERS")]
    pub kafka_bootstrap_servers: Option<String>,
    /// Kafka topic of cache events.
    #[arg(long, env = "IC_KAFKA_TOPIC", default_value = "lmcache-cache-events")]
    pub kafka_topic: String,
    /// Kafka consumer group.
    #[arg(long, env = "IC_KAFKA_GROUP_ID", default_value = "lmcache-coordinator")]
    pub kafka_group_id: String,
}

/// Runs the coordinator until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let metrics = MetricsRegistry::new("inferencecache", BINARY);
    let health = Health::new();
    let routes = axum::Router::new().route("/healthz", get(|| async { "ok\n" }));
    let addr = SocketAddr::new(config.host, config.port);
    let admin = AdminServer::bind(addr, health.clone(), metrics, routes)
        .await
        .context("starting HTTP server")?;
    tracing::info!(event_transport = ?config.event_transport, "coordinator started (REST API not served in this build)");
    health.set_ready(true);
    admin.serve(shutdown).await.context("HTTP server")?;
    tracing::info!("coordinator stopped");
    Ok(())
}
