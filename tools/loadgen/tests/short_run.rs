//! A short run against the real index server binary: every phase completes
//! requests without errors and preloaded prompts are hits.

#![allow(clippy::unwrap_used)]

use std::process::Command;

/// Runs `ic-loadgen --json` against the workspace's index server binary
/// with `args`; returns its report.
fn index_loadgen(args: &[&str]) -> serde_json::Value {
    index_loadgen_stderr(args).0
}

/// [`index_loadgen`], with what the run printed to stderr.
fn index_loadgen_stderr(args: &[&str]) -> (serde_json::Value, String) {
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
    (
        serde_json::from_slice(&out.stdout).unwrap(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
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
        // Every prompt is held, so every answer is a prefix match, unless
        // all its holders are over the load bound at that moment (a
        // no-hint by design, and by timing: 2 of 7 runs at load 6.5).
        "--server-arg=--load-bound=0",
    ]);
    assert_eq!(report["preload_events"], 20000);
    for phase in ["empty_rpc", "lookup_route"] {
        assert!(report[phase]["requests"].as_u64().unwrap() > 0, "{report}");
        assert_eq!(report[phase]["errors"], 0, "{report}");
    }
    assert_eq!(report["lookup_hit_ratio"], 1.0, "{report}");
}

/// A short open-loop run at `rate` requests/s for 1 s (0.2 s warm-up).
fn open_loop(rate: &str, extra: &[&str]) -> serde_json::Value {
    open_loop_stderr(rate, extra).0
}

/// [`open_loop`], with what the run printed to stderr.
fn open_loop_stderr(rate: &str, extra: &[&str]) -> (serde_json::Value, String) {
    let mut args = vec![
        "--replicas",
        "4",
        "--entries",
        "2000",
        "--prompt-blocks",
        "16",
        "--concurrency",
        "8",
        "--connections",
        "2",
        "--rate",
        rate,
        "--duration-secs",
        "1",
        "--warmup-secs",
        "0.2",
    ];
    args.extend_from_slice(extra);
    index_loadgen_stderr(&args)
}

/// Every measured send due in the window completed, and the window held
/// `expect` sends within `tolerance`; the schedule's figures are there.
fn check_open_phases(report: &serde_json::Value, expect: f64, tolerance: f64) {
    for phase in ["empty_rpc", "lookup_route"] {
        let schedule = &report["open_loop"][phase];
        let scheduled = schedule["scheduled"].as_u64().unwrap();
        assert!(
            (scheduled as f64 - expect).abs() <= tolerance,
            "{phase}: {scheduled} due, {expect} ± {tolerance} expected: {report}"
        );
        // Each due send is sent (late if need be) and answered, none dropped.
        assert_eq!(
            report[phase]["requests"].as_u64().unwrap(),
            scheduled,
            "{phase}: {report}"
        );
        assert_eq!(report[phase]["errors"], 0, "{report}");
        for q in ["dispatch_lateness_us", "send_lateness_us", "from_start_us"] {
            for f in ["p50_us", "p99_us", "p999_us", "max_us"] {
                assert!(
                    schedule[q][f].as_f64().unwrap() >= 0.0,
                    "{phase}.{q}.{f}: {report}"
                );
            }
        }
        assert!(
            schedule["spin_fraction"].as_f64().unwrap() >= 0.0,
            "{report}"
        );
        assert!(report[phase]["p999_us"].as_f64().unwrap() > 0.0, "{report}");
    }
}

#[test]
fn uniform_open_loop_sends_rate_times_duration() {
    let (report, stderr) = open_loop_stderr("2000", &["--spacing", "uniform"]);
    assert_eq!(report["rate"], 2000.0, "{report}");
    assert_eq!(report["open_loop"]["spacing"], "uniform", "{report}");
    assert_eq!(report["open_loop"]["spin_us"], 10, "{report}");
    // The default spin stays under a tenth of a core: no warning.
    assert!(!stderr.contains("--spin-us"), "{stderr}");
    // Equal gaps: exactly rate x duration due in the window, but for the
    // slot on its edge.
    check_open_phases(&report, 2000.0, 1.0);
    // The server's own histogram counted this phase's lookups: the
    // measured ones and the warm-up's (2,400 due in all).
    let server = &report["server_lookup"];
    let count = server["count"].as_u64().unwrap();
    assert!((2000..=2401).contains(&count), "{report}");
    for f in ["mean_us", "p50_us", "p99_us", "p999_us"] {
        assert!(
            server[f].as_f64().unwrap() > 0.0,
            "server_lookup.{f}: {report}"
        );
    }
}

#[test]
fn poisson_open_loop_is_the_default_and_keeps_the_mean_rate() {
    let report = open_loop("2000", &["--seed", "7"]);
    assert_eq!(report["open_loop"]["spacing"], "poisson", "{report}");
    assert_eq!(report["open_loop"]["client"], "direct", "{report}");
    assert_eq!(report["open_loop"]["seed"], 7, "{report}");
    // A Poisson count over a second at 2,000/s: mean 2,000, deviation
    // about 45; five of them.
    check_open_phases(&report, 2000.0, 5.0 * 2000f64.sqrt());
}

#[test]
fn a_current_thread_client_keeps_the_schedule() {
    let report = open_loop("2000", &["--spacing", "uniform", "--client-threads", "1"]);
    assert_eq!(report["client_threads"], 1, "{report}");
    check_open_phases(&report, 2000.0, 1.0);
}

#[test]
fn both_open_loop_clients_keep_the_schedule_with_the_floor() {
    // `direct`: the schedule thread sends on connections of its own;
    // `channel`: through the runtime and tonic's channel. Every send due
    // is sent and answered either way, the floor's echo too.
    for client in ["direct", "channel"] {
        let report = open_loop(
            "2000",
            &[
                "--spacing",
                "uniform",
                "--floor",
                "--open-loop-client",
                client,
            ],
        );
        assert_eq!(report["open_loop"]["client"], client, "{report}");
        check_open_phases(&report, 2000.0, 1.0);
        let floor = report["open_loop"]["tcp_floor"]["scheduled"].as_u64();
        assert_eq!(report["tcp_floor"]["requests"].as_u64(), floor, "{report}");
        assert_eq!(report["tcp_floor"]["errors"], 0, "{report}");
        assert_eq!(report["lookup_hit_ratio"], 1.0, "{report}");
    }
}

#[test]
fn a_spin_above_a_tenth_of_a_core_warns() {
    // Gaps of 500 µs and a 10 ms spin: the thread spins nearly all the time.
    let (report, stderr) = open_loop_stderr("2000", &["--spin-us", "10000"]);
    for phase in ["empty_rpc", "lookup_route"] {
        let fraction = report["open_loop"][phase]["spin_fraction"]
            .as_f64()
            .unwrap();
        assert!(fraction > 0.1, "{phase}: {report}");
    }
    for phase in ["empty RPC phase", "LookupRoute phase"] {
        assert!(
            stderr.contains("warning: --spin-us 10000") && stderr.contains(phase),
            "{phase}: {stderr}"
        );
    }
}

#[test]
fn the_floor_and_cpu_placement_run_on_the_same_schedule() {
    // Client on CPU 0, server and echo on the last CPU (0 on one core),
    // the server with one worker: every phase keeps the schedule.
    let last = (std::thread::available_parallelism().unwrap().get() - 1).to_string();
    let report = open_loop(
        "2000",
        &[
            "--spacing",
            "uniform",
            "--floor",
            "--client-cpus",
            "0",
            "--server-cpus",
            &last,
            "--server-workers",
            "1",
            "--host-probe-us",
            "1000",
        ],
    );
    check_open_phases(&report, 2000.0, 1.0);
    let floor = &report["open_loop"]["tcp_floor"];
    let scheduled = floor["scheduled"].as_u64().unwrap();
    assert!(scheduled.abs_diff(2000) <= 1, "{report}");
    assert_eq!(
        report["tcp_floor"]["requests"].as_u64(),
        Some(scheduled),
        "{report}"
    );
    assert_eq!(report["tcp_floor"]["errors"], 0, "{report}");
    assert_eq!(report["client_cpus"], "0", "{report}");
    assert_eq!(report["server_cpus"], last.as_str(), "{report}");
    assert_eq!(report["server_workers"], 1, "{report}");
    // The host probe sat on the client's and the server's CPUs through
    // every phase.
    let mut cpus = vec![0, last.parse::<u64>().unwrap()];
    cpus.dedup();
    for phase in ["tcp_floor", "empty_rpc", "lookup_route"] {
        let stalls = &report["open_loop"][phase]["cpu_stalls"];
        let listed: Vec<u64> = stalls["cpus"]
            .as_array()
            .unwrap_or_else(|| panic!("{phase}: no cpu_stalls: {report}"))
            .iter()
            .map(|c| c.as_u64().unwrap())
            .collect();
        assert_eq!(listed, cpus, "{phase}: {report}");
        assert_eq!(stalls["period_us"], 1000, "{phase}: {report}");
        // Run as root here, with chrt on the PATH.
        assert_eq!(stalls["prioritized"], true, "{phase}: {report}");
        assert_eq!(stalls["over_us"], 500, "{phase}: {report}");
        // Every slow request touched is a request touched; the counts of
        // stalls are there.
        let touched = stalls["touched"].as_u64().unwrap();
        assert!(
            stalls["slow_touched"].as_u64().unwrap() <= touched,
            "{report}"
        );
        assert!(stalls["count"].is_u64(), "{phase}: {report}");
        assert!(stalls["every_cpu"].is_u64(), "{phase}: {report}");
        assert_eq!(stalls["dropped"], 0, "{phase}: {report}");
    }
    // Without --floor there is none; without --host-probe-us no probe
    // (it is a diagnostic run's, off by default).
    let plain = open_loop("500", &[]);
    assert!(plain["tcp_floor"].is_null(), "{plain}");
    assert!(plain["open_loop"]["tcp_floor"].is_null(), "{plain}");
    for phase in ["empty_rpc", "lookup_route"] {
        assert!(
            plain["open_loop"][phase]["cpu_stalls"].is_null(),
            "{phase}: {plain}"
        );
        // Steal time is read with or without the probe, for every CPU.
        let steal = plain["open_loop"][phase]["steal"].as_array().unwrap();
        let cpus = std::thread::available_parallelism().unwrap().get();
        assert!(steal.len() >= cpus, "{phase}: {plain}");
        assert!(
            steal.iter().all(|s| s["ms"].as_f64().unwrap() >= 0.0),
            "{plain}"
        );
    }
}

#[test]
fn a_probe_without_its_priority_says_so_in_the_report() {
    // No `chrt` on the PATH: the probe cannot raise its priority.
    let bin_dir = ic_e2e::workspace_binary("ic-index-server");
    let empty = std::env::temp_dir().join(format!("ic-loadgen-no-chrt-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ic-loadgen"))
        .env("PATH", &empty)
        .args([
            "--bin-dir",
            bin_dir.parent().unwrap().to_str().unwrap(),
            "--json",
        ])
        .args([
            "--replicas",
            "2",
            "--entries",
            "200",
            "--prompt-blocks",
            "4",
        ])
        .args([
            "--rate",
            "200",
            "--duration-secs",
            "0.3",
            "--warmup-secs",
            "0.1",
        ])
        .args(["--host-probe-us", "1000"])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir(&empty);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for phase in ["empty_rpc", "lookup_route"] {
        let stalls = &report["open_loop"][phase]["cpu_stalls"];
        assert_eq!(stalls["prioritized"], false, "{phase}: {report}");
    }
    assert!(
        stderr.contains("without its real-time priority"),
        "{stderr}"
    );
}

#[test]
fn bad_flags_are_refused_naming_the_flag() {
    for (args, flag) in [
        (&["--rate", "0"][..], "--rate"),
        (&["--rate=-5"], "--rate"),
        (&["--rate", "NaN"], "--rate"),
        (&["--rate", "100", "--spacing", "bursty"], "--spacing"),
        (&["--rate", "100", "--spin-us", "20000"], "--spin-us"),
        (&["--client-threads", "65"], "--client-threads"),
        (&["--server-workers", "65"], "--server-workers"),
        (&["--client-cpus", "2-1"], "--client-cpus"),
        (&["--server-cpus", "x"], "--server-cpus"),
        (&["--floor"], "--rate"),
        (&["--spacing", "uniform"], "--rate"),
        (&["--open-loop-client", "channel"], "--rate"),
        (&["--host-probe-us", "1000"], "--rate"),
        (&["--host-stall-us", "800"], "--rate"),
        (
            &["--rate", "100", "--open-loop-client", "tonic"],
            "--open-loop-client",
        ),
        (&["--duration-secs", "0"], "--duration-secs"),
        (&["--warmup-secs", "inf"], "--warmup-secs"),
        (&["--concurrency", "0"], "--concurrency"),
        (&["--connections", "0"], "--connections"),
        (
            &["--rate", "100", "--host-probe-us", "10"],
            "--host-probe-us",
        ),
        (
            &["--rate", "100", "--host-stall-us", "0"],
            "--host-stall-us",
        ),
        (
            &["--rate", "100", "--host-stall-cap", "0"],
            "--host-stall-cap",
        ),
    ] {
        // No server is started: the flags are checked first.
        let out = Command::new(env!("CARGO_BIN_EXE_ic-loadgen"))
            .args(["--bin-dir", "/nonexistent", "--json"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
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
