//! HTTP API next to the admin endpoints: `GET /snapshot` (read by the
//! controller's CacheIndex poller), `POST /probe` (the functional probe,
//! see [`crate::probe`]) and `GET /healthz`.
//!
//! `/snapshot` schema (JSON, stable field names):
//!
//! ```json
//! {"generatedAt": "2026-11-30T05:00:00Z", "entries": 123,
//!  "replicas": [{"tenant": "ns", "replicaId": "pod-0", "dpRank": 0,
//!                "address": "10.0.0.7:8000", "model": "m", "hashScheme": "vllm",
//!                "adapter": "", "prefixCount": 100, "t1Count": 80,
//!                "blockSize": 16, "lastEventAt": "…" | null, "lastSeenAt": "…",
//!                "cacheMemoryBytes": 3221225472 | null,
//!                "cacheCapacityTokens": 500000 | null, "hitRateReported": false,
//!                "tier2Hits": 3 | null, "tier2Queries": 10 | null}]}
//! ```
//!
//! `cacheMemoryBytes`/`cacheCapacityTokens` are null unless the engine's
//! metrics export them (on the pod's rank-0 row, for the whole pod);
//! `tier2Hits`/`tier2Queries` are null when the engine exports no tier-2
//! counters (absent is not zero).

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ic_index::Index;

use crate::auth::{AuthError, ProbeAuth};
use crate::convert::PROBE_TENANT;
use crate::index_core::{EngineReports, IndexCore};
use crate::metrics::{Metrics, ReasonLabel};
use crate::probe::{ProbeRequest, Prober};

/// Largest `/probe` body accepted.
pub const MAX_PROBE_BODY_BYTES: usize = 16 * 1024;

/// The `/snapshot` body: the one definition the controller and icctl read.
pub use ic_index_http::{Snapshot, SnapshotReplica};

/// RFC 3339 UTC with second precision, from Unix milliseconds.
pub fn rfc3339(ms: i64) -> String {
    let seconds = ms.div_euclid(1000).clamp(
        jiff::Timestamp::MIN.as_second(),
        jiff::Timestamp::MAX.as_second(),
    );
    jiff::Timestamp::from_second(seconds)
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

/// Builds the snapshot body.
pub fn snapshot(index: &Index, reports: &EngineReports, now_ms: i64) -> Snapshot {
    let rows = index.snapshot();
    let present = rows.iter().map(|r| &r.key).collect();
    let reports = reports.of_present(&present);
    Snapshot {
        generated_at: rfc3339(now_ms),
        entries: index.len(),
        replicas: rows
            .into_iter()
            // The functional probe's synthetic replicas are not real.
            .filter(|r| r.key.tenant != PROBE_TENANT)
            .map(|r| {
                let report = reports.get(&r.key).copied().unwrap_or_default();
                SnapshotReplica {
                    tenant: r.key.tenant,
                    replica_id: r.key.replica_id,
                    dp_rank: r.key.dp_rank,
                    address: r.address,
                    model: r.scope.model,
                    hash_scheme: r.scope.hash_scheme.as_str().to_owned(),
                    adapter: r.scope.adapter,
                    prefix_count: r.prefix_count,
                    t1_count: r.t1_count,
                    block_size: r.block_size,
                    last_event_at: r.last_event_ms.map(rfc3339),
                    last_seen_at: rfc3339(r.last_seen_ms),
                    cache_memory_bytes: report.cache.and_then(|c| c.memory_bytes),
                    cache_capacity_tokens: report.cache.and_then(|c| c.capacity_tokens),
                    history_incomplete: report.history_incomplete,
                    hit_rate_reported: false,
                    tier2_hits: r.tier2.map(|t| t.0),
                    tier2_queries: r.tier2.map(|t| t.1),
                }
            })
            .collect(),
    }
}

/// What the HTTP handlers share.
#[derive(Clone, Debug)]
pub struct HttpState {
    /// The index, its metrics and the engines' reports.
    pub core: Arc<IndexCore>,
    /// Runs functional probes.
    pub prober: Prober,
    /// Authenticates `/probe`.
    pub auth: Arc<ProbeAuth>,
    /// Who may read `/snapshot`.
    pub access: Arc<crate::access::ApiAccess>,
}

/// A JSON error body `{"error": "..."}`.
fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

fn refuse(
    metrics: &Metrics,
    reason: &'static str,
    status: StatusCode,
    message: String,
) -> Response {
    metrics
        .probe_refusals
        .get_or_create(&ReasonLabel { reason })
        .inc();
    tracing::warn!(reason, %message, "probe request refused");
    error(status, message)
}

async fn probe(State(state): State<HttpState>, headers: HeaderMap, body: Bytes) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Err(e) = state.auth.check(authorization).await {
        let status = match e {
            AuthError::Missing | AuthError::Rejected(_) => StatusCode::UNAUTHORIZED,
            AuthError::Forbidden(_) => StatusCode::FORBIDDEN,
            AuthError::Disabled(_) | AuthError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut response = refuse(state.core.metrics(), e.reason(), status, e.to_string());
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        return response;
    }
    let request: ProbeRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return refuse(
                state.core.metrics(),
                "bad_request",
                StatusCode::BAD_REQUEST,
                format!("body must be JSON {{\"namespace\": \"...\", \"backend\": \"...\"}}: {e}"),
            );
        }
    };
    if let Err(e) = request.validate() {
        return refuse(
            state.core.metrics(),
            "bad_request",
            StatusCode::BAD_REQUEST,
            e,
        );
    }
    let prober = state.prober.clone();
    let now_ms = state.core.now_ms();
    match tokio::task::spawn_blocking(move || prober.run(&request, now_ms)).await {
        Ok(report) => Json(report).into_response(),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("probe task failed: {e}"),
        ),
    }
}

async fn get_snapshot(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    use crate::access::Denied;
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let allowed = match state.access.authenticate(authorization).await {
        Ok(caller) => state.access.authorize_snapshot(&caller).await,
        Err(denied) => Err(denied),
    };
    if let Err(denied) = allowed {
        state.core.metrics().access_refused("snapshot", &denied);
        let status = match denied {
            Denied::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Denied::PermissionDenied(_) => StatusCode::FORBIDDEN,
            Denied::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        let mut response = error(status, denied.to_string());
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        return response;
    }
    Json(snapshot(
        state.core.index(),
        state.core.reports(),
        state.core.now_ms(),
    ))
    .into_response()
}

/// The routes.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/snapshot", get(get_snapshot))
        .route(
            "/probe",
            post(probe).layer(DefaultBodyLimit::max(MAX_PROBE_BODY_BYTES)),
        )
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000_250), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
    }
}
