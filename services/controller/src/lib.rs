//! `ic-controller`: CacheBackend reconciliation, the CacheIndex poller and
//! the CachePolicy / CacheTenant pushers, behind Lease-based leader election.
//!
//! Layout: [`stores`] (the watch-fed view every loop reads) and [`index`]
//! (its Pods and Deployments by namespace and labels), [`backend`]
//! (CacheBackend reconciler), [`enginepod`] (engine-pod Events), [`poller`]
//! (CacheIndex + indexParticipation), [`policy`] (CachePolicy →
//! SetPolicies on every index server [`discovery`] finds), [`tenant`] (CacheTenant → coordinator, with a finalizer),
//! [`leader`] (Lease elector), [`metrics`] and [`kubeutil`] (SSA helpers).
//! The decisions live in `ic-controller-core`; this crate does the I/O.
//! Tests drive it against `ic-fake-apiserver`.

pub mod backend;
pub mod discovery;
pub mod enginepod;
pub mod index;
pub mod kubeutil;
pub mod leader;
pub mod metrics;
pub mod policy;
pub mod poller;
pub mod stores;
pub mod tenant;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ic_controller_core::clock::{Clock, SystemClock};
use ic_telemetry::{AdminServer, Health, MetricsRegistry};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::discovery::DiscoveryMode;
use crate::leader::LeaderElector;
use crate::metrics::Metrics;
use crate::policy::PolicyPusher;
use crate::poller::Poller;
use crate::stores::{Feeds, Stores};
use crate::tenant::TenantPusher;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

/// Binary name.
pub const BINARY: &str = "ic-controller";

/// Controller flags.
#[derive(Clone, Debug, clap::Args)]
pub struct Config {
    /// Admin listen address (/live, /ready, /metrics).
    #[arg(long, env = "IC_ADMIN_ADDR", default_value = "0.0.0.0:8082")]
    pub admin_addr: SocketAddr,
    #[command(flatten)]
    pub header_deadline: ic_telemetry::serving::HeaderDeadlineFlags,
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
    /// Index server gRPC URL(s), comma-separated, the CachePolicy pusher
    /// calls SetPolicies on (every replica needs the policies: list each,
    /// or name a headless Service with --index-server-discovery=dns); empty
    /// disables the pusher.
    #[arg(
        long,
        env = "IC_INDEX_SERVER_GRPC",
        default_value = "http://inferencecache-index-server.inferencecache-system:9090"
    )]
    pub index_server_grpc: String,
    /// How --index-server-grpc's URLs become index servers: `static` (each
    /// URL is one) or `dns` (each URL's host is resolved every
    /// --index-server-resolve-seconds and every address is pushed to).
    #[arg(
        long,
        env = "IC_INDEX_SERVER_DISCOVERY",
        value_enum,
        default_value_t = DiscoveryMode::Static
    )]
    pub index_server_discovery: DiscoveryMode,
    /// Seconds between resolutions of --index-server-grpc (dns) and pushes
    /// to the index servers that lack the current policies (new ones, or
    /// ones whose last push failed).
    #[arg(long, env = "IC_INDEX_SERVER_RESOLVE_SECONDS", default_value_t = 5)]
    pub index_server_resolve_seconds: u64,
    /// CA bundle (PEM file) of an `https://` --index-server-grpc.
    #[arg(long, env = "IC_INDEX_SERVER_CA_FILE")]
    pub index_server_ca_file: Option<PathBuf>,
    /// Coordinator base URL for CacheTenant quotas and pins; unset disables the pusher.
    #[arg(long, env = "IC_COORDINATOR_URL")]
    pub coordinator_url: Option<String>,
    /// Bearer token file presented to the coordinator's operator
    /// endpoints (for a coordinator started with `--api-audience`).
    #[arg(long, env = "IC_COORDINATOR_TOKEN_PATH")]
    pub coordinator_token_path: Option<PathBuf>,
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
    /// Seconds between /snapshot scrapes.
    #[arg(long, env = "IC_SNAPSHOT_INTERVAL_SECONDS", default_value_t = 15)]
    pub snapshot_interval_seconds: u64,
    /// Seconds between CachePolicy / CacheTenant resyncs.
    #[arg(long, env = "IC_RESYNC_INTERVAL_SECONDS", default_value_t = 30)]
    pub resync_interval_seconds: u64,
    /// Run only while holding the leader Lease (disable for a single replica
    /// without Lease RBAC).
    #[arg(long, env = "IC_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,
    /// Namespace of the leader Lease.
    #[arg(
        long,
        env = "IC_LEADER_ELECTION_NAMESPACE",
        default_value = "inferencecache-system"
    )]
    pub leader_election_namespace: String,
    /// Name of the leader Lease.
    #[arg(long, env = "IC_LEASE_NAME", default_value = "ic-controller")]
    pub lease_name: String,
    /// This instance's identity in the Lease (the pod name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Seconds a Lease stays valid without renewal.
    #[arg(long, env = "IC_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,
    /// Seconds between acquire/renew attempts (well under the duration).
    #[arg(long, env = "IC_LEASE_RETRY_SECONDS", default_value_t = 4)]
    pub lease_retry_seconds: u64,
}

/// What the loops share.
#[derive(Clone)]
pub struct Shared {
    /// API client.
    pub client: kube::Client,
    /// HTTP client (snapshot, probe, coordinator).
    pub http: reqwest::Client,
    /// Metrics.
    pub metrics: Metrics,
    /// Time source.
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// Starts the watch-fed stores and every loop of this build under `stop`;
/// they end when it fires. The poller and the pushers start once every
/// store has synced; the reconcilers consume their feeds from the start
/// (a subscriber that does not read would hold its watch back) and wait
/// for the stores inside reconcile.
pub fn spawn_loops(config: &Config, shared: &Shared, stop: &CancellationToken) -> JoinSet<()> {
    let mut set = JoinSet::new();
    let (stores, feeds) = stores::start(&shared.client, &shared.metrics, &mut set, stop);
    let mut poller = Poller::new(
        shared.client.clone(),
        shared.http.clone(),
        config.snapshot_url.clone(),
        shared.metrics.clone(),
        shared.clock.clone(),
        stores.clone(),
    );
    // The same audience-bound token as /probe: the index server's access
    // control lets the controller (an --api-admin) read and push.
    poller.token_path = Some(config.probe_token_path.clone());
    let every = Duration::from_secs(config.snapshot_interval_seconds.max(1));
    spawn_synced(&mut set, &stores, stop, poller.run(every, stop.clone()));
    let resync = Duration::from_secs(config.resync_interval_seconds.max(1));
    // Validated in `run`; a bad list here (a test's Config) pushes nowhere.
    let urls = discovery::parse_urls(&config.index_server_grpc).unwrap_or_default();
    if !urls.is_empty() {
        let pusher = PolicyPusher::new(
            shared.client.clone(),
            urls,
            shared.metrics.clone(),
            shared.clock.clone(),
            stores.clone(),
        )
        .with_discovery(
            config.index_server_discovery,
            Duration::from_secs(config.index_server_resolve_seconds.max(1)),
        )
        .with_token_path(Some(config.probe_token_path.clone()))
        .with_ca_path(config.index_server_ca_file.clone());
        let changes = stores.changes.policies.clone();
        spawn_synced(
            &mut set,
            &stores,
            stop,
            pusher.run(resync, changes, stop.clone()),
        );
    }
    if let Some(url) = config.coordinator_url.clone().filter(|u| !u.is_empty()) {
        let pusher = TenantPusher::new(
            shared.client.clone(),
            shared.http.clone(),
            url,
            shared.metrics.clone(),
            shared.clock.clone(),
            stores.clone(),
        )
        .with_token_path(config.coordinator_token_path.clone());
        let changes = stores.changes.tenants.clone();
        spawn_synced(
            &mut set,
            &stores,
            stop,
            pusher.run(resync, changes, stop.clone()),
        );
    }
    spawn_reconcilers(config, shared, &stores, feeds, stop, &mut set);
    set
}

/// Runs `run` on `set` once `stores` have synced (never, if `stop` fires
/// first).
fn spawn_synced(
    set: &mut JoinSet<()>,
    stores: &Stores,
    stop: &CancellationToken,
    run: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let stores = stores.clone();
    let stop = stop.clone();
    set.spawn(async move {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            synced = stores.synced() => if synced.is_err() { return },
        }
        run.await;
    });
}

/// The kube-runtime controllers, fed from the shared watches: CacheBackends
/// (owning the provider objects, woken by their injected engine pods) and
/// engine-pod events.
fn spawn_reconcilers(
    config: &Config,
    shared: &Shared,
    stores: &Stores,
    feeds: Feeds,
    stop: &CancellationToken,
    set: &mut JoinSet<()>,
) {
    use futures::StreamExt;
    use kube::runtime::Controller;
    use kube::runtime::events::{Recorder, Reporter};
    use kube::runtime::reflector::ObjectRef;

    let client = shared.client.clone();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: BINARY.into(),
            instance: Some(identity(config)),
        },
    );
    let ctx = Arc::new(backend::BackendContext::new(
        client.clone(),
        recorder.clone(),
        shared.metrics.clone(),
        shared.clock.clone(),
        shared.http.clone(),
        config.server_probe_url.clone(),
        config.probe_token_path.clone(),
        config
            .kvevent_subscriber_image
            .as_deref()
            .is_some_and(|i| !i.is_empty()),
        stores.clone(),
    ));
    let pod_ctx = Arc::new(enginepod::PodEventsContext::new(
        client,
        recorder,
        shared.metrics.clone(),
        stores.backends.clone(),
    ));
    // Deletions never reach reconcile: prune the per-object memory of both
    // controllers against the stores every resync.
    let prune_every = Duration::from_secs(config.resync_interval_seconds.max(1));
    let (prune_ctx, prune_pods, prune_stores) = (ctx.clone(), pod_ctx.clone(), stores.clone());
    let prune_stop = stop.clone();
    spawn_synced(set, stores, stop, async move {
        let mut tick = tokio::time::interval(prune_every);
        loop {
            tokio::select! {
                () = prune_stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let live = prune_stores
                .backends
                .state()
                .iter()
                .map(|b| format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any()))
                .collect();
            prune_ctx.forget_deleted(&live);
            prune_pods.forget_deleted(&prune_stores.pods);
        }
    });
    let backends = Controller::for_stream(feeds.backends, stores.backends.clone())
        .owns_stream(feeds.deployments)
        .owns_stream(feeds.statefulsets)
        .owns_stream(feeds.services)
        .owns_stream(feeds.hpas)
        .watches_stream(feeds.backend_pods, |pod: Pod| {
            ic_controller_core::observe::injected_by(pod.metadata.annotations.as_ref())
                .map(|(ns, name)| ObjectRef::<ic_api::CacheBackend>::new(&name).within(&ns))
        })
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(backend::reconcile, backend::error_policy, ctx);
    set.spawn(backends.for_each(|_| async {}));

    let pods = Controller::for_stream(feeds.pods, stores.pods.clone())
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(enginepod::reconcile, enginepod::error_policy, pod_ctx);
    set.spawn(pods.for_each(|_| async {}));
}

/// Runs the loops whenever `leading` is true, stopping them when it turns
/// false or `shutdown` fires.
pub async fn run_while_leading(
    config: Config,
    shared: Shared,
    mut leading: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    loop {
        // Wait to lead.
        while !*leading.borrow_and_update() {
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = leading.changed() => if changed.is_err() { return },
            }
        }
        let term = shutdown.child_token();
        let mut loops = spawn_loops(&config, &shared, &term);
        tracing::info!("leading: controllers started");
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                changed = leading.changed() => {
                    if changed.is_err() || !*leading.borrow_and_update() { break }
                }
            }
        }
        term.cancel();
        while loops.join_next().await.is_some() {}
        // Only the leader reports backends; a follower exports none.
        shared
            .metrics
            .retain_degraded_backends(&std::collections::BTreeSet::new());
        tracing::info!("controllers stopped");
        if shutdown.is_cancelled() {
            return;
        }
    }
}

fn identity(config: &Config) -> String {
    config
        .identity
        .clone()
        .filter(|i| !i.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| format!("ic-controller-{}", std::process::id()))
}

/// Connects to the API server and runs elector plus loops until `shutdown`.
async fn control(config: Config, metrics: Metrics, shutdown: CancellationToken) {
    let client = loop {
        match kube::Client::try_default().await {
            Ok(c) => break c,
            Err(e) => {
                tracing::error!(error = %e, "no Kubernetes API credentials; retrying in 10s");
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
        }
    };
    let shared = Shared {
        client: client.clone(),
        http: reqwest::Client::new(),
        metrics: metrics.clone(),
        clock: Arc::new(SystemClock::default()),
    };
    let (tx, rx) = watch::channel(false);
    let elector = if config.leader_election {
        let elector = LeaderElector::new(
            client,
            &config.leader_election_namespace,
            &config.lease_name,
            &identity(&config),
            Duration::from_secs(config.lease_duration_seconds.max(1)),
            shared.clock.clone(),
        )
        .with_metrics(metrics);
        Some(tokio::spawn(elector.run(
            Duration::from_secs(config.lease_retry_seconds.max(1)),
            tx,
            shutdown.clone(),
        )))
    } else {
        tx.send_replace(true);
        metrics.leader.set(1);
        // Keep the sender alive for the lifetime of the loops.
        let shutdown = shutdown.clone();
        Some(tokio::spawn(async move {
            shutdown.cancelled().await;
            drop(tx);
        }))
    };
    run_while_leading(config, shared, rx, shutdown).await;
    if let Some(handle) = elector {
        let _ = handle.await;
    }
}

/// Runs the controller until `shutdown` is cancelled.
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    discovery::parse_urls(&config.index_server_grpc).map_err(anyhow::Error::msg)?;
    let registry = MetricsRegistry::new("inferencecache", BINARY);
    let metrics = Metrics::register(&registry);
    let health = Health::new();
    let admin = AdminServer::bind(
        config.admin_addr,
        health.clone(),
        registry,
        axum::Router::new(),
    )
    .await
    .context("starting admin server")?
    .with_counted_header_read_timeout(config.header_deadline, "controller");
    tracing::info!(
        snapshot_url = %config.snapshot_url,
        index_server_grpc = %config.index_server_grpc,
        index_server_discovery = ?config.index_server_discovery,
        leader_election = config.leader_election,
        "controller started"
    );
    let control = tokio::spawn(control(config, metrics, shutdown.clone()));
    health.set_ready(true);
    let served = admin.serve(shutdown.clone()).await;
    shutdown.cancel();
    control.await.context("controller task")?;
    served.context("admin server")?;
    tracing::info!("controller stopped");
    Ok(())
}
