//! `ic-index-server`: the prefix index behind `LookupRoute`.
//!
//! Serves the gRPC `IndexService` (LookupRoute, IngestEvents, SetPolicies)
//! over an [`ic_index::Index`] (and, when configured, llm-d's
//! `IndexerService` beside it and the Gateway API endpoint picker on its
//! own port), and `/snapshot` plus the admin endpoints on its HTTP port.

pub mod access;
pub mod auth;
pub mod conn;
pub mod convert;
pub mod epp;
pub mod epp_config;
pub mod epp_observed;
pub mod epp_usage;
pub mod epp_wire;
pub mod grpc;
pub mod http;
pub mod index_core;
pub mod ingest;
pub mod kafka;
pub mod llmd;
pub mod message_bound;
pub mod metrics;
pub mod openai;
pub mod peers;
pub mod policy;
pub mod pool;
pub mod probe;
pub mod readiness;
pub mod routing;
pub mod snapshot;
pub mod streams;
pub mod tokenize;

pub use tokenize::TokenizerSpec;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ic_index::{Index, IndexConfig};
use ic_proto::IndexServiceServer;
use ic_telemetry::serving::{ServeOptions, ServingListener};
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use tokio_util::sync::CancellationToken;

use crate::auth::{ProbeAuth, TokenReviewer};
use crate::grpc::IndexServer;
use crate::index_core::IndexCore;
use crate::metrics::{IndexMemoryCollector, Metrics};
use crate::probe::Prober;
use crate::tokenize::Tokenizers;

/// Binary name, as deployment manifests reference it.
pub const BINARY: &str = "ic-index-server";

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

    /// Most replicas (tenant, replica id, data-parallel rank) the index
    /// knows at once; a batch of one more ends its stream until silent
    /// ones expire.
    #[arg(long, env = "IC_MAX_REPLICAS", default_value_t = ic_index::DEFAULT_MAX_REPLICAS, value_parser = clap::value_parser!(u32).range(1..i64::from(ic_index::MAX_REPLICA_SLOTS)))]
    pub max_replicas: u32,

    /// Most scopes (tenant, model, hash scheme, adapter) the index keeps;
    /// they are kept for good, so a batch naming one more ends its stream.
    #[arg(long, env = "IC_MAX_SCOPES", default_value_t = ic_index::DEFAULT_MAX_SCOPES, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_scopes: u32,

    /// Tokenizer for prompt_text lookups, MODEL=PATH to a tokenizer.json (repeatable).
    #[arg(long = "tokenizer", env = "IC_TOKENIZERS", value_delimiter = ',')]
    pub tokenizers: Vec<TokenizerSpec>,

    /// MODEL=JSON-OBJECT: the model's chat template variables by default,
    /// as the engine's `--default-chat-template-kwargs` (repeatable; in the
    /// environment, one per line).
    #[arg(
        long = "chat-template-kwargs",
        env = "IC_CHAT_TEMPLATE_KWARGS",
        value_delimiter = '\n'
    )]
    pub chat_template_kwargs: Vec<tokenize::ChatKwargsSpec>,

    /// Audience a /probe bearer token must carry (Kubernetes TokenReview).
    #[arg(long, env = "IC_PROBE_AUDIENCE")]
    pub probe_audience: Option<String>,

    /// Static bearer token for /probe in local mode (no cluster).
    #[arg(long, env = "IC_PROBE_STATIC_TOKEN", hide_env_values = true)]
    pub probe_static_token: Option<String>,

    /// Identities (TokenReview usernames) that may call /probe with
    /// --probe-audience: the controller's service account (repeatable).
    /// The --api-admin identities may too; with neither, --probe-audience
    /// is refused (other pods' tokens may carry the audience).
    #[arg(
        long = "probe-allowed-identity",
        env = "IC_PROBE_ALLOWED_IDENTITIES",
        value_delimiter = ','
    )]
    pub probe_allowed_identities: Vec<String>,

    /// A token the API server refused is refused again without asking for
    /// this many seconds (bounded cache; 0 asks every time).
    #[arg(long, env = "IC_TOKEN_REFUSAL_CACHE_SECONDS", default_value_t = 10)]
    pub token_refusal_cache_seconds: u64,

    /// TokenReviews a second, at most, for bearer tokens neither cache
    /// knows (0: unbounded); past it a call is answered UNAVAILABLE without
    /// asking the API server, so a flood of distinct garbage tokens cannot
    /// load it. Accepted tokens are cached for a minute.
    #[arg(long, env = "IC_TOKEN_REVIEWS_PER_SECOND", default_value_t = 100)]
    pub token_reviews_per_second: u32,

    /// Reviews that may be asked at once beyond that rate (every engine's
    /// subscriber and every gateway presenting its token to a replica that
    /// just started).
    #[arg(long, env = "IC_TOKEN_REVIEW_BURST", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub token_review_burst: u32,

    /// Audience a gRPC API or /snapshot bearer token must carry (Kubernetes
    /// TokenReview); turns on Kubernetes access control (docs/security.md).
    #[arg(long, env = "IC_API_AUDIENCE")]
    pub api_audience: Option<String>,

    /// Identities (TokenReview usernames) that may push policies and read
    /// everything: the controller's service account (repeatable).
    #[arg(long = "api-admin", env = "IC_API_ADMINS", value_delimiter = ',')]
    pub api_admins: Vec<String>,

    /// Static bearer token for the gRPC API and /snapshot in local mode.
    #[arg(long, env = "IC_API_STATIC_TOKEN", hide_env_values = true)]
    pub api_static_token: Option<String>,

    /// Forget a replica (and its entries) after this many seconds without
    /// any batch or heartbeat from it; 0 keeps silent replicas forever.
    /// Subscribers heartbeat every 5 s, so only gone engines reach it.
    #[arg(long, env = "IC_REPLICA_GC_AFTER_SECONDS", default_value_t = 600)]
    pub replica_gc_after_seconds: u64,

    /// Load-aware scoring.
    #[command(flatten)]
    pub scoring: routing::ScoringFlags,

    /// IngestEvents streams open at once, in all; further streams are
    /// refused (RESOURCE_EXHAUSTED, `ingest_refused_total{limit="streams"}`).
    #[arg(long, env = "IC_MAX_INGEST_STREAMS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_ingest_streams: u64,

    /// IngestEvents streams open at once per client (its authenticated
    /// identity, or its IP address when callers are anonymous).
    #[arg(long, env = "IC_MAX_INGEST_STREAMS_PER_CLIENT", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_ingest_streams_per_client: u64,

    /// Close an IngestEvents stream that sent no batch for this many seconds
    /// (subscribers heartbeat every 5 s).
    #[arg(long, env = "IC_INGEST_IDLE_TIMEOUT_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub ingest_idle_timeout_seconds: u64,

    /// Replica ranks one IngestEvents stream may carry.
    #[arg(long, env = "IC_MAX_RANKS_PER_STREAM", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_ranks_per_stream: u64,

    /// Bytes one stream may buffer in an unfinished resync, as the memory
    /// its events really take (a removal or clear about as much as a stored
    /// block: ~100 bytes per one-block event, 8 per block beyond).
    #[arg(long, env = "IC_MAX_STREAM_RESYNC_BYTES", default_value_t = ic_index::ingest::DEFAULT_MAX_STREAM_RESYNC_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_stream_resync_bytes: u64,

    /// Bytes all streams together may buffer in unfinished resyncs (sized
    /// from the chart's 1 GiB memory limit: docs/reliability.md).
    #[arg(long, env = "IC_RESYNC_BUDGET_BYTES", default_value_t = ic_index::ingest::DEFAULT_RESYNC_BUDGET_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    pub resync_budget_bytes: u64,

    /// Most block hashes one lookup may carry.
    #[arg(long, env = "IC_MAX_PROMPT_BLOCKS", default_value_t = grpc::MAX_PROMPT_BLOCKS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_prompt_blocks: u64,

    /// Most token ids one lookup may carry.
    #[arg(long, env = "IC_MAX_PROMPT_TOKENS", default_value_t = grpc::MAX_PROMPT_TOKENS as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_prompt_tokens: u64,

    /// Most candidate replicas (LookupRoute) or pods (llm-d's
    /// GetPodScores) one lookup may name.
    #[arg(long, env = "IC_MAX_CANDIDATES", default_value_t = grpc::MAX_CANDIDATES as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_candidates: u64,

    /// Largest gRPC message decoded (a lookup, an ingest batch, a policy
    /// push, an llm-d scoring request), in bytes; gRPC refuses a larger one
    /// with OUT_OF_RANGE before it is read.
    #[arg(long, env = "IC_GRPC_MAX_MESSAGE_BYTES", default_value_t = message_bound::DEFAULT_MAX_MESSAGE_BYTES as u64, value_parser = clap::value_parser!(u64).range(1024..=(1 << 31)))]
    pub grpc_max_message_bytes: u64,

    /// Most bytes of prompt text one lookup may carry (LookupRoute's
    /// prompt_text, llm-d's GetPodScores prompt), tokenized on the request
    /// path.
    #[arg(long, env = "IC_MAX_PROMPT_TEXT_BYTES", default_value_t = grpc::MAX_PROMPT_TEXT_BYTES as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_prompt_text_bytes: u64,

    /// Most multimodal items, blocks of extra keys, and extra keys in all,
    /// one lookup may carry.
    #[arg(long, env = "IC_MAX_EXTRA_ENTRIES", default_value_t = grpc::MAX_EXTRA_ENTRIES as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_extra_entries: u64,

    /// Longest cache salt, media identifier or extra key of a lookup, in
    /// bytes.
    #[arg(long, env = "IC_MAX_EXTRA_KEY_BYTES", default_value_t = grpc::MAX_EXTRA_KEY_BYTES as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_extra_key_bytes: u64,

    /// Longest model, adapter, replica id or address an ingest batch may
    /// name, in bytes (every scope and replica it names is kept).
    #[arg(long, env = "IC_MAX_INGEST_NAME_BYTES", default_value_t = ic_index::ingest::DEFAULT_MAX_NAME_BYTES as u64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_ingest_name_bytes: u64,

    /// Data-parallel ranks a replica may report (`dp_rank` below this;
    /// each rank takes one of the index's replica slots).
    #[arg(long, env = "IC_MAX_DP_RANKS", default_value_t = u64::from(ic_index::ingest::DEFAULT_MAX_DP_RANKS), value_parser = clap::value_parser!(u64).range(1..=u64::from(u32::MAX)))]
    pub max_dp_ranks: u64,

    /// The endpoint picker (Envoy ext_proc).
    #[command(flatten)]
    pub epp: epp_config::EppFlags,

    /// Serve llm-d's remote indexer API (indexer.v1.IndexerService/
    /// GetPodScores) on the gRPC port, scoring this namespace's engines;
    /// off when unset.
    #[arg(long, env = "IC_LLMD_INDEXER_TENANT")]
    pub llmd_indexer_tenant: Option<String>,

    /// Fingerprint scheme of the engines GetPodScores scores.
    #[arg(
        long,
        env = "IC_LLMD_INDEXER_HASH_SCHEME",
        value_enum,
        default_value = "vllm"
    )]
    pub llmd_indexer_hash_scheme: EngineFamily,

    /// GetPodScores: what a block held only at tier 2 (the engine's CPU or
    /// offload tier) is worth, against 1.0 at tier 1 (llm-d's default 0.8).
    #[arg(long, env = "IC_LLMD_T2_WEIGHT", default_value_t = 0.8)]
    pub llmd_t2_weight: f64,

    /// TLS (served on the gRPC and endpoint-picker ports) and the
    /// connection idle limit (every port).
    #[command(flatten)]
    pub serving: ic_telemetry::serving::ServingFlags,

    /// Seconds after start before the replica may report ready: by then
    /// every live subscriber has found it and begun its resync
    /// (subscribers resolve the index servers every 5 s and reconnect
    /// within 5 s); after it, readiness waits for resyncs under way.
    #[arg(long, env = "IC_READY_WARMUP_SECONDS", default_value_t = 10)]
    pub ready_warmup_seconds: u64,

    /// Until it is first ready, the replica waits for each resync under
    /// way at most this long from its first batch (a subscriber that never
    /// ends its resync cannot keep it out of the Service); once ready,
    /// resyncs no longer hold it back.
    #[arg(long, env = "IC_READY_RESYNC_WAIT_SECONDS", default_value_t = readiness::DEFAULT_RESYNC_WAIT.as_secs())]
    pub ready_resync_wait_seconds: u64,

    /// Not ready until the controller's first policy push, for at most
    /// this many seconds after start (0: do not wait; the chart sets it
    /// when it deploys the controller).
    #[arg(long, env = "IC_READY_POLICIES_SECONDS", default_value_t = 0)]
    pub ready_policies_seconds: u64,

    /// What happens between SIGTERM and exit.
    #[command(flatten)]
    pub drain: ic_telemetry::drain::DrainFlags,

    /// The Kafka transport: consume the topic beside IngestEvents.
    #[command(flatten)]
    pub kafka: kafka::KafkaConsumerFlags,

    /// The peer replicas' pick-load exchange.
    #[command(flatten)]
    pub peers: peers::PeerFlags,
}

/// The engine family of a pool, which fixes its fingerprint scheme.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineFamily {
    /// vLLM engines.
    Vllm,
    /// SGLang engines.
    Sglang,
}

impl EngineFamily {
    /// The family's fingerprint scheme.
    pub fn hash_scheme(self) -> ic_index::HashScheme {
        match self {
            Self::Vllm => ic_index::HashScheme::Vllm,
            Self::Sglang => ic_index::HashScheme::Sglang,
        }
    }
}

/// A flag's count as a `usize` (saturating on a 32-bit target).
fn usize_of(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// llm-d's remote indexer API from the flags; `None` when it is off.
fn llmd_indexer(config: &Config) -> anyhow::Result<Option<llmd::IndexerConfig>> {
    let weight = config.llmd_t2_weight;
    if !(weight.is_finite() && (0.0..=1.0).contains(&weight)) {
        anyhow::bail!("--llmd-t2-weight: expected a number from 0 to 1, got {weight}");
    }
    let Some(tenant) = &config.llmd_indexer_tenant else {
        return Ok(None);
    };
    if tenant.trim().is_empty() {
        anyhow::bail!("--llmd-indexer-tenant: must name a namespace");
    }
    Ok(Some(llmd::IndexerConfig {
        tenant: tenant.trim().to_owned(),
        hash_scheme: config.llmd_indexer_hash_scheme.hash_scheme(),
        weights: ic_index::pod_scores::TierWeights {
            t1: 1.0,
            t2: weight,
        },
    }))
}

/// The IngestEvents bounds from the flags.
fn ingest_control(config: &Config) -> streams::IngestControl {
    streams::IngestControl::new(
        ic_index::ingest::IngestLimits {
            max_ranks: usize_of(config.max_ranks_per_stream),
            max_stream_resync_bytes: config.max_stream_resync_bytes,
            budget: ic_index::ingest::ResyncBudget::new(config.resync_budget_bytes),
            max_name_bytes: usize_of(config.max_ingest_name_bytes),
            max_dp_ranks: u32::try_from(config.max_dp_ranks).unwrap_or(u32::MAX),
        },
        usize_of(config.max_ingest_streams),
        usize_of(config.max_ingest_streams_per_client),
        Duration::from_secs(config.ingest_idle_timeout_seconds),
    )
}

/// Who may call the gRPC API and `/snapshot`, from the flags.
async fn api_access(config: &Config, metrics: &Metrics) -> anyhow::Result<access::ApiAccess> {
    match (&config.api_audience, &config.api_static_token) {
        (Some(_), Some(_)) => anyhow::bail!(
            "--api-audience and --api-static-token are exclusive: use the audience in a \
             cluster, the static token locally"
        ),
        (Some(audience), None) => {
            if audience.trim().is_empty() {
                anyhow::bail!("--api-audience: must not be empty");
            }
            let client = kube::Client::try_default().await.context(
                "--api-audience needs Kubernetes API credentials (in-cluster service account \
                 or KUBECONFIG) to run TokenReviews and SubjectAccessReviews",
            )?;
            Ok(access::ApiAccess::Kubernetes(Box::new(
                access::KubeAccess::new(
                    reviewer(config, metrics, client, audience),
                    config.api_admins.clone(),
                ),
            )))
        }
        (None, Some(token)) if token.is_empty() => {
            anyhow::bail!("--api-static-token: must not be empty")
        }
        (None, Some(token)) => Ok(access::ApiAccess::Static(token.clone())),
        (None, None) => {
            if !config.api_admins.is_empty() {
                anyhow::bail!("--api-admin needs --api-audience");
            }
            Ok(access::ApiAccess::Open)
        }
    }
}

/// A TokenReviewer for `audience` with the refusal cache and the review
/// rate the flags ask for.
fn reviewer(
    config: &Config,
    metrics: &Metrics,
    client: kube::Client,
    audience: &str,
) -> TokenReviewer {
    TokenReviewer::new(client, audience.to_owned())
        .with_refusal_cache(
            Duration::from_secs(config.token_refusal_cache_seconds),
            metrics.token_refusals_cached.clone(),
        )
        .with_review_rate(
            config.token_reviews_per_second,
            config.token_review_burst,
            metrics.token_reviews_throttled.clone(),
        )
}

/// How `/probe` authenticates, from the flags.
async fn probe_auth(config: &Config, metrics: &Metrics) -> anyhow::Result<ProbeAuth> {
    match (&config.probe_audience, &config.probe_static_token) {
        (Some(_), Some(_)) => anyhow::bail!(
            "--probe-audience and --probe-static-token are exclusive: use the audience in a \
             cluster, the static token locally"
        ),
        (Some(audience), None) => {
            if audience.trim().is_empty() {
                anyhow::bail!("--probe-audience: must not be empty");
            }
            let allowed: Vec<String> = config
                .probe_allowed_identities
                .iter()
                .chain(&config.api_admins)
                .filter(|i| !i.trim().is_empty())
                .cloned()
                .collect();
            if allowed.is_empty() {
                anyhow::bail!(
                    "--probe-allowed-identity: required with --probe-audience (the controller's \
                     service account, system:serviceaccount:<namespace>:<name>; --api-admin \
                     identities count too); the audience alone admits every pod whose token \
                     carries it"
                );
            }
            let client = kube::Client::try_default().await.context(
                "--probe-audience needs Kubernetes API credentials (in-cluster service account \
                 or KUBECONFIG) to run TokenReviews",
            )?;
            Ok(ProbeAuth::TokenReview {
                reviewer: Box::new(reviewer(config, metrics, client, audience)),
                allowed,
            })
        }
        (None, Some(token)) if token.is_empty() => {
            anyhow::bail!("--probe-static-token: must not be empty")
        }
        (None, Some(token)) => Ok(ProbeAuth::Static(token.clone())),
        (None, None) => Ok(ProbeAuth::Disabled),
    }
}

/// Periodically forgets replicas that fell silent.
async fn collect_stale_replicas(
    core: Arc<IndexCore>,
    after: Duration,
    shutdown: CancellationToken,
) {
    let period = (after / 4).clamp(Duration::from_secs(1), Duration::from_secs(30));
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        core.forget_silent(after);
    }
}

/// Every few seconds, [`IndexCore::routing_upkeep`].
async fn routing_upkeep(core: Arc<IndexCore>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    let mut dropped_seen = 0;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        dropped_seen = core.routing_upkeep(dropped_seen);
    }
}

/// Binds the endpoint picker's port and serves ext_proc plus
/// grpc.health.v1 (the `liveness` and `readiness` services the protocol
/// names, and the server as a whole) until `shutdown`.
async fn serve_epp(
    addr: SocketAddr,
    options: ServeOptions,
    picker: epp::EndpointPicker,
    shutdown: CancellationToken,
) -> anyhow::Result<(
    tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    tonic_health::server::HealthReporter,
)> {
    let listener = ServingListener::bind(addr, options)
        .await
        .with_context(|| format!("cannot bind the endpoint picker to {addr}"))?;
    let bound = listener.local_addr();
    let (reporter, health) = tonic_health::server::health_reporter();
    // Live from the start; ready when the replica is (see readiness).
    reporter
        .set_service_status("liveness", tonic_health::ServingStatus::Serving)
        .await;
    for name in EPP_READY_SERVICES {
        reporter
            .set_service_status(name, tonic_health::ServingStatus::NotServing)
            .await;
    }
    tracing::info!(addr = %bound, "endpoint picker listening");
    ic_telemetry::listening::listening("epp", bound);
    let kept = reporter.clone();
    Ok((
        tokio::spawn(async move {
            // Keep the reporter alive as long as the server.
            let _reporter = kept;
            tonic::transport::Server::builder()
                .add_service(health)
                .add_service(picker.into_server())
                .serve_with_incoming_shutdown(conn::incoming(listener), shutdown.cancelled_owned())
                .await
        }),
        reporter,
    ))
}

/// The endpoint picker's grpc.health.v1 services that follow readiness.
const EPP_READY_SERVICES: [&str; 3] = [
    "",
    "readiness",
    "envoy.service.ext_proc.v3.ExternalProcessor",
];

/// Runs the server until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let health = Health::new();
    // SIGTERM: not ready at once, serve on for the drain period, then stop.
    let shutdown = ic_telemetry::drain::drain(shutdown, health.clone(), config.drain.period());
    let readiness = readiness::Readiness::new(Duration::from_secs(config.ready_warmup_seconds));
    readiness.wait_for_policies(Duration::from_secs(config.ready_policies_seconds));
    let mut tokenizers = Tokenizers::load(&config.tokenizers)?;
    tokenizers
        .set_chat_kwargs(&config.chat_template_kwargs)
        .map_err(anyhow::Error::msg)?;
    let epp_pools = config.epp.pools()?;
    let llmd_indexer = llmd_indexer(&config)?;
    let routing = routing::Routing::from_flags(&config.scoring)?;
    let kafka_settings = config.kafka.settings()?;
    let peer_settings = config.peers.settings(config.api_static_token.as_deref())?;
    let registry = MetricsRegistry::new("inferencecache", BINARY);
    let metrics = Metrics::register(&registry);
    readiness.wait_for_resyncs(
        Duration::from_secs(config.ready_resync_wait_seconds),
        metrics.ready_resyncs_not_waited_for.clone(),
    );
    let auth = probe_auth(&config, &metrics).await?;
    let access = Arc::new(api_access(&config, &metrics).await?);
    if matches!(*access, access::ApiAccess::Open) {
        tracing::warn!(
            "the gRPC API and /snapshot are open to anonymous callers (local mode): set \
             --api-audience in a cluster"
        );
    }
    metrics
        .capacity_entries
        .set(i64::try_from(config.capacity_entries).unwrap_or(i64::MAX));
    let index = Arc::new(Index::new(IndexConfig {
        capacity_entries: config.capacity_entries,
        max_replicas: config.max_replicas,
        max_scopes: config.max_scopes,
        ..IndexConfig::default()
    }));
    IndexMemoryCollector::register(&registry, index.clone());
    let core = Arc::new(
        IndexCore::new(index.clone(), config.engine_block_size, metrics.clone())
            .with_tokenizers(tokenizers)
            .with_routing(routing),
    );
    let mut service = IndexServer::over(core.clone());
    service.ingest = Arc::new(ingest_control(&config));
    service.limits = grpc::LookupLimits {
        max_prompt_blocks: usize_of(config.max_prompt_blocks),
        max_prompt_tokens: usize_of(config.max_prompt_tokens),
        max_candidates: usize_of(config.max_candidates),
        max_prompt_text_bytes: usize_of(config.max_prompt_text_bytes),
        max_extra_entries: usize_of(config.max_extra_entries),
        max_extra_key_bytes: usize_of(config.max_extra_key_bytes),
    };
    service.access = access.clone();
    service.shutdown = shutdown.clone();
    service.readiness = readiness.clone();
    let kafka = kafka_settings
        .map(|settings| {
            let limits = kafka::limits(&service.ingest.limits);
            let gc = (config.replica_gc_after_seconds > 0)
                .then(|| Duration::from_secs(config.replica_gc_after_seconds));
            kafka::start(
                settings.forgetting_ranks_after(gc),
                core.clone(),
                limits,
                &registry,
                shutdown.clone(),
            )
        })
        .transpose()?;
    let exchange = peers::Exchange::new(peer_settings, &registry);
    let http_state = http::HttpState {
        core: core.clone(),
        prober: Prober::new(core.clone()),
        auth: Arc::new(auth),
        access: access.clone(),
    };
    let certs =
        ic_telemetry::serving::certificates(&config.serving, &metrics.serving, shutdown.clone())
            .context("loading --tls-cert-file/--tls-key-file")?;
    let serve_options = |alpn: &[&[u8]]| {
        config
            .serving
            .options(certs.as_ref(), alpn, &metrics.serving)
    };
    // The HTTP port (probes, /metrics, /snapshot, /probe) stays plaintext:
    // the kubelet, Prometheus and the controller read it in-cluster, and
    // the chart's NetworkPolicy limits who reaches it. It gets the idle
    // limit all the same.
    let admin = AdminServer::bind_with(
        config.http_addr,
        config.serving.options(None, &[], &metrics.serving),
        health.clone(),
        registry,
        http::router(http_state),
    )
    .await
    .context("starting HTTP server")?
    .with_header_read_timeout(
        config.serving.header_read_timeout(),
        metrics.serving.header_read_timeouts.clone(),
    );
    let grpc_listener = ServingListener::bind(config.grpc_addr, serve_options(&[b"h2"]))
        .await
        .with_context(|| format!("cannot bind gRPC server to {}", config.grpc_addr))?;
    let grpc_addr = grpc_listener.local_addr();
    if config.replica_gc_after_seconds > 0 {
        tokio::spawn(collect_stale_replicas(
            core.clone(),
            Duration::from_secs(config.replica_gc_after_seconds),
            shutdown.clone(),
        ));
    }
    tokio::spawn(routing_upkeep(core.clone(), shutdown.clone()));
    peers::start(exchange.clone(), core.clone(), shutdown.clone());
    let peer_service = peers::IndexPeerServiceServer::new(peers::PeerServer::new(
        exchange,
        core.clone(),
        access.clone(),
    ));
    // Standard grpc.health.v1 (Kubernetes gRPC probes, load balancers; the
    // load generator's empty-RPC baseline).
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_not_serving::<IndexServiceServer<IndexServer>>()
        .await;
    health_reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let mut reporters = vec![(
        health_reporter.clone(),
        vec![
            "",
            <IndexServiceServer<IndexServer> as tonic::server::NamedService>::NAME,
        ],
    )];
    let epp = match (config.epp.epp_addr, epp_pools) {
        (Some(addr), Some(pools)) => {
            if pools.iter().any(|p| p.watched) {
                let client = kube::Client::try_default().await.context(
                    "--epp-pool needs Kubernetes API credentials (in-cluster service account \
                     or KUBECONFIG) to watch the InferencePool and its pods",
                )?;
                for p in pools.iter().filter(|p| p.watched) {
                    tokio::spawn(pool::watch_pool(
                        client.clone(),
                        p.tenant.clone(),
                        p.name.clone().unwrap_or_default(),
                        p.endpoints.clone(),
                        shutdown.clone(),
                    ));
                }
            }
            let picker = epp::EndpointPicker::serving(core.clone(), pools);
            let (task, reporter) =
                serve_epp(addr, serve_options(&[b"h2"]), picker, shutdown.clone()).await?;
            reporters.push((reporter, EPP_READY_SERVICES.to_vec()));
            Some(task)
        }
        _ => None,
    };
    let max_message = usize_of(config.grpc_max_message_bytes);
    let llmd = match llmd_indexer {
        Some(c) => {
            use ic_proto::llmd_indexer_v1::indexer_service_server::IndexerServiceServer;
            tracing::info!(tenant = %c.tenant, "serving llm-d's GetPodScores");
            health_reporter
                .set_not_serving::<IndexerServiceServer<llmd::LlmdIndexer>>()
                .await;
            reporters.push((
                health_reporter.clone(),
                vec![
                    <IndexerServiceServer<llmd::LlmdIndexer> as tonic::server::NamedService>::NAME,
                ],
            ));
            Some(message_bound::Counted::new(
                IndexerServiceServer::new(llmd::LlmdIndexer::new(service.clone(), c))
                    .max_decoding_message_size(max_message),
                metrics.grpc_messages_refused.clone(),
            ))
        }
        None => None,
    };
    let grpc = {
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tracing::info!(addr = %grpc_addr, "grpc server listening");
            ic_telemetry::listening::listening("grpc", grpc_addr);
            tonic::transport::Server::builder()
                .add_service(health_service)
                .add_optional_service(llmd)
                .add_service(peer_service)
                .add_service(message_bound::Counted::new(
                    IndexServiceServer::new(service).max_decoding_message_size(max_message),
                    metrics.grpc_messages_refused.clone(),
                ))
                .serve_with_incoming_shutdown(
                    conn::incoming(grpc_listener),
                    shutdown.cancelled_owned(),
                )
                .await
        })
    };
    tracing::info!(
        engine_block_size = config.engine_block_size,
        capacity_entries = config.capacity_entries,
        tokenizers = config.tokenizers.len(),
        probe_auth = match (&config.probe_audience, &config.probe_static_token) {
            (Some(_), _) => "token_review",
            (None, Some(_)) => "static_token",
            (None, None) => "disabled",
        },
        api_access = access.mode(),
        tls = certs.is_some(),
        connection_idle_timeout_seconds = config.serving.connection_idle_timeout_seconds,
        "index server started"
    );
    if let Some(mut ready) = kafka.as_ref().map(|k| k.ready.clone()) {
        // Ready only once the consumer has caught up with the topic.
        let gate = readiness.gate("kafka");
        tokio::spawn(async move {
            loop {
                gate.set(*ready.borrow_and_update());
                if ready.changed().await.is_err() {
                    return;
                }
            }
        });
    }
    tokio::spawn(readiness::publish(
        readiness,
        health.clone(),
        readiness::HealthReporters { reporters },
        shutdown.clone(),
    ));
    let served = admin.serve(shutdown.clone()).await;
    shutdown.cancel();
    let grpc_result = grpc.await.context("gRPC server task")?;
    if let Some(epp) = epp {
        epp.await
            .context("endpoint picker task")?
            .context("endpoint picker")?;
    }
    served.context("HTTP server")?;
    grpc_result.context("gRPC server")?;
    if let Some(kafka) = kafka {
        kafka.task.await.context("Kafka consumer task")?;
    }
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

    use ic_clock::{Clock, ManualClock};
    use ic_index::{Change, HashScheme, ReplicaKey, Scope, Tier};

    #[test]
    fn silent_replicas_are_forgotten_as_the_clock_moves() {
        let clock = Arc::new(ManualClock::at_second(1_700_000_000));
        let registry = MetricsRegistry::new("inferencecache", "test");
        let metrics = Metrics::register(&registry);
        let core = IndexCore::new(Arc::new(Index::new(IndexConfig::default())), 16, metrics)
            .with_clock(clock.clone());
        let index = core.index();
        let scope = Scope {
            tenant: "t".into(),
            model: "m".into(),
            hash_scheme: HashScheme::Vllm,
            adapter: String::new(),
        };
        let key = ReplicaKey {
            tenant: "t".into(),
            replica_id: "pod".into(),
            dp_rank: 0,
        };
        let stored = Change::Stored {
            start_depth: 0,
            fingerprints: vec![ic_index::Fingerprint(1), ic_index::Fingerprint(2)],
            block_size: 16,
            tier: Tier::T1,
        };
        index.apply(&key, &scope, "10.0.0.1:8000", &[stored], clock.unix_ms());
        let after = Duration::from_secs(60);
        clock.advance(Duration::from_secs(60));
        assert_eq!(core.forget_silent(after), 0);
        clock.advance(Duration::from_millis(1));
        assert_eq!(core.forget_silent(after), 1);
        assert!(index.replicas_silent_since(i64::MAX).is_empty());
        assert!(
            registry.encode().contains("stale_replicas_removed"),
            "counted"
        );
    }
}
