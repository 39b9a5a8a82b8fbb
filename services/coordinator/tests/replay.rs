//! `.lct` replay into a real coordinator, in-process and through the binary.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Coord;
use ic_coordinator::replay::{ReplayArgs, ReplayReport, replay};
use ic_coordinator_core::trace::{Frame, LifecycleAction, TRACE_VERSION, write_frame};
use serde_json::json;

fn batch(seq: i64, ts: f64) -> Frame {
    Frame::Batch {
        ts,
        batch: serde_json::from_value(json!({
            "instance_id": "mp-a", "incarnation": 7, "seq": seq, "event_type": "store", "tier": "l2",
            "backend": "fs", "entries": [{"key": {"chunk_hash_hex": format!("{seq:02x}"), "model_name": "m",
                                                  "kv_rank": 16777472}, "size_bytes": 10}]}))
        .unwrap(),
    }
}

fn write_trace(path: &std::path::Path, gap: f64) {
    let mut out = Vec::new();
    let frames = [
        Frame::Header {
            version: TRACE_VERSION,
            created_at: 0.0,
            source: "test".into(),
        },
        Frame::Lifecycle {
            ts: 100.0,
            action: LifecycleAction::Register,
            instance_id: "mp-a".into(),
            instance: Some(json!({"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 9})),
        },
        batch(1, 100.0),
        batch(2, 100.0 + gap),
        batch(2, 100.0 + gap),
        Frame::Lifecycle {
            ts: 100.0 + gap,
            action: LifecycleAction::Heartbeat,
            instance_id: "mp-a".into(),
            instance: None,
        },
    ];
    for f in &frames {
        write_frame(&mut out, f).unwrap();
    }
    std::fs::write(path, out).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_feeds_events_and_membership() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.lct");
    write_trace(&path, 0.3);
    let c = Coord::start(&[]).await;
    let started = Instant::now();
    let report = replay(&ReplayArgs {
        file: path.clone(),
        url: format!("http://{}", c.addr),
        speed: 2.0,
    })
    .await
    .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "0.3 s recorded at speed 2 takes at least 0.15 s"
    );
    assert_eq!(
        report,
        ReplayReport {
            frames: 6,
            applied: 2,
            duplicates: 1,
            stale: 0,
            lifecycle: 2,
            rejected: 0
        }
    );
    assert_eq!(c.get("/directory/stats").await.1["num_keys"], 2);
    assert_eq!(
        c.get("/instances").await.1["instances"][0]["instance_id"],
        "mp-a"
    );
    // A second replay is absorbed by the gate.
    let again = replay(&ReplayArgs {
        file: path,
        url: format!("http://{}", c.addr),
        speed: 0.0,
    })
    .await
    .unwrap();
    assert_eq!((again.applied, again.duplicates), (0, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_rejects_a_file_that_is_not_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.lct");
    std::fs::write(&path, b"\0\0\0\x02hi").unwrap();
    let c = Coord::start(&[]).await;
    let err = replay(&ReplayArgs {
        file: path,
        url: format!("http://{}", c.addr),
        speed: 0.0,
    })
    .await
    .unwrap_err();
    assert!(format!("{err:#}").contains("bad.lct"), "{err:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_subcommand_of_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.lct");
    write_trace(&path, 0.0);
    let c = Coord::start(&[]).await;
    let url = format!("http://{}", c.addr);
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_ic-coordinator"))
        .args([
            "--log-format",
            "json",
            "replay",
            "--speed",
            "0",
            "--url",
            &url,
            path.to_str().unwrap(),
        ])
        .output()
        .await
        .unwrap();
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert!(
        logs.contains("replay finished") && logs.contains("\"applied\":2"),
        "{logs}"
    );
    assert_eq!(c.get("/directory/stats").await.1["num_keys"], 2);
}
