//! Where a binary listens, for whoever started it: every server records its
//! bound address here once it accepts connections, and with
//! `--listen-report FILE` the whole set is (re)written to `FILE` as a JSON
//! object (`{"admin": "127.0.0.1:41231", "grpc": "127.0.0.1:39117"}`), so a
//! supervisor or a test binds port 0 and reads the real ports without
//! racing on a freed port or parsing log lines.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock, PoisonError};

static REPORT: OnceLock<PathBuf> = OnceLock::new();
static BOUND: Mutex<BTreeMap<&'static str, SocketAddr>> = Mutex::new(BTreeMap::new());

/// Reports to `path` from now on (the first call wins; `LogArgs::init` makes
/// it from `--listen-report`).
pub fn report_to(path: PathBuf) {
    let _ = REPORT.set(path);
}

/// Records that the server `name` (`admin`, `grpc`, `https`, `epp`) is listening
/// on `addr` and rewrites the report (the caller logs its own line).
pub fn listening(name: &'static str, addr: SocketAddr) {
    // Written under the lock: two servers binding at once must not let the
    // older set land last.
    let mut bound = BOUND.lock().unwrap_or_else(PoisonError::into_inner);
    bound.insert(name, addr);
    if let Some(path) = REPORT.get()
        && let Err(error) = write(path, &bound)
    {
        tracing::warn!(path = %path.display(), %error, "cannot write the listen report");
    }
}

/// Every address recorded so far.
pub fn bound() -> BTreeMap<&'static str, SocketAddr> {
    BOUND.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

fn write(path: &Path, bound: &BTreeMap<&'static str, SocketAddr>) -> std::io::Result<()> {
    let object: BTreeMap<&str, String> = bound.iter().map(|(k, v)| (*k, v.to_string())).collect();
    let text = serde_json::to_string(&object).map_err(std::io::Error::other)?;
    // Written beside the target and renamed over it: a reader never sees a
    // half-written file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Reads a report written by [`listening`] (for supervisors and tests).
pub fn read_report(path: &Path) -> Option<BTreeMap<String, SocketAddr>> {
    let text = std::fs::read_to_string(path).ok()?;
    let raw: BTreeMap<String, String> = serde_json::from_str(&text).ok()?;
    raw.into_iter()
        .map(|(k, v)| v.parse().ok().map(|a| (k, a)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_holds_every_bound_server() {
        let dir = std::env::temp_dir().join(format!("ic-listen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let path = dir.join("listening.json");
        report_to(path.clone());
        listening(
            "admin",
            "127.0.0.1:41231"
                .parse()
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
        );
        listening(
            "grpc",
            "127.0.0.1:39117"
                .parse()
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
        );
        let report = read_report(&path).unwrap_or_default();
        assert_eq!(
            report.get("admin").map(ToString::to_string).as_deref(),
            Some("127.0.0.1:41231")
        );
        assert_eq!(
            report.get("grpc").map(ToString::to_string).as_deref(),
            Some("127.0.0.1:39117")
        );
        assert_eq!(bound().len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
