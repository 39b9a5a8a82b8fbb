//! `/instances`: registration, heartbeats, listing and usage.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use ic_coordinator_core::registry::InstanceRecord;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, Body, Schema};
use crate::state::App;

#[derive(Debug, Deserialize)]
pub(crate) struct RegisterRequest {
    #[serde(default)]
    instance_id: String,
    ip: String,
    http_port: i64,
    #[serde(default)]
    metadata: BTreeMap<String, String>,
    #[serde(default)]
    p2p_advertised_url: String,
    #[serde(default)]
    mq_port: i64,
}

impl Schema for RegisterRequest {
    const MODEL: &'static ic_coordinator_core::lax::Model =
        &ic_coordinator_core::lax::models::REGISTER;
    fn valid(&self) -> bool {
        !self.ip.trim().is_empty()
            && (1..=65535).contains(&self.http_port)
            && (0..=65535).contains(&self.mq_port)
    }
}

pub(crate) async fn register(
    State(app): State<App>,
    Body(req): Body<RegisterRequest>,
) -> Result<Json<Value>, ApiError> {
    let ip = req.ip.trim();
    if ip.is_empty() {
        return Err(ApiError::body("ip", "ip must not be empty"));
    }
    let http_port = u16::try_from(req.http_port)
        .ok()
        .filter(|p| *p >= 1)
        .ok_or_else(|| ApiError::body("http_port", "http_port must be in 1..65535"))?;
    let mq_port = u16::try_from(req.mq_port)
        .map_err(|_| ApiError::body("mq_port", "mq_port must be in 0..65535"))?;
    let mut instance_id = req.instance_id.trim().to_owned();
    if instance_id.is_empty() {
        instance_id = format!("mp-{}", uuid::Uuid::new_v4().simple());
    }
    let record = InstanceRecord {
        instance_id: instance_id.clone(),
        ip: ip.to_owned(),
        http_port,
        registration_time: app.clock.unix_seconds(),
        metadata: req.metadata,
        p2p_advertised_url: req.p2p_advertised_url.trim().to_owned(),
        mq_port,
    };
    let re_registered = app.instances.register(record);
    tracing::info!(instance_id = %instance_id, re_registered, "instance registered");
    Ok(Json(
        json!({"instance_id": instance_id, "re_registered": re_registered}),
    ))
}

pub(crate) async fn heartbeat(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if app.instances.heartbeat(&id) {
        Ok(Json(json!({"instance_id": id})))
    } else {
        Err(ApiError::UnknownInstance(format!(
            "unknown instance {id}; re-register"
        )))
    }
}

pub(crate) async fn deregister(
    State(app): State<App>,
    Path(id): Path<String>,
) -> impl IntoResponse {
    let was = app.deregister(&id).await;
    tracing::info!(instance_id = %id, was_registered = was, "instance deregistered");
    StatusCode::NO_CONTENT
}

/// `DELETE /instances/usage`: in the reference's route order
/// `DELETE /instances/{instance_id}` comes first and takes `usage` as an id.
pub(crate) async fn deregister_usage(State(app): State<App>) -> impl IntoResponse {
    deregister(State(app), Path("usage".to_owned())).await
}

pub(crate) async fn list(State(app): State<App>) -> Json<Value> {
    let instances: Vec<InstanceRecord> = app.instances.records();
    Json(json!({"instances": instances}))
}

pub(crate) async fn fleet_usage(State(app): State<App>) -> Json<Value> {
    let registered = app.instances.ids();
    Json(
        app.views
            .read(|views| json!(views.usage.fleet_usage(&registered, &views.capacity))),
    )
}

pub(crate) async fn instance_usage(
    State(app): State<App>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let registered = app.instances.contains(&id);
    app.views.read(|views| {
        if !views.usage.knows(&id, registered, &views.capacity) {
            return Err(ApiError::NotFound(format!("unknown instance '{id}'")));
        }
        Ok(Json(json!(views.usage.instance_usage(
            &id,
            registered,
            &views.capacity
        ))))
    })
}
