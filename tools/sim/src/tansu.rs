//! `tansu`, the Kafka-protocol broker the tests run on loopback: where it
//! is found, how it is started, and [`Broker`], one started with its log in
//! SQLite, stopped, restarted, frozen and thawed as the tests need (the
//! subscriber's producer tests and the e2e Kafka scenarios share it). No
//! broker is a failure, never a skip.

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

// === impl Broker ===

/// A tansu broker on a loopback port with its log in a SQLite file (as a
/// Kafka broker keeps its log on disk), its own output in `broker.log`
/// beside it. A restart ([`Broker::stop`], [`Broker::start_again`]) takes
/// the same port and comes back with the topics and their records. Killed
/// on drop, frozen or not, and its directory removed.
#[derive(Debug)]
pub struct Broker {
    child: std::process::Child,
    bin: PathBuf,
    port: u16,
    dir: tempfile::TempDir,
}

/// How long a broker may take to stop.
const STOP_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

impl Broker {
    /// Starts a broker on 127.0.0.1:`port` and waits until it listens.
    ///
    /// # Panics
    /// When there is no tansu, or it exits or does not listen in time.
    pub fn start(port: u16) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir for the broker");
        let bin = binary();
        let child = Self::spawn(&bin, port, dir.path());
        let mut broker = Self {
            child,
            bin,
            port,
            dir,
        };
        broker.wait_listening();
        broker
    }

    fn spawn(bin: &std::path::Path, port: u16, dir: &std::path::Path) -> std::process::Child {
        let log = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("broker.log"))
                .expect("the broker's log file")
        };
        broker_command(bin, port, Storage::Sqlite(dir))
            // tansu's tracing goes to stdout, a panic to stderr: both into
            // its log, warnings only (at info it logs every span, load on
            // the broker under test).
            .stdout(log())
            .stderr(log())
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}; {INSTALL}", bin.display()))
    }

    fn wait_listening(&mut self) {
        let log = self.log_path();
        wait_listening(&mut self.child, self.port, || {
            format!(
                "; its log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
    }

    /// Creates topic `name` (tansu does not create topics on its own).
    pub fn create_topic(&self, name: &str, partitions: u32) {
        create_topic(&self.bin, self.port, name, partitions);
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`, for `--kafka-brokers`.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The broker's own output, across restarts.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("broker.log")
    }

    /// Every panic in the broker's whole log ([`panics`]).
    pub fn panics(&self) -> Vec<String> {
        panics(&self.log_path())
    }

    /// Fails the test when the broker panicked.
    ///
    /// # Panics
    /// When its log holds a panic, naming `what` and every panic.
    pub fn assert_no_panic(&self, what: &str) {
        let panics = self.panics();
        assert!(
            panics.is_empty(),
            "{what}: the broker panicked:\n{}",
            panics.join("\n")
        );
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = i32::try_from(self.child.id()).expect("a pid fits in i32");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .unwrap_or_else(|e| panic!("{signal} to the broker: {e}"));
    }

    /// SIGSTOP, returning once every thread of the broker is stopped
    /// ([`crate::freeze::freeze`]): its connections stay open and silent.
    ///
    /// # Panics
    /// When it has exited, or a thread still runs after 60 s.
    pub fn freeze(&self) {
        crate::freeze::freeze(self.child.id(), "the broker");
    }

    /// SIGCONT, returning once no thread of the broker is stopped.
    ///
    /// # Panics
    /// When it has exited, or a thread is still stopped after 60 s.
    pub fn thaw(&self) {
        crate::freeze::thaw(self.child.id(), "the broker");
    }

    /// SIGTERM, as a broker pod's restart or a node drain stops it, and
    /// waits for it to exit.
    ///
    /// # Panics
    /// When it is still running after 60 s.
    pub fn stop(&mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + STOP_DEADLINE;
        while self
            .child
            .try_wait()
            .expect("try_wait the broker")
            .is_none()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the broker still ran {STOP_DEADLINE:?} after SIGTERM"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Starts it again on the same port and log after [`Broker::stop`].
    pub fn start_again(&mut self) {
        self.child = Self::spawn(&self.bin, self.port, self.dir.path());
        self.wait_listening();
    }

    /// SIGKILL (which also ends a frozen broker) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}
