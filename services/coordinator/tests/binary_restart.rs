//! The real binary: stop with SIGTERM, restart on the same files, and the
//! views come back equal.
#![allow(clippy::unwrap_used)]

use ic_e2e::ServiceProcess;
use serde_json::{Value, json};

fn start(ckpt: &str, meta: &str) -> (ServiceProcess, String) {
    let mut p = ServiceProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator")),
        &[
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--checkpoint-path",
            ckpt,
            "--metadata-path",
            meta,
        ],
    );
    let addr = p.admin_addr();
    (p, format!("http://{addr}"))
}

async fn get(http: &reqwest::Client, base: &str, path: &str) -> Value {
    http.get(format!("{base}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_checkpoints_and_restart_restores() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("coord.ckpt");
    let meta = dir.path().join("meta.json");
    let (ckpt, meta) = (ckpt.to_str().unwrap(), meta.to_str().unwrap());
    let http = reqwest::Client::new();

    let (mut p, base) = tokio::task::block_in_place(|| start(ckpt, meta));
    let entries: Vec<Value> = (0..50)
        .map(|i| json!({"key": {"chunk_hash_hex": format!("{i:064x}"), "model_name": "m", "kv_rank": 16777472}, "size_bytes": 1000 + i}))
        .collect();
    let body = json!({"batches": [{"instance_id": "mp-a", "incarnation": 1, "seq": 1, "event_type": "store",
                                   "tier": "l2", "backend": "fs", "entries": entries}]});
    let resp: Value = http
        .post(format!("{base}/events"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(resp["applied"], 1);
    http.put(format!("{base}/quota/t"))
        .json(&json!({"limit_gb": 3}))
        .send()
        .await
        .unwrap();
    let stats = get(&http, &base, "/directory/stats").await;
    let keys = get(&http, &base, "/directory/keys").await;
    assert_eq!(stats["num_keys"], 50);
    let status = tokio::task::block_in_place(|| p.stop());
    assert!(status.success(), "{status:?}");

    let (_p2, base) = tokio::task::block_in_place(|| start(ckpt, meta));
    assert_eq!(get(&http, &base, "/directory/stats").await, stats);
    assert_eq!(get(&http, &base, "/directory/keys").await, keys);
    assert_eq!(get(&http, &base, "/quota/t").await["quota_limit_gb"], 3.0);
}
