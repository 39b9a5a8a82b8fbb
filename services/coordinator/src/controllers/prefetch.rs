//! `PrefetchManager`: warm a named node's L1 from L2 and relay its status.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::actions::ActionError;
use crate::controller::{Context, Controller};
use crate::error::{ApiError, Body};
use crate::http::compat::no_allow;
use crate::metrics::inc;

/// The prefetch controller (stateless: the node tracks its jobs).
#[derive(Debug, Default)]
pub struct PrefetchManager;

impl Controller for PrefetchManager {
    fn name(&self) -> &'static str {
        "PrefetchManager"
    }

    fn routes(self: Arc<Self>, ctx: Context) -> Option<Router> {
        Some(
            Router::new()
                .route("/cache/prefetches", no_allow(post(submit)))
                .route(
                    "/cache/prefetches/{instance_id}/{request_id}",
                    no_allow(get(status)),
                )
                .with_state(ctx),
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

impl crate::error::Schema for PrefetchRequest {
    const MODEL: &'static ic_coordinator_core::lax::Model =
        &ic_coordinator_core::lax::models::PREFETCH;
    fn valid(&self) -> bool {
        self.world_size >= 1
    }
}

/// An action error as the reference answers it: 404 for an unknown
/// instance, 502 (with `what`) when the call failed.
pub(crate) fn action_error(what: &str, instance_id: &str, error: ActionError) -> ApiError {
    match error {
        ActionError::UnknownInstance(_) => ApiError::NotFound(error.to_string()),
        ActionError::Mp(error) => {
            ApiError::BadGateway(format!("{what} '{instance_id}' failed: {error}"))
        }
    }
}

async fn submit(
    State(ctx): State<Context>,
    Body(req): Body<PrefetchRequest>,
) -> Result<Json<Value>, ApiError> {
    if req.world_size < 1 {
        return Err(ApiError::body("world_size", "world_size must be >= 1"));
    }
    let body = json!({"model_name": req.model_name, "world_size": req.world_size,
                      "token_ids": req.token_ids, "cache_salt": req.cache_salt});
    let m = &ctx.metrics.metrics;
    match ctx.actions.submit_prefetch(&req.instance_id, &body).await {
        Ok(reply) => {
            inc(&m.prefetch_requests, "submitted");
            Ok(Json(json!({
                "instance_id": req.instance_id,
                "request_id": reply.get("request_id").and_then(Value::as_str).unwrap_or(""),
                "chunks": reply.get("chunks").and_then(Value::as_i64).unwrap_or(0),
                "status": reply.get("status").and_then(Value::as_str).unwrap_or("submitted"),
            })))
        }
        Err(error) => {
            if matches!(error, ActionError::Mp(_)) {
                inc(&m.prefetch_requests, "failed");
                tracing::warn!(instance_id = %req.instance_id, %error, "prefetch submit failed");
            }
            Err(action_error("prefetch submit to", &req.instance_id, error))
        }
    }
}

async fn status(
    State(ctx): State<Context>,
    Path((instance_id, request_id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    match ctx.actions.prefetch_status(&instance_id, &request_id).await {
        Ok(relayed) => {
            if relayed.body.get("status").and_then(Value::as_str) == Some("completed") {
                let m = &ctx.metrics.metrics;
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
        Err(error) => Err(action_error("prefetch status from", &instance_id, error)),
    }
}
