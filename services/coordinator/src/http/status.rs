//! `GET /status`: one page for operators (HTML), or the same snapshot as
//! JSON with `Accept: application/json`.

use std::fmt::Write;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{Html, IntoResponse, Response};
use serde_json::{Value, json};

use crate::state::App;

/// The snapshot both renderings use.
pub fn snapshot(app: &App) -> Value {
    let ages: std::collections::HashMap<String, f64> =
        app.instances.heartbeat_ages().into_iter().collect();
    let instances = ages.len();
    let kafka = crate::kafka::status_json(app);
    let (gate, mut streams, dir) = app.views.read(|views| {
        let streams: Vec<Value> = views
            .gate
            .cursors()
            .iter()
            .map(|(id, c)| {
                json!({"instance_id": id, "incarnation": c.incarnation, "last_seq": c.last_seq,
                       "gap_detected": c.gap_detected, "registered": ages.contains_key(id),
                       "heartbeat_age_seconds": ages.get(id.as_str())})
            })
            .collect();
        (views.gate.stats(), streams, views.directory.stats())
    });
    streams.sort_by(|a, b| a["instance_id"].as_str().cmp(&b["instance_id"].as_str()));
    let controllers: Vec<Value> = app
        .controllers
        .iter()
        .map(|c| json!({"name": c.name(), "consumes_events": c.consumes_events(), "status": c.status()}))
        .collect();
    json!({
        "instances": instances,
        "streams": streams,
        "gate": gate,
        "directory": {"num_keys": dir.num_keys, "num_placements": dir.num_placements,
                      "l1": dir.l1, "l2": dir.l2},
        "controllers": controllers,
        "event_transport": if app.settings.kafka.is_some() { "kafka" } else { "http" },
        "kafka": kafka,
        "loops": app.loops.snapshot(),
        "checkpoint": {"path": app.settings.checkpoint_path.as_ref().map(|p| p.display().to_string()),
                       "last_success": app.persistence.last_checkpoint()},
    })
}

pub(crate) async fn status(State(app): State<App>, headers: HeaderMap) -> Response {
    let snap = snapshot(&app);
    let wants_json = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"));
    if wants_json {
        return Json(snap).into_response();
    }
    Html(render_html(&snap)).into_response()
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn render_html(snap: &Value) -> String {
    let mut h = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>ic-coordinator status</title></head><body>\n<h1>ic-coordinator</h1>\n",
    );
    let _ = writeln!(h, "<p>Registered instances: {}</p>", snap["instances"]);
    let _ = writeln!(
        h,
        "<h2>Event streams</h2><table border=\"1\"><tr><th>instance</th><th>incarnation</th><th>last seq</th><th>gap</th><th>registered</th><th>heartbeat age (s)</th></tr>"
    );
    for s in snap["streams"].as_array().into_iter().flatten() {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(s["instance_id"].as_str().unwrap_or("")),
            s["incarnation"],
            s["last_seq"],
            s["gap_detected"],
            s["registered"],
            s["heartbeat_age_seconds"]
        );
    }
    h.push_str("</table>\n");
    let _ = writeln!(
        h,
        "<h2>Gate</h2><pre>{}</pre>",
        esc(&snap["gate"].to_string())
    );
    let _ = writeln!(
        h,
        "<h2>Key directory</h2><pre>{}</pre>",
        esc(&snap["directory"].to_string())
    );
    h.push_str("<h2>Controllers</h2><ul>\n");
    for c in snap["controllers"].as_array().into_iter().flatten() {
        let _ = writeln!(
            h,
            "<li><b>{}</b>: <code>{}</code></li>",
            esc(c["name"].as_str().unwrap_or("")),
            esc(&c["status"].to_string())
        );
    }
    h.push_str("</ul>\n");
    let _ = writeln!(
        h,
        "<h2>Loops (last pass, epoch s)</h2><pre>{}</pre>",
        esc(&snap["loops"].to_string())
    );
    let _ = writeln!(
        h,
        "<h2>Event transport: {}</h2><pre>{}</pre>",
        esc(snap["event_transport"].as_str().unwrap_or("")),
        esc(&snap["kafka"].to_string())
    );
    let _ = writeln!(
        h,
        "<h2>Checkpoint</h2><pre>{}</pre>",
        esc(&snap["checkpoint"].to_string())
    );
    h.push_str("</body></html>\n");
    h
}
