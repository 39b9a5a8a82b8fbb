//! What a gateway sends an endpoint picker over Envoy's ext_proc protocol,
//! built from Envoy's own protos: request headers, body chunks, the body
//! mode, and reading the picked endpoint back.

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
    processing_request, processing_response,
};

/// The request headers of a `POST` to `path`.
pub fn headers(path: &str, end_of_stream: bool) -> ProcessingRequest {
    let header = |k: &str, v: &str| HeaderValue {
        key: k.into(),
        raw_value: v.as_bytes().to_vec(),
        ..HeaderValue::default()
    };
    ProcessingRequest {
        request: Some(processing_request::Request::RequestHeaders(HttpHeaders {
            headers: Some(HeaderMap {
                headers: vec![
                    header(":method", "POST"),
                    header(":path", path),
                    header("content-type", "application/json"),
                ],
            }),
            end_of_stream,
            ..HttpHeaders::default()
        })),
        ..ProcessingRequest::default()
    }
}

/// One body chunk.
pub fn body(bytes: &[u8], end_of_stream: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream,
            ..HttpBody::default()
        })),
        ..ProcessingRequest::default()
    }
}

/// `message` announcing the filter's request body mode (Envoy sends it on
/// the first message).
pub fn with_mode(mut message: ProcessingRequest, mode: BodySendMode) -> ProcessingRequest {
    message.protocol_config = Some(ProtocolConfiguration {
        request_body_mode: mode as i32,
        ..ProtocolConfiguration::default()
    });
    message
}

/// A whole request in BUFFERED mode: headers, then the body in one message.
pub fn buffered(path: &str, bytes: &[u8]) -> Vec<ProcessingRequest> {
    vec![
        with_mode(headers(path, false), BodySendMode::Buffered),
        body(bytes, true),
    ]
}

/// The endpoint a headers or body response picked: the first of its
/// `x-gateway-destination-endpoint` header mutation (the rest are
/// fallbacks, as Envoy reads the list).
pub fn destination(response: &ProcessingResponse) -> Option<String> {
    let all = destinations(response)?;
    all.split(',').next().map(|e| e.trim().to_owned())
}

/// The whole `x-gateway-destination-endpoint` value of a headers or body
/// response: the pick, then its fallbacks, comma-separated.
pub fn destinations(response: &ProcessingResponse) -> Option<String> {
    let common = match response.response.as_ref()? {
        processing_response::Response::RequestHeaders(h) => h.response.as_ref()?,
        processing_response::Response::RequestBody(b) => b.response.as_ref()?,
        _ => return None,
    };
    common
        .header_mutation
        .as_ref()?
        .set_headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .find(|h| h.key == "x-gateway-destination-endpoint")
        .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned())
}
