//! The conformance tier's runner: feeds what the adapters render to the real
//! engine-side packages (LMCache, vLLM, SGLang, Mooncake, Redis) in the venv
//! `e2e/conformance/setup.sh` builds once per machine, through
//! `e2e/conformance/driver.py`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::free_port;

/// The conformance venv: `$IC_CONFORMANCE_VENV` (set by `./dev.sh test`),
/// else whatever `setup.sh` builds or finds.
///
/// # Panics
/// When the venv cannot be built: the tier never passes by skipping.
pub fn venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        if let Some(dir) = std::env::var_os("IC_CONFORMANCE_VENV") {
            let dir = PathBuf::from(dir);
            assert!(
                dir.join(".complete").exists(),
                "IC_CONFORMANCE_VENV={} is not a complete conformance venv",
                dir.display()
            );
            return dir;
        }
        let setup = crate::chart::repo_root().join("e2e/conformance/setup.sh");
        let out = Command::new("bash")
            .arg(&setup)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", setup.display()));
        assert!(
            out.status.success(),
            "{} failed ({}): the conformance tier needs its venv",
            setup.display(),
            out.status
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
    .clone()
}

/// Runs one case (`{"kind": ..., ...}`) in the venv with `PYTHONPATH`
/// `pythonpath` (for a vLLM version's `--target` dir) and returns the
/// driver's result object.
///
/// # Panics
/// When the driver does not answer with a JSON result.
pub fn run_case(case: &Value, pythonpath: Option<&str>) -> Value {
    let driver = crate::chart::repo_root().join("e2e/conformance/driver.py");
    let mut cmd = Command::new(venv().join("bin/python3"));
    cmd.arg(&driver)
        .env("LMCACHE_TRACK_USAGE", "false")
        .env("HF_HUB_OFFLINE", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(path) = pythonpath {
        cmd.env("PYTHONPATH", path);
    }
    let mut child = cmd.spawn().expect("spawn the conformance driver");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(case.to_string().as_bytes())
        .expect("write the case");
    let out = child.wait_with_output().expect("driver output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty());
    match last.and_then(|l| serde_json::from_str::<Value>(l).ok()) {
        Some(result) => result,
        None => panic!(
            "the driver gave no result for {case}:\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// [`run_case`], asserting the case passed.
///
/// # Panics
/// With the driver's error and traceback when it did not.
pub fn expect_ok(what: &str, case: &Value, pythonpath: Option<&str>) -> Value {
    let result = run_case(case, pythonpath);
    assert_eq!(
        result["ok"],
        Value::Bool(true),
        "{what}: {}\n{}",
        result["error"],
        result["traceback"].as_str().unwrap_or_default()
    );
    result
}

/// A `redis-server` on loopback, killed on drop.
#[derive(Debug)]
pub struct Redis {
    /// Its port.
    pub port: u16,
    child: Child,
}

impl Redis {
    /// Starts one and waits until it accepts connections.
    ///
    /// # Panics
    /// When redis-server is missing (setup.sh installs it) or never listens.
    pub fn start() -> Self {
        let port = free_port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server (installed by e2e/conformance/setup.sh)");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server never listened");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { port, child }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The engine env as the kubelet hands it to the process: literal values,
/// `fieldRef`s from `fields` (e.g. `status.podIP`), and `$(VAR)` references
/// to variables defined earlier expanded in one pass (`$$` escapes a `$`;
/// unknown references stay as written).
pub fn expand_env(env: &[Value], fields: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for var in env {
        let name = var["name"].as_str().unwrap_or_default().to_owned();
        let raw = match (&var["value"], &var["valueFrom"]["fieldRef"]["fieldPath"]) {
            (Value::String(v), _) => v.clone(),
            (_, Value::String(path)) => match fields.iter().find(|(f, _)| f == path) {
                Some((_, v)) => (*v).to_owned(),
                None => continue,
            },
            _ => continue,
        };
        let value = expand_once(&raw, &out);
        out.retain(|(n, _)| *n != name);
        out.push((name, value));
    }
    out
}

fn expand_once(raw: &str, defined: &[(String, String)]) -> String {
    let mut value = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = rest.find('$') {
        value.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$$") {
            value.push('$');
            rest = after;
        } else if let Some((reference, after)) =
            tail.strip_prefix("$(").and_then(|t| t.split_once(')'))
        {
            match defined.iter().find(|(n, _)| n == reference) {
                Some((_, v)) => value.push_str(v),
                None => {
                    value.push_str("$(");
                    value.push_str(reference);
                    value.push(')');
                }
            }
            rest = after;
        } else {
            value.push('$');
            rest = &tail[1..];
        }
    }
    value.push_str(rest);
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn env_expands_like_the_kubelet() {
        let env = [
            json!({"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}),
            json!({"name": "A", "value": "$(B)"}),
            json!({"name": "B", "value": "x"}),
            json!({"name": "C", "value": "$(IP):$(A)/$$(IP)/$(NOPE)"}),
        ];
        let out = expand_env(&env, &[("status.podIP", "10.0.0.1")]);
        assert_eq!(
            out,
            [
                ("IP".to_owned(), "10.0.0.1".to_owned()),
                ("A".to_owned(), "$(B)".to_owned()),
                ("B".to_owned(), "x".to_owned()),
                ("C".to_owned(), "10.0.0.1:$(B)/$(IP)/$(NOPE)".to_owned()),
            ]
        );
    }
}
