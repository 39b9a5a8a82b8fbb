//! Running the real InferenceCache binaries as child processes: a
//! [`ServiceProcess`] starts a binary with JSON logs and a
//! `--listen-report` file, learns the addresses it actually bound from that
//! file (so callers pass port 0 and never collide), and kills it on drop if
//! the caller did not stop it; [`http_get`] asks one of its HTTP servers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long a binary may take to start listening or to stop.
pub const PROCESS_TIMEOUT: Duration = Duration::from_secs(60);

/// A running service binary.
#[derive(Debug)]
pub struct ServiceProcess {
    child: Child,
    /// The binary's file name, for messages.
    name: String,
    /// Holds the `--listen-report` file the binary writes its addresses to.
    report_dir: tempfile::TempDir,
    logs: Receiver<String>,
    seen: Vec<String>,
}

impl ServiceProcess {
    /// Starts `binary` with `args` plus JSON logging, with no drain period
    /// or readiness warm-up unless `args` set them.
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
            // A test's process stops at SIGTERM and is ready once serving,
            // unless the test asks for a drain or a warm-up (a flag, or
            // these variables in `env`).
            .env("IC_DRAIN_SECONDS", "0")
            .env("IC_READY_WARMUP_SECONDS", "0")
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
            name: binary.file_name().map_or_else(
                || binary.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            ),
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

    /// SIGSTOP, returning once every thread of the process is stopped
    /// ([`crate::freeze::freeze`]): its connections stay open and silent.
    ///
    /// # Panics
    /// When it has exited, or a thread still runs after 60 s.
    pub fn freeze(&self) {
        crate::freeze::freeze(self.child.id(), &self.name);
    }

    /// SIGCONT, returning once no thread of the process is stopped.
    ///
    /// # Panics
    /// When it has exited, or a thread is still stopped after 60 s.
    pub fn thaw(&self) {
        crate::freeze::thaw(self.child.id(), &self.name);
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

/// The value of `series` (its name and labels, as a Prometheus text
/// exposition writes them) in `exposition`; `None` when absent.
pub fn metric_value(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| {
        line.strip_prefix(series)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
    })
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
