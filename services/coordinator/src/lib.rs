//! `ic-coordinator`: the LMCache-compatible fleet coordinator.
//!
//! It takes the reference coordinator's own flags so an existing deployment
//! can swap the binary, and serves the reference's REST API on one port:
//! instances, cache events, the key directory, usage, quotas, pins,
//! prefetches and targeted deletes, plus `/healthz`, `/metrics`, `/status`
//! and the house `/live` and `/ready`. Pure logic lives in
//! `ic-coordinator-core`; this crate adds locks, HTTP, timers and files.

// No `unsafe` here, nor in the binary (its allocator's is in libs/alloc).
#![forbid(unsafe_code)]

pub mod actions;
pub mod clock;
pub mod controller;
pub mod controllers;
pub mod error;
mod hot;
pub mod http;
pub mod ingest;
pub mod kafka;
pub mod kafka_state;
pub mod loops;
pub mod metrics;
pub mod mp;
pub mod persistence;
pub mod registry;
pub mod settings;
pub mod state;
pub mod views;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use ic_telemetry::MetricsRegistry;
use ic_telemetry::serving::{ServeOptions, ServingListener};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::controller::ExtraConfig;
use crate::metrics::MetricsSet;
use crate::settings::Settings;
use crate::state::{App, Coordinator};

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
    pub host: std::net::IpAddr,
    /// Listen port (REST API, /healthz, /metrics, /live, /ready).
    #[arg(long, env = "IC_PORT", default_value_t = 9300)]
    pub port: u16,
    /// HTTP keep-alive timeout, seconds: a connection that moves no bytes
    /// for this long is closed (one that never sends a request included);
    /// 0 never closes.
    #[arg(long, env = "IC_TIMEOUT_KEEP_ALIVE", default_value_t = 10)]
    pub timeout_keep_alive: u64,
    /// `--header-read-timeout-seconds` (a house extension, counted in
    /// `header_read_timeouts_total`).
    #[command(flatten)]
    pub header_deadline: ic_telemetry::serving::HeaderDeadlineFlags,
    /// Guard the operator endpoints (quotas, pins, delete, prefetch):
    /// callers present a service-account token for this audience, checked
    /// by TokenReview, and must be an `--api-admin` or be allowed the
    /// endpoint's subresource of `coordinators.inferencecache.io` by RBAC
    /// (SubjectAccessReview; house extension; unset, as in LMCache, leaves
    /// them open).
    #[arg(long, env = "IC_API_AUDIENCE")]
    pub api_audience: Option<String>,
    /// Usernames always allowed to call the operator endpoints with
    /// `--api-audience`, without asking RBAC
    /// (`system:serviceaccount:<namespace>:<name>`).
    #[arg(long = "api-admin", env = "IC_API_ADMINS", value_delimiter = ',')]
    pub api_admins: Vec<String>,
    /// With `--api-audience`: TokenReviews a second, at most, for bearer
    /// tokens neither cache knows (0: unbounded); past it the request is
    /// answered 503 without asking the API server (house extension).
    #[arg(long, env = "IC_TOKEN_REVIEWS_PER_SECOND", default_value_t = 100)]
    pub token_reviews_per_second: u32,
    /// Reviews that may be asked at once beyond that rate.
    #[arg(long, env = "IC_TOKEN_REVIEW_BURST", default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub token_review_burst: u32,
    /// Local mode: operator endpoints need this bearer token.
    #[arg(
        long,
        env = "IC_API_STATIC_TOKEN",
        hide_env_values = true,
        conflicts_with = "api_audience"
    )]
    pub api_static_token: Option<String>,
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
    /// Kafka consumer group (sent to the broker; offsets are never
    /// committed to it, the checkpoint is the read cursor).
    #[arg(long, env = "IC_KAFKA_GROUP_ID", default_value = "lmcache-coordinator")]
    pub kafka_group_id: String,
    /// Kafka transport: `/ready` answers 503 until every partition is within
    /// this many records of its high watermark (unset: ready at once).
    #[arg(long, env = "IC_MAX_READY_LAG")]
    pub max_ready_lag: Option<u64>,
    /// Most keys the directory holds; a new key beyond it drops the oldest
    /// reported one everywhere (`key_directory_keys_dropped`). Unset: sized
    /// from the container's memory limit (half of the cgroup limit over the
    /// measured memory of one key), 10 M without a limit. 0: no bound. Not
    /// an LMCache flag: the reference coordinator's directory is unbounded.
    #[arg(long, env = "IC_MAX_DIRECTORY_KEYS")]
    pub max_directory_keys: Option<u64>,
    /// Require the operator credentials (`--api-static-token`, or a token of
    /// `--api-audience` whose caller is an admin or may `create`
    /// `coordinators/events`) on `POST /events` too. Off by default, as in
    /// LMCache, whose MP servers send no credentials (house extension).
    #[arg(long, env = "IC_EVENTS_REQUIRE_AUTH", default_value_t = false)]
    pub events_require_auth: bool,
    /// Largest `size_bytes` one event entry may claim; an entry above it,
    /// or above the capacity its instance declared for the compartment, is
    /// refused (422, `event_entries_refused_total`). 0: no fixed bound
    /// (the declared capacity still applies). House extension.
    #[arg(long, env = "IC_MAX_EVENT_ENTRY_BYTES", default_value_t = 1 << 30)]
    pub max_event_entry_bytes: u64,
    /// Most `POST /events` requests waiting for the event writer (one
    /// thread applies every request in arrival order); a request that finds
    /// the queue full is refused at once with 503 and `Retry-After: 1`,
    /// nothing applied (`events_queue_full_total`). House extension.
    #[arg(long, env = "IC_MAX_PENDING_EVENT_REQUESTS", default_value_t = 128,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_pending_event_requests: u64,
    /// Most token ids one request (a directory lookup, a pin) may carry;
    /// one more is refused with 400 (`requests_refused_total`). LMCache's
    /// fixed cap by default. House extension.
    #[arg(long, env = "IC_MAX_TOKENS_PER_REQUEST",
          default_value_t = ic_coordinator_core::resolve::MAX_TOKENS_PER_REQUEST as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_tokens_per_request: u64,
    /// Most keys (complete chunks × world size) one token request may
    /// expand to; more is refused with 400 (`requests_refused_total`).
    /// House extension.
    #[arg(long, env = "IC_MAX_KEYS_PER_REQUEST",
          default_value_t = ic_coordinator_core::resolve::MAX_KEYS_PER_REQUEST as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub max_keys_per_request: u64,
    /// Seconds every call to an MP server (delete, evict, prefetch) may
    /// take; a call past it fails (`mp_requests_total{outcome="timeout"}`).
    /// LMCache's fixed 30 s by default. House extension.
    #[arg(long, env = "IC_MP_TIMEOUT_SECONDS", default_value_t = 30.0)]
    pub mp_timeout_seconds: f64,
    /// Largest request body accepted, in bytes; a larger one is answered
    /// 413 (`requests_refused_total{limit="body_bytes"}`). House extension.
    #[arg(long, env = "IC_MAX_BODY_BYTES",
          default_value_t = http::MAX_BODY_BYTES as u64,
          value_parser = clap::value_parser!(u64).range(1024..=(1 << 32)))]
    pub max_body_bytes: u64,
    /// Report format of LMCache's CLI (`terminal`, `json`). Accepted so an
    /// `lmcache coordinator` command line works unchanged; the coordinator
    /// command writes no report, in LMCache as here, so it has no effect.
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<String>,
    /// Report file of LMCache's CLI; accepted, no effect (see `--format`).
    #[arg(long, value_name = "PATH")]
    pub output: Option<String>,
    /// Suppress LMCache's CLI report; accepted, no effect (see `--format`).
    /// Logs are governed by `--log-level`.
    #[arg(short = 'q', long)]
    pub quiet: bool,
}

fn seconds(flag: &str, value: f64) -> anyhow::Result<Option<Duration>> {
    if value == 0.0 {
        return Ok(None);
    }
    match Duration::try_from_secs_f64(value) {
        Ok(d) => Ok(Some(d)),
        Err(_) => bail!("--{flag} must be a non-negative number of seconds (got {value})"),
    }
}

fn path(value: &str) -> Option<PathBuf> {
    (!value.is_empty()).then(|| PathBuf::from(value))
}

impl Config {
    /// Checks the flags and resolves them into [`Settings`]. Features this
    /// build does not have fail here, clearly, instead of being ignored.
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let kafka = match self.event_transport {
            EventTransport::Kafka => {
                let bootstrap_servers = self
                    .kafka_bootstrap_servers
                    .clone()
                    .filter(|s| !s.trim().is_empty())
                    .context("--event-transport kafka needs --kafka-bootstrap-servers")?;
                if self.kafka_topic.is_empty() {
                    bail!("--kafka-topic must not be empty");
                }
                Some(kafka::KafkaSettings {
                    bootstrap_servers,
                    topic: self.kafka_topic.clone(),
                    group_id: self.kafka_group_id.clone(),
                    max_ready_lag: self.max_ready_lag,
                })
            }
            EventTransport::Http => {
                if self.max_ready_lag.is_some() {
                    bail!("--max-ready-lag applies only with --event-transport kafka");
                }
                None
            }
        };
        if self.enable_blend_lookup {
            bail!("--enable-blend-lookup is not built yet in ic-coordinator");
        }
        if self.hash_algorithm != "blake3" {
            bail!(
                "--hash-algorithm {:?} is not supported; only blake3 is built",
                self.hash_algorithm
            );
        }
        if self.chunk_size == 0 {
            bail!("--chunk-size must be at least 1");
        }
        if !(self.trigger_watermark > 0.0 && self.trigger_watermark <= 1.0) {
            bail!(
                "--trigger-watermark must be in (0, 1] (got {})",
                self.trigger_watermark
            );
        }
        if !(self.eviction_ratio > 0.0 && self.eviction_ratio <= 1.0) {
            bail!(
                "--eviction-ratio must be in (0, 1] (got {})",
                self.eviction_ratio
            );
        }
        // An empty credential would leave the operator endpoints open
        // while the operator believes them closed.
        for (flag, value, env) in [
            (
                "--api-static-token",
                &self.api_static_token,
                "IC_API_STATIC_TOKEN",
            ),
            ("--api-audience", &self.api_audience, "IC_API_AUDIENCE"),
        ] {
            let empty_env = std::env::var_os(env).is_some_and(|v| v.is_empty());
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) || empty_env {
                bail!(
                    "{flag} (or {env}) is empty: that would leave the operator endpoints open; \
                     give it a value or leave it unset"
                );
            }
        }
        if self.events_require_auth
            && self.api_static_token.is_none()
            && self.api_audience.is_none()
        {
            bail!("--events-require-auth needs --api-static-token or --api-audience");
        }
        let instance_timeout = seconds("instance-timeout", self.instance_timeout)?
            .context("--instance-timeout must be greater than 0")?;
        let mp_timeout = seconds("mp-timeout-seconds", self.mp_timeout_seconds)?
            .context("--mp-timeout-seconds must be greater than 0")?;
        Ok(Settings {
            chunk_size: usize::try_from(self.chunk_size).context("--chunk-size")?,
            instance_timeout,
            health_check_interval: seconds("health-check-interval", self.health_check_interval)?,
            eviction_check_interval: seconds(
                "eviction-check-interval",
                self.eviction_check_interval,
            )?,
            eviction: ic_coordinator_core::eviction::EvictionSettings {
                trigger_watermark: self.trigger_watermark,
                eviction_ratio: self.eviction_ratio,
            },
            checkpoint_path: path(&self.checkpoint_path),
            checkpoint_interval: seconds("checkpoint-interval", self.checkpoint_interval)?,
            metadata_path: path(&self.metadata_path),
            disable_metrics: self.disable_metrics,
            kafka,
            events_require_auth: self.events_require_auth,
            max_event_entry_bytes: (self.max_event_entry_bytes > 0)
                .then_some(self.max_event_entry_bytes),
            max_pending_event_requests: usize::try_from(self.max_pending_event_requests)
                .context("--max-pending-event-requests")?,
            request_limits: ic_coordinator_core::resolve::RequestLimits {
                max_tokens: usize::try_from(self.max_tokens_per_request)
                    .context("--max-tokens-per-request")?,
                max_keys: usize::try_from(self.max_keys_per_request)
                    .context("--max-keys-per-request")?,
            },
            mp_timeout,
            max_body_bytes: usize::try_from(self.max_body_bytes).context("--max-body-bytes")?,
            max_directory_keys: match self.max_directory_keys {
                Some(0) => None,
                Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
                None => Some(settings::default_directory_keys(
                    settings::memory_limit_bytes(),
                )),
            },
        })
    }
}

/// Builds a coordinator from flags: validates them, selects controllers,
/// and restores the metadata file then the checkpoint.
pub fn build(config: &Config, clock: Arc<dyn Clock>) -> anyhow::Result<App> {
    build_with(config, clock, Vec::new())
}

/// Like [`build`], with `extra` controllers registered after the built-ins
/// (and, like them, subject to `disabled_controllers`).
pub fn build_with(
    config: &Config,
    clock: Arc<dyn Clock>,
    extra_controllers: Vec<Arc<dyn controller::Controller>>,
) -> anyhow::Result<App> {
    let settings = config.settings()?;
    let extra = ExtraConfig::parse(config.extra_config.as_deref())?;
    let builtins = controllers::builtins(&settings);
    let mut all = builtins.all;
    all.extend(extra_controllers);
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = all.iter().find(|c| !seen.insert(c.name())) {
        bail!("two controllers are named {:?}", dup.name());
    }
    let controllers = extra.select(all)?;
    let names: Vec<&str> = controllers.iter().map(|c| c.name()).collect();
    tracing::info!(controllers = ?names, "controllers enabled");
    let metrics = MetricsSet::new(MetricsRegistry::new("inferencecache", BINARY));
    let eviction = names
        .contains(&controller::Controller::name(builtins.eviction.as_ref()))
        .then_some(builtins.eviction);
    let app = Arc::new(Coordinator::new(
        settings,
        clock,
        controllers,
        eviction,
        metrics,
    )?);
    // Metadata first: it is operator intent and independent of events.
    app.persistence.restore_metadata();
    app.persistence.restore_checkpoint();
    Ok(app)
}

/// A coordinator serving on a bound address.
#[derive(Debug)]
pub struct Running {
    /// Address actually bound.
    pub addr: SocketAddr,
    /// Shared state (tests drive sweeps through it).
    pub app: App,
    /// Finishes after shutdown, with the final checkpoint written.
    pub task: JoinHandle<anyhow::Result<()>>,
}

/// Binds and starts serving; background loops run until `shutdown`.
pub async fn start(
    config: &Config,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    start_with(config, clock, Vec::new(), shutdown).await
}

/// Like [`start`], with extra controllers (see [`build_with`]).
pub async fn start_with(
    config: &Config,
    clock: Arc<dyn Clock>,
    extra_controllers: Vec<Arc<dyn controller::Controller>>,
    shutdown: CancellationToken,
) -> anyhow::Result<Running> {
    let app = build_with(config, clock, extra_controllers)?;
    // The runtime's own count, so `--worker-threads` can be checked from
    // outside (thread names cannot: blocking-pool threads share them).
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    app.metrics
        .metrics
        .runtime_workers
        .set(i64::try_from(workers).unwrap_or(i64::MAX));
    // The allocator's own setting (the flag, mimalloc's variable or its
    // default), read back so the gauge shows what is in effect.
    app.metrics
        .metrics
        .allocator_purge_delay_ms
        .set(ic_alloc::purge_delay_ms());
    let kafka_clients = app
        .settings
        .kafka
        .as_ref()
        .map(kafka::clients)
        .transpose()?;
    let addr = SocketAddr::new(config.host, config.port);
    let options = ServeOptions {
        idle: (config.timeout_keep_alive > 0)
            .then(|| std::time::Duration::from_secs(config.timeout_keep_alive)),
        idle_closed: Some(app.metrics.metrics.idle_connections_closed.clone()),
        ..ServeOptions::plain()
    };
    let listener = ServingListener::bind(addr, options)
        .await
        .with_context(|| format!("cannot bind {addr}"))?;
    let addr = listener.local_addr();
    tracing::info!(%addr, "admin server listening");
    ic_telemetry::listening::listening("admin", addr);
    let access = operator_access(config, &app.metrics.metrics).await?;
    tracing::info!(mode = access.mode(), "operator endpoint access");
    if !app.settings.disable_metrics {
        // Like LMCache's coordinator: with --otlp-endpoint the metrics are
        // pushed (and /metrics answers 404).
        let source = app.clone();
        ic_telemetry::otel::push::spawn(
            Arc::new(move || http::metrics_text(&source)),
            shutdown.clone(),
        );
    }
    let header_read_timeout = config.header_deadline.timeout();
    let task = tokio::spawn(serve(
        app.clone(),
        (listener, header_read_timeout),
        kafka_clients,
        access,
        shutdown,
    ));
    Ok(Running { addr, app, task })
}

/// The operator endpoints' guard the flags ask for.
async fn operator_access(
    config: &Config,
    metrics: &metrics::Metrics,
) -> anyhow::Result<http::access::OperatorAccess> {
    use http::access::OperatorAccess;
    if let Some(token) = config.api_static_token.clone().filter(|t| !t.is_empty()) {
        return Ok(OperatorAccess::Static(token));
    }
    let Some(audience) = config.api_audience.clone().filter(|a| !a.is_empty()) else {
        return Ok(OperatorAccess::Open);
    };
    let client = kube::Client::try_default().await.context(
        "--api-audience needs Kubernetes API access (in-cluster service account or KUBECONFIG) \
         to run TokenReviews and SubjectAccessReviews",
    )?;
    Ok(OperatorAccess::Kube(Box::new(
        http::access::KubeOperators {
            access: ic_kube_auth::AccessReviewer::new(client.clone()),
            reviewer: ic_kube_auth::TokenReviewer::new(client, audience).with_review_rate(
                config.token_reviews_per_second,
                config.token_review_burst,
                metrics.token_reviews_throttled.clone(),
            ),
            admins: config.api_admins.clone(),
        },
    )))
}

async fn serve(
    app: App,
    (listener, header_read_timeout): (ServingListener, std::time::Duration),
    kafka_clients: Option<kafka::Clients>,
    access: http::access::OperatorAccess,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let loops = shutdown.child_token();
    let mut tasks = Vec::new();
    if let Some(clients) = kafka_clients {
        // The consumer blocks in librdkafka's poll, so it gets its own thread.
        let (app, stop) = (app.clone(), loops.clone());
        tasks.push(tokio::task::spawn_blocking(move || {
            kafka::run(app, clients, stop);
        }));
    }
    if let Some(every) = app.settings.health_check_interval {
        tasks.push(tokio::spawn(health_loop(app.clone(), every, loops.clone())));
    }
    if app.settings.checkpoint_path.is_some()
        && let Some(every) = app.settings.checkpoint_interval
    {
        tasks.push(tokio::spawn(checkpoint_loop(
            app.clone(),
            every,
            loops.clone(),
        )));
    }
    for c in app.controllers.iter() {
        if let Some(task) = c.clone().run(app.context(), loops.clone()) {
            tasks.push(tokio::spawn(watch_controller(
                app.clone(),
                c.name(),
                task,
                loops.clone(),
            )));
        }
    }
    tracing::info!("coordinator started");
    // With the operator endpoints open, lookups skip the router (hot.rs).
    let open = matches!(access, http::access::OperatorAccess::Open);
    let router = http::router_with(app.clone(), access);
    let router = if open {
        hot::with_hot_routes(app.clone(), router)
    } else {
        router
    };
    let result = ic_telemetry::serving::serve_http(
        listener,
        router,
        header_read_timeout,
        app.metrics.metrics.header_read_timeouts.clone(),
        shutdown.clone(),
    )
    .await
    .context("HTTP server");
    loops.cancel();
    for t in tasks {
        let _ = t.await;
    }
    // Final checkpoint on a clean stop.
    let persistence = app.persistence.clone();
    let _ = tokio::task::spawn_blocking(move || persistence.write_checkpoint()).await;
    tracing::info!("coordinator stopped");
    result
}

/// Runs a controller's background task; one that panics or returns before
/// shutdown is logged and its up gauge drops to 0, the rest keep running.
async fn watch_controller(
    app: App,
    name: &'static str,
    task: controller::Task,
    stop: CancellationToken,
) {
    let outcome = tokio::spawn(task).await;
    if stop.is_cancelled() && outcome.is_ok() {
        return;
    }
    match outcome {
        Err(error) => tracing::error!(controller = name, %error, "controller task failed"),
        Ok(()) => tracing::error!(controller = name, "controller task ended before shutdown"),
    }
    app.metrics
        .metrics
        .controller_up
        .get_or_create(&metrics::ControllerLabel { controller: name })
        .set(0);
}

async fn health_loop(app: App, every: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        app.sweep_liveness().await;
        app.loops.pass("health");
    }
}

async fn checkpoint_loop(app: App, every: Duration, stop: CancellationToken) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let persistence = app.persistence.clone();
        let _ = tokio::task::spawn_blocking(move || persistence.write_checkpoint()).await;
        app.loops.pass("checkpoint");
    }
}

/// Runs the coordinator until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    let running = start(&config, Arc::new(SystemClock::default()), shutdown).await?;
    running.task.await.context("coordinator task")?
}
