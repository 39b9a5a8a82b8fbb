//! The fleet's gateway when it routes through the endpoint picker: what
//! Envoy does for each request, over a real ext_proc stream — the request
//! headers, then the buffered OpenAI body — and the endpoint read back from
//! `x-gateway-destination-endpoint`.

use envoy_types::pb::envoy::service::ext_proc::v3::{
    external_processor_client::ExternalProcessorClient, processing_response,
};
use ic_sim::ext_proc;
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
        let body = serde_json::to_vec(&serde_json::json!({
            "model": model,
            "prompt": tokens,
            "max_tokens": 1,
        }))?;
        let mut responses = self
            .client
            .process(futures::stream::iter(ext_proc::buffered(
                "/v1/completions",
                &body,
            )))
            .await?
            .into_inner();
        let mut picked = None;
        // Read to the end, as Envoy does: a stream dropped half-read is reset,
        // and a server sees many resets as an attack and closes the connection.
        while let Some(response) = responses.message().await? {
            if picked.is_some() {
                continue;
            }
            if let Some(processing_response::Response::ImmediateResponse(i)) = &response.response {
                anyhow::bail!("the picker refused the request: {}", i.details);
            }
            let Some(endpoint) = ext_proc::destination(&response) else {
                continue;
            };
            picked = Some(endpoint);
        }
        picked.ok_or_else(|| anyhow::anyhow!("the picker closed the stream without a pick"))
    }
}
