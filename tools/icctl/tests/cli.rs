//! `icctl` against the real index server and coordinator binaries on
//! loopback: every command's table and JSON, and errors that say what to do.

#![allow(clippy::unwrap_used)]

use std::process::Command;

mod common;

use common::start;
use ic_coordinator_core::trace::{Header, TraceWriter};
use serde_json::{Value, json};

const TOKENS: &str =
    "0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31";

#[test]
fn index_commands() {
    let f = start();
    // Fingerprints are the published vectors.
    let fp = f.json(&["fingerprint", "--tokens", TOKENS, "--block-size", "16"]);
    assert_eq!(
        fp["fingerprintsHex"],
        json!(["0x5d85718ec594b982", "0x3905bfb5eeeaaa81"])
    );
    assert!(
        f.ok(&["fingerprint", "--tokens", "1 2 3 4 5", "--block-size", "4"])
            .contains("1 trailing tokens ignored")
    );

    // Nothing indexed yet: a NO_HINT that says why, in both forms.
    let args = [
        "lookup", "--tenant", "demo", "--model", "m", "--tokens", TOKENS,
    ];
    let text = f.ok(&args);
    assert!(text.starts_with("NO_HINT (UNKNOWN_MODEL)"), "{text}");
    let mut json_args = args.to_vec();
    json_args.extend(["-o", "json"]);
    let v: Value = serde_json::from_str(&f.ok(&json_args)).unwrap();
    assert_eq!(v["outcome"], "NO_HINT");
    assert_eq!(v["promptBlocks"], 2);
    let hashes = f.json(&[
        "lookup",
        "--tenant",
        "demo",
        "--model",
        "m",
        "--block-hashes",
        "0x5d85718ec594b982",
    ]);
    assert_eq!(hashes["promptBlocks"], 1);
    // The server's refusal comes through with the field it names.
    let (ok, _, err) = f.icctl(&[
        "lookup",
        "--tenant",
        "Bad_Tenant",
        "--model",
        "m",
        "--tokens",
        "1",
    ]);
    assert!(!ok);
    assert!(err.contains("scope.tenant"), "{err}");
    let (ok, _, err) = f.icctl(&[
        "lookup", "--tenant", "demo", "--model", "m", "--text", "hello",
    ]);
    assert!(!ok);
    assert!(err.contains("--tokenizer m="), "{err}");

    let snapshot = f.ok(&["snapshot"]);
    assert!(
        snapshot.starts_with("0 entries over 0 replicas"),
        "{snapshot}"
    );
    assert_eq!(f.json(&["snapshot"])["replicas"], json!([]));
}

#[test]
fn coordinator_commands() {
    let f = start();
    assert_eq!(f.json(&["instances"])["instances"], json!([]));
    assert!(f.ok(&["instances"]).starts_with("INSTANCE"));

    // Quotas: set, read back, list, remove.
    assert_eq!(f.json(&["quota", "set", "team-a", "2"])["status"], "ok");
    let got = f.json(&["quota", "get", "team-a"]);
    assert_eq!(got["quota_exists"], true);
    assert_eq!(got["quota_limit_gb"], 2.0);
    assert!(f.ok(&["quota", "ls"]).contains("team-a"));
    assert_eq!(f.json(&["quota", "rm", "team-a"])["status"], "removed");

    // Pins: 512 tokens are two 256-token chunks.
    let tokens: Vec<String> = (0..512).map(|i| i.to_string()).collect();
    let tokens = tokens.join(",");
    let pinned = f.json(&["pins", "add", "--model", "m", "--tokens", &tokens]);
    assert_eq!(pinned["status"], "pinned");
    assert_eq!(pinned["requested"], 2);
    let listed = f.json(&["pins", "ls"]);
    assert_eq!(listed["total"], 2);
    assert!(f.ok(&["pins", "ls"]).contains("2 pinned keys"));
    assert_eq!(
        f.json(&["pins", "rm", "--model", "m", "--tokens", &tokens])["status"],
        "unpinned"
    );
    assert_eq!(f.json(&["pins", "ls"])["total"], 0);

    // Actions on an unknown instance fail with the coordinator's reason.
    let (ok, _, err) = f.icctl(&[
        "delete",
        "--instance",
        "mp-x",
        "--model",
        "m",
        "--tokens",
        &tokens,
    ]);
    assert!(!ok);
    assert!(err.contains("HTTP 404") && err.contains("mp-x"), "{err}");
    let (ok, _, err) = f.icctl(&[
        "prefetch",
        "submit",
        "--instance",
        "mp-x",
        "--model",
        "m",
        "--tokens",
        &tokens,
    ]);
    assert!(!ok);
    assert!(err.contains("HTTP 404") && err.contains("mp-x"), "{err}");
    let (ok, _, err) = f.icctl(&["prefetch", "status", "--instance", "mp-x", "req-1"]);
    assert!(!ok);
    assert!(err.contains("HTTP 404"), "{err}");

    // Replay a small trace: one registration and two batches.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.lct");
    let batch = |seq: i64| {
        serde_json::from_value(json!({
            "instance_id": "mp-a", "incarnation": 1, "seq": seq, "event_type": "store", "tier": "l2",
            "backend": "fs", "entries": [{"key": {"chunk_hash_hex": format!("{seq:02x}"), "model_name": "m",
                                                  "kv_rank": 16777472}, "size_bytes": 1024}]}))
        .unwrap()
    };
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    let registration = json!({"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 9});
    let serde_json::Value::Object(registration) = registration else {
        unreachable!()
    };
    w.lifecycle(0.0, 1.0, "register", registration).unwrap();
    w.batch(0.0, 1.0, &batch(1)).unwrap();
    w.batch(0.0, 1.0, &batch(2)).unwrap();
    let out = w.finish().unwrap();
    std::fs::write(&path, out).unwrap();
    let report = f.json(&["replay", path.to_str().unwrap(), "--speed", "0"]);
    assert_eq!(report["applied"], 2, "{report}");
    let instances = f.json(&["instances"]);
    assert_eq!(instances["instances"][0]["instance_id"], "mp-a");
    let usage = f.ok(&["usage"]);
    assert!(usage.contains("mp-a"), "{usage}");
    assert!(f.ok(&["usage", "mp-a"]).contains("l2"));
}

#[test]
fn unreachable_servers_say_what_to_set() {
    let port = ic_e2e::free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_icctl"))
        .args([
            "--coordinator",
            &format!("http://127.0.0.1:{port}"),
            "instances",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("IC_COORDINATOR"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_icctl"))
        .args(["--index-http", &format!("127.0.0.1:{port}"), "snapshot"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("IC_INDEX_HTTP"), "{err}");
}

#[test]
fn a_token_file_opens_an_access_controlled_index_server() {
    let f = common::start_with(&["--api-static-token", "s3cret"]);
    let lookup = [
        "lookup", "--tenant", "demo", "--model", "m", "--tokens", TOKENS,
    ];
    let (ok, _, err) = f.icctl(&lookup);
    assert!(!ok);
    assert!(err.contains("Unauthenticated"), "{err}");
    let (ok, _, err) = f.icctl(&["snapshot"]);
    assert!(!ok);
    assert!(err.contains("401"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let token = token.to_str().unwrap();
    let mut with = vec!["--token-file", token];
    with.extend(lookup);
    assert!(f.ok(&with).starts_with("NO_HINT"));
    assert!(
        f.ok(&["--token-file", token, "snapshot"])
            .starts_with("0 entries")
    );
    // `helm test` runs `check` with no token: a refusal is the server
    // answering, and says access control is on.
    let rows = f.json(&["check"]);
    let lookup = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["check"] == "index server LookupRoute")
        .unwrap();
    assert_eq!(lookup["ok"], true, "{rows}");
    assert!(
        lookup["detail"]
            .as_str()
            .unwrap()
            .contains("access control is on"),
        "{rows}"
    );
}
