//! The Gateway API Inference Extension endpoint picker: Envoy's
//! `envoy.service.ext_proc.v3.ExternalProcessor/Process`, one gRPC stream
//! per HTTP request. A thin adapter: it reads the request (headers, the
//! gateway's endpoint subset, the request's objective, the OpenAI body),
//! asks the core ([`IndexCore::route`], which tokenizes the prompt as the
//! engine will, decides over the pool's endpoints and falls back by load),
//! and answers with `x-gateway-destination-endpoint` (the pick, then
//! fallbacks by load; header and `envoy.lb` dynamic metadata), or refuses
//! (503 nothing to pick, 429 shed, 413 body too large). The response phase
//! ends the pick's in-flight count and reports the engine's usage.
//!
//! One picker may serve several InferencePools: each stream's pool is the
//! one its call's `x-inferencecache-pool` gRPC metadata names (the only
//! pool when there is one). A request's priority is its InferenceObjective's
//! (pushed by the controller; `--epp-objective` for objectives it has not
//! pushed), its shedding thresholds its namespace's CachePolicy's over the
//! flags.
//!
//! Message sequences handled, as Envoy sends them (docs/gateway-integration.md):
//! * headers only (`end_of_stream` on the headers): picked by load at once;
//! * `BUFFERED` (and `BUFFERED_PARTIAL`) body: headers answered "continue",
//!   the pick rides on the body response (the one body message, trailers
//!   or not);
//! * `FULL_DUPLEX_STREAMED` body: headers and chunks arrive without
//!   waiting; when the body ends (a chunk with `end_of_stream`, or the
//!   trailers) the headers response carries the pick, then every chunk is
//!   streamed back unchanged, then the trailers response;
//! * `STREAMED` body: Envoy forwards the headers once answered, so the pick
//!   is made from the headers (by load), then the chunks pass through;
//! * the response: headers, body chunks (each streamed back unchanged in
//!   `FULL_DUPLEX_STREAMED`, left as they are otherwise), trailers.
//!
//! A request the picker cannot read (bad JSON, no tokenizer, images) is
//! still routed, by load: the engine answers a bad request better than a
//! gateway error would.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
    external_processor_server::{ExternalProcessor, ExternalProcessorServer},
    processing_request, processing_response,
};
use envoy_types::pb::envoy::r#type::v3::StatusCode;
use futures::Stream;
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

#[path = "epp_budget.rs"]
mod budget;
#[path = "epp_decide.rs"]
mod decide;
#[path = "epp_scope.rs"]
mod scope;

pub use crate::epp_config::PoolConfig;
use crate::epp_config::{MESSAGE_OVERHEAD_BYTES, select_pool};
use crate::epp_observed::{EndpointStats, Observations, ObservedResponse};
use crate::epp_usage::{Usage, UsageReader};
use crate::epp_wire::{self as wire, OBJECTIVE_HEADER, POOL_METADATA};
use crate::index_core::IndexCore;

pub use crate::epp_wire::{DESTINATION, SUBSET_KEY, SUBSET_NAMESPACE};
pub use scope::PoolCache;

/// The endpoint picker service.
#[derive(Clone, Debug)]
pub struct EndpointPicker {
    core: Arc<IndexCore>,
    /// The pool of the stream at hand (a stream's clone is given its own).
    pool: Arc<PoolConfig>,
    pools: Arc<Vec<Arc<PoolConfig>>>,
    observed: Arc<parking_lot::Mutex<Observations>>,
    /// The bytes of bodies held across every stream (all pools).
    bodies: Arc<budget::BodyBudget>,
}

impl EndpointPicker {
    /// A picker over `core` choosing among `pool`'s endpoints.
    pub fn new(core: Arc<IndexCore>, pool: PoolConfig) -> Self {
        Self::serving(core, vec![pool])
    }

    /// A picker over `core` serving each of `pools` (at least one).
    ///
    /// # Panics
    /// When `pools` is empty (the flags never resolve to none).
    pub fn serving(core: Arc<IndexCore>, pools: Vec<PoolConfig>) -> Self {
        let pools: Vec<Arc<PoolConfig>> = pools.into_iter().map(Arc::new).collect();
        let pool = pools.first().cloned().expect("at least one pool");
        let bodies = Arc::new(budget::BodyBudget::new(
            pool.max_held_body_bytes,
            core.metrics().epp_held_body_bytes.clone(),
        ));
        Self {
            core,
            pool,
            pools: Arc::new(pools),
            observed: Arc::default(),
            bodies,
        }
    }

    /// What the responses served by `replica_id` said: its prefill rate
    /// and cached share, for the TTFT estimate.
    pub fn observed(&self, replica_id: &str) -> Option<EndpointStats> {
        self.observed.lock().get(replica_id)
    }

    /// The gRPC service, its message limit fitting the largest body read
    /// (a BUFFERED body comes in one message).
    pub fn into_server(self) -> ExternalProcessorServer<Self> {
        let body = self.pools.iter().map(|p| p.max_body_bytes).max();
        let limit = body.unwrap_or(self.pool.max_body_bytes) + MESSAGE_OVERHEAD_BYTES;
        ExternalProcessorServer::new(self).max_decoding_message_size(limit)
    }
}

/// Most endpoints whose responses are remembered (a pool is far smaller).
const OBSERVED_MAX_ENDPOINTS: usize = 4096;

/// A pick: the endpoints in preference order (the pick first), the
/// load-board key of each, and the in-flight count the pick took on the
/// first (ended if the pick is dropped before its stream takes it).
#[derive(Debug)]
struct Pick {
    endpoints: Vec<String>,
    replica_ids: Vec<String>,
    in_flight: InFlight,
}

/// Why no endpoint was picked.
#[derive(Clone, Debug, PartialEq, Eq)]
enum NoEndpoint {
    /// The pool (or the gateway's subset of it) has no endpoint: 503.
    Empty(String),
    /// Every eligible endpoint is saturated: 429, the client may retry.
    Saturated(String),
}

/// What one stream has seen so far.
#[derive(Debug, Default)]
struct Exchange {
    path: String,
    /// The trace the pick's span joins: the gateway's ext_proc call (its
    /// gRPC metadata) or else the client request's own headers.
    trace_context: std::collections::HashMap<String, String>,
    subset: Option<Vec<String>>,
    objective: Option<String>,
    mode: Option<BodySendMode>,
    response_mode: Option<BodySendMode>,
    body: Vec<u8>,
    /// FULL_DUPLEX_STREAMED chunks held until the pick: (bytes, end), and
    /// their bytes in all (read from the chunks themselves at the pick, so
    /// the body is held once).
    chunks: Vec<(Vec<u8>, bool)>,
    chunk_bytes: usize,
    too_large: bool,
    /// The body or chunks held, against the picker-wide budget; given
    /// back once the pick is made.
    held: budget::HeldBytes,
    /// The budget had no room for the next chunk: routed by load.
    over_budget: bool,
    /// Picked (or refused): the rest of the request passes through.
    decided: bool,
    /// When the pick was made, and whether the first response byte came.
    picked_at: Option<Instant>,
    first_byte_ms: Option<u64>,
    /// The response is an event stream: its first byte is the first token,
    /// so the time to it measures prefill (a whole JSON answer's first
    /// byte comes only once generation ends).
    streamed_response: bool,
    usage: Option<UsageReader>,
    response_ended: bool,
}

impl Exchange {
    /// Why the held body is not read, if it is not.
    fn unread_reason(&self) -> Option<&'static str> {
        if self.too_large {
            Some("too_large")
        } else if self.over_budget {
            Some("held_body_budget")
        } else {
            None
        }
    }
}

/// The picker's in-flight count of one request (the load board's
/// `started`): taken at the pick, moved to the endpoint the gateway reports
/// serving it, ended with the response or, failing that, when dropped. The
/// pick carries it until the stream takes it over, so a pick decided on a
/// blocking thread for a stream the gateway reset meanwhile (its reply
/// stream dropped, the pick with nobody to take it) leaves no count behind.
struct InFlight {
    core: Arc<IndexCore>,
    replica_id: Option<String>,
}

/// Only the replica: the core is shared, and its Debug is the whole index.
impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("replica_id", &self.replica_id)
            .finish_non_exhaustive()
    }
}

impl InFlight {
    /// The count `core` took on `replica_id`.
    fn taken(core: &Arc<IndexCore>, replica_id: String) -> Self {
        Self {
            core: Arc::clone(core),
            replica_id: Some(replica_id),
        }
    }

    /// Takes over `other`'s count (ending this one's, if any).
    fn take_over(&mut self, other: &mut Self) {
        self.end();
        self.replica_id = other.replica_id.take();
    }

    fn end(&mut self) {
        if let Some(id) = self.replica_id.take() {
            self.core.finished(&id);
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.end();
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for EndpointPicker {
    type ProcessStream = ResponseStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let stream_context: std::collections::HashMap<String, String> =
            ["traceparent", "tracestate"]
                .into_iter()
                .filter_map(|k| {
                    let v = request.metadata().get(k)?.to_str().ok()?;
                    Some((k.to_owned(), v.to_owned()))
                })
                .collect();
        let selector = request
            .metadata()
            .get(POOL_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let pool = select_pool(&self.pools, selector.as_deref());
        let mut incoming = request.into_inner();
        let picker = match pool {
            Ok(pool) => EndpointPicker {
                pool,
                ..self.clone()
            },
            Err(detail) => {
                // Answer the first message, as for any refusal.
                self.core.metrics().epp_refused("unknown_pool");
                tracing::warn!(%detail, "request refused");
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                tokio::spawn(async move {
                    if let Some(Ok(_)) = incoming.next().await {
                        let refusal = wire::refusal(StatusCode::ServiceUnavailable, &detail);
                        let _ = tx.send(Ok(refusal)).await;
                    }
                });
                return Ok(Response::new(Box::pin(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                )));
            }
        };
        let ex = Exchange {
            trace_context: stream_context,
            held: budget::HeldBytes::of(picker.bodies.clone()),
            ..Exchange::default()
        };
        Ok(Response::new(Box::pin(picker.replies(ex, incoming))))
    }
}

/// A stream's state between its messages.
struct Replying<S> {
    picker: EndpointPicker,
    ex: Exchange,
    incoming: S,
    in_flight: InFlight,
    /// Replies to the last message not yet sent.
    pending: std::collections::VecDeque<ProcessingResponse>,
    /// No message is read after the pending replies.
    ended: bool,
}

impl EndpointPicker {
    /// The replies of one stream, message by message, until the gateway
    /// half-closes, the stream breaks or the picker answers with an
    /// immediate response. Each message is handled when the reply stream
    /// is polled, in the gRPC stream's own task, as LookupRoute's handler
    /// runs: no task of its own, no channel between the two (each such
    /// hand-over may wake the other runtime thread and move the decision
    /// to a core whose caches are cold, docs/benchmarks.md). When the
    /// gateway resets the stream, the reply stream is dropped wherever it
    /// waits: its [`InFlight`] ends its count, and a pick still on a
    /// blocking thread ends its own when dropped there.
    fn replies<S>(
        self,
        ex: Exchange,
        incoming: S,
    ) -> impl Stream<Item = Result<ProcessingResponse, Status>> + Send + 'static
    where
        S: Stream<Item = Result<ProcessingRequest, Status>> + Send + Unpin + 'static,
    {
        let in_flight = InFlight {
            core: Arc::clone(&self.core),
            replica_id: None,
        };
        let state = Replying {
            picker: self,
            ex,
            incoming,
            in_flight,
            pending: std::collections::VecDeque::new(),
            ended: false,
        };
        futures::stream::unfold(state, |mut s| async move {
            loop {
                if let Some(reply) = s.pending.pop_front() {
                    if is_immediate(&reply) {
                        // The stream ends with it.
                        s.pending.clear();
                        s.ended = true;
                    }
                    return Some((Ok(reply), s));
                }
                if s.ended {
                    return None;
                }
                let message = s.incoming.next().await?;
                let Some(replies) = s.picker.handle(&mut s.ex, message, &mut s.in_flight).await
                else {
                    s.ended = true;
                    continue;
                };
                s.pending.extend(replies);
            }
        })
    }

    /// One message of a stream: its replies, or `None` when the stream
    /// ends (after the replies already pending).
    async fn handle(
        &self,
        ex: &mut Exchange,
        message: Result<ProcessingRequest, Status>,
        in_flight: &mut InFlight,
    ) -> Option<Vec<ProcessingResponse>> {
        let message = match message {
            Ok(m) => m,
            Err(status) if status.code() == tonic::Code::OutOfRange => {
                // A message over the gRPC limit (a BUFFERED body): say
                // so, rather than end the stream without a word.
                self.core.metrics().epp_refused("too_large");
                let detail = format!(
                    "the request body is over the endpoint picker's limit \
                     (--epp-max-body-bytes {}): {}",
                    self.pool.max_body_bytes,
                    status.message()
                );
                tracing::warn!(%detail, "request refused");
                return Some(vec![wire::refusal(StatusCode::PayloadTooLarge, &detail)]);
            }
            Err(status) => {
                tracing::debug!(%status, "ext_proc stream ended by the gateway");
                return None;
            }
        };
        if let Some(config) = &message.protocol_config {
            ex.mode = ex
                .mode
                .or_else(|| BodySendMode::try_from(config.request_body_mode).ok());
            ex.response_mode = ex
                .response_mode
                .or_else(|| BodySendMode::try_from(config.response_body_mode).ok());
        }
        if let Some(subset) = wire::subset_hint(&message) {
            ex.subset = Some(subset);
        }
        if let Some(served) = wire::served_endpoint(&message) {
            self.served_by(&served, ex, in_flight);
        }
        let replies = match message.request {
            Some(processing_request::Request::RequestHeaders(h)) => {
                self.on_headers(ex, &h, in_flight).await
            }
            Some(processing_request::Request::RequestBody(b)) => {
                self.on_body(ex, b, in_flight).await
            }
            Some(processing_request::Request::RequestTrailers(_)) => {
                self.on_trailers(ex, in_flight).await
            }
            Some(processing_request::Request::ResponseHeaders(h)) => {
                let content_type = wire::header(&h, "content-type");
                let reader = UsageReader::new(content_type.as_deref());
                ex.streamed_response = reader.is_event_stream();
                ex.usage = Some(reader);
                if h.end_of_stream {
                    self.response_ended(ex, in_flight);
                }
                vec![wire::response_headers()]
            }
            Some(processing_request::Request::ResponseBody(b)) => {
                self.on_response_body(ex, b, in_flight)
            }
            Some(processing_request::Request::ResponseTrailers(_)) => {
                self.response_ended(ex, in_flight);
                vec![wire::response_trailers()]
            }
            None => Vec::new(),
        };
        Some(replies)
    }

    async fn pick_or_refuse(
        &self,
        ex: &mut Exchange,
        body: Option<Vec<u8>>,
        in_flight: &mut InFlight,
    ) -> Result<Pick, ProcessingResponse> {
        ex.decided = true;
        let span = tracing::debug_span!(
            "pick_endpoint",
            otel.kind = "server",
            path = %ex.path,
            replica = tracing::field::Empty,
            outcome = tracing::field::Empty,
        );
        ic_telemetry::otel::adopt(
            &span,
            ic_telemetry::otel::parent_from_map(&ex.trace_context),
        );
        let priority = self
            .pool
            .priority(&self.core.policies(), ex.objective.as_deref());
        let decided = self
            .decide_placed(&ex.path, body, ex.subset.as_deref(), priority)
            .instrument(span.clone())
            .await;
        // Read: the body's bytes leave the budget (held chunks go back to
        // the gateway with the replies).
        ex.held.release();
        span.record(
            "outcome",
            match &decided {
                Ok(_) => "picked",
                Err(NoEndpoint::Empty(_)) => "no_endpoint",
                Err(NoEndpoint::Saturated(_)) => "saturated",
            },
        );
        let _entered = span.enter();
        match decided {
            Ok(mut pick) => {
                span.record("replica", pick.replica_ids[0].as_str());
                in_flight.take_over(&mut pick.in_flight);
                ex.picked_at = Some(Instant::now());
                Ok(pick)
            }
            Err(NoEndpoint::Empty(detail)) => {
                self.core.metrics().epp_refused("no_endpoint");
                tracing::warn!(%detail, "no endpoint to pick");
                Err(wire::refusal(StatusCode::ServiceUnavailable, &detail))
            }
            Err(NoEndpoint::Saturated(detail)) => {
                self.core.metrics().epp_refused("saturated");
                tracing::debug!(%detail, priority, "request shed");
                Err(wire::refusal(StatusCode::TooManyRequests, &detail))
            }
        }
    }

    async fn on_headers(
        &self,
        ex: &mut Exchange,
        h: &HttpHeaders,
        in_flight: &mut InFlight,
    ) -> Vec<ProcessingResponse> {
        ex.path = wire::header(h, ":path").unwrap_or_default();
        ex.objective = wire::header(h, OBJECTIVE_HEADER).filter(|o| !o.is_empty());
        if !ex.trace_context.contains_key("traceparent") {
            for key in ["traceparent", "tracestate"] {
                if let Some(value) = wire::header(h, key) {
                    ex.trace_context.insert(key.to_owned(), value);
                }
            }
        }
        // STREAMED: the chunks pass on as they come; NONE: no body comes.
        let by_headers =
            h.end_of_stream || matches!(ex.mode, Some(BodySendMode::Streamed | BodySendMode::None));
        if by_headers {
            // No body will come in time: pick now, by load.
            return match self.pick_or_refuse(ex, None, in_flight).await {
                Ok(pick) => vec![wire::request_headers(Some(&pick.endpoints))],
                Err(refusal) => vec![refusal],
            };
        }
        if ex.mode == Some(BodySendMode::FullDuplexStreamed) {
            // Answered with the pick once the body is complete.
            return Vec::new();
        }
        vec![wire::request_headers(None)]
    }

    async fn on_body(
        &self,
        ex: &mut Exchange,
        b: HttpBody,
        in_flight: &mut InFlight,
    ) -> Vec<ProcessingResponse> {
        match ex.mode {
            Some(BodySendMode::FullDuplexStreamed) => {
                if ex.decided {
                    // Picked already (the body outgrew the limit): pass on.
                    return vec![wire::request_body(None, Some((b.body, b.end_of_stream)))];
                }
                ex.chunk_bytes += b.body.len();
                ex.too_large |= ex.chunk_bytes > self.pool.max_body_bytes;
                ex.over_budget |= !ex.too_large && !ex.held.grow(b.body.len());
                ex.chunks.push((b.body, b.end_of_stream));
                if b.end_of_stream || ex.too_large || ex.over_budget {
                    return self.release_full_duplex(ex, in_flight).await;
                }
                Vec::new()
            }
            // Picked from the headers; the chunks pass as they are.
            Some(BodySendMode::Streamed) => vec![wire::request_body(None, None)],
            Some(BodySendMode::Buffered | BodySendMode::BufferedPartial) if !ex.decided => {
                // The one body message (trailers may follow): pick on it.
                if b.body.len() > self.pool.max_body_bytes {
                    ex.decided = true;
                    self.core.metrics().epp_refused("too_large");
                    let detail = format!(
                        "the request body ({} bytes) is over the endpoint picker's limit \
                         (--epp-max-body-bytes {})",
                        b.body.len(),
                        self.pool.max_body_bytes
                    );
                    return vec![wire::refusal(StatusCode::PayloadTooLarge, &detail)];
                }
                // Counted while it is read; no room: routed by load.
                let body = if ex.held.grow(b.body.len()) {
                    Some(b.body)
                } else {
                    self.core.metrics().epp_unread("held_body_budget");
                    None
                };
                match self.pick_or_refuse(ex, body, in_flight).await {
                    Ok(pick) => vec![wire::request_body(Some(&pick.endpoints), None)],
                    Err(refusal) => vec![refusal],
                }
            }
            // No mode announced: hold the chunks, pick at the end.
            _ => {
                if ex.decided {
                    return vec![wire::request_body(None, None)];
                }
                self.hold(ex, &b.body);
                if !b.end_of_stream {
                    return vec![wire::request_body(None, None)];
                }
                let body = self.held_body(ex);
                match self.pick_or_refuse(ex, body, in_flight).await {
                    Ok(pick) => vec![wire::request_body(Some(&pick.endpoints), None)],
                    Err(refusal) => vec![refusal],
                }
            }
        }
    }

    async fn on_trailers(
        &self,
        ex: &mut Exchange,
        in_flight: &mut InFlight,
    ) -> Vec<ProcessingResponse> {
        if ex.mode == Some(BodySendMode::FullDuplexStreamed) && !ex.decided {
            // The trailers end the body: pick, then answer everything in
            // order (headers, chunks, trailers).
            let mut out = self.release_full_duplex(ex, in_flight).await;
            if !out.iter().any(is_immediate) {
                out.push(wire::request_trailers(None));
            }
            return out;
        }
        if !ex.decided {
            // Trailers end a body that never said so (no mode announced):
            // the headers are answered, so the pick rides on the metadata.
            let body = self.held_body(ex);
            return match self.pick_or_refuse(ex, body, in_flight).await {
                Ok(pick) => vec![wire::request_trailers(Some(&pick.endpoints))],
                Err(refusal) => vec![refusal],
            };
        }
        vec![wire::request_trailers(None)]
    }

    /// Adds a chunk to the body the pick reads, up to the limit.
    fn hold(&self, ex: &mut Exchange, chunk: &[u8]) {
        if ex.too_large || ex.over_budget {
            return;
        }
        if ex.body.len() + chunk.len() > self.pool.max_body_bytes {
            ex.too_large = true;
        } else if !ex.held.grow(chunk.len()) {
            ex.over_budget = true;
        } else {
            ex.body.extend_from_slice(chunk);
            return;
        }
        ex.body = Vec::new();
        ex.held.release();
    }

    /// The body to read, or `None` when it outgrew the limit (counted).
    fn held_body(&self, ex: &mut Exchange) -> Option<Vec<u8>> {
        if let Some(reason) = ex.unread_reason() {
            self.core.metrics().epp_unread(reason);
            return None;
        }
        Some(std::mem::take(&mut ex.body))
    }

    /// FULL_DUPLEX_STREAMED: pick on the held body (by load when it
    /// outgrew the limit), then the headers response with the pick and
    /// every held chunk, unchanged.
    async fn release_full_duplex(
        &self,
        ex: &mut Exchange,
        in_flight: &mut InFlight,
    ) -> Vec<ProcessingResponse> {
        let body = if let Some(reason) = ex.unread_reason() {
            self.core.metrics().epp_unread(reason);
            None
        } else {
            Some(
                ex.chunks
                    .iter()
                    .flat_map(|(bytes, _)| bytes.iter().copied())
                    .collect(),
            )
        };
        let pick = match self.pick_or_refuse(ex, body, in_flight).await {
            Ok(pick) => pick,
            Err(refusal) => return vec![refusal],
        };
        let mut out = vec![wire::request_headers(Some(&pick.endpoints))];
        for chunk in std::mem::take(&mut ex.chunks) {
            out.push(wire::request_body(None, Some(chunk)));
        }
        out
    }

    fn on_response_body(
        &self,
        ex: &mut Exchange,
        b: HttpBody,
        in_flight: &mut InFlight,
    ) -> Vec<ProcessingResponse> {
        if ex.first_byte_ms.is_none()
            && ex.streamed_response
            && !b.body.is_empty()
            && let Some(at) = ex.picked_at
        {
            ex.first_byte_ms = Some(u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX));
        }
        ex.usage
            .get_or_insert_with(|| UsageReader::new(None))
            .feed(&b.body);
        if b.end_of_stream {
            self.response_ended(ex, in_flight);
        }
        let streamed = (ex.response_mode == Some(BodySendMode::FullDuplexStreamed))
            .then_some((b.body, b.end_of_stream));
        vec![wire::response_body(streamed)]
    }

    /// The response is complete: the request no longer counts as in flight,
    /// and what the engine reported feeds the load estimates.
    fn response_ended(&self, ex: &mut Exchange, in_flight: &mut InFlight) {
        if ex.response_ended {
            return;
        }
        ex.response_ended = true;
        let usage: Option<Usage> = ex.usage.take().and_then(UsageReader::finish);
        if let Some(id) = in_flight.replica_id.as_deref() {
            let observed = ObservedResponse {
                prompt_tokens: usage.map(|u| u.prompt_tokens),
                cached_tokens: usage.and_then(|u| u.cached_tokens),
                first_byte_ms: ex.first_byte_ms,
            };
            let mut table = self.observed.lock();
            if table.len() >= OBSERVED_MAX_ENDPOINTS && table.get(id).is_none() {
                // Endpoints come and go: keep the pool's, drop the rest.
                let endpoints = self.pool.endpoints.read().clone();
                let current: HashSet<String> = endpoints
                    .iter()
                    .filter_map(|e| self.replica_of(e))
                    .collect();
                table.retain(|id| current.contains(id));
            }
            table.record(id, &observed);
            let rate = table.get(id).and_then(|s| s.prefill_tokens_per_second);
            drop(table);
            if let Some(rate) = rate
                && observed.prompt_tokens.is_some()
            {
                self.core.routing().observed_prefill_rate(id, rate);
                self.core.metrics().epp_prefill_rate_observations.inc();
            }
        }
        in_flight.end();
    }

    /// The gateway reports the request served by `served` (it may have
    /// retried down the list): the in-flight count moves there.
    fn served_by(&self, served: &str, ex: &Exchange, in_flight: &mut InFlight) {
        let Some(current) = in_flight.replica_id.clone() else {
            return;
        };
        if ex.response_ended {
            return;
        }
        let Some(replica_id) = self.replica_of(served) else {
            return;
        };
        if replica_id != current {
            self.core.finished(&current);
            self.core.routing().started(&replica_id);
            in_flight.replica_id = Some(replica_id);
        }
    }

    /// The load-board key of endpoint `address` of the pool.
    fn replica_of(&self, address: &str) -> Option<String> {
        if !self.pool.endpoints.read().iter().any(|e| e == address) {
            return None;
        }
        let index = self.core.index();
        let key = index
            .scope_at(&self.pool.tenant, self.pool.hash_scheme, address)
            .and_then(|scope| {
                index
                    .replicas_in(&scope, None, None)
                    .into_iter()
                    .find(|(_, a)| a == address)
                    .map(|(k, _)| k.replica_id)
            });
        Some(key.unwrap_or_else(|| address.to_owned()))
    }
}

fn is_immediate(r: &ProcessingResponse) -> bool {
    matches!(
        r.response,
        Some(processing_response::Response::ImmediateResponse(_))
    )
}
