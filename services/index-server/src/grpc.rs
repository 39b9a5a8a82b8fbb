//! The `IndexService` gRPC handlers: thin adapters that check the caller,
//! validate, call the core ([`IndexCore::route`], [`IndexCore::ingest`])
//! and convert.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use ic_index::pick::Scored;
use ic_index::route::Ranked;
use ic_index::{Fingerprint, Index};
use ic_proto::IndexService;
use ic_proto::index_v1 as pb;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

use crate::access::{ApiAccess, Caller};
use crate::convert::{reason_to_pb, scope_from_pb, scope_from_pb_owned};
use crate::index_core::{IndexCore, Prompt, Purpose, RouteError, RouteRequest, Routed, StepEnd};
use crate::ingest::{IngestStream, engine_facts, rank_of};
use crate::metrics::Metrics;
use crate::policy::Policies;
use crate::tokenize::EncodeError;

/// Ingest steps of more blocks than this run on the blocking pool.
const BLOCKING_STEP_BLOCKS: u64 = 4096;

/// Default of [`LookupLimits::max_prompt_blocks`].
pub const MAX_PROMPT_BLOCKS: usize = 1 << 16;
/// Default of [`LookupLimits::max_prompt_tokens`].
pub const MAX_PROMPT_TOKENS: usize = 1 << 21;
/// Default of [`LookupLimits::max_candidates`].
pub const MAX_CANDIDATES: usize = 4096;
/// Default of [`LookupLimits::max_prompt_text_bytes`].
pub const MAX_PROMPT_TEXT_BYTES: usize = 4 << 20;
/// Default of [`LookupLimits::max_extra_entries`].
pub const MAX_EXTRA_ENTRIES: usize = 1 << 16;
/// Default of [`LookupLimits::max_extra_key_bytes`].
pub const MAX_EXTRA_KEY_BYTES: usize = 4096;

/// How large a lookup may be (`--max-prompt-blocks`, `--max-prompt-tokens`,
/// `--max-candidates`, `--max-prompt-text-bytes`, `--max-extra-entries`,
/// `--max-extra-key-bytes`); one past them is refused naming the field and
/// the flag, and counted in `lookups_refused_total{limit}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LookupLimits {
    /// Block hashes in one lookup.
    pub max_prompt_blocks: usize,
    /// Token ids in one lookup.
    pub max_prompt_tokens: usize,
    /// Candidate replicas (LookupRoute) or pods (GetPodScores) named.
    pub max_candidates: usize,
    /// Bytes of prompt text (LookupRoute's `prompt_text`, GetPodScores'
    /// `prompt`), tokenized on the request path.
    pub max_prompt_text_bytes: usize,
    /// Multimodal items, and blocks of per-block extra keys.
    pub max_extra_entries: usize,
    /// Bytes of one cache salt, media identifier or extra key.
    pub max_extra_key_bytes: usize,
}

impl Default for LookupLimits {
    fn default() -> Self {
        Self {
            max_prompt_blocks: MAX_PROMPT_BLOCKS,
            max_prompt_tokens: MAX_PROMPT_TOKENS,
            max_candidates: MAX_CANDIDATES,
            max_prompt_text_bytes: MAX_PROMPT_TEXT_BYTES,
            max_extra_entries: MAX_EXTRA_ENTRIES,
            max_extra_key_bytes: MAX_EXTRA_KEY_BYTES,
        }
    }
}

/// The gRPC front end: the core, plus what only this transport needs
/// (who may call, the IngestEvents stream bounds, shutdown).
#[derive(Clone, Debug)]
pub struct IndexServer {
    core: Arc<IndexCore>,
    /// IngestEvents stream bounds.
    pub ingest: Arc<crate::streams::IngestControl>,
    /// Who may call what.
    pub access: Arc<ApiAccess>,
    /// Cancelled when the server stops: open ingest streams end at once
    /// (the subscribers reconnect elsewhere) instead of holding shutdown.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Readiness: a resync under way on a stream holds it back.
    pub readiness: Arc<crate::readiness::Readiness>,
    /// How large a lookup may be.
    pub limits: LookupLimits,
}

/// A request's `authorization` metadata, when it is text.
fn authorization<T>(request: &Request<T>) -> Option<&str> {
    request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
}

fn score(c: &Scored) -> pb::CandidateScore {
    pb::CandidateScore {
        replica: Some(pb::ReplicaRef {
            replica_id: c.replica.replica_id.clone(),
            address: c.address.clone(),
        }),
        ..score_of_figures(c)
    }
}

/// A candidate's figures, without its names.
fn score_of_figures(c: &Scored) -> pb::CandidateScore {
    pb::CandidateScore {
        replica: None,
        matched_tokens: u32::try_from(c.matched_tokens()).unwrap_or(u32::MAX),
        matched_blocks: c.matched_blocks,
        tier: ic_proto::tier::to_pb(c.tier),
        score: c.score,
        speculative: c.speculative,
        load: c.load.requests,
    }
}

/// [`score`] of a candidate the answer owns: its names move.
fn score_of(c: Scored) -> pb::CandidateScore {
    let figures = score_of_figures(&c);
    pb::CandidateScore {
        replica: Some(pb::ReplicaRef {
            replica_id: c.replica.replica_id,
            address: c.address,
        }),
        ..figures
    }
}

/// The core's decision as a protobuf answer: candidates are the replicas
/// holding part of the prompt, best first, at most `max_candidates` of them
/// (0: all). The decision is consumed, so the candidates' names move into
/// the answer instead of being copied.
fn response_of(decision: Ranked, max_candidates: u32) -> pb::LookupRouteResponse {
    let best = match (&decision.no_hint, decision.best()) {
        (None, Some(best)) => Some(score(best)),
        (Some(_), _) => decision.destination().map(score),
        (None, None) => None,
    };
    let candidates: Vec<pb::CandidateScore> = decision
        .ranked
        .into_iter()
        .filter(|s| s.matched_blocks > 0)
        .take(match max_candidates {
            0 => usize::MAX,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        })
        .map(score_of)
        .collect();
    let base = pb::LookupRouteResponse {
        block_size: decision.block_size,
        prompt_blocks: decision.prompt_blocks,
        candidates,
        best,
        ..Default::default()
    };
    match decision.no_hint {
        None if base.best.is_some() => pb::LookupRouteResponse {
            outcome: pb::LookupOutcome::PrefixMatch as i32,
            ..base
        },
        // With candidates named, NO_HINT still names where load alone sends
        // the request (and counted it as a pick).
        Some((reason, detail)) => pb::LookupRouteResponse {
            outcome: pb::LookupOutcome::NoHint as i32,
            no_hint_reason: reason_to_pb(reason) as i32,
            detail,
            ..base
        },
        None => pb::LookupRouteResponse {
            outcome: pb::LookupOutcome::NoHint as i32,
            no_hint_reason: pb::NoHintReason::NoEntry as i32,
            detail: "no replica to route to".into(),
            ..base
        },
    }
}

impl IndexServer {
    /// Who sent `request` (its `authorization` metadata); refusals are
    /// counted under `path`.
    pub(crate) async fn caller<T>(
        &self,
        request: &Request<T>,
        path: &'static str,
    ) -> Result<Caller, Status> {
        self.access
            .authenticate(authorization(request))
            .await
            .map_err(|d| self.refused(path, &d))
    }

    /// A lookup past one of [`LookupLimits`], counted under `limit`.
    pub(crate) fn over_limit(&self, limit: &'static str, detail: String) -> Status {
        self.core.metrics().lookup_refused(limit);
        Status::invalid_argument(detail)
    }

    /// Counts `denied` and turns it into the call's status.
    pub(crate) fn refused(&self, path: &'static str, denied: &crate::access::Denied) -> Status {
        self.core.metrics().access_refused(path, denied);
        denied.to_status()
    }

    /// A server over `index` with default policies and no tokenizers.
    pub fn new(index: Arc<Index>, default_block_size: u32, metrics: Metrics) -> Self {
        Self::over(Arc::new(IndexCore::new(index, default_block_size, metrics)))
    }

    /// The gRPC front end of `core`, open to anyone, with default stream
    /// bounds.
    pub fn over(core: Arc<IndexCore>) -> Self {
        Self {
            core,
            ingest: Arc::new(crate::streams::IngestControl::default()),
            access: Arc::new(ApiAccess::Open),
            shutdown: tokio_util::sync::CancellationToken::new(),
            readiness: crate::readiness::Readiness::new(std::time::Duration::ZERO),
            limits: LookupLimits::default(),
        }
    }

    /// The core this front end adapts.
    pub fn core(&self) -> &Arc<IndexCore> {
        &self.core
    }

    /// The index.
    pub fn index(&self) -> &Arc<Index> {
        self.core.index()
    }

    /// LookupRoute without gRPC: validate, route, convert. The budget
    /// starts now and covers tokenizing, fingerprinting and the walk.
    pub fn lookup(&self, req: &pb::LookupRouteRequest) -> Result<pb::LookupRouteResponse, Status> {
        let received = Instant::now();
        let scope = scope_from_pb(req.scope.as_ref(), "scope").map_err(Status::invalid_argument)?;
        self.lookup_with(req, scope, None, received)
    }

    /// [`Self::lookup`] of a request the caller gives up: its scope's names
    /// and its block hashes move into the query (the hashes become the
    /// prompt's fingerprints in place), not copied.
    pub fn lookup_owned(
        &self,
        mut req: pb::LookupRouteRequest,
    ) -> Result<pb::LookupRouteResponse, Status> {
        let received = Instant::now();
        let scope =
            scope_from_pb_owned(req.scope.take(), "scope").map_err(Status::invalid_argument)?;
        let hashes = match &mut req.key {
            Some(pb::lookup_route_request::Key::BlockHashes(b)) => {
                Some(std::mem::take(&mut b.hashes))
            }
            _ => None,
        };
        self.lookup_with(&req, scope, hashes, received)
    }

    /// [`Self::lookup`] in `scope` (`req`'s, validated), received at
    /// `received`, the block hashes taken from `hashes` when given (`req`'s
    /// are then not read).
    fn lookup_with(
        &self,
        req: &pb::LookupRouteRequest,
        scope: ic_index::Scope,
        hashes: Option<Vec<u64>>,
        received: Instant,
    ) -> Result<pb::LookupRouteResponse, Status> {
        let limits = self.limits;
        if req.candidate_replicas.len() > limits.max_candidates {
            return Err(self.over_limit(
                "candidates",
                format!(
                    "candidate_replicas: at most {} entries (--max-candidates)",
                    limits.max_candidates
                ),
            ));
        }
        let extras = crate::convert::extras_from_pb(req, &limits).map_err(|e| match e.limit {
            Some(limit) => self.over_limit(limit, e.detail),
            None => Status::invalid_argument(e.detail),
        })?;
        let candidates: Option<HashSet<String>> = (!req.candidate_replicas.is_empty())
            .then(|| req.candidate_replicas.iter().cloned().collect());
        use pb::lookup_route_request::Key;
        let blocks: Vec<Fingerprint>;
        let prompt = match &req.key {
            None => {
                return Err(Status::invalid_argument(
                    "key: one of prefix_hash, block_hashes, token_ids, prompt_text is required",
                ));
            }
            // Fingerprints carry the adapter already; a scope naming one
            // as well was silently not applied: refused, not guessed.
            Some(Key::PrefixHash(_) | Key::BlockHashes(_)) if !scope.adapter.is_empty() => {
                return Err(Status::invalid_argument(
                    "scope.adapter: only with token_ids or prompt_text; prefix_hash and \
                     block_hashes are fingerprints computed with the adapter already (leave \
                     scope.adapter empty; see docs/fingerprints.md)",
                ));
            }
            Some(Key::PrefixHash(fp)) => Prompt::PrefixHash(Fingerprint(*fp)),
            Some(Key::BlockHashes(b)) => {
                let hashes = hashes.unwrap_or_else(|| b.hashes.clone());
                if hashes.len() > limits.max_prompt_blocks {
                    return Err(self.over_limit(
                        "prompt_blocks",
                        format!(
                            "block_hashes.hashes: at most {} blocks (--max-prompt-blocks)",
                            limits.max_prompt_blocks
                        ),
                    ));
                }
                // In place: a `Fingerprint` is its `u64`.
                blocks = Fingerprint::from_raw(hashes);
                Prompt::Blocks(&blocks)
            }
            Some(Key::TokenIds(t)) => {
                if t.ids.len() > limits.max_prompt_tokens {
                    return Err(self.over_limit(
                        "prompt_tokens",
                        format!(
                            "token_ids.ids: at most {} tokens (--max-prompt-tokens)",
                            limits.max_prompt_tokens
                        ),
                    ));
                }
                Prompt::Tokens(&t.ids)
            }
            Some(Key::PromptText(text)) => {
                if text.len() > limits.max_prompt_text_bytes {
                    return Err(self.over_limit(
                        "prompt_text_bytes",
                        format!(
                            "prompt_text: at most {} bytes (--max-prompt-text-bytes)",
                            limits.max_prompt_text_bytes
                        ),
                    ));
                }
                Prompt::Text(text)
            }
        };
        // Holders past `max_candidates` are scored but not answered: not
        // copied either.
        let holders = match req.max_candidates {
            0 => usize::MAX,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let routed = self.core.route_top(
            &RouteRequest {
                scope: &scope,
                prompt,
                candidates: candidates.as_ref(),
                extras: extras.as_ref(),
                received,
                purpose: Purpose::Hint {
                    record_pick: !req.observe_only,
                },
            },
            holders,
        );
        let decision = match routed {
            Ok(Routed::Hint(decision)) => decision,
            Ok(_) => return Err(Status::internal("the core answered another purpose")),
            Err(RouteError::Tokenize(e @ EncodeError::NoTokenizer(_))) => {
                return Err(Status::failed_precondition(e.to_string()));
            }
            Err(e) => return Err(Status::invalid_argument(e.to_string())),
        };
        let response = response_of(decision, req.max_candidates);
        self.core
            .metrics()
            .record_lookup(&response, received.elapsed());
        Ok(response)
    }
}

impl IndexServer {
    /// Validates, classifies and applies one IngestEvents batch of
    /// `stream`: the path every batch takes after transport and access
    /// checks (the fuzz targets drive it directly). `Err` names why the
    /// batch was refused or the stream would end.
    pub fn apply_batch(
        &self,
        stream: &mut IngestStream,
        batch: pb::IngestBatch,
    ) -> Result<(), String> {
        let facts = engine_facts(&batch);
        let step = stream.accept(batch).map_err(|e| e.0)?;
        self.core.ingest(step, facts).map_err(|end| match end {
            StepEnd::Resync(detail) => format!("resync required: {detail}"),
            StepEnd::Refused(limit, detail) => format!("refused ({}): {detail}", limit.label()),
        })
    }
}

#[tonic::async_trait]
impl IndexService for IndexServer {
    async fn lookup_route(
        &self,
        request: Request<pb::LookupRouteRequest>,
    ) -> Result<Response<pb::LookupRouteResponse>, Status> {
        // Borrowed: the span's fields are formatted only when it is enabled.
        let scope = request.get_ref().scope.as_ref();
        let span = tracing::debug_span!(
            "LookupRoute",
            otel.kind = "server",
            rpc.system = "grpc",
            tenant = scope.map_or("", |s| s.tenant.as_str()),
            model = scope.map_or("", |s| s.model.as_str()),
            outcome = tracing::field::Empty,
            best = tracing::field::Empty,
            matched_blocks = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        if !span.is_disabled() {
            ic_telemetry::otel::adopt(
                &span,
                ic_telemetry::otel::parent_from_metadata(request.metadata()),
            );
        }
        let is_text = matches!(
            request.get_ref().key,
            Some(pb::lookup_route_request::Key::PromptText(_))
        );
        // Open and static-token callers are known at once, and may look up
        // any namespace: a prompt that needs no tokenizing is answered
        // without awaiting anything. The rest waits in a future of its own,
        // so this one (moved by value into tonic's boxes) stays small.
        let result = match self.access.authenticate_now(authorization(&request)) {
            Some(Ok(Caller::Unrestricted)) if !is_text => {
                let _entered = span.enter();
                self.lookup_answered(request.into_inner())
            }
            Some(Err(denied)) => Err(self.refused("lookup", &denied)),
            _ => Box::pin(self.lookup_route_checked(request).instrument(span.clone())).await,
        };
        match &result {
            Ok(response) => {
                let r = response.get_ref();
                span.record("outcome", r.outcome().as_str_name());
                if let Some(best) = &r.best {
                    span.record("matched_blocks", i64::from(best.matched_blocks));
                    if let Some(replica) = &best.replica {
                        span.record("best", replica.replica_id.as_str());
                    }
                }
            }
            Err(status) => {
                span.record("otel.status_code", "ERROR");
                span.record("outcome", status.code().description());
            }
        }
        result
    }

    async fn ingest_events(
        &self,
        request: Request<Streaming<pb::IngestBatch>>,
    ) -> Result<Response<pb::IngestAck>, Status> {
        self.ingest_stream(request).await
    }

    async fn set_policies(
        &self,
        request: Request<pb::SetPoliciesRequest>,
    ) -> Result<Response<pb::SetPoliciesResponse>, Status> {
        let span = tracing::debug_span!("SetPolicies", otel.kind = "server", rpc.system = "grpc");
        ic_telemetry::otel::adopt(
            &span,
            ic_telemetry::otel::parent_from_metadata(request.metadata()),
        );
        self.replace_policies(request).instrument(span).await
    }
}

impl IndexServer {
    async fn lookup_route_checked(
        &self,
        request: Request<pb::LookupRouteRequest>,
    ) -> Result<Response<pb::LookupRouteResponse>, Status> {
        let caller = self.caller(&request, "lookup").await?;
        if let Some(scope) = &request.get_ref().scope
            && !scope.tenant.is_empty()
        {
            self.access
                .authorize_lookup(&caller, &scope.tenant)
                .await
                .map_err(|d| self.refused("lookup", &d))?;
        }
        let is_text = matches!(
            request.get_ref().key,
            Some(pb::lookup_route_request::Key::PromptText(_))
        );
        if is_text {
            // Tokenizing a long prompt is CPU work: keep it off the runtime's
            // I/O threads.
            let server = self.clone();
            tokio::task::spawn_blocking(move || server.lookup_answered(request.into_inner()))
                .await
                .map_err(|e| Status::internal(format!("lookup task failed: {e}")))?
        } else {
            self.lookup_answered(request.into_inner())
        }
    }

    /// [`Self::lookup_owned`] as the call's answer, its errors counted.
    fn lookup_answered(
        &self,
        request: pb::LookupRouteRequest,
    ) -> Result<Response<pb::LookupRouteResponse>, Status> {
        match self.lookup_owned(request) {
            Ok(response) => Ok(Response::new(response)),
            Err(status) => {
                self.core.metrics().lookup_errors.inc();
                Err(status)
            }
        }
    }

    async fn ingest_stream(
        &self,
        request: Request<Streaming<pb::IngestBatch>>,
    ) -> Result<Response<pb::IngestAck>, Status> {
        let caller = self.caller(&request, "ingest").await?;
        // Per pod (pod-bound token) or identity; anonymous callers by
        // their peer address.
        let client = caller.client_key().unwrap_or_else(|| {
            request
                .remote_addr()
                .map_or_else(|| "addr:unknown".to_owned(), |a| format!("addr:{}", a.ip()))
        });
        let metrics = self.core.metrics();
        let _permit = self.ingest.admit(client).map_err(|refusal| {
            metrics.ingest_refused(refusal.label());
            Status::resource_exhausted(refusal.detail(&self.ingest))
        })?;
        let mut stream = request.into_inner();
        let mut state = IngestStream::with_limits(self.ingest.limits.clone());
        let mut last_applied_seq = 0;
        metrics.ingest_streams.inc();
        let _open = StreamGuard(metrics);
        let idle = self.ingest.idle_timeout;
        // Per rank, held from its resync's first batch to its last (or the
        // stream's end): a stream may carry several ranks' resyncs at once.
        // At most --max-ranks-per-stream (and one being refused).
        let mut resyncs: Vec<(ic_index::ReplicaKey, crate::readiness::ResyncUnderWay)> = Vec::new();
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(idle, stream.message()) => next,
                () = self.shutdown.cancelled() => {
                    return Err(Status::unavailable("the index server is stopping; reconnect"));
                }
            };
            let Ok(next) = next else {
                metrics.ingest_refused("idle");
                return Err(Status::deadline_exceeded(format!(
                    "no batch for {} s (--ingest-idle-timeout-seconds)",
                    idle.as_secs()
                )));
            };
            // A batch over --grpc-max-message-bytes ends the stream with
            // gRPC's own status, counted as it leaves (`message_bound`).
            let Some(batch) = next? else { break };
            let seq = batch.seq;
            let resync_end = batch.resync_end;
            let rank = (batch.resync_begin || resync_end)
                .then(|| rank_of(&batch))
                .flatten();
            if let Some(rank) = &rank
                && batch.resync_begin
                && !resyncs.iter().any(|(r, _)| r == rank)
            {
                resyncs.push((rank.clone(), self.readiness.resync_begun()));
            }
            match self.ingest_one(&caller, &mut state, batch).await? {
                Ok(()) => {
                    last_applied_seq = seq;
                    if let Some(rank) = rank
                        && resync_end
                    {
                        resyncs.retain(|(r, _)| *r != rank);
                    }
                }
                Err(detail) => {
                    return Ok(Response::new(pb::IngestAck {
                        last_applied_seq,
                        resync_required: true,
                        detail,
                    }));
                }
            }
        }
        Ok(Response::new(pb::IngestAck {
            last_applied_seq,
            ..Default::default()
        }))
    }

    /// One batch of a stream: check the caller may write the replica,
    /// convert, hand it to the core. `Ok(Err(detail))` asks the subscriber
    /// to resync; `Err` ends the stream.
    async fn ingest_one(
        &self,
        caller: &Caller,
        state: &mut IngestStream,
        batch: pb::IngestBatch,
    ) -> Result<Result<(), String>, Status> {
        let metrics = self.core.metrics();
        // Only batches the subscriber traced (it sends a context with
        // deltas and resyncs, not heartbeats) get a span here.
        let span = if batch.trace_context.is_empty() {
            tracing::Span::none()
        } else {
            let span = tracing::debug_span!(
                "ingest_batch",
                otel.kind = "consumer",
                replica = batch.replica.as_ref().map_or("", |r| r.replica_id.as_str()),
                seq = i64::try_from(batch.seq).unwrap_or(i64::MAX),
                events = i64::try_from(batch.events.len()).unwrap_or(i64::MAX),
                resync_begin = batch.resync_begin,
                resync_end = batch.resync_end,
                outcome = tracing::field::Empty,
            );
            ic_telemetry::otel::adopt(
                &span,
                ic_telemetry::otel::parent_from_map(&batch.trace_context),
            );
            span
        };
        let _entered = span.enter();
        if let Some(replica) = &batch.replica {
            let tenant = replica.scope.as_ref().map_or("", |s| s.tenant.as_str());
            ApiAccess::authorize_ingest(caller, tenant, &replica.replica_id)
                .map_err(|d| self.refused("ingest", &d))?;
        }
        let facts = engine_facts(&batch);
        let step = state.accept(batch).map_err(|e| {
            metrics.ingest_batch("invalid");
            Status::invalid_argument(e.0)
        })?;
        let applied = if step.weight() > BLOCKING_STEP_BLOCKS {
            // A resync or a large batch is milliseconds of CPU: off the
            // runtime's I/O threads, so that lookups sharing a worker
            // are not held behind it.
            let core = self.core.clone();
            tokio::task::spawn_blocking(move || core.ingest(step, facts))
                .await
                .map_err(|e| Status::internal(format!("ingest task failed: {e}")))?
        } else {
            self.core.ingest(step, facts)
        };
        span.record(
            "outcome",
            match &applied {
                Ok(()) => "applied",
                Err(StepEnd::Resync(_)) => "resync_required",
                Err(StepEnd::Refused(..)) => "refused",
            },
        );
        match applied {
            Ok(()) => {
                metrics.ingest_batch("applied");
                Ok(Ok(()))
            }
            Err(StepEnd::Resync(detail)) => {
                metrics.ingest_batch("resync_required");
                tracing::info!(%detail, "asking a subscriber to resync");
                Ok(Err(detail))
            }
            Err(StepEnd::Refused(limit, detail)) => {
                metrics.ingest_batch("refused");
                metrics.ingest_refused(limit.label());
                tracing::warn!(%detail, limit = limit.label(), "ingest stream refused");
                Err(Status::resource_exhausted(detail))
            }
        }
    }

    async fn replace_policies(
        &self,
        request: Request<pb::SetPoliciesRequest>,
    ) -> Result<Response<pb::SetPoliciesResponse>, Status> {
        let caller = self.caller(&request, "set_policies").await?;
        ApiAccess::authorize_set_policies(&caller).map_err(|d| self.refused("set_policies", &d))?;
        let push = request.get_ref();
        let policies = Policies::from_request(&push.policies, &push.objectives)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let applied = u32::try_from(policies.len()).unwrap_or(u32::MAX);
        if self.core.routing().by_ttft() {
            for p in push
                .policies
                .iter()
                .filter(|p| p.score_load_weight.is_some() || p.score_kv_usage_weight.is_some())
            {
                tracing::warn!(
                    namespace = %p.namespace,
                    "CachePolicy scoring sets loadWeight or kvUsageWeight, which scoring \
                     by TTFT does not use (--ttft-prefill-tokens-per-second=0 scores by them)"
                );
            }
        }
        self.core.set_policies(policies);
        self.readiness.policies_pushed();
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
