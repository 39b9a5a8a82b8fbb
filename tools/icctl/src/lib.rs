//! `icctl`: the operator CLI. Talks to the index server (gRPC LookupRoute,
//! HTTP /snapshot) and the coordinator (its REST API), prints tables for
//! people and JSON for machines (`-o json`).

pub mod check;
pub mod cli;
pub mod coordinator;
pub mod index;
pub mod parse;
pub mod table;

/// The current span's W3C trace context (`traceparent`) as HTTP headers;
/// empty unless `--otlp-endpoint` is set. Every request icctl sends carries
/// it, so a command is one trace across the servers it calls.
pub(crate) fn trace_headers() -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    for (key, value) in ic_telemetry::otel::context_of(&tracing::Span::current()) {
        if let (Ok(key), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(key.as_bytes()),
            reqwest::header::HeaderValue::from_str(&value),
        ) {
            headers.insert(key, value);
        }
    }
    headers
}
