//! Helpers for tests that run the real InferenceCache binaries on loopback.
//!
//! The process harness ([`ServiceProcess`], [`http_get`]), the stand-in
//! engine ([`engine`]), the ext_proc requests ([`ext_proc`]) and the
//! IngestEvents helpers ([`ingest`]) live in `ic-sim`, which the tools run
//! too; they are re-exported here so tests keep one import root. What only
//! tests need (assertions, the chart and conformance harnesses, a free port
//! for third-party processes) is defined here.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

pub use ic_sim::{
    PROCESS_TIMEOUT, ServiceProcess, engine, ext_proc, http_get, ingest, metric_value, tansu,
};

pub mod chart;
pub mod conformance;
pub mod otlp;
pub mod tls;

/// Path of a workspace binary next to the running test (in `target/<profile>/`).
///
/// # Panics
/// When it has not been built (run the tests with `cargo nextest run
/// --workspace`, which builds every binary).
pub fn workspace_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is not built: run `cargo build --workspace --bins` (or the whole suite)",
        path.display()
    );
    path
}

/// A loopback port nobody listens on right now: for a dead address, or for
/// a third-party process (redis, tansu, LMCache, a Python publisher) that
/// must be given its port up front. Our own servers bind port 0 and report
/// what they bound ([`ServiceProcess::addr`], `FakeEngine::start`).
///
/// # Panics
/// When the OS has no free port.
pub fn free_port() -> u16 {
    free_ports_in_a_row(1)
}

/// The first of `count` consecutive loopback ports nobody listens on right
/// now (for services that derive ports from a base, like one per DP rank).
///
/// # Panics
/// When no such run turns up in a hundred tries.
pub fn free_ports_in_a_row(count: u16) -> u16 {
    for _ in 0..100 {
        let first = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let base = first.local_addr().expect("local address").port();
        // Hold every port of the run until all are known free.
        let rest: Option<Vec<std::net::TcpListener>> = (1..count)
            .map(|i| {
                let port = base.checked_add(i)?;
                std::net::TcpListener::bind(("127.0.0.1", port)).ok()
            })
            .collect();
        if rest.is_some() {
            return base;
        }
    }
    panic!("no run of {count} free loopback ports");
}

/// Runs `binary --help` and returns its stdout.
///
/// # Panics
/// When the binary fails to run or `--help` exits non-zero.
pub fn help_text(binary: &Path) -> String {
    let out = Command::new(binary)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary.display()));
    assert!(out.status.success(), "--help failed: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8 help")
}

/// The standard lifecycle check for a service binary: `--help` mentions
/// `expected_flags`, the process serves `/live`, `/ready` and `/metrics` on
/// its admin address, and SIGTERM stops it with exit code 0.
///
/// # Panics
/// On any deviation (this is a test helper).
pub fn assert_service_lifecycle(binary: &Path, args: &[&str], expected_flags: &[&str]) {
    let help = help_text(binary);
    for flag in expected_flags
        .iter()
        .chain(&["--log-level", "--log-format"])
    {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }

    let mut process = ServiceProcess::start(binary, args);
    let addr = process.admin_addr();
    assert_eq!(http_get(addr, "/live").0, 200);
    // Readiness is set right after the listener is up; allow a moment.
    let deadline = Instant::now() + PROCESS_TIMEOUT;
    while http_get(addr, "/ready").0 != 200 {
        assert!(Instant::now() < deadline, "/ready never became 200");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, metrics) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    let name = binary
        .file_name()
        .and_then(|n| n.to_str())
        .expect("binary name");
    assert!(
        metrics.contains(&format!("inferencecache_build_info{{binary=\"{name}\"")),
        "{metrics}"
    );
    assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");

    process.signal(Signal::SIGTERM);
    let status = process.wait_exit();
    assert!(
        status.success(),
        "exit after SIGTERM: {status:?}; logs:\n{}",
        process.logs().join("\n")
    );
    assert!(
        process
            .logs()
            .iter()
            .any(|l| l.contains("shutdown requested") && l.contains("SIGTERM")),
        "no shutdown log:\n{}",
        process.logs().join("\n")
    );
}
