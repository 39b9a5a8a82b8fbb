//! Where the tests find `tansu`, the Kafka-protocol broker they run on
//! loopback. No broker is a failure, never a skip.

use std::path::PathBuf;

/// How to get the broker, for every message about a missing or failed one.
pub const INSTALL: &str = "install tansu 0.6.0 with `./dev.sh test` (it installs it into \
     ~/.cache/inferencecache/tools), or `cargo install tansu --version 0.6.0 --features dynostore,libsql \
     --locked --debug --root ~/.cache/inferencecache/tools`, or point IC_TANSU_BIN at a tansu binary";

/// The tansu binary: `IC_TANSU_BIN`, the dev.sh tool cache, then PATH.
///
/// # Panics
/// When there is none, saying how to install it.
pub fn binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("IC_TANSU_BIN") {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "IC_TANSU_BIN={} does not exist; {INSTALL}",
            bin.display()
        );
        return bin;
    }
    let mut candidates = Vec::new();
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cache/inferencecache/tools/bin/tansu"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("tansu")));
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("tansu (Kafka broker) not found; {INSTALL}"))
}

/// Where a test broker keeps its log.
#[derive(Clone, Copy, Debug)]
pub enum Storage<'a> {
    /// In memory: gone when the broker stops.
    Memory,
    /// A SQLite file in this directory, kept across restarts.
    Sqlite(&'a std::path::Path),
}

/// The command that runs `bin` as a broker listening on, and advertising,
/// 127.0.0.1:`port` with `storage`; stdin is closed, the rest is the
/// caller's (output, environment, spawning).
pub fn broker_command(
    bin: &std::path::Path,
    port: u16,
    storage: Storage<'_>,
) -> std::process::Command {
    let url = format!("tcp://127.0.0.1:{port}");
    let mut command = std::process::Command::new(bin);
    command
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .stdin(std::process::Stdio::null());
    match storage {
        Storage::Memory => command.args(["--storage-engine", "memory://tansu/"]),
        // tansu resolves the file against its working directory (an
        // absolute path in the URL is misread).
        Storage::Sqlite(dir) => command
            .current_dir(dir)
            .args(["--storage-engine", "sqlite://tansu.db"]),
    };
    command
}

/// How long a broker may take to start listening.
const LISTEN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(90);

/// Waits until the broker `child` accepts connections on 127.0.0.1:`port`.
///
/// # Panics
/// When it exits first (with `log()`, what it said) or takes longer than
/// 90 s.
pub fn wait_listening(child: &mut std::process::Child, port: u16, log: impl Fn() -> String) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = std::time::Instant::now() + LISTEN_DEADLINE;
    while std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(200))
        .is_err()
    {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "tansu exited before listening on {addr}: {status}; {INSTALL}{}",
                log()
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "tansu did not listen on {addr} within {LISTEN_DEADLINE:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Every `panicked at` line of the broker log at `log`, each with the line
/// after it (the message). tansu 0.6's SQLite store panics on a produce
/// with a producer epoch it did not create and then answers every request
/// with an error, so tests assert this is empty. A missing log reads as
/// no panics.
pub fn panics(log: &std::path::Path) -> Vec<String> {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("panicked at"))
        .map(|(i, l)| format!("{l}\n{}", lines.get(i + 1).unwrap_or(&"")))
        .collect()
}

/// Creates topic `name` with `partitions` on the broker at 127.0.0.1:`port`
/// (tansu does not create topics on its own).
///
/// # Panics
/// When tansu refuses.
pub fn create_topic(bin: &std::path::Path, port: u16, name: &str, partitions: u32) {
    let out = std::process::Command::new(bin)
        .args([
            "topic",
            "create",
            "--broker",
            &format!("tcp://127.0.0.1:{port}"),
            "--partitions",
            &partitions.to_string(),
            name,
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}; {INSTALL}", bin.display()));
    assert!(
        out.status.success(),
        "tansu topic create {name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
