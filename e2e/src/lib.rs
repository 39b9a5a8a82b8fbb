//! Helpers for tests that run the real InferenceCache binaries on loopback.
//!
//! A [`ServiceProcess`] starts a binary with JSON logs, learns the address it
//! actually bound from its `admin server listening` log line (so tests can
//! pass port 0 and never collide), and kills it on drop if the test did not
//! stop it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub mod chart;
pub mod conformance;
pub mod engine;
pub mod ext_proc;
pub mod ingest;
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

/// A loopback port nobody listens on right now.
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

/// How long a binary may take to start listening or to stop.
pub const PROCESS_TIMEOUT: Duration = Duration::from_secs(60);

/// A running service binary.
#[derive(Debug)]
pub struct ServiceProcess {
    child: Child,
    /// Holds the `--listen-report` file the binary writes its addresses to.
    report_dir: tempfile::TempDir,
    logs: Receiver<String>,
    seen: Vec<String>,
}

impl ServiceProcess {
    /// Starts `binary` with `args` plus JSON logging.
    ///
    /// # Panics
    /// When the binary cannot be started (the test cannot proceed).
    pub fn start(binary: &Path, args: &[&str]) -> Self {
        Self::start_with_env(binary, args, &[])
    }

    /// Like [`ServiceProcess::start`], with extra environment variables.
    ///
    /// # Panics
    /// When the binary cannot be started (the test cannot proceed).
    pub fn start_with_env(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let report_dir = tempfile::tempdir().expect("a temp dir for the listen report");
        let report = report_dir.path().join("listening.json");
        let mut child = Command::new(binary)
            .args(args)
            .envs(env.iter().copied())
            .args(["--log-format", "json", "--log-level", "info"])
            .arg("--listen-report")
            .arg(&report)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, logs) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            report_dir,
            logs,
            seen: Vec::new(),
        }
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for a JSON log line whose `fields.message` is `message` and
    /// returns the parsed line.
    ///
    /// # Panics
    /// When no such line appears within [`PROCESS_TIMEOUT`]; the panic message
    /// carries every log line seen so far.
    pub fn wait_for_log(&mut self, message: &str) -> serde_json::Value {
        // Lines read while waiting for another message count too.
        let matches = |line: &str| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .filter(|v| v["fields"]["message"] == message)
        };
        if let Some(v) = self.seen.iter().find_map(|l| matches(l)) {
            return v;
        }
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.logs.recv_timeout(left) {
                Ok(line) => {
                    let found = matches(&line);
                    self.seen.push(line);
                    if let Some(v) = found {
                        return v;
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => panic!(
                    "no log line {message:?} within {PROCESS_TIMEOUT:?}; logs:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Waits until the admin server is listening and returns its address.
    pub fn admin_addr(&mut self) -> SocketAddr {
        self.addr("admin")
    }

    /// Waits until the server `name` (`admin`, `grpc`, `https`) is
    /// listening and returns its address, from the binary's
    /// `--listen-report` file (written once the socket is bound: no port
    /// is guessed, no log line parsed).
    ///
    /// # Panics
    /// When it does not listen within [`PROCESS_TIMEOUT`] (the panic
    /// carries the logs seen so far).
    pub fn addr(&mut self, name: &str) -> SocketAddr {
        let path = self.report_dir.path().join("listening.json");
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        loop {
            if let Some(addr) = ic_telemetry::listening::read_report(&path)
                .and_then(|report| report.get(name).copied())
            {
                return addr;
            }
            if Instant::now() > deadline {
                while let Ok(line) = self.logs.try_recv() {
                    self.seen.push(line);
                }
                panic!(
                    "no {name} address reported within {PROCESS_TIMEOUT:?}; logs:\n{}",
                    self.seen.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits in i32"));
        kill(pid, signal).expect("signal delivered");
    }

    /// Asks the process to stop with SIGTERM (unless it already exited, e.g.
    /// on a terminal's Ctrl-C) and waits for it.
    pub fn stop(&mut self) -> ExitStatus {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.signal(Signal::SIGTERM);
        }
        self.wait_exit()
    }

    /// Waits for the process to exit.
    ///
    /// # Panics
    /// When it is still running after [`PROCESS_TIMEOUT`].
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PROCESS_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "process {} still running {PROCESS_TIMEOUT:?} after being asked to stop",
                self.child.id()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every log line received so far (drains what is pending).
    pub fn logs(&mut self) -> &[String] {
        while let Ok(line) = self.logs.try_recv() {
            self.seen.push(line);
        }
        &self.seen
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A minimal HTTP/1.1 GET over loopback: returns the status code and body.
///
/// # Panics
/// When the server cannot be reached or answers something that is not HTTP.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("set timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("send request");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read response");
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {raw:?}"));
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
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
