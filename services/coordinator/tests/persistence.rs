//! Checkpoint and metadata files: restart restores the views, quotas and
//! pins; corrupt files mean a cold start; failed writes are retried.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::{Coord, batch, key};
use serde_json::{Value, json};

fn args<'a>(ckpt: &'a str, meta: &'a str) -> Vec<&'a str> {
    vec![
        "--chunk-size",
        "4",
        "--checkpoint-path",
        ckpt,
        "--metadata-path",
        meta,
        "--checkpoint-interval",
        "0",
    ]
}

/// Everything a restart must preserve, read over HTTP.
async fn observable(c: &Coord) -> Vec<Value> {
    let mut out = Vec::new();
    for path in [
        "/directory/stats",
        "/directory/keys",
        "/instances/usage",
        "/cache/pins",
        "/quota",
        "/quota/config",
    ] {
        let (status, body) = c.get(path).await;
        assert_eq!(status, 200, "{path}");
        out.push(body);
    }
    let (_, look) = c
        .post(
            "/directory/lookup",
            json!({"token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "model_name": "org/model-a"}),
        )
        .await;
    out.push(look);
    out
}

async fn populate(c: &Coord) {
    let look = c
        .post(
            "/directory/lookup",
            json!({"token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "model_name": "org/model-a"}),
        )
        .await
        .1;
    let k0 = look["results"][0]["key"].clone();
    let mut store = batch(
        "mp-a",
        100,
        1,
        "store",
        "l2",
        "fs",
        &[(k0.clone(), 4096), (key("0b", "t"), 50)],
    );
    store["entries"][0]["token_ids"] = json!([1, 2, 3, 4]);
    let cfg = json!({"instance_id": "mp-a", "incarnation": 100, "seq": 2, "event_type": "config",
                     "tier": "l2", "backend": "fs", "capacity_bytes": 1_000_000});
    c.events(vec![
        store,
        cfg,
        batch("mp-a", 100, 3, "store", "l1", "dram", &[(key("0c", ""), 7)]),
        batch("mp-a", 100, 4, "access", "l2", "", &[(k0, 0)]),
    ])
    .await;
    c.put("/quota/t", json!({"limit_gb": 2})).await;
    c.put("/quota/config", json!({"default_limit_gb": 0.5}))
        .await;
    c.post(
        "/cache/pins",
        json!({"model_name": "org/model-a", "world_size": 1, "token_ids": [1, 2, 3, 4]}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_restores_views_quotas_pins_and_cursors() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("coord.ckpt");
    let meta = dir.path().join("coord-meta.json");
    let (ckpt_s, meta_s) = (ckpt.to_str().unwrap(), meta.to_str().unwrap());

    let c = Coord::start(&args(ckpt_s, meta_s)).await;
    populate(&c).await;
    let before = observable(&c).await;
    assert_eq!(before[0]["num_keys"], 3, "{}", before[0]);
    c.stop().await;
    assert!(ckpt.exists(), "clean stop writes a checkpoint");
    assert_eq!(&std::fs::read(&ckpt).unwrap()[..8], b"LMCKPT\0\0");

    let c = Coord::start(&args(ckpt_s, meta_s)).await;
    assert_eq!(observable(&c).await, before);
    // The gate cursor survived: an old seq is a duplicate, not re-applied.
    let again = c
        .events(vec![batch(
            "mp-a",
            100,
            3,
            "store",
            "l1",
            "dram",
            &[(key("0c", ""), 7)],
        )])
        .await;
    assert_eq!(again["duplicates"], 1);
    // The registry is not persisted.
    assert_eq!(c.get("/instances").await.1["instances"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_written_on_every_change() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("c.ckpt");
    let meta = dir.path().join("m.json");
    let c = Coord::start(&args(ckpt.to_str().unwrap(), meta.to_str().unwrap())).await;
    assert!(!meta.exists(), "not written at boot");
    c.put("/quota/t", json!({"limit_gb": 1})).await;
    let doc: Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    assert_eq!(doc["version"], 1);
    assert!(doc["saved_at"].as_f64().unwrap() > 1.7e9);
    assert_eq!(doc["components"]["quotas"]["limits"]["t"], 1u64 << 30);
    c.post(
        "/cache/pins",
        json!({"model_name": "m", "world_size": 1, "token_ids": [1, 2, 3, 4]}),
    )
    .await;
    let doc: Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    assert_eq!(doc["components"]["pins"]["entries"][0]["count"], 1);
    assert_eq!(
        doc["components"]["pins"]["entries"][0]["key"]["model_name"],
        "m"
    );
    assert!(
        std::fs::read_to_string(&meta)
            .unwrap()
            .contains("\n  \"components\""),
        "indent 2"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_files_mean_cold_start() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("c.ckpt");
    let meta = dir.path().join("m.json");
    std::fs::write(&ckpt, b"LMCKPT\0\0\x01\0\0\0\xde\xad\xbe\xef").unwrap();
    std::fs::write(&meta, b"{\"version\": 1, \"components\": {}}").unwrap();
    let c = Coord::start(&args(ckpt.to_str().unwrap(), meta.to_str().unwrap())).await;
    assert_eq!(c.get("/directory/stats").await.1["num_keys"], 0);
    assert_eq!(c.get("/healthz").await.0, 200);
    c.stop().await;
    for garbage in [&b""[..], b"hello", b"LMCKPT\0\0\x09\0\0\0"] {
        std::fs::write(&ckpt, garbage).unwrap();
        let c = Coord::start(&args(ckpt.to_str().unwrap(), meta.to_str().unwrap())).await;
        assert_eq!(c.get("/directory/stats").await.1["num_keys"], 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_checkpoint_write_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    // The checkpoint's parent is a file, so the write fails until it is removed.
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"x").unwrap();
    let ckpt = blocker.join("c.ckpt");
    let c = Coord::start(&[
        "--checkpoint-path",
        ckpt.to_str().unwrap(),
        "--checkpoint-interval",
        "0",
    ])
    .await;
    c.events(vec![batch(
        "mp-a",
        1,
        1,
        "store",
        "l2",
        "fs",
        &[(key("01", ""), 1)],
    )])
    .await;
    assert!(!c.app.persistence.write_checkpoint());
    let text = c.metrics_text().await;
    assert!(
        text.contains(r#"lmcache_coordinator_checkpoint_writes_total{outcome="failed"} 1"#),
        "{text}"
    );
    std::fs::remove_file(&blocker).unwrap();
    assert!(c.app.persistence.write_checkpoint());
    assert!(ckpt.exists());
    assert!(!Path::new(&format!("{}.tmp", ckpt.display())).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_checkpoint_is_written_while_running() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("c.ckpt");
    let c = Coord::start(&[
        "--checkpoint-path",
        ckpt.to_str().unwrap(),
        "--checkpoint-interval",
        "0.05",
    ])
    .await;
    c.events(vec![batch(
        "mp-a",
        1,
        1,
        "store",
        "l2",
        "fs",
        &[(key("01", ""), 1)],
    )])
    .await;
    // Polls the real timer (the loop itself is what is under test).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        if let Ok(raw) = std::fs::read(&ckpt)
            && let Ok(restored) = ic_coordinator_core::checkpoint::decode_file(&raw)
            && restored.directory.is_some_and(|d| d.len() == 1)
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no periodic checkpoint"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Parks a checkpoint's capture (its section is asked for while the capture
/// holds the views) until told to go on.
#[derive(Debug)]
struct ParkedCapture {
    entered: std::sync::mpsc::SyncSender<()>,
    release: parking_lot::Mutex<std::sync::mpsc::Receiver<()>>,
}

impl ic_coordinator::controller::Controller for ParkedCapture {
    fn name(&self) -> &'static str {
        "ParkedCaptureController"
    }
    fn save_checkpoint(&self, _sections: &mut ic_coordinator_core::checkpoint::Sections) {
        let _ = self.entered.send(());
        let _ = self.release.lock().recv();
    }
}

/// A lookup, the stats and a key listing answer while a checkpoint's capture
/// is in progress (before, the capture held the one views lock, 2 s at 10 M
/// keys, and this test never finished); a `POST /events` sent meanwhile
/// applies after the capture, so the file holds whole requests only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_answer_during_a_checkpoint_capture() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("c.ckpt");
    let (entered_tx, entered) = std::sync::mpsc::sync_channel(1);
    let (release, release_rx) = std::sync::mpsc::sync_channel(1);
    let parked = std::sync::Arc::new(ParkedCapture {
        entered: entered_tx,
        release: parking_lot::Mutex::new(release_rx),
    });
    let c = Coord::start_with(
        &[
            "--checkpoint-path",
            ckpt.to_str().unwrap(),
            "--checkpoint-interval",
            "0",
        ],
        vec![parked],
    )
    .await;
    c.events(vec![batch(
        "mp-a",
        1,
        1,
        "store",
        "l2",
        "fs",
        &[(key("01", ""), 7)],
    )])
    .await;
    let persistence = c.app.persistence.clone();
    let capture = std::thread::spawn(move || persistence.write_checkpoint());
    tokio::task::spawn_blocking(move || entered.recv().unwrap())
        .await
        .unwrap();

    // The capture is parked inside the views: every read still answers.
    let (status, body) = c
        .post("/directory/lookup", json!({"keys": [key("01", "")]}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["results"][0]["placements"][0]["size_bytes"], 7,
        "{body}"
    );
    assert_eq!(c.get("/directory/stats").await.1["num_keys"], 1);
    assert_eq!(c.get("/directory/keys").await.1["total"], 1);

    // A write waits for the capture, then applies.
    let url = c.url("/events");
    let http = c.http.clone();
    let late = tokio::spawn(async move {
        let body =
            json!({"batches": [batch("mp-a", 1, 2, "store", "l2", "fs", &[(key("02", ""), 1)])]});
        http.post(url).json(&body).send().await.unwrap().status()
    });
    release.send(()).unwrap();
    assert!(capture.join().unwrap(), "the checkpoint was written");
    // Kept before the stop, which writes its own.
    let captured = dir.path().join("captured.ckpt");
    std::fs::copy(&ckpt, &captured).unwrap();
    assert_eq!(late.await.unwrap(), 200);
    assert_eq!(c.get("/directory/stats").await.1["num_keys"], 2);
    // The stop's own capture must not park.
    drop(release);
    c.stop().await;

    // The file holds the views as of the capture: one key.
    let again = Coord::start(&[
        "--checkpoint-path",
        captured.to_str().unwrap(),
        "--checkpoint-interval",
        "0",
    ])
    .await;
    assert_eq!(again.get("/directory/stats").await.1["num_keys"], 1);
}
