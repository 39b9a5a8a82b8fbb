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
        "--allocator-purge-delay-ms",
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

/// The value of the gauge `lmcache_coordinator_<name>` on `/metrics`.
fn gauge(addr: std::net::SocketAddr, name: &str) -> i64 {
    let (status, text) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let prefix = format!("lmcache_coordinator_{name} ");
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {name} gauge:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// The runtime's worker count as `/metrics` reports it (tokio's own
/// figure: thread names would also count the blocking pool's threads).
fn runtime_workers(addr: std::net::SocketAddr) -> i64 {
    gauge(addr, "runtime_workers")
}

/// Starts the binary with `args` and `env`, waits until ready, and returns
/// the process with its address.
fn start_ready(
    bin: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (ServiceProcess, std::net::SocketAddr) {
    let mut all = vec!["--host", "127.0.0.1"];
    all.extend(args.iter());
    let mut process = ServiceProcess::start_with_env(bin, &all, env);
    let addr = process.admin_addr();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(addr, "/ready").0 != 200 {
        assert!(Instant::now() < deadline, "/ready never became 200");
        std::thread::sleep(Duration::from_millis(20));
    }
    (process, addr)
}

/// `--allocator-purge-delay-ms` sets mimalloc's purge delay, before or
/// after the subcommand and through `IC_ALLOCATOR_PURGE_DELAY_MS`, over
/// mimalloc's own `MIMALLOC_PURGE_DELAY`; unset, freed pages are kept (-1)
/// unless that variable is set. The gauge reads mimalloc's option back.
#[test]
fn allocator_purge_delay_follows_the_flag() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator"));
    // The test's own environment may set mimalloc's variables, which the
    // default case would then follow (and `ServiceProcess` cannot remove).
    let inherited = ["MIMALLOC_PURGE_DELAY", "MIMALLOC_RESET_DELAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    let mut cases = vec![
        (
            vec![
                "--allocator-purge-delay-ms",
                "0",
                "coordinator",
                "--port",
                "0",
            ],
            vec![],
            0,
        ),
        (
            vec![
                "coordinator",
                "--port",
                "0",
                "--allocator-purge-delay-ms",
                "250",
            ],
            vec![],
            250,
        ),
        (
            vec!["coordinator", "--port", "0"],
            vec![("IC_ALLOCATOR_PURGE_DELAY_MS", "1000")],
            1000,
        ),
        (
            vec![
                "coordinator",
                "--port",
                "0",
                "--allocator-purge-delay-ms=-1",
            ],
            vec![("MIMALLOC_PURGE_DELAY", "250")],
            -1,
        ),
        (
            vec!["coordinator", "--port", "0"],
            vec![("MIMALLOC_PURGE_DELAY", "250")],
            250,
        ),
    ];
    if inherited {
        eprintln!("MIMALLOC_PURGE_DELAY or MIMALLOC_RESET_DELAY is set: the unset case is skipped");
    } else {
        cases.push((vec!["coordinator", "--port", "0"], vec![], -1));
    }
    for (args, env, delay) in cases {
        let (mut process, addr) = start_ready(bin, &args, &env);
        assert_eq!(
            gauge(addr, "allocator_purge_delay_ms"),
            delay,
            "{args:?} {env:?}"
        );
        process.signal(Signal::SIGTERM);
        assert!(process.wait_exit().success());
    }
}

/// A purge delay outside -1..=3600000 is refused at start, naming the flag.
#[test]
fn allocator_purge_delay_out_of_range_is_refused() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator"));
    for (args, env) in [
        (vec!["coordinator", "--allocator-purge-delay-ms=-2"], vec![]),
        (
            vec!["--allocator-purge-delay-ms", "3600001", "coordinator"],
            vec![],
        ),
        (
            vec!["coordinator"],
            vec![("IC_ALLOCATOR_PURGE_DELAY_MS", "soon")],
        ),
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
            stderr.contains("--allocator-purge-delay-ms"),
            "{args:?} {env:?}: {stderr}"
        );
    }
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
        let (mut process, addr) = start_ready(bin, &args, &env);
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

/// Voluntary context switches of each of `pid`'s threads, by thread id.
fn voluntary_switches(pid: u32) -> std::collections::BTreeMap<String, u64> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = task.unwrap();
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let n = status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .map(|v| v.trim().parse::<u64>().unwrap())
            .unwrap();
        out.insert(task.file_name().to_string_lossy().into_owned(), n);
    }
    out
}

/// Requests with a body, one at a time on one keep-alive connection, are
/// served by one thread that wakes no other: hyper's server task wakes
/// itself while it reads a body, and tokio's multi-threaded runtime took
/// that self-wake for a yield and unparked the idle worker for every
/// lookup (a futex wake and two context switches on the cores the clients
/// share; 373 wake-ups of other threads over 400 lookups before
/// `ic_telemetry::repoll`). The count is of wake-ups, not of time: each is
/// a thread blocking again.
#[test]
fn a_lookup_wakes_no_other_thread() {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator"));
    let mut process = ServiceProcess::start(
        bin,
        &[
            "coordinator",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--worker-threads",
            "2",
        ],
    );
    let addr = process.admin_addr();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(addr, "/ready").0 != 200 {
        assert!(Instant::now() < deadline, "/ready never became 200");
        std::thread::sleep(Duration::from_millis(20));
    }
    let key =
        r#"{"chunk_hash_hex":"00000000000000000000000000000001","model_name":"m","kv_rank":0}"#;
    let body = format!(r#"{{"keys":[{key},{key}]}}"#);
    let request = format!(
        "POST /directory/lookup HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_nodelay(true).unwrap();
    let mut lookup = || {
        conn.write_all(request.as_bytes()).unwrap();
        // One answer: the head, then exactly Content-Length bytes.
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            conn.read_exact(&mut byte).unwrap();
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        let len: usize = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap())
            })
            .unwrap();
        let mut answer = vec![0u8; len];
        conn.read_exact(&mut answer).unwrap();
    };
    // Warm: every lazy start done.
    for _ in 0..50 {
        lookup();
    }
    const LOOKUPS: u64 = 400;
    // The serving thread waits for most requests (the measure works),
    // unless the cores are busy (another test starting servers): then it
    // is preempted while the client sends the next request, finds it
    // there and does not wait; such a window measures nothing and is
    // taken again, up to 5 times.
    let mut woken = Vec::new();
    for _ in 0..5 {
        let before = voluntary_switches(process.pid());
        for _ in 0..LOOKUPS {
            lookup();
        }
        let after = voluntary_switches(process.pid());
        woken = after
            .iter()
            // A thread id reused by a newer thread may count fewer: not negative.
            .map(|(tid, n)| {
                let was = before.get(tid).copied().unwrap_or(0);
                (tid.clone(), n.saturating_sub(was))
            })
            .collect();
        woken.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        if woken[0].1 >= LOOKUPS / 4 {
            break;
        }
    }
    assert!(woken[0].1 >= LOOKUPS / 4, "{woken:?}");
    // The others: timers only (the liveness sweep, the idle deadline).
    let others: u64 = woken[1..].iter().map(|(_, n)| n).sum();
    assert!(
        others < LOOKUPS / 10,
        "{others} wake-ups of other threads over {LOOKUPS} lookups: {woken:?}"
    );
    process.signal(Signal::SIGTERM);
    assert!(process.wait_exit().success());
}
