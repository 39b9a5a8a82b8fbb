//! Active-active replicas share their pick-level load.
//!
//! Every replica holds the same index, but each sees only the picks of the
//! gateways that ask it: with N replicas, its in-flight counts, recent picks
//! and queued work are about 1/N of the engine's, so the load bound, the
//! TTFT estimates and the absolute shedding thresholds judge a fraction of
//! the load. So every `--peer-share-interval-ms` each replica sends every
//! other replica ([`IndexPeerService::share_picks`]) its own per-engine
//! figures ([`LoadBoard::own_picks`]); a receiver keeps each peer's newest
//! report, and as often sums the fresh ones into its board
//! ([`LoadBoard::peer_picks`]). Besides, with `--peer-push` (the default),
//! each pick (and each request's start and end) is pushed to every peer at
//! once, as a partial report of the engines it changed, which the receiver
//! applies at once: a peer sees a pick within a round trip, not up to two
//! intervals later (see [`send`]). A peer silent for `--peer-ttl-ms` counts
//! no more. Peers are found like the subscribers find the replicas: a static
//! `--peer` list, or a headless Service re-resolved (`--peer-discovery
//! dns`); a replica that reaches itself learns it from the answer's
//! instance id and stops sending there. Calls are authenticated like
//! IngestEvents; bounds (peers kept, engines per report) are flags, and
//! what they cut is counted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::Duration;

use ic_index::load::{LoadBoard, PeerPicks};
use ic_index::sharded::ShardedRwLock;
use ic_proto::index_v1 as pb;
pub use ic_proto::index_v1::index_peer_service_server::{IndexPeerService, IndexPeerServiceServer};
use ic_telemetry::MetricsRegistry;
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::access::{ApiAccess, Caller};
use crate::index_core::IndexCore;

mod send;

/// How the peers are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PeerDiscovery {
    /// Each `--peer` URL is one peer.
    Static,
    /// Each `--peer` URL's host is resolved every `--peer-resolve-seconds`
    /// and every address it names is a peer (a headless Service).
    Dns,
}

/// The peer replicas' load exchange.
#[derive(Clone, Debug, clap::Args)]
pub struct PeerFlags {
    /// The other index-server replicas' gRPC URLs (comma-separated; this
    /// replica's own address among them is found and skipped). None: no
    /// exchange.
    #[arg(long = "peer", env = "IC_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,

    /// How `--peer` URLs become peers.
    #[arg(long, env = "IC_PEER_DISCOVERY", value_enum, default_value = "static")]
    pub peer_discovery: PeerDiscovery,

    /// Seconds between two resolutions of the `--peer` hosts (dns).
    #[arg(long, env = "IC_PEER_RESOLVE_SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub peer_resolve_seconds: u64,

    /// Milliseconds between two reports to every peer (and between two
    /// sums of what the peers reported).
    #[arg(long, env = "IC_PEER_SHARE_INTERVAL_MS", default_value_t = 50, value_parser = clap::value_parser!(u64).range(5..=10_000))]
    pub peer_share_interval_ms: u64,

    /// Push this replica's picks to every peer as they happen (one call in
    /// flight per peer; picks made during a call go in the next), besides
    /// the full report every --peer-share-interval-ms: a peer then sees a
    /// pick a round trip later instead of up to two intervals later.
    #[arg(long, env = "IC_PEER_PUSH", default_value_t = true, action = clap::ArgAction::Set)]
    pub peer_push: bool,

    /// A peer's figures count this long after its last report, ms.
    #[arg(long, env = "IC_PEER_TTL_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    pub peer_ttl_ms: u64,

    /// Peers whose reports are kept at once; a further peer's reports are
    /// refused (RESOURCE_EXHAUSTED), counted.
    #[arg(long, env = "IC_PEER_MAX", default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub peer_max: u64,

    /// Engines in one report, sent or read; the rest are cut, counted.
    #[arg(long, env = "IC_PEER_MAX_ENDPOINTS", default_value_t = 4_096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub peer_max_endpoints: u64,

    /// Bearer token presented to the peers, read again every 10 s (a
    /// projected service-account token for --api-audience); without it
    /// the --api-static-token, if any.
    #[arg(long, env = "IC_PEER_TOKEN_FILE")]
    pub peer_token_file: Option<PathBuf>,

    /// CA bundle an `https://` peer must chain to.
    #[arg(long, env = "IC_PEER_CA_FILE")]
    pub peer_ca_file: Option<PathBuf>,

    /// Identities (TokenReview usernames) whose reports are accepted with
    /// --api-audience: the index server's own service account
    /// (repeatable); the --api-admin identities are too.
    #[arg(
        long = "peer-identity",
        env = "IC_PEER_IDENTITIES",
        value_delimiter = ','
    )]
    pub peer_identities: Vec<String>,
}

const FLAG: &str = "--peer";

/// The exchange's settings, checked.
#[derive(Clone, Debug)]
pub struct PeerSettings {
    urls: Vec<String>,
    discovery: PeerDiscovery,
    resolve_every: Duration,
    interval: Duration,
    push: bool,
    ttl_ms: i64,
    max_peers: usize,
    max_endpoints: usize,
    token_file: Option<PathBuf>,
    static_token: Option<String>,
    ca_pem: Option<Vec<u8>>,
    identities: Vec<String>,
}

impl PeerFlags {
    /// The settings, or an error naming the flag; `api_static_token` is
    /// presented when no token file is set.
    pub fn settings(&self, api_static_token: Option<&str>) -> anyhow::Result<PeerSettings> {
        let mut urls = Vec::new();
        for value in &self.peers {
            for url in ic_proto::urls::parse_list(value, FLAG).map_err(anyhow::Error::msg)? {
                if !urls.contains(&url) {
                    urls.push(url);
                }
            }
        }
        let ca_pem = match &self.peer_ca_file {
            Some(path) => Some(
                std::fs::read(path)
                    .map_err(|e| anyhow::anyhow!("--peer-ca-file {}: {e}", path.display()))?,
            ),
            None => None,
        };
        for url in &urls {
            ic_proto::channel::endpoint(url, ca_pem.as_deref(), FLAG)
                .map_err(anyhow::Error::msg)?;
        }
        let usize_of = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        Ok(PeerSettings {
            urls,
            discovery: self.peer_discovery,
            resolve_every: Duration::from_secs(self.peer_resolve_seconds),
            interval: Duration::from_millis(self.peer_share_interval_ms),
            push: self.peer_push,
            ttl_ms: i64::try_from(self.peer_ttl_ms).unwrap_or(i64::MAX),
            max_peers: usize_of(self.peer_max),
            max_endpoints: usize_of(self.peer_max_endpoints),
            token_file: self.peer_token_file.clone(),
            static_token: api_static_token.map(str::to_owned),
            ca_pem,
            identities: self
                .peer_identities
                .iter()
                .map(|i| i.trim().to_owned())
                .filter(|i| !i.is_empty())
                .collect(),
        })
    }
}

// === metrics ===

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShareLabel {
    /// `sent` or `received`.
    direction: &'static str,
    /// `full` (every interval) or `push` (right after a pick).
    report: &'static str,
    /// `ok`, `error`, `self`; received: `refused`, `invalid`, `over_peers`.
    outcome: &'static str,
}

/// The exchange's metrics (prefixed `inferencecache_index_peers_`).
#[derive(Clone, Debug, Default)]
struct PeerMetrics {
    shares: Family<ShareLabel, Counter>,
    endpoints_cut: Counter,
    live: Gauge,
    destinations: Gauge,
}

impl PeerMetrics {
    fn register(registry: &MetricsRegistry) -> Self {
        let m = Self::default();
        registry.register_with(|r| {
            let r = r.sub_registry_with_prefix("index_peers");
            r.register(
                "shares",
                "Pick-load reports sent to or received from peer replicas, by direction, kind (full or push) and outcome",
                m.shares.clone(),
            );
            r.register(
                "endpoints_cut",
                "Engines left out of a report sent or read, over --peer-max-endpoints",
                m.endpoints_cut.clone(),
            );
            r.register(
                "live",
                "Peers whose figures count (reported within --peer-ttl-ms)",
                m.live.clone(),
            );
            r.register(
                "destinations",
                "Peers this replica reports to",
                m.destinations.clone(),
            );
        });
        m
    }

    fn share(&self, direction: &'static str, partial: bool, outcome: &'static str) {
        let report = if partial { "push" } else { "full" };
        self.shares
            .get_or_create(&ShareLabel {
                direction,
                report,
                outcome,
            })
            .inc();
    }
}

// === the receiving side ===

/// One peer's newest report.
#[derive(Debug)]
struct Report {
    at_ms: i64,
    endpoints: HashMap<String, PeerPicks>,
}

/// The peers' reports and the engines whose peer figures are on the board.
///
/// One mutex over both, held while the board is written: a sum written by
/// the upkeep cannot overwrite a push applied after it was computed, and an
/// engine only a push put on the board is reset when no report names it.
#[derive(Debug, Default)]
struct Received {
    reports: HashMap<u64, Report>,
    on_board: HashSet<String>,
}

impl Received {
    /// The fresh reports' figures of `id`, summed.
    fn sum_of(&self, id: &str, now_ms: i64, ttl: i64) -> PeerPicks {
        let mut s = PeerPicks::default();
        for report in self.reports.values() {
            if now_ms.saturating_sub(report.at_ms) > ttl {
                continue;
            }
            if let Some(p) = report.endpoints.get(id) {
                s.in_flight += p.in_flight;
                s.recent += p.recent;
                s.queued_ms += p.queued_ms;
            }
        }
        s
    }
}

/// What the peers reported, and this process's instance id.
#[derive(Debug)]
pub struct Exchange {
    instance: u64,
    settings: PeerSettings,
    received: Mutex<Received>,
    metrics: PeerMetrics,
    /// Each reporter's engines changed since its last report (`--peer-push`);
    /// read on every pick (through the thread's shard), written only
    /// when a reporter starts or stops.
    pending: ShardedRwLock<Vec<Arc<send::Pending>>>,
}

impl Exchange {
    /// An exchange with a fresh instance id.
    pub fn new(settings: PeerSettings, registry: &MetricsRegistry) -> Arc<Self> {
        Arc::new(Self {
            instance: random_instance(),
            settings,
            received: Mutex::new(Received::default()),
            metrics: PeerMetrics::register(registry),
            pending: ShardedRwLock::new(Vec::new()),
        })
    }

    /// This server's own figures of `replica_id` changed: every reporter
    /// pushes it with its next report.
    fn changed(&self, replica_id: &str) {
        let pending = self.pending.read();
        if pending.is_empty() {
            return;
        }
        // The pick's figures written before any mark reads its slot
        // (`send::Pending`: the other half is the sender's, after it takes).
        fence(Ordering::SeqCst);
        for pending in pending.iter() {
            if !pending.mark(replica_id) {
                self.metrics.endpoints_cut.inc();
            }
        }
    }

    /// Keeps `endpoints` as peer `instance`'s report at `now_ms`: a full
    /// report replaces the peer's last one, a `partial` one updates the
    /// engines it names (new ones only up to --peer-max-endpoints) and,
    /// applied at once, writes their sums to `board`.
    fn take(
        &self,
        instance: u64,
        endpoints: Vec<(String, PeerPicks)>,
        now_ms: i64,
        partial: bool,
        board: &LoadBoard,
    ) -> Result<(), Status> {
        let mut received = self.received.lock();
        let ids: Vec<String> = if partial {
            endpoints.iter().map(|(id, _)| id.clone()).collect()
        } else {
            Vec::new()
        };
        self.receive(&mut received, instance, endpoints, now_ms, partial)?;
        // A pushed pick counts at once, not at the next sum: the next
        // request may come before it.
        let ttl = self.settings.ttl_ms;
        for id in ids {
            board.peer_picks(&id, received.sum_of(&id, now_ms, ttl), now_ms, ttl);
            received.on_board.insert(id);
        }
        Ok(())
    }

    fn receive(
        &self,
        received: &mut Received,
        instance: u64,
        endpoints: Vec<(String, PeerPicks)>,
        now_ms: i64,
        partial: bool,
    ) -> Result<(), Status> {
        let reports = &mut received.reports;
        if !reports.contains_key(&instance) && reports.len() >= self.settings.max_peers {
            // Make room only from peers that fell silent.
            let ttl = self.settings.ttl_ms;
            reports.retain(|_, r| now_ms.saturating_sub(r.at_ms) <= ttl);
            if reports.len() >= self.settings.max_peers {
                self.metrics.share("received", partial, "over_peers");
                return Err(Status::resource_exhausted(format!(
                    "SharePicks: this replica keeps the reports of {} peers \
                     (--peer-max)",
                    self.settings.max_peers
                )));
            }
        }
        match reports.get_mut(&instance) {
            Some(report) if partial => {
                // A push leaves `at_ms` alone: only a full report vouches
                // for the engines it does not name.
                let max = self.settings.max_endpoints;
                let mut cut = 0;
                for (id, picks) in endpoints {
                    let len = report.endpoints.len();
                    match report.endpoints.entry(id) {
                        std::collections::hash_map::Entry::Occupied(mut e) => {
                            e.insert(picks);
                        }
                        std::collections::hash_map::Entry::Vacant(e) if len < max => {
                            e.insert(picks);
                        }
                        std::collections::hash_map::Entry::Vacant(_) => cut += 1,
                    }
                }
                self.metrics.endpoints_cut.inc_by(cut);
            }
            _ => {
                reports.insert(
                    instance,
                    Report {
                        at_ms: now_ms,
                        endpoints: endpoints.into_iter().collect(),
                    },
                );
            }
        }
        Ok(())
    }

    /// Sums the fresh peers' figures into `board`: an engine on the board
    /// that no fresh peer names any more is set to zero. Returns how many
    /// peers counted.
    fn apply_once(&self, board: &LoadBoard, now_ms: i64) -> usize {
        let ttl = self.settings.ttl_ms;
        let mut received = self.received.lock();
        let mut sum: BTreeMap<String, PeerPicks> = BTreeMap::new();
        let mut live = 0;
        for report in received.reports.values() {
            if now_ms.saturating_sub(report.at_ms) > ttl {
                continue;
            }
            live += 1;
            for (id, p) in &report.endpoints {
                let s = sum.entry(id.clone()).or_default();
                s.in_flight += p.in_flight;
                s.recent += p.recent;
                s.queued_ms += p.queued_ms;
            }
        }
        board.set_live_peers(u32::try_from(live).unwrap_or(u32::MAX));
        for id in received.on_board.iter().filter(|id| !sum.contains_key(*id)) {
            board.peer_picks(id, PeerPicks::default(), now_ms, ttl);
        }
        for (id, picks) in &sum {
            board.peer_picks(id, *picks, now_ms, ttl);
        }
        received.on_board = sum.into_keys().collect();
        live
    }
}

/// A random instance id (the std hasher's per-process random keys over the
/// pid and the time), never 0.
fn random_instance() -> u64 {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    std::collections::hash_map::RandomState::new().hash_one((std::process::id(), nanos)) | 1
}

/// Checks a report's figures; an error names the field.
fn decode(
    endpoints: Vec<pb::EndpointPicks>,
    max: usize,
) -> Result<(Vec<(String, PeerPicks)>, u64), Status> {
    let cut = endpoints.len().saturating_sub(max) as u64;
    let mut out = Vec::with_capacity(endpoints.len().min(max));
    for (i, e) in endpoints.into_iter().take(max).enumerate() {
        if e.replica_id.is_empty() {
            return Err(Status::invalid_argument(format!(
                "endpoints[{i}].replica_id: must not be empty"
            )));
        }
        for (field, value) in [
            ("in_flight", e.in_flight),
            ("recent_picks", e.recent_picks),
            ("queued_ms", e.queued_ms),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(Status::invalid_argument(format!(
                    "endpoints[{i}].{field}: expected a finite number >= 0, got {value}"
                )));
            }
        }
        out.push((
            e.replica_id,
            PeerPicks {
                in_flight: e.in_flight,
                recent: e.recent_picks,
                queued_ms: e.queued_ms,
            },
        ));
    }
    Ok((out, cut))
}

/// The `IndexPeerService` on the gRPC port.
#[derive(Clone, Debug)]
pub struct PeerServer {
    exchange: Arc<Exchange>,
    core: Arc<IndexCore>,
    access: Arc<ApiAccess>,
}

impl PeerServer {
    /// Serves `exchange`, checking callers with `access`.
    pub fn new(exchange: Arc<Exchange>, core: Arc<IndexCore>, access: Arc<ApiAccess>) -> Self {
        Self {
            exchange,
            core,
            access,
        }
    }

    fn refused(&self, denied: &crate::access::Denied, partial: bool) -> Status {
        self.exchange.metrics.share("received", partial, "refused");
        self.core.metrics().access_refused("share_picks", denied);
        denied.to_status()
    }
}

#[tonic::async_trait]
impl IndexPeerService for PeerServer {
    async fn share_picks(
        &self,
        request: Request<pb::SharePicksRequest>,
    ) -> Result<Response<pb::SharePicksResponse>, Status> {
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let partial = request.get_ref().partial;
        let caller = self
            .access
            .authenticate(authorization)
            .await
            .map_err(|d| self.refused(&d, partial))?;
        if let Caller::User { user, admin: false } = &caller
            && !self.exchange.settings.identities.contains(&user.username)
        {
            return Err(self.refused(
                &crate::access::Denied::PermissionDenied(format!(
                    "SharePicks: {:?} is not an identity --peer-identity names (the index \
                 server's service account)",
                    user.username
                )),
                partial,
            ));
        }
        let answer = Response::new(pb::SharePicksResponse {
            instance: self.exchange.instance,
        });
        let request = request.into_inner();
        if request.instance == self.exchange.instance {
            self.exchange.metrics.share("received", partial, "self");
            return Ok(answer);
        }
        let (endpoints, cut) = decode(request.endpoints, self.exchange.settings.max_endpoints)
            .inspect_err(|_| self.exchange.metrics.share("received", partial, "invalid"))?;
        self.exchange.metrics.endpoints_cut.inc_by(cut);
        let now_ms = self.core.now_ms();
        self.exchange.take(
            request.instance,
            endpoints,
            now_ms,
            partial,
            self.core.routing().load_board(),
        )?;
        self.exchange.metrics.share("received", partial, "ok");
        Ok(answer)
    }
}

// === the sending side and the upkeep ===

/// Sums the peers' reports into `board` every share interval until
/// `shutdown`; an engine no fresh peer names any more is set to zero.
async fn apply(exchange: Arc<Exchange>, core: Arc<IndexCore>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(exchange.settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let live = exchange.apply_once(core.routing().load_board(), core.now_ms());
        exchange.metrics.live.set(live as i64);
    }
}

fn key(url: &str, addr: Option<SocketAddr>) -> String {
    match addr {
        Some(a) => format!("{url}@{a}"),
        None => url.to_owned(),
    }
}

/// Runs the exchange (reports to every peer, sums theirs) until
/// `shutdown`; nothing when no peer is configured.
pub fn start(exchange: Arc<Exchange>, core: Arc<IndexCore>, shutdown: CancellationToken) {
    if exchange.settings.urls.is_empty() {
        return;
    }
    tracing::info!(
        peers = exchange.settings.urls.len(),
        discovery = ?exchange.settings.discovery,
        interval_ms = exchange.settings.interval.as_millis() as u64,
        push = exchange.settings.push,
        "sharing pick load with peer replicas"
    );
    if exchange.settings.push {
        let x = exchange.clone();
        if !core
            .routing()
            .load_board()
            .on_own_change(move |id| x.changed(id))
        {
            tracing::warn!("the load board already has a listener: picks are not pushed");
        }
    }
    tokio::spawn(apply(exchange.clone(), core.clone(), shutdown.clone()));
    tokio::spawn(discover(exchange, core, shutdown));
}

/// Starts a reporter for every peer, and with dns discovery keeps the set
/// in step with what the hosts resolve to.
async fn discover(exchange: Arc<Exchange>, core: Arc<IndexCore>, shutdown: CancellationToken) {
    let selves: Arc<Mutex<HashSet<String>>> = Arc::default();
    let spawn = |url: &str, addr: Option<SocketAddr>, stop: CancellationToken| {
        tokio::spawn(send::report_to(
            exchange.clone(),
            core.clone(),
            url.to_owned(),
            addr,
            selves.clone(),
            stop,
        ));
    };
    if exchange.settings.discovery == PeerDiscovery::Static {
        for url in &exchange.settings.urls {
            spawn(url, None, shutdown.child_token());
        }
        return;
    }
    let mut running: BTreeMap<String, CancellationToken> = BTreeMap::new();
    let mut tick = tokio::time::interval(exchange.settings.resolve_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut wanted: BTreeMap<String, (String, SocketAddr)> = BTreeMap::new();
        for url in &exchange.settings.urls {
            match ic_proto::urls::resolve(url, FLAG).await {
                Ok(addrs) => wanted.extend(
                    addrs
                        .into_iter()
                        .map(|a| (key(url, Some(a)), (url.clone(), a))),
                ),
                Err(error) => {
                    // Keep this URL's peers: a DNS hiccup must not stop
                    // every report.
                    tracing::warn!(%url, %error, "cannot resolve the peers");
                    let prefix = format!("{url}@");
                    for k in running.keys().filter(|k| k.starts_with(&prefix)) {
                        if let Some((_, a)) = k.rsplit_once('@')
                            && let Ok(a) = a.parse()
                        {
                            wanted.insert(k.clone(), (url.clone(), a));
                        }
                    }
                }
            }
        }
        let selves_now = selves.lock().clone();
        wanted.retain(|k, _| !selves_now.contains(k));
        running.retain(|k, stop| {
            let keep = wanted.contains_key(k);
            if !keep {
                stop.cancel();
            }
            keep
        });
        for (k, (url, addr)) in wanted {
            if let std::collections::btree_map::Entry::Vacant(slot) = running.entry(k) {
                let stop = shutdown.child_token();
                spawn(&url, Some(addr), stop.clone());
                slot.insert(stop);
            }
        }
    }
}

#[cfg(test)]
mod tests;
