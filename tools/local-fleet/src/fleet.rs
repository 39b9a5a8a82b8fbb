//! Replaying a trace across a fleet of simulated engines, routed several
//! ways, each with the same engine timing model (crate::timing).
//!
//! * `lookup-route …`: the real thing. Each engine publishes its cache
//!   changes in the vLLM wire over ZMQ to its own `ic-kvevent-subscriber`,
//!   which feeds the `ic-index-server` (every replica of it); a gateway
//!   loop asks `LookupRoute` (with block hashes it computes itself) of the
//!   replicas in turn, naming every engine as a candidate, and follows
//!   `best` (a prefix hint, or on NO_HINT the index's pick by load); with no
//!   `best` at all it falls back to the engine with the least queued work. Run once per scoring variant
//!   (prefix only, by the weights, by TTFT told the engines' rate, and the
//!   server's default), through LookupRoute and the endpoint picker.
//! * `round-robin` and `random`: the same engines, simulated in-process.
//! * `longest prefix (exact…)`: in-process references that know every
//!   engine's cache exactly (no event delay), unbounded and with a 1.25×
//!   fair-share load bound.
//! * `by predicted TTFT (exact…)`: the index's TTFT scoring with exact
//!   knowledge of every engine's cache and queue (what the routed TTFT
//!   variants would do with no event delay and no clock drift).
//! * `oracle`: one unbounded cache, the ceiling no routing can beat.

use std::time::{Duration, Instant};

use ic_kvevents::Medium;
use ic_kvevents::encode::{gpu_store, removal};
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use ic_sim::engine::FakeEngine;
use serde::Serialize;

use crate::cache::{PrefixCache, Served};
use crate::rng::Rng;
use crate::timing::{EngineQueues, TimingModel, percentile_ms};
use crate::trace::TraceRequest;

/// Tokens per simulated engine block (one per trace block id).
pub const ENGINE_BLOCK_TOKENS: u32 = 16;
/// Tokens per trace block.
pub const TRACE_BLOCK_TOKENS: u64 = 512;

/// The token ids standing for trace block `id` (distinct for every id).
pub fn block_tokens(id: u64) -> Vec<u32> {
    (0..u64::from(ENGINE_BLOCK_TOKENS))
        .map(|j| u32::try_from(id * u64::from(ENGINE_BLOCK_TOKENS) + j).unwrap_or(u32::MAX))
        .collect()
}

/// Hit statistics of one routing policy.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PolicyResult {
    /// Policy name.
    pub policy: String,
    /// Requests routed.
    pub requests: u64,
    /// Prompt blocks over all requests.
    pub prompt_blocks: u64,
    /// Blocks served from cache.
    pub hit_blocks: u64,
    /// Prompt tokens whose prefill was skipped.
    pub prefill_tokens_saved: u64,
    /// Prompt tokens over all requests.
    pub prompt_tokens: u64,
    /// Hit ratio per window of requests: (requests so far, window ratio).
    pub timeline: Vec<(u64, f64)>,
    /// Simulated time to first token, median, ms.
    pub ttft_p50_ms: f64,
    /// Simulated time to first token, 99th percentile, ms.
    pub ttft_p99_ms: f64,
    #[serde(skip)]
    ttft_ms: Vec<f64>,
    #[serde(skip)]
    window: u64,
    #[serde(skip)]
    window_blocks: u64,
    #[serde(skip)]
    window_hits: u64,
}

/// Windows the timeline of a `total`-request replay is cut into.
const TIMELINE_POINTS: u64 = 60;

impl PolicyResult {
    /// An empty result for a replay of `total` requests.
    pub fn new(policy: &str, total: usize) -> Self {
        Self {
            policy: policy.to_owned(),
            window: (total as u64 / TIMELINE_POINTS).max(1),
            ..Self::default()
        }
    }

    /// Counts one request served with `hit_blocks` cached and its TTFT.
    pub fn record_served(&mut self, request: &TraceRequest, hit_blocks: usize, ttft_ms: f64) {
        self.ttft_ms.push(ttft_ms);
        self.record(request, hit_blocks);
    }

    /// Computes the TTFT percentiles once every request is recorded.
    pub fn finish(mut self) -> Self {
        self.ttft_p50_ms = percentile_ms(&self.ttft_ms, 50.0);
        self.ttft_p99_ms = percentile_ms(&self.ttft_ms, 99.0);
        self
    }

    fn record(&mut self, request: &TraceRequest, hit_blocks: usize) {
        self.requests += 1;
        self.prompt_blocks += request.hash_ids.len() as u64;
        self.hit_blocks += hit_blocks as u64;
        self.window_blocks += request.hash_ids.len() as u64;
        self.window_hits += hit_blocks as u64;
        if self.requests.is_multiple_of(self.window.max(1)) {
            let ratio = if self.window_blocks == 0 {
                0.0
            } else {
                self.window_hits as f64 / self.window_blocks as f64
            };
            self.timeline.push((self.requests, ratio));
            self.window_blocks = 0;
            self.window_hits = 0;
        }
        self.prefill_tokens_saved +=
            (hit_blocks as u64 * TRACE_BLOCK_TOKENS).min(request.input_length);
        self.prompt_tokens += request.input_length;
    }

    /// Fraction of prompt blocks served from cache.
    pub fn hit_ratio(&self) -> f64 {
        if self.prompt_blocks == 0 {
            0.0
        } else {
            self.hit_blocks as f64 / self.prompt_blocks as f64
        }
    }
}

/// Prompt tokens a request still has to prefill after `hit_blocks`.
pub fn uncached_tokens(request: &TraceRequest, hit_blocks: usize) -> u64 {
    request
        .input_length
        .saturating_sub(hit_blocks as u64 * TRACE_BLOCK_TOKENS)
}

/// One in-process policy: its result, its engines' caches and queues.
struct Simulated {
    result: PolicyResult,
    caches: Vec<PrefixCache>,
    queues: EngineQueues,
    assigned: Vec<u64>,
}

impl Simulated {
    fn new(name: &str, total: usize, engines: usize, capacity: usize, timing: TimingModel) -> Self {
        Self {
            result: PolicyResult::new(name, total),
            caches: vec![PrefixCache::new(capacity); engines],
            queues: EngineQueues::new(engines, timing),
            assigned: vec![0; engines],
        }
    }

    fn serve(&mut self, engine: usize, request: &TraceRequest) {
        let served = self.caches[engine].serve(&request.hash_ids);
        let ttft = self.queues.serve(
            engine,
            request.timestamp_ms as f64,
            uncached_tokens(request, served.hit_blocks),
        );
        self.assigned[engine] += 1;
        self.result.record_served(request, served.hit_blocks, ttft);
    }

    /// Exact longest-prefix routing: the engine whose cache holds the most
    /// leading blocks, among those within `bound` × their fair share of
    /// requests so far when bounded; ties to the fewest assigned.
    fn longest_prefix(&self, request: &TraceRequest, bound: Option<f64>) -> usize {
        let n = self.caches.len();
        let total: u64 = self.assigned.iter().sum();
        let fair = (total + 1) as f64 / n as f64;
        (0..n)
            .filter(|&e| bound.is_none_or(|c| (self.assigned[e] + 1) as f64 <= c * fair + 1e-9))
            .max_by(|&a, &b| {
                let (ha, hb) = (
                    self.caches[a].peek_hits(&request.hash_ids),
                    self.caches[b].peek_hits(&request.hash_ids),
                );
                ha.cmp(&hb).then(self.assigned[b].cmp(&self.assigned[a]))
            })
            .unwrap_or(0)
    }
}

impl Simulated {
    /// Exact routing by predicted TTFT, as the index scores it with a TTFT
    /// model at the default prefix weight (2): among the engines within
    /// `bound` × their fair share, the least queued work plus twice the
    /// prefill of the blocks each does not hold.
    fn by_ttft(&self, request: &TraceRequest, at_ms: f64, bound: f64) -> usize {
        let n = self.caches.len();
        let total: u64 = self.assigned.iter().sum();
        let fair = (total + 1) as f64 / n as f64;
        let within = |e: &usize| (self.assigned[*e] + 1) as f64 <= bound * fair + 1e-9;
        let predicted = |e: usize| {
            let hits = self.caches[e].peek_hits(&request.hash_ids);
            self.queues.backlog_ms(e, at_ms)
                + 2.0 * self.queues.prefill_ms(uncached_tokens(request, hits))
        };
        let best = |candidates: &mut dyn Iterator<Item = usize>| {
            candidates.min_by(|&a, &b| {
                predicted(a)
                    .total_cmp(&predicted(b))
                    .then(self.assigned[a].cmp(&self.assigned[b]))
            })
        };
        best(&mut (0..n).filter(within))
            .or_else(|| best(&mut (0..n)))
            .unwrap_or(0)
    }
}

/// Routes the trace in-process: round-robin, random, exact longest-prefix
/// (unbounded and load-bounded, the references), exact by predicted TTFT
/// and the single-cache oracle.
pub fn simulate_baselines(
    trace: &[TraceRequest],
    engines: usize,
    capacity: usize,
    seed: u64,
    timing: TimingModel,
) -> Vec<PolicyResult> {
    let total = trace.len();
    let mut rr = Simulated::new("round-robin", total, engines, capacity, timing);
    let mut random = Simulated::new("random", total, engines, capacity, timing);
    let mut exact = Simulated::new(
        "longest prefix (exact, unbounded)",
        total,
        engines,
        capacity,
        timing,
    );
    let mut bounded = Simulated::new(
        "longest prefix (exact, 1.25x bound)",
        total,
        engines,
        capacity,
        timing,
    );
    let mut ttft = Simulated::new(
        "by predicted TTFT (exact, 1.25x bound)",
        total,
        engines,
        capacity,
        timing,
    );
    let mut oracle = Simulated::new(
        "oracle (one unbounded cache)",
        total,
        1,
        usize::MAX,
        TimingModel {
            // One cache standing for the fleet: as fast as all engines.
            prefill_tokens_per_second: timing.prefill_tokens_per_second * engines as f64,
            ..timing
        },
    );
    let mut rng = Rng::new(seed);
    for (i, request) in trace.iter().enumerate() {
        rr.serve(i % engines, request);
        random.serve(rng.below(engines), request);
        let e = exact.longest_prefix(request, None);
        exact.serve(e, request);
        let e = bounded.longest_prefix(request, Some(1.25));
        bounded.serve(e, request);
        let e = ttft.by_ttft(request, request.timestamp_ms as f64, 1.25);
        ttft.serve(e, request);
        oracle.serve(0, request);
    }
    [rr, random, exact, bounded, ttft, oracle]
        .into_iter()
        .map(|s| s.result.finish())
        .collect()
}

/// The engine-side batch for what serving a request changed.
pub fn events_for(served: &Served) -> Vec<ic_kvevents::KvEvent> {
    let mut events = Vec::new();
    let mut i = 0;
    while i < served.stored.len() {
        // A run of blocks each the parent of the next becomes one store.
        let (first, parent) = served.stored[i];
        let mut ids = vec![first];
        let mut j = i + 1;
        while j < served.stored.len() && served.stored[j].1 == Some(served.stored[j - 1].0) {
            ids.push(served.stored[j].0);
            j += 1;
        }
        let tokens = ids.iter().flat_map(|id| block_tokens(*id)).collect();
        events.push(gpu_store(ids, parent, tokens, ENGINE_BLOCK_TOKENS));
        i = j;
    }
    if !served.evicted.is_empty() {
        events.push(removal(served.evicted.clone(), Medium::Gpu));
    }
    events
}

/// The LookupRoute request for a prompt of `tokens`, with the block hashes
/// a gateway computes itself.
pub fn lookup_request(
    tenant: &str,
    model: &str,
    tokens: &[u32],
    observe_only: bool,
) -> pb::LookupRouteRequest {
    let hashes = ic_kvevents::Fingerprint::to_raw(ic_kvevents::chain_fingerprints(
        None,
        tokens,
        ENGINE_BLOCK_TOKENS as usize,
    ));
    pb::LookupRouteRequest {
        scope: Some(pb::IndexScope {
            tenant: tenant.to_owned(),
            model: model.to_owned(),
            hash_scheme: pb::HashScheme::Vllm as i32,
            adapter: String::new(),
        }),
        key: Some(pb::lookup_route_request::Key::BlockHashes(
            pb::BlockHashes { hashes },
        )),
        candidate_replicas: Vec::new(),
        observe_only,
        ..Default::default()
    }
}

/// Where one request of the routed replay went (`--placements`): to tell
/// apart runs whose tails differ, request by request.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Index-server replica (or picker) asked.
    pub replica: usize,
    /// Engine that served it.
    pub engine: usize,
    /// How the engine was chosen: `prefix` (a PREFIX_MATCH answer), `load`
    /// (the index's pick with no hint), `fallback` (no `best`), `picker`.
    pub how: &'static str,
    /// Leading blocks the engine held.
    pub hit_blocks: usize,
    /// Blocks of the prompt.
    pub prompt_blocks: usize,
    /// The most leading blocks any engine held (more than `hit_blocks`:
    /// routed away from a holder; equal: the history was evicted or new).
    pub best_blocks: usize,
    /// Simulated time to first token, ms.
    pub ttft_ms: f64,
}

/// Outcome of the routed replay.
#[derive(Debug)]
pub struct RoutedRun {
    /// Hit statistics.
    pub result: PolicyResult,
    /// LookupRoute round-trip latencies.
    pub latencies: Vec<Duration>,
    /// Requests routed by a PREFIX_MATCH answer.
    pub routed_by_hint: u64,
    /// The engines' true caches at the end.
    pub caches: Vec<PrefixCache>,
    /// Engine event batches published.
    pub batches_published: u64,
    /// Block events in them (each stored or removed block counts one).
    pub block_events_published: u64,
    /// Wall time of the replay.
    pub elapsed: Duration,
    /// Where each request went, in trace order.
    pub placements: Vec<Placement>,
}

/// The engine index behind a simulated engine's address `127.0.0.{i+1}:8000`.
pub fn engine_of(endpoint: &str) -> Option<usize> {
    let ip: std::net::SocketAddr = endpoint.parse().ok()?;
    match ip.ip() {
        std::net::IpAddr::V4(v4) => usize::from(v4.octets()[3]).checked_sub(1),
        std::net::IpAddr::V6(_) => None,
    }
}

/// Serves `request` on engine `target`: its cache, its queue, its events.
async fn serve_routed(
    run: &mut RoutedRun,
    caches: &mut [PrefixCache],
    queues: &mut EngineQueues,
    engines: &mut [FakeEngine],
    target: usize,
    request: &TraceRequest,
    (replica, how): (usize, &'static str),
) {
    let best_blocks = caches
        .iter()
        .map(|c| c.peek_hits(&request.hash_ids))
        .max()
        .unwrap_or(0);
    let served = caches[target].serve(&request.hash_ids);
    let ttft = queues.serve(
        target,
        request.timestamp_ms as f64,
        uncached_tokens(request, served.hit_blocks),
    );
    run.result.record_served(request, served.hit_blocks, ttft);
    run.placements.push(Placement {
        replica,
        engine: target,
        how,
        hit_blocks: served.hit_blocks,
        prompt_blocks: request.hash_ids.len(),
        best_blocks,
        ttft_ms: ttft,
    });
    let events = events_for(&served);
    if !events.is_empty() {
        run.block_events_published += (served.stored.len() + served.evicted.len()) as u64;
        engines[target].publish(&events).await;
        run.batches_published += 1;
    }
}

/// Where and how the routed replay runs.
#[derive(Clone, Debug)]
pub struct RoutedConfig {
    /// Blocks per engine cache.
    pub capacity: usize,
    /// gRPC URL of every index-server replica; request `i` asks replica
    /// `i mod n` (round-robin, as a Kubernetes Service spreads requests).
    pub grpc_urls: Vec<String>,
    /// Tenant of the engines.
    pub tenant: String,
    /// Model the engines serve.
    pub model: String,
    /// Time compression of arrival times.
    pub speed: f64,
    /// Name of the policy in the results.
    pub policy: String,
    /// Engine timing.
    pub timing: TimingModel,
    /// Route through the endpoint pickers at these URLs (one per replica,
    /// in turn) instead of LookupRoute; empty: LookupRoute.
    pub epp_urls: Vec<String>,
}

/// Replays the trace through the real index: engines publish over ZMQ, the
/// gateway routes with LookupRoute (or the endpoint picker), each request
/// asking the next index-server replica.
pub async fn run_routed(
    trace: &[TraceRequest],
    engines: &mut [FakeEngine],
    config: &RoutedConfig,
    mut progress: impl FnMut(usize),
) -> anyhow::Result<RoutedRun> {
    let RoutedConfig {
        capacity,
        grpc_urls,
        tenant,
        model,
        speed,
        policy,
        timing,
        epp_urls,
    } = config;
    let mut gateways = Vec::with_capacity(epp_urls.len());
    for url in epp_urls {
        gateways.push(crate::epp_client::Gateway::connect(url.clone()).await?);
    }
    let (capacity, speed) = (*capacity, *speed);
    let mut clients = Vec::with_capacity(grpc_urls.len());
    for url in grpc_urls {
        clients.push(IndexServiceClient::connect(url.clone()).await?);
    }
    if clients.is_empty() {
        anyhow::bail!("no index-server replica to route through");
    }
    let mut caches = vec![PrefixCache::new(capacity); engines.len()];
    let mut queues = EngineQueues::new(engines.len(), *timing);
    let mut rng = Rng::new(0x5eed);
    let mut run = RoutedRun {
        result: PolicyResult::new(policy, trace.len()),
        latencies: Vec::with_capacity(trace.len()),
        routed_by_hint: 0,
        caches: Vec::new(),
        batches_published: 0,
        block_events_published: 0,
        elapsed: Duration::ZERO,
        placements: Vec::with_capacity(trace.len()),
    };
    let start = tokio::time::Instant::now();
    // The replay's clock stopped while the first request's blocks reach
    // the index (below).
    let mut paused = Duration::ZERO;
    let first_ts = trace.first().map_or(0, |r| r.timestamp_ms);
    for (i, request) in trace.iter().enumerate() {
        let at = Duration::from_secs_f64(
            (request.timestamp_ms - first_ts) as f64 / 1000.0 / speed.max(1e-9),
        );
        tokio::time::sleep_until(start + paused + at).await;
        let tokens: Vec<u32> = request
            .hash_ids
            .iter()
            .flat_map(|id| block_tokens(*id))
            .collect();
        let asked = Instant::now();
        let (target, asked) = if !gateways.is_empty() {
            let n = gateways.len();
            let gateway = &mut gateways[i % n];
            // The picker always names an endpoint; it decides prefix vs load.
            let endpoint = gateway.pick(model, &tokens).await?;
            run.latencies.push(asked.elapsed());
            let target = engine_of(&endpoint)
                .filter(|e| *e < engines.len())
                .ok_or_else(|| {
                    anyhow::anyhow!("the picker named an unknown endpoint {endpoint}")
                })?;
            (target, (i % n, "picker"))
        } else {
            let n = clients.len();
            // The gateway names its endpoints, so a request with no prefix
            // hint still gets (and the index counts) a destination by load.
            let mut ask = lookup_request(tenant, model, &tokens, false);
            ask.candidate_replicas = (0..engines.len()).map(|e| format!("engine-{e}")).collect();
            let answer = clients[i % n].lookup_route(ask).await?.into_inner();
            run.latencies.push(asked.elapsed());
            let by_prefix = answer.outcome == pb::LookupOutcome::PrefixMatch as i32;
            let hinted = answer
                .best
                .and_then(|b| b.replica)
                .and_then(|r| r.replica_id.strip_prefix("engine-")?.parse::<usize>().ok())
                .filter(|e| *e < engines.len());
            let (target, how) = match hinted {
                Some(e) => {
                    run.routed_by_hint += u64::from(by_prefix);
                    (e, if by_prefix { "prefix" } else { "load" })
                }
                // As Envoy's least-request balancer: the less busy of two
                // engines drawn at random.
                None => (
                    queues.less_loaded_of_two(request.timestamp_ms as f64, &mut rng),
                    "fallback",
                ),
            };
            (target, (i % n, how))
        };
        serve_routed(
            &mut run,
            &mut caches,
            &mut queues,
            engines,
            target,
            request,
            asked,
        )
        .await;
        if i == 0 {
            // The trace's clock runs `speed` times faster than the events'
            // way to the index (1-4 ms): the next requests would otherwise
            // race the first one's blocks (a shared prompt then lands on
            // one engine or on several by chance, and prefix-only routing
            // collapses or not). In a fleet, requests 100 ms apart see
            // them: so does the replay.
            let waited = tokio::time::Instant::now();
            first_blocks_visible(&mut clients, tenant, model, &tokens).await?;
            paused = waited.elapsed();
        }
        progress(i + 1);
    }
    run.caches = caches;
    run.elapsed = start.elapsed();
    run.result = std::mem::take(&mut run.result).finish();
    Ok(run)
}

/// Waits until every replica names a replica holding the start of
/// `tokens` (a lookup that records no pick); an error after 10 s.
async fn first_blocks_visible(
    clients: &mut [IndexServiceClient<tonic::transport::Channel>],
    tenant: &str,
    model: &str,
    tokens: &[u32],
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    for client in clients.iter_mut() {
        loop {
            let answer = client
                .lookup_route(lookup_request(tenant, model, tokens, true))
                .await?
                .into_inner();
            // Held somewhere, whether or not the policy routes by it.
            if answer.candidates.iter().any(|c| c.matched_blocks > 0) {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!(
                    "the first request's blocks did not reach the index in 10 s \
                     (no replica holds them; last answer {answer:?})"
                );
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp_ms: 0,
            input_length: ids.len() as u64 * TRACE_BLOCK_TOKENS,
            hash_ids: ids.to_vec(),
        }
    }

    #[test]
    fn stores_group_into_chains_and_evictions_follow() {
        let served = Served {
            hit_blocks: 1,
            stored: vec![(2, Some(1)), (3, Some(2)), (9, Some(7))],
            evicted: vec![4],
        };
        let events = events_for(&served);
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[0],
            gpu_store(
                vec![2, 3],
                Some(1),
                [block_tokens(2), block_tokens(3)].concat(),
                16
            )
        );
        assert_eq!(events[2], removal(vec![4], Medium::Gpu));
    }

    #[test]
    fn the_oracle_bounds_every_baseline() {
        let trace: Vec<TraceRequest> = (0..200).map(|i| req(&[0, 1, 2, 100 + i % 7])).collect();
        let results = simulate_baselines(&trace, 4, 3, 7, TimingModel::default());
        let oracle = results
            .iter()
            .find(|r| r.policy.starts_with("oracle"))
            .unwrap();
        for r in &results {
            assert!(r.hit_ratio() <= oracle.hit_ratio() + 1e-9, "{r:?}");
            assert_eq!(r.requests, 200);
        }
        assert!(oracle.hit_ratio() > 0.7);
    }

    #[test]
    fn the_exact_ttft_reference_leaves_a_holder_only_when_its_queue_outweighs_a_cold_prefill() {
        let model = TimingModel {
            prefill_tokens_per_second: 512_000.0,
            overhead_ms: 0.0,
        };
        // One block costs 1 ms. Engine 0 holds the 10-block prompt.
        let mut sim = Simulated::new("t", 10, 2, 100, model);
        let prompt = req(&(0..10).collect::<Vec<_>>());
        sim.serve(0, &prompt);
        // Its queue is that prefill (10 ms, done at 10): at 5 ms, 5 ms queued
        // against twice engine 1's 10 ms cold prefill: stay.
        assert_eq!(sim.by_ttft(&prompt, 5.0, 100.0), 0);
        // 25 ms queued on it: 25 > 20, so the idle engine wins.
        sim.queues.serve(0, 5.0, 10 * TRACE_BLOCK_TOKENS);
        sim.queues.serve(0, 5.0, 10 * TRACE_BLOCK_TOKENS);
        assert_eq!(sim.by_ttft(&prompt, 5.0, 100.0), 1);
    }

    #[test]
    fn endpoints_map_back_to_engines() {
        assert_eq!(engine_of("127.0.0.1:8000"), Some(0));
        assert_eq!(engine_of("127.0.0.8:8000"), Some(7));
        assert_eq!(engine_of("pod-a"), None);
    }

    #[test]
    fn block_tokens_are_distinct_per_id() {
        assert_ne!(block_tokens(1), block_tokens(2));
        assert_eq!(block_tokens(1).len(), 16);
    }
}
