//! The REST API: core routes (instances, events, directory, health,
//! metrics, status) plus the routes of each enabled controller.

pub mod access;
pub mod compat;
pub mod directory;
pub mod events;
pub mod instances;
pub mod status;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use serde_json::json;
use std::borrow::Cow;

use crate::state::App;

/// Largest accepted request body by default (`--max-body-bytes`). A full
/// 1,000,000-token request is about 8 MB of JSON; event batches are far
/// smaller.
pub const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Builds the whole router with the operator endpoints open (LMCache's
/// behaviour).
pub fn router(app: App) -> Router {
    router_with(app, access::OperatorAccess::Open)
}

/// Builds the whole router, the operator endpoints guarded by `access`.
pub fn router_with(app: App, access: access::OperatorAccess) -> Router {
    let mut router = Router::new()
        .route("/openapi.json", compat::no_allow(get(compat::openapi)))
        .route("/docs", compat::no_allow(get(compat::docs)))
        .route(
            "/docs/oauth2-redirect",
            compat::no_allow(get(compat::oauth2_redirect)),
        )
        .route("/redoc", compat::no_allow(get(compat::redoc)))
        .route("/healthz", compat::no_allow(get(healthz)))
        .route("/live", compat::no_allow(get(|| async { "ok\n" })))
        .route("/ready", compat::no_allow(get(ready)))
        .route("/metrics", compat::no_allow(get(metrics)))
        .route("/status", compat::no_allow(get(status::status)))
        .route(
            "/instances",
            compat::no_allow(post(instances::register).get(instances::list)),
        )
        .route(
            "/instances/usage",
            compat::no_allow(get(instances::fleet_usage).delete(instances::deregister_usage)),
        )
        .route(
            "/instances/{instance_id}",
            compat::no_allow(delete(instances::deregister)),
        )
        .route(
            "/instances/{instance_id}/heartbeat",
            compat::no_allow(put(instances::heartbeat)),
        )
        .route(
            "/instances/{instance_id}/usage",
            compat::no_allow(get(instances::instance_usage)),
        )
        .route("/events", compat::no_allow(post(events::post_events)))
        .route(
            "/directory/lookup",
            compat::no_allow(post(directory::lookup)),
        )
        .route("/directory/keys", compat::no_allow(get(directory::keys)))
        .route("/directory/stats", compat::no_allow(get(directory::stats)))
        .route(
            "/directory/blend-lookup",
            compat::no_allow(post(directory::blend_lookup)),
        )
        .with_state(app.clone());
    for c in app.controllers.iter() {
        if let Some(routes) = c.clone().routes(app.context()) {
            router = router.merge(routes);
        }
    }
    let names: std::collections::HashSet<&'static str> =
        app.controllers.iter().map(|c| c.name()).collect();
    let enabled: std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync> =
        std::sync::Arc::new(move |c: &str| names.contains(c));
    // Open access refuses nothing: no guard layer to pass through.
    if !matches!(access, access::OperatorAccess::Open) {
        router = router.route_layer(axum::middleware::from_fn_with_state(
            (app.clone(), std::sync::Arc::new(access)),
            access::guard,
        ));
    }
    let max_body_bytes = app.settings.max_body_bytes;
    let routed = router
        .route_layer(axum::middleware::from_fn_with_state(app, observe))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes));
    // Starlette's edges decide on the percent-decoded path. They run after
    // axum's routing (a layer does), which matched the raw path: a request
    // whose decoded path differs is routed again through `routed` (which
    // has no edges, so holds no reference back to them). Every route's
    // method router is `compat::no_allow`: the edges answer the methods a
    // route does not serve, and axum would add the route's `Allow` to what
    // they answer (a 404, uvicorn's 400).
    let reroute = std::sync::Arc::new(routed.clone());
    routed.layer(axum::middleware::from_fn(move |req, next| {
        compat::starlette_edges(enabled.clone(), reroute.clone(), req, next)
    }))
}

/// Counts and times every request that matched a route.
async fn observe(State(app): State<App>, req: Request, next: Next) -> Response {
    // The busy routes' labels are borrowed: no allocation per request.
    const BUSY: [&str; 4] = [
        "/directory/lookup",
        "/events",
        "/instances/{instance_id}/heartbeat",
        "/healthz",
    ];
    let route: Cow<'static, str> = match req.extensions().get::<MatchedPath>() {
        None => Cow::Borrowed("unmatched"),
        Some(p) => BUSY
            .iter()
            .find(|b| **b == p.as_str())
            .map_or_else(|| Cow::Owned(p.as_str().to_owned()), |b| Cow::Borrowed(*b)),
    };
    let method = match *req.method() {
        axum::http::Method::GET => "GET",
        axum::http::Method::POST => "POST",
        axum::http::Method::PUT => "PUT",
        axum::http::Method::DELETE => "DELETE",
        _ => "other",
    };
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    app.metrics
        .served(method, route, resp.status().as_u16(), started.elapsed());
    resp
}

async fn healthz() -> Json<serde_json::Value> {
    // Never fails on degradation: a restart would throw the views away.
    Json(json!({"status": "healthy"}))
}

/// Ready at once, except under `--max-ready-lag` until the Kafka consumer
/// has caught up (serving views far behind the stream would mislead).
async fn ready(State(app): State<App>) -> Response {
    if crate::kafka::ready(&app) {
        "ready\n".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: Kafka consumer has not caught up (--max-ready-lag)\n",
        )
            .into_response()
    }
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, Json(json!({"detail": "Not Found"}))).into_response()
}

pub(crate) async fn method_not_allowed() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        Json(json!({"detail": "Method Not Allowed"})),
    )
        .into_response()
}

async fn metrics(State(app): State<App>, headers: axum::http::HeaderMap) -> Response {
    if app.settings.disable_metrics || ic_telemetry::otel::enabled() {
        return not_found().await;
    }
    // Prometheus asks for OpenMetrics and gets it; other clients get the
    // reference's Prometheus text format.
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let text = metrics_text(&app);
    if openmetrics {
        let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
        ([(header::CONTENT_TYPE, content_type)], text).into_response()
    } else {
        // The reference's type (prometheus_client 0.24), with a body in
        // the Prometheus text format it names.
        let content_type = "text/plain; version=1.0.0; charset=utf-8";
        let body = crate::metrics::prometheus_text(&text);
        ([(header::CONTENT_TYPE, content_type)], body).into_response()
    }
}

/// The exposition, with the scrape-time gauges set first (what `/metrics`
/// serves and what OTLP pushes).
pub(crate) fn metrics_text(app: &App) -> String {
    refresh_gauges(app);
    app.metrics.render()
}

/// Sets scrape-time gauges from counters the views keep; per-instance
/// families are rebuilt so departed instances disappear.
fn refresh_gauges(app: &App) {
    let m = &app.metrics.metrics;
    let ages = app.instances.heartbeat_ages();
    m.instances
        .set(i64::try_from(ages.len()).unwrap_or(i64::MAX));
    m.heartbeat_age.clear();
    let mut registered = std::collections::BTreeSet::new();
    for (id, age) in ages {
        m.heartbeat_age
            .get_or_create(&crate::metrics::InstanceLabel {
                instance_id: id.clone(),
            })
            .set(age);
        registered.insert(id);
    }
    let (depth, lag) = app.ingest.queue.snapshot();
    m.event_queue_depth
        .set(i64::try_from(depth).unwrap_or(i64::MAX));
    m.event_drain_lag.set(lag);
    let stats = app.views.read(|v| v.directory.stats());
    app.metrics.set_tier("l1", stats.l1.count, stats.l1.bytes);
    app.metrics.set_tier("l2", stats.l2.count, stats.l2.bytes);
    m.directory_keys
        .set(i64::try_from(stats.num_keys).unwrap_or(i64::MAX));
    let (dropped, max) = app.views.read(|v| {
        (
            v.directory.dropped_for_capacity(),
            v.directory.max_keys().unwrap_or(0),
        )
    });
    m.directory_keys_dropped
        .set(i64::try_from(dropped).unwrap_or(i64::MAX));
    m.directory_max_keys
        .set(i64::try_from(max).unwrap_or(i64::MAX));
    let ctx = app.context();
    for c in app.controllers.iter() {
        c.refresh_metrics(&ctx);
    }
    m.instance_l1_keys.clear();
    for (id, n) in stats.l1_keys_by_instance {
        if registered.contains(&id) {
            m.instance_l1_keys
                .get_or_create(&crate::metrics::InstanceLabel { instance_id: id })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}
