//! `PrefetchManager`: warm a named node's L1 from L2 and relay its status.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::controller::Controller;
use crate::http::error::{ApiError, Body};
use crate::metrics::inc;
use crate::state::App;

/// The prefetch controller (stateless: the node tracks its jobs).
#[derive(Debug, Default)]
pub struct PrefetchManager;

impl Controller for PrefetchManager {
    fn name(&self) -> &'static str {
        "PrefetchManager"
    }

    fn routes(self: Arc<Self>, app: App) -> Option<Router> {
        Some(
            Router::new()
                .route("/cache/prefetches", post(submit))
                .route("/cache/prefetches/{instance_id}/{request_id}", get(status))
                .with_state(app),
        )
    }
}

#[derive(Debug, Deserialize)]
struct PrefetchRequest {
    instance_id: String,
    model_name: String,
    world_size: i64,
    #[serde(default)]
    token_ids: Vec<i64>,
    #[serde(default)]
    cache_salt: String,
}

/// The base URL of a registered instance, or the reference's 404.
pub(crate) fn instance_url(app: &App, id: &str) -> Result<String, ApiError> {
    app.registry
        .lock()
        .get(id)
        .map(|r| r.base_url())
        .ok_or_else(|| {
            ApiError::NotFound(format!("no MP server registered with instance_id='{id}'"))
        })
}

async fn submit(
    State(app): State<App>,
    Body(req): Body<PrefetchRequest>,
) -> Result<Json<Value>, ApiError> {
    if req.world_size < 1 {
        return Err(ApiError::body("world_size", "world_size must be >= 1"));
    }
    let base = instance_url(&app, &req.instance_id)?;
    let body = json!({"model_name": req.model_name, "world_size": req.world_size,
                      "token_ids": req.token_ids, "cache_salt": req.cache_salt});
    let m = &app.metrics.metrics;
    match app.mp.submit_prefetch(&base, &body).await {
        Ok(reply) => {
            app.count_mp("prefetch_submit", true);
            inc(&m.prefetch_requests, "submitted");
            Ok(Json(json!({
                "instance_id": req.instance_id,
                "request_id": reply.get("request_id").and_then(Value::as_str).unwrap_or(""),
                "chunks": reply.get("chunks").and_then(Value::as_i64).unwrap_or(0),
                "status": reply.get("status").and_then(Value::as_str).unwrap_or("submitted"),
            })))
        }
        Err(error) => {
            app.count_mp("prefetch_submit", false);
            inc(&m.prefetch_requests, "failed");
            tracing::warn!(instance_id = %req.instance_id, %error, "prefetch submit failed");
            Err(ApiError::BadGateway(format!(
                "prefetch submit to '{}' failed: {error}",
                req.instance_id
            )))
        }
    }
}

async fn status(
    State(app): State<App>,
    Path((instance_id, request_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let base = instance_url(&app, &instance_id)?;
    match app.mp.prefetch_status(&base, &request_id).await {
        Ok(relayed) => {
            app.count_mp("prefetch_status", true);
            if relayed.body.get("status").and_then(Value::as_str) == Some("completed") {
                let m = &app.metrics.metrics;
                m.prefetch_found_keys.inc_by(
                    relayed
                        .body
                        .get("found_keys")
                        .and_then(Value::as_u64)
                        .unwrap_or(0),
                );
                m.prefetch_total_keys.inc_by(
                    relayed
                        .body
                        .get("total_keys")
                        .and_then(Value::as_u64)
                        .unwrap_or(0),
                );
            }
            let code = StatusCode::from_u16(relayed.status).unwrap_or(StatusCode::BAD_GATEWAY);
            Ok((code, Json(relayed.body)).into_response())
        }
        Err(error) => {
            app.count_mp("prefetch_status", false);
            Err(ApiError::BadGateway(format!(
                "prefetch status from '{instance_id}' failed: {error}"
            )))
        }
    }
}
