//! Three index-server replicas behind the fleet's gateways (issue 38, item
//! 3): every subscriber streams to all of them, the gateways ask them in
//! turn, and once caught up they answer alike — the same `/snapshot` block
//! counts on each, the same holders for the same prompt, and the same
//! `best` where the prefix alone decides.

#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn three_index_replicas_converge_and_answer_alike() {
    let index_server = ic_e2e::workspace_binary("ic-index-server");
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ic-local-fleet"))
        .arg("--report")
        .arg(dir.path().join("run.md"))
        .args([
            "--workload",
            "chat",
            "--requests",
            "400",
            "--engines",
            "4",
            "--capacity-blocks",
            "300",
            "--index-replicas",
            "3",
            "--speed",
            "400",
            "--json",
        ])
        .arg("--bin-dir")
        .arg(index_server.parent().unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "local fleet failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["index_replicas"], 3, "{report}");
    assert_eq!(report["index_agrees_with_engines"], true, "{report}");
    let checks = report["replicas_alike"].as_array().unwrap();
    // One check per routed variant, the endpoint picker's included.
    assert_eq!(checks.len(), 7, "{report}");
    for check in checks {
        assert_eq!(check["replicas"], 3, "{check}");
        assert_eq!(check["snapshots_identical"], true, "{check}");
        assert_eq!(check["holders_differ"], 0, "{check}");
        assert_eq!(check["best_differ"], 0, "{check}");
        // The probes found cached prompts: the comparison compared something.
        assert!(check["probes_matched"].as_u64().unwrap() > 0, "{check}");
    }
    let prefix_only = checks
        .iter()
        .find(|c| c["variant"] == "lookup-route, prefix only")
        .unwrap();
    assert!(
        prefix_only["best_checked"].as_u64().unwrap() > 0,
        "no prompt had one longest holder to compare `best` on: {prefix_only}"
    );
    // Spread over three replicas, routing still beats random routing.
    let ratio = |name: &str| {
        let p = report["policies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["policy"] == name)
            .unwrap_or_else(|| panic!("no policy {name}: {report}"));
        p["hit_blocks"].as_f64().unwrap() / p["prompt_blocks"].as_f64().unwrap()
    };
    assert!(
        ratio("lookup-route (default)") > ratio("random"),
        "{report}"
    );
    assert!(
        ratio("endpoint picker (default)") > ratio("random"),
        "{report}"
    );
}
