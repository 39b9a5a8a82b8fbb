//! `ic-kvevent-subscriber`: the engine-pod sidecar that turns the engine's
//! KV-event stream into index updates.
//!
//! This build serves the process plumbing and fixes the flag contract the
//! webhook injects (DESIGN.md §7); the ZMQ listener and forwarding are not
//! wired yet.

use std::net::SocketAddr;

use anyhow::Context;
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use tokio_util::sync::CancellationToken;

/// Binary name, as the webhook injects it.
pub const BINARY: &str = "ic-kvevent-subscriber";

/// Fingerprint domain of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HashSchemeArg {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
}

/// Where index updates go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportArg {
    /// gRPC IngestEvents stream to the index server.
    Grpc,
}

/// Subscriber flags (each with an env fallback; identity comes from the
/// downward API).
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Admin listen address (/live, /ready, /metrics).
    #[arg(long, env = "IC_ADMIN_ADDR", default_value = "0.0.0.0:8083")]
    pub admin_addr: SocketAddr,

    /// Engine KV-event publisher (ZMQ PUB).
    #[arg(
        long,
        env = "IC_ENGINE_ENDPOINT",
        default_value = "tcp://127.0.0.1:5557"
    )]
    pub engine_endpoint: String,

    /// Engine replay endpoint (ZMQ ROUTER) used to recover sequence gaps.
    #[arg(long, env = "IC_REPLAY_ENDPOINT")]
    pub replay_endpoint: Option<String>,

    /// ZMQ topic filter (empty subscribes to everything).
    #[arg(long, env = "IC_TOPIC", default_value = "")]
    pub topic: String,

    /// Data-parallel ranks the engine runs; rank r publishes on port + r.
    #[arg(long, env = "IC_DP_RANKS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub dp_ranks: u32,

    /// Model identity reported to the index.
    #[arg(long, env = "IC_MODEL_ID")]
    pub model_id: String,

    /// Fingerprint domain.
    #[arg(long, env = "IC_HASH_SCHEME", value_enum, default_value_t = HashSchemeArg::Vllm)]
    pub hash_scheme: HashSchemeArg,

    /// Offload mode: a BlockRemoved re-reports the prefix at tier 2 instead of
    /// evicting it.
    #[arg(long, env = "IC_IGNORE_BLOCK_REMOVED", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub ignore_block_removed: bool,

    /// Index server gRPC URL.
    #[arg(long, env = "IC_INDEX_SERVER", default_value = "http://127.0.0.1:9090")]
    pub index_server: String,

    /// Replica id (the pod name).
    #[arg(long, env = "POD_NAME")]
    pub replica_id: String,

    /// Tenant (the pod namespace).
    #[arg(long, env = "POD_NAMESPACE")]
    pub tenant: String,

    /// Engine serving address ip:port; defaults to POD_IP and --engine-port.
    #[arg(long, env = "IC_ADDRESS")]
    pub address: Option<String>,

    /// Pod IP (downward API), used when --address is not given.
    #[arg(long, env = "POD_IP")]
    pub pod_ip: Option<String>,

    /// Engine serving port, used when --address is not given.
    #[arg(long, env = "IC_ENGINE_PORT", default_value_t = 8000)]
    pub engine_port: u16,

    /// Engine Prometheus endpoint scraped for tier-2 hit counters.
    #[arg(long, env = "IC_ENGINE_METRICS_URL")]
    pub engine_metrics_url: Option<String>,

    /// Transport to the index.
    #[arg(long, env = "IC_TRANSPORT", value_enum, default_value_t = TransportArg::Grpc)]
    pub transport: TransportArg,
}

impl Config {
    /// The serving address reported for this replica.
    pub fn serving_address(&self) -> Option<String> {
        self.address.clone().or_else(|| {
            self.pod_ip
                .as_ref()
                .map(|ip| format!("{ip}:{}", self.engine_port))
        })
    }
}

/// Runs the subscriber until `shutdown` is cancelled.
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
    tracing::info!(
        engine_endpoint = %config.engine_endpoint,
        model_id = %config.model_id,
        replica_id = %config.replica_id,
        tenant = %config.tenant,
        address = config.serving_address().as_deref().unwrap_or(""),
        "kvevent-subscriber started (ZMQ listener not wired in this build)"
    );
    health.set_ready(true);
    admin.serve(shutdown).await.context("admin server")?;
    tracing::info!("kvevent-subscriber stopped");
    Ok(())
}
