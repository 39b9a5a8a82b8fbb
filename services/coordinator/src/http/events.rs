//! `POST /events`: validate the whole request, then offer it to the gate.

use axum::Json;
use axum::extract::State;
use ic_coordinator_core::events::{EventsRequest, EventsResponse};

use crate::error::{ApiError, Body};
use crate::state::App;

pub(crate) async fn post_events(
    State(app): State<App>,
    body: Result<Body<EventsRequest>, ApiError>,
) -> Result<Json<EventsResponse>, ApiError> {
    if app.settings.kafka.is_some() {
        return Err(ApiError::NotFound(
            "POST /events is disabled: this coordinator consumes cache events from Kafka (--event-transport kafka)".to_owned(),
        ));
    }
    let Body(req) = body.inspect_err(|_| {
        app.metrics.metrics.event_requests_rejected.inc();
    })?;
    // All-or-nothing: one invalid batch rejects the request before any applies.
    let batches = req.validate().map_err(|e| {
        app.metrics.metrics.event_requests_rejected.inc();
        ApiError::from_field(e)
    })?;
    // Applying takes the views lock; keep it off the async worker.
    let app2 = app.clone();
    let resp = tokio::task::spawn_blocking(move || app2.ingest.ingest(&batches))
        .await
        .map_err(|e| ApiError::Internal(format!("ingest task failed: {e}")))?;
    Ok(Json(resp))
}
