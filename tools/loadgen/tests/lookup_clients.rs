//! Both LookupRoute clients against the real index server binary: the lean
//! one (bodies encoded ahead, answers read for outcome and best) and the
//! full one (the generated client) see every preloaded prompt as a hit.

#![allow(clippy::unwrap_used)]

use std::process::Command;

fn run(client: &str) -> serde_json::Value {
    let bin_dir = ic_e2e::workspace_binary("ic-index-server");
    let out = Command::new(env!("CARGO_BIN_EXE_ic-loadgen"))
        .args([
            "--bin-dir",
            bin_dir.parent().unwrap().to_str().unwrap(),
            "--json",
            "--replicas",
            "16",
            "--entries",
            "20000",
            "--prompt-blocks",
            "32",
            "--concurrency",
            "4",
            "--connections",
            "2",
            "--duration-secs",
            "0.5",
            "--warmup-secs",
            "0.1",
            "--lookup-client",
            client,
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn lean_and_full_clients_both_get_routed_answers() {
    for client in ["lean", "full"] {
        let report = run(client);
        assert_eq!(report["lookup_client"], client, "{report}");
        assert!(
            report["lookup_route"]["requests"].as_u64().unwrap() > 0,
            "{report}"
        );
        assert_eq!(report["lookup_route"]["errors"], 0, "{report}");
        // Lean: a hit is a prefix match naming best's address. Every prompt
        // is held, but a debug server on a loaded machine may overrun a
        // lookup's 20 ms budget (NO_HINT, LOOKUP_TIMEOUT) now and then; a
        // client that misread the answers would see no hits at all.
        let hits = report["lookup_hit_ratio"].as_f64().unwrap();
        assert!(hits >= 0.9, "{report}");
    }
    // 16 replicas in 4 groups, 1,250 blocks each: 2 families per group.
    assert_eq!(run("lean")["lookup_bodies_pooled"], 8);
    assert!(run("full")["lookup_bodies_pooled"].is_null());
}

#[test]
fn an_unknown_lookup_client_is_refused_naming_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_ic-loadgen"))
        .args(["--lookup-client", "thin"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--lookup-client"), "{err}");
}
