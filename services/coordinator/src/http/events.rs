//! `POST /events`: validate the whole request, then offer it to the gate.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use ic_coordinator_core::events::{self, Batch, EventsRequest, EventsResponse};
use ic_coordinator_core::lax::models;

use crate::error::{ApiError, is_json, validate};
use crate::ingest::{Refused, SubmitError};
use crate::state::App;

pub(crate) async fn post_events(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Json<EventsResponse>, ApiError> {
    if app.settings.kafka.is_some() {
        return Err(ApiError::NotFound(
            "POST /events is disabled: this coordinator consumes cache events from Kafka (--event-transport kafka)".to_owned(),
        ));
    }
    let bytes = body.map_err(|e| {
        app.metrics.metrics.event_requests_rejected.inc();
        crate::error::body_rejection(e)
    })?;
    // All-or-nothing: one invalid batch rejects the request before any applies.
    let batches = parse(&headers, &bytes).inspect_err(|_| {
        app.metrics.metrics.event_requests_rejected.inc();
    })?;
    // One writer applies every request in order (and checks the entries'
    // claims against the declared capacity under the same lock).
    let settings = &app.settings;
    match app
        .ingest
        .submit(batches, settings.max_event_entry_bytes)
        .await
    {
        Ok(resp) => Ok(Json(resp)),
        Err(SubmitError::Refused(refused)) => Err(refusal(&app, &refused)),
        Err(e @ SubmitError::WriterFailed) => Err(ApiError::Internal(e.to_string())),
        Err(e @ SubmitError::QueueFull(_)) => {
            app.metrics.metrics.event_requests_rejected.inc();
            Err(ApiError::Unavailable(e.to_string()))
        }
    }
}

/// The 422 for an entry that claims more than `--max-event-entry-bytes` or
/// than the capacity its instance declared (issue: an open `/events` must
/// not let one client inflate a tenant and trigger evictions).
fn refusal(app: &App, refused: &Refused) -> ApiError {
    let e = &refused.error;
    app.metrics
        .metrics
        .event_entries_refused
        .get_or_create(&crate::metrics::ReasonLabel { reason: e.reason() })
        .inc();
    app.metrics.metrics.event_requests_rejected.inc();
    tracing::warn!(instance_id = %refused.instance_id, batch = refused.batch, reason = e.reason(), %e, "event entry refused");
    ApiError::Pydantic(vec![ic_coordinator_core::lax::PydError::value_error(
        &[
            serde_json::json!("body"),
            serde_json::json!("batches"),
            serde_json::json!(refused.batch),
            serde_json::json!("entries"),
            serde_json::json!(e.entry()),
        ],
        &e.to_string(),
        &serde_json::Value::Null,
    )])
}

/// serde and our validation first; anything they refuse goes through the
/// reference model, which coerces what pydantic would and reports its errors.
fn parse(headers: &HeaderMap, bytes: &[u8]) -> Result<Vec<Batch>, ApiError> {
    let json_type = is_json(headers);
    if json_type && let Some(batches) = events::decode_valid(bytes) {
        return Ok(batches);
    }
    let coerced = validate(&models::EVENTS, json_type, bytes)?;
    let req: EventsRequest = serde_json::from_value(coerced).map_err(|e| ApiError::Validation {
        loc: vec![serde_json::json!("body")],
        msg: e.to_string(),
    })?;
    req.validate().map_err(ApiError::from_field)
}
