//! Scoring replicas by prefix match and load, with a load bound: the
//! routing core's choice of *where* once [`crate::route`] has said *what is
//! held where*.
//!
//! For each eligible replica `r` of the scope:
//!
//! ```text
//! prefix(r) = matched_blocks(r) / prompt_blocks × (1 at T1, t2_credit at T2)
//! load(r)   = requests(r) / max(1, max over replicas of requests)
//! score(r)  = prefix_weight × prefix(r) − load_weight × load(r) − kv_weight × kv_usage(r)
//! ```
//!
//! where `matched_blocks` is the longer of the index's match and the
//! replica's speculative holding (a recent pick), and `requests` is the
//! [`crate::load::LoadBoard`]'s estimate. With a load bound `c`, a replica is
//! eligible only while `requests(r) + 1 ≤ max(1, c × (Σ requests + 1) / n)`
//! (its share of the fleet's load after this request); replicas over it are
//! ranked after every replica within it. Equal scores go to the less loaded
//! replica, then to a hash of (request, replica): never to "the most
//! recently active", which is the one that just got the last request and
//! would take every tie of a shared prefix.
//!
//! With a [`TtftModel`] the score is instead the predicted time to first
//! token, negated: the replica's queued work plus the prefill of the tokens
//! it does not hold, that prefill weighed by the prefix weight,
//!
//! ```text
//! work(r)  = overhead_ms + unheld_tokens(r) / prefill_rate(r)
//! score(r) = −(queued_ms(r) + prefix_weight × work(r))
//! ```
//!
//! so a holder with a long queue loses to an idle replica when the idle
//! one would answer first (as Preble and llm-d's scorers weigh prefix
//! against load, but in the engine's own units). At a prefix weight of 1
//! that is the user's wait alone; above 1 it also charges a cold prefill
//! for the blocks it stores, which evict blocks later requests would have
//! hit. The server scores this way by default ([`ScoreWeights::by_ttft`],
//! prefix weight [`TTFT_PREFIX_WEIGHT`], [`TtftModel::DEFAULT`] until an
//! engine's own rate is observed). The load bound applies as with the
//! weights. A T2 block counts as held for `t2_credit` of its tokens.

use crate::load::ReplicaLoad;
use crate::types::{Match, ReplicaKey, Tier};

/// The weights of the score and the load bound.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreWeights {
    /// Weight of the prefix match (fraction of the prompt held).
    pub prefix: f64,
    /// Weight of the normalised request load.
    pub load: f64,
    /// Weight of the engine's KV-cache usage.
    pub kv_usage: f64,
    /// Credit of a block held only at T2, relative to T1.
    pub t2_credit: f64,
    /// Load bound factor (`None`: unbounded).
    pub load_bound: Option<f64>,
    /// Score by predicted time to first token instead of the weights.
    pub ttft: Option<TtftModel>,
}

/// What a request costs an engine, for predicting time to first token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TtftModel {
    /// Prompt tokens an engine prefills per millisecond.
    pub tokens_per_ms: f64,
    /// Fixed cost of every request, ms.
    pub overhead_ms: f64,
}

impl TtftModel {
    /// What the server assumes of an engine until its own rate is
    /// observed: 100,000 prompt tokens per second, no fixed cost. Fast on
    /// purpose: with no fixed cost every score scales alike with the rate,
    /// so a wrong rate only changes how fast the virtual queues drain. An
    /// engine slower than assumed drains them early, and the ranking leans
    /// towards the prefix, as the weights do; one faster than assumed keeps
    /// them long, and index replicas sharing their queues then pile work
    /// up (docs/benchmarks.md, "TTFT scoring by default"). No fixed cost,
    /// because a batching engine overlaps the fixed cost of the requests
    /// ahead, and this request's own is the same on every replica.
    pub const DEFAULT: TtftModel = TtftModel {
        tokens_per_ms: 100.0,
        overhead_ms: 0.0,
    };

    /// Milliseconds an engine spends on a request with `unheld_tokens` to
    /// prefill.
    pub fn work_ms(&self, unheld_tokens: f64) -> f64 {
        self.work_ms_at(unheld_tokens, None)
    }

    /// [`TtftModel::work_ms`] on an engine whose own prefill rate was
    /// observed (`Some`), which then replaces the configured one.
    pub fn work_ms_at(&self, unheld_tokens: f64, observed_tokens_per_ms: Option<f64>) -> f64 {
        let rate = observed_tokens_per_ms.unwrap_or(self.tokens_per_ms);
        self.overhead_ms + unheld_tokens.max(0.0) / rate.max(1e-9)
    }
}

impl Default for ScoreWeights {
    fn default() -> Self {
        Self {
            prefix: 2.0,
            load: 1.0,
            kv_usage: 0.5,
            t2_credit: 0.5,
            load_bound: Some(1.25),
            ttft: None,
        }
    }
}

/// The prefix weight of the TTFT score unless configured: a cold prefill
/// counts four times its own time. In an exact simulation of the local
/// fleet's engines, 4 stayed within 0.5 % of the load-bounded reference's
/// hit ratio with the rate assumed from 20x too slow to 4x too fast, where
/// 2 lost up to 5 % (docs/benchmarks.md, "TTFT scoring by default").
pub const TTFT_PREFIX_WEIGHT: f64 = 4.0;

impl ScoreWeights {
    /// The server's default: by predicted time to first token under
    /// `model`, with [`TTFT_PREFIX_WEIGHT`] and the default load bound.
    /// ([`ScoreWeights::default`] is the weights score, which the server
    /// runs with `--ttft-prefill-tokens-per-second=0`.)
    pub fn by_ttft(model: TtftModel) -> Self {
        Self {
            prefix: TTFT_PREFIX_WEIGHT,
            ttft: Some(model),
            ..Self::default()
        }
    }

    /// Prefix match only, unbounded: the longest match wins, as before load
    /// was scored (kept for comparisons).
    pub fn prefix_only() -> Self {
        Self {
            prefix: 1.0,
            load: 0.0,
            kv_usage: 0.0,
            t2_credit: 1.0,
            load_bound: None,
            ttft: None,
        }
    }
}

/// One replica, scored.
#[derive(Clone, Debug, PartialEq)]
pub struct Scored {
    /// Which replica.
    pub replica: ReplicaKey,
    /// Its serving address.
    pub address: String,
    /// Blocks matched from the start (real or speculative, the longer).
    pub matched_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Coldest tier of the match (T1 for a speculative one).
    pub tier: Tier,
    /// Whether the match counted is a speculative holding.
    pub speculative: bool,
    /// Its load.
    pub load: ReplicaLoad,
    /// The score.
    pub score: f64,
    /// Over the load bound: ranked after every replica within it.
    pub over_bound: bool,
}

impl Scored {
    /// Matched tokens.
    pub fn matched_tokens(&self) -> u64 {
        u64::from(self.matched_blocks) * u64::from(self.block_size)
    }
}

/// What to score: the scope's eligible replicas and what each holds.
#[derive(Clone, Copy, Debug)]
pub struct PickInput<'a> {
    /// Every replica that may be answered, with its address.
    pub replicas: &'a [(&'a ReplicaKey, &'a str)],
    /// The index's matches (replicas holding at least the first block),
    /// borrowed from the index or from owned candidates
    /// ([`crate::Candidate::as_match`]); their addresses are not read
    /// (`replicas` has them).
    pub matches: &'a [Match<'a>],
    /// Speculative holdings: replica id and blocks held from the start.
    pub speculative: &'a [(String, u32)],
    /// Blocks in the prompt (0 for a prefix-hash query: a match is whole).
    pub prompt_blocks: u32,
    /// Tokens per block of the scope.
    pub block_size: u32,
    /// Distinguishes requests for tie-breaking (e.g. the prompt's last
    /// block fingerprint).
    pub tie_seed: u64,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser: a cheap, well-spread hash.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// FNV-1a of a replica id: the tie-break's input, and how the replicas
/// are matched to the (few) holders without comparing every name.
pub fn id_hash(replica_id: &str) -> u64 {
    replica_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Positions in `items` sorted by the hash of their replica id, so each
/// replica finds its entries by binary search (on the stack for the few
/// holders of a usual prompt).
fn by_id_hash<T>(items: &[T], id: impl Fn(&T) -> &str) -> smallvec::SmallVec<[(u64, usize); 8]> {
    sorted_by_hash(items.iter().map(|item| id_hash(id(item))))
}

/// `(hash, position)` of each of `hashes`, sorted.
fn sorted_by_hash(hashes: impl Iterator<Item = u64>) -> smallvec::SmallVec<[(u64, usize); 8]> {
    let mut hashed: smallvec::SmallVec<[(u64, usize); 8]> = hashes.zip(0..).collect();
    hashed.sort_unstable();
    hashed
}

/// The prompt's holders, real and speculative, by [`id_hash`] of their
/// replica ids: hashed once per ranking, then read by every step of it
/// (which replicas are holders, and each replica's match).
#[derive(Debug, Default)]
pub(crate) struct HeldHashes {
    /// `(hash, position in PickInput::matches)`, sorted.
    matches: smallvec::SmallVec<[(u64, usize); 8]>,
    /// `(hash, position in PickInput::speculative)`, sorted.
    speculative: smallvec::SmallVec<[(u64, usize); 8]>,
}

impl HeldHashes {
    /// The holders of `input`.
    pub(crate) fn of(input: &PickInput<'_>) -> Self {
        Self {
            matches: by_id_hash(input.matches, |m| &m.replica.replica_id),
            speculative: by_id_hash(input.speculative, |(id, _)| id),
        }
    }

    /// The holders of `input`, `match_hashes` the [`id_hash`] of each of
    /// its matches' replica ids in their order (the registry keeps them).
    pub(crate) fn with_match_hashes(input: &PickInput<'_>, match_hashes: &[u64]) -> Self {
        debug_assert_eq!(match_hashes.len(), input.matches.len());
        Self {
            matches: sorted_by_hash(match_hashes.iter().copied()),
            speculative: by_id_hash(input.speculative, |(id, _)| id),
        }
    }

    /// Whether a holder's id hashes to `h` (a replica sharing a holder's
    /// hash reads as one: scoring a non-holder in full changes nothing).
    pub(crate) fn holds(&self, h: u64) -> bool {
        let found = |list: &[(u64, usize)]| list.binary_search_by_key(&h, |&(x, _)| x).is_ok();
        found(&self.matches) || found(&self.speculative)
    }

    /// How many holdings (a replica may hold really and speculatively).
    pub(crate) fn len(&self) -> usize {
        self.matches.len() + self.speculative.len()
    }

    /// Every holder's hash (a hash may come twice).
    pub(crate) fn hashes(&self) -> impl Iterator<Item = u64> + '_ {
        self.matches
            .iter()
            .chain(&self.speculative)
            .map(|&(h, _)| h)
    }
}

/// The entries of `hashed` whose hash is `h`.
fn with_hash(hashed: &[(u64, usize)], h: u64) -> impl Iterator<Item = usize> + '_ {
    let from = hashed.partition_point(|(x, _)| *x < h);
    hashed[from..]
        .iter()
        .take_while(move |(x, _)| *x == h)
        .map(|(_, i)| *i)
}

/// Replicas holding none of the prompt that [`rank`] returns, at most: the
/// best of them is a fallback, the rest only cost copies.
pub const OTHERS_RANKED: usize = 8;

/// Scores every replica of `input` under `weights`, best first, and returns
/// every replica that holds part of the prompt and the best
/// [`OTHERS_RANKED`] of the rest; `loads` holds each replica's load, in the
/// order of `input.replicas` (a missing one reads as idle).
pub fn rank(input: &PickInput<'_>, weights: &ScoreWeights, loads: &[ReplicaLoad]) -> Vec<Scored> {
    rank_in(
        input,
        weights,
        loads,
        &Fleet::of(input.replicas.len(), loads),
    )
}

/// Positions in `input.replicas` of the `n` best replicas by load alone,
/// best first: [`rank`]'s order for a prompt no replica holds
/// (`input.matches` and `input.speculative` are not read), from loads read
/// already, scoring nothing in full and copying no name.
pub fn best_by_load(
    input: &PickInput<'_>,
    weights: &ScoreWeights,
    loads: &[ReplicaLoad],
    n: usize,
) -> Vec<usize> {
    let fleet = Fleet::of(input.replicas.len(), loads);
    let idle = ReplicaLoad::default();
    let mut keys: Vec<(OtherKey, usize)> = input
        .replicas
        .iter()
        .enumerate()
        .map(|(i, (key, _))| {
            let load = loads.get(i).unwrap_or(&idle);
            (
                OtherKey::new(input, weights, &fleet, load, id_hash(&key.replica_id)),
                i,
            )
        })
        .collect();
    let better = |a: &(OtherKey, usize), b: &(OtherKey, usize)| {
        a.0.rank_cmp(&b.0)
            .then_with(|| input.replicas[a.1].0.cmp(input.replicas[b.1].0))
    };
    if keys.len() > n && n > 0 {
        keys.select_nth_unstable_by(n - 1, better);
    }
    keys.truncate(n);
    keys.sort_unstable_by(better);
    keys.into_iter().map(|(_, i)| i).collect()
}

/// The fleet-wide figures every score is relative to: the busiest
/// replica's requests and the fair share of the load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fleet {
    /// Requests of the busiest replica, at least 1.
    pub max_requests: f64,
    /// Requests over every replica.
    pub total_requests: f64,
    /// Replicas, at least 1.
    pub replicas: f64,
}

impl Fleet {
    /// The figures of `replicas` replicas whose loads are `loads` (a
    /// missing one reads as idle).
    pub fn of(replicas: usize, loads: &[ReplicaLoad]) -> Self {
        let load_of = |i: usize| loads.get(i).map_or(0.0, |l| l.requests);
        Self {
            max_requests: (0..replicas).map(load_of).fold(1.0, f64::max),
            total_requests: (0..replicas).map(load_of).sum(),
            replicas: replicas.max(1) as f64,
        }
    }

    /// The load bound, in requests (`None`: unbounded). Never below one
    /// request: with nothing measured, nobody is over.
    fn bound(&self, weights: &ScoreWeights) -> Option<f64> {
        weights
            .load_bound
            .map(|c| (c * (self.total_requests + 1.0) / self.replicas).max(1.0))
    }
}

/// Where [`rank`] places a replica holding none of the prompt among the
/// others (smaller is better; replicas with equal keys go by their
/// [`ReplicaKey`]): lets a caller pick the few best of a large scope
/// without scoring every replica in full. `id_hash` is [`id_hash`] of the
/// replica id.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OtherKey {
    over_bound: bool,
    score: f64,
    requests: f64,
    tie: u64,
}

impl OtherKey {
    /// The key of a non-holder with `load` in `fleet`, for `input`'s prompt.
    #[inline]
    pub fn new(
        input: &PickInput<'_>,
        weights: &ScoreWeights,
        fleet: &Fleet,
        load: &ReplicaLoad,
        id_hash: u64,
    ) -> Self {
        Self {
            over_bound: over_bound(fleet.bound(weights), load),
            score: score(input, weights, fleet, load, 0.0, 1.0),
            requests: requests_key(weights, load),
            tie: Self::tie_of(input, id_hash),
        }
    }

    /// A key no worse than that of any non-holder whose figures are each
    /// no better than `floor`'s (requests, own requests, KV usage and
    /// queued work at least as large, prefill rate at most as fast): being
    /// over the bound and the score are each monotone in every figure, so
    /// `k.load_cmp(&floor) == Less` proves `k` ranks before every such
    /// replica, whatever its tie-break.
    pub(crate) fn floor(
        input: &PickInput<'_>,
        weights: &ScoreWeights,
        fleet: &Fleet,
        floor: &ReplicaLoad,
    ) -> Self {
        Self {
            over_bound: over_bound(fleet.bound(weights), floor),
            score: score(input, weights, fleet, floor, 0.0, 1.0),
            requests: requests_key(weights, floor),
            tie: 0,
        }
    }

    /// The tie-break of the replica whose id hashes to `id_hash` for
    /// `input`'s prompt (larger ranks first): [`Self::new`]'s, computed
    /// without the replica's load.
    pub(crate) fn tie_of(input: &PickInput<'_>, id_hash: u64) -> u64 {
        mix(input.tie_seed ^ id_hash)
    }

    /// This key's tie-break ([`Self::tie_of`]).
    pub(crate) fn tie(&self) -> u64 {
        self.tie
    }

    /// [`rank`]'s order, up to the replica key.
    pub fn rank_cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.over_bound
            .cmp(&other.over_bound)
            .then(other.score.total_cmp(&self.score))
            .then(self.requests.total_cmp(&other.requests))
            .then(other.tie.cmp(&self.tie))
    }

    /// [`Self::rank_cmp`] without the per-request tie-break: the order of
    /// the replicas' loads alone: by the weights the same for every prompt;
    /// by TTFT the same for every prompt of one length (of any length when
    /// every replica prefills at one rate). A shortlist kept between
    /// requests keeps every replica tied with its last one.
    pub fn load_cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.over_bound
            .cmp(&other.over_bound)
            .then(other.score.total_cmp(&self.score))
            .then(self.requests.total_cmp(&other.requests))
    }
}

/// The request count that orders equal scores: by TTFT this server's own
/// ([`ReplicaLoad::own_requests`]). Why: by TTFT the load is in the score
/// (queued work), and the peers' part of the count is the same on every
/// index replica between two reports: each replica would send its tied
/// picks (idle engines, a prompt held only at its shared start) to the same
/// least-picked engine, and two long prefills through two replicas would
/// queue behind each other there (docs/scaling.md, "Alike answers"). With
/// one replica the two counts are the same.
fn requests_key(weights: &ScoreWeights, load: &ReplicaLoad) -> f64 {
    if weights.ttft.is_some() {
        load.own_requests
    } else {
        load.requests
    }
}

fn over_bound(bound: Option<f64>, load: &ReplicaLoad) -> bool {
    bound.is_some_and(|b| load.requests + 1.0 > b + 1e-9)
}

/// The score of a replica holding `held` of the prompt, its tier's credit
/// `credit`.
fn score(
    input: &PickInput<'_>,
    weights: &ScoreWeights,
    fleet: &Fleet,
    load: &ReplicaLoad,
    held: f64,
    credit: f64,
) -> f64 {
    match weights.ttft {
        Some(model) => {
            let prompt_tokens =
                f64::from(input.prompt_blocks.max(1)) * f64::from(input.block_size.max(1));
            // The prefix weight prices a prefill against a wait: 1 is the
            // user's time alone; above 1 also counts what the blocks it
            // stores evict, which later requests pay for again.
            -(load.queued_ms
                + weights.prefix
                    * model.work_ms_at(
                        prompt_tokens * (1.0 - held * credit),
                        load.prefill_tokens_per_ms,
                    ))
        }
        None => {
            weights.prefix * held * credit
                - weights.load * load.requests / fleet.max_requests
                - weights.kv_usage * load.kv_usage
        }
    }
}

/// [`rank`] of a part of the scope: `fleet` holds the whole scope's figures,
/// so each replica scores as it would among all of them. Given every
/// replica holding part of the prompt and the best [`OTHERS_RANKED`] others
/// by [`OtherKey`], it answers what [`rank`] of the whole scope answers.
pub fn rank_in(
    input: &PickInput<'_>,
    weights: &ScoreWeights,
    loads: &[ReplicaLoad],
    fleet: &Fleet,
) -> Vec<Scored> {
    rank_top(input, weights, loads, fleet, OTHERS_RANKED)
}

/// [`rank_in`] returning the best `others` replicas holding none of the
/// prompt (at least one) instead of [`OTHERS_RANKED`]: a caller that reads
/// only the first of them (the hint is compared with it, and load alone
/// sends a request there) copies no name for the rest.
pub fn rank_top(
    input: &PickInput<'_>,
    weights: &ScoreWeights,
    loads: &[ReplicaLoad],
    fleet: &Fleet,
    others: usize,
) -> Vec<Scored> {
    rank_hashed(input, weights, loads, fleet, others, usize::MAX, None, None)
}

/// [`rank_top`] given [`id_hash`] of each of `input.replicas` (in order)
/// when the caller has them already: a replica id is hashed once per
/// lookup, not once per use. Only the best `holders` replicas holding part
/// of the prompt (at least one) are returned: replicas within the load
/// bound rank before every one over it, so the best holder is among them
/// whatever the cut, and the rest are neither copied nor sorted. `held`:
/// [`HeldHashes::of`] `input`, when the caller has it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rank_hashed(
    input: &PickInput<'_>,
    weights: &ScoreWeights,
    loads: &[ReplicaLoad],
    fleet: &Fleet,
    others: usize,
    holders: usize,
    id_hashes: Option<&[u64]>,
    held: Option<&HeldHashes>,
) -> Vec<Scored> {
    // Both callers build the hashes alongside the replicas (one entry per
    // replica, in order): a length mismatch is a bug, not an input.
    if let Some(hs) = id_hashes {
        debug_assert_eq!(hs.len(), input.replicas.len());
    }
    let keep = others.max(1);
    let load_of = |i: usize| loads.get(i).copied().unwrap_or_default();
    let bound = fleet.bound(weights);
    let hashed_here;
    let held_hashes = match held {
        Some(h) => h,
        None => {
            hashed_here = HeldHashes::of(input);
            &hashed_here
        }
    };
    let (matches, speculative) = (&held_hashes.matches, &held_hashes.speculative);
    // Scored in place as small keys; names and addresses are copied once,
    // for the replicas returned (a scope may hold hundreds of replicas, and
    // every lookup scores them all). One list, sized once for every
    // replica and split in place: holders first, then the others (two
    // lists cost a second allocation, and joining them grew the first).
    let mut keys: Vec<RankKey> = Vec::with_capacity(input.replicas.len());
    keys.extend(input.replicas.iter().enumerate().map(|(i, (key, _))| {
        let load = load_of(i);
        let h = id_hashes.map_or_else(|| id_hash(&key.replica_id), |hs| hs[i]);
        // A pod's data-parallel ranks share its address: the best rank's
        // match is the pod's.
        let real = with_hash(matches, h)
            .map(|j| &input.matches[j])
            // A scope's holders and members are the same registry entries:
            // the same address is the same replica, names unread.
            .filter(|m| {
                std::ptr::eq(m.replica, *key)
                    || (m.replica.replica_id == key.replica_id && m.replica.tenant == key.tenant)
            })
            .max_by(|a, b| {
                a.matched_blocks
                    .cmp(&b.matched_blocks)
                    .then(b.tier.cmp(&a.tier))
            });
        let spec = with_hash(speculative, h)
            .map(|j| &input.speculative[j])
            .find(|(id, _)| *id == key.replica_id)
            .map_or(0, |(_, b)| *b);
        let (matched_blocks, tier, speculative) = match real {
            Some(m) if m.matched_blocks >= spec => (m.matched_blocks, m.tier, false),
            _ if spec > 0 => (spec, Tier::T1, true),
            _ => (0, Tier::T1, false),
        };
        let held = if input.prompt_blocks == 0 {
            f64::from(u8::from(matched_blocks > 0))
        } else {
            (f64::from(matched_blocks) / f64::from(input.prompt_blocks)).min(1.0)
        };
        let credit = if tier == Tier::T1 {
            1.0
        } else {
            weights.t2_credit
        };
        RankKey {
            index: i,
            over_bound: over_bound(bound, &load),
            score: score(input, weights, fleet, &load, held, credit),
            requests: requests_key(weights, &load),
            tie: mix(input.tie_seed ^ h),
            matched_blocks,
            tier,
            speculative,
        }
    }));
    let mut held = 0;
    for i in 0..keys.len() {
        if keys[i].matched_blocks > 0 {
            keys.swap(held, i);
            held += 1;
        }
    }
    let key_of = |k: &RankKey| input.replicas[k.index].0;
    let better = |a: &RankKey, b: &RankKey| {
        a.order()
            .rank_cmp(&b.order())
            .then_with(|| key_of(a).cmp(key_of(b)))
    };
    // Only the best few of the rest (and of the holders, when a caller
    // answers only the first few) are returned: select them in linear time
    // rather than sorting them all.
    let (order, others) = keys.split_at_mut(held);
    let kept_others = others.len().min(keep);
    if others.len() > keep {
        others.select_nth_unstable_by(keep - 1, better);
    }
    let holders = holders.max(1);
    let kept_holders = held.min(holders);
    if held > holders {
        order.select_nth_unstable_by(holders - 1, better);
    }
    // The kept others follow the kept holders.
    keys.truncate(held + kept_others);
    keys.drain(kept_holders..held);
    keys.sort_unstable_by(better);
    keys.into_iter()
        .map(|k| {
            let (replica, address) = input.replicas[k.index];
            Scored {
                replica: replica.clone(),
                address: address.to_owned(),
                matched_blocks: k.matched_blocks,
                block_size: input.block_size,
                tier: k.tier,
                speculative: k.speculative,
                load: load_of(k.index),
                score: k.score,
                over_bound: k.over_bound,
            }
        })
        .collect()
}

/// What [`rank`] sorts by, and what it computed on the way.
struct RankKey {
    index: usize,
    over_bound: bool,
    score: f64,
    requests: f64,
    tie: u64,
    matched_blocks: u32,
    tier: Tier,
    speculative: bool,
}

impl RankKey {
    /// The order, one definition for holders and the others alike.
    fn order(&self) -> OtherKey {
        OtherKey {
            over_bound: self.over_bound,
            score: self.score,
            requests: self.requests,
            tie: self.tie,
        }
    }
}

#[cfg(test)]
#[path = "pick_tests.rs"]
mod tests;
