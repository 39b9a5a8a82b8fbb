//! Active-active index replicas with the real binaries on loopback: three
//! `ic-index-server` replicas, each fed by every subscriber (fan-out), and a
//! gateway that asks the endpoint picker continuously the way Envoy and a
//! Kubernetes Service do: round-robin over the replicas whose `/ready`
//! answers 200 (polled every 100 ms, as endpoints follow readiness), a
//! replica whose connection fails set aside at once (outlier detection).
//!
//! While the gateway picks, a replica is killed, every replica is rolled
//! (SIGTERM, drain, a new process), a replica starts late and a subscriber
//! restarts. Failed picks are counted: none through a rolling restart, no
//! more than the picks in flight at a kill -9. Every scenario ends with
//! every replica equal to what the engines hold. Convergence times are
//! printed as `fault figure:` lines (docs/reliability.md); nothing asserts a duration beyond a
//! generous "it converges at all" deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use ic_e2e::ext_proc::{buffered, destination};
use ic_e2e::{ServiceProcess, free_port, workspace_binary};
use nix::sys::signal::Signal;
use parking_lot::Mutex;
use tonic::transport::Channel;

#[path = "support/fleet.rs"]
mod fleet;

use fleet::{CONVERGE, Engine, MODEL, TENANT, converge, figure, rounds, subscriber};

/// Engines (each with its subscriber) and gateway workers.
const ENGINES: u64 = 3;
const WORKERS: usize = 4;
/// A restarted replica waits this long for every subscriber before it may
/// be ready (their reconnect backoff stays under it in these scenarios).
const WARMUP_SECONDS: &str = "3";
/// How long a replica keeps serving after SIGTERM.
const DRAIN_SECONDS: &str = "3";
const TOKENIZER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../services/index-server/tests/fixtures/chat/tokenizer.json"
);

/// One index-server replica: its ports survive a restart (as a Service's
/// endpoints would follow a new pod), its HTTP port does not.
struct Replica {
    process: ServiceProcess,
    grpc_port: u16,
    epp_port: u16,
}

impl Replica {
    /// Starts a replica (ports 0: the OS picks them).
    fn start(grpc_port: u16, epp_port: u16) -> Self {
        let grpc = format!("127.0.0.1:{grpc_port}");
        let epp = format!("127.0.0.1:{epp_port}");
        let endpoints = (0..ENGINES)
            .map(|i| format!("10.0.0.{i}:8000"))
            .collect::<Vec<_>>()
            .join(",");
        let tokenizer = format!("{MODEL}={TOKENIZER}");
        let args = [
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            &grpc,
            "--epp-addr",
            &epp,
            "--epp-tenant",
            TENANT,
            "--epp-endpoint",
            &endpoints,
            "--tokenizer",
            &tokenizer,
            "--ready-warmup-seconds",
            WARMUP_SECONDS,
            "--drain-seconds",
            DRAIN_SECONDS,
        ];
        let mut process = ServiceProcess::start(&workspace_binary("ic-index-server"), &args);
        let grpc_port = process.addr("grpc").port();
        let epp_port = process.addr("epp").port();
        Self {
            process,
            grpc_port,
            epp_port,
        }
    }

    fn http(&mut self) -> SocketAddr {
        self.process.admin_addr()
    }

    fn url(&self) -> String {
        fleet::url(self.grpc_port)
    }

    /// After SIGTERM: waits for the drained replica to exit 0 and starts
    /// its replacement on the same ports.
    fn replace_after_drain(&mut self) -> Self {
        let status = tokio::task::block_in_place(|| self.process.wait_exit());
        assert!(status.success(), "a drained replica exits 0");
        Self::start(self.grpc_port, self.epp_port)
    }
}

/// One replica as the gateway sees it.
struct Backend {
    epp: Channel,
    http: SocketAddr,
    ready: bool,
    /// Its connection failed: skipped until `/ready` answers again.
    ejected: bool,
}

/// The gateway: workers picking continuously, a poller following `/ready`.
struct Gateway {
    backends: Arc<Mutex<Vec<Backend>>>,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn backend(replica: &mut Replica) -> Backend {
    Backend {
        epp: Channel::from_shared(format!("http://127.0.0.1:{}", replica.epp_port))
            .unwrap()
            .connect_timeout(Duration::from_secs(1))
            .connect_lazy(),
        http: replica.http(),
        ready: false,
        ejected: false,
    }
}

impl Gateway {
    fn start(replicas: &mut [Replica]) -> Self {
        let backends = Arc::new(Mutex::new(replicas.iter_mut().map(backend).collect()));
        let mut gateway = Self {
            backends,
            stop: Arc::new(AtomicBool::new(false)),
            ok: Arc::default(),
            failed: Arc::default(),
            failures: Arc::default(),
            tasks: Vec::new(),
        };
        let (backends, stop) = (gateway.backends.clone(), gateway.stop.clone());
        gateway.tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let addrs: Vec<SocketAddr> = backends.lock().iter().map(|b| b.http).collect();
                let ready = tokio::task::spawn_blocking(move || {
                    addrs
                        .into_iter()
                        .map(|a| http_get_quiet(a, "/ready") == Some(200))
                        .collect::<Vec<_>>()
                })
                .await
                .unwrap();
                for (b, ready) in backends.lock().iter_mut().zip(ready) {
                    b.ready = ready;
                    if ready {
                        b.ejected = false;
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }));
        for worker in 0..WORKERS {
            let (backends, stop) = (gateway.backends.clone(), gateway.stop.clone());
            let (ok, failed, failures) = (
                gateway.ok.clone(),
                gateway.failed.clone(),
                gateway.failures.clone(),
            );
            gateway.tasks.push(tokio::spawn(async move {
                let mut n = worker;
                while !stop.load(Ordering::Relaxed) {
                    n += WORKERS;
                    // Round-robin over the replicas in the Service's endpoints.
                    let chosen = {
                        let list = backends.lock();
                        let usable: Vec<usize> = (0..list.len())
                            .filter(|&i| list[i].ready && !list[i].ejected)
                            .collect();
                        (!usable.is_empty()).then(|| {
                            let i = usable[n % usable.len()];
                            (i, list[i].epp.clone())
                        })
                    };
                    let Some((i, channel)) = chosen else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    match pick(channel, n).await {
                        Ok(_) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            failures.lock().push(format!("replica {i}: {error}"));
                            backends.lock()[i].ejected = true;
                        }
                    }
                }
            }));
        }
        gateway
    }

    /// A replica restarted: the Service's endpoint now names the new pod
    /// (not ready until it says so).
    fn replace(&self, i: usize, replica: &mut Replica) {
        self.backends.lock()[i] = backend(replica);
    }

    /// Adds a replica that started late.
    fn add(&self, replica: &mut Replica) {
        self.backends.lock().push(backend(replica));
    }

    /// Waits until replica `i` is ready in the gateway's eyes.
    async fn wait_ready(&self, i: usize, what: &str) -> Duration {
        let started = Instant::now();
        while !self.backends.lock()[i].ready {
            assert!(
                started.elapsed() < CONVERGE,
                "{what}: replica {i} never became ready"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        started.elapsed()
    }

    /// Picks made and failed so far.
    fn counts(&self) -> (u64, u64) {
        (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    async fn stop(self) -> (u64, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        let (ok, failed) = (
            self.ok.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        );
        let failures = self.failures.lock().clone();
        (ok, failed, failures)
    }
}

/// The status of `GET path`, `None` when the replica does not answer (it
/// is dead or gone): what a kubelet's readiness probe sees.
fn http_get_quiet(addr: SocketAddr, path: &str) -> Option<u16> {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// One pick over ext_proc in BUFFERED mode, as Envoy sends it: the body's
/// response must name an endpoint.
async fn pick(channel: Channel, n: usize) -> Result<String, String> {
    let body = serde_json::json!({"model": MODEL, "prompt": format!("hello world {}", n % 7)});
    let messages = buffered("/v1/completions", &serde_json::to_vec(&body).unwrap());
    let expect = messages.len();
    let mut client = ExternalProcessorClient::new(channel);
    let call = async {
        let mut responses = client
            .process(tokio_stream::iter(messages))
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let mut picked = None;
        for _ in 0..expect {
            let Some(r) = responses.message().await.map_err(|e| e.to_string())? else {
                break;
            };
            picked = picked.or_else(|| destination(&r));
        }
        picked.ok_or_else(|| "no endpoint picked".to_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .map_err(|_| "no answer within 5 s".to_owned())?
}

/// Three replicas, then the engines and their subscribers streaming to all
/// of them.
async fn setup(replica_count: usize) -> (Vec<Replica>, Vec<Engine>, Vec<ServiceProcess>) {
    let mut replicas: Vec<Replica> = (0..replica_count).map(|_| Replica::start(0, 0)).collect();
    let urls = replicas
        .iter()
        .map(Replica::url)
        .collect::<Vec<_>>()
        .join(",");
    let (mut engines, sidecars) = fleet::fleet(ENGINES, &urls, &[]).await;
    rounds(&mut engines, 10).await;
    for (i, replica) in replicas.iter_mut().enumerate() {
        let http = replica.http();
        converge(
            replica.grpc_port,
            http,
            &engines,
            &format!("replica {i} at start"),
        )
        .await;
    }
    (replicas, engines, sidecars)
}

/// Every replica holds exactly what the engines hold.
async fn all_converge(replicas: &mut [Replica], engines: &[Engine], what: &str) -> Duration {
    let started = Instant::now();
    for (i, replica) in replicas.iter_mut().enumerate() {
        let http = replica.http();
        converge(
            replica.grpc_port,
            http,
            engines,
            &format!("{what}: replica {i}"),
        )
        .await;
    }
    started.elapsed()
}

fn stop_all(sidecars: Vec<ServiceProcess>, replicas: Vec<Replica>) {
    for mut sidecar in sidecars {
        assert!(sidecar.stop().success());
    }
    for mut replica in replicas {
        assert!(replica.process.stop().success());
    }
}

/// Roll every replica one by one (SIGTERM, drain, a new process on the same
/// ports, ready before the next goes) while the engines publish and the
/// gateway picks: no pick fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_every_replica_fails_no_pick() {
    let (mut replicas, mut engines, sidecars) = setup(3).await;
    let gateway = Gateway::start(&mut replicas);
    for i in 0..replicas.len() {
        gateway.wait_ready(i, "before the roll").await;
    }
    let started = Instant::now();
    // Index, not iterator: each step replaces the replica in place.
    #[allow(clippy::needless_range_loop)]
    for i in 0..replicas.len() {
        let (before, _) = gateway.counts();
        replicas[i].process.signal(Signal::SIGTERM);
        // The engines go on while the replica drains and restarts.
        rounds(&mut engines, 5).await;
        let rolled = replicas[i].replace_after_drain();
        replicas[i] = rolled;
        gateway.replace(i, &mut replicas[i]);
        let took = gateway.wait_ready(i, "after its restart").await;
        // Ready means whole: the first picks it makes are not blind.
        let http = replicas[i].http();
        fleet::index_matches(replicas[i].grpc_port, http, &engines)
            .await
            .unwrap_or_else(|why| panic!("replica {i} ready but not whole: {why}"));
        figure(
            "rolling restart, one replica",
            format!(
                "ready {} ms after its new process started",
                took.as_millis()
            ),
        );
        let (after, failed) = gateway.counts();
        assert!(
            after > before,
            "the gateway kept picking while replica {i} rolled"
        );
        assert_eq!(failed, 0, "{:?}", gateway.failures.lock());
    }
    rounds(&mut engines, 5).await;
    let took = all_converge(&mut replicas, &engines, "after the roll").await;
    let (ok, failed, failures) = gateway.stop().await;
    figure(
        "rolling restart of 3 replicas",
        format!(
            "{ok} picks, {failed} failed, {} s in all, every replica whole {} ms after the last",
            started.elapsed().as_secs(),
            took.as_millis()
        ),
    );
    assert_eq!(failed, 0, "{failures:?}");
    stop_all(sidecars, replicas);
}

/// kill -9 of one replica while the gateway picks: only picks in flight
/// (at most one per gateway worker) fail; the replica's replacement
/// converges from the subscribers' resyncs and is ready only then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_costs_at_most_the_picks_in_flight_and_comes_back_whole() {
    let (mut replicas, mut engines, sidecars) = setup(3).await;
    let gateway = Gateway::start(&mut replicas);
    for i in 0..replicas.len() {
        gateway.wait_ready(i, "before the kill").await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas[1].process.signal(Signal::SIGKILL);
    assert!(!tokio::task::block_in_place(|| replicas[1].process.wait_exit()).success());
    rounds(&mut engines, 5).await;
    let (grpc, epp) = (replicas[1].grpc_port, replicas[1].epp_port);
    replicas[1] = Replica::start(grpc, epp);
    gateway.replace(1, &mut replicas[1]);
    let took = gateway.wait_ready(1, "after the kill").await;
    let http = replicas[1].http();
    fleet::index_matches(replicas[1].grpc_port, http, &engines)
        .await
        .unwrap_or_else(|why| panic!("the replacement is ready but not whole: {why}"));
    rounds(&mut engines, 5).await;
    let whole = all_converge(&mut replicas, &engines, "after the kill").await;
    let (ok, failed, failures) = gateway.stop().await;
    figure(
        "replica kill -9",
        format!(
            "{ok} picks, {failed} failed ({WORKERS} gateway workers), ready {} ms after the \
             restart, every replica whole {} ms later",
            took.as_millis(),
            whole.as_millis()
        ),
    );
    assert!(
        failed <= WORKERS as u64,
        "{failed} failed picks: {failures:?}"
    );
    stop_all(sidecars, replicas);
}

/// A replica started after the fleet, then a subscriber restarted: the late
/// replica converges from one resync per subscriber and is ready only then;
/// no pick fails and every replica ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_replica_and_a_restarted_subscriber_fail_no_pick() {
    let late_grpc = free_port();
    let late_epp = free_port();
    let mut replicas: Vec<Replica> = (0..2).map(|_| Replica::start(0, 0)).collect();
    // The subscribers know the third replica's address before it runs (a
    // static list; with a headless Service they would resolve it later).
    let urls = replicas
        .iter()
        .map(Replica::url)
        .chain([fleet::url(late_grpc)])
        .collect::<Vec<_>>()
        .join(",");
    let (mut engines, mut sidecars) = fleet::fleet(ENGINES, &urls, &[]).await;
    rounds(&mut engines, 10).await;
    all_converge(&mut replicas, &engines, "two replicas").await;
    let gateway = Gateway::start(&mut replicas);
    for i in 0..2 {
        gateway.wait_ready(i, "at start").await;
    }
    let mut late = Replica::start(late_grpc, late_epp);
    gateway.add(&mut late);
    replicas.push(late);
    let took = gateway.wait_ready(2, "the late replica").await;
    rounds(&mut engines, 5).await;
    let whole = all_converge(&mut replicas, &engines, "after the late start").await;
    figure(
        "replica started late",
        format!(
            "ready {} ms after it started, every replica whole {} ms later",
            took.as_millis(),
            whole.as_millis()
        ),
    );

    assert!(sidecars[0].stop().success());
    rounds(&mut engines, 5).await;
    sidecars[0] = subscriber(&engines[0], &urls, &[]);
    engines[0].engine.wait_for_subscriber().await;
    rounds(&mut engines, 5).await;
    let whole = all_converge(&mut replicas, &engines, "after the subscriber restart").await;
    figure(
        "subscriber restart, 3 replicas",
        format!("every replica whole {} ms after", whole.as_millis()),
    );
    let (ok, failed, failures) = gateway.stop().await;
    assert!(ok > 0);
    assert_eq!(failed, 0, "{failures:?}");
    stop_all(sidecars, replicas);
}
