//! `POST /events`: validate the whole request, then offer it to the gate.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use ic_coordinator_core::events::{Batch, EventsRequest, EventsResponse};
use ic_coordinator_core::lax::models;

use crate::error::{ApiError, is_json, validate};
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
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge(e.body_text())
        } else {
            ApiError::BadRequest(e.body_text())
        }
    })?;
    // All-or-nothing: one invalid batch rejects the request before any applies.
    let batches = parse(&headers, &bytes).inspect_err(|_| {
        app.metrics.metrics.event_requests_rejected.inc();
    })?;
    check_claims(&app, &batches)?;
    // Applying takes the views lock; keep it off the async worker.
    let app2 = app.clone();
    let queued = app.ingest.queue.enter(batches.len());
    let resp = tokio::task::spawn_blocking(move || {
        let resp = app2.ingest.ingest(&batches);
        drop(queued);
        resp
    })
    .await
    .map_err(|e| ApiError::Internal(format!("ingest task failed: {e}")))?;
    Ok(Json(resp))
}

/// Refuses the request if an entry claims more than `--max-event-entry-bytes`
/// or than the capacity its instance declared (issue: an open `/events`
/// must not let one client inflate a tenant and trigger evictions).
fn check_claims(app: &App, batches: &[Batch]) -> Result<(), ApiError> {
    let max = app.settings.max_event_entry_bytes;
    let refused = app.views.read(|v| {
        batches
            .iter()
            .enumerate()
            .find_map(|(i, b)| v.capacity.check_claims(b, max).err().map(|e| (i, e)))
    });
    let Some((i, e)) = refused else {
        return Ok(());
    };
    app.metrics
        .metrics
        .event_entries_refused
        .get_or_create(&crate::metrics::ReasonLabel { reason: e.reason() })
        .inc();
    app.metrics.metrics.event_requests_rejected.inc();
    tracing::warn!(instance_id = %batches[i].instance_id, reason = e.reason(), %e, "event entry refused");
    Err(ApiError::Pydantic(vec![
        ic_coordinator_core::lax::PydError::value_error(
            &[
                serde_json::json!("body"),
                serde_json::json!("batches"),
                serde_json::json!(i),
                serde_json::json!("entries"),
                serde_json::json!(e.entry()),
            ],
            &e.to_string(),
            &serde_json::Value::Null,
        ),
    ]))
}

/// serde and our validation first; anything they refuse goes through the
/// reference model, which coerces what pydantic would and reports its errors.
fn parse(headers: &HeaderMap, bytes: &[u8]) -> Result<Vec<Batch>, ApiError> {
    let json_type = is_json(headers);
    if json_type
        && let Ok(req) = serde_json::from_slice::<EventsRequest>(bytes)
        && let Ok(batches) = req.validate()
    {
        return Ok(batches);
    }
    let coerced = validate(&models::EVENTS, json_type, bytes)?;
    let req: EventsRequest = serde_json::from_value(coerced).map_err(|e| ApiError::Validation {
        loc: vec![serde_json::json!("body")],
        msg: e.to_string(),
    })?;
    req.validate().map_err(ApiError::from_field)
}
