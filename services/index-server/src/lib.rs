//! `ic-index-server`: the prefix index behind `LookupRoute`.
//!
//! Serves the gRPC `IndexService` (LookupRoute, IngestEvents, SetPolicies)
//! over an [`ic_index::Index`], and `/snapshot` plus the admin endpoints on
//! its HTTP port.

pub mod convert;
pub mod grpc;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod policy;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use ic_index::{Index, IndexConfig};
use ic_proto::IndexServiceServer;
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use parking_lot::RwLock;
use tokio_util::sync::CancellationToken;

use crate::grpc::IndexServer;
use crate::metrics::Metrics;

/// Binary name, as deployment manifests reference it.
pub const BINARY: &str = "ic-index-server";

/// A `--tokenizer MODEL=PATH` pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerSpec {
    /// Model id as lookups name it.
    pub model: String,
    /// Path to a Hugging Face `tokenizer.json`.
    pub path: std::path::PathBuf,
}

impl std::str::FromStr for TokenizerSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('=') {
            Some((model, path)) if !model.is_empty() && !path.is_empty() => Ok(Self {
                model: model.to_owned(),
                path: path.into(),
            }),
            _ => Err(format!("expected MODEL=PATH, got {s:?}")),
        }
    }
}

/// Index server flags.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// gRPC listen address (LookupRoute, IngestEvents, SetPolicies).
    #[arg(long, env = "IC_GRPC_ADDR", default_value = "0.0.0.0:9090")]
    pub grpc_addr: SocketAddr,

    /// HTTP listen address: /snapshot, /probe, /healthz plus /live, /ready, /metrics.
    #[arg(
        long,
        visible_alias = "admin-addr",
        env = "IC_HTTP_ADDR",
        default_value = "0.0.0.0:8081"
    )]
    pub http_addr: SocketAddr,

    /// Block size (tokens) for raw token_ids lookups when none was learned
    /// from events of the same scope.
    #[arg(long, env = "IC_ENGINE_BLOCK_SIZE", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub engine_block_size: u32,

    /// Maximum resident (replica, block) entries before the least recently
    /// stored are evicted.
    #[arg(long, env = "IC_CAPACITY_ENTRIES", default_value_t = 10_000_000)]
    pub capacity_entries: u64,

    /// Tokenizer for prompt_text lookups, MODEL=PATH to a tokenizer.json (repeatable).
    #[arg(long = "tokenizer", env = "IC_TOKENIZERS", value_delimiter = ',')]
    pub tokenizers: Vec<TokenizerSpec>,

    /// Audience a /probe bearer token must carry (Kubernetes TokenReview).
    #[arg(long, env = "IC_PROBE_AUDIENCE")]
    pub probe_audience: Option<String>,

    /// Static bearer token for /probe in local mode (no cluster).
    #[arg(long, env = "IC_PROBE_STATIC_TOKEN", hide_env_values = true)]
    pub probe_static_token: Option<String>,
}

/// Runs the server until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    if let Some(t) = config.tokenizers.first() {
        anyhow::bail!(
            "--tokenizer {}={}: prompt_text lookups are not supported by this build yet; \
             send token_ids or block_hashes",
            t.model,
            t.path.display()
        );
    }
    let registry = MetricsRegistry::new("inferencecache", BINARY);
    let metrics = Metrics::register(&registry);
    let index = Arc::new(Index::new(IndexConfig {
        capacity_entries: config.capacity_entries,
        ..IndexConfig::default()
    }));
    let health = Health::new();
    let admin = AdminServer::bind(
        config.http_addr,
        health.clone(),
        registry,
        http::router(index.clone()),
    )
    .await
    .context("starting HTTP server")?;
    let grpc_listener = tokio::net::TcpListener::bind(config.grpc_addr)
        .await
        .with_context(|| format!("cannot bind gRPC server to {}", config.grpc_addr))?;
    let grpc_addr = grpc_listener.local_addr()?;
    let service = IndexServer {
        index,
        policies: Arc::new(RwLock::new(policy::Policies::default())),
        default_block_size: config.engine_block_size,
        metrics,
    };
    let grpc = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tracing::info!(addr = %grpc_addr, "grpc server listening");
            tonic::transport::Server::builder()
                .add_service(IndexServiceServer::new(service))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(grpc_listener),
                    shutdown.cancelled_owned(),
                )
                .await
        })
    };
    tracing::info!(
        engine_block_size = config.engine_block_size,
        capacity_entries = config.capacity_entries,
        "index server started"
    );
    health.set_ready(true);
    let served = admin.serve(shutdown.clone()).await;
    shutdown.cancel();
    let grpc_result = grpc.await.context("gRPC server task")?;
    served.context("HTTP server")?;
    grpc_result.context("gRPC server")?;
    tracing::info!("index server stopped");
    Ok(())
}

/// The address a `run` bound for gRPC is logged as `grpc server listening`
/// (field `addr`), so callers passing port 0 can find it.
pub const GRPC_LISTENING_LOG: &str = "grpc server listening";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_spec_parses_and_rejects() {
        let spec: TokenizerSpec = "llama=/models/llama/tokenizer.json".parse().unwrap();
        assert_eq!(spec.model, "llama");
        assert_eq!(
            spec.path,
            std::path::Path::new("/models/llama/tokenizer.json")
        );
        assert!("llama".parse::<TokenizerSpec>().is_err());
        assert!("=x".parse::<TokenizerSpec>().is_err());
        assert!("x=".parse::<TokenizerSpec>().is_err());
    }
}
