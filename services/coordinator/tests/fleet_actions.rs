//! Quotas, pins, targeted delete, prefetch and the eviction sweep, with a
//! fake MP server (a real HTTP server on loopback) on the other end.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Coord, FakeMp, batch, key};
use serde_json::{Value, json};

fn tokens(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_routes() {
    let c = Coord::start(&[]).await;
    assert_eq!(
        c.put("/quota/t", json!({"limit_gb": 1})).await,
        (
            200,
            json!({"cache_salt": "t", "limit_gb": 1.0, "status": "ok"})
        )
    );
    assert_eq!(
        c.put("/quota/_default", json!({"limit_gb": 0.5})).await.1["cache_salt"],
        ""
    );
    c.events(vec![batch(
        "mp-a",
        1,
        1,
        "store",
        "l2",
        "fs",
        &[(key("01", "t"), 1 << 29)],
    )])
    .await;
    assert_eq!(
        c.get("/quota/t").await,
        (
            200,
            json!({"cache_salt": "t", "quota_limit_gb": 1.0, "quota_exists": true, "usage_gb": 0.5})
        )
    );
    assert_eq!(
        c.get("/quota/none?tier=l1").await.1,
        json!({"cache_salt": "none", "quota_limit_gb": 0.0, "quota_exists": false, "usage_gb": 0.0})
    );
    let (_, list) = c.get("/quota").await;
    let salts: Vec<&str> = list["by_cache_salt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cache_salt"].as_str().unwrap())
        .collect();
    assert_eq!(salts, vec!["", "t"]);
    assert_eq!(list["total_gb"], 0.5);
    // Errors.
    assert_eq!(c.put("/quota/t", json!({"limit_gb": -1})).await.0, 422);
    assert_eq!(c.put("/quota/t", json!({})).await.0, 422);
    assert_eq!(
        c.put("/quota/t", json!({"limit_gb": 1, "tier": "l9"}))
            .await
            .0,
        422
    );
    assert_eq!(
        c.put("/quota/t", json!({"limit_gb": 1, "tier": "l1"}))
            .await,
        (
            400,
            json!({"detail": "quotas apply to tier 'l2' only, not 'l1'"})
        )
    );
    assert_eq!(
        c.get("/quota/t?tier=all").await,
        (
            400,
            json!({"detail": "tier 'all' has no usage accounting; only 'l1', 'l2'"})
        )
    );
    assert_eq!(c.get("/quota?tier=all").await.0, 400);
    assert_eq!(c.delete("/quota/t?tier=l1", None).await.0, 400);
    assert_eq!(
        c.delete("/quota/t", None).await,
        (
            200,
            json!({"cache_salt": "t", "limit_gb": 0.0, "status": "removed"})
        )
    );
    assert_eq!(c.delete("/quota/t", None).await.1["status"], "not_found");
    // Quota gauges follow the current quotas on every scrape.
    c.put("/quota/q2", json!({"limit_gb": 1})).await;
    let text = c.metrics_text().await;
    assert!(
        text.contains(r#"lmcache_coordinator_quota_limit_bytes{cache_salt="q2"} 1073741824"#),
        "{text}"
    );
    assert!(
        !text.contains(r#"cache_salt="t""#),
        "removed quota must leave the gauges:\n{text}"
    );
    // Default limit and its rounding.
    assert_eq!(
        c.get("/quota/config").await,
        (200, json!({"default_limit_gb": null}))
    );
    assert_eq!(
        c.put("/quota/config", json!({"default_limit_gb": 0.1}))
            .await,
        (200, json!({"default_limit_gb": 0.1}))
    );
    assert_eq!(
        c.get("/quota/config").await.1,
        json!({"default_limit_gb": 0.09999999962747097})
    );
    assert_eq!(
        c.put("/quota/config", json!({"default_limit_gb": -2}))
            .await
            .0,
        422
    );
    assert_eq!(
        c.put(
            "/quota/config",
            json!({"default_limit_gb": 1, "tier": "l1"})
        )
        .await
        .0,
        400
    );
    // PUT /quota/config {"limit_gb"} is a config request that resets the default.
    assert_eq!(
        c.put("/quota/config", json!({"limit_gb": 4})).await.1,
        json!({"default_limit_gb": null})
    );
    assert_eq!(
        c.get("/quota/config").await.1,
        json!({"default_limit_gb": null})
    );
    assert_eq!(
        c.delete("/quota/config", None).await,
        (
            200,
            json!({"cache_salt": "config", "limit_gb": 0.0, "status": "not_found"})
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pins_refcount_list_and_errors() {
    let c = Coord::start(&["--chunk-size", "4"]).await;
    let body =
        json!({"model_name": "m", "world_size": 2, "token_ids": tokens(1..11), "cache_salt": "t"});
    assert_eq!(
        c.post("/cache/pins", body.clone()).await,
        (
            200,
            json!({"requested": 2, "affected": 4, "status": "pinned"})
        )
    );
    c.post("/cache/pins", body.clone()).await;
    let (_, list) = c.get("/cache/pins?cache_salt=t").await;
    assert_eq!(list["total"], 4);
    assert_eq!(list["pins"][0]["pin_count"], 2);
    assert_eq!(list["pins"][0]["key"]["object_group_id"], 0);
    assert_eq!(c.get("/cache/pins?cache_salt=other").await.1["total"], 0);
    assert_eq!(
        c.get("/cache/pins?limit=1&offset=3").await.1["pins"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        c.delete("/cache/pins", Some(body.clone())).await,
        (
            200,
            json!({"requested": 2, "affected": 4, "status": "unpinned"})
        )
    );
    assert_eq!(c.get("/cache/pins").await.1["pins"][0]["pin_count"], 1);
    c.delete("/cache/pins", Some(body.clone())).await;
    assert_eq!(c.get("/cache/pins").await.1["total"], 0);
    // Unpinning what is not pinned still reports every resolved key.
    assert_eq!(c.delete("/cache/pins", Some(body)).await.1["affected"], 4);
    assert_eq!(c.post("/cache/pins", json!({"world_size": 1})).await.0, 422);
    assert_eq!(
        c.post("/cache/pins", json!({"model_name": "m"})).await.0,
        422
    );
    assert_eq!(
        c.post("/cache/pins", json!({"model_name": "m", "world_size": 0}))
            .await
            .0,
        422
    );
    assert_eq!(
        c.post(
            "/cache/pins",
            json!({"model_name": "m", "world_size": 1, "cache_salt": "a/b"})
        )
        .await
        .0,
        400
    );
    assert_eq!(c.get("/cache/pins?limit=0").await.0, 422);
}

/// The contract's example: chunks 0 and 1 pinned, chunk 0 has a group-1 copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeted_delete_holds_back_pins() {
    let mp = FakeMp::start().await;
    let c = Coord::start(&["--chunk-size", "4"]).await;
    c.register("mp-a", mp.port).await;
    let req = |extra: Value| {
        let mut b = json!({"instance_id": "mp-a", "model_name": "org/model-a", "world_size": 1,
                           "token_ids": tokens(1000..1012), "cache_salt": ""});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    // Resolve keys through a lookup to learn the hashes.
    let (_, look) = c
        .post(
            "/directory/lookup",
            json!({"token_ids": tokens(1000..1012), "model_name": "org/model-a"}),
        )
        .await;
    let keys: Vec<Value> = look["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key"].clone())
        .collect();
    let mut g1 = keys[0].clone();
    g1["object_group_id"] = json!(1);
    c.events(vec![batch("mp-a", 1, 1, "store", "l2", "fs", &[(g1, 10)])])
        .await;
    c.post(
        "/cache/pins",
        json!({"model_name": "org/model-a", "world_size": 1, "token_ids": tokens(1000..1008)}),
    )
    .await;

    let (status, body) = c.post("/cache/delete", req(json!({}))).await;
    assert_eq!(
        (status, body),
        (
            200,
            json!({"instance_id": "mp-a", "requested": 3, "affected": 1, "skipped": 3, "status": "deleted"})
        )
    );
    let got = mp.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].method, "DELETE");
    assert_eq!(
        got[0].body,
        json!({"keys": [keys[2]], "tier": "all", "force": false})
    );

    // L1-only deletes ignore pins.
    c.post("/cache/delete", req(json!({"tier": "l1"}))).await;
    assert_eq!(mp.received()[1].body["keys"].as_array().unwrap().len(), 4);
    // A forced L2 delete sends everything and releases the pins.
    let (status, _) = c
        .post("/cache/delete", req(json!({"tier": "l2", "force": true})))
        .await;
    assert_eq!(status, 200);
    assert_eq!(mp.received()[2].body["force"], true);
    assert_eq!(c.get("/cache/pins").await.1["total"], 0);
    // Sub-chunk: noop without calling the node.
    assert_eq!(
        c.post("/cache/delete", req(json!({"token_ids": [1, 2]})))
            .await,
        (
            200,
            json!({"instance_id": "mp-a", "requested": 0, "affected": 0, "skipped": 0, "status": "noop"})
        )
    );
    assert_eq!(mp.received().len(), 3);
    // Unknown instance beats token validation.
    assert_eq!(
        c.post(
            "/cache/delete",
            req(json!({"instance_id": "ghost", "cache_salt": "a/b"}))
        )
        .await,
        (
            404,
            json!({"detail": "no MP server registered with instance_id='ghost'"})
        )
    );
    assert_eq!(
        c.post("/cache/delete", req(json!({"cache_salt": "a/b"})))
            .await
            .0,
        400
    );
    assert_eq!(
        c.post("/cache/delete", req(json!({"tier": "l7"}))).await.0,
        422
    );
    // Node failure is a 502.
    mp.set(|b| b.delete_status = 500);
    let (status, body) = c.post("/cache/delete", req(json!({}))).await;
    assert_eq!(status, 502);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .starts_with("delete to 'mp-a' failed: "),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_submit_and_status_relay() {
    let mp = FakeMp::start().await;
    let c = Coord::start(&[]).await;
    c.register("mp-a", mp.port).await;
    let req =
        json!({"instance_id": "mp-a", "model_name": "m", "world_size": 1, "token_ids": [1, 2, 3]});
    assert_eq!(
        c.post("/cache/prefetches", req.clone()).await,
        (
            200,
            json!({"instance_id": "mp-a", "request_id": "r1", "chunks": 2, "status": "submitted"})
        )
    );
    assert_eq!(
        mp.received()[0].body,
        json!({"model_name": "m", "world_size": 1, "token_ids": [1, 2, 3], "cache_salt": ""})
    );
    assert_eq!(
        c.get("/cache/prefetches/mp-a/r1").await,
        (200, json!({"request_id": "r1", "status": "pending"}))
    );
    mp.set(|b| {
        b.prefetch_status = (
            200,
            r#"{"request_id":"r1","status":"completed","found_keys":3,"total_keys":4}"#.into(),
        )
    });
    assert_eq!(c.get("/cache/prefetches/mp-a/r1").await.1["found_keys"], 3);
    mp.set(|b| {
        b.prefetch_status = (
            404,
            r#"{"detail":"unknown prefetch request_id='r1'"}"#.into(),
        )
    });
    assert_eq!(
        c.get("/cache/prefetches/mp-a/r1").await,
        (404, json!({"detail": "unknown prefetch request_id='r1'"}))
    );
    mp.set(|b| b.prefetch_status = (503, "busy".into()));
    assert_eq!(
        c.get("/cache/prefetches/mp-a/r1").await,
        (503, json!({"detail": "busy"}))
    );
    assert_eq!(c.get("/cache/prefetches/ghost/r1").await.0, 404);
    assert_eq!(
        c.post(
            "/cache/prefetches",
            json!({"instance_id": "mp-a", "model_name": "m"})
        )
        .await
        .0,
        422
    );
    // A registered but unreachable node is a 502.
    c.register("mp-dead", common_dead_port()).await;
    let mut dead = req;
    dead["instance_id"] = json!("mp-dead");
    let (status, body) = c.post("/cache/prefetches", dead).await;
    assert_eq!(status, 502);
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .starts_with("prefetch submit to 'mp-dead' failed"),
        "{body}"
    );
    assert_eq!(c.get("/cache/prefetches/mp-dead/x").await.0, 502);
}

fn common_dead_port() -> u16 {
    ic_e2e::free_port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_sweep_deletes_lru_unpinned_keys() {
    let mp = FakeMp::start().await;
    let c = Coord::start(&["--chunk-size", "4", "--eviction-ratio", "0.5"]).await;
    let ctl = eviction_controller(&c);
    // No quota: nothing happens.
    let hashes: Vec<String> = (1..=4).map(|i| format!("{i:02x}")).collect();
    let entries: Vec<(Value, u64)> = hashes.iter().map(|h| (key(h, "t"), 100)).collect();
    c.events(vec![batch("mp-a", 1, 1, "store", "l2", "fs", &entries)])
        .await;
    assert_eq!(ctl.sweep(&c.app.context()).await.selected, 0);
    // Over quota but nobody registered: selected, not sent.
    c.put("/quota/t", json!({"limit_gb": 0.0000001})).await;
    let r = ctl.sweep(&c.app.context()).await;
    // 1e-7 GiB is 107 bytes: 400 used, so int(4 × 0.5) keys are selected.
    assert_eq!((r.selected, r.target.clone()), (2, None));
    c.register("mp-a", mp.port).await;
    // Access key 01 so it becomes most recent; pin key 02 (through its exact key).
    c.events(vec![batch(
        "mp-a",
        1,
        2,
        "access",
        "l2",
        "",
        &[(key("01", "t"), 0)],
    )])
    .await;
    ctl.state
        .lock()
        .pins
        .pin([&ic_coordinator_core::ObjectKey::from_wire(
            &serde_json::from_value(key("02", "t")).unwrap(),
        )
        .unwrap()]);
    let r = ctl.sweep(&c.app.context()).await;
    assert_eq!(r.target.as_deref(), Some("mp-a"));
    let sent = mp.received();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].path, "/cache/objects");
    let keys: Vec<&str> = sent[0].body["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["chunk_hash_hex"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        vec!["03", "04"],
        "oldest unpinned first, ratio 0.5 of 4"
    );
    assert!(sent[0].body.get("tier").is_none() && sent[0].body.get("force").is_none());
    // Keys stay in the LRU until the node's delete events arrive.
    c.events(vec![batch(
        "mp-a",
        1,
        3,
        "delete",
        "l2",
        "fs",
        &[(key("03", "t"), 0), (key("04", "t"), 0)],
    )])
    .await;
    ctl.sweep(&c.app.context()).await;
    let sent = mp.received();
    let keys: Vec<&str> = sent[1].body["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["chunk_hash_hex"].as_str().unwrap())
        .collect();
    assert_eq!(keys, vec!["01"], "02 pinned; int(2 × 0.5) = 1");
}

fn eviction_controller(
    c: &Coord,
) -> std::sync::Arc<ic_coordinator::controllers::FleetEvictionController> {
    c.app.eviction.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_loop_dispatches_on_its_own() {
    let mp = FakeMp::start().await;
    let c = Coord::start(&["--eviction-check-interval", "0.02"]).await;
    c.register("mp-a", mp.port).await;
    c.put("/quota/t", json!({"limit_gb": 0})).await;
    c.events(vec![batch(
        "mp-a",
        1,
        1,
        "store",
        "l2",
        "fs",
        &[(key("01", "t"), 10)],
    )])
    .await;
    // Deadlines only for "it happens at all": a loaded machine may be slow.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while mp.received().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "eviction loop never sent a delete"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(mp.received()[0].body["keys"][0]["chunk_hash_hex"], "01");
    // A pass is marked when its sweep returns, after the delete it sent was
    // answered: the delete arriving does not mean the pass is marked yet
    // (when the sweep that sent it was the loop's first, under load, the
    // page read at once had no pass). Wait for the mark.
    let pass = r#"lmcache_coordinator_loop_last_pass_timestamp_seconds{loop="eviction"}"#;
    loop {
        let text = c.metrics_text().await;
        if text.contains(pass) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the eviction loop's pass was never marked: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mp_call_past_its_timeout_fails_and_is_counted_as_a_timeout() {
    let mp = FakeMp::start().await;
    mp.set(|b| b.delete_delay = std::time::Duration::from_secs(5));
    let c = Coord::start(&["--chunk-size", "4", "--mp-timeout-seconds", "0.3"]).await;
    c.register("mp-a", mp.port).await;
    let started = std::time::Instant::now();
    let (status, body) = c
        .post(
            "/cache/delete",
            json!({"instance_id": "mp-a", "model_name": "org/model-a", "world_size": 1,
                   "token_ids": tokens(1000..1008), "cache_salt": ""}),
        )
        .await;
    assert!(
        started.elapsed() < std::time::Duration::from_secs(4),
        "gave up at the flag's timeout"
    );
    assert!(status >= 500, "{status} {body}");
    assert!(
        body.to_string().contains("--mp-timeout-seconds"),
        "{status} {body}"
    );
    let metrics = c.metrics_text().await;
    assert!(
        metrics.lines().any(|l| l.contains("mp_requests_total{")
            && l.contains("outcome=\"timeout\"")
            && l.ends_with(" 1")),
        "{metrics}"
    );
}
