//! Helpers for black-box tests: a real coordinator on loopback (in-process,
//! with a manual clock so timeouts need no sleeping) and a fake MP server
//! that is a real axum server recording what the coordinator sends it.
#![allow(clippy::unwrap_used, dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use clap::Parser;
use ic_coordinator::clock::ManualClock;
use ic_coordinator::state::App;
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    config: ic_coordinator::Config,
}

/// Flags for an in-process coordinator: loopback, port 0, loops off (tests
/// drive sweeps themselves), plus `extra`.
pub fn config(extra: &[&str]) -> ic_coordinator::Config {
    let mut args = vec!["ic-coordinator", "--host", "127.0.0.1", "--port", "0"];
    for flag in ["--health-check-interval", "--eviction-check-interval"] {
        if !extra.contains(&flag) {
            args.extend([flag, "0"]);
        }
    }
    args.extend(extra);
    Cli::parse_from(args).config
}

/// A running in-process coordinator.
#[derive(Debug)]
pub struct Coord {
    pub addr: SocketAddr,
    pub app: App,
    pub clock: Arc<ManualClock>,
    pub http: reqwest::Client,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Coord {
    /// The `/metrics` text.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub async fn start(extra: &[&str]) -> Self {
        Self::start_with(extra, Vec::new()).await
    }

    /// Starts with extra (test) controllers.
    pub async fn start_with(
        extra: &[&str],
        controllers: Vec<Arc<dyn ic_coordinator::controller::Controller>>,
    ) -> Self {
        let clock = Arc::new(ManualClock::default());
        let shutdown = CancellationToken::new();
        let running = ic_coordinator::start_with(
            &config(extra),
            clock.clone(),
            controllers,
            shutdown.clone(),
        )
        .await
        .unwrap();
        Self {
            addr: running.addr,
            app: running.app,
            clock,
            http: reqwest::Client::new(),
            shutdown,
            task: Some(running.task),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Sends a request; returns status and JSON body (Null when empty).
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut req = self.http.request(method, self.url(path));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        (status, body)
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    pub async fn put(&self, path: &str, body: Value) -> (u16, Value) {
        self.call(Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call(Method::DELETE, path, body).await
    }

    /// Sends a raw body with a JSON content type.
    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let resp = self
            .http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// Registers an instance reachable at `port` on loopback.
    pub async fn register(&self, id: &str, port: u16) {
        let (status, body) = self
            .post(
                "/instances",
                json!({"instance_id": id, "ip": "127.0.0.1", "http_port": port}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    /// Posts events and returns the counts.
    pub async fn events(&self, batches: Vec<Value>) -> Value {
        let (status, body) = self.post("/events", json!({ "batches": batches })).await;
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Stops the server and waits for the final checkpoint.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

impl Drop for Coord {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A key in the contract's JSON form.
pub fn key(hash: &str, salt: &str) -> Value {
    json!({"chunk_hash_hex": hash, "model_name": "org/model-a", "kv_rank": 16777472,
           "object_group_id": 0, "cache_salt": salt})
}

/// A batch with entries `(key, size)`.
pub fn batch(
    instance: &str,
    incarnation: u64,
    seq: u64,
    event: &str,
    tier: &str,
    backend: &str,
    entries: &[(Value, u64)],
) -> Value {
    let entries: Vec<Value> = entries
        .iter()
        .map(|(k, s)| json!({"key": k, "size_bytes": s}))
        .collect();
    json!({"instance_id": instance, "incarnation": incarnation, "seq": seq, "event_type": event,
           "tier": tier, "backend": backend, "entries": entries})
}

/// A request the fake MP server received.
#[derive(Clone, Debug)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub body: Value,
}

/// How the fake MP server answers.
#[derive(Clone, Debug)]
pub struct MpBehaviour {
    /// Status for `DELETE /cache/objects`.
    pub delete_status: u16,
    /// `skipped` it reports.
    pub delete_skipped: u64,
    /// Status and body for the prefetch status poll.
    pub prefetch_status: (u16, String),
    /// How long `DELETE /cache/objects` takes to answer.
    pub delete_delay: std::time::Duration,
}

impl Default for MpBehaviour {
    fn default() -> Self {
        Self {
            delete_status: 200,
            delete_skipped: 0,
            prefetch_status: (200, r#"{"request_id":"r1","status":"pending"}"#.into()),
            delete_delay: std::time::Duration::ZERO,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct MpState {
    received: Arc<Mutex<Vec<Received>>>,
    behaviour: Arc<Mutex<MpBehaviour>>,
}

/// A fake MP server on loopback.
#[derive(Debug)]
pub struct FakeMp {
    pub port: u16,
    state: MpState,
    shutdown: CancellationToken,
}

impl FakeMp {
    pub async fn start() -> Self {
        let state = MpState::default();
        let router = Router::new()
            .route("/cache/objects", delete(mp_delete))
            .route("/cache/prefetches", post(mp_prefetch))
            .route("/cache/prefetches/{id}", get(mp_prefetch_status))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(stop.cancelled_owned())
                .await
                .unwrap();
        });
        Self {
            port,
            state,
            shutdown,
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.state.received.lock().clone()
    }

    pub fn set(&self, f: impl FnOnce(&mut MpBehaviour)) {
        f(&mut self.state.behaviour.lock());
    }
}

impl Drop for FakeMp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

async fn mp_delete(State(s): State<MpState>, Json(body): Json<Value>) -> Response {
    let n = body["keys"].as_array().map_or(0, Vec::len) as u64;
    s.received.lock().push(Received {
        method: "DELETE".into(),
        path: "/cache/objects".into(),
        body,
    });
    let b = s.behaviour.lock().clone();
    tokio::time::sleep(b.delete_delay).await;
    let status = StatusCode::from_u16(b.delete_status).unwrap();
    if !status.is_success() {
        return (status, "node exploded").into_response();
    }
    Json(json!({"deleted": n, "skipped": b.delete_skipped, "ok": true})).into_response()
}

async fn mp_prefetch(State(s): State<MpState>, Json(body): Json<Value>) -> Response {
    s.received.lock().push(Received {
        method: "POST".into(),
        path: "/cache/prefetches".into(),
        body,
    });
    (
        StatusCode::ACCEPTED,
        Json(json!({"request_id": "r1", "chunks": 2, "status": "submitted"})),
    )
        .into_response()
}

async fn mp_prefetch_status(State(s): State<MpState>, Path(id): Path<String>) -> Response {
    s.received.lock().push(Received {
        method: "GET".into(),
        path: format!("/cache/prefetches/{id}"),
        body: Value::Null,
    });
    let (status, body) = s.behaviour.lock().prefetch_status.clone();
    (StatusCode::from_u16(status).unwrap(), body).into_response()
}
