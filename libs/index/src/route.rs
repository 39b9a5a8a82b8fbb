//! The routing core: one query, one namespace policy and the current time
//! in, one decision out. Protocol-free, so LookupRoute, the functional
//! probe and every future front end (a gateway endpoint picker, a Kafka-fed
//! replica) decide the same way; each adapter only validates its input,
//! calls [`route`] and converts the answer.
//!
//! A decision is reached in this order: the key becomes block fingerprints
//! (token ids are chained with the scope's block size); replicas silent for
//! longer than the policy's staleness bound are left out; the index scores
//! the rest (within the deadline); tier-2-only matches are dropped when the
//! policy excludes them; the best match must reach the minimum prefix.
//! [`route_ranked`] then orders every eligible replica by prefix and load
//! ([`crate::pick`]), counting recent picks as speculative holders.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ic_kvevents::{PromptExtras, keyed_chain_fingerprints_from};
use smallvec::SmallVec;

use crate::Index;
use crate::index::ReplicaMeta;
use crate::load::{LoadBoard, ReplicaLoad};
use crate::lookup::MatchOrder;
use crate::pick::{ScoreWeights, Scored};
use crate::speculative::Speculation;

mod members;
mod rank;
mod shortlist;
use crate::types::{
    Deadline, Fingerprint, LookupView, Match, ReplicaKey, Scope, ScopeHandle, Tier,
};
use members::InScope;
pub use members::ScopeMembers;
pub(crate) use shortlist::Shortlist;
#[cfg(test)]
pub(crate) use shortlist::TIED_ANSWERS;

/// What to route on.
#[derive(Clone, Copy, Debug)]
pub enum RouteKey<'a> {
    /// The fingerprint of a prompt's last full block: the replicas holding
    /// it hold its whole prefix.
    PrefixHash(Fingerprint),
    /// A prompt's block fingerprints, in order.
    Blocks(&'a [Fingerprint]),
    /// A prompt's token ids (fingerprinted here with the scope's block size).
    Tokens(&'a [u32]),
}

/// One routing question.
#[derive(Clone, Copy, Debug)]
pub struct RouteQuery<'a> {
    /// Whose index to look in.
    pub scope: &'a Scope,
    /// What to look up.
    pub key: RouteKey<'a>,
    /// Only these replica ids may be answered (`None`: any).
    pub candidates: Option<&'a HashSet<String>>,
    /// What besides the tokens the engine hashes (multimodal items, cache
    /// salt, per-block keys); used when the key is token ids.
    pub extras: Option<&'a PromptExtras>,
}

impl RouteQuery<'_> {
    /// The scope the index keeps the replicas in. A LoRA adapter is not a
    /// replica scope of its own (a replica serves its base model and every
    /// adapter it loads): it is a fingerprint domain inside the base
    /// model's scope, so the lookup runs in the base scope.
    pub fn replica_scope(&self) -> Cow<'_, Scope> {
        if self.scope.adapter.is_empty() {
            Cow::Borrowed(self.scope)
        } else {
            Cow::Owned(Scope {
                adapter: String::new(),
                ..self.scope.clone()
            })
        }
    }

    /// [`Self::blocks`] without a deadline, for tests.
    #[cfg(test)]
    pub(crate) fn blocks_for_test(&self, block_size: u32) -> Vec<Fingerprint> {
        struct Never;
        impl Deadline for Never {
            fn expired(&self) -> bool {
                false
            }
        }
        self.blocks(block_size, &Never)
            .map(Cow::into_owned)
            .unwrap_or_default()
    }

    /// Fingerprints of the key's blocks: token ids are chained with
    /// `block_size` in the domain of the scope's adapter and the extras.
    /// A long prompt is fingerprinted a piece at a time, and stops (a
    /// prefix only) once `deadline` expires: the budget bounds the work,
    /// not just the answer.
    fn blocks(&self, block_size: u32, deadline: &dyn Deadline) -> Option<Cow<'_, [Fingerprint]>> {
        match self.key {
            RouteKey::PrefixHash(_) => None,
            RouteKey::Blocks(b) => Some(Cow::Borrowed(b)),
            RouteKey::Tokens(t) => {
                let none = PromptExtras::default();
                let extras = self.extras.unwrap_or(&none);
                let with_adapter;
                let extras =
                    if self.scope.adapter.is_empty() || extras.adapter == self.scope.adapter {
                        extras
                    } else {
                        with_adapter = PromptExtras {
                            adapter: self.scope.adapter.clone(),
                            ..extras.clone()
                        };
                        &with_adapter
                    };
                let bs = block_size as usize;
                let mut fps = Vec::with_capacity(t.len() / bs.max(1));
                if bs > 0 {
                    for piece in t.chunks(bs * FINGERPRINT_PIECE_BLOCKS) {
                        if deadline.expired() {
                            break;
                        }
                        let prev = fps.last().copied();
                        fps.extend(keyed_chain_fingerprints_from(
                            prev,
                            fps.len(),
                            piece,
                            bs,
                            extras,
                        ));
                    }
                }
                Some(Cow::Owned(fps))
            }
        }
    }
}

/// Blocks fingerprinted between two looks at a lookup's deadline (about
/// 50 µs of hashing at 16-token blocks).
const FINGERPRINT_PIECE_BLOCKS: usize = 256;

/// A namespace's own scoring (CachePolicy); each `None` keeps the
/// server's flag.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScoringOverrides {
    /// Weight of the prefix match.
    pub prefix: Option<f64>,
    /// Weight of the request load.
    pub load: Option<f64>,
    /// Weight of the engine's KV usage.
    pub kv_usage: Option<f64>,
    /// The load bound (`Some(None)`: unbounded).
    pub load_bound: Option<Option<f64>>,
}

impl ScoringOverrides {
    /// `base` (the server's weights) with these overrides.
    pub fn over(&self, base: &ScoreWeights) -> ScoreWeights {
        ScoreWeights {
            prefix: self.prefix.unwrap_or(base.prefix),
            load: self.load.unwrap_or(base.load),
            kv_usage: self.kv_usage.unwrap_or(base.kv_usage),
            load_bound: self.load_bound.unwrap_or(base.load_bound),
            ..*base
        }
    }
}

/// A namespace's routing policy (what a CachePolicy says).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoutePolicy {
    /// Budget of one lookup.
    pub lookup_timeout: Duration,
    /// Matches shorter than this many tokens are not worth routing on.
    pub minimum_prefix_tokens: u64,
    /// Replicas silent for longer are left out.
    pub replica_stale_after: Duration,
    /// Whether a prefix held only at T2 may be returned.
    pub allow_tier2_matches: bool,
    /// Scoring weights and load bound over the server's.
    pub scoring: ScoringOverrides,
}

impl Default for RoutePolicy {
    fn default() -> Self {
        Self {
            lookup_timeout: Duration::from_millis(20),
            minimum_prefix_tokens: 0,
            replica_stale_after: Duration::from_secs(120),
            allow_tier2_matches: true,
            scoring: ScoringOverrides::default(),
        }
    }
}

/// Why no replica was recommended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoHintReason {
    /// Nothing was ever reported for the scope.
    UnknownModel,
    /// The prompt has no full block.
    PromptTooShort,
    /// No eligible replica holds the first block (or only at an excluded tier).
    NoEntry,
    /// The best match is shorter than the policy's minimum.
    BelowMinimumPrefix,
    /// The deadline passed before the lookup finished.
    LookupTimeout,
    /// Every replica holding the prefix is over its load bound (or scored
    /// below an idle one): route by load.
    LoadBound,
}

/// A decision, with the replicas' names borrowed from the index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteOutcome<'a> {
    /// Replicas holding a prefix worth routing on, best first.
    Route(Vec<Match<'a>>),
    /// No recommendation, and why.
    NoHint {
        /// The reason.
        reason: NoHintReason,
        /// A sentence for humans.
        detail: String,
    },
}

/// What [`route`] decided and the facts it used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteDecision<'a> {
    /// Tokens per block in the scope (learned from events, else the default).
    pub block_size: u32,
    /// Full blocks in the prompt (0 for a prefix-hash query).
    pub prompt_blocks: u32,
    /// The decision.
    pub outcome: RouteOutcome<'a>,
}

fn no_hint(reason: NoHintReason, detail: String) -> RouteOutcome<'static> {
    RouteOutcome::NoHint { reason, detail }
}

/// Decides `query` under `policy` at `now_ms` (Unix ms, for staleness),
/// giving up when `deadline` expires, and hands the decision to `answer`
/// while the index lends the replicas' names (the registry stays
/// read-locked meanwhile: `answer` should only convert). `default_block_size`
/// fingerprints token ids in a scope that has not reported one yet.
pub fn route<R>(
    index: &Index,
    query: &RouteQuery<'_>,
    policy: &RoutePolicy,
    default_block_size: u32,
    now_ms: i64,
    deadline: &dyn Deadline,
    answer: impl FnOnce(RouteDecision<'_>) -> R,
) -> R {
    let replica_scope = query.replica_scope();
    let resolved = InScope::resolve(index, &replica_scope);
    let block_size = InScope::block_size_or(resolved.as_ref(), default_block_size);
    route_in(
        index,
        query,
        &replica_scope,
        resolved.as_ref().map(|s| s.handle),
        block_size,
        policy,
        now_ms,
        deadline,
        MatchOrder::Best,
        |_, d| answer(d),
    )
}

/// [`route`] in `scope` (the query's replica scope, resolved to `handle`:
/// `None` when the index never heard of it) with its block size looked up
/// already. The matches come in `order` (the ranking orders them itself).
#[allow(clippy::too_many_arguments)]
fn route_in<R>(
    index: &Index,
    query: &RouteQuery<'_>,
    scope: &Scope,
    handle: Option<ScopeHandle>,
    block_size: u32,
    policy: &RoutePolicy,
    now_ms: i64,
    deadline: &dyn Deadline,
    order: MatchOrder,
    answer: impl for<'r> FnOnce(&'r [&'r Arc<ReplicaMeta>], RouteDecision<'r>) -> R,
) -> R {
    let stale_ms = i64::try_from(policy.replica_stale_after.as_millis()).unwrap_or(i64::MAX);
    let fresh_since = Some(now_ms.saturating_sub(stale_ms));
    let blocks = query.blocks(block_size, deadline);
    let prompt_blocks = blocks
        .as_ref()
        .map_or(0, |b| u32::try_from(b.len()).unwrap_or(u32::MAX));
    let decide = |metas: &[&Arc<ReplicaMeta>], view: LookupView<'_>| {
        let outcome = match view {
            LookupView::UnknownScope => no_hint(
                NoHintReason::UnknownModel,
                format!(
                    "no events seen for tenant {:?} model {:?} ({})",
                    scope.tenant,
                    scope.model,
                    scope.hash_scheme.as_str()
                ),
            ),
            LookupView::TimedOut => no_hint(
                NoHintReason::LookupTimeout,
                format!("lookup took longer than {:?}", policy.lookup_timeout),
            ),
            LookupView::NoEntry if prompt_blocks == 0 && blocks.is_some() => no_hint(
                NoHintReason::PromptTooShort,
                format!("the prompt has no full block of {block_size} tokens"),
            ),
            LookupView::NoEntry => no_hint(
                NoHintReason::NoEntry,
                "no replica holds the first block".into(),
            ),
            LookupView::Matches(all) => {
                let allowed: Vec<Match<'_>> = all
                    .iter()
                    .filter(|m| policy.allow_tier2_matches || m.tier == Tier::T1)
                    .copied()
                    .collect();
                // The longest match (the first, when best first).
                let best = match order {
                    MatchOrder::Best => allowed.first(),
                    MatchOrder::Walk => allowed.iter().max_by_key(|m| m.matched_blocks),
                };
                match best {
                    None => no_hint(
                        NoHintReason::NoEntry,
                        "only tier-2 matches, which this namespace's policy excludes".into(),
                    ),
                    Some(best) if best.matched_tokens() < policy.minimum_prefix_tokens => no_hint(
                        NoHintReason::BelowMinimumPrefix,
                        format!(
                            "best match is {} tokens, below the minimum of {}",
                            best.matched_tokens(),
                            policy.minimum_prefix_tokens
                        ),
                    ),
                    Some(_) => RouteOutcome::Route(allowed),
                }
            }
        };
        answer(
            metas,
            RouteDecision {
                block_size,
                prompt_blocks,
                outcome,
            },
        )
    };
    if deadline.expired() {
        // Fingerprinting a long prompt already spent the budget.
        return decide(&[], LookupView::TimedOut);
    }
    match &blocks {
        None => {
            let RouteKey::PrefixHash(fp) = query.key else {
                return decide(&[], LookupView::NoEntry);
            };
            index.lookup_prefix_hash_in(scope, fp, query.candidates, fresh_since, decide)
        }
        Some(fps) => match handle {
            Some(handle) => index.lookup_resolved_in(
                handle,
                fps,
                query.candidates,
                fresh_since,
                deadline,
                order,
                decide,
            ),
            None => decide(&[], LookupView::UnknownScope),
        },
    }
}

/// The load-aware part of a decision: where the scoring sends the request.
#[derive(Clone, Debug, PartialEq)]
pub struct Ranked {
    /// Tokens per block in the scope.
    pub block_size: u32,
    /// Full blocks in the prompt (0 for a prefix-hash query).
    pub prompt_blocks: u32,
    /// The best [`Scoring::holders`] eligible replicas holding part of the
    /// prompt and the best [`Scoring::others`] others, best first (empty when the
    /// routing core had nothing to score: unknown scope, short prompt,
    /// timeout, minimum).
    pub ranked: Vec<Scored>,
    /// Index in `ranked` of the hint: the best-ranked replica that holds
    /// part of the prompt (see [`route_ranked`]).
    pub hint: Option<usize>,
    /// Set when there is no routing hint, with why; `ranked` may still say
    /// where load alone would send the request.
    pub no_hint: Option<(NoHintReason, String)>,
    /// Index in `ranked` of the replica load alone chooses when there is no
    /// hint and the caller named its candidates (a gateway that sends every
    /// request to one of them): answered as `best` and counted as a pick,
    /// so the index sees the whole load, not only the hinted part.
    pub by_load: Option<usize>,
    /// The prompt's block fingerprints (for recording the pick).
    pub blocks: Vec<Fingerprint>,
    /// With a pool ([`Scoring::pool`]): each endpoint's load as the ranking
    /// read it, in the pool's order, so the caller's fallbacks by load read
    /// no load again; empty when the ranking did not run.
    pub pool_loads: Vec<ReplicaLoad>,
}

impl Ranked {
    /// The hinted replica, when there is a hint.
    pub fn best(&self) -> Option<&Scored> {
        self.hint.and_then(|i| self.ranked.get(i))
    }

    /// The replica the request goes to: the hint, else (for a caller that
    /// named its candidates) the one load alone chooses.
    pub fn destination(&self) -> Option<&Scored> {
        self.hint.or(self.by_load).and_then(|i| self.ranked.get(i))
    }

    /// The prompt's blocks `pick` does not hold yet: what a pick of it
    /// holds speculatively until its events arrive.
    pub fn unheld_by(&self, pick: &Scored) -> &[Fingerprint] {
        let held = (pick.matched_blocks as usize).min(self.blocks.len());
        &self.blocks[held..]
    }
}

/// Where the load-aware scoring reads load and speculative holders. It is
/// asked only after the index walk has released the index's registry (the
/// ranking keeps a reference to each holder's registry entry instead), so
/// it may read the index; an implementation behind locks should hold them
/// briefly, since every lookup takes them.
pub trait ScoringSource {
    /// Replicas speculatively holding `blocks` from the start (alone, or
    /// continuing the real holdings of `holders`: replica id and blocks
    /// held), with the blocks each holds from the start
    /// ([`Speculation::holdings`]).
    fn speculative(
        &self,
        scope_tag: u64,
        blocks: &[Fingerprint],
        holders: &[(&str, u32)],
        now_ms: i64,
    ) -> Vec<(String, u32)>;
    /// The load of each of `replica_ids`, in order.
    fn loads(&self, replica_ids: &[&str], now_ms: i64) -> Vec<ReplicaLoad>;
    /// The load board behind [`ScoringSource::loads`], when there is one: a
    /// scope's loads are then read through entries resolved once per
    /// membership change instead of a map probe per replica.
    fn board(&self) -> Option<&LoadBoard> {
        None
    }
}

/// A load board and a speculation table read directly (tests, simulations).
#[derive(Clone, Copy, Debug)]
pub struct Boards<'a> {
    /// Load per replica.
    pub load: &'a LoadBoard,
    /// Speculative holders.
    pub speculation: &'a Speculation,
}

impl ScoringSource for Boards<'_> {
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
        Some(self.load)
    }
}

/// How a decision is scored.
#[derive(Clone, Copy)]
pub struct Scoring<'a> {
    /// Score weights and the load bound.
    pub weights: &'a ScoreWeights,
    /// Load and speculative holders.
    pub source: &'a dyn ScoringSource,
    /// Tag of the query's scope in the speculation table.
    pub scope_tag: u64,
    /// Score exactly these endpoints (replica and address) instead of the
    /// scope's replicas: an endpoint picker's pool, where an endpoint the
    /// index has not heard from yet is still a candidate.
    pub pool: Option<&'a [(ReplicaKey, String)]>,
    /// Replicas holding none of the prompt to rank in full, at most (at
    /// least one): the first is what the hint is weighed against and where
    /// load alone sends a request; [`crate::pick::OTHERS_RANKED`] keeps
    /// fallbacks. Fewer cost fewer loads read and names copied.
    pub others: usize,
    /// Replicas holding part of the prompt to answer, at most (at least
    /// one; `usize::MAX`: all): every holder is scored, but only the best
    /// this many are sorted and copied into [`Ranked::ranked`]. The hint,
    /// the load-only destination and the order of those kept are the same
    /// as with all kept (a holder within its load bound ranks before any
    /// over it), so a caller answering only the first few (LookupRoute's
    /// `max_candidates`) copies no name for the rest: a prompt every
    /// replica of a large scope holds (a fleet-wide system prompt) no
    /// longer costs a copy of every replica's names.
    pub holders: usize,
}

impl std::fmt::Debug for Scoring<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scoring")
            .field("weights", self.weights)
            .field("scope_tag", &self.scope_tag)
            .finish_non_exhaustive()
    }
}

/// A tag of `scope` for the speculation table and the load board's
/// per-scope entries, the same for the life of the process (never sent or
/// stored). foldhash with a fixed seed: SipHash cost every lookup and every
/// ingest batch about 480 instructions for the scope's names.
pub fn scope_tag(scope: &Scope) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::with_seed(0x5eed_5c09_e7a6_0001).hash_one(scope)
}

/// Whether a replica's score falls as each of its figures grows (weights
/// of no sign below zero): what a shortlist's floors rely on.
fn monotone(w: &ScoreWeights) -> bool {
    w.prefix >= 0.0 && w.load >= 0.0 && w.kv_usage >= 0.0
}

/// A walk's holders, each held by a reference to its registry entry, so
/// they outlive the registry's read lock without a copy of their names
/// (copies cost 6.2 k instructions more per lookup of 8 holders; the
/// references 1.4 k: docs/benchmarks.md, "Index server over gRPC").
struct Holders {
    block_size: u32,
    prompt_blocks: u32,
    held: Held,
    /// Why there is nothing to rank (a reason other than no entry).
    no_hint: Option<(NoHintReason, String)>,
}

/// Each holder's registry entry, blocks matched, block size and tier.
type Held = SmallVec<[(Arc<ReplicaMeta>, u32, u32, Tier); 8]>;

impl Holders {
    /// `matches`' entries among `metas` (the walk's matches' entries, in
    /// their order; `matches` is that list or a part of it, in order).
    fn of(metas: &[&Arc<ReplicaMeta>], matches: &[Match<'_>]) -> Held {
        let mut metas = metas.iter();
        matches
            .iter()
            .filter_map(|m| {
                let meta = metas.find(|meta| std::ptr::eq(&meta.key, m.replica))?;
                Some((Arc::clone(meta), m.matched_blocks, m.block_size, m.tier))
            })
            .collect()
    }

    /// [`crate::pick::id_hash`] of each holder's replica id, in
    /// [`Self::matches`]' order (hashed when the replica registered).
    fn id_hashes(&self) -> SmallVec<[u64; 8]> {
        self.held.iter().map(|(meta, ..)| meta.id_hash).collect()
    }

    /// The holders as matches, borrowing from `self`.
    fn matches(&self) -> SmallVec<[Match<'_>; 8]> {
        self.held
            .iter()
            .map(|(meta, matched_blocks, block_size, tier)| Match {
                replica: &meta.key,
                address: &meta.address,
                matched_blocks: *matched_blocks,
                block_size: *block_size,
                tier: *tier,
            })
            .collect()
    }
}

/// [`route`], then the scoring: the prefix match (real or speculative),
/// load and the load bound decide the order of every eligible replica.
///
/// The hint (what LookupRoute answers as `best`) is the best-ranked replica
/// that holds part of the prompt and is within its load bound. When every
/// holder is over its bound while some other replica is within it, there is
/// no hint ([`NoHintReason::LoadBound`]): the gateway balances by load, and
/// `ranked` still says where. A gateway calling LookupRoute may not follow a
/// hint; one that names its candidates is given a load-based destination
/// when there is no hint ([`Ranked::by_load`]), so its every pick counts.
///
/// The scope is resolved once (its handle, block size and members in one
/// read of the registry). The walk's answer takes a reference to each
/// holder's registry entry (names borrowed from it, not copied), and the
/// ranking runs after the registry's read lock is released: the load
/// board, the speculation and a shortlist rebuild never hold it, so a
/// replica joining, leaving or resyncing waits for the walk only.
#[allow(clippy::too_many_arguments)]
pub fn route_ranked(
    index: &Index,
    query: &RouteQuery<'_>,
    policy: &RoutePolicy,
    default_block_size: u32,
    now_ms: i64,
    deadline: &dyn Deadline,
    scoring: Scoring<'_>,
) -> Ranked {
    // Borrowed unless an adapter names a fingerprint domain: no copy of the
    // scope's names per lookup.
    let replica_scope = query.replica_scope();
    // The scope's handle, block size and members, read at once.
    let resolved = InScope::resolve(index, &replica_scope);
    let block_size = InScope::block_size_or(resolved.as_ref(), default_block_size);
    let blocks: Vec<Fingerprint> = match query.key {
        RouteKey::PrefixHash(fp) => vec![fp],
        _ => query
            .blocks(block_size, deadline)
            .map(Cow::into_owned)
            .unwrap_or_default(),
    };
    // Fingerprint once: the walk and the speculation read the same blocks.
    let query = &RouteQuery {
        key: match query.key {
            RouteKey::PrefixHash(fp) => RouteKey::PrefixHash(fp),
            _ => RouteKey::Blocks(&blocks),
        },
        ..*query
    };
    let (handle, members) = match resolved {
        Some(s) => (Some(s.handle), s.members),
        None => (None, None),
    };
    // The walk's answer keeps a reference to each holder's entry (one
    // reference count each, no name copied) and the registry is released
    // before the ranking: an ingest writer (a replica joining, leaving or
    // resyncing) waits for the walk only, not for the load board, the
    // speculation or a shortlist rebuild, and no lookup queues behind it
    // for that long (see [`ScoringSource`]).
    let holders = route_in(
        index,
        query,
        &replica_scope,
        handle,
        block_size,
        policy,
        now_ms,
        deadline,
        MatchOrder::Walk,
        |metas, d| {
            let matches: &[Match<'_>] = match &d.outcome {
                RouteOutcome::Route(m) => m,
                RouteOutcome::NoHint { .. } => &[],
            };
            Holders {
                block_size: d.block_size,
                prompt_blocks: d.prompt_blocks,
                held: Holders::of(metas, matches),
                no_hint: match &d.outcome {
                    RouteOutcome::NoHint { reason, detail } if *reason != NoHintReason::NoEntry => {
                        Some((*reason, detail.clone()))
                    }
                    _ => None,
                },
            }
        },
    );
    let mut ranked = match holders.no_hint {
        Some(no_hint) => Ranked {
            block_size: holders.block_size,
            prompt_blocks: holders.prompt_blocks,
            ranked: Vec::new(),
            hint: None,
            no_hint: Some(no_hint),
            by_load: None,
            blocks: Vec::new(),
            pool_loads: Vec::new(),
        },
        None => rank::rank_matches(
            &rank::Decided {
                query,
                matches: &holders.matches()[..],
                match_hashes: &holders.id_hashes()[..],
                members: members.as_ref(),
                blocks: &blocks,
                block_size: holders.block_size,
                prompt_blocks: holders.prompt_blocks,
            },
            policy,
            now_ms,
            &scoring,
        ),
    };
    ranked.blocks = blocks;
    ranked
}
