//! The fleet's gateway when it routes through the endpoint picker: what
//! Envoy does for each request, over a real ext_proc stream — the request
//! headers, then the buffered OpenAI body — and the endpoint read back from
//! `x-gateway-destination-endpoint`.

use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProtocolConfiguration,
    external_processor_client::ExternalProcessorClient, processing_request, processing_response,
};
use tonic::transport::Channel;

/// An ext_proc client to the picker.
#[derive(Clone, Debug)]
pub struct Gateway {
    client: ExternalProcessorClient<Channel>,
}

impl Gateway {
    /// Connects to the picker at `url`.
    pub async fn connect(url: String) -> anyhow::Result<Self> {
        Ok(Self {
            client: ExternalProcessorClient::connect(url).await?,
        })
    }

    /// Asks where a `/v1/completions` request for `model` with `tokens` as
    /// its prompt goes; the picked `ip:port`.
    pub async fn pick(&mut self, model: &str, tokens: &[u32]) -> anyhow::Result<String> {
        let header = |k: &str, v: &str| HeaderValue {
            key: k.into(),
            raw_value: v.as_bytes().to_vec(),
            ..HeaderValue::default()
        };
        let headers = ProcessingRequest {
            request: Some(processing_request::Request::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap {
                    headers: vec![
                        header(":method", "POST"),
                        header(":path", "/v1/completions"),
                        header("content-type", "application/json"),
                    ],
                }),
                end_of_stream: false,
                ..HttpHeaders::default()
            })),
            protocol_config: Some(ProtocolConfiguration {
                request_body_mode: BodySendMode::Buffered as i32,
                ..ProtocolConfiguration::default()
            }),
            ..ProcessingRequest::default()
        };
        let body = serde_json::to_vec(&serde_json::json!({
            "model": model,
            "prompt": tokens,
            "max_tokens": 1,
        }))?;
        let body = ProcessingRequest {
            request: Some(processing_request::Request::RequestBody(HttpBody {
                body,
                end_of_stream: true,
                ..HttpBody::default()
            })),
            ..ProcessingRequest::default()
        };
        let mut responses = self
            .client
            .process(futures::stream::iter([headers, body]))
            .await?
            .into_inner();
        let mut picked = None;
        // Read to the end, as Envoy does: a stream dropped half-read is reset,
        // and a server sees many resets as an attack and closes the connection.
        while let Some(response) = responses.message().await? {
            if picked.is_some() {
                continue;
            }
            let common = match response.response {
                Some(processing_response::Response::RequestBody(b)) => b.response,
                Some(processing_response::Response::ImmediateResponse(i)) => {
                    anyhow::bail!("the picker refused the request: {}", i.details)
                }
                _ => continue,
            };
            let endpoint = common
                .and_then(|c| c.header_mutation)
                .into_iter()
                .flat_map(|m| m.set_headers)
                .filter_map(|h| h.header)
                .find(|h| h.key == "x-gateway-destination-endpoint")
                .map(|h| String::from_utf8_lossy(&h.raw_value).into_owned());
            picked = Some(endpoint.ok_or_else(|| anyhow::anyhow!("the picker named no endpoint"))?);
        }
        picked.ok_or_else(|| anyhow::anyhow!("the picker closed the stream without a pick"))
    }
}
