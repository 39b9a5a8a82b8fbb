//! The index server's core: its state (the index, the namespaces' policies,
//! the load board and speculative holders, tokenizers, the engines' reports)
//! and its two entries, [`IndexCore::route`] and [`IndexCore::ingest`].
//!
//! Every front end — LookupRoute and IngestEvents on gRPC ([`crate::grpc`]),
//! the endpoint picker ([`crate::epp`]), llm-d's GetPodScores
//! ([`crate::llmd`]) and the functional probe ([`crate::probe`]) — is an
//! adapter: it validates its protocol's input, calls one of the two entries
//! and converts the answer. Policy, the lookup budget, tokenizing, the
//! decision, falling back by load, shedding and the feedback a pick leaves
//! in the load board are decided here once, on the core's clock.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use ic_clock::{Clock, SystemClock};
use ic_index::ingest::{Limit, Step};
use ic_index::load::EngineLoad;
use ic_index::pick::Scored;
use ic_index::route::{NoHintReason, Ranked, RouteKey, RouteOutcome, RouteQuery, scope_tag};
use ic_index::{
    Candidate, Change, ContentError, Deadline, Fingerprint, Index, Match, ReplicaKey, Scope,
};
use ic_kvevents::PromptExtras;
use ic_proto::index_v1 as pb;
use parking_lot::{Mutex, RwLock};

use crate::metrics::Metrics;
use crate::policy::{Policies, Policy};
use crate::routing::Routing;
use crate::tokenize::{ChatPrompt, EncodeError, Tokenizers};

/// A lookup's budget: the instant on the monotonic clock when it ends.
#[derive(Clone, Copy, Debug)]
pub struct InstantDeadline(pub Instant);

impl Deadline for InstantDeadline {
    fn expired(&self) -> bool {
        Instant::now() >= self.0
    }
}

/// What a replica's subscriber last said about the engine beside its
/// blocks: its KV cache size and whether the view misses history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineReport {
    /// The engine's KV cache size, when its metrics export it.
    pub cache: Option<pb::EngineCache>,
    /// The subscriber's view misses unrecoverable batches.
    pub history_incomplete: bool,
}

/// Each replica's latest [`EngineReport`] (for the snapshot; not routing
/// state, so it lives beside the index).
#[derive(Debug, Default)]
pub struct EngineReports(Mutex<std::collections::HashMap<ReplicaKey, EngineReport>>);

impl EngineReports {
    /// Records what `key`'s latest batch said.
    pub fn report(
        &self,
        key: ReplicaKey,
        cache: Option<pb::EngineCache>,
        history_incomplete: bool,
    ) {
        let mut map = self.0.lock();
        let entry = map.entry(key).or_default();
        entry.history_incomplete = history_incomplete;
        if cache.is_some() {
            entry.cache = cache;
        }
    }

    /// The latest reports of the replicas in `present`, forgetting the rest.
    pub fn of_present(
        &self,
        present: &HashSet<&ReplicaKey>,
    ) -> std::collections::HashMap<ReplicaKey, EngineReport> {
        let mut map = self.0.lock();
        map.retain(|k, _| present.contains(k));
        map.clone()
    }
}

/// What a batch said about its engine besides blocks, already checked.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineFacts {
    /// The replica the facts are about.
    pub key: ReplicaKey,
    /// The engine's queue and KV-cache usage, when the subscriber read them.
    pub load: Option<EngineLoad>,
    /// The engine's KV cache size, when its metrics export it.
    pub cache: Option<pb::EngineCache>,
    /// The subscriber's view misses unrecoverable batches.
    pub history_incomplete: bool,
}

/// Why an ingest stream must end after a batch.
#[derive(Debug, PartialEq, Eq)]
pub enum StepEnd {
    /// Ask the subscriber to resync, with this detail.
    Resync(String),
    /// A bound was reached.
    Refused(Limit, String),
}

/// What to route on, as the front end received it.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    /// The fingerprint of the prompt's last full block.
    PrefixHash(Fingerprint),
    /// The prompt's block fingerprints, in order.
    Blocks(&'a [Fingerprint]),
    /// The prompt's token ids.
    Tokens(&'a [u32]),
    /// Completion text, tokenized with the scope model's tokenizer.
    Text(&'a str),
    /// Chat messages, rendered with the scope model's chat template.
    Chat(&'a ChatPrompt),
    /// Nothing to match on (an endpoint pick of an unreadable body): load
    /// alone decides.
    Unknown,
}

/// Who asks, which decides what is answered and what is counted.
#[derive(Clone, Copy, Debug)]
pub enum Purpose<'a> {
    /// A routing hint (LookupRoute): the best holder of the prompt within
    /// its load bound, or none. A gateway that follows the hint sends the
    /// request there, so it counts as a pick unless `record_pick` is off.
    Hint {
        /// Count the hint in the load board and as a speculative holder.
        record_pick: bool,
    },
    /// An endpoint of `pool`, always (the endpoint picker): by prefix and
    /// load, else by load alone; counted as a pick and as in flight until
    /// the caller reports [`IndexCore::finished`].
    Endpoint {
        /// The endpoints (their index replica and address).
        pool: &'a [(ReplicaKey, String)],
        /// Refuse when even the least busy endpoint has this many requests.
        shed_at_requests: Option<f64>,
        /// Endpoints the caller names after the pick, by load (the answer's
        /// [`Routed::Endpoint::by_load`] holds one more, as the pick may be
        /// among them).
        fallbacks: usize,
    },
    /// Prefix matches only (llm-d's scores): nothing is counted.
    Scores,
}

/// One routing question to the core.
#[derive(Clone, Copy, Debug)]
pub struct RouteRequest<'a> {
    /// Whose index to look in (validated by the front end).
    pub scope: &'a Scope,
    /// What to route on.
    pub prompt: Prompt<'a>,
    /// Only these replica ids may be answered (`None`: any).
    pub candidates: Option<&'a HashSet<String>>,
    /// What besides the tokens the engine hashes.
    pub extras: Option<&'a PromptExtras>,
    /// When the front end received the request: the namespace's lookup
    /// budget runs from here, so tokenizing is inside it.
    pub received: Instant,
    /// What to answer.
    pub purpose: Purpose<'a>,
}

/// The core's answer, by purpose.
#[derive(Clone, Debug, PartialEq)]
pub enum Routed {
    /// [`Purpose::Hint`]: the ranking, its hint or why there is none.
    Hint(Ranked),
    /// [`Purpose::Endpoint`]: the endpoint the request goes to.
    Endpoint {
        /// The picked replica (its address is the endpoint).
        pick: Scored,
        /// Whether the prompt's prefix decided (else load alone).
        by_prefix: bool,
        /// Time spent rendering and tokenizing the prompt, so the picker
        /// can time its decision without it.
        tokenized_in: std::time::Duration,
        /// Positions in the pool of the best endpoints by load alone, best
        /// first, for the fallbacks (empty when none were asked for).
        by_load: Vec<usize>,
    },
    /// [`Purpose::Scores`]: the replicas holding a prefix worth routing
    /// on, best first, or why there are none.
    Scores(Result<Vec<Candidate>, NoHintReason>),
}

/// Why the core gave no answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// The prompt could not be tokenized (hints and scores; an endpoint
    /// pick falls back to load instead).
    #[error(transparent)]
    Tokenize(#[from] EncodeError),
    /// The pool (or the gateway's subset of it) has no endpoint.
    #[error("{0}")]
    NoEndpoint(String),
    /// Every eligible endpoint is saturated.
    #[error("{0}")]
    Saturated(String),
}

/// A hint's answer when the prompt gives nothing to match on.
fn nothing_to_match() -> Ranked {
    Ranked {
        block_size: 0,
        prompt_blocks: 0,
        ranked: Vec::new(),
        hint: None,
        no_hint: Some((
            NoHintReason::NoEntry,
            "the prompt has nothing to match on".into(),
        )),
        by_load: None,
        blocks: Vec::new(),
        pool_loads: Vec::new(),
    }
}

/// The index server's state and its request and ingest entries.
#[derive(Debug)]
pub struct IndexCore {
    index: Arc<Index>,
    policies: RwLock<Policies>,
    default_block_size: u32,
    tokenizers: Tokenizers,
    routing: Routing,
    reports: EngineReports,
    metrics: Metrics,
    clock: Arc<dyn Clock>,
    /// When changes contradicting the index were last logged (ms).
    content_logged_ms: std::sync::atomic::AtomicI64,
}

/// Changes contradicting the index are logged at most this often (each is
/// counted in `content_errors_total`).
const CONTENT_LOG_EVERY_MS: i64 = 10_000;

impl IndexCore {
    /// A core over `index` with default policies and scoring, no
    /// tokenizers and the system clock; `default_block_size` fingerprints
    /// token ids in scopes that reported no block size yet.
    pub fn new(index: Arc<Index>, default_block_size: u32, metrics: Metrics) -> Self {
        Self {
            index,
            policies: RwLock::new(Policies::default()),
            default_block_size,
            tokenizers: Tokenizers::default(),
            routing: Routing::default(),
            reports: EngineReports::default(),
            metrics,
            clock: Arc::new(SystemClock::default()),
            content_logged_ms: std::sync::atomic::AtomicI64::new(i64::MIN),
        }
    }

    /// With these tokenizers for text and chat prompts.
    #[must_use]
    pub fn with_tokenizers(self, tokenizers: Tokenizers) -> Self {
        Self { tokenizers, ..self }
    }

    /// With this scoring and load state.
    #[must_use]
    pub fn with_routing(self, routing: Routing) -> Self {
        Self { routing, ..self }
    }

    /// With this clock for every decision's time.
    #[must_use]
    pub fn with_clock(self, clock: Arc<dyn Clock>) -> Self {
        Self { clock, ..self }
    }

    /// The index.
    pub fn index(&self) -> &Arc<Index> {
        &self.index
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The load board and speculative holders.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    /// What the engines last reported beside their blocks.
    pub fn reports(&self) -> &EngineReports {
        &self.reports
    }

    /// Now, on the core's clock (Unix ms).
    pub fn now_ms(&self) -> i64 {
        self.clock.unix_ms()
    }

    /// The policy of namespace `tenant`.
    pub fn policy(&self, tenant: &str) -> Policy {
        self.policies.read().get(tenant)
    }

    /// Every namespace's policies, read-locked (the endpoint picker reads
    /// its shedding thresholds and InferenceObjective priorities here).
    pub fn policies(&self) -> parking_lot::RwLockReadGuard<'_, Policies> {
        self.policies.read()
    }

    /// Replaces every namespace's policy at once.
    pub fn set_policies(&self, policies: Policies) {
        *self.policies.write() = policies;
    }

    /// The one request path: the namespace's policy, the lookup budget from
    /// `received`, the prompt's tokens, the decision for the purpose, and
    /// the feedback the answer leaves in the load board.
    pub fn route(&self, request: &RouteRequest<'_>) -> Result<Routed, RouteError> {
        self.route_top(request, usize::MAX)
    }

    /// [`Self::route`] answering at most `holders` replicas holding part
    /// of the prompt (at least one: LookupRoute's `max_candidates`): the
    /// same hint and pick, and no name copied for a holder not answered.
    pub fn route_top(
        &self,
        request: &RouteRequest<'_>,
        holders: usize,
    ) -> Result<Routed, RouteError> {
        let policy = self.policy(&request.scope.tenant);
        let deadline = InstantDeadline(request.received + policy.lookup_timeout);
        let now_ms = self.now_ms();
        if let Purpose::Endpoint {
            pool,
            shed_at_requests: Some(limit),
            ..
        } = request.purpose
        {
            // Shed before tokenizing: a saturated pool spends nothing. The
            // threshold counts requests, so it is met only when every
            // eligible endpoint has that many, whatever the scoring would
            // rank first (by TTFT, queued work).
            let least = self.routing.least_requests(pool, now_ms);
            if let Some(least) = least.filter(|&l| l >= limit) {
                return Err(RouteError::Saturated(format!(
                    "every endpoint is saturated: the least busy has {least:.0} requests \
                     (this request's priority is shed at {limit}: its CachePolicy's \
                     shedding, else the --epp-shed-*-at-requests flags)"
                )));
            }
        }
        // Only text and chat are tokenized (and timed): the other forms
        // read no clock here.
        let (tokenized, tokenized_in) = match request.prompt {
            Prompt::Text(_) | Prompt::Chat(_) => {
                let tokenizing = Instant::now();
                let tokenized = self.tokens(request);
                (tokenized, tokenizing.elapsed())
            }
            _ => (Ok(None), std::time::Duration::ZERO),
        };
        let tokens = match tokenized {
            Ok(tokens) => tokens,
            Err(error) if matches!(request.purpose, Purpose::Endpoint { .. }) => {
                tracing::debug!(model = %request.scope.model, %error, "prompt not tokenized; routing by load");
                self.metrics.epp_unread("tokenize");
                None
            }
            Err(error) => return Err(error.into()),
        };
        let key = match (request.prompt, &tokens) {
            (_, Some(tokens)) => Some(RouteKey::Tokens(tokens)),
            (Prompt::Tokens(ids), None) => Some(RouteKey::Tokens(ids)),
            (Prompt::PrefixHash(fp), None) => Some(RouteKey::PrefixHash(fp)),
            (Prompt::Blocks(blocks), None) => Some(RouteKey::Blocks(blocks)),
            (Prompt::Text(_) | Prompt::Chat(_) | Prompt::Unknown, None) => None,
        };
        let query = key.map(|key| RouteQuery {
            scope: request.scope,
            key,
            candidates: request.candidates,
            extras: request.extras,
        });
        let tag = scope_tag(request.scope);
        // The load-aware ranking, over the scope's replicas or a pool.
        let rank = |query: &RouteQuery<'_>, pool| {
            self.routing.decide(
                &self.index,
                query,
                &policy,
                self.default_block_size,
                now_ms,
                &deadline,
                pool,
                tag,
                holders,
            )
        };
        match request.purpose {
            Purpose::Scores => {
                let Some(query) = query else {
                    return Ok(Routed::Scores(Err(NoHintReason::NoEntry)));
                };
                let matches = ic_index::route::route(
                    &self.index,
                    &query,
                    &policy,
                    self.default_block_size,
                    now_ms,
                    &deadline,
                    |d| match d.outcome {
                        RouteOutcome::Route(m) => Ok(m.iter().map(Match::to_candidate).collect()),
                        RouteOutcome::NoHint { reason, .. } => Err(reason),
                    },
                );
                Ok(Routed::Scores(matches))
            }
            Purpose::Hint { record_pick } => {
                let Some(query) = query else {
                    return Ok(Routed::Hint(nothing_to_match()));
                };
                let decision = rank(&query, None);
                if let Some(best) = decision.destination().filter(|_| record_pick) {
                    // A prefix hash names no blocks to hold speculatively.
                    let blocks: &[Fingerprint] = match query.key {
                        RouteKey::PrefixHash(_) => &[],
                        _ => decision.unheld_by(best),
                    };
                    self.routing.picked(
                        tag,
                        &best.replica.replica_id,
                        blocks,
                        decision.block_size,
                        now_ms,
                    );
                }
                Ok(Routed::Hint(decision))
            }
            Purpose::Endpoint {
                pool, fallbacks, ..
            } => {
                let mut ranked = query.as_ref().map(|query| rank(query, Some(pool)));
                // The pool's loads are read once: by the ranking, else here.
                let loads = match ranked.as_mut() {
                    Some(r) if r.pool_loads.len() == pool.len() => {
                        std::mem::take(&mut r.pool_loads)
                    }
                    _ => self.routing.pool_loads(pool, now_ms),
                };
                // The ranking's first, moved out (the rest is not answered).
                let first = ranked
                    .as_mut()
                    .filter(|r| !r.ranked.is_empty())
                    .map(|r| r.ranked.swap_remove(0));
                let pick = first.or_else(|| {
                    // Nothing to rank on (no prompt, a lookup that ended
                    // early): load alone decides.
                    self.routing
                        .rank_loads(pool, &loads, now_ms, &policy.scoring)
                        .into_iter()
                        .next()
                });
                let Some(pick) = pick else {
                    return Err(RouteError::NoEndpoint(
                        "the pool has no ready endpoint".into(),
                    ));
                };
                let (blocks, block_size) = match &ranked {
                    Some(r) => (r.unheld_by(&pick), r.block_size),
                    None => (&[][..], self.default_block_size),
                };
                self.routing
                    .picked(tag, &pick.replica.replica_id, blocks, block_size, now_ms);
                self.routing.started(&pick.replica.replica_id);
                // One more than asked: the pick may be among them.
                let by_load = if fallbacks == 0 {
                    Vec::new()
                } else {
                    self.routing.best_by_load(
                        pool,
                        &loads,
                        now_ms,
                        &policy.scoring,
                        fallbacks.saturating_add(1),
                    )
                };
                let by_prefix = pick.matched_blocks > 0;
                Ok(Routed::Endpoint {
                    pick,
                    by_prefix,
                    tokenized_in,
                    by_load,
                })
            }
        }
    }

    /// A request an endpoint pick counted as in flight on `replica_id`
    /// ended.
    pub fn finished(&self, replica_id: &str) {
        self.routing.finished(replica_id);
    }

    /// The token ids of a text or chat prompt (`None` for the other forms,
    /// which need no tokenizer).
    fn tokens(&self, request: &RouteRequest<'_>) -> Result<Option<Vec<u32>>, EncodeError> {
        let model = &request.scope.model;
        match request.prompt {
            Prompt::Text(text) => self.tokenizers.encode(model, text).map(Some),
            Prompt::Chat(chat) => self.tokenizers.encode_chat(model, chat).map(Some),
            Prompt::Tokens(_) | Prompt::PrefixHash(_) | Prompt::Blocks(_) | Prompt::Unknown => {
                Ok(None)
            }
        }
    }

    /// The one ingest path: applies one classified batch of a stream (from
    /// IngestEvents, Kafka or the functional probe) and what it said about
    /// its engine. `Err` when the stream must end.
    pub fn ingest(&self, step: Step, facts: Option<EngineFacts>) -> Result<(), StepEnd> {
        self.ingest_at(step, facts, None)
    }

    /// [`IndexCore::ingest`] of a batch replayed from a log while catching
    /// up, recorded at `recorded_ms`: its replica counts as seen then, not
    /// now (a pod deleted since is not brought back into lookups by its
    /// old resync), and what it says of the engine's work and load is
    /// history: it queues no prefill work and sets no load (a replay of
    /// minutes of stores would otherwise stack them all up as queued now).
    pub fn ingest_replayed(
        &self,
        step: Step,
        facts: Option<EngineFacts>,
        recorded_ms: i64,
    ) -> Result<(), StepEnd> {
        self.ingest_at(step, facts, Some(recorded_ms))
    }

    fn ingest_at(
        &self,
        step: Step,
        facts: Option<EngineFacts>,
        recorded_ms: Option<i64>,
    ) -> Result<(), StepEnd> {
        let now = self.now_ms();
        let live = recorded_ms.is_none();
        // Never later than now: a producer's clock may run ahead.
        let seen = recorded_ms.map_or(now, |at| at.min(now));
        let resync = matches!(step, Step::Replace { .. });
        match step {
            Step::Buffered => {}
            Step::Apply {
                key,
                scope,
                address,
                changes,
                tier2,
            }
            | Step::Replace {
                key,
                scope,
                address,
                changes,
                tier2,
            } => {
                // A resync swaps the replica's whole state in at once.
                let errors = if resync {
                    self.index.replace(&key, &scope, &address, &changes, seen)
                } else {
                    self.index.apply(&key, &scope, &address, &changes, seen)
                };
                // A replica or scope past the index's bounds took nothing:
                // the stream ends so that its subscriber does not take the
                // batch for applied, and resyncs once there is room.
                if let [full @ (ContentError::TooManyReplicas | ContentError::TooManyScopes)] =
                    errors.as_slice()
                {
                    return Err(self.index_full(full, &key, &scope));
                }
                self.metrics.content_errors.inc_by(errors.len() as u64);
                if let Some(first) = errors.first() {
                    self.log_content_errors(&key, errors.len(), first, now);
                }
                self.index.set_tier2(&key, tier2);
                if resync {
                    self.metrics.resyncs.inc();
                }
                // A resync restates what is held: no new work; nor is a
                // replayed batch's.
                self.confirm_speculation(&scope, &key.replica_id, &changes, live && !resync);
            }
            Step::ResyncRequired(detail) => return Err(StepEnd::Resync(detail)),
            Step::Refused(limit, detail) => return Err(StepEnd::Refused(limit, detail)),
        }
        if let Some(facts) = facts {
            if let Some(load) = facts.load.filter(|_| live) {
                self.routing
                    .report_engine(&facts.key.replica_id, load, self.now_ms());
            }
            self.reports
                .report(facts.key, facts.cache, facts.history_incomplete);
        }
        self.metrics.set_index_size(&self.index);
        Ok(())
    }

    /// Why a batch naming a replica or scope past the index's bounds ends
    /// its stream.
    fn index_full(&self, full: &ContentError, key: &ReplicaKey, scope: &Scope) -> StepEnd {
        let (max_replicas, max_scopes) = self.index.bounds();
        if *full == ContentError::TooManyScopes {
            StepEnd::Refused(
                Limit::Scopes,
                format!(
                    "replica.scope: model {:?} of tenant {:?} would be a scope past the \
                     {max_scopes} the index keeps (--max-scopes)",
                    scope.model, scope.tenant
                ),
            )
        } else {
            StepEnd::Refused(
                Limit::Replicas,
                format!(
                    "replica.replica_id: {:?} rank {} would be a replica past the {max_replicas} \
                     the index knows at once (--max-replicas); retry once silent ones expire",
                    key.replica_id, key.dp_rank
                ),
            )
        }
    }

    /// Names the replica and the first of `count` changes the index could
    /// not take (counted either way), at most every
    /// [`CONTENT_LOG_EVERY_MS`] so that a broken producer cannot flood
    /// the log.
    fn log_content_errors(
        &self,
        key: &ic_index::ReplicaKey,
        count: usize,
        first: &ic_index::ContentError,
        now_ms: i64,
    ) {
        use std::sync::atomic::Ordering;
        let last = self.content_logged_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(last) < CONTENT_LOG_EVERY_MS
            || self
                .content_logged_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        tracing::warn!(
            tenant = %key.tenant,
            replica = %key.replica_id,
            rank = key.dp_rank,
            count,
            first = ?first,
            "changes contradicting the index were skipped (content_errors_total; \
             logged at most every 10 s)"
        );
    }

    /// The engine's own word replaces the replica's speculative holding:
    /// stored blocks are now real, evicted ones are gone, a cleared tier
    /// ends every speculation of the replica; blocks stored `live` (not a
    /// resync) are work the engine did, for the TTFT estimate.
    fn confirm_speculation(&self, scope: &Scope, replica_id: &str, changes: &[Change], live: bool) {
        let tag = scope_tag(scope);
        for change in changes {
            match change {
                Change::Stored {
                    fingerprints,
                    block_size,
                    ..
                } => {
                    self.routing.confirm(tag, replica_id, fingerprints);
                    if live {
                        self.routing.observed_stores(
                            replica_id,
                            fingerprints.len(),
                            *block_size,
                            self.now_ms(),
                        );
                    }
                }
                Change::Evicted { fingerprints } => {
                    self.routing.confirm(tag, replica_id, fingerprints);
                }
                Change::Cleared { .. } => self.routing.forget_speculation(replica_id),
            }
        }
    }

    /// Forgets every replica silent for longer than `after`; returns how
    /// many went.
    pub fn forget_silent(&self, after: std::time::Duration) -> usize {
        let cutoff = self
            .now_ms()
            .saturating_sub(i64::try_from(after.as_millis()).unwrap_or(i64::MAX));
        let mut forgotten = 0;
        for key in self.index.replicas_silent_since(cutoff) {
            if self.index.remove_replica(&key) {
                forgotten += 1;
                self.metrics.stale_replicas_removed.inc();
                tracing::info!(
                    tenant = %key.tenant,
                    replica = %key.replica_id,
                    dp_rank = key.dp_rank,
                    "forgot a silent replica"
                );
            }
        }
        self.metrics.set_index_size(&self.index);
        forgotten
    }

    /// Load and speculation of replicas gone from the index are dropped
    /// (they never outlive a replica), expired speculation goes, and the
    /// speculation metrics are refreshed; returns the entries dropped for
    /// space so far (the caller counts the difference).
    pub fn routing_upkeep(&self, dropped_seen: u64) -> u64 {
        let present: HashSet<String> = self
            .index
            .replicas_silent_since(i64::MAX)
            .into_iter()
            .map(|k| k.replica_id)
            .collect();
        self.routing.retain(&present, self.now_ms());
        let (entries, dropped) = self.routing.speculation_stats();
        self.metrics
            .speculative_entries
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
        self.metrics
            .speculative_dropped
            .inc_by(dropped.saturating_sub(dropped_seen));
        let rebuilds = self.routing.shortlist_refreshes();
        self.metrics
            .shortlist_rebuilds
            .inc_by(rebuilds.saturating_sub(self.metrics.shortlist_rebuilds.get()));
        dropped
    }
}
