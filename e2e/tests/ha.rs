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
use std::time::{Duration, Instant};

use ic_e2e::{ServiceProcess, free_port, workspace_binary};
use nix::sys::signal::Signal;

#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/gateway.rs"]
mod gateway;

use fleet::{Engine, MODEL, TENANT, converge, figure, rounds, subscriber};
use gateway::{Endpoint, Gateway, WORKERS};

/// Engines, each with its subscriber.
const ENGINES: u64 = 3;
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

    fn endpoint(&mut self) -> Endpoint {
        Endpoint {
            epp_port: self.epp_port,
            http: self.http(),
        }
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
    let gateway = Gateway::start(replicas.iter_mut().map(Replica::endpoint));
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
        gateway.replace(i, replicas[i].endpoint());
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
    let gateway = Gateway::start(replicas.iter_mut().map(Replica::endpoint));
    for i in 0..replicas.len() {
        gateway.wait_ready(i, "before the kill").await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas[1].process.signal(Signal::SIGKILL);
    assert!(!tokio::task::block_in_place(|| replicas[1].process.wait_exit()).success());
    rounds(&mut engines, 5).await;
    let (grpc, epp) = (replicas[1].grpc_port, replicas[1].epp_port);
    replicas[1] = Replica::start(grpc, epp);
    gateway.replace(1, replicas[1].endpoint());
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
    let gateway = Gateway::start(replicas.iter_mut().map(Replica::endpoint));
    for i in 0..2 {
        gateway.wait_ready(i, "at start").await;
    }
    let mut late = Replica::start(late_grpc, late_epp);
    gateway.add(late.endpoint());
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
