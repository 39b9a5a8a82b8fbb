//! A short run against the real index server binary: every phase completes
//! requests without errors and preloaded prompts are hits.

#![allow(clippy::unwrap_used)]

use std::process::Command;

/// Runs `ic-loadgen --json` against the workspace's index server binary
/// with `args`; returns its report.
fn index_loadgen(args: &[&str]) -> serde_json::Value {
    let bin_dir = ic_e2e::workspace_binary("ic-index-server");
    let out = Command::new(env!("CARGO_BIN_EXE_ic-loadgen"))
        .args([
            "--bin-dir",
            bin_dir.parent().unwrap().to_str().unwrap(),
            "--json",
        ])
        .args(args)
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
fn short_run_reports_every_phase() {
    let report = index_loadgen(&[
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
    ]);
    assert_eq!(report["preload_events"], 20000);
    for phase in ["empty_rpc", "lookup_route"] {
        assert!(report[phase]["requests"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(report[phase]["errors"], 0, "{report}");
    }
    assert_eq!(report["lookup_hit_ratio"], 1.0, "{report}");
}

#[test]
fn open_loop_runs_offer_no_more_than_the_rate() {
    let report = index_loadgen(&[
        "--replicas",
        "4",
        "--entries",
        "2000",
        "--prompt-blocks",
        "16",
        "--concurrency",
        "8",
        "--connections",
        "1",
        "--rate",
        "200",
        "--duration-secs",
        "1",
        "--warmup-secs",
        "0.2",
    ]);
    assert_eq!(report["rate"], 200.0, "{report}");
    for phase in ["empty_rpc", "lookup_route"] {
        // The measured second holds 200 scheduled slots; a closed loop
        // would complete thousands.
        let requests = report[phase]["requests"].as_u64().unwrap();
        assert!((1..=201).contains(&requests), "{phase}: {report}");
        assert_eq!(report[phase]["errors"], 0, "{report}");
    }
}

#[test]
fn coordinator_short_run_ingests_and_finds_every_key() {
    let bin_dir = ic_e2e::workspace_binary("ic-coordinator");
    let out = Command::new(env!("CARGO_BIN_EXE_ic-coordinator-loadgen"))
        .args([
            "--bin-dir",
            bin_dir.parent().unwrap().to_str().unwrap(),
            "--instances",
            "3",
            "--entries-per-batch",
            "8",
            "--concurrency",
            "2",
            "--duration-secs",
            "0.5",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for phase in ["ingest", "lookup"] {
        assert!(report[phase]["requests"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(report[phase]["errors"], 0, "{report}");
    }
    assert_eq!(report["lookup_hit_ratio"], 1.0, "{report}");
}
