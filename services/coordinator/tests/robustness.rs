//! Bad input on every route gets a clear 4xx and never a 5xx or a crash.
#![allow(clippy::unwrap_used)]

mod common;

use common::Coord;
use reqwest::Method;

const ROUTES: &[(&str, &str)] = &[
    ("POST", "/instances"),
    ("PUT", "/instances/x/heartbeat"),
    ("DELETE", "/instances/x"),
    ("POST", "/events"),
    ("POST", "/directory/lookup"),
    ("GET", "/directory/keys"),
    ("POST", "/directory/blend-lookup"),
    ("PUT", "/quota/x"),
    ("GET", "/quota/x"),
    ("DELETE", "/quota/x"),
    ("GET", "/quota"),
    ("PUT", "/quota/config"),
    ("GET", "/quota/config"),
    ("POST", "/cache/pins"),
    ("DELETE", "/cache/pins"),
    ("GET", "/cache/pins"),
    ("POST", "/cache/delete"),
    ("POST", "/cache/prefetches"),
];

const BODIES: &[&str] = &[
    "",
    "{",
    "null",
    "[]",
    "\"text\"",
    "123456789012345678901234567890",
    "{\"batches\": [{}]}",
    "{\"batches\": [null, 1, \"x\"]}",
    "{\"keys\": [{\"chunk_hash_hex\": 5}]}",
    "{\"token_ids\": [1e400], \"model_name\": \"m\"}",
    "{\"token_ids\": [-1, 99999999999999999999], \"model_name\": \"m\"}",
    "{\"token_ids\": \"abc\", \"model_name\": [1]}",
    "{\"limit_gb\": \"lots\"}",
    "{\"limit_gb\": 1e308}",
    "{\"default_limit_gb\": true}",
    "{\"ip\": \"h\", \"http_port\": 1.5}",
    "{\"instance_id\": \"x\", \"model_name\": \"m\", \"world_size\": 99999999999999}",
    "{\"instance_id\": \"x\", \"model_name\": \"m\", \"world_size\": 1, \"tier\": \"all\", \"force\": \"yes\"}",
    "\u{0}\u{1}\u{2}",
];

const QUERIES: &[&str] = &[
    "",
    "?tier=zz",
    "?limit=-5",
    "?offset=1e9",
    "?limit=99999999999999999999",
    "?tier",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_never_yields_a_server_error() {
    let c = Coord::start(&[]).await;
    let mut checked = 0;
    for (method, path) in ROUTES {
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        for query in QUERIES {
            for body in BODIES {
                let resp = c
                    .http
                    .request(method.clone(), c.url(&format!("{path}{query}")))
                    .header("content-type", "application/json")
                    .body(*body)
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                let text = resp.text().await.unwrap();
                assert!(
                    status < 500,
                    "{method} {path}{query} {body:?} -> {status} {text}"
                );
                if status >= 400 && status != 404 {
                    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|_| {
                        panic!("{method} {path}{query} {body:?}: non-JSON error {text:?}")
                    });
                    assert!(
                        v.get("detail").is_some() || v.get("error").is_some(),
                        "{text}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, ROUTES.len() * QUERIES.len() * BODIES.len());
    // A full chunk with an absurd world size must be refused, not expanded.
    let tokens: Vec<u32> = (0..256).collect();
    for (method, path) in [
        (Method::POST, "/cache/pins"),
        (Method::POST, "/directory/lookup"),
    ] {
        let body = serde_json::json!({"model_name": "m", "world_size": 99_999_999_999_999u64, "token_ids": tokens});
        let (status, resp) = c.call(method, path, Some(body)).await;
        assert_eq!(status, 400, "{path}: {resp}");
    }
    // Still healthy and consistent afterwards.
    assert_eq!(c.get("/healthz").await.0, 200);
    assert_eq!(c.get("/directory/stats").await.1["num_keys"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_flood_stays_within_the_directory_bound() {
    use common::{batch, key};
    let c = Coord::start(&["--max-directory-keys", "100"]).await;
    // 10 batches of 50 distinct keys from one emitter: 500 keys offered.
    for seq in 1..=10u64 {
        let entries: Vec<(serde_json::Value, u64)> = (0..50)
            .map(|i| (key(&format!("{:064x}", seq * 1000 + i), ""), 10))
            .collect();
        let applied = c
            .events(vec![batch("mp-a", 1, seq, "store", "l1", "dram", &entries)])
            .await;
        assert_eq!(applied["applied"], 1, "{applied}");
    }
    let (_, stats) = c.get("/directory/stats").await;
    assert_eq!(stats["num_keys"], 100, "{stats}");
    let metrics = c.metrics_text().await;
    assert!(
        metrics.contains("lmcache_coordinator_key_directory_keys_dropped 400"),
        "{metrics}"
    );
    assert!(
        metrics.contains("lmcache_coordinator_key_directory_max_keys 100"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_after_the_keep_alive_timeout() {
    use tokio::io::AsyncReadExt as _;
    let c = Coord::start(&["--timeout-keep-alive", "1"]).await;
    // A client that connects and never sends a request.
    let mut silent = tokio::net::TcpStream::connect(c.addr).await.unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(std::time::Duration::from_secs(15), silent.read(&mut buf))
        .await
        .expect("the silent connection was still open after 15 s");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(started.elapsed() >= std::time::Duration::from_millis(900));
    // Requests keep being answered, and the closure was counted.
    let (status, _) = c.get("/directory/stats").await;
    assert_eq!(status, 200);
    let metrics = c.metrics_text().await;
    assert!(
        metrics.lines().any(|l| l
            .starts_with("lmcache_coordinator_idle_connections_closed_total ")
            && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// Paths are routed as Starlette decodes them (`%71uota` is `quota`), and
/// the operator guard sees the decoded route: an encoded operator path is
/// refused without the token and served with it, never let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn percent_encoded_operator_paths_stay_guarded() {
    let c = Coord::start(&["--api-static-token", "s3cret"]).await;
    let body = serde_json::json!({"limit_gb": 1, "model_name": "m", "world_size": 1});
    for (method, path) in [
        (Method::PUT, "/%71uota/t1"),
        (Method::PUT, "/quota/%74%31"),
        (Method::POST, "/cache/%70ins"),
    ] {
        let (status, resp) = c.call(method.clone(), path, Some(body.clone())).await;
        assert_eq!(status, 401, "{method} {path}: {resp}");
    }
    let resp = c
        .http
        .put(c.url("/%71uota/t%31"))
        .bearer_auth("s3cret")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(c.get("/quota/t1").await.1["quota_limit_gb"], 1.0);
}
