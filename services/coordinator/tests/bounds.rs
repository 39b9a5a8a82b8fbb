//! Issue 42's coordinator bounds, against the real binary: memory bounded
//! by `--max-directory-keys` everywhere (directory, usage, LRU), empty
//! credentials refused at start, what one event entry may claim, and
//! optional authentication on `/events`.
#![allow(clippy::unwrap_used)]

use ic_e2e::ServiceProcess;
use serde_json::{Value, json};

fn start(args: &[&str]) -> (ServiceProcess, String) {
    let mut all = vec!["--host", "127.0.0.1", "--port", "0"];
    all.extend(args);
    let mut p = ServiceProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator")),
        &all,
    );
    let addr = p.admin_addr();
    (p, format!("http://{addr}"))
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn store(instance: &str, seq: u64, first: u64, n: u64, size: u64) -> Value {
    let entries: Vec<Value> = (first..first + n)
        .map(|i| json!({"key": {"chunk_hash_hex": format!("{i:064x}"), "model_name": "m", "kv_rank": 16777216},
                        "size_bytes": size}))
        .collect();
    json!({"batches": [{"instance_id": instance, "incarnation": 1, "seq": seq, "event_type": "store",
                        "tier": "l2", "backend": "fs", "entries": entries}]})
}

async fn post(
    http: &reqwest::Client,
    url: &str,
    body: &Value,
    token: Option<&str>,
) -> (u16, Value) {
    let mut req = http.post(url).json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn get(http: &reqwest::Client, url: &str) -> Value {
    http.get(url)
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A flood of ten times the bound: once the bound is reached the usage view
/// and the eviction LRU hold exactly the directory's keys, and RSS stays
/// flat (before the fix they kept every dropped key: ~0.5 KB each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_ten_times_the_bound_keeps_memory_flat() {
    const BOUND: u64 = 20_000;
    const BATCH: u64 = 1_000;
    let bound = BOUND.to_string();
    let (p, base) = tokio::task::block_in_place(|| {
        start(&[
            "--max-directory-keys",
            &bound,
            "--health-check-interval",
            "0",
            "--eviction-check-interval",
            "0",
        ])
    });
    let http = reqwest::Client::new();
    let url = format!("{base}/events");
    let mut rss_at_bound = 0;
    let total = 10 * BOUND;
    for (seq, first) in (0..total)
        .step_by(usize::try_from(BATCH).unwrap())
        .enumerate()
    {
        let (status, resp) = post(
            &http,
            &url,
            &store("mp-a", seq as u64 + 1, first, BATCH, 1000),
            None,
        )
        .await;
        assert_eq!((status, &resp["applied"]), (200, &json!(1)), "{resp}");
        // The maps reach their steady size a few bounds in (measured: flat
        // within ~1 MiB from 4x to 30x); the leak grew ~0.5 KB per key.
        if first + BATCH == 5 * BOUND {
            rss_at_bound = rss_kib(p.pid());
        }
    }
    let rss_end = rss_kib(p.pid());
    let stats = get(&http, &format!("{base}/directory/stats")).await;
    assert_eq!(stats["num_keys"], BOUND);
    assert_eq!(stats["l2_size_bytes"], BOUND * 1000);
    // Usage holds only the directory's keys (was: every key ever stored).
    let usage = get(&http, &format!("{base}/instances/mp-a/usage")).await;
    assert_eq!(usage["modules"][0]["used_bytes"], BOUND * 1000, "{usage}");
    // So does the eviction LRU.
    let status = get(&http, &format!("{base}/status")).await;
    let tracked = status.to_string();
    assert!(
        tracked.contains(&format!("\"tracked_keys\":{BOUND}")),
        "LRU must track exactly the bound: {tracked}"
    );
    let growth = rss_end.saturating_sub(rss_at_bound);
    // 16 MiB of slack for the allocator: a thread's heap takes memory in
    // segments of megabytes, and which runtime threads handle the flood
    // varies with the machine's load (8,196 KiB once in a loaded `.ci/run`
    // on 2026-12-06, with no coordinator change; at most 8 MiB alone). The
    // leak this guards against was ~50 MB over these 100,000 keys.
    assert!(
        growth < 16 * 1024,
        "RSS grew {growth} KiB from {rss_at_bound} KiB after the bound was reached"
    );
}

#[test]
fn empty_credentials_refuse_to_start() {
    let bin = env!("CARGO_BIN_EXE_ic-coordinator");
    let run = |args: &[&str], env: &[(&str, &str)]| {
        let out = std::process::Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (args, env, flag) in [
        (
            &["--api-static-token", ""][..],
            &[][..],
            "--api-static-token",
        ),
        (&["--api-audience", " "][..], &[][..], "--api-audience"),
        (
            &[][..],
            &[("IC_API_STATIC_TOKEN", "")][..],
            "--api-static-token",
        ),
        (&[][..], &[("IC_API_AUDIENCE", "")][..], "--api-audience"),
        (
            &["--events-require-auth"][..],
            &[][..],
            "--events-require-auth",
        ),
    ] {
        let (ok, err) = run(args, env);
        assert!(!ok, "{args:?} {env:?} started");
        assert!(err.contains(flag), "{args:?} {env:?}: {err}");
    }
}

/// One entry may not claim more than `--max-event-entry-bytes`, nor more
/// than the capacity its instance declared for the compartment: an open
/// `/events` cannot inflate a tenant past its quota with a few huge claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_entries_cannot_claim_more_than_the_bounds() {
    let (_p, base) = tokio::task::block_in_place(|| start(&["--max-event-entry-bytes", "1000000"]));
    let http = reqwest::Client::new();
    let url = format!("{base}/events");
    let (status, body) = post(&http, &url, &store("mp-a", 1, 0, 2, 2_000_000), None).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["body", "batches", 0, "entries", 0])
    );
    let config = json!({"batches": [{"instance_id": "mp-a", "incarnation": 1, "seq": 1, "event_type": "config",
        "tier": "l2", "backend": "fs", "capacity_bytes": 5000, "capacity_revision": 1}]});
    assert_eq!(post(&http, &url, &config, None).await.0, 200);
    let (status, body) = post(&http, &url, &store("mp-a", 2, 0, 2, 6000), None).await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body["detail"][0]["msg"]
            .as_str()
            .unwrap()
            .contains("capacity 5000"),
        "{body}"
    );
    let (status, body) = post(&http, &url, &store("mp-a", 2, 0, 2, 4000), None).await;
    assert_eq!((status, &body["applied"]), (200, &json!(1)), "{body}");
    let stats = get(&http, &format!("{base}/directory/stats")).await;
    assert_eq!(stats["l2_size_bytes"], 8000);
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for reason in ["over_max_entry_bytes", "over_declared_capacity"] {
        assert!(
            metrics.contains(&format!(
                "lmcache_coordinator_event_entries_refused_total{{reason=\"{reason}\"}} 1"
            )),
            "{reason}:\n{metrics}"
        );
    }
}

/// A request that declares a capacity and stores in one body is checked as
/// it applies: each store against the declaration the batches before it
/// leave, as when they come in separate requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capacity_declared_earlier_in_the_request_bounds_its_stores() {
    let (_p, base) = tokio::task::block_in_place(|| start(&[]));
    let http = reqwest::Client::new();
    let url = format!("{base}/events");
    let config = |seq: u64, revision: u64, capacity: u64| {
        json!({"instance_id": "mp-a", "incarnation": 1, "seq": seq, "event_type": "config",
            "tier": "l2", "backend": "fs", "capacity_bytes": capacity, "capacity_revision": revision})
    };
    let stored = |seq: u64, size: u64| store("mp-a", seq, seq, 1, size)["batches"][0].clone();
    let (status, body) = post(
        &http,
        &url,
        &json!({"batches": [config(1, 1, 100), stored(2, 1000)]}),
        None,
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(
        body["detail"][0]["loc"],
        json!(["body", "batches", 1, "entries", 0])
    );
    // Nothing of the refused request applied: the capacity is undeclared,
    // and a request raising it before storing is taken.
    let (status, body) = post(
        &http,
        &url,
        &json!({"batches": [config(1, 1, 100), config(2, 2, 5000), stored(3, 1000)]}),
        None,
    )
    .await;
    assert_eq!((status, &body["applied"]), (200, &json!(3)), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_can_require_authentication() {
    let (_p, base) = tokio::task::block_in_place(|| {
        start(&["--events-require-auth", "--api-static-token", "s3cret"])
    });
    let http = reqwest::Client::new();
    let url = format!("{base}/events");
    let body = store("mp-a", 1, 0, 1, 10);
    assert_eq!(post(&http, &url, &body, None).await.0, 401);
    assert_eq!(post(&http, &url, &body, Some("wrong")).await.0, 401);
    let (status, resp) = post(&http, &url, &body, Some("s3cret")).await;
    assert_eq!((status, &resp["applied"]), (200, &json!(1)));
    // Off by default: LMCache's MP servers send no credentials.
    let (_p2, open) = tokio::task::block_in_place(|| start(&["--api-static-token", "s3cret"]));
    assert_eq!(
        post(&http, &format!("{open}/events"), &body, None).await.0,
        200
    );
}
