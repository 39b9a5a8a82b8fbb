//! The endpoint picker protocol's messages, as Envoy's ext_proc carries
//! them: what the picker reads from a `ProcessingRequest` (headers, the
//! gateway's subset hint, the endpoint that served) and the
//! `ProcessingResponse`s it answers with. No state, no I/O.

use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue, HeaderValueOption, header_value_option,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpHeaders,
    ImmediateResponse, ProcessingRequest, ProcessingResponse, StreamedBodyResponse,
    TrailersResponse, body_mutation, processing_response,
};
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};

/// The header (and `envoy.lb` metadata key) naming the picked endpoints.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The filter-metadata namespace of the gateway's subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The key of the subset hint: the endpoints the picker must choose from.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The dynamic- and filter-metadata namespace of the destination.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The key under [`LB_NAMESPACE`] naming the endpoint that served the
/// request (the gateway may have retried down the list).
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";
/// The request header naming the request's InferenceObjective.
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";
/// The ext_proc call's gRPC metadata naming the request's pool,
/// `[NAMESPACE/]NAME`, when one picker serves several (Envoy's
/// `grpc_initial_metadata`, per route in `ExtProcPerRoute`).
pub const POOL_METADATA: &str = "x-inferencecache-pool";

/// The gateway's subset hint: `None` when it sent none; the endpoints
/// otherwise (empty when the entry is there but names none). The entry is a
/// list of `ip:port` strings; each string may itself be a comma-separated
/// list, and a single string is accepted as one, as gateways send both.
pub fn subset_hint(req: &ProcessingRequest) -> Option<Vec<String>> {
    let value = req
        .metadata_context
        .as_ref()?
        .filter_metadata
        .get(SUBSET_NAMESPACE)?
        .fields
        .get(SUBSET_KEY)?;
    let mut out = Vec::new();
    let mut add = |s: &str| {
        for e in s.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if !out.iter().any(|x: &String| x == e) {
                out.push(e.to_owned());
            }
        }
    };
    match &value.kind {
        Some(Kind::ListValue(list)) => {
            for v in &list.values {
                if let Some(Kind::StringValue(s)) = &v.kind {
                    add(s);
                }
            }
        }
        Some(Kind::StringValue(s)) => add(s),
        _ => {}
    }
    Some(out)
}

/// The endpoint that served the request, when the gateway reports it
/// (`envoy.lb` / `x-gateway-destination-endpoint-served` in the response
/// messages' metadata).
pub fn served_endpoint(req: &ProcessingRequest) -> Option<String> {
    let value = req
        .metadata_context
        .as_ref()?
        .filter_metadata
        .get(LB_NAMESPACE)?
        .fields
        .get(SERVED_KEY)?;
    match &value.kind {
        Some(Kind::StringValue(s)) => s
            .split(',')
            .map(str::trim)
            .find(|s| !s.is_empty())
            .map(str::to_owned),
        _ => None,
    }
}

/// The value of header `name` (case-insensitive), `raw_value` or `value`.
pub fn header(headers: &HttpHeaders, name: &str) -> Option<String> {
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

/// The destination as Envoy reads it: `endpoints` (best first) joined with
/// commas in the header and, identical, under `envoy.lb` in the dynamic
/// metadata.
fn destination(endpoints: &[String]) -> (HeaderMutation, Struct) {
    let value = endpoints.join(",");
    let mutation = HeaderMutation {
        set_headers: vec![HeaderValueOption {
            header: Some(HeaderValue {
                key: DESTINATION.to_owned(),
                raw_value: value.as_bytes().to_vec(),
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
        fields: [(DESTINATION.to_owned(), string_value(&value))].into(),
    };
    let metadata = Struct {
        fields: [(
            LB_NAMESPACE.to_owned(),
            Value {
                kind: Some(Kind::StructValue(lb)),
            },
        )]
        .into(),
    };
    (mutation, metadata)
}

fn common(endpoints: Option<&[String]>, streamed: Option<(Vec<u8>, bool)>) -> CommonResponse {
    CommonResponse {
        header_mutation: endpoints.map(|e| destination(e).0),
        clear_route_cache: endpoints.is_some(),
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
    }
}

/// The answer to the request headers, with the destination when picked.
pub fn request_headers(endpoints: Option<&[String]>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestHeaders(
            HeadersResponse {
                response: Some(common(endpoints, None)),
            },
        )),
        dynamic_metadata: endpoints.map(|e| destination(e).1),
        ..ProcessingResponse::default()
    }
}

/// The answer to a request body message: the destination when picked, the
/// chunk streamed back (FULL_DUPLEX_STREAMED) or left as it is (`None`).
pub fn request_body(
    endpoints: Option<&[String]>,
    streamed: Option<(Vec<u8>, bool)>,
) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestBody(BodyResponse {
            response: Some(common(endpoints, streamed)),
        })),
        dynamic_metadata: endpoints.map(|e| destination(e).1),
        ..ProcessingResponse::default()
    }
}

/// The answer to the request trailers (unchanged), with the destination in
/// the dynamic metadata when the pick is made this late.
pub fn request_trailers(endpoints: Option<&[String]>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::RequestTrailers(
            TrailersResponse::default(),
        )),
        dynamic_metadata: endpoints.map(|e| destination(e).1),
        ..ProcessingResponse::default()
    }
}

/// The answer to the response headers (unchanged).
pub fn response_headers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseHeaders(
            HeadersResponse {
                response: Some(CommonResponse::default()),
            },
        )),
        ..ProcessingResponse::default()
    }
}

/// The answer to a response body message: streamed back unchanged
/// (FULL_DUPLEX_STREAMED) or left as it is (`None`).
pub fn response_body(streamed: Option<(Vec<u8>, bool)>) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseBody(BodyResponse {
            response: Some(common(None, streamed)),
        })),
        ..ProcessingResponse::default()
    }
}

/// The answer to the response trailers (unchanged).
pub fn response_trailers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(processing_response::Response::ResponseTrailers(
            TrailersResponse::default(),
        )),
        ..ProcessingResponse::default()
    }
}

/// An error answered by the gateway itself, as the protocol asks: 503 when
/// nothing can serve, 429 when the pool is saturated, 413 for a body over
/// the picker's limit.
pub fn refusal(code: StatusCode, detail: &str) -> ProcessingResponse {
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

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::Metadata;
    use envoy_types::pb::google::protobuf::ListValue;

    fn with_metadata(ns: &str, key: &str, value: Kind) -> ProcessingRequest {
        ProcessingRequest {
            metadata_context: Some(Metadata {
                filter_metadata: [(
                    ns.to_owned(),
                    Struct {
                        fields: [(key.to_owned(), Value { kind: Some(value) })].into(),
                    },
                )]
                .into(),
                ..Metadata::default()
            }),
            ..ProcessingRequest::default()
        }
    }

    #[test]
    fn subset_hints_as_lists_and_comma_separated_strings() {
        let list = |items: &[&str]| {
            Kind::ListValue(ListValue {
                values: items.iter().map(|s| string_value(s)).collect(),
            })
        };
        let hint = |kind| subset_hint(&with_metadata(SUBSET_NAMESPACE, SUBSET_KEY, kind));
        let ab = Some(vec!["10.0.0.1:80".to_owned(), "10.0.0.2:80".to_owned()]);
        assert_eq!(hint(list(&["10.0.0.1:80", "10.0.0.2:80"])), ab);
        assert_eq!(hint(list(&["10.0.0.1:80, 10.0.0.2:80"])), ab);
        assert_eq!(
            hint(Kind::StringValue("10.0.0.1:80,10.0.0.2:80".into())),
            ab
        );
        assert_eq!(hint(list(&["10.0.0.1:80", "10.0.0.1:80,10.0.0.2:80"])), ab);
        assert_eq!(hint(list(&[])), Some(Vec::new()));
        assert_eq!(hint(Kind::BoolValue(true)), Some(Vec::new()));
        assert_eq!(subset_hint(&ProcessingRequest::default()), None);
    }

    #[test]
    fn the_served_endpoint_is_read_from_envoy_lb() {
        let served = |s: &str| {
            served_endpoint(&with_metadata(
                LB_NAMESPACE,
                SERVED_KEY,
                Kind::StringValue(s.into()),
            ))
        };
        assert_eq!(served("10.0.0.2:80").as_deref(), Some("10.0.0.2:80"));
        assert_eq!(served(" 10.0.0.2:80 ,x").as_deref(), Some("10.0.0.2:80"));
        assert_eq!(served(""), None);
        assert_eq!(served_endpoint(&ProcessingRequest::default()), None);
    }

    #[test]
    fn the_destination_lists_endpoints_best_first_in_header_and_metadata() {
        let r = request_headers(Some(&["a:1".to_owned(), "b:2".to_owned()]));
        let Some(processing_response::Response::RequestHeaders(h)) = &r.response else {
            panic!("{r:?}")
        };
        let c = h.response.as_ref().unwrap();
        assert!(c.clear_route_cache);
        let set = &c.header_mutation.as_ref().unwrap().set_headers[0];
        assert_eq!(set.header.as_ref().unwrap().raw_value, b"a:1,b:2");
        let Some(Kind::StructValue(lb)) =
            &r.dynamic_metadata.as_ref().unwrap().fields[LB_NAMESPACE].kind
        else {
            panic!("{r:?}")
        };
        assert_eq!(lb.fields[DESTINATION], string_value("a:1,b:2"));
    }
}
