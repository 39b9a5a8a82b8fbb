//! Black-box tests of `/directory/*`.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Coord, batch, key};
use serde_json::{Value, json};

const V1_H0: &str = "6309ed506b8721905753f5c73c070bb21c3aafbd9b474b1e231f41368b71123c";
const V1_H1: &str = "98efc76eafb06cfe774c31ff151f300b61a614c27982a211bb8cdbd83a8c0e19";

fn tkey(hash: &str, model: &str, rank: i64, group: i64) -> Value {
    json!({"chunk_hash_hex": hash, "model_name": model, "kv_rank": rank, "object_group_id": group, "cache_salt": ""})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_lookup_matches_golden_vectors_and_expands_groups() {
    let c = Coord::start(&["--chunk-size", "4"]).await;
    // Chunk 0 stored with its tokens, plus an object-group-1 copy.
    let mut store = batch(
        "mp-b",
        2000,
        1,
        "store",
        "l2",
        "fs",
        &[(tkey(V1_H0, "test-model", 16777472, 0), 4096)],
    );
    store["entries"][0]["token_ids"] = json!([1, 2, 3, 4]);
    store["entries"][0]["token_offset"] = json!(0);
    let g1 = batch(
        "mp-a",
        1,
        1,
        "store",
        "l1",
        "dram",
        &[(tkey(V1_H0, "test-model", 16777472, 1), 10)],
    );
    c.events(vec![store, g1]).await;
    let (status, body) = c
        .post("/directory/lookup", json!({"token_ids": [1,2,3,4,5,6,7,8,9,10], "model_name": "test-model", "world_size": 1, "cache_salt": ""}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["chunks"], 2);
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 3, "chunk 0, its group-1 copy, chunk 1");
    assert_eq!(results[0]["key"], tkey(V1_H0, "test-model", 16777472, 0));
    assert_eq!(results[0]["placements"][0]["instance_id"], "mp-b");
    assert_eq!(results[0]["token_ids"], json!([1, 2, 3, 4]));
    assert_eq!(results[1]["key"]["object_group_id"], 1);
    assert_eq!(
        results[1]["token_ids"],
        json!([1, 2, 3, 4]),
        "tokens come by chunk hash"
    );
    assert_eq!(results[2]["key"], tkey(V1_H1, "test-model", 16777472, 0));
    assert_eq!(results[2]["placements"], json!([]));
    assert_eq!(results[2]["access_count"], 0);

    // V2: world size 2, salted.
    let (_, body) = c
        .post("/directory/lookup", json!({"token_ids": [1,2,3,4,5,6,7,8], "model_name": "test-model", "world_size": 2, "cache_salt": "tenant-a"}))
        .await;
    let ranks: Vec<(String, i64)> = body["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["key"]["chunk_hash_hex"].as_str().unwrap().to_owned(),
                r["key"]["kv_rank"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ranks,
        vec![
            (V1_H0.to_owned(), 33554944),
            (V1_H0.to_owned(), 33620481),
            (V1_H1.to_owned(), 33554944),
            (V1_H1.to_owned(), 33620481)
        ]
    );
    assert!(
        body["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["key"]["cache_salt"] == "tenant-a")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_lookup_echoes_input_and_sorts_placements() {
    let c = Coord::start(&[]).await;
    let k = key(
        "31da4bfd0f6649244546c17c9734daf7521f4f7b1cd500b57da136f3eb5820d3",
        "",
    );
    c.events(vec![
        batch("mp-b", 2000, 1, "store", "l2", "fs", &[(k.clone(), 4096)]),
        batch("mp-a", 1, 1, "store", "l2", "fs", &[(k.clone(), 4096)]),
        batch("mp-a", 1, 2, "access", "l2", "", &[(k.clone(), 0)]),
    ])
    .await;
    let mut upper = k.clone();
    upper["chunk_hash_hex"] =
        json!("31DA4BFD0F6649244546C17C9734DAF7521F4F7B1CD500B57DA136F3EB5820D3");
    let (status, body) = c
        .post(
            "/directory/lookup",
            json!({"keys": [upper.clone(), upper.clone(), key("00", "")]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["chunks"], 3);
    let r = &body["results"][0];
    assert_eq!(r["key"], upper, "echoed as sent");
    assert_eq!(r["access_count"], 1);
    let owners: Vec<&str> = r["placements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["instance_id"].as_str().unwrap())
        .collect();
    assert_eq!(owners, vec!["mp-a", "mp-b"]);
    assert_eq!(
        r["placements"][1],
        json!({"instance_id": "mp-b", "incarnation": 2000, "tier": "l2", "backend": "fs", "size_bytes": 4096, "shared": false})
    );
    assert_eq!(body["results"][1], body["results"][0], "duplicates kept");
    assert_eq!(body["results"][2]["placements"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_errors() {
    let c = Coord::start(&["--chunk-size", "4"]).await;
    let k = key("aa", "");
    for (body, want) in [
        (
            json!({"keys": [k], "token_ids": [1], "model_name": "m"}),
            422,
        ),
        (json!({}), 422),
        (json!({"keys": [], "token_ids": []}), 422),
        (json!({"token_ids": [1, 2, 3, 4]}), 422),
        (
            json!({"token_ids": [1, 2, 3, 4], "model_name": "m", "world_size": 0}),
            422,
        ),
        (
            json!({"keys": [{"chunk_hash_hex": "abc", "model_name": "m", "kv_rank": 1}]}),
            422,
        ),
        (
            json!({"keys": [{"chunk_hash_hex": "ab", "model_name": "m"}]}),
            422,
        ),
        (json!({"token_ids": [1, 2, 3, 4], "model_name": "a@b"}), 400),
        (
            json!({"token_ids": [1], "model_name": "m", "cache_salt": "a/b"}),
            400,
        ),
        (json!({"token_ids": [1, 2, 3, -4], "model_name": "m"}), 400),
        (
            json!({"token_ids": [1, 2, 3, 4294967296u64], "model_name": "m"}),
            400,
        ),
    ] {
        let (status, resp) = c.post("/directory/lookup", body.clone()).await;
        assert_eq!(status, want, "{body} -> {resp}");
    }
    let (status, resp) = c
        .post(
            "/directory/lookup",
            json!({"token_ids": [1], "model_name": "m", "cache_salt": "a/b"}),
        )
        .await;
    assert_eq!(
        (status, resp),
        (
            400,
            json!({"detail": "cache_salt must not contain frozenset({'/'}) (got 'a/b')"})
        )
    );
    let (status, resp) = c
        .post(
            "/directory/lookup",
            json!({"token_ids": [1, 2], "model_name": "a@b"}),
        )
        .await;
    assert_eq!(
        (status, resp["chunks"].clone()),
        (200, json!(0)),
        "model checked only when a key is built"
    );
    let many = vec![0u32; 1_000_001];
    let (status, resp) = c
        .post(
            "/directory/lookup",
            json!({"token_ids": many, "model_name": "m"}),
        )
        .await;
    assert_eq!(
        (status, resp),
        (
            400,
            json!({"detail": "too many token_ids in a single request (limit=1000000, got=1000001)"})
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_requests_past_the_flags_bounds_are_refused_and_counted() {
    let c = Coord::start(&[
        "--chunk-size",
        "2",
        "--max-tokens-per-request",
        "8",
        "--max-keys-per-request",
        "6",
    ])
    .await;
    let lookup = |n: u32, ws: u32| json!({"token_ids": (0..n).collect::<Vec<_>>(), "model_name": "m", "world_size": ws});
    assert_eq!(c.post("/directory/lookup", lookup(8, 1)).await.0, 200);
    assert_eq!(
        c.post("/directory/lookup", lookup(9, 1)).await,
        (
            400,
            json!({"detail": "too many token_ids in a single request (limit=8, got=9)"})
        )
    );
    assert_eq!(
        c.post("/directory/lookup", lookup(8, 2)).await,
        (
            400,
            json!({"detail": "too many keys in a single request (limit=6, got=8)"})
        )
    );
    // Pins resolve tokens the same way.
    let (status, _) = c
        .post(
            "/cache/pins",
            json!({"model_name": "m", "world_size": 1, "token_ids": (0..9).collect::<Vec<_>>()}),
        )
        .await;
    assert_eq!(status, 400);
    let metrics = c.metrics_text().await;
    let counted = |limit: &str| {
        metrics.lines().find_map(|l| {
            l.strip_prefix(&format!(
                "lmcache_coordinator_requests_refused_total{{limit=\"{limit}\"}} "
            ))
            .map(str::to_owned)
        })
    };
    assert_eq!(
        counted("tokens_per_request").as_deref(),
        Some("2"),
        "{metrics}"
    );
    assert_eq!(
        counted("keys_per_request").as_deref(),
        Some("1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_past_the_flags_bound_are_refused_and_counted() {
    let c = Coord::start(&["--max-body-bytes", "2048"]).await;
    let tokens = |n: u32| (0..n).collect::<Vec<_>>();
    let small = json!({"token_ids": tokens(16), "model_name": "m"});
    assert_eq!(c.post("/directory/lookup", small).await.0, 200);
    // Past it on the lookup's own path and through the router.
    let large = json!({"token_ids": tokens(1000), "model_name": "m"});
    assert_eq!(c.post("/directory/lookup", large.clone()).await.0, 413);
    assert_eq!(c.post("/events", large).await.0, 413);
    let metrics = c.metrics_text().await;
    assert!(
        metrics.contains("lmcache_coordinator_requests_refused_total{limit=\"body_bytes\"} 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_listing_filters_and_pages() {
    let c = Coord::start(&[]).await;
    let hashes: Vec<String> = (1..=5).map(|i| format!("{i:02x}")).collect();
    let mut batches = Vec::new();
    for (i, h) in hashes.iter().enumerate() {
        let (inst, tier, backend) = if i % 2 == 0 {
            ("mp-a", "l2", "fs")
        } else {
            ("mp-b", "l1", "dram")
        };
        let seq = i as u64 + 1;
        let mut b = batch(inst, 1, seq, "store", tier, backend, &[(key(h, ""), 10)]);
        if i == 0 {
            b["entries"][0]["token_ids"] = json!([5, 6]);
        }
        batches.push(b);
    }
    c.events(batches).await;
    let (status, all) = c.get("/directory/keys").await;
    assert_eq!(status, 200);
    assert_eq!(all["total"], 5);
    let order: Vec<&str> = all["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"]["chunk_hash_hex"].as_str().unwrap())
        .collect();
    assert_eq!(order, vec!["01", "02", "03", "04", "05"]);
    assert_eq!(all["keys"][0]["num_tokens"], 2);
    let (_, l2) = c.get("/directory/keys?tier=l2&offset=1&limit=1").await;
    assert_eq!(l2["total"], 3);
    assert_eq!(l2["keys"].as_array().unwrap().len(), 1);
    assert_eq!(l2["keys"][0]["key"]["chunk_hash_hex"], "03");
    let (_, b) = c.get("/directory/keys?instance_id=mp-b&backend=dram").await;
    assert_eq!(b["total"], 2);
    for bad in [
        "tier=l3",
        "limit=0",
        "limit=10001",
        "offset=-1",
        "limit=abc",
    ] {
        let (status, body) = c.get(&format!("/directory/keys?{bad}")).await;
        assert_eq!(status, 422, "{bad} -> {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_shape_and_blend_lookup() {
    let c = Coord::start(&[]).await;
    c.events(vec![
        batch(
            "mp-a",
            1,
            1,
            "store",
            "l1",
            "dram",
            &[(key("01", ""), 10), (key("02", ""), 5)],
        ),
        batch("mp-a", 1, 2, "store", "l2", "fs", &[(key("01", ""), 100)]),
        batch("mp-c", 1, 1, "access", "l2", "", &[]),
    ])
    .await;
    let (status, s) = c.get("/directory/stats").await;
    assert_eq!(status, 200);
    assert_eq!(
        s,
        json!({"num_keys": 2, "num_placements": 3, "l1_keys_by_instance": {"mp-a": 2, "mp-c": 0},
               "blend": {"num_contents": 0, "num_chunks": 0, "num_claims": 0, "num_namespaces": 0, "table_size": 1024},
               "l1_count": 2, "l1_size_bytes": 15, "l2_count": 1, "l2_size_bytes": 100})
    );
    let ok =
        json!({"tokens_b64": "AQAAAAIAAAA=", "model_name": "m", "world_size": 1, "cache_salt": ""});
    assert_eq!(
        c.post("/directory/blend-lookup", ok).await,
        (200, json!({"matches": []}))
    );
    assert_eq!(
        c.post(
            "/directory/blend-lookup",
            json!({"tokens_b64": "!!", "model_name": "m"})
        )
        .await
        .0,
        422
    );
    assert_eq!(
        c.post(
            "/directory/blend-lookup",
            json!({"tokens_b64": "AQID", "model_name": "m"})
        )
        .await
        .0,
        422
    );
    assert_eq!(
        c.post("/directory/blend-lookup", json!({"tokens_b64": "AQAAAA=="}))
            .await
            .0,
        422
    );
}

/// The lookup answer is written directly as text: it must be the compact,
/// key-sorted JSON a `serde_json::Value` writes (what it was before), with
/// every string escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_answer_is_the_compact_sorted_json_of_its_value() {
    let c = Coord::start(&[]).await;
    let k = json!({"chunk_hash_hex": "00fF", "model_name": "mo\"del\té", "kv_rank": 7,
                   "object_group_id": 2, "cache_salt": "ten\"ant"});
    let mut b = batch(
        "mp-\"a",
        1,
        1,
        "store",
        "l1",
        "dr\\am",
        &[(k.clone(), 4096)],
    );
    b["entries"][0]["token_ids"] = json!([1, 2, 4_294_967_295_u64]);
    b["entries"][0]["token_offset"] = json!(0);
    let mut shared = batch("mp-b", 3, 1, "store", "l2", "fs", &[(k.clone(), 10)]);
    shared["shared"] = json!(true);
    c.events(vec![b, shared]).await;
    let resp = c
        .http
        .post(c.url("/directory/lookup"))
        .json(&json!({"keys": [k, key("00", "")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let text = resp.text().await.unwrap();
    let value: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(text, serde_json::to_string(&value).unwrap());
    let r = &value["results"][0];
    assert_eq!(r["key"]["model_name"], "mo\"del\té");
    assert_eq!(r["token_ids"], json!([1, 2, 4_294_967_295_u64]));
    assert_eq!(
        r["placements"],
        json!([
            {"backend": "dr\\am", "incarnation": 1, "instance_id": "mp-\"a", "shared": false, "size_bytes": 4096, "tier": "l1"},
            {"backend": "fs", "incarnation": 3, "instance_id": "mp-b", "shared": true, "size_bytes": 10, "tier": "l2"}
        ])
    );
    assert_eq!(value["results"][1]["placements"], json!([]));
    assert_eq!(value["chunks"], 2);
}

/// `POST /directory/lookup` is served before the router (src/hot.rs) and
/// keeps what the router gave it: the 32 MiB body limit (not axum's 2 MiB
/// default), the request counted and timed under the route's labels
/// (answers and refusals), and every other method left to the router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lookup_route_keeps_the_routers_body_limit_metrics_and_methods() {
    const H: &str = "abababababababababababababababababababababababababababababababab";
    let c = Coord::start(&[]).await;
    c.events(vec![batch(
        "mp-a",
        1,
        1,
        "store",
        "l1",
        "dram",
        &[(key(H, ""), 1)],
    )])
    .await;
    // 3 MiB of whitespace after a valid request: over axum's default.
    let padded = format!("{}{}", json!({"keys": [key(H, "")]}), " ".repeat(3 << 20));
    let (status, body) = c.post_raw("/directory/lookup", padded).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["results"][0]["placements"][0]["instance_id"], "mp-a");
    let huge = vec![b' '; ic_coordinator::http::MAX_BODY_BYTES + 10];
    assert_eq!(c.post_raw("/directory/lookup", huge).await.0, 413);
    assert_eq!(
        c.post("/directory/lookup", json!({"keys": []})).await.0,
        422
    );
    assert_eq!(c.get("/directory/lookup").await.0, 405);
    let text = c.metrics_text().await;
    for needle in [
        r#"lmcache_coordinator_http_requests_total{method="POST",route="/directory/lookup",status="2xx"} 1"#,
        r#"lmcache_coordinator_http_requests_total{method="POST",route="/directory/lookup",status="4xx"} 2"#,
        r#"lmcache_coordinator_http_request_duration_seconds_count{route="/directory/lookup"} 3"#,
    ] {
        assert!(text.contains(needle), "missing {needle}:\n{text}");
    }
}
