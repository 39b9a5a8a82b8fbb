//! The `IndexService` gRPC handlers: thin adapters that validate, call the
//! routing core ([`ic_index::route`]) or the ingest protocol
//! ([`ic_index::ingest`]) and convert.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use ic_index::pick::Scored;
use ic_index::route::{NoHintReason, Ranked, RouteKey, RouteQuery, scope_tag};
use ic_index::{Change, Deadline, Index, ReplicaKey};
use ic_proto::IndexService;
use ic_proto::index_v1 as pb;
use parking_lot::RwLock;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

use crate::access::{ApiAccess, Caller};
use crate::convert::scope_from_pb;
use crate::ingest::{IngestStream, Step};
use crate::metrics::Metrics;
use crate::policy::Policies;
use crate::routing::Routing;
use crate::tokenize::{EncodeError, Tokenizers};

/// Ingest steps of more blocks than this run on the blocking pool.
const BLOCKING_STEP_BLOCKS: u64 = 4096;

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
    /// Load board, speculative holders and scoring weights.
    pub routing: Arc<Routing>,
    /// Each replica's latest KV cache size, as its engine reports it.
    pub engine_reports: Arc<EngineReports>,
    /// IngestEvents stream bounds.
    pub ingest: Arc<crate::streams::IngestControl>,
    /// Who may call what.
    pub access: Arc<ApiAccess>,
    /// Cancelled when the server stops: open ingest streams end at once
    /// (the subscribers reconnect elsewhere) instead of holding shutdown.
    pub shutdown: tokio_util::sync::CancellationToken,
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
pub struct EngineReports(parking_lot::Mutex<std::collections::HashMap<ReplicaKey, EngineReport>>);

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
        present: &std::collections::HashSet<&ReplicaKey>,
    ) -> std::collections::HashMap<ReplicaKey, EngineReport> {
        let mut map = self.0.lock();
        map.retain(|k, _| present.contains(k));
        map.clone()
    }
}

/// Why an ingest stream must end after a batch.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StepEnd {
    /// Ask the subscriber to resync, with this detail.
    Resync(String),
    /// A bound was reached.
    Refused(ic_index::ingest::Limit, String),
}

/// A lookup's budget on the monotonic clock.
pub(crate) struct Until(pub(crate) Instant);

impl Deadline for Until {
    fn expired(&self) -> bool {
        Instant::now() >= self.0
    }
}

fn score(c: &Scored) -> pb::CandidateScore {
    pb::CandidateScore {
        replica: Some(pb::ReplicaRef {
            replica_id: c.replica.replica_id.clone(),
            address: c.address.clone(),
        }),
        matched_blocks: c.matched_blocks,
        matched_tokens: u32::try_from(c.matched_tokens()).unwrap_or(u32::MAX),
        tier: ic_proto::tier::to_pb(c.tier),
        score: c.score,
        speculative: c.speculative,
        load: c.load.requests,
    }
}

fn reason_to_pb(reason: NoHintReason) -> pb::NoHintReason {
    match reason {
        NoHintReason::UnknownModel => pb::NoHintReason::UnknownModel,
        NoHintReason::PromptTooShort => pb::NoHintReason::PromptTooShort,
        NoHintReason::NoEntry => pb::NoHintReason::NoEntry,
        NoHintReason::BelowMinimumPrefix => pb::NoHintReason::BelowMinimumPrefix,
        NoHintReason::LookupTimeout => pb::NoHintReason::LookupTimeout,
        NoHintReason::LoadBound => pb::NoHintReason::LoadBound,
    }
}

/// The routing core's decision on the wire: candidates are the replicas
/// holding part of the prompt, best first.
fn response_of(decision: &Ranked) -> pb::LookupRouteResponse {
    let candidates: Vec<pb::CandidateScore> = decision
        .ranked
        .iter()
        .filter(|s| s.matched_blocks > 0)
        .map(score)
        .collect();
    let base = pb::LookupRouteResponse {
        block_size: decision.block_size,
        prompt_blocks: decision.prompt_blocks,
        candidates,
        ..Default::default()
    };
    match (&decision.no_hint, decision.best()) {
        (None, Some(best)) => pb::LookupRouteResponse {
            outcome: pb::LookupOutcome::PrefixMatch as i32,
            best: Some(score(best)),
            ..base
        },
        (Some((reason, detail)), _) => pb::LookupRouteResponse {
            outcome: pb::LookupOutcome::NoHint as i32,
            no_hint_reason: reason_to_pb(*reason) as i32,
            detail: detail.clone(),
            ..base
        },
        (None, None) => pb::LookupRouteResponse {
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
        let authorization = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        self.access
            .authenticate(authorization)
            .await
            .map_err(|d| self.refused(path, &d))
    }

    /// Counts `denied` and turns it into the call's status.
    pub(crate) fn refused(&self, path: &'static str, denied: &crate::access::Denied) -> Status {
        self.metrics.access_refused(path, denied);
        denied.to_status()
    }

    /// A server over `index` with default policies and no tokenizers.
    pub fn new(index: Arc<Index>, default_block_size: u32, metrics: Metrics) -> Self {
        Self {
            index,
            policies: Arc::new(RwLock::new(Policies::default())),
            default_block_size,
            metrics,
            tokenizers: Arc::new(Tokenizers::default()),
            routing: Arc::new(Routing::default()),
            engine_reports: Arc::new(EngineReports::default()),
            ingest: Arc::new(crate::streams::IngestControl::default()),
            access: Arc::new(ApiAccess::Open),
            shutdown: tokio_util::sync::CancellationToken::new(),
        }
    }

    /// LookupRoute without gRPC: validate, route, convert.
    pub fn lookup(&self, req: &pb::LookupRouteRequest) -> Result<pb::LookupRouteResponse, Status> {
        let scope = scope_from_pb(req.scope.as_ref(), "scope").map_err(Status::invalid_argument)?;
        self.lookup_in(scope, req)
    }

    /// LookupRoute for an already validated scope; the functional probe
    /// calls it directly for its own (otherwise unreachable) tenant. The
    /// budget starts now and covers tokenizing, fingerprinting and the walk.
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
        let deadline = Until(started + policy.lookup_timeout);
        let extras = crate::convert::extras_from_pb(req).map_err(Status::invalid_argument)?;
        let candidates: Option<HashSet<String>> = (!req.candidate_replicas.is_empty())
            .then(|| req.candidate_replicas.iter().cloned().collect());
        use pb::lookup_route_request::Key;
        let tokens;
        let key = match &req.key {
            None => {
                return Err(Status::invalid_argument(
                    "key: one of prefix_hash, block_hashes, token_ids, prompt_text is required",
                ));
            }
            Some(Key::PrefixHash(fp)) => RouteKey::PrefixHash(*fp),
            Some(Key::BlockHashes(b)) => {
                if b.hashes.len() > MAX_PROMPT_BLOCKS {
                    return Err(Status::invalid_argument(format!(
                        "block_hashes.hashes: at most {MAX_PROMPT_BLOCKS} blocks"
                    )));
                }
                RouteKey::Blocks(&b.hashes)
            }
            Some(Key::TokenIds(t)) => {
                if t.ids.len() > MAX_PROMPT_TOKENS {
                    return Err(Status::invalid_argument(format!(
                        "token_ids.ids: at most {MAX_PROMPT_TOKENS} tokens"
                    )));
                }
                RouteKey::Tokens(&t.ids)
            }
            Some(Key::PromptText(text)) => {
                tokens = self
                    .tokenizers
                    .encode(&scope.model, text)
                    .map_err(|e| match e {
                        EncodeError::NoTokenizer(_) => Status::failed_precondition(e.to_string()),
                        EncodeError::TooLong
                        | EncodeError::Failed(_)
                        | EncodeError::NoChatTemplate(_)
                        | EncodeError::Template(_) => Status::invalid_argument(e.to_string()),
                    })?;
                RouteKey::Tokens(&tokens)
            }
        };
        let query = RouteQuery {
            scope: &scope,
            key,
            candidates: candidates.as_ref(),
            extras: extras.as_ref(),
        };
        let now_ms = ic_clock::unix_ms();
        let decision = self.routing.decide(
            &self.index,
            &query,
            &policy,
            self.default_block_size,
            now_ms,
            &deadline,
            None,
        );
        let response = response_of(&decision);
        // A gateway that follows `best` sends the request there: count it
        // in the load and as a speculative holder of the prompt.
        if let Some(best) = decision.best().filter(|_| !req.observe_only) {
            let blocks: &[u64] = match query.key {
                RouteKey::PrefixHash(_) => &[],
                _ => &decision.blocks,
            };
            self.routing
                .picked(scope_tag(&scope), &best.replica.replica_id, blocks, now_ms);
        }
        self.metrics.record_lookup(&response, started.elapsed());
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
        now: i64,
    ) -> Result<(), String> {
        let step = stream.accept(batch).map_err(|e| e.0)?;
        self.apply_step(step, now).map_err(|end| match end {
            StepEnd::Resync(detail) => format!("resync required: {detail}"),
            StepEnd::Refused(limit, detail) => format!("refused ({}): {detail}", limit.label()),
        })
    }

    /// Applies one classified ingest batch to the index (the one path both
    /// IngestEvents and the functional probe use). `Err` when the stream
    /// must end.
    pub(crate) fn apply_step(&self, step: Step, now: i64) -> Result<(), StepEnd> {
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
                self.confirm_speculation(&scope, &key.replica_id, &changes);
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
                self.confirm_speculation(&scope, &key.replica_id, &changes);
            }
            Step::ResyncRequired(detail) => return Err(StepEnd::Resync(detail)),
            Step::Refused(limit, detail) => return Err(StepEnd::Refused(limit, detail)),
        }
        Ok(())
    }

    /// The engine's own word replaces the replica's speculative holding:
    /// stored blocks are now real, evicted ones are gone, a cleared tier
    /// ends every speculation of the replica.
    fn confirm_speculation(&self, scope: &ic_index::Scope, replica_id: &str, changes: &[Change]) {
        let tag = scope_tag(scope);
        for change in changes {
            match change {
                Change::Stored { fingerprints, .. } | Change::Evicted { fingerprints } => {
                    self.routing.confirm(tag, replica_id, fingerprints);
                }
                Change::Cleared { .. } => self.routing.forget_speculation(replica_id),
            }
        }
    }
}

#[tonic::async_trait]
impl IndexService for IndexServer {
    async fn lookup_route(
        &self,
        request: Request<pb::LookupRouteRequest>,
    ) -> Result<Response<pb::LookupRouteResponse>, Status> {
        let scope = request.get_ref().scope.clone().unwrap_or_default();
        let span = tracing::debug_span!(
            "LookupRoute",
            otel.kind = "server",
            rpc.system = "grpc",
            tenant = %scope.tenant,
            model = %scope.model,
            outcome = tracing::field::Empty,
            best = tracing::field::Empty,
            matched_blocks = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        ic_telemetry::otel::adopt(
            &span,
            ic_telemetry::otel::parent_from_metadata(request.metadata()),
        );
        let result = self
            .lookup_route_checked(request)
            .instrument(span.clone())
            .await;
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

    async fn ingest_stream(
        &self,
        request: Request<Streaming<pb::IngestBatch>>,
    ) -> Result<Response<pb::IngestAck>, Status> {
        let caller = self.caller(&request, "ingest").await?;
        let client = caller.client_key().map_or_else(
            || {
                request
                    .remote_addr()
                    .map_or_else(|| "unknown".to_owned(), |a| a.ip().to_string())
            },
            str::to_owned,
        );
        let _permit = self.ingest.admit(client).map_err(|refusal| {
            self.metrics.ingest_refused(refusal.label());
            Status::resource_exhausted(refusal.detail(&self.ingest))
        })?;
        let mut stream = request.into_inner();
        let mut state = IngestStream::with_limits(self.ingest.limits.clone());
        let mut last_applied_seq = 0;
        self.metrics.ingest_streams.inc();
        let _open = scopeguard(&self.metrics);
        let idle = self.ingest.idle_timeout;
        loop {
            let next = tokio::select! {
                next = tokio::time::timeout(idle, stream.message()) => next,
                () = self.shutdown.cancelled() => {
                    return Err(Status::unavailable("the index server is stopping; reconnect"));
                }
            };
            let Ok(next) = next else {
                self.metrics.ingest_refused("idle");
                return Err(Status::deadline_exceeded(format!(
                    "no batch for {} s (--ingest-idle-timeout-seconds)",
                    idle.as_secs()
                )));
            };
            let Some(batch) = next? else { break };
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
            let seq = batch.seq;
            let engine_load = batch.engine_load.zip(batch.replica.as_ref()).map(|(l, r)| {
                (
                    r.replica_id.clone(),
                    ic_index::load::EngineLoad {
                        waiting: l.waiting,
                        running: l.running,
                        kv_usage: if l.kv_usage.is_finite() {
                            l.kv_usage.clamp(0.0, 1.0)
                        } else {
                            0.0
                        },
                    },
                )
            });
            let report = batch.replica.as_ref().and_then(|r| {
                let tenant = r.scope.as_ref()?.tenant.clone();
                Some((
                    ReplicaKey {
                        tenant,
                        replica_id: r.replica_id.clone(),
                        dp_rank: r.dp_rank,
                    },
                    batch.engine_cache,
                    batch.history_incomplete,
                ))
            });
            if let Some(replica) = &batch.replica {
                let tenant = replica.scope.as_ref().map_or("", |s| s.tenant.as_str());
                ApiAccess::authorize_ingest(&caller, tenant, &replica.replica_id)
                    .map_err(|d| self.refused("ingest", &d))?;
            }
            let step = state.accept(batch).map_err(|e| {
                self.metrics.ingest_batch("invalid");
                Status::invalid_argument(e.0)
            })?;
            let applied = if step.weight() > BLOCKING_STEP_BLOCKS {
                // A resync or a large batch is milliseconds of CPU: off the
                // runtime's I/O threads, so that lookups sharing a worker
                // are not held behind it.
                let server = self.clone();
                tokio::task::spawn_blocking(move || server.apply_step(step, ic_clock::unix_ms()))
                    .await
                    .map_err(|e| Status::internal(format!("ingest task failed: {e}")))?
            } else {
                self.apply_step(step, ic_clock::unix_ms())
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
                Ok(()) => {}
                Err(StepEnd::Resync(detail)) => {
                    self.metrics.ingest_batch("resync_required");
                    tracing::info!(%detail, "asking a subscriber to resync");
                    return Ok(Response::new(pb::IngestAck {
                        last_applied_seq,
                        resync_required: true,
                        detail,
                    }));
                }
                Err(StepEnd::Refused(limit, detail)) => {
                    self.metrics.ingest_batch("refused");
                    self.metrics.ingest_refused(limit.label());
                    tracing::warn!(%detail, limit = limit.label(), "ingest stream refused");
                    return Err(Status::resource_exhausted(detail));
                }
            }
            self.metrics.ingest_batch("applied");
            if let Some((key, cache, incomplete)) = report {
                self.engine_reports.report(key, cache, incomplete);
            }
            if let Some((replica_id, load)) = engine_load {
                self.routing
                    .report_engine(&replica_id, load, ic_clock::unix_ms());
            }
            self.metrics.set_index_size(&self.index);
            last_applied_seq = seq;
        }
        Ok(Response::new(pb::IngestAck {
            last_applied_seq,
            ..Default::default()
        }))
    }

    async fn replace_policies(
        &self,
        request: Request<pb::SetPoliciesRequest>,
    ) -> Result<Response<pb::SetPoliciesResponse>, Status> {
        let caller = self.caller(&request, "set_policies").await?;
        ApiAccess::authorize_set_policies(&caller).map_err(|d| self.refused("set_policies", &d))?;
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
