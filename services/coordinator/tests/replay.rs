//! `.lct` replay into a real coordinator, in-process and through the binary.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Coord;
use ic_coordinator_client::replay::{ReplayArgs, ReplayReport, replay};
use ic_coordinator_core::trace::{Header, Record, TraceWriter};
use serde_json::{Map, Value, json};

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn batch(seq: i64) -> ic_coordinator_core::events::WireBatch {
    serde_json::from_value(json!({
        "instance_id": "mp-a", "incarnation": 7, "seq": seq, "event_type": "store", "tier": "l2",
        "backend": "fs", "entries": [{"key": {"chunk_hash_hex": format!("{seq:02x}"), "model_name": "m",
                                              "kv_rank": 16777472}, "size_bytes": 10}]}))
    .unwrap()
}

/// Header, register, three batches (one a duplicate), a heartbeat, an
/// unrelated record and an unknown phase: nine frames.
fn write_trace(path: &std::path::Path, gap: f64) {
    let header = Header {
        t_mono_start: 1000.0,
        t_wall_start: 1.7e9,
        lmcache_version: Some("test".into()),
        ..Header::default()
    };
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    w.lifecycle(
        0.0,
        1.7e9,
        "register",
        obj(json!({"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 9})),
    )
    .unwrap();
    w.batch(0.0, 1.7e9, &batch(1)).unwrap();
    w.batch(gap, 1.7e9 + gap, &batch(2)).unwrap();
    w.batch(gap, 1.7e9 + gap, &batch(2)).unwrap();
    w.lifecycle(gap, 0.0, "heartbeat", obj(json!({"instance_id": "mp-a"})))
        .unwrap();
    w.record(&Record {
        t_mono: gap,
        t_wall: 0.0,
        qualname: "storage.put".into(),
        args: Map::new(),
    })
    .unwrap();
    w.lifecycle(gap, 0.0, "suspend", obj(json!({"instance_id": "mp-a"})))
        .unwrap();
    std::fs::write(path, w.finish().unwrap()).unwrap();
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
            frames: 8,
            applied: 2,
            duplicates: 1,
            stale: 0,
            lifecycle: 2,
            rejected: 0,
            unknown_qualnames: 1,
            unknown_phases: 1,
            malformed: 0,
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
    let run = |path: std::path::PathBuf| {
        let url = format!("http://{}", c.addr);
        async move {
            let err = replay(&ReplayArgs {
                file: path,
                url,
                speed: 0.0,
            })
            .await
            .unwrap_err();
            format!("{err:#}")
        }
    };
    let err = run(path).await;
    assert!(err.contains("bad.lct"), "{err}");
    // A real trace recorded at another level names the file and the level.
    let calls = dir.path().join("calls.lct");
    let header = Header {
        level: "calls".into(),
        ..Header::default()
    };
    std::fs::write(
        &calls,
        TraceWriter::new(Vec::new(), &header)
            .unwrap()
            .finish()
            .unwrap(),
    )
    .unwrap();
    let err = run(calls).await;
    assert!(
        err.contains("calls.lct") && err.contains("level `calls`"),
        "{err}"
    );
    // A trace cut inside a frame is an error naming the file, not a panic.
    let cut = dir.path().join("cut.lct");
    write_trace(&cut, 0.0);
    let mut raw = std::fs::read(&cut).unwrap();
    raw.truncate(raw.len() - 5);
    std::fs::write(&cut, raw).unwrap();
    let err = run(cut).await;
    assert!(
        err.contains("cut.lct") && err.contains("truncated inside frame 7"),
        "{err}"
    );
}

/// A trace written by msgspec the way LMCache's recorder lays it out
/// replays unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_of_a_trace_written_by_msgspec() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lmcache.lct");
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/write_lmcache_trace.py"
    );
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(&path)
        .output()
        .unwrap_or_else(|e| {
            panic!("this test needs python3 with msgspec (pip install msgspec); cannot run python3: {e}")
        });
    assert!(
        out.status.success(),
        "this test needs python3 with msgspec (pip install msgspec); {script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = Coord::start(&[]).await;
    let report = replay(&ReplayArgs {
        file: path,
        url: format!("http://{}", c.addr),
        speed: 1.0,
    })
    .await
    .unwrap();
    assert_eq!(
        report,
        ReplayReport {
            frames: 8,
            applied: 2,
            duplicates: 1,
            stale: 0,
            lifecycle: 2,
            rejected: 0,
            unknown_qualnames: 1,
            unknown_phases: 1,
            malformed: 0,
        }
    );
    assert_eq!(c.get("/directory/stats").await.1["num_keys"], 2);
    let instances = c.get("/instances").await.1;
    let inst = &instances["instances"][0];
    assert_eq!(inst["instance_id"], "mp-py", "{instances}");
    assert_eq!(inst["http_port"], 8123, "{instances}");
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
