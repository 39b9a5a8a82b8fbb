//! Restart-to-ready: starts the coordinator binary on a checkpoint and
//! times process start → the first `200` from `GET /ready`, then reports
//! the keys restored (`/directory/stats`) and the process's resident set.
//!
//! Run (a checkpoint of N keys from `memory_per_key fill N PATH`):
//! `cargo build --release -p ic-coordinator --bin ic-coordinator --example restart_to_ready`,
//! then `target/release/examples/restart_to_ready target/release/ic-coordinator PATH`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `GET path` on 127.0.0.1:port; the status and body, or `None` while
/// nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
    Some((status, body))
}

/// A `/proc/PID/status` size field (`VmRSS`, `VmHWM`: the peak) in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The process's CPU time so far (user, system) in seconds, from
/// `/proc/PID/stat` (clock ticks of 1/100 s): a figure the machine's load
/// does not stretch, unlike the wall time to ready.
fn cpu_seconds(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let field = |i: usize| -> f64 {
        rest.split_whitespace()
            .nth(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 100.0
    };
    // utime and stime are fields 14 and 15, 12 and 13 after the name.
    (field(11), field(12))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(bin), Some(ckpt)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: restart_to_ready COORDINATOR_BINARY CHECKPOINT");
        std::process::exit(2);
    };
    // A free loopback port (released just before the child binds it).
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    let started = Instant::now();
    let mut child = Command::new(bin)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--checkpoint-path",
            ckpt,
            // No periodic checkpoint while measuring, and no bound below
            // the checkpoint's size.
            "--checkpoint-interval",
            "0",
            "--max-directory-keys",
            "0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the coordinator");
    let ready = loop {
        if let Some((200, _)) = get(port, "/ready") {
            break started.elapsed();
        }
        if let Ok(Some(status)) = child.try_wait() {
            eprintln!("the coordinator exited before it was ready: {status}");
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stats = get(port, "/directory/stats")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let keys: u64 = stats
        .split("\"num_keys\":")
        .nth(1)
        .and_then(|s| s.split([',', '}']).next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    let rss = status_bytes(child.id(), "VmRSS:");
    let peak = status_bytes(child.id(), "VmHWM:");
    let (user, sys) = cpu_seconds(child.id());
    #[allow(clippy::cast_precision_loss)]
    let per_key = |b: u64| {
        if keys > 0 {
            b as f64 / keys as f64
        } else {
            0.0
        }
    };
    println!(
        "ready in {:.2} s (CPU user {user:.2} s, sys {sys:.2} s) with {keys} keys; RSS {:.0} MiB ({:.0} B/key), peak {:.0} MiB ({:.0} B/key)",
        ready.as_secs_f64(),
        rss as f64 / 1_048_576.0,
        per_key(rss),
        peak as f64 / 1_048_576.0,
        per_key(peak)
    );
    // Stop it by its pid (SIGKILL: a clean stop would write a checkpoint).
    let _ = child.kill();
    let _ = child.wait();
}
