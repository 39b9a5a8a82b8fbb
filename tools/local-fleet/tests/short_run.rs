//! A short end-to-end run of the main job on its synthetic chat workload:
//! real services, simulated engines over ZMQ, LookupRoute routing. At the end every engine's true cache and
//! the index agree exactly, and cache-aware routing beats random routing.

#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn a_short_trace_replay_converges_and_beats_random_routing() {
    let index_server = ic_e2e::workspace_binary("ic-index-server");
    let bin_dir = index_server.parent().unwrap();
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/data/traces/mooncake_synthetic_trace.jsonl"
    );
    assert!(
        std::path::Path::new(trace).exists(),
        "the workload trace must sit beside the repository at {trace}"
    );
    let dir = tempfile::tempdir().unwrap();
    let report_path = dir.path().join("run.md");
    let out = Command::new(env!("CARGO_BIN_EXE_ic-local-fleet"))
        .arg("--report")
        .arg(&report_path)
        .args([
            "--requests",
            "400",
            "--engines",
            "4",
            "--capacity-blocks",
            "600",
            "--speed",
            "400",
            // The default is the map encoding; cover the other one here.
            "--era",
            "array",
            "--json",
        ])
        .args(["--trace", trace])
        .arg("--bin-dir")
        .arg(bin_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "local fleet failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["index_agrees_with_engines"], true, "{report}");
    assert_eq!(report["requests"], 400);
    // The index's memory gauge is scraped: every part is counted.
    let memory = report["index_memory_bytes"].as_f64().unwrap();
    assert!(memory > 0.0, "{report}");
    let ratio = |name: &str| {
        let p = report["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["policy"].as_str().unwrap().starts_with(name))
            .unwrap();
        p["hit_blocks"].as_f64().unwrap() / p["prompt_blocks"].as_f64().unwrap()
    };
    assert!(ratio("lookup-route") > ratio("random"), "{report}");
    assert!(ratio("lookup-route") <= ratio("oracle") + 1e-9, "{report}");
    // The report page and its chart, one line per policy.
    let md = std::fs::read_to_string(&report_path).unwrap();
    assert!(md.contains("| lookup-route (default) | 400 |"), "{md}");
    assert!(
        md.contains("![hit ratio and TTFT per routing policy](run.svg)"),
        "{md}"
    );
    let svg = std::fs::read_to_string(dir.path().join("run.svg")).unwrap();
    // Seven routed variants and six in-process policies (round-robin,
    // random, the two exact longest-prefix references, the exact TTFT
    // reference and the oracle), two TTFT bars each.
    assert_eq!(svg.matches("<polyline").count(), 26, "{svg}");
}

/// The shared-prefix chat workload, short: prefix-only routing piles the
/// conversations onto few engines (every request shares the first block);
/// the default scoring (by predicted TTFT at the server's default rate,
/// about half these engines' on this run's clock) and the
/// weights both stay near the exact load-bounded reference and ahead of
/// round-robin in hit ratio and TTFT.
#[test]
fn on_shared_prefix_chat_load_aware_routing_beats_prefix_only() {
    let index_server = ic_e2e::workspace_binary("ic-index-server");
    let bin_dir = index_server.parent().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ic-local-fleet"))
        .arg("--report")
        .arg(dir.path().join("run.md"))
        .args([
            "--workload",
            "shared-prefix-chat",
            "--requests",
            "3000",
            "--engines",
            "4",
            "--capacity-blocks",
            "1000",
            "--speed",
            "200",
            "--json",
        ])
        .arg("--bin-dir")
        .arg(bin_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "local fleet failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["index_agrees_with_engines"], true, "{report}");
    let policy = |name: &str| {
        report["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["policy"].as_str().unwrap() == name)
            .unwrap_or_else(|| panic!("no policy {name}: {report}"))
            .clone()
    };
    let ratio = |p: &serde_json::Value| {
        p["hit_blocks"].as_f64().unwrap() / p["prompt_blocks"].as_f64().unwrap()
    };
    let default = policy("lookup-route (default)");
    let weights = policy("lookup-route, by the weights");
    let prefix_only = policy("lookup-route, prefix only");
    let reference = policy("longest prefix (exact, 1.25x bound)");
    let rr = policy("round-robin");
    let epp = policy("endpoint picker (default)");
    assert!(ratio(&epp) > ratio(&prefix_only), "{report}");
    assert!(ratio(&epp) >= 0.9 * ratio(&reference), "{report}");
    assert!(ratio(&default) > ratio(&prefix_only), "{report}");
    assert!(ratio(&default) > ratio(&rr), "{report}");
    assert!(ratio(&default) >= 0.9 * ratio(&reference), "{report}");
    assert!(ratio(&weights) >= 0.9 * ratio(&reference), "{report}");
    assert!(
        default["ttft_p99_ms"].as_f64().unwrap() < prefix_only["ttft_p99_ms"].as_f64().unwrap(),
        "{report}"
    );
}

/// `--otlp-endpoint` reaches every service the fleet starts: the index
/// server's LookupRoute spans, the subscribers' batch spans and the
/// coordinator's metrics arrive at a real OTLP/gRPC receiver.
#[test]
fn every_service_of_the_fleet_exports_to_the_collector() {
    let receiver = ic_e2e::otlp::Receiver::start();
    let index_server = ic_e2e::workspace_binary("ic-index-server");
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ic-local-fleet"))
        .arg("--report")
        .arg(dir.path().join("run.md"))
        .args([
            "--workload",
            "chat",
            "--requests",
            "60",
            "--engines",
            "2",
            "--compare-scoring",
            "false",
            "--speed",
            "400",
            "--json",
            "--otlp-endpoint",
            &receiver.endpoint(),
        ])
        .arg("--bin-dir")
        .arg(index_server.parent().unwrap())
        .env("IC_OTLP_EXPORT_INTERVAL_SECONDS", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "local fleet failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let timeout = std::time::Duration::from_secs(20);
    receiver.wait_for("a LookupRoute span", timeout, |r| {
        r["signal"] == "span" && r["service"] == "ic-index-server" && r["name"] == "LookupRoute"
    });
    receiver.wait_for("a subscriber batch span", timeout, |r| {
        r["signal"] == "span"
            && r["service"] == "ic-kvevent-subscriber"
            && r["name"] == "forward_batch"
    });
    receiver.wait_for("a coordinator metric", timeout, |r| {
        r["signal"] == "metric" && r["service"] == "ic-coordinator"
    });
}
