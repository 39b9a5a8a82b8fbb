//! Active-active replicas share their pick-level load (`--peer`), with the
//! real binaries on loopback: two `ic-index-server` replicas fed by the
//! same subscribers, each given both replicas' URLs (its own among them, as
//! a headless Service would list it). Gateways ask only the first; the
//! second's LookupRoute must see those picks in the engine's load, and each
//! replica must have found its own address and stopped reporting there.
//! Speculative holders stay per replica: a pick made through one replica
//! makes it, and only it, count the picked engine as holding the prompt
//! until the engine's events arrive; then both answer alike.
//! Also: readiness waits for the controller's first policy push.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ic_e2e::{ServiceProcess, free_port, workspace_binary};
use ic_proto::IndexServiceClient;

#[path = "support/fleet.rs"]
mod fleet;

use fleet::{MODEL, TENANT, converge, metric};

/// How often a wait says what it is still missing.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A wait with no deadline (tests assert no times): a wait that never ends
/// is ended by the runner's timeout, its last lines saying what it missed.
struct Wait {
    started: Instant,
    next: Duration,
}

impl Wait {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            next: LOG_EVERY,
        }
    }

    fn still(&mut self, missing: impl FnOnce() -> String) {
        if self.started.elapsed() >= self.next {
            eprintln!(
                "still waiting after {:?}: {}",
                self.started.elapsed(),
                missing()
            );
            self.next += LOG_EVERY;
        }
    }
}

/// Pick-load reports this replica accepted from its peers.
fn reports_received(http: SocketAddr) -> f64 {
    shares(http, "received", "")
}

/// Pick-load reports sent (`direction`) or received, `ok`, of `report`
/// (`full`, `push`; empty: both).
fn shares(http: SocketAddr, direction: &str, report: &str) -> f64 {
    shares_with(http, direction, report, "ok")
}

/// As [`shares`], of `outcome` (empty: every outcome).
fn shares_with(http: SocketAddr, direction: &str, report: &str, outcome: &str) -> f64 {
    let (_, text) = ic_e2e::http_get(http, "/metrics");
    let direction = format!("direction=\"{direction}\"");
    let report = format!("report=\"{report}\"");
    let outcome = format!("outcome=\"{outcome}\"");
    text.lines()
        .filter(|l| {
            l.starts_with("inferencecache_index_peers_shares_total{")
                && l.contains(&direction)
                && (report == "report=\"\"" || l.contains(&report))
                && (outcome == "outcome=\"\"" || l.contains(&outcome))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn replica(grpc_port: u16, peers: &str) -> ServiceProcess {
    replica_with(grpc_port, peers, &[])
}

fn replica_with(grpc_port: u16, peers: &str, extra: &[&str]) -> ServiceProcess {
    replica_every(grpc_port, peers, "50", extra)
}

/// A replica reporting in full every `interval_ms`.
fn replica_every(grpc_port: u16, peers: &str, interval_ms: &str, extra: &[&str]) -> ServiceProcess {
    let grpc = format!("127.0.0.1:{grpc_port}");
    let mut args = vec![
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        &grpc,
        "--ready-warmup-seconds",
        "0",
        "--peer",
        peers,
        "--peer-share-interval-ms",
        interval_ms,
        // Every pick goes to the holder (no load bound), and keeps its
        // weight for the whole test.
        "--load-bound",
        "0",
        "--pick-half-life-ms",
        "600000",
    ];
    args.extend_from_slice(extra);
    ServiceProcess::start(&workspace_binary("ic-index-server"), &args)
}

/// The load LookupRoute names for `replica_id` on the replica at
/// `grpc_port` for `tokens` (observe-only: asking adds no pick).
async fn load_of(grpc_port: u16, tokens: &[u32], replica_id: &str, observe: bool) -> Option<f64> {
    let mut client = IndexServiceClient::connect(fleet::url(grpc_port))
        .await
        .unwrap();
    let mut request = ic_e2e::ingest::token_lookup(TENANT, MODEL, tokens.to_vec());
    request.observe_only = observe;
    let r = client.lookup_route(request).await.unwrap().into_inner();
    r.candidates
        .iter()
        .find(|c| {
            c.replica
                .as_ref()
                .is_some_and(|r| r.replica_id == replica_id)
        })
        .map(|c| c.load)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_sees_the_picks_made_through_its_peer() {
    let ports = [free_port(), free_port()];
    let urls = ports
        .iter()
        .map(|p| fleet::url(*p))
        .collect::<Vec<_>>()
        .join(",");
    let mut replicas: Vec<ServiceProcess> = ports.iter().map(|p| replica(*p, &urls)).collect();
    let https: Vec<SocketAddr> = replicas.iter_mut().map(|r| r.admin_addr()).collect();
    let (mut engines, sidecars) = fleet::fleet(2, &urls, &[]).await;
    engines[0].store(6).await;
    engines[1].store(3).await;
    for (port, http) in ports.iter().zip(&https) {
        converge(*port, *http, &engines, "at start").await;
    }
    let (tokens, _) = engines[0].newest().unwrap();
    let holder = engines[0].replica.clone();
    assert_eq!(
        load_of(ports[1], &tokens, &holder, true).await,
        Some(0.0),
        "nobody picked yet"
    );

    // Gateways ask only the first replica, which counts each pick.
    for _ in 0..12 {
        load_of(ports[0], &tokens, &holder, false).await.unwrap();
    }
    let own = load_of(ports[0], &tokens, &holder, true).await.unwrap();
    assert!(own >= 11.0, "the first replica counts its 12 picks: {own}");

    // The second replica's ranking sees them through the exchange.
    let mut wait = Wait::new();
    let seen = loop {
        let seen = load_of(ports[1], &tokens, &holder, true).await.unwrap();
        if seen >= own * 0.9 {
            break seen;
        }
        wait.still(|| format!("the second replica's load {seen}, the first's {own}"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("peer load: first replica {own:.2}, second {seen:.2}");
    // The first replica does not get its own picks echoed back.
    let again = load_of(ports[0], &tokens, &holder, true).await.unwrap();
    assert!(
        again <= own * 1.01,
        "own picks counted twice: {own} then {again}"
    );

    for http in &https {
        // Live peers are counted when a replica next applies what its peers
        // sent (`apply_once` in peers.rs), on its own schedule, not when the
        // picks above became visible: wait for the count, do not read it once.
        let mut wait = Wait::new();
        loop {
            let live = metric(*http, "inferencecache_index_peers_live");
            if live == 1.0 {
                break;
            }
            wait.still(|| format!("{http} counts {live} live peers, not one"));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let (_, text) = ic_e2e::http_get(*http, "/metrics");
        assert!(
            text.lines()
                .any(|l| l.starts_with("inferencecache_index_peers_shares_total")
                    && l.contains("direction=\"sent\"")
                    && l.contains("outcome=\"self\"")),
            "each replica found its own address among --peer"
        );
    }
    for mut sidecar in sidecars {
        assert!(sidecar.stop().success());
    }
    for mut r in replicas {
        assert!(r.stop().success());
    }
}

/// A pick is pushed to the peers at once (`--peer-push`, the default): with
/// full reports 10 s apart, the second replica sees the picks made through
/// the first without a full report in between (its count of full reports
/// received is the same before and after). The peers' figures count for
/// ten minutes, so a slow poll cannot miss them. Without the push every
/// round sees a full report and picks again, until the runner's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pick_reaches_the_peer_before_the_next_full_report() {
    let ports = [free_port(), free_port()];
    let urls = ports
        .iter()
        .map(|p| fleet::url(*p))
        .collect::<Vec<_>>()
        .join(",");
    let mut replicas: Vec<ServiceProcess> = ports
        .iter()
        .map(|p| replica_every(*p, &urls, "10000", &["--peer-ttl-ms", "600000"]))
        .collect();
    let https: Vec<SocketAddr> = replicas.iter_mut().map(|r| r.admin_addr()).collect();
    let (mut engines, sidecars) = fleet::fleet(2, &urls, &[]).await;
    engines[0].store(6).await;
    engines[1].store(3).await;
    for (port, http) in ports.iter().zip(&https) {
        converge(*port, *http, &engines, "at start").await;
    }
    let (tokens, _) = engines[0].newest().unwrap();
    let holder = engines[0].replica.clone();
    // Pushes go only to a peer a full report reached (the first may have
    // found the other replica not listening yet).
    let mut wait = Wait::new();
    while shares(https[0], "sent", "full") < 1.0 {
        wait.still(|| "the first replica's first full report".into());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut picks = 0;
    let seen = loop {
        let full_before = shares(https[1], "received", "full");
        for _ in 0..4 {
            load_of(ports[0], &tokens, &holder, false).await.unwrap();
        }
        picks += 4;
        let own = load_of(ports[0], &tokens, &holder, true).await.unwrap();
        let mut wait = Wait::new();
        let seen = loop {
            let seen = load_of(ports[1], &tokens, &holder, true).await.unwrap();
            if seen >= own * 0.99 {
                break seen;
            }
            wait.still(|| format!("the second replica's load {seen}, the first's {own}"));
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        if shares(https[1], "received", "full") == full_before {
            break seen;
        }
        // A full report came in between: it proves nothing; pick again.
    };
    eprintln!("after {picks} picks the peer's load is {seen:.2}, without a full report");
    assert!(seen >= 3.9, "the second replica sees the picks: {seen}");
    assert!(
        shares(https[0], "sent", "push") >= 1.0,
        "the picks were pushed"
    );
    for mut sidecar in sidecars {
        assert!(sidecar.stop().success());
    }
    for mut r in replicas {
        assert!(r.stop().success());
    }
}

/// No pushes go to a peer whose last call failed: the first replica's
/// first full report finds the second not listening; picks made then push
/// nothing (not one failing call per pick). Once the second is up and a
/// full report reaches it, picks are pushed again. Without the rule the
/// picks' pushes fail, counted as `report="push",outcome="error"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_picks_are_pushed_to_a_failing_peer_until_a_full_report_gets_through() {
    let ports = [free_port(), free_port()];
    let urls = ports
        .iter()
        .map(|p| fleet::url(*p))
        .collect::<Vec<_>>()
        .join(",");
    let mut first = replica_every(ports[0], &urls, "1000", &["--peer-ttl-ms", "600000"]);
    let http = first.admin_addr();
    let (mut engines, sidecars) = fleet::fleet(1, &fleet::url(ports[0]), &[]).await;
    engines[0].store(6).await;
    converge(ports[0], http, &engines, "at start").await;
    let (tokens, _) = engines[0].newest().unwrap();
    let holder = engines[0].replica.clone();
    let mut wait = Wait::new();
    while shares_with(http, "sent", "full", "error") < 1.0 {
        wait.still(|| "a failed full report to the second replica".into());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for _ in 0..4 {
        load_of(ports[0], &tokens, &holder, false).await.unwrap();
    }
    let mut second = replica_every(ports[1], &urls, "10000", &["--peer-ttl-ms", "600000"]);
    let mut wait = Wait::new();
    while shares(http, "sent", "full") < 1.0 {
        wait.still(|| "a full report reaching the second replica".into());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let failed_pushes = shares_with(http, "sent", "push", "error");
    assert_eq!(
        failed_pushes, 0.0,
        "no push to the peer while its calls failed"
    );
    // The peer is back: picks are pushed again.
    let mut wait = Wait::new();
    while shares(http, "sent", "push") < 1.0 {
        load_of(ports[0], &tokens, &holder, false).await.unwrap();
        wait.still(|| "a push reaching the second replica".into());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(shares_with(http, "sent", "push", "error"), 0.0);
    for mut sidecar in sidecars {
        assert!(sidecar.stop().success());
    }
    assert!(first.stop().success());
    assert!(second.stop().success());
}

/// A replica whose controller pushes policies is not ready before the
/// first push (gate `policies`), and is at once after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_first_policy_push() {
    let mut server = ServiceProcess::start(
        &workspace_binary("ic-index-server"),
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--ready-warmup-seconds",
            "0",
            "--ready-policies-seconds",
            "3600",
        ],
    );
    let http = server.admin_addr();
    let grpc = server.addr("grpc");
    // Readiness is evaluated every 200 ms: a second of not ready is five
    // evaluations with the warm-up over.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(ic_e2e::http_get(http, "/ready").0, 503, "no push yet");
    let mut client = IndexServiceClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    client
        .set_policies(ic_proto::index_v1::SetPoliciesRequest::default())
        .await
        .unwrap();
    let mut wait = Wait::new();
    while ic_e2e::http_get(http, "/ready").0 != 200 {
        wait.still(|| "ready after the push".into());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(server.stop().success());
}

/// (replica, matched blocks, speculative) of every candidate, sorted.
type Holders = Vec<(String, u32, bool)>;

async fn holders(grpc_port: u16, tokens: &[u32], candidates: &[&str], observe: bool) -> Holders {
    let mut client = IndexServiceClient::connect(fleet::url(grpc_port))
        .await
        .unwrap();
    let mut request = ic_e2e::ingest::token_lookup(TENANT, MODEL, tokens.to_vec());
    request.observe_only = observe;
    request.candidate_replicas = candidates.iter().map(|c| (*c).to_owned()).collect();
    let r = client.lookup_route(request).await.unwrap().into_inner();
    let mut out: Holders = r
        .candidates
        .iter()
        .filter(|c| c.matched_blocks > 0)
        .map(|c| {
            (
                c.replica
                    .as_ref()
                    .map_or(String::new(), |r| r.replica_id.clone()),
                c.matched_blocks,
                c.speculative,
            )
        })
        .collect();
    out.sort();
    out
}

/// The bounded divergence of docs/scaling.md ("What stays per replica"):
/// a pick through replica A for a prompt nobody holds makes A count the
/// engine as its speculative holder; replica B, which shares A's load but
/// not its speculation, does not. Once the engine stores the prompt and
/// its events reach both replicas, they answer alike, the holder real —
/// with a speculative TTL far longer than the test, so the events, not
/// the expiry, end it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_speculative_holder_stays_on_its_replica_until_the_engines_events_arrive() {
    let ports = [free_port(), free_port()];
    let urls = ports
        .iter()
        .map(|p| fleet::url(*p))
        .collect::<Vec<_>>()
        .join(",");
    let mut replicas: Vec<ServiceProcess> = ports
        .iter()
        .map(|p| replica_with(*p, &urls, &["--speculative-ttl-ms", "600000"]))
        .collect();
    let https: Vec<SocketAddr> = replicas.iter_mut().map(|r| r.admin_addr()).collect();
    let (mut engines, sidecars) = fleet::fleet(2, &urls, &[]).await;
    engines[0].store(2).await;
    engines[1].store(2).await;
    for (port, http) in ports.iter().zip(&https) {
        converge(*port, *http, &engines, "at start").await;
    }
    // The prompt engine-0 will store next; nobody holds it yet.
    let chain = engines[0].next_chain;
    let prompt = engines[0].tokens(chain, 4);
    let holder = engines[0].replica.clone();
    for port in ports {
        assert_eq!(
            holders(port, &prompt, &[], true).await,
            vec![],
            "cold at start"
        );
    }
    // A gateway asks replica A, naming engine-0 as its only candidate, and
    // sends the request there.
    holders(ports[0], &prompt, &[holder.as_str()], false).await;
    let speculative = vec![(holder.clone(), 4, true)];
    assert_eq!(
        holders(ports[0], &prompt, &[], true).await,
        speculative,
        "A counts its pick as a speculative holder"
    );
    // B has since accepted a report A built after the pick (A sends one
    // at a time: the second report counted from now was built after the
    // first returned), and still does not know of it.
    let before = reports_received(https[1]);
    let mut wait = Wait::new();
    while reports_received(https[1]) < before + 2.0 {
        wait.still(|| format!("B's reports from A: {before} before the pick"));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        holders(ports[1], &prompt, &[], true).await,
        vec![],
        "B holds no speculation of A's pick (the divergence)"
    );
    // The engine prefills the prompt: its events reach both replicas.
    engines[0].store(4).await;
    assert_eq!(engines[0].newest().unwrap().0, prompt);
    let real = vec![(holder.clone(), 4, false)];
    let started = Instant::now();
    let mut wait = Wait::new();
    loop {
        let a = holders(ports[0], &prompt, &[], true).await;
        let b = holders(ports[1], &prompt, &[], true).await;
        if a == real && b == real {
            break;
        }
        wait.still(|| format!("the real holder on both: A {a:?}, B {b:?}"));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    eprintln!(
        "speculative divergence ended {} ms after the engine stored the prompt",
        started.elapsed().as_millis()
    );
    for mut sidecar in sidecars {
        assert!(sidecar.stop().success());
    }
    for mut r in replicas {
        assert!(r.stop().success());
    }
}
