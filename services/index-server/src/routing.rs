//! The server's load board and speculation table (each shared, with short
//! locks of their own), and the scoring flags. Every routing front end
//! (LookupRoute, the endpoint picker) decides through [`Routing::decide`]
//! and reports what it did with the answer through the methods here.

use ic_index::load::{EngineLoad, LoadBoard, LoadSettings, ReplicaLoad};
use ic_index::pick::{ScoreWeights, TtftModel};
use ic_index::route::{Ranked, RoutePolicy, RouteQuery, Scoring, ScoringSource, route_ranked};
use ic_index::speculative::{Speculation, SpeculationSettings};
use ic_index::{Deadline, Fingerprint, Index};

/// Scoring flags (server-wide; docs/routing.md has the formula).
#[derive(Clone, Debug, clap::Args)]
pub struct ScoringFlags {
    /// Weight of the prefix match (fraction of the prompt a replica holds;
    /// by TTFT, the weight of the prefill against the wait) [default: 4 by
    /// TTFT, 2 by the weights].
    #[arg(long, env = "IC_SCORE_PREFIX_WEIGHT")]
    pub score_prefix_weight: Option<f64>,
    /// Weight of the replica's request load (normalised to the busiest).
    #[arg(long, env = "IC_SCORE_LOAD_WEIGHT", default_value_t = 1.0)]
    pub score_load_weight: f64,
    /// Weight of the engine's KV-cache usage (0..1).
    #[arg(long, env = "IC_SCORE_KV_USAGE_WEIGHT", default_value_t = 0.5)]
    pub score_kv_usage_weight: f64,
    /// Credit of a block held only at tier 2, relative to tier 1.
    #[arg(long, env = "IC_SCORE_T2_CREDIT", default_value_t = 0.5)]
    pub score_t2_credit: f64,
    /// A replica above this multiple of its fair share of the load is passed
    /// over (0 disables the bound).
    #[arg(long, env = "IC_LOAD_BOUND", default_value_t = 1.25)]
    pub load_bound: f64,
    /// Half-life of a recommended pick in the load estimate, ms.
    #[arg(long, env = "IC_PICK_HALF_LIFE_MS", default_value_t = 10_000)]
    pub pick_half_life_ms: u32,
    /// A scope of over 64 replicas keeps its least loaded replicas between
    /// lookups (following picks exactly), rebuilt once the list is this
    /// old, ms (0: rank every replica on every lookup).
    #[arg(long, env = "IC_SHORTLIST_REFRESH_MS", default_value_t = 20)]
    pub shortlist_refresh_ms: u32,
    /// ... or once this many load changes other than picks (engine
    /// reports, requests started or ended, queued work, peers' figures)
    /// happened since (0: rank every replica on every lookup).
    #[arg(long, env = "IC_SHORTLIST_REFRESH_CHANGES", default_value_t = 16)]
    pub shortlist_refresh_changes: u32,
    /// How long a pick counts as a speculative holder of the prompt's
    /// blocks until the engine's events arrive, ms (0 disables).
    #[arg(long, env = "IC_SPECULATIVE_TTL_MS", default_value_t = 2_000)]
    pub speculative_ttl_ms: u32,
    /// Most (block, replica) speculative entries kept.
    #[arg(long, env = "IC_SPECULATIVE_MAX_ENTRIES", default_value_t = 1_000_000)]
    pub speculative_max_entries: u32,
    /// Score by predicted time to first token: the engines' prefill rate
    /// until the picker measures an engine's own, prompt tokens per second
    /// (0: score by the weights above). A wrong rate only changes how fast
    /// the predicted queues drain, which matters with several index
    /// replicas: set the engines' rate there (docs/benchmarks.md, "TTFT
    /// scoring by default").
    #[arg(
        long,
        env = "IC_TTFT_PREFILL_TOKENS_PER_SECOND",
        default_value_t = 100_000.0
    )]
    pub ttft_prefill_tokens_per_second: f64,
    /// The fixed cost of every request in the TTFT prediction, ms (0: a
    /// batching engine overlaps it).
    #[arg(long, env = "IC_TTFT_REQUEST_OVERHEAD_MS", default_value_t = 0.0)]
    pub ttft_request_overhead_ms: f64,
}

impl Default for ScoringFlags {
    fn default() -> Self {
        let w = ScoreWeights::by_ttft(TtftModel::DEFAULT);
        let l = LoadSettings::default();
        let s = SpeculationSettings::default();
        Self {
            score_prefix_weight: None,
            score_load_weight: w.load,
            score_kv_usage_weight: w.kv_usage,
            score_t2_credit: w.t2_credit,
            load_bound: w.load_bound.unwrap_or(0.0),
            pick_half_life_ms: u32::try_from(l.pick_half_life_ms).unwrap_or(u32::MAX),
            shortlist_refresh_ms: u32::try_from(l.shortlist_refresh_ms).unwrap_or(u32::MAX),
            shortlist_refresh_changes: u32::try_from(l.shortlist_refresh_changes)
                .unwrap_or(u32::MAX),
            speculative_ttl_ms: u32::try_from(s.ttl_ms).unwrap_or(u32::MAX),
            speculative_max_entries: u32::try_from(s.max_entries).unwrap_or(u32::MAX),
            ttft_prefill_tokens_per_second: w.ttft.map_or(0.0, |m| m.tokens_per_ms * 1_000.0),
            ttft_request_overhead_ms: w.ttft.map_or(0.0, |m| m.overhead_ms),
        }
    }
}

impl ScoringFlags {
    /// Checks the values; the error names the flag.
    pub fn weights(&self) -> anyhow::Result<ScoreWeights> {
        let by_ttft = self.ttft_prefill_tokens_per_second > 0.0;
        let prefix = self.score_prefix_weight.unwrap_or(if by_ttft {
            ic_index::pick::TTFT_PREFIX_WEIGHT
        } else {
            ScoreWeights::default().prefix
        });
        for (flag, v) in [
            ("--score-prefix-weight", prefix),
            ("--score-load-weight", self.score_load_weight),
            ("--score-kv-usage-weight", self.score_kv_usage_weight),
            ("--load-bound", self.load_bound),
            (
                "--ttft-prefill-tokens-per-second",
                self.ttft_prefill_tokens_per_second,
            ),
            ("--ttft-request-overhead-ms", self.ttft_request_overhead_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                anyhow::bail!("{flag} must be a non-negative number (got {v})");
            }
        }
        if !(0.0..=1.0).contains(&self.score_t2_credit) {
            anyhow::bail!(
                "--score-t2-credit must be in 0..=1 (got {})",
                self.score_t2_credit
            );
        }
        if self.load_bound > 0.0 && self.load_bound < 1.0 {
            anyhow::bail!(
                "--load-bound must be 0 (off) or at least 1 (got {}): below 1 no replica is ever within it",
                self.load_bound
            );
        }
        Ok(ScoreWeights {
            prefix,
            load: self.score_load_weight,
            kv_usage: self.score_kv_usage_weight,
            t2_credit: self.score_t2_credit,
            load_bound: (self.load_bound > 0.0).then_some(self.load_bound),
            ttft: by_ttft.then(|| TtftModel {
                tokens_per_ms: self.ttft_prefill_tokens_per_second / 1_000.0,
                overhead_ms: self.ttft_request_overhead_ms,
            }),
        })
    }
}

/// Load and speculation shared by the routing front ends.
#[derive(Debug)]
pub struct Routing {
    weights: ScoreWeights,
    load: LoadBoard,
    /// Sharded: a pick locks one shard for the run it records, a lookup
    /// whose prompt no run can concern takes no lock at all.
    speculation: Speculation,
}

impl Default for Routing {
    fn default() -> Self {
        Self::new(
            ScoreWeights::default(),
            LoadSettings::default(),
            SpeculationSettings::default(),
        )
    }
}

impl ScoringSource for Routing {
    fn speculative(
        &self,
        scope_tag: u64,
        blocks: &[Fingerprint],
        holders: &[(&str, u32)],
        now_ms: i64,
    ) -> Vec<(String, u32)> {
        self.speculation
            .holdings(scope_tag, blocks, holders, now_ms)
    }

    fn loads(&self, replica_ids: &[&str], now_ms: i64) -> Vec<ReplicaLoad> {
        self.load.loads(replica_ids, now_ms)
    }

    fn board(&self) -> Option<&LoadBoard> {
        Some(&self.load)
    }
}

impl Routing {
    /// A routing state with these weights and bounds.
    pub fn new(
        weights: ScoreWeights,
        load: LoadSettings,
        speculation: SpeculationSettings,
    ) -> Self {
        Self {
            weights,
            load: LoadBoard::new(load),
            speculation: Speculation::new(speculation),
        }
    }

    /// Large scopes' shortlists rebuilt so far.
    pub fn shortlist_refreshes(&self) -> u64 {
        self.load.shortlist_refreshes()
    }

    /// From the flags.
    pub fn from_flags(flags: &ScoringFlags) -> anyhow::Result<Self> {
        Ok(Self::new(
            flags.weights()?,
            LoadSettings {
                pick_half_life_ms: i64::from(flags.pick_half_life_ms.max(1)),
                shortlist_refresh_ms: i64::from(flags.shortlist_refresh_ms),
                shortlist_refresh_changes: u64::from(flags.shortlist_refresh_changes),
                ..LoadSettings::default()
            },
            SpeculationSettings {
                ttl_ms: i64::from(flags.speculative_ttl_ms),
                max_entries: flags.speculative_max_entries as usize,
            },
        ))
    }

    /// Routes and scores `query` (the locks are taken after the index walk);
    /// `pool` restricts the scoring to an endpoint picker's endpoints;
    /// `scope_tag` is [`ic_index::route::scope_tag`] of the query's scope
    /// (the caller's, hashed once per request); `holders` is how many
    /// replicas holding part of the prompt to answer, at most
    /// ([`Scoring::holders`]).
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &self,
        index: &Index,
        query: &RouteQuery<'_>,
        policy: &RoutePolicy,
        default_block_size: u32,
        now_ms: i64,
        deadline: &dyn Deadline,
        pool: Option<&[(ic_index::ReplicaKey, String)]>,
        scope_tag: u64,
        holders: usize,
    ) -> Ranked {
        // The namespace's CachePolicy over the server's flags.
        let weights = policy.scoring.over(&self.weights);
        route_ranked(
            index,
            query,
            policy,
            default_block_size,
            now_ms,
            deadline,
            Scoring {
                weights: &weights,
                source: self,
                scope_tag,
                pool,
                // Both front ends read the first of the others only (the
                // picker's fallbacks are ranked by load apart).
                others: 1,
                holders,
            },
        )
    }

    /// The request of `ranked` goes to `replica_id`: its load counts the
    /// pick and it speculatively holds `unheld` (the prompt's blocks it
    /// does not hold yet, [`Ranked::unheld_by`]) until its events arrive.
    pub fn picked(
        &self,
        scope_tag: u64,
        replica_id: &str,
        unheld: &[Fingerprint],
        block_size: u32,
        now_ms: i64,
    ) {
        // Speculation first: a replica's board entry then outlives any run
        // of it an upkeep's sweep could miss (a pick racing the upkeep), so
        // the next upkeep sees it leave the board and sweeps again.
        if !unheld.is_empty() {
            self.speculation
                .record(scope_tag, replica_id, unheld, now_ms);
        }
        // One visit of the replica's load entry, not three; of the scope's
        // shortlist only, when the replica is in no other scope.
        let tokens = unheld.len() as f64 * f64::from(block_size);
        self.load
            .picked_in_scope(scope_tag, replica_id, now_ms, |rate| {
                self.weights
                    .ttft
                    .map_or(0.0, |model| model.work_ms_at(tokens, rate))
            });
    }

    /// The engine behind `replica_id` stored `blocks` blocks of
    /// `block_size` tokens (a prefill, whoever routed it): counted as work
    /// queued on it when scoring by TTFT.
    pub fn observed_stores(&self, replica_id: &str, blocks: usize, block_size: u32, now_ms: i64) {
        if let Some(model) = self.weights.ttft {
            let tokens = blocks as f64 * f64::from(block_size);
            let work = model.work_ms_at(tokens, self.load.prefill_rate(replica_id));
            self.load.observed_work(replica_id, work, now_ms);
        }
    }

    /// A request the endpoint picker sent to `replica_id` started.
    pub fn started(&self, replica_id: &str) {
        self.load.started(replica_id);
    }

    /// A request the endpoint picker sent to `replica_id` ended.
    pub fn finished(&self, replica_id: &str) {
        self.load.finished(replica_id);
    }

    /// The endpoint picker measured the prefill rate of the engine behind
    /// `replica_id` from its responses, tokens per second: it replaces the
    /// configured rate in that engine's TTFT estimates.
    pub fn observed_prefill_rate(&self, replica_id: &str, tokens_per_second: f64) {
        self.load
            .observed_prefill_rate(replica_id, tokens_per_second / 1000.0);
    }

    /// The engine behind `replica_id` reported its load.
    pub fn report_engine(&self, replica_id: &str, load: EngineLoad, now_ms: i64) {
        self.load.report_engine(replica_id, load, now_ms);
    }

    /// The engine's events now show `replica_id` holding `blocks`.
    pub fn confirm(&self, scope_tag: u64, replica_id: &str, blocks: &[Fingerprint]) {
        self.speculation.confirm(scope_tag, replica_id, blocks);
    }

    /// Ends every speculation naming `replica_id` (its cache was cleared).
    pub fn forget_speculation(&self, replica_id: &str) {
        self.speculation.retain(|id| id != replica_id);
    }

    /// Drops the state of replicas gone from the index and expired
    /// speculation. The speculation table is read through only when a
    /// replica left the board: every replica it names was picked, so on
    /// the board, and a walk of a full table (a million entries) holds
    /// each shard's lock for a millisecond or more.
    pub fn retain(&self, present: &std::collections::HashSet<String>, now_ms: i64) {
        let left = self.load.retain(|id| present.contains(id));
        self.speculation.expire(now_ms);
        if left > 0 {
            self.speculation.retain(|id| present.contains(id));
        }
    }

    /// Ranks `pool` by load alone (no prompt to match): where a request
    /// with nothing to route on goes, under the namespace's `scoring` over
    /// the server's weights (as [`Self::decide`]).
    pub fn rank_by_load(
        &self,
        pool: &[(ic_index::ReplicaKey, String)],
        now_ms: i64,
        scoring: &ic_index::route::ScoringOverrides,
    ) -> Vec<ic_index::pick::Scored> {
        let loads = self.pool_loads(pool, now_ms);
        self.rank_loads(pool, &loads, now_ms, scoring)
    }

    /// The load of each endpoint of `pool`, in order.
    pub fn pool_loads(
        &self,
        pool: &[(ic_index::ReplicaKey, String)],
        now_ms: i64,
    ) -> Vec<ReplicaLoad> {
        let ids: Vec<&str> = pool.iter().map(|(k, _)| k.replica_id.as_str()).collect();
        self.loads(&ids, now_ms)
    }

    /// [`Self::rank_by_load`] with the pool's loads read already.
    pub fn rank_loads(
        &self,
        pool: &[(ic_index::ReplicaKey, String)],
        loads: &[ReplicaLoad],
        now_ms: i64,
        scoring: &ic_index::route::ScoringOverrides,
    ) -> Vec<ic_index::pick::Scored> {
        let replicas: Vec<(&ic_index::ReplicaKey, &str)> =
            pool.iter().map(|(k, a)| (k, a.as_str())).collect();
        ic_index::pick::rank(
            &by_load_input(&replicas, now_ms),
            &scoring.over(&self.weights),
            loads,
        )
    }

    /// Positions in `pool` of the `n` first of [`Self::rank_by_load`]'s
    /// order, from the pool's loads read already (nothing scored in full,
    /// no name copied).
    pub fn best_by_load(
        &self,
        pool: &[(ic_index::ReplicaKey, String)],
        loads: &[ReplicaLoad],
        now_ms: i64,
        scoring: &ic_index::route::ScoringOverrides,
        n: usize,
    ) -> Vec<usize> {
        let replicas: Vec<(&ic_index::ReplicaKey, &str)> =
            pool.iter().map(|(k, a)| (k, a.as_str())).collect();
        ic_index::pick::best_by_load(
            &by_load_input(&replicas, now_ms),
            &scoring.over(&self.weights),
            loads,
            n,
        )
    }

    /// Whether replicas are scored by predicted time to first token (the
    /// load and KV-usage weights then unused).
    pub fn by_ttft(&self) -> bool {
        self.weights.ttft.is_some()
    }

    /// The fewest requests any endpoint of `pool` is busy with (`None`: an
    /// empty pool): what shedding compares with its threshold.
    pub fn least_requests(
        &self,
        pool: &[(ic_index::ReplicaKey, String)],
        now_ms: i64,
    ) -> Option<f64> {
        let ids: Vec<&str> = pool.iter().map(|(k, _)| k.replica_id.as_str()).collect();
        self.loads(&ids, now_ms)
            .iter()
            .map(|l| l.requests)
            .min_by(f64::total_cmp)
    }

    /// The load board: the peer replicas' exchange reads this server's
    /// own picks from it and adds theirs (crate::peers).
    pub fn load_board(&self) -> &LoadBoard {
        &self.load
    }

    /// Speculative entries held and entries dropped for space.
    pub fn speculation_stats(&self) -> (usize, u64) {
        (self.speculation.len(), self.speculation.dropped_for_space())
    }
}

/// A prompt-less ranking of `replicas`, its ties broken by the time.
fn by_load_input<'a>(
    replicas: &'a [(&'a ic_index::ReplicaKey, &'a str)],
    now_ms: i64,
) -> ic_index::pick::PickInput<'a> {
    ic_index::pick::PickInput {
        replicas,
        matches: &[],
        speculative: &[],
        prompt_blocks: 0,
        block_size: 0,
        tie_seed: u64::try_from(now_ms).unwrap_or_default(),
    }
}
