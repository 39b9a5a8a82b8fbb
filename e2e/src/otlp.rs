//! The OTLP/gRPC receiver the telemetry tests export to: `e2e/otlp/receiver.py`,
//! gRPC's server with the OpenTelemetry project's protobuf classes, run from
//! the venv `./dev.sh test` builds (`IC_OTLP_RECEIVER_PYTHON`). It writes one
//! JSON line per span and per metric point, which [`Receiver::wait_for`]
//! reads back.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running receiver; killed on drop.
#[derive(Debug)]
pub struct Receiver {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl Receiver {
    /// Starts the receiver on a free loopback port.
    ///
    /// # Panics
    /// When `IC_OTLP_RECEIVER_PYTHON` is unset (run the suite with
    /// `./dev.sh test`) or the receiver does not come up within 30 s.
    pub fn start() -> Self {
        let python = std::env::var("IC_OTLP_RECEIVER_PYTHON").unwrap_or_else(|_| {
            panic!(
                "IC_OTLP_RECEIVER_PYTHON is not set: the OTLP receiver's venv is built by \
                 `./dev.sh test` (ensure_otlp_receiver); run the suite through it"
            )
        });
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("otlp/receiver.py");
        let dir = tempfile::tempdir().expect("tempdir");
        let port_file = dir.path().join("port");
        let child = Command::new(&python)
            .arg(&script)
            .arg("--port-file")
            .arg(&port_file)
            .arg("--out")
            .arg(dir.path().join("received.jsonl"))
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {python} {}: {e}", script.display()));
        let mut receiver = Self {
            child,
            dir,
            port: 0,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(text) = std::fs::read_to_string(&port_file)
                && let Ok(port) = text.trim().parse()
            {
                receiver.port = port;
                return receiver;
            }
            if let Ok(Some(status)) = receiver.child.try_wait() {
                panic!("the OTLP receiver exited at start: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "the OTLP receiver did not start in 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The `--otlp-endpoint` value pointing at this receiver.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Everything received so far.
    pub fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("received.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The first record `matches` accepts, waiting up to `timeout`.
    ///
    /// # Panics
    /// When none arrives in time; the message lists what did.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        matches: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let records = self.records();
            if let Some(found) = records.iter().find(|r| matches(r)) {
                return found.clone();
            }
            if Instant::now() >= deadline {
                let seen: Vec<String> = records
                    .iter()
                    .map(|r| format!("{} {} {}", r["signal"], r["service"], r["name"]))
                    .collect();
                panic!("no {what} reached the receiver in {timeout:?}; it got: {seen:#?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Spans named `name` from `service`.
    pub fn spans(&self, service: &str, name: &str) -> Vec<Value> {
        self.records()
            .into_iter()
            .filter(|r| r["signal"] == "span" && r["service"] == service && r["name"] == name)
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A W3C `traceparent` for a sampled span `span_id` of trace `trace_id`
/// (both hex).
pub fn traceparent(trace_id: &str, span_id: &str) -> String {
    format!("00-{trace_id}-{span_id}-01")
}
