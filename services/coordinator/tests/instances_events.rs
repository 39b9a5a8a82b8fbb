//! Black-box tests of `/instances` and `/events` against a real coordinator.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Coord, batch, key};
use serde_json::json;

const H: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_reregister_list_and_deregister() {
    let c = Coord::start(&[]).await;
    let body = json!({"instance_id": " mp-a ", "ip": " 127.0.0.1 ", "http_port": 8080,
                      "metadata": {"role": "prefill", "zone": "z1"},
                      "p2p_advertised_url": "http://127.0.0.1:7001", "mq_port": 5555});
    assert_eq!(
        c.post("/instances", body.clone()).await,
        (200, json!({"instance_id": "mp-a", "re_registered": false}))
    );
    assert_eq!(c.post("/instances", body).await.1["re_registered"], true);
    let (status, generated) = c
        .post("/instances", json!({"ip": "10.0.0.1", "http_port": 1}))
        .await;
    assert_eq!(status, 200);
    let id = generated["instance_id"].as_str().unwrap();
    assert!(
        id.starts_with("mp-") && id.len() == 35 && id[3..].chars().all(|c| c.is_ascii_hexdigit()),
        "{id}"
    );

    let (status, list) = c.get("/instances").await;
    assert_eq!(status, 200);
    let list = list["instances"].as_array().unwrap().clone();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["instance_id"], "mp-a");
    assert_eq!(list[0]["ip"], "127.0.0.1");
    assert_eq!(list[0]["metadata"]["zone"], "z1");
    assert_eq!(list[0]["mq_port"], 5555);
    assert!(list[0]["registration_time"].as_f64().unwrap() > 1.7e9);

    assert_eq!(
        c.delete("/instances/mp-a", None).await,
        (204, serde_json::Value::Null)
    );
    assert_eq!(c.delete("/instances/mp-a", None).await.0, 204, "idempotent");
    assert_eq!(
        c.get("/instances").await.1["instances"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_validation_is_422() {
    let c = Coord::start(&[]).await;
    for bad in [
        json!({"ip": "  ", "http_port": 80}),
        json!({"ip": "h", "http_port": 0}),
        json!({"ip": "h", "http_port": 65536}),
        json!({"ip": "h", "http_port": 80, "mq_port": -1}),
        json!({"ip": "h", "http_port": 80, "metadata": {"a": 1}}),
        json!({"http_port": 80}),
        json!({"ip": "h", "http_port": "eighty"}),
    ] {
        let (status, body) = c.post("/instances", bad.clone()).await;
        assert_eq!(status, 422, "{bad} -> {body}");
        assert_eq!(body["detail"][0]["loc"][0], "body", "{body}");
    }
    let (status, body) = c.post_raw("/instances", "{not json").await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["detail"][0]["loc"][0], "body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_known_and_unknown() {
    let c = Coord::start(&[]).await;
    c.register("mp-a", 9).await;
    assert_eq!(
        c.call(reqwest::Method::PUT, "/instances/mp-a/heartbeat", None)
            .await,
        (200, json!({"instance_id": "mp-a"}))
    );
    assert_eq!(
        c.call(reqwest::Method::PUT, "/instances/mp-nobody/heartbeat", None)
            .await,
        (
            404,
            json!({"error": "unknown instance mp-nobody; re-register"})
        )
    );
}

fn l1_count(stats: &serde_json::Value) -> u64 {
    stats["l1_count"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_partly_applied_partly_duplicate() {
    let c = Coord::start(&[]).await;
    let mut seed = Vec::new();
    for seq in 1..=6 {
        seed.push(batch("mp-a", 1000, seq, "access", "l2", "", &[]));
    }
    assert_eq!(
        c.events(seed).await,
        json!({"applied": 6, "duplicates": 0, "stale": 0})
    );
    let mut store = batch("mp-a", 1000, 7, "store", "l2", "s3", &[(key(H, ""), 8192)]);
    store["shared"] = json!(true);
    let config = json!({"instance_id": "mp-a", "incarnation": 1000, "seq": 3, "event_type": "config",
                        "tier": "l1", "backend": "dram", "entries": [], "capacity_bytes": 1});
    let out = c.events(vec![store.clone(), store, config]).await;
    assert_eq!(out, json!({"applied": 1, "duplicates": 2, "stale": 0}));
    let out = c
        .events(vec![batch("mp-a", 999, 50, "access", "l2", "", &[])])
        .await;
    assert_eq!(out, json!({"applied": 0, "duplicates": 0, "stale": 1}));
    let (_, stats) = c.get("/directory/stats").await;
    assert_eq!(stats["l2_count"], 1);
    assert_eq!(stats["l2_size_bytes"], 8192);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_request_rejects_every_batch() {
    let c = Coord::start(&[]).await;
    let good = batch("mp-a", 1, 1, "store", "l1", "dram", &[(key(H, ""), 1)]);
    let bad = batch("mp-a", 1, 2, "store", "all", "dram", &[]);
    let (status, body) = c
        .post("/events", json!({"batches": [good.clone(), bad]}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        c.get("/directory/stats").await.1["num_keys"],
        0,
        "nothing applied"
    );
    // Malformed, mistyped and oversized bodies are clear 4xx.
    assert_eq!(c.post_raw("/events", "{\"batches\": [").await.0, 422);
    assert_eq!(c.post("/events", json!({"batches": "x"})).await.0, 422);
    assert_eq!(c.post("/events", json!([1, 2])).await.0, 422);
    let huge = vec![b' '; ic_coordinator::http::MAX_BODY_BYTES + 10];
    assert_eq!(c.post_raw("/events", huge).await.0, 413);
    // Empty request is fine; unknown fields are ignored.
    let mut with_extra = good;
    with_extra["dropped_events"] = json!(0);
    with_extra["future_field"] = json!({"x": 1});
    assert_eq!(c.events(vec![with_extra]).await["applied"], 1);
    assert_eq!(c.events(vec![]).await["applied"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_fences_l1_and_keeps_l2() {
    let c = Coord::start(&[]).await;
    c.events(vec![
        batch("mp-a", 1000, 1, "store", "l1", "dram", &[(key(H, ""), 100)]),
        batch("mp-a", 1000, 2, "store", "l2", "fs", &[(key(H, ""), 200)]),
    ])
    .await;
    let (_, stats) = c.get("/directory/stats").await;
    assert_eq!(l1_count(&stats), 1);
    assert_eq!(stats["l1_keys_by_instance"]["mp-a"], 1);
    // A gap is admitted.
    assert_eq!(
        c.events(vec![batch("mp-a", 1000, 9, "access", "l2", "", &[])])
            .await["applied"],
        1
    );
    // New incarnation: L1 fenced, L2 survives.
    assert_eq!(
        c.events(vec![batch("mp-a", 2000, 1, "access", "l2", "", &[])])
            .await["applied"],
        1
    );
    let (_, stats) = c.get("/directory/stats").await;
    assert_eq!(l1_count(&stats), 0);
    assert_eq!(stats["l2_count"], 1);
    assert_eq!(stats["l1_keys_by_instance"]["mp-a"], 0);
    let (_, usage) = c.get("/quota?tier=l1").await;
    assert_eq!(usage["total_gb"], 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deregister_drops_stream_and_capacity() {
    let c = Coord::start(&[]).await;
    c.register("mp-a", 9).await;
    let config = json!({"instance_id": "mp-a", "incarnation": 5, "seq": 2, "event_type": "config",
                        "tier": "l1", "backend": "dram", "capacity_bytes": 1000});
    c.events(vec![
        batch("mp-a", 5, 1, "store", "l1", "dram", &[(key(H, ""), 100)]),
        config,
        batch("mp-a", 5, 3, "store", "l2", "fs", &[(key(H, ""), 200)]),
    ])
    .await;
    assert_eq!(c.delete("/instances/mp-a", None).await.0, 204);
    let (_, stats) = c.get("/directory/stats").await;
    assert_eq!(l1_count(&stats), 0);
    assert_eq!(stats["l2_count"], 1);
    assert!(stats["l1_keys_by_instance"].get("mp-a").is_none());
    // Still known through its L2 bytes, but the declaration is gone.
    let (status, usage) = c.get("/instances/mp-a/usage").await;
    assert_eq!(status, 200);
    assert_eq!(usage["registered"], false);
    assert_eq!(usage["declared_capacity"], false);
    // The cursor was forgotten: an older incarnation is admitted again.
    assert_eq!(
        c.events(vec![batch("mp-a", 1, 1, "access", "l2", "", &[])])
            .await["applied"],
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_timeout_fences_and_keeps_declaration() {
    let c = Coord::start(&["--instance-timeout", "30"]).await;
    c.register("mp-a", 9).await;
    c.register("mp-b", 9).await;
    let config = json!({"instance_id": "mp-a", "incarnation": 5, "seq": 2, "event_type": "config",
                        "tier": "l1", "backend": "dram", "capacity_bytes": 1000});
    c.events(vec![
        batch("mp-a", 5, 1, "store", "l1", "dram", &[(key(H, ""), 100)]),
        config,
    ])
    .await;
    c.clock.advance(Duration::from_secs(20));
    c.call(reqwest::Method::PUT, "/instances/mp-b/heartbeat", None)
        .await;
    c.clock.advance(Duration::from_secs(11));
    assert_eq!(c.app.sweep_liveness().await, vec!["mp-a".to_owned()]);
    let ids: Vec<String> = c.get("/instances").await.1["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, vec!["mp-b"]);
    assert_eq!(l1_count(&c.get("/directory/stats").await.1), 0);
    let (status, usage) = c.get("/instances/mp-a/usage").await;
    assert_eq!(status, 200, "declaration kept after a timeout");
    assert_eq!(usage["declared_capacity"], true);
    assert_eq!(usage["registered"], false);
    assert_eq!(
        c.call(reqwest::Method::PUT, "/instances/mp-a/heartbeat", None)
            .await
            .0,
        404
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_joins_declared_capacity() {
    let c = Coord::start(&[]).await;
    c.register("mp-a", 9).await;
    let cfg = |seq, tier: &str, backend: &str, cap: u64| {
        json!({"instance_id": "mp-a", "incarnation": 7, "seq": seq, "event_type": "config",
               "tier": tier, "backend": backend, "capacity_bytes": cap})
    };
    let mut shared = batch("mp-b", 1, 1, "store", "l2", "s3", &[(key(H, "t"), 50)]);
    shared["shared"] = json!(true);
    c.events(vec![
        cfg(1, "l1", "dram", 2_097_152),
        cfg(2, "l2", "fs", 33_554_432),
        batch("mp-a", 7, 3, "store", "l1", "dram", &[(key(H, ""), 300)]),
        batch("mp-a", 7, 4, "store", "l2", "fs", &[(key(H, ""), 8192)]),
        shared,
    ])
    .await;
    let (status, one) = c.get("/instances/mp-a/usage").await;
    assert_eq!(status, 200);
    assert_eq!(
        one,
        json!({"instance_id": "mp-a", "registered": true, "declared_capacity": true, "modules": [
            {"tier": "l1", "backend": "dram", "shared": false, "used_bytes": 300,
             "capacity_bytes": 2097152, "usage_ratio": 0.0001430511474609375},
            {"tier": "l2", "backend": "fs", "shared": false, "used_bytes": 8192,
             "capacity_bytes": 33554432, "usage_ratio": 0.000244140625}]})
    );
    let (_, fleet) = c.get("/instances/usage").await;
    let ids: Vec<&str> = fleet["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["instance_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        vec!["mp-a"],
        "a shared-pool reporter owns no private bytes"
    );
    assert_eq!(
        fleet["shared_modules"],
        json!([{"tier": "l2", "backend": "s3", "shared": true, "used_bytes": 50, "capacity_bytes": 0, "usage_ratio": null}])
    );
    assert_eq!(
        c.get("/instances/mp-zzz/usage").await,
        (404, json!({"detail": "unknown instance 'mp-zzz'"}))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framework_defaults_and_health() {
    let c = Coord::start(&[]).await;
    assert_eq!(c.get("/nope").await, (404, json!({"detail": "Not Found"})));
    assert_eq!(
        c.get("/events").await,
        (405, json!({"detail": "Method Not Allowed"}))
    );
    assert_eq!(c.get("/healthz").await, (200, json!({"status": "healthy"})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_loop_runs_the_sweep() {
    let c = Coord::start(&[
        "--health-check-interval",
        "0.02",
        "--instance-timeout",
        "30",
    ])
    .await;
    c.register("mp-a", 9).await;
    c.clock.advance(Duration::from_secs(31));
    // The real loop (a short period) does the sweep; poll for its effect.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !c.get("/instances").await.1["instances"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "health loop never removed mp-a"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_ingest_reads_and_checkpoints_stay_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("c.ckpt");
    let c = std::sync::Arc::new(
        Coord::start(&[
            "--checkpoint-path",
            ckpt.to_str().unwrap(),
            "--checkpoint-interval",
            "0",
        ])
        .await,
    );
    let mut tasks = Vec::new();
    for w in 0..8u64 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("mp-{w}");
            c.register(&id, 9).await;
            for seq in 1..=50u64 {
                let hash = format!("{w:02x}{seq:04x}");
                let tier = if seq % 2 == 0 { "l1" } else { "l2" };
                let out = c
                    .events(vec![batch(
                        &id,
                        1,
                        seq,
                        "store",
                        tier,
                        "b",
                        &[(key(&hash, "t"), 10)],
                    )])
                    .await;
                assert_eq!(out["applied"], 1);
            }
        }));
    }
    let reader = {
        let c = c.clone();
        tokio::spawn(async move {
            for _ in 0..30 {
                for path in [
                    "/metrics",
                    "/status",
                    "/instances/usage",
                    "/directory/stats",
                    "/quota",
                ] {
                    assert_eq!(
                        c.http.get(c.url(path)).send().await.unwrap().status(),
                        200,
                        "{path}"
                    );
                }
                let app = c.app.clone();
                assert!(
                    tokio::task::spawn_blocking(move || app.persistence.write_checkpoint())
                        .await
                        .unwrap()
                );
            }
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    reader.await.unwrap();
    let (_, stats) = c.get("/directory/stats").await;
    assert_eq!(stats["num_keys"], 400);
    assert_eq!(stats["l1_count"], 200);
    assert_eq!(stats["l2_size_bytes"], 2000);
    assert_eq!(
        c.get("/quota?tier=l2").await.1["by_cache_salt"][0]["usage_gb"],
        2000.0 / (1u64 << 30) as f64
    );
}

/// `POST /events` goes through one writer fed by a bounded queue: while the
/// views are held, requests wait in the queue (the event-bus gauges count
/// their batches), a request beyond `--max-pending-event-requests` is
/// refused at once with a 503 naming the bound (counted), and the queued
/// ones apply in arrival order once the views are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_queue_for_one_writer_and_are_refused_when_full() {
    let c = std::sync::Arc::new(Coord::start(&["--max-pending-event-requests", "2"]).await);
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let app = c.app.clone();
    let holder = std::thread::spawn(move || {
        app.views.read(|_| {
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        });
    });
    held_rx.recv().unwrap();
    // One instance, seq 1..=3, posted one after another: the writer holds
    // the first (blocked on the views), the queue the next two. Applied out
    // of order, a lower seq would count as a duplicate.
    let hashes: Vec<String> = (0..4).map(|i| format!("{i:064x}")).collect();
    let mut posts = Vec::new();
    for seq in 1..=3u64 {
        let c2 = c.clone();
        let b = batch(
            "mp-a",
            1,
            seq,
            "store",
            "l2",
            "fs",
            &[(key(&hashes[seq as usize - 1], ""), 64)],
        );
        posts.push(tokio::spawn(async move { c2.events(vec![b]).await }));
        // The writer's state, not the event gauges: a request is counted
        // there before it takes its place in the writer's queue.
        while c.app.ingest.writer_state() != (true, seq as usize - 1) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // The fourth finds the queue full: refused, nothing queued.
    let b = batch(
        "mp-a",
        1,
        4,
        "store",
        "l2",
        "fs",
        &[(key(&hashes[3], ""), 64)],
    );
    let resp = c
        .http
        .post(c.url("/events"))
        .json(&json!({ "batches": [b.clone()] }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: serde_json::Value = resp.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("--max-pending-event-requests"), "{detail}");
    assert_eq!(c.app.metrics.metrics.event_queue_full.get(), 1);
    assert_eq!(c.app.ingest.queue.snapshot().0, 3);
    assert_eq!(c.app.ingest.writer_state(), (true, 2));
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    for p in posts {
        assert_eq!(
            p.await.unwrap(),
            json!({"applied": 1, "duplicates": 0, "stale": 0})
        );
    }
    assert_eq!(c.app.ingest.queue.snapshot(), (0, 0.0));
    // The refused request was not applied; retried, it is.
    let (_, stats) = c.get("/directory/stats").await;
    assert_eq!(stats["num_keys"], 3);
    assert_eq!(
        c.events(vec![b]).await,
        json!({"applied": 1, "duplicates": 0, "stale": 0})
    );
    let text = c.metrics_text().await;
    assert!(
        text.contains("lmcache_coordinator_events_queue_full_total 1\n"),
        "{text}"
    );
}

/// A deregistration queues behind the instance's events already waiting
/// for the writer: applied after them, its fence removes their L1
/// placements (applied before, the events would find no cursor, be
/// admitted and bring the placements back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deregistration_applies_after_the_events_queued_before_it() {
    let c = std::sync::Arc::new(Coord::start(&[]).await);
    c.register("mp-x", 1).await;
    let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let app = c.app.clone();
    let holder = std::thread::spawn(move || {
        app.views.read(|_| {
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
        });
    });
    held_rx.recv().unwrap();
    // The writer holds mp-y's request; mp-x's L1 store waits in the queue.
    let mut posts = Vec::new();
    for (i, instance) in ["mp-y", "mp-x"].into_iter().enumerate() {
        let c2 = c.clone();
        let b = batch(
            instance,
            1,
            1,
            "store",
            "l1",
            "dram",
            &[(key(&format!("{i:064x}"), ""), 64)],
        );
        posts.push(tokio::spawn(async move { c2.events(vec![b]).await }));
        while c.app.ingest.writer_state() != (true, i) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let c2 = c.clone();
    let dereg = tokio::spawn(async move {
        c2.call(reqwest::Method::DELETE, "/instances/mp-x", None)
            .await
    });
    // The deregistration queued behind mp-x's store (before the fix it
    // took the lock directly, ahead of it).
    while c.app.ingest.writer_state() != (true, 2) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    release_tx.send(()).unwrap();
    holder.join().unwrap();
    for p in posts {
        p.await.unwrap();
    }
    assert_eq!(dereg.await.unwrap().0, 204);
    let (_, stats) = c.get("/directory/stats").await;
    assert_eq!(stats["l1_count"], 1, "{stats}");
    assert_eq!(stats["l1_keys_by_instance"].get("mp-x"), None, "{stats}");
}
