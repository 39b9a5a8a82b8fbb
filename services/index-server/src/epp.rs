//! The Gateway API Inference Extension endpoint picker: Envoy's
//! `envoy.service.ext_proc.v3.ExternalProcessor/Process`, one gRPC stream
//! per HTTP request. A thin adapter: it reads the request (headers, the
//! gateway's endpoint subset, the OpenAI body), asks the core
//! ([`IndexCore::route`], which tokenizes the prompt as the engine will —
//! chat messages through the model's chat template — sheds, decides over
//! the pool's endpoints and falls back by load), and answers with `x-gateway-destination-endpoint` (header and
//! `envoy.lb` dynamic metadata), or a 503 when no endpoint can serve.
//!
//! Message sequences handled, as Envoy sends them:
//! * headers only (`end_of_stream` on the headers): picked by load at once;
//! * `BUFFERED` body: headers answered "continue", the pick rides on the
//!   body response;
//! * `FULL_DUPLEX_STREAMED` body (what the protocol asks gateways to use):
//!   headers and chunks arrive without waiting; at the last chunk the
//!   headers response carries the pick and the chunks are streamed back;
//! * `STREAMED` body: Envoy forwards the headers once answered, so the pick
//!   is made from the headers (by load), then the chunks pass through.
//!
//! A request the picker cannot read (bad JSON, no tokenizer, images) is
//! still routed, by load: the engine answers a bad request better than a
//! gateway error would.

use std::collections::HashSet;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, header_value_option,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpBody,
    HttpHeaders, ImmediateResponse, ProcessingRequest, ProcessingResponse, StreamedBodyResponse,
    body_mutation, external_processor_server::ExternalProcessor, processing_request,
    processing_response,
};
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use futures::Stream;
use ic_index::{HashScheme, ReplicaKey, Scope};
use tokio_stream::StreamExt;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument as _;

use crate::index_core::{IndexCore, Prompt, Purpose, RouteError, RouteRequest, Routed};
use crate::openai::{self, MAX_BODY_BYTES, Prompt as BodyPrompt};

/// The header (and `envoy.lb` metadata key) naming the picked endpoint.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The filter-metadata namespace of the gateway's subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The key of the subset hint: the endpoints the picker must choose from.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";

/// Where the picker's endpoints come from and whose they are.
#[derive(Clone, Debug)]
pub struct PoolConfig {
    /// Namespace of the pool (the index tenant of its engines).
    pub tenant: String,
    /// Fingerprint domain of its engines.
    pub hash_scheme: HashScheme,
    /// Ready endpoints, `ip:port` (static, or kept current by
    /// [`crate::pool::watch_pool`]).
    pub endpoints: crate::pool::Endpoints,
    /// Refuse a request with 429 when even the least busy eligible
    /// endpoint has this many requests (in flight or queued); `None` never.
    pub shed_at_requests: Option<f64>,
}

/// The endpoint picker service.
#[derive(Clone, Debug)]
pub struct EndpointPicker {
    core: Arc<IndexCore>,
    pool: Arc<PoolConfig>,
}

impl EndpointPicker {
    /// A picker over `core` choosing among `pool`'s endpoints.
    pub fn new(core: Arc<IndexCore>, pool: PoolConfig) -> Self {
        Self {
            core,
            pool: Arc::new(pool),
        }
    }
}

/// A pick: the endpoint and the load-board key it was counted under.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pick {
    endpoint: String,
    replica_id: String,
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
    mode: Option<BodySendMode>,
    body: Vec<u8>,
    chunks: Vec<Vec<u8>>,
    headers_answered: bool,
    too_large: bool,
}

fn subset_hint(req: &ProcessingRequest) -> Option<Vec<String>> {
    let ns = req
        .metadata_context
        .as_ref()?
        .filter_metadata
        .get(SUBSET_NAMESPACE)?;
    let Some(Kind::ListValue(list)) = ns.fields.get(SUBSET_KEY)?.kind.as_ref() else {
        return Some(Vec::new());
    };
    Some(
        list.values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(s.clone()),
                _ => None,
            })
            .collect(),
    )
}

fn header(headers: &HttpHeaders, name: &str) -> Option<String> {
    headers
        .headers
        .as_ref()?
        .headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| {
            if h.raw_value.is_empty() {
                h.value.clone()
            } else {
                String::from_utf8_lossy(&h.raw_value).into_owned()
            }
        })
}

fn string_value(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// The pick as Envoy reads it: the header, and the same in `envoy.lb`.
fn destination(pick: &Pick) -> (HeaderMutation, Struct) {
    let mutation = HeaderMutation {
        set_headers: vec![HeaderValueOption {
            header: Some(HeaderValue {
                key: DESTINATION.to_owned(),
                raw_value: pick.endpoint.as_bytes().to_vec(),
                ..HeaderValue::default()
            }),
            append_action: header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
            ..HeaderValueOption::default()
        }],
        // The subset is the gateway's word to the picker, never the client's
        // to the engine.
        remove_headers: vec![SUBSET_KEY.to_owned()],
    };
    let lb = Struct {
        fields: [(DESTINATION.to_owned(), string_value(&pick.endpoint))].into(),
    };
    let metadata = Struct {
        fields: [(
            "envoy.lb".to_owned(),
            Value {
                kind: Some(Kind::StructValue(lb)),
            },
        )]
        .into(),
    };
    (mutation, metadata)
}

fn headers_response(pick: Option<&Pick>) -> ProcessingResponse {
    let (mutation, metadata) = pick.map(destination).unzip();
    ProcessingResponse {
        response: Some(processing_response::Response::RequestHeaders(
            HeadersResponse {
                response: Some(CommonResponse {
                    header_mutation: mutation,
                    clear_route_cache: pick.is_some(),
                    ..CommonResponse::default()
                }),
            },
        )),
        dynamic_metadata: metadata,
        ..ProcessingResponse::default()
    }
}

fn body_response(pick: Option<&Pick>, streamed: Option<(Vec<u8>, bool)>) -> ProcessingResponse {
    let (mutation, metadata) = pick.map(destination).unzip();
    ProcessingResponse {
        response: Some(processing_response::Response::RequestBody(BodyResponse {
            response: Some(CommonResponse {
                header_mutation: mutation,
                clear_route_cache: pick.is_some(),
                body_mutation: streamed.map(|(body, end_of_stream)| BodyMutation {
                    mutation: Some(body_mutation::Mutation::StreamedResponse(
                        StreamedBodyResponse {
                            body,
                            end_of_stream,
                            ..StreamedBodyResponse::default()
                        },
                    )),
                }),
                ..CommonResponse::default()
            }),
        })),
        dynamic_metadata: metadata,
        ..ProcessingResponse::default()
    }
}

/// An error answered by the gateway itself, as the protocol asks: 503 when
/// nothing can serve, 429 when the pool is saturated.
fn refusal(code: StatusCode, detail: &str) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ImmediateResponse(
            ImmediateResponse {
                status: Some(HttpStatus { code: code as i32 }),
                body: format!("{{\"error\":{}}}", serde_json::Value::from(detail)).into_bytes(),
                details: detail.to_owned(),
                ..ImmediateResponse::default()
            },
        )),
        ..ProcessingResponse::default()
    }
}

impl EndpointPicker {
    /// The endpoints this request may go to: the pool, narrowed by the
    /// gateway's subset when it sent one.
    fn eligible(&self, subset: Option<&[String]>) -> Result<Vec<String>, NoEndpoint> {
        let endpoints = self.pool.endpoints.read();
        let eligible: Vec<String> = match subset {
            None => endpoints.clone(),
            Some(subset) => {
                // The subset narrows the pool: the gateway knows which
                // endpoints are healthy for it right now.
                let pool: HashSet<&String> = endpoints.iter().collect();
                subset
                    .iter()
                    .filter(|e| pool.contains(e))
                    .cloned()
                    .collect()
            }
        };
        drop(endpoints);
        if eligible.is_empty() {
            return Err(NoEndpoint::Empty(match subset {
                Some(_) => "no endpoint of the gateway's subset is in the pool".to_owned(),
                None => "the pool has no ready endpoint".to_owned(),
            }));
        }
        Ok(eligible)
    }

    /// The pool as scored: each endpoint under its index replica's key, or
    /// under its address when the index has not heard from it.
    fn scored_pool(&self, scope: &Scope, eligible: &[String]) -> Vec<(ReplicaKey, String)> {
        let base = Scope {
            adapter: String::new(),
            ..scope.clone()
        };
        let known = self.core.index().replicas_in(&base, None, None);
        eligible
            .iter()
            .map(|address| {
                let key = known
                    .iter()
                    .find(|(_, a)| a == address)
                    .map(|(k, _)| k.clone())
                    .unwrap_or_else(|| ReplicaKey {
                        tenant: scope.tenant.clone(),
                        replica_id: address.clone(),
                        dp_rank: 0,
                    });
                (key, address.clone())
            })
            .collect()
    }

    /// The index scope of a request for `model`. vLLM serves each LoRA
    /// adapter under its own model name: a name the index has no replicas
    /// for, while the pool's endpoints report a base model, is an adapter
    /// of that base model.
    fn scope_of(&self, model: String, eligible: &[String]) -> Scope {
        let scope = Scope {
            tenant: self.pool.tenant.clone(),
            model,
            hash_scheme: self.pool.hash_scheme,
            adapter: String::new(),
        };
        let index = self.core.index();
        if scope.model.is_empty() || index.block_size(&scope).is_some() {
            return scope;
        }
        let base = eligible
            .iter()
            .find_map(|address| index.scope_at(&scope.tenant, scope.hash_scheme, address));
        match base {
            Some(base) if base.model != scope.model => Scope {
                adapter: scope.model,
                ..base
            },
            _ => scope,
        }
    }

    /// Decides where a request goes (CPU work: run off the I/O threads):
    /// read the body, narrow the pool, ask the core, convert.
    fn decide(
        &self,
        path: &str,
        body: Option<&[u8]>,
        subset: Option<&[String]>,
    ) -> Result<Pick, NoEndpoint> {
        let received = Instant::now();
        let eligible = self.eligible(subset)?;
        let request = body.and_then(|b| match openai::parse(path, b) {
            Ok(r) => Some(r),
            Err(error) => {
                tracing::debug!(%error, "request body not read; routing by load");
                self.core.metrics().epp_unread("body");
                None
            }
        });
        let model = request
            .as_ref()
            .map_or_else(String::new, |r| r.model.clone());
        let scope = self.scope_of(model, &eligible);
        let pool = self.scored_pool(&scope, &eligible);
        let extras = request
            .as_ref()
            .filter(|r| !r.cache_salt.is_empty())
            .map(|r| ic_kvevents::PromptExtras {
                cache_salt: r.cache_salt.clone(),
                ..Default::default()
            });
        // An adapter shares its base `model`'s tokenizer (the scope's model).
        let prompt = match request.as_ref().and_then(|r| r.prompt.as_ref()) {
            Some(BodyPrompt::Tokens(ids)) => Prompt::Tokens(ids),
            Some(BodyPrompt::Text(text)) => Prompt::Text(text),
            Some(BodyPrompt::Chat(messages)) => Prompt::Chat(messages),
            None => Prompt::Unknown,
        };
        let routed = self.core.route(&RouteRequest {
            scope: &scope,
            prompt,
            candidates: None,
            extras: extras.as_ref(),
            received,
            purpose: Purpose::Endpoint {
                pool: &pool,
                shed_at_requests: self.pool.shed_at_requests,
            },
        });
        match routed {
            Ok(Routed::Endpoint { pick, by_prefix }) => {
                self.core.metrics().epp_decided(
                    if by_prefix { "prefix" } else { "load" },
                    received.elapsed(),
                );
                Ok(Pick {
                    endpoint: pick.address,
                    replica_id: pick.replica.replica_id,
                })
            }
            Err(RouteError::Saturated(detail)) => Err(NoEndpoint::Saturated(detail)),
            Err(other) => Err(NoEndpoint::Empty(other.to_string())),
            Ok(_) => Err(NoEndpoint::Empty(
                "the core answered another purpose".into(),
            )),
        }
    }

    async fn decide_off_thread(
        &self,
        path: String,
        body: Option<Vec<u8>>,
        subset: Option<Vec<String>>,
    ) -> Result<Pick, NoEndpoint> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.decide(&path, body.as_deref(), subset.as_deref()))
            .await
            .unwrap_or_else(|e| Err(NoEndpoint::Empty(format!("pick task failed: {e}"))))
    }
}

/// Ends a pick's in-flight count when the stream (the HTTP request) ends.
struct InFlight {
    picker: EndpointPicker,
    replica_id: Option<String>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(id) = self.replica_id.take() {
            self.picker.core.finished(&id);
        }
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
        let mut incoming = request.into_inner();
        let picker = self.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<ProcessingResponse, Status>>(16);
        tokio::spawn(async move {
            let mut ex = Exchange {
                trace_context: stream_context,
                ..Exchange::default()
            };
            let mut in_flight = InFlight {
                picker: picker.clone(),
                replica_id: None,
            };
            while let Some(message) = incoming.next().await {
                let message = match message {
                    Ok(m) => m,
                    Err(status) => {
                        tracing::debug!(%status, "ext_proc stream ended by the gateway");
                        break;
                    }
                };
                if ex.mode.is_none()
                    && let Some(config) = &message.protocol_config
                {
                    ex.mode = BodySendMode::try_from(config.request_body_mode).ok();
                }
                if let Some(subset) = subset_hint(&message) {
                    ex.subset = Some(subset);
                }
                let replies = match message.request {
                    Some(processing_request::Request::RequestHeaders(h)) => {
                        picker.on_headers(&mut ex, &h, &mut in_flight).await
                    }
                    Some(processing_request::Request::RequestBody(b)) => {
                        picker.on_body(&mut ex, b, &mut in_flight).await
                    }
                    // Response phases, trailers: nothing to change.
                    Some(processing_request::Request::ResponseHeaders(_)) => {
                        vec![ProcessingResponse {
                            response: Some(processing_response::Response::ResponseHeaders(
                                HeadersResponse::default(),
                            )),
                            ..ProcessingResponse::default()
                        }]
                    }
                    Some(processing_request::Request::ResponseBody(_)) => {
                        vec![ProcessingResponse {
                            response: Some(processing_response::Response::ResponseBody(
                                BodyResponse::default(),
                            )),
                            ..ProcessingResponse::default()
                        }]
                    }
                    Some(processing_request::Request::RequestTrailers(_)) => {
                        vec![ProcessingResponse {
                            response: Some(processing_response::Response::RequestTrailers(
                                Default::default(),
                            )),
                            ..ProcessingResponse::default()
                        }]
                    }
                    Some(processing_request::Request::ResponseTrailers(_)) => {
                        vec![ProcessingResponse {
                            response: Some(processing_response::Response::ResponseTrailers(
                                Default::default(),
                            )),
                            ..ProcessingResponse::default()
                        }]
                    }
                    None => Vec::new(),
                };
                for reply in replies {
                    let immediate = matches!(
                        reply.response,
                        Some(processing_response::Response::ImmediateResponse(_))
                    );
                    if tx.send(Ok(reply)).await.is_err() || immediate {
                        return;
                    }
                }
            }
            drop(in_flight);
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

impl EndpointPicker {
    async fn pick_or_refuse(
        &self,
        ex: &Exchange,
        body: Option<Vec<u8>>,
        in_flight: &mut InFlight,
    ) -> Result<Pick, ProcessingResponse> {
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
        let decided = self
            .decide_off_thread(ex.path.clone(), body, ex.subset.clone())
            .instrument(span.clone())
            .await;
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
            Ok(pick) => {
                span.record("replica", pick.replica_id.as_str());
                in_flight.replica_id = Some(pick.replica_id.clone());
                Ok(pick)
            }
            Err(NoEndpoint::Empty(detail)) => {
                self.core.metrics().epp_refused("no_endpoint");
                tracing::warn!(%detail, "no endpoint to pick");
                Err(refusal(StatusCode::ServiceUnavailable, &detail))
            }
            Err(NoEndpoint::Saturated(detail)) => {
                self.core.metrics().epp_refused("saturated");
                tracing::debug!(%detail, "request shed");
                Err(refusal(StatusCode::TooManyRequests, &detail))
            }
        }
    }

    async fn on_headers(
        &self,
        ex: &mut Exchange,
        h: &HttpHeaders,
        in_flight: &mut InFlight,
    ) -> Vec<ProcessingResponse> {
        ex.path = header(h, ":path").unwrap_or_default();
        if !ex.trace_context.contains_key("traceparent") {
            for key in ["traceparent", "tracestate"] {
                if let Some(value) = header(h, key) {
                    ex.trace_context.insert(key.to_owned(), value);
                }
            }
        }
        let by_headers = h.end_of_stream || ex.mode == Some(BodySendMode::Streamed);
        if by_headers {
            // No body will come in time: pick now, by load.
            ex.headers_answered = true;
            return match self.pick_or_refuse(ex, None, in_flight).await {
                Ok(pick) => vec![headers_response(Some(&pick))],
                Err(refusal) => vec![refusal],
            };
        }
        if ex.mode == Some(BodySendMode::FullDuplexStreamed) {
            // Answered with the pick once the body is complete.
            return Vec::new();
        }
        ex.headers_answered = true;
        vec![headers_response(None)]
    }

    async fn on_body(
        &self,
        ex: &mut Exchange,
        b: HttpBody,
        in_flight: &mut InFlight,
    ) -> Vec<ProcessingResponse> {
        let full_duplex = ex.mode == Some(BodySendMode::FullDuplexStreamed);
        if ex.body.len() + b.body.len() <= MAX_BODY_BYTES {
            ex.body.extend_from_slice(&b.body);
        } else {
            ex.too_large = true;
        }
        if full_duplex {
            ex.chunks.push(b.body);
        }
        if !b.end_of_stream {
            // Streamed chunks are answered at the end (full duplex) or pass
            // through (streamed, already picked).
            return if full_duplex {
                Vec::new()
            } else {
                vec![body_response(None, None)]
            };
        }
        if ex.mode == Some(BodySendMode::Streamed) {
            return vec![body_response(None, None)];
        }
        let body = (!ex.too_large).then(|| std::mem::take(&mut ex.body));
        if ex.too_large {
            self.core.metrics().epp_unread("too_large");
        }
        let pick = match self.pick_or_refuse(ex, body, in_flight).await {
            Ok(pick) => pick,
            Err(refusal) => return vec![refusal],
        };
        if full_duplex {
            let mut out = vec![headers_response(Some(&pick))];
            let chunks = std::mem::take(&mut ex.chunks);
            let last = chunks.len().saturating_sub(1);
            for (i, chunk) in chunks.into_iter().enumerate() {
                out.push(body_response(None, Some((chunk, i == last))));
            }
            return out;
        }
        vec![body_response(Some(&pick), None)]
    }
}
