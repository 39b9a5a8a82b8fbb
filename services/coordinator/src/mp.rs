//! Calls to MP servers' own HTTP endpoints (`DELETE /cache/objects`,
//! `POST /cache/prefetches`, `GET /cache/prefetches/{id}`).

use std::time::Duration;

use serde_json::Value;

/// Timeout of every MP call by default (`--mp-timeout-seconds`), as in the
/// reference.
pub const MP_TIMEOUT: Duration = Duration::from_secs(30);

/// Why an MP call failed.
#[derive(Debug, thiserror::Error)]
pub enum MpError {
    /// The node could not be reached or the exchange broke.
    #[error("{0}")]
    Transport(String),
    /// The node did not answer within `--mp-timeout-seconds`.
    #[error("no answer within {0:?} (--mp-timeout-seconds): {1}")]
    Timeout(Duration, String),
    /// The node answered with a non-2xx status.
    #[error("HTTP {status}: {body}")]
    Status {
        /// Status code.
        status: u16,
        /// Body text.
        body: String,
    },
}

/// A reply relayed as is.
#[derive(Debug)]
pub struct Relayed {
    /// Node's status code.
    pub status: u16,
    /// Node's JSON body, or `{"detail": text}` when it was not JSON.
    pub body: Value,
}

/// Shared HTTP client to MP servers.
#[derive(Clone, Debug)]
pub struct MpClient {
    http: reqwest::Client,
    timeout: Duration,
}

impl Default for MpClient {
    fn default() -> Self {
        Self::new(MP_TIMEOUT)
    }
}

impl MpClient {
    /// A client whose every call gives up after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .unwrap_or_default();
        Self { http, timeout }
    }

    /// The call's failure, a timeout told apart.
    fn failed(&self, e: &reqwest::Error) -> MpError {
        if e.is_timeout() {
            MpError::Timeout(self.timeout, error_chain(e))
        } else {
            MpError::Transport(error_chain(e))
        }
    }

    async fn expect_2xx(
        &self,
        resp: Result<reqwest::Response, reqwest::Error>,
    ) -> Result<Value, MpError> {
        let resp = resp.map_err(|e| self.failed(&e))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| self.failed(&e))?;
        if !status.is_success() {
            return Err(MpError::Status {
                status: status.as_u16(),
                body: text,
            });
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// `DELETE {base}/cache/objects` with `body`.
    pub async fn delete_objects(&self, base: &str, body: &Value) -> Result<Value, MpError> {
        let url = format!("{base}/cache/objects");
        self.expect_2xx(self.http.delete(url).json(body).send().await)
            .await
    }

    /// `POST {base}/cache/prefetches` with `body`.
    pub async fn submit_prefetch(&self, base: &str, body: &Value) -> Result<Value, MpError> {
        let url = format!("{base}/cache/prefetches");
        self.expect_2xx(self.http.post(url).json(body).send().await)
            .await
    }

    /// `GET {base}/cache/prefetches/{request_id}`, relayed verbatim.
    pub async fn prefetch_status(&self, base: &str, request_id: &str) -> Result<Relayed, MpError> {
        let url = format!("{base}/cache/prefetches/{}", encode_segment(request_id));
        let resp = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| self.failed(&e))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| self.failed(&e))?;
        let body =
            serde_json::from_str(&text).unwrap_or_else(|_| serde_json::json!({"detail": text}));
        Ok(Relayed { status, body })
    }
}

/// Percent-encodes a path segment (ids are usually hex; be safe anyway).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
