//! The `IndexService` gRPC handlers: thin adapters over [`ic_index::Index`].

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use ic_index::{Index, LookupView, Match, Tier};
use ic_kvevents::chain_fingerprints;
use ic_proto::IndexService;
use ic_proto::index_v1 as pb;
use parking_lot::RwLock;
use tonic::{Request, Response, Status, Streaming};

use crate::convert::{scope_from_pb, tier_to_pb};
use crate::ingest::{IngestStream, Step};
use crate::metrics::Metrics;
use crate::policy::Policies;
use crate::tokenize::{EncodeError, Tokenizers};

/// Largest prompt accepted, in blocks or tokens.
pub const MAX_PROMPT_BLOCKS: usize = 1 << 16;
/// Largest prompt accepted as token ids.
pub const MAX_PROMPT_TOKENS: usize = 1 << 21;
/// Largest candidate list accepted.
pub const MAX_CANDIDATES: usize = 4096;

/// Shared state of the handlers.
#[derive(Clone, Debug)]
pub struct IndexServer {
    /// The index.
    pub index: Arc<Index>,
    /// Resolved policies.
    pub policies: Arc<RwLock<Policies>>,
    /// Block size for token-id lookups in scopes without learned events.
    pub default_block_size: u32,
    /// Metrics.
    pub metrics: Metrics,
    /// Tokenizers for `prompt_text` lookups, by model.
    pub tokenizers: Arc<Tokenizers>,
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn no_hint(
    reason: pb::NoHintReason,
    detail: String,
    block_size: u32,
    prompt_blocks: u32,
) -> pb::LookupRouteResponse {
    pb::LookupRouteResponse {
        outcome: pb::LookupOutcome::NoHint as i32,
        no_hint_reason: reason as i32,
        detail,
        block_size,
        prompt_blocks,
        ..Default::default()
    }
}

/// What a LookupRoute looks up.
enum Query<'a> {
    /// The replicas holding one block (and so its whole prefix).
    Prefix(u64),
    /// The longest prefix of a prompt's blocks.
    Blocks(Cow<'a, [u64]>),
}

fn score(c: &Match<'_>) -> pb::CandidateScore {
    pb::CandidateScore {
        replica: Some(pb::ReplicaRef {
            replica_id: c.replica.replica_id.clone(),
            address: c.address.to_owned(),
        }),
        matched_blocks: c.matched_blocks,
        matched_tokens: u32::try_from(c.matched_tokens()).unwrap_or(u32::MAX),
        tier: tier_to_pb(c.tier),
    }
}

impl IndexServer {
    /// A server over `index` with default policies and no tokenizers.
    pub fn new(index: Arc<Index>, default_block_size: u32, metrics: Metrics) -> Self {
        Self {
            index,
            policies: Arc::new(RwLock::new(Policies::default())),
            default_block_size,
            metrics,
            tokenizers: Arc::new(Tokenizers::default()),
        }
    }

    /// The pure core of LookupRoute (tested without gRPC).
    pub fn lookup(&self, req: &pb::LookupRouteRequest) -> Result<pb::LookupRouteResponse, Status> {
        let scope = scope_from_pb(req.scope.as_ref(), "scope").map_err(Status::invalid_argument)?;
        self.lookup_in(scope, req)
    }

    /// LookupRoute for an already validated scope; the functional probe
    /// calls it directly for its own (otherwise unreachable) tenant.
    pub(crate) fn lookup_in(
        &self,
        scope: ic_index::Scope,
        req: &pb::LookupRouteRequest,
    ) -> Result<pb::LookupRouteResponse, Status> {
        let started = Instant::now();
        if req.candidate_replicas.len() > MAX_CANDIDATES {
            return Err(Status::invalid_argument(format!(
                "candidate_replicas: at most {MAX_CANDIDATES} entries"
            )));
        }
        let policy = self.policies.read().get(&scope.tenant);
        let block_size = self
            .index
            .block_size(&scope)
            .unwrap_or(self.default_block_size);
        let candidates: Option<HashSet<String>> = (!req.candidate_replicas.is_empty())
            .then(|| req.candidate_replicas.iter().cloned().collect());
        let stale_ms = i64::try_from(policy.replica_stale_after.as_millis()).unwrap_or(i64::MAX);
        let fresh_since = Some(now_ms().saturating_sub(stale_ms));

        use pb::lookup_route_request::Key;
        let (query, prompt_blocks) = match &req.key {
            None => {
                return Err(Status::invalid_argument(
                    "key: one of prefix_hash, block_hashes, token_ids, prompt_text is required",
                ));
            }
            Some(Key::PrefixHash(fp)) => (Query::Prefix(*fp), 0),
            Some(Key::BlockHashes(b)) => {
                if b.hashes.len() > MAX_PROMPT_BLOCKS {
                    return Err(Status::invalid_argument(format!(
                        "block_hashes.hashes: at most {MAX_PROMPT_BLOCKS} blocks"
                    )));
                }
                (Query::Blocks(Cow::Borrowed(&b.hashes)), b.hashes.len())
            }
            Some(Key::TokenIds(t)) => {
                if t.ids.len() > MAX_PROMPT_TOKENS {
                    return Err(Status::invalid_argument(format!(
                        "token_ids.ids: at most {MAX_PROMPT_TOKENS} tokens"
                    )));
                }
                let fps = chain_fingerprints(None, &t.ids, block_size as usize);
                let n = fps.len();
                (Query::Blocks(Cow::Owned(fps)), n)
            }
            Some(Key::PromptText(text)) => {
                let ids = self
                    .tokenizers
                    .encode(&scope.model, text)
                    .map_err(|e| match e {
                        EncodeError::NoTokenizer(_) => Status::failed_precondition(e.to_string()),
                        EncodeError::TooLong | EncodeError::Failed(_) => {
                            Status::invalid_argument(e.to_string())
                        }
                    })?;
                let fps = chain_fingerprints(None, &ids, block_size as usize);
                let n = fps.len();
                (Query::Blocks(Cow::Owned(fps)), n)
            }
        };
        let prompt_blocks = u32::try_from(prompt_blocks).unwrap_or(u32::MAX);
        let by_prefix = matches!(query, Query::Prefix(_));
        // Built while the index lends the replicas' names (no copy of its own).
        let respond = |view: LookupView<'_>| match view {
            LookupView::UnknownScope => no_hint(
                pb::NoHintReason::UnknownModel,
                format!(
                    "no events seen for tenant {:?} model {:?} ({})",
                    scope.tenant,
                    scope.model,
                    scope.hash_scheme.as_str()
                ),
                block_size,
                prompt_blocks,
            ),
            LookupView::NoEntry if prompt_blocks == 0 && !by_prefix => no_hint(
                pb::NoHintReason::PromptTooShort,
                format!("the prompt has no full block of {block_size} tokens"),
                block_size,
                prompt_blocks,
            ),
            LookupView::NoEntry => no_hint(
                pb::NoHintReason::NoEntry,
                "no replica holds the first block".into(),
                block_size,
                prompt_blocks,
            ),
            LookupView::Matches(all) => {
                let allowed = |c: &&Match<'_>| policy.allow_tier2_matches || c.tier == Tier::T1;
                match all.iter().find(allowed) {
                    None => no_hint(
                        pb::NoHintReason::NoEntry,
                        "only tier-2 matches, which this namespace's policy excludes".into(),
                        block_size,
                        prompt_blocks,
                    ),
                    Some(best) if best.matched_tokens() < policy.minimum_prefix_tokens => no_hint(
                        pb::NoHintReason::BelowMinimumPrefix,
                        format!(
                            "best match is {} tokens, below the minimum of {}",
                            best.matched_tokens(),
                            policy.minimum_prefix_tokens
                        ),
                        block_size,
                        prompt_blocks,
                    ),
                    Some(best) => pb::LookupRouteResponse {
                        outcome: pb::LookupOutcome::PrefixMatch as i32,
                        best: Some(score(best)),
                        candidates: all.iter().filter(allowed).map(score).collect(),
                        block_size,
                        prompt_blocks,
                        ..Default::default()
                    },
                }
            }
        };
        let candidates = candidates.as_ref();
        let mut response = match &query {
            Query::Prefix(fp) => {
                self.index
                    .lookup_prefix_hash_with(&scope, *fp, candidates, fresh_since, respond)
            }
            Query::Blocks(fps) => {
                self.index
                    .lookup_with(&scope, fps, candidates, fresh_since, respond)
            }
        };
        if started.elapsed() > policy.lookup_timeout {
            response = no_hint(
                pb::NoHintReason::LookupTimeout,
                format!("lookup took longer than {:?}", policy.lookup_timeout),
                block_size,
                prompt_blocks,
            );
        }
        self.metrics.record_lookup(&response, started.elapsed());
        Ok(response)
    }
}

impl IndexServer {
    /// Applies one classified ingest batch to the index (the one path both
    /// IngestEvents and the functional probe use). Returns the detail when
    /// the stream must end asking for a resync.
    pub(crate) fn apply_step(&self, step: Step, now: i64) -> Option<String> {
        match step {
            Step::Buffered => {}
            Step::Apply {
                key,
                scope,
                address,
                changes,
                tier2,
            } => {
                let errors = self.index.apply(&key, &scope, &address, &changes, now);
                self.metrics.content_errors.inc_by(errors.len() as u64);
                self.index.set_tier2(&key, tier2);
            }
            Step::Replace {
                key,
                scope,
                address,
                changes,
                tier2,
            } => {
                let errors = self.index.replace(&key, &scope, &address, &changes, now);
                self.metrics.content_errors.inc_by(errors.len() as u64);
                self.index.set_tier2(&key, tier2);
                self.metrics.resyncs.inc();
            }
            Step::ResyncRequired(detail) => return Some(detail),
        }
        None
    }
}

#[tonic::async_trait]
impl IndexService for IndexServer {
    async fn lookup_route(
        &self,
        request: Request<pb::LookupRouteRequest>,
    ) -> Result<Response<pb::LookupRouteResponse>, Status> {
        let is_text = matches!(
            request.get_ref().key,
            Some(pb::lookup_route_request::Key::PromptText(_))
        );
        let result = if is_text {
            // Tokenizing a long prompt is CPU work: keep it off the runtime's
            // I/O threads.
            let server = self.clone();
            tokio::task::spawn_blocking(move || server.lookup(request.get_ref()))
                .await
                .map_err(|e| Status::internal(format!("lookup task failed: {e}")))?
        } else {
            self.lookup(request.get_ref())
        };
        match result {
            Ok(response) => Ok(Response::new(response)),
            Err(status) => {
                self.metrics.lookup_errors.inc();
                Err(status)
            }
        }
    }

    async fn ingest_events(
        &self,
        request: Request<Streaming<pb::IngestBatch>>,
    ) -> Result<Response<pb::IngestAck>, Status> {
        let mut stream = request.into_inner();
        let mut state = IngestStream::default();
        let mut last_applied_seq = 0;
        self.metrics.ingest_streams.inc();
        let _open = scopeguard(&self.metrics);
        while let Some(batch) = stream.message().await? {
            let seq = batch.seq;
            let step = state.accept(batch).map_err(|e| {
                self.metrics.ingest_batch("invalid");
                Status::invalid_argument(e.0)
            })?;
            if let Some(detail) = self.apply_step(step, now_ms()) {
                self.metrics.ingest_batch("resync_required");
                tracing::info!(%detail, "asking a subscriber to resync");
                return Ok(Response::new(pb::IngestAck {
                    last_applied_seq,
                    resync_required: true,
                    detail,
                }));
            }
            self.metrics.ingest_batch("applied");
            self.metrics.set_index_size(&self.index);
            last_applied_seq = seq;
        }
        Ok(Response::new(pb::IngestAck {
            last_applied_seq,
            ..Default::default()
        }))
    }

    async fn set_policies(
        &self,
        request: Request<pb::SetPoliciesRequest>,
    ) -> Result<Response<pb::SetPoliciesResponse>, Status> {
        let policies = Policies::from_push(&request.get_ref().policies)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let applied = u32::try_from(policies.len()).unwrap_or(u32::MAX);
        *self.policies.write() = policies;
        tracing::info!(namespaces = applied, "routing policies replaced");
        Ok(Response::new(pb::SetPoliciesResponse { applied }))
    }
}

/// Decrements the open-stream gauge when the stream handler returns.
struct StreamGuard<'a>(&'a Metrics);

impl Drop for StreamGuard<'_> {
    fn drop(&mut self) {
        self.0.ingest_streams.dec();
    }
}

fn scopeguard(metrics: &Metrics) -> StreamGuard<'_> {
    StreamGuard(metrics)
}
