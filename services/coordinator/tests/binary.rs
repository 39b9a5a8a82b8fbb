//! The real binary starts, answers --help, serves its admin endpoints and
//! stops cleanly on SIGTERM. The house lifecycle check
//! (`ic_e2e::assert_service_lifecycle`), except for `/metrics`: like the
//! reference, a scrape without `Accept: application/openmetrics-text` gets
//! the Prometheus text format (no `# EOF`), one asking for OpenMetrics gets
//! OpenMetrics.
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use ic_e2e::{ServiceProcess, help_text, http_get};
use nix::sys::signal::Signal;

fn get_with_accept(addr: std::net::SocketAddr, path: &str, accept: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn binary_lifecycle() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator"));
    let help = help_text(bin);
    for flag in [
        "--host",
        "--port",
        "--chunk-size",
        "--hash-algorithm",
        "--instance-timeout",
        "--health-check-interval",
        "--checkpoint-path",
        "--checkpoint-interval",
        "--metadata-path",
        "--extra-config",
        "--event-transport",
        "--kafka-bootstrap-servers",
        "--kafka-topic",
        "--kafka-group-id",
        "--max-ready-lag",
        "--format",
        "--output",
        "--quiet",
        "--events-require-auth",
        "--max-event-entry-bytes",
        "coordinator",
        "--log-level",
        "--log-format",
        "--worker-threads",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}:\n{help}");
    }
    let mut process =
        ServiceProcess::start(bin, &["coordinator", "--host", "127.0.0.1", "--port", "0"]);
    let addr = process.admin_addr();
    assert_eq!(http_get(addr, "/live").0, 200);
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(addr, "/ready").0 != 200 {
        assert!(Instant::now() < deadline, "/ready never became 200");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, text) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    assert!(
        text.contains("inferencecache_build_info{binary=\"ic-coordinator\""),
        "{text}"
    );
    assert!(!text.contains("# EOF"), "{text}");
    let om = get_with_accept(
        addr,
        "/metrics",
        "application/openmetrics-text;version=1.0.0",
    );
    assert!(
        om.contains("content-type: application/openmetrics-text"),
        "{om}"
    );
    assert!(om.trim_end().ends_with("# EOF"), "{om}");
    process.signal(Signal::SIGTERM);
    let status = process.wait_exit();
    assert!(status.success(), "exit after SIGTERM: {status:?}");
    assert!(
        process
            .logs()
            .iter()
            .any(|l| l.contains("shutdown requested") && l.contains("SIGTERM")),
        "no shutdown log:\n{}",
        process.logs().join("\n")
    );
}

/// The runtime's worker count as `/metrics` reports it (tokio's own
/// figure: thread names would also count the blocking pool's threads).
fn runtime_workers(addr: std::net::SocketAddr) -> i64 {
    let (status, text) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("lmcache_coordinator_runtime_workers "))
        .unwrap_or_else(|| panic!("no runtime_workers gauge:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// `--worker-threads N` sizes the runtime, before or after the subcommand
/// (and through `IC_WORKER_THREADS`), and the server answers with one
/// worker; unset, one per core.
#[test]
fn worker_threads_size_the_runtime() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator"));
    let cores = std::thread::available_parallelism().unwrap().get() as i64;
    for (args, env, workers) in [
        (
            vec!["--worker-threads", "1", "coordinator", "--port", "0"],
            vec![],
            1,
        ),
        (
            vec!["coordinator", "--port", "0", "--worker-threads", "3"],
            vec![],
            3,
        ),
        (
            vec!["coordinator", "--port", "0"],
            vec![("IC_WORKER_THREADS", "2")],
            2,
        ),
        (vec!["coordinator", "--port", "0"], vec![], cores),
    ] {
        let mut all = vec!["--host", "127.0.0.1"];
        all.extend(args.iter());
        let mut process = ServiceProcess::start_with_env(bin, &all, &env);
        let addr = process.admin_addr();
        let deadline = Instant::now() + Duration::from_secs(30);
        while http_get(addr, "/ready").0 != 200 {
            assert!(Instant::now() < deadline, "/ready never became 200");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(runtime_workers(addr), workers, "{args:?} {env:?}");
        process.signal(Signal::SIGTERM);
        assert!(process.wait_exit().success());
    }
}

/// A worker count past the bound is refused before any thread starts,
/// naming the flag, from the command line and from the environment.
#[test]
fn worker_threads_past_the_bound_are_refused() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator"));
    for (args, env) in [
        (vec!["--worker-threads", "1025", "coordinator"], vec![]),
        (vec!["coordinator", "--worker-threads=-1"], vec![]),
        (vec!["coordinator"], vec![("IC_WORKER_THREADS", "100000")]),
    ] {
        let out = std::process::Command::new(bin)
            .args(&args)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains("--worker-threads") && stderr.contains("0..=1024"),
            "{args:?} {env:?}: {stderr}"
        );
    }
}
