//! Controllers plugged in as trait objects: every optional role works, a
//! failing consumer is counted without starving the others, and names can
//! be switched off.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::routing::get;
use common::{Coord, batch, key};
use ic_coordinator::controller::{ConsumeError, Context, Controller, Task};
use ic_coordinator::views::Views;
use ic_coordinator_core::events::Batch;
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// Counts batches, serves `/acme/reaper`, and runs a loop.
#[derive(Debug, Default)]
struct Reaper {
    seen: AtomicU64,
    loop_started: AtomicU64,
}

impl Controller for Reaper {
    fn name(&self) -> &'static str {
        "ReaperController"
    }
    fn consumes_events(&self) -> bool {
        true
    }
    fn consume(&self, _batch: &Batch, views: &Views) -> Result<(), ConsumeError> {
        // Views are already updated when a controller sees the batch.
        assert!(views.directory.len() <= 10);
        self.seen.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn routes(self: Arc<Self>, _ctx: Context) -> Option<Router> {
        Some(Router::new().route(
            "/acme/reaper",
            get(move || {
                let me = self.clone();
                async move { axum::Json(json!({"seen": me.seen.load(Ordering::SeqCst)})) }
            }),
        ))
    }
    fn run(self: Arc<Self>, _ctx: Context, shutdown: CancellationToken) -> Option<Task> {
        Some(Box::pin(async move {
            self.loop_started.store(1, Ordering::SeqCst);
            shutdown.cancelled().await;
        }))
    }
}

/// Fails every batch: once with an error, once with a panic.
#[derive(Debug)]
struct Broken {
    panic: bool,
    name: &'static str,
}

impl Controller for Broken {
    fn name(&self) -> &'static str {
        self.name
    }
    fn consumes_events(&self) -> bool {
        true
    }
    fn consume(&self, _batch: &Batch, _views: &Views) -> Result<(), ConsumeError> {
        if self.panic {
            panic!("controller bug");
        }
        Err(ConsumeError("cannot apply".into()))
    }
}

fn controllers() -> (Arc<Reaper>, Vec<Arc<dyn Controller>>) {
    let reaper = Arc::new(Reaper::default());
    let list: Vec<Arc<dyn Controller>> = vec![
        Arc::new(Broken {
            panic: false,
            name: "ErrController",
        }),
        Arc::new(Broken {
            panic: true,
            name: "PanicController",
        }),
        reaper.clone(),
    ];
    (reaper, list)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_consumers_are_counted_and_do_not_stop_others() {
    let (reaper, list) = controllers();
    let c = Coord::start_with(&[], list).await;
    let out = c
        .events(vec![
            batch("mp-a", 1, 1, "store", "l2", "fs", &[(key("01", "t"), 5)]),
            batch("mp-a", 1, 2, "store", "l2", "fs", &[(key("02", "t"), 5)]),
        ])
        .await;
    assert_eq!(out["applied"], 2);
    assert_eq!(
        reaper.seen.load(Ordering::SeqCst),
        2,
        "later controllers still get every batch"
    );
    assert_eq!(c.get("/acme/reaper").await, (200, json!({"seen": 2})));
    assert_eq!(reaper.loop_started.load(Ordering::SeqCst), 1);
    assert_eq!(c.get("/directory/stats").await.1["num_keys"], 2);
    // The built-in eviction controller (before them) got the batches too.
    let ctl = c.app.eviction.clone().unwrap();
    assert_eq!(ctl.state.lock().tracked_keys, 2);
    let text = c.metrics_text().await;
    assert!(
        text.contains(
            r#"lmcache_coordinator_consumer_apply_failures_total{consumer="ErrController"} 2"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"lmcache_coordinator_consumer_apply_failures_total{consumer="PanicController"} 2"#
        ),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_controllers_can_be_disabled_by_name() {
    let (reaper, list) = controllers();
    let c = Coord::start_with(
        &[
            "--extra-config",
            r#"{"disabled_controllers": ["ReaperController", "PanicController", "ErrController"]}"#,
        ],
        list,
    )
    .await;
    c.events(vec![batch(
        "mp-a",
        1,
        1,
        "store",
        "l2",
        "fs",
        &[(key("01", "t"), 5)],
    )])
    .await;
    assert_eq!(reaper.seen.load(Ordering::SeqCst), 0);
    assert_eq!(c.get("/acme/reaper").await.0, 404);
    let text = c.metrics_text().await;
    assert!(!text.contains("consumer_apply_failures_total{"), "{text}");
}

/// A controller whose loop dies at once.
#[derive(Debug)]
struct Doomed;

impl Controller for Doomed {
    fn name(&self) -> &'static str {
        "DoomedController"
    }
    fn run(self: Arc<Self>, _ctx: Context, _shutdown: CancellationToken) -> Option<Task> {
        Some(Box::pin(async { panic!("loop bug") }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_controller_loop_shows_in_its_up_gauge() {
    let c = Coord::start_with(&[], vec![Arc::new(Doomed)]).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let text = c.metrics_text().await;
        if text.contains(r#"lmcache_coordinator_controller_up{controller="DoomedController"} 0"#) {
            assert!(
                text.contains(
                    r#"lmcache_coordinator_controller_up{controller="PrefetchManager"} 1"#
                )
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "up gauge never dropped:\n{text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(c.get("/healthz").await.0, 200, "the rest keeps serving");
}
