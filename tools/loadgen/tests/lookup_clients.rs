//! Both LookupRoute clients against the real index server binary: the lean
//! one (bodies encoded ahead, answers read for outcome and best) and the
//! full one (the generated client) see every preloaded prompt as a hit.

#![allow(clippy::unwrap_used)]

use std::process::Command;

use ic_e2e::ServiceProcess;
use ic_proto::index_v1 as pb;

/// The loadgen's tenant (its `TENANT`).
const TENANT: &str = "loadgen";

/// The real index server, started here rather than by the loadgen so the
/// test can give its tenant a policy under which every held prompt is a
/// hit whatever the machine's load: a lookup budget no loaded machine runs
/// past (the default 20 ms counts from arrival; a debug server on busy
/// cores overran it: NO_HINT, LOOKUP_TIMEOUT) and no load bound (picks in
/// flight pile up on a slow machine until every holder is past the
/// default bound: NO_HINT, LOAD_BOUND). Every hit is then decided by the
/// index alone.
fn server() -> (ServiceProcess, String) {
    let bin = ic_e2e::workspace_binary("ic-index-server");
    let mut p = ServiceProcess::start(
        &bin,
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--capacity-entries",
            "1000000",
        ],
    );
    let addr = p.addr("grpc").to_string();
    let url = format!("http://{addr}");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            pb::index_service_client::IndexServiceClient::connect(url)
                .await
                .unwrap()
                .set_policies(pb::SetPoliciesRequest {
                    policies: vec![pb::NamespacePolicy {
                        namespace: TENANT.into(),
                        lookup_timeout_ms: 10_000,
                        allow_tier2_matches: true,
                        load_bound: Some(0.0),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .await
                .unwrap();
        });
    (p, addr)
}

fn run(client: &str) -> serde_json::Value {
    run_with(client, &[])
}

fn run_with(client: &str, extra: &[&str]) -> serde_json::Value {
    let (mut server, target) = server();
    let out = Command::new(env!("CARGO_BIN_EXE_ic-loadgen"))
        .args([
            "--target",
            &target,
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
        .args(extra)
        .output()
        .unwrap();
    server.stop();
    assert!(
        out.status.success(),
        "{}\nstderr:\n{}\nstdout:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
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
        // is held and no lookup runs out of budget: every answer is a hit.
        assert_eq!(report["lookup_hit_ratio"], 1.0, "{report}");
    }
    // 16 replicas in 4 groups, 1,250 blocks each: 2 families per group.
    assert_eq!(run("lean")["lookup_bodies_pooled"], 8);
    assert!(run("full")["lookup_bodies_pooled"].is_null());
}

#[test]
fn the_open_loops_own_client_reads_both_kinds_of_answer() {
    // `--open-loop-client direct` (the open loop's default) sends the same
    // requests on hyper's HTTP/2 client and reads the answers itself: the
    // lean reading (outcome and best) and the full one see every prompt
    // as a hit, as through tonic.
    for client in ["lean", "full"] {
        let report = run_with(client, &["--rate", "400", "--open-loop-client", "direct"]);
        assert_eq!(report["open_loop"]["client"], "direct", "{report}");
        let scheduled = report["open_loop"]["lookup_route"]["scheduled"].as_u64();
        assert!(scheduled.is_some_and(|n| n > 0), "{report}");
        assert_eq!(
            report["lookup_route"]["requests"].as_u64(),
            scheduled,
            "{report}"
        );
        assert_eq!(report["lookup_route"]["errors"], 0, "{report}");
        assert_eq!(report["empty_rpc"]["errors"], 0, "{report}");
        assert_eq!(report["lookup_hit_ratio"], 1.0, "{report}");
    }
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
