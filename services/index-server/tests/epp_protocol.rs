//! The endpoint picker protocol beyond the pick, against the real
//! `ic-index-server` binary with an ext_proc client built from Envoy's
//! protos, in the message order Envoy sends: the response phases in every
//! body mode (and what they do to the load), the request's trailers, the
//! gateway's subset hint as comma-separated strings, the destination as a
//! list with fallbacks and the endpoint that served, bodies over the
//! message limit, and shedding by the request's objective.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue, Metadata};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, HttpTrailers, ProcessingRequest, ProcessingResponse,
    ProtocolConfiguration, body_mutation, external_processor_client::ExternalProcessorClient,
    processing_request, processing_response,
};
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};
use ic_e2e::ServiceProcess;
use ic_e2e::ext_proc::{body, headers};

const A: &str = "10.0.0.1:8000";
const B: &str = "10.0.0.2:8000";

struct Picker {
    process: ServiceProcess,
    epp: String,
}

fn start(extra: &[&str]) -> Picker {
    let endpoints = format!("{A},{B}");
    let mut args = vec![
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--epp-addr",
        "127.0.0.1:0",
        "--epp-tenant",
        "team-a",
        "--epp-endpoint",
        &endpoints,
        // Recent picks stop counting at once: the load is what is in
        // flight, which is what these tests follow.
        "--pick-half-life-ms",
        "1",
    ];
    args.extend_from_slice(extra);
    let mut process =
        ServiceProcess::start(Path::new(env!("CARGO_BIN_EXE_ic-index-server")), &args);
    let epp = format!("http://{}", process.addr("epp"));
    Picker { process, epp }
}

/// Envoy's first message announces the filter's body modes.
fn with_modes(
    mut m: ProcessingRequest,
    request: BodySendMode,
    response: BodySendMode,
) -> ProcessingRequest {
    m.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: request as i32,
        response_body_mode: response as i32,
        ..ProtocolConfiguration::default()
    });
    m
}

fn with_header(mut m: ProcessingRequest, key: &str, value: &str) -> ProcessingRequest {
    if let Some(processing_request::Request::RequestHeaders(h)) = &mut m.request {
        h.headers.as_mut().unwrap().headers.push(HeaderValue {
            key: key.into(),
            raw_value: value.as_bytes().to_vec(),
            ..HeaderValue::default()
        });
    }
    m
}

fn with_filter_metadata(
    mut m: ProcessingRequest,
    ns: &str,
    key: &str,
    v: Kind,
) -> ProcessingRequest {
    m.metadata_context = Some(Metadata {
        filter_metadata: [(
            ns.to_owned(),
            Struct {
                fields: [(key.to_owned(), Value { kind: Some(v) })].into(),
            },
        )]
        .into(),
        ..Metadata::default()
    });
    m
}

fn response_headers(content_type: &str, end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::ResponseHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    HeaderValue {
                        key: ":status".into(),
                        raw_value: b"200".to_vec(),
                        ..HeaderValue::default()
                    },
                    HeaderValue {
                        key: "content-type".into(),
                        raw_value: content_type.as_bytes().to_vec(),
                        ..HeaderValue::default()
                    },
                ],
            }),
            end_of_stream,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

fn response_body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::ResponseBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

fn request_trailers() -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestTrailers(
            HttpTrailers::default(),
        )),
        ..ProcessingRequest::default()
    }
}

/// One ext_proc stream (one HTTP request), driven message by message as
/// Envoy does, and kept open until dropped.
struct Stream {
    tx: tokio::sync::mpsc::Sender<ProcessingRequest>,
    rx: tonic::Streaming<ProcessingResponse>,
}

impl Stream {
    async fn open(epp: &str) -> Self {
        let mut client = ExternalProcessorClient::connect(epp.to_owned())
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let rx = client
            .process(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Self { tx, rx }
    }

    async fn send(&self, m: ProcessingRequest) {
        self.tx.send(m).await.unwrap();
    }

    async fn read(&mut self, n: usize) -> Vec<ProcessingResponse> {
        let mut out = Vec::new();
        for _ in 0..n {
            let next = tokio::time::timeout(Duration::from_secs(10), self.rx.message())
                .await
                .expect("the picker answered in time")
                .unwrap()
                .expect("a response, not the end of the stream");
            out.push(next);
        }
        out
    }

    /// Half-closes and reads to the end: no answer beyond those read.
    async fn close(mut self) {
        drop(self.tx);
        let rest = tokio::time::timeout(Duration::from_secs(10), async {
            let mut n = 0;
            while let Ok(Some(_)) = self.rx.message().await {
                n += 1;
            }
            n
        })
        .await
        .expect("the picker ends the stream once the gateway half-closes");
        assert_eq!(rest, 0, "no response beyond the expected ones");
    }
}

/// The whole destination a response carries (header), checked against its
/// `envoy.lb` metadata.
fn destinations(r: &ProcessingResponse) -> Option<String> {
    let header = ic_e2e::ext_proc::destinations(r)?;
    let lb = &r.dynamic_metadata.as_ref().unwrap().fields["envoy.lb"];
    let Some(Kind::StructValue(lb)) = &lb.kind else {
        panic!("envoy.lb is not a struct: {lb:?}");
    };
    let Some(Kind::StringValue(meta)) = &lb.fields["x-gateway-destination-endpoint"].kind else {
        panic!("no endpoint in envoy.lb");
    };
    assert_eq!(&header, meta, "header and metadata agree");
    Some(header)
}

fn first(list: &str) -> String {
    list.split(',').next().unwrap().to_owned()
}

fn immediate_status(r: &ProcessingResponse) -> Option<i32> {
    match &r.response {
        Some(processing_response::Response::ImmediateResponse(i)) => {
            Some(i.status.as_ref().unwrap().code)
        }
        _ => None,
    }
}

fn streamed(r: &ProcessingResponse) -> Option<(Vec<u8>, bool)> {
    let common = match r.response.as_ref()? {
        processing_response::Response::RequestBody(b)
        | processing_response::Response::ResponseBody(b) => b.response.as_ref()?,
        _ => return None,
    };
    match common.body_mutation.as_ref()?.mutation.as_ref()? {
        body_mutation::Mutation::StreamedResponse(s) => Some((s.body.clone(), s.end_of_stream)),
        _ => None,
    }
}

fn kind(r: &ProcessingResponse) -> &'static str {
    match r.response {
        Some(processing_response::Response::RequestHeaders(_)) => "request_headers",
        Some(processing_response::Response::RequestBody(_)) => "request_body",
        Some(processing_response::Response::RequestTrailers(_)) => "request_trailers",
        Some(processing_response::Response::ResponseHeaders(_)) => "response_headers",
        Some(processing_response::Response::ResponseBody(_)) => "response_body",
        Some(processing_response::Response::ResponseTrailers(_)) => "response_trailers",
        Some(processing_response::Response::ImmediateResponse(_)) => "immediate",
        Some(_) => "other",
        None => "none",
    }
}

const REQUEST: &[u8] = br#"{"model":"m","prompt":"hello there, a prompt"}"#;
const SSE: [&[u8]; 3] = [
    b"data: {\"choices\":[{\"text\":\"hi\"}],\"usage\":null}\n\n",
    b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":1,",
    b"\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n",
];

/// Sends one request in `mode` with its response in the same mode, and
/// checks every answer; the stream is left open (the gateway has not
/// closed it yet). Returns it and the endpoint picked.
async fn request_and_response(epp: &str, mode: BodySendMode) -> (Stream, String) {
    let mut s = Stream::open(epp).await;
    s.send(with_modes(headers("/v1/completions", false), mode, mode))
        .await;
    let (a, b) = REQUEST.split_at(10);
    let picked = match mode {
        BodySendMode::Buffered => {
            let r = s.read(1).await;
            assert_eq!(kind(&r[0]), "request_headers");
            assert_eq!(destinations(&r[0]), None, "headers pass without a pick");
            s.send(body(REQUEST, true)).await;
            let r = s.read(1).await;
            assert_eq!(kind(&r[0]), "request_body");
            assert_eq!(streamed(&r[0]), None, "the body is left as it is");
            destinations(&r[0]).unwrap()
        }
        BodySendMode::Streamed => {
            let r = s.read(1).await;
            let picked = destinations(&r[0]).expect("picked from the headers");
            s.send(body(a, false)).await;
            s.send(body(b, true)).await;
            for r in s.read(2).await {
                assert_eq!(kind(&r), "request_body");
                assert_eq!(streamed(&r), None, "chunks pass as they are");
            }
            picked
        }
        BodySendMode::FullDuplexStreamed => {
            s.send(body(a, false)).await;
            s.send(body(b, true)).await;
            let r = s.read(3).await;
            assert_eq!(kind(&r[0]), "request_headers");
            let picked = destinations(&r[0]).unwrap();
            assert_eq!(streamed(&r[1]), Some((a.to_vec(), false)));
            assert_eq!(streamed(&r[2]), Some((b.to_vec(), true)));
            picked
        }
        other => panic!("not a mode under test: {other:?}"),
    };
    // The engine takes a moment to its first byte (a time to first byte of
    // 0 ms would calibrate no prefill rate).
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    // The response: headers, then the body in chunks, in the same mode.
    s.send(response_headers("text/event-stream", false)).await;
    let r = s.read(1).await;
    assert_eq!(kind(&r[0]), "response_headers");
    for (i, chunk) in SSE.iter().enumerate() {
        let last = i == SSE.len() - 1;
        if mode == BodySendMode::Buffered && !last {
            continue;
        }
        let bytes: Vec<u8> = if mode == BodySendMode::Buffered {
            SSE.concat()
        } else {
            chunk.to_vec()
        };
        s.send(response_body(&bytes, last)).await;
        let r = s.read(1).await;
        assert_eq!(kind(&r[0]), "response_body", "{r:?}");
        if mode == BodySendMode::FullDuplexStreamed {
            assert_eq!(
                streamed(&r[0]),
                Some((bytes, last)),
                "each chunk comes back unchanged"
            );
        } else {
            assert_eq!(streamed(&r[0]), None, "left as it is: {r:?}");
        }
    }
    (s, picked)
}

/// Every body mode: each response message is answered as the mode
/// requires, and a request stops counting as in flight when its response
/// ends, though the gateway keeps the stream open: with a pool of two that
/// sheds at one request each, a third request gets an endpoint only
/// because the first two responses ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_phases_in_every_mode_end_the_request_s_load() {
    let mut picker = start(&[
        "--epp-shed-at-requests",
        "1",
        "--epp-shed-standard-at-requests",
        "1",
    ]);
    for mode in [
        BodySendMode::Buffered,
        BodySendMode::Streamed,
        BodySendMode::FullDuplexStreamed,
    ] {
        let (s1, p1) = request_and_response(&picker.epp, mode).await;
        let (s2, p2) = request_and_response(&picker.epp, mode).await;
        let mut both = [first(&p1), first(&p2)];
        both.sort();
        // Both free again: the second went to the first's fallback, the
        // least busy, only if the first had ended; either way both end.
        assert!(both.iter().all(|e| e == A || e == B), "{both:?}");
        // Both responses ended: nothing in flight, nothing shed.
        let s3 = Stream::open(&picker.epp).await;
        let mut s3 = s3;
        s3.send(headers("/v1/completions", true)).await;
        let r = s3.read(1).await;
        assert_eq!(immediate_status(&r[0]), None, "{mode:?}: shed: {r:?}");
        assert!(destinations(&r[0]).is_some());
        s1.close().await;
        s2.close().await;
        drop(s3);
    }
    // Every response reported its usage (2 of 6 prompt tokens prefilled)
    // after a measurable first byte: each recalibrated its endpoint's
    // prefill rate for the TTFT estimate.
    let metrics = ic_e2e::http_get(picker.process.admin_addr(), "/metrics").1;
    assert!(
        metrics.contains("inferencecache_index_epp_prefill_rate_observations_total 6"),
        "{metrics}"
    );
}

/// Without a response, a request stays in flight for as long as its
/// stream is open: the control of the test above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_its_response_stays_in_flight() {
    let picker = start(&[
        "--epp-shed-at-requests",
        "1",
        "--epp-shed-standard-at-requests",
        "1",
    ]);
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut s = Stream::open(&picker.epp).await;
        s.send(headers("/v1/completions", true)).await;
        assert!(destinations(&s.read(1).await[0]).is_some());
        open.push(s);
    }
    let mut s = Stream::open(&picker.epp).await;
    s.send(headers("/v1/completions", true)).await;
    assert_eq!(immediate_status(&s.read(1).await[0]), Some(429));
    // The response headers alone do not end it; their end_of_stream does.
    open[0]
        .send(response_headers("application/json", false))
        .await;
    assert_eq!(kind(&open[0].read(1).await[0]), "response_headers");
    let mut s = Stream::open(&picker.epp).await;
    s.send(headers("/v1/completions", true)).await;
    assert_eq!(immediate_status(&s.read(1).await[0]), Some(429));
    open[0].send(response_body(b"{}", true)).await;
    assert_eq!(kind(&open[0].read(1).await[0]), "response_body");
    let mut s = Stream::open(&picker.epp).await;
    s.send(headers("/v1/completions", true)).await;
    assert_eq!(immediate_status(&s.read(1).await[0]), None);
}

/// FULL_DUPLEX_STREAMED with trailers: the body's last chunk does not say
/// it ends, the trailers do; the pick still comes, then the chunks and the
/// trailers' answer, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_duplex_body_ending_with_trailers_gets_its_pick() {
    let picker = start(&[]);
    let mut s = Stream::open(&picker.epp).await;
    let full = BodySendMode::FullDuplexStreamed;
    s.send(with_modes(headers("/v1/completions", false), full, full))
        .await;
    let (a, b) = REQUEST.split_at(7);
    s.send(body(a, false)).await;
    s.send(body(b, false)).await;
    s.send(request_trailers()).await;
    let r = s.read(4).await;
    let kinds: Vec<_> = r.iter().map(kind).collect();
    assert_eq!(
        kinds,
        [
            "request_headers",
            "request_body",
            "request_body",
            "request_trailers"
        ]
    );
    assert!(destinations(&r[0]).is_some());
    assert_eq!(streamed(&r[1]), Some((a.to_vec(), false)));
    assert_eq!(streamed(&r[2]), Some((b.to_vec(), false)));
    s.close().await;
}

/// The subset hint as a list, as comma-separated strings in it, and as one
/// string; the destination as the pick then its fallbacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subset_hints_in_every_shape_and_the_destination_with_fallbacks() {
    let picker = start(&[]);
    let subset = |v: Kind| {
        with_filter_metadata(
            headers("/v1/completions", true),
            "envoy.lb.subset_hint",
            "x-gateway-destination-endpoint-subset",
            v,
        )
    };
    let list = |items: &[&str]| {
        Kind::ListValue(ListValue {
            values: items
                .iter()
                .map(|s| Value {
                    kind: Some(Kind::StringValue((*s).into())),
                })
                .collect(),
        })
    };
    for (hint, allowed) in [
        (Kind::StringValue(B.into()), vec![B]),
        (list(&[B]), vec![B]),
        (Kind::StringValue(format!("10.9.9.9:1, {B}")), vec![B]),
        (list(&[&format!("{A},{B}")]), vec![A, B]),
    ] {
        let mut s = Stream::open(&picker.epp).await;
        s.send(subset(hint.clone())).await;
        let r = s.read(1).await;
        let d = destinations(&r[0]).unwrap_or_else(|| panic!("{hint:?}: {r:?}"));
        let named: Vec<&str> = d.split(',').collect();
        assert_eq!(named.len(), allowed.len(), "{hint:?}: {d}");
        for e in &named {
            assert!(allowed.contains(e), "{hint:?}: {d}");
        }
        s.close().await;
    }
    // A subset naming none of the pool: 503.
    let mut s = Stream::open(&picker.epp).await;
    s.send(subset(Kind::StringValue("10.9.9.9:1,10.9.9.8:1".into())))
        .await;
    assert_eq!(immediate_status(&s.read(1).await[0]), Some(503));
    // Without fallbacks, the pick alone.
    let mut quiet = start(&["--epp-fallback-endpoints", "0"]);
    let mut s = Stream::open(&quiet.epp).await;
    s.send(headers("/v1/completions", true)).await;
    let d = destinations(&s.read(1).await[0]).unwrap();
    assert!(d == A || d == B, "{d}");
    s.close().await;
    assert!(quiet.process.stop().success());
}

/// The gateway retried down the list and reports the endpoint that served:
/// the request's load moves there. Two endpoints shedding at one request
/// each: after the move, the next request goes to the endpoint first
/// picked (now free), not to the one that served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_that_served_carries_the_load() {
    let picker = start(&[
        "--epp-shed-at-requests",
        "1",
        "--epp-shed-standard-at-requests",
        "1",
    ]);
    let mut s = Stream::open(&picker.epp).await;
    s.send(headers("/v1/completions", true)).await;
    let list = destinations(&s.read(1).await[0]).unwrap();
    let named: Vec<String> = list.split(',').map(str::to_owned).collect();
    assert_eq!(named.len(), 2, "the pick and one fallback: {list}");
    let (picked, fallback) = (named[0].clone(), named[1].clone());
    assert_ne!(picked, fallback);
    s.send(with_filter_metadata(
        response_headers("application/json", false),
        "envoy.lb",
        "x-gateway-destination-endpoint-served",
        Kind::StringValue(fallback.clone()),
    ))
    .await;
    assert_eq!(kind(&s.read(1).await[0]), "response_headers");
    let mut next = Stream::open(&picker.epp).await;
    next.send(headers("/v1/completions", true)).await;
    let r = next.read(1).await;
    let d = destinations(&r[0]).unwrap_or_else(|| panic!("{r:?}"));
    assert_eq!(first(&d), picked, "the served endpoint is the busy one");
}

/// A BUFFERED body comes in one gRPC message: one over the default 4 MiB
/// gRPC limit is still read (the limit follows --epp-max-body-bytes, 16
/// MiB by default); over the configured limit the picker answers 413 at
/// once, whether the message fits the gRPC limit or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffered_bodies_past_the_message_limit_are_answered() {
    let prompt = "x".repeat(5 << 20);
    let big = serde_json::to_vec(&serde_json::json!({"model": "m", "prompt": prompt})).unwrap();
    let picker = start(&[]);
    let mut s = Stream::open(&picker.epp).await;
    s.send(with_modes(
        headers("/v1/completions", false),
        BodySendMode::Buffered,
        BodySendMode::None,
    ))
    .await;
    assert_eq!(kind(&s.read(1).await[0]), "request_headers");
    s.send(body(&big, true)).await;
    let r = s.read(1).await;
    assert!(
        destinations(&r[0]).is_some(),
        "5 MiB picked: {}",
        kind(&r[0])
    );
    s.close().await;

    let mut small = start(&["--epp-max-body-bytes", "1048576"]);
    for size in [(1 << 20) + (100 << 10), 2 << 20] {
        let mut s = Stream::open(&small.epp).await;
        s.send(with_modes(
            headers("/v1/completions", false),
            BodySendMode::Buffered,
            BodySendMode::None,
        ))
        .await;
        assert_eq!(kind(&s.read(1).await[0]), "request_headers");
        s.send(body(&vec![b' '; size], true)).await;
        let r = s.read(1).await;
        assert_eq!(immediate_status(&r[0]), Some(413), "{size} bytes");
        let Some(processing_response::Response::ImmediateResponse(i)) = &r[0].response else {
            unreachable!()
        };
        assert!(i.details.contains("--epp-max-body-bytes"), "{i:?}");
    }
    let metrics = ic_e2e::http_get(small.process.admin_addr(), "/metrics").1;
    assert!(
        metrics.contains("inferencecache_index_epp_refusals_total{reason=\"too_large\"} 2"),
        "{metrics}"
    );
}

/// Shedding follows the request's InferenceObjective: sheddable traffic is
/// refused first, standard traffic (priority 0, or no objective) next,
/// critical traffic never here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedding_refuses_sheddable_traffic_first_and_critical_last() {
    let picker = start(&[
        "--epp-objective",
        "batch=-1,chat=0,pager=10",
        "--epp-shed-at-requests",
        "1",
        "--epp-shed-standard-at-requests",
        "2",
    ]);
    let mut open = Vec::new();
    let ask = async |objective: Option<&str>, open: &mut Vec<Stream>| {
        let mut s = Stream::open(&picker.epp).await;
        let mut m = headers("/v1/completions", true);
        if let Some(o) = objective {
            m = with_header(m, "x-gateway-inference-objective", o);
        }
        s.send(m).await;
        let r = s.read(1).await;
        let status = immediate_status(&r[0]);
        open.push(s);
        status
    };
    // One request on each endpoint.
    assert_eq!(ask(Some("batch"), &mut open).await, None);
    assert_eq!(ask(None, &mut open).await, None);
    // The least busy has one: sheddable refused, standard served.
    assert_eq!(ask(Some("batch"), &mut open).await, Some(429));
    assert_eq!(ask(Some("chat"), &mut open).await, None);
    assert_eq!(ask(Some("unknown-objective"), &mut open).await, None);
    // Two each: standard refused too, critical served.
    assert_eq!(ask(None, &mut open).await, Some(429));
    assert_eq!(ask(Some("pager"), &mut open).await, None);
    assert_eq!(ask(Some("pager"), &mut open).await, None);
}

#[test]
fn bad_picker_flags_are_refused_naming_the_flag() {
    for (args, expect) in [
        (vec!["--epp-max-body-bytes", "1000"], "--epp-max-body-bytes"),
        (vec!["--epp-objective", "batch"], "expected NAME=PRIORITY"),
        (vec!["--epp-objective", "a=x"], "must be an integer"),
        (
            vec![
                "--epp-shed-at-requests",
                "4",
                "--epp-shed-standard-at-requests",
                "2",
            ],
            "before sheddable",
        ),
        (
            vec!["--epp-shed-critical-at-requests", "2"],
            "lower priorities must shed first",
        ),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ic-index-server"))
            .args([
                "--http-addr",
                "127.0.0.1:0",
                "--grpc-addr",
                "127.0.0.1:0",
                "--epp-addr",
                "127.0.0.1:0",
                "--epp-tenant",
                "t",
                "--epp-endpoint",
                A,
            ])
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
    }
}

/// FULL_DUPLEX_STREAMED: a body outgrowing --epp-max-body-bytes is not
/// held to the end: the picker picks by load as soon as it passes the
/// limit, sends the held chunks back, and streams the rest through at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_duplex_body_past_the_limit_is_picked_by_load_and_streamed_on() {
    let mut picker = start(&["--epp-max-body-bytes", "1048576"]);
    let full = BodySendMode::FullDuplexStreamed;
    let mut s = Stream::open(&picker.epp).await;
    s.send(with_modes(headers("/v1/completions", false), full, full))
        .await;
    let chunk = vec![b'x'; 600 << 10];
    s.send(body(&chunk, false)).await;
    s.send(body(&chunk, false)).await;
    let r = s.read(3).await;
    assert_eq!(kind(&r[0]), "request_headers");
    assert!(destinations(&r[0]).is_some());
    assert_eq!(streamed(&r[1]), Some((chunk.clone(), false)));
    assert_eq!(streamed(&r[2]), Some((chunk.clone(), false)));
    s.send(body(b"tail", true)).await;
    let r = s.read(1).await;
    assert_eq!(streamed(&r[0]), Some((b"tail".to_vec(), true)));
    s.close().await;
    let metrics = ic_e2e::http_get(picker.process.admin_addr(), "/metrics").1;
    assert!(
        metrics.contains("inferencecache_index_epp_unread_total{reason=\"too_large\"} 1"),
        "{metrics}"
    );
}

/// A filter that sends no request body (request_body_mode NONE) gets its
/// pick with the headers: no body message will come to pick on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_sending_no_body_gets_its_pick_with_the_headers() {
    let picker = start(&[]);
    let mut s = Stream::open(&picker.epp).await;
    s.send(with_modes(
        headers("/v1/completions", false),
        BodySendMode::None,
        BodySendMode::None,
    ))
    .await;
    let r = s.read(1).await;
    assert_eq!(kind(&r[0]), "request_headers");
    let picked = destinations(&r[0]).expect("picked with the headers");
    assert!([A, B].contains(&first(&picked).as_str()), "{picked}");
}

/// A whole JSON answer's first byte comes only when generation ends: its
/// usage does not calibrate the endpoint's prefill rate (an event stream's
/// does, in the test above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_json_answer_does_not_calibrate_the_prefill_rate() {
    let mut picker = start(&[]);
    let mut s = Stream::open(&picker.epp).await;
    let buffered = BodySendMode::Buffered;
    s.send(with_modes(
        headers("/v1/completions", false),
        buffered,
        buffered,
    ))
    .await;
    assert_eq!(kind(&s.read(1).await[0]), "request_headers");
    s.send(body(REQUEST, true)).await;
    assert!(destinations(&s.read(1).await[0]).is_some());
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    s.send(response_headers("application/json", false)).await;
    assert_eq!(kind(&s.read(1).await[0]), "response_headers");
    let answer = br#"{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":6,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}}}"#;
    s.send(response_body(answer, true)).await;
    assert_eq!(kind(&s.read(1).await[0]), "response_body");
    s.close().await;
    let metrics = ic_e2e::http_get(picker.process.admin_addr(), "/metrics").1;
    assert!(
        metrics.contains("inferencecache_index_epp_prefill_rate_observations_total 0"),
        "{metrics}"
    );
}
