//! `ic-index-server`: the prefix index behind `LookupRoute`.
//!
//! This build serves the process plumbing (admin endpoints on the HTTP port,
//! graceful shutdown) and fixes the command-line contract of DESIGN.md §7.
//! The gRPC `IndexService`, `/snapshot` and `/probe` are not served yet.

use std::net::SocketAddr;

use anyhow::Context;
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use tokio_util::sync::CancellationToken;

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
    let metrics = MetricsRegistry::new("inferencecache", BINARY);
    let health = Health::new();
    let admin = AdminServer::bind(
        config.http_addr,
        health.clone(),
        metrics,
        axum::Router::new(),
    )
    .await
    .context("starting HTTP server")?;
    tracing::info!(
        grpc_addr = %config.grpc_addr,
        engine_block_size = config.engine_block_size,
        capacity_entries = config.capacity_entries,
        tokenizers = config.tokenizers.len(),
        "index server started (gRPC IndexService not served in this build)"
    );
    health.set_ready(true);
    admin.serve(shutdown).await.context("HTTP server")?;
    tracing::info!("index server stopped");
    Ok(())
}

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
