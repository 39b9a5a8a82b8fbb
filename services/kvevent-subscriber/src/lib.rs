//! `ic-kvevent-subscriber`: the engine-pod sidecar that turns the engine's
//! KV-event stream into index updates.
//!
//! One [`listener`] per DP rank reads the engine's ZMQ stream, decodes it
//! and applies it to that rank's block state; the [`forwarder`] streams the
//! resulting index changes to the index server over `IngestEvents`; an
//! optional scraper reads the engine's tier-2 hit counters. The engine never
//! waits on the index: changes queue in a bounded [`outbox`] and a full queue
//! turns into a resync instead of back-pressure.

pub mod convert;
pub mod discovery;
pub mod forwarder;
pub mod kafka;
pub mod listener;
pub mod metrics;
pub mod outbox;
pub mod tier2;

use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use ic_kvevents::ReplicaConfig;
use ic_proto::index_v1 as pb;
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use tokio_util::sync::CancellationToken;

use crate::forwarder::Identity;
use crate::listener::{ListenerContext, RankEndpoints, offset_endpoint};
use crate::metrics::Metrics;
use crate::outbox::{Outbox, Wakers};

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

/// Subscriber flags (each with an env fallback; identity comes from the
/// downward API).
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Admin listen address (/live, /ready, /metrics).
    #[arg(long, env = "IC_ADMIN_ADDR", default_value = "0.0.0.0:8083")]
    pub admin_addr: SocketAddr,

    #[command(flatten)]
    pub header_deadline: ic_telemetry::serving::HeaderDeadlineFlags,

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

    /// Index server gRPC URL; several (comma-separated) stream to each,
    /// as do all the addresses of a host with `--index-server-discovery dns`.
    #[arg(long, env = "IC_INDEX_SERVER", default_value = "http://127.0.0.1:9090")]
    pub index_server: String,

    /// How the index-server replicas are found: `static` streams to each
    /// URL as given; `dns` resolves each URL's host again every
    /// `--index-server-resolve-seconds` and streams to every address (a
    /// headless Service: every replica, each with the whole index).
    #[arg(long, env = "IC_INDEX_SERVER_DISCOVERY", value_enum, default_value_t = discovery::DiscoveryMode::Static)]
    pub index_server_discovery: discovery::DiscoveryMode,

    /// Seconds between look-ups of the index servers' addresses (dns).
    #[arg(long, env = "IC_INDEX_SERVER_RESOLVE_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub index_server_resolve_seconds: u64,

    /// Bearer token file presented to the index server (a projected,
    /// audience-bound service-account token); read again on every
    /// (re)connect, so the kubelet's rotation needs no restart.
    #[arg(long, env = "IC_INDEX_SERVER_TOKEN_FILE")]
    pub index_server_token_file: Option<std::path::PathBuf>,

    /// CA bundle (PEM file) an `https://` index server must chain to; read
    /// again on every (re)connect.
    #[arg(
        long,
        env = "IC_INDEX_SERVER_CA_FILE",
        conflicts_with = "index_server_ca_pem"
    )]
    pub index_server_ca_file: Option<std::path::PathBuf>,

    /// The same CA bundle given inline (PEM text): the webhook injects it
    /// this way, since a pod cannot mount a Secret of another namespace.
    #[arg(long, env = "IC_INDEX_SERVER_CA_PEM", hide_env_values = true)]
    pub index_server_ca_pem: Option<String>,

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

    /// Seconds between engine metrics scrapes.
    #[arg(long, env = "IC_TIER2_SCRAPE_INTERVAL_SECONDS", default_value_t = 15)]
    pub tier2_scrape_interval_seconds: u64,

    /// Index changes queued for the index server before the oldest are
    /// dropped (and recovered by a resync).
    #[arg(long, env = "IC_QUEUE_CAPACITY", default_value_t = 100_000)]
    pub queue_capacity: usize,

    /// Consecutive receive errors on the engine's publisher socket after
    /// which the subscriber drops the socket and reconnects (each error
    /// also waits, backing off from 10 ms to 1 s, so a broken socket never
    /// spins).
    #[arg(long, env = "IC_MAX_RECEIVE_ERRORS", default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_receive_errors: u32,

    /// Largest forward sequence jump believed from one frame; a larger one
    /// is refused (`batches_failed_total{reason="implausible_sequence"}`)
    /// unless the next frame continues from it, which counts as a restart.
    #[arg(long, env = "IC_MAX_SEQUENCE_JUMP", default_value_t = ic_kvevents::seq::DEFAULT_MAX_JUMP, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_sequence_jump: u64,

    /// Milliseconds one request to the engine's replay buffer may take
    /// (the whole buffer at start-up and on a reconnect, a gap's batches
    /// otherwise); past it the reply is counted in `replay_failures_total`
    /// and handled as no reply: on a reconnect the engine is taken for a
    /// new one (the replica cleared and rebuilt), a gap's batches count as
    /// lost. Raise it for engines with large buffers on busy nodes.
    #[arg(long, env = "IC_REPLAY_TIMEOUT_MS", default_value_t = 3000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub replay_timeout_ms: u64,

    /// Seconds a rank waits at start-up for the engine's first batch when
    /// its replay buffer gave nothing, before resyncing an empty replica;
    /// meanwhile the index keeps its view of the engine.
    #[arg(long, env = "IC_STARTUP_GRACE_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    pub startup_grace_seconds: u64,

    /// Tokens a rank whose history is incomplete must store, with no store
    /// extending a block its view lacks, before it counts as complete again
    /// (`history_incomplete` back to 0); 0 = the engine's reported KV
    /// capacity (never while it reports none).
    #[arg(long, env = "IC_HISTORY_TURNOVER_TOKENS", default_value_t = 0)]
    pub history_turnover_tokens: u64,

    /// Blocks remembered per DP rank; beyond it the oldest tier-2-only blocks
    /// are forgotten.
    #[arg(long, env = "IC_MAX_BLOCKS", default_value_t = 4_000_000)]
    pub max_blocks: usize,

    /// LoRA adapters with blocks held at once per DP rank; blocks of further
    /// adapters are skipped (`adapter_blocks_skipped_total`).
    #[arg(long, env = "IC_MAX_ADAPTERS", default_value_t = 64)]
    pub max_adapters: usize,

    /// Transport to the index (`--transport grpc|kafka`) and the Kafka
    /// producer's settings.
    #[command(flatten)]
    pub kafka: kafka::KafkaProducerFlags,
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
    let registry = MetricsRegistry::new("inferencecache", BINARY);
    let metrics = Metrics::register(&registry);
    let kafka = config
        .kafka
        .settings()?
        .map(|settings| (settings, kafka::KafkaMetrics::register(&registry)));
    let health = Health::new();
    let admin = AdminServer::bind(
        config.admin_addr,
        health.clone(),
        registry,
        axum::Router::new(),
    )
    .await
    .context("starting admin server")?
    .with_counted_header_read_timeout(config.header_deadline, "subscriber");

    let outbox = Arc::new(Mutex::new(
        Outbox::new(
            config.dp_ranks,
            config.queue_capacity,
            ReplicaConfig {
                ignore_block_removed: config.ignore_block_removed,
                max_blocks: config.max_blocks,
                max_adapters: config.max_adapters,
            },
        )
        .with_history_turnover(config.history_turnover_tokens),
    ));
    let wakers = Wakers::new();
    let urls = discovery::parse_urls(&config.index_server).map_err(anyhow::Error::msg)?;
    let identity = Identity {
        scope: pb::IndexScope {
            tenant: config.tenant.clone(),
            model: config.model_id.clone(),
            hash_scheme: match config.hash_scheme {
                HashSchemeArg::Vllm => pb::HashScheme::Vllm as i32,
                HashSchemeArg::Sglang => pb::HashScheme::Sglang as i32,
            },
            adapter: String::new(),
        },
        replica_id: config.replica_id.clone(),
        address: config.serving_address().unwrap_or_default(),
        // RandomState is seeded from the OS per process: a fresh incarnation id.
        incarnation: std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish(),
    };
    tracing::info!(
        engine_endpoint = %config.engine_endpoint,
        dp_ranks = config.dp_ranks,
        model_id = %config.model_id,
        replica_id = %config.replica_id,
        tenant = %config.tenant,
        address = %identity.address,
        index_server = %config.index_server,
        index_server_discovery = ?config.index_server_discovery,
        ignore_block_removed = config.ignore_block_removed,
        "kvevent-subscriber starting"
    );

    let mut tasks = tokio::task::JoinSet::new();
    let ctx = ListenerContext {
        topic: config.topic.clone(),
        outbox: outbox.clone(),
        wakers: wakers.clone(),
        metrics: metrics.clone(),
        max_receive_errors: config.max_receive_errors,
        max_sequence_jump: config.max_sequence_jump,
        replay_timeout: Duration::from_millis(config.replay_timeout_ms),
        startup_grace: Duration::from_secs(config.startup_grace_seconds),
    };
    for rank in 0..config.dp_ranks {
        let events = offset_endpoint(&config.engine_endpoint, rank).with_context(|| {
            format!(
                "--engine-endpoint {} has no port to offset for DP rank {rank}",
                config.engine_endpoint
            )
        })?;
        let replay = match &config.replay_endpoint {
            Some(e) => Some(offset_endpoint(e, rank).with_context(|| {
                format!("--replay-endpoint {e} has no port to offset for DP rank {rank}")
            })?),
            None => None,
        };
        tasks.spawn(listener::run(
            RankEndpoints {
                rank,
                events,
                replay,
            },
            ctx.clone(),
            shutdown.clone(),
        ));
    }
    let trust = match (&config.index_server_ca_file, &config.index_server_ca_pem) {
        (Some(path), _) => Some(forwarder::Trust::File(path.clone())),
        (None, Some(pem)) => Some(forwarder::Trust::Pem(pem.clone())),
        (None, None) => None,
    };
    if let Some((settings, kafka_metrics)) = kafka {
        // The topic replaces the gRPC streams: one destination, the producer.
        let (outbox, shutdown) = (outbox.clone(), shutdown.clone());
        tasks.spawn(async move {
            let stop = shutdown.clone();
            if let Err(error) =
                kafka::run(settings, identity, outbox, wakers, kafka_metrics, shutdown).await
            {
                tracing::error!(error = %format!("{error:#}"), "Kafka producer");
                stop.cancel();
            }
        });
    } else {
        tasks.spawn(discovery::run(
            discovery::Discovery {
                targets: urls
                    .into_iter()
                    .map(|url| forwarder::Target {
                        url,
                        addr: None,
                        token_file: config.index_server_token_file.clone(),
                        ca: trust.clone(),
                    })
                    .collect(),
                mode: config.index_server_discovery,
                resolve_every: Duration::from_secs(config.index_server_resolve_seconds),
            },
            identity,
            outbox.clone(),
            wakers,
            metrics.clone(),
            shutdown.clone(),
        ));
    }
    if let Some(url) = config.engine_metrics_url.clone() {
        let interval = Duration::from_secs(config.tier2_scrape_interval_seconds.max(1));
        tasks.spawn(scrape_tier2(
            url,
            interval,
            outbox,
            metrics,
            shutdown.clone(),
        ));
    }

    health.set_ready(true);
    let served = admin.serve(shutdown.clone()).await;
    shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    served.context("admin server")?;
    tracing::info!("kvevent-subscriber stopped");
    Ok(())
}

async fn scrape_tier2(
    url: String,
    interval: Duration,
    outbox: Arc<Mutex<Outbox>>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
    {
        Ok(client) => client,
        Err(error) => {
            tracing::error!(%error, "cannot build HTTP client; tier-2 stats disabled");
            return;
        }
    };
    let mut tick = tokio::time::interval(interval);
    let mut last = None;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let text = match client
            .get(&url)
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
        {
            Ok(response) => response.text().await,
            Err(error) => Err(error),
        };
        match text {
            Ok(text) => {
                let counters = tier2::parse_tier2(&text);
                if let Some(now) = counters {
                    metrics.record_tier2(last, now);
                    last = Some(now);
                }
                let load = tier2::parse_engine_load(&text);
                let cache = tier2::parse_engine_cache(&text);
                let mut ob = outbox::lock(&outbox);
                ob.tier2 = counters;
                ob.engine_load = load;
                for rank in ob.set_engine_cache(cache) {
                    metrics.history_completed(rank);
                }
            }
            Err(error) => {
                metrics.tier2_scrape_failures.inc();
                tracing::debug!(%error, url = %url, "engine metrics scrape failed");
            }
        }
    }
}
