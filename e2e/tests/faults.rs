//! Fault injection with the real binaries on loopback: engines publishing
//! the real vLLM wire, the real `ic-kvevent-subscriber` sidecars and the real
//! `ic-index-server`, each killed, frozen, restarted or flooded while
//! traffic flows. Every scenario ends with the index equal to what the
//! engines hold (its `/snapshot` block count per replica and a full-length
//! `LookupRoute` match on each engine's newest prompt).
//!
//! The times measured (convergence after an index-server restart, say) are
//! printed as `fault figure:` lines for docs/reliability.md; nothing here
//! asserts a duration beyond a generous "it converges at all" deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ic_e2e::{ServiceProcess, http_get, workspace_binary};
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use nix::sys::signal::Signal;

#[path = "support/fleet.rs"]
mod fleet;

use fleet::{
    BLOCK, CONVERGE, MODEL, TENANT, converge, figure, metric, rounds, snapshot_blocks, subscriber,
};

/// Stops the sidecars and the server; each must exit cleanly.
fn stop_all(sidecars: Vec<ServiceProcess>, mut server: ServiceProcess) {
    for mut sidecar in sidecars {
        assert!(sidecar.stop().success());
    }
    assert!(server.stop().success());
}

/// An index server on `grpc_port` (0: the OS picks; read it back with
/// `addr("grpc")`), so a restart can take the port the first one bound.
fn index_server(grpc_port: u16, extra: &[&str]) -> ServiceProcess {
    let grpc = format!("127.0.0.1:{grpc_port}");
    let mut args = vec!["--http-addr", "127.0.0.1:0", "--grpc-addr", &grpc];
    args.extend_from_slice(extra);
    let mut server = ServiceProcess::start(&workspace_binary("ic-index-server"), &args);
    server.addr("grpc");
    server
}

/// kill -9 of the index server while engines publish; a new one on the
/// same port starts empty and every subscriber resyncs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_server_killed_under_load_is_rebuilt_by_the_subscribers() {
    let mut server = index_server(0, &[]);
    let port = server.addr("grpc").port();
    let (mut engines, mut sidecars) = fleet::fleet(3, &fleet::url(port), &[]).await;
    rounds(&mut engines, 20).await;
    let http = server.admin_addr();
    converge(port, http, &engines, "before the kill").await;

    server.signal(Signal::SIGKILL);
    assert!(!server.wait_exit().success());
    // The engines go on while no index server runs.
    rounds(&mut engines, 20).await;
    let mut restarted = index_server(port, &[]);
    let http = restarted.admin_addr();
    let started = Instant::now();
    // ... and while the new one is being resynced.
    for _ in 0..10 {
        for engine in &mut engines {
            engine.round().await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    converge(port, http, &engines, "after the restart").await;
    figure(
        "index-server kill -9, 3 replicas",
        format!(
            "converged {} ms after the restart",
            started.elapsed().as_millis()
        ),
    );
    for sidecar in &mut sidecars {
        let admin = sidecar.admin_addr();
        assert!(metric(admin, "inferencecache_subscriber_forward_connects_total") >= 2.0);
    }
    stop_all(sidecars, restarted);
}

/// kill -9 of one sidecar: the index keeps the replica's blocks meanwhile;
/// its replacement rebuilds the engine's state from the replay buffer, with
/// what the engine did while no sidecar watched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscriber_is_replaced_and_the_replica_is_whole_again() {
    let mut server = index_server(0, &[]);
    let port = server.addr("grpc").port();
    let http = server.admin_addr();
    let (mut engines, mut sidecars) = fleet::fleet(2, &fleet::url(port), &[]).await;
    rounds(&mut engines, 15).await;
    converge(port, http, &engines, "before the kill").await;
    let before = snapshot_blocks(http).unwrap();

    sidecars[0].signal(Signal::SIGKILL);
    assert!(!sidecars[0].wait_exit().success());
    // The other replica's state is untouched and the dead sidecar's replica
    // keeps its blocks (routing hints stay useful through a sidecar restart).
    assert_eq!(snapshot_blocks(http).unwrap(), before);
    rounds(&mut engines, 10).await;
    sidecars[0] = subscriber(&engines[0], &fleet::url(port), &[]);
    engines[0].engine.wait_for_subscriber().await;
    let took = converge(port, http, &engines, "after the replacement").await;
    figure(
        "subscriber kill -9",
        format!(
            "replica whole {} ms after the new sidecar subscribed",
            took.as_millis()
        ),
    );
    stop_all(sidecars, server);
}

/// The index server frozen (SIGSTOP) for longer than the sidecar's queue
/// holds: the sidecar drops what does not fit and counts it, never blocks
/// the engine, and after SIGCONT resyncs the full state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_index_server_costs_counted_drops_and_a_resync() {
    let mut server = index_server(0, &[]);
    let port = server.addr("grpc").port();
    let http = server.admin_addr();
    let (mut engines, mut sidecars) =
        fleet::fleet(1, &fleet::url(port), &["--queue-capacity", "32"]).await;
    for _ in 0..5 {
        engines[0].round().await;
    }
    converge(port, http, &engines, "before the freeze").await;
    let admin = sidecars[0].admin_addr();

    // Returns once every thread of the server has stopped: `kill` returns
    // before that, and a server still running would take batches meanwhile.
    server.freeze();
    let frozen = Instant::now();
    // Far more batches than the queue, HTTP/2 windows and socket buffers hold.
    let rounds = 400;
    for _ in 0..rounds {
        engines[0].round().await;
    }
    let decoded_before = metric(admin, "inferencecache_subscriber_batches_decoded_total");
    let deadline = Instant::now() + CONVERGE;
    while metric(admin, "inferencecache_subscriber_queue_dropped_total") == 0.0 {
        assert!(
            Instant::now() < deadline,
            "the sidecar never dropped while the index server was frozen (decoded {decoded_before})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let dropped = metric(admin, "inferencecache_subscriber_queue_dropped_total");
    assert!(metric(admin, "inferencecache_subscriber_queue_depth") <= 32.0);
    server.thaw();
    let thawed = Instant::now();
    let took = converge(port, http, &engines, "after SIGCONT").await;
    figure(
        "index server SIGSTOP, queue 32",
        format!(
            "frozen {} ms, {dropped} batches dropped and counted, whole {} ms after SIGCONT",
            thawed.duration_since(frozen).as_millis(),
            took.as_millis()
        ),
    );
    assert!(sidecars[0].stop().success());
    assert!(server.stop().success());
}

/// An engine restarting mid-stream (its sequence starts over, its cache is
/// empty): the index drops what the old process held and follows the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restart_mid_stream_replaces_the_replicas_state() {
    let mut server = index_server(0, &[]);
    let port = server.addr("grpc").port();
    let http = server.admin_addr();
    let (mut engines, sidecars) = fleet::fleet(2, &fleet::url(port), &[]).await;
    rounds(&mut engines, 10).await;
    converge(port, http, &engines, "before the restart").await;
    engines[1].restart();
    rounds(&mut engines, 3).await;
    let took = converge(port, http, &engines, "after the engine restart").await;
    figure(
        "engine restart mid-stream",
        format!("index follows the new process in {} ms", took.as_millis()),
    );
    stop_all(sidecars, server);
}

/// Index entries (the `--capacity-entries` bound) and the index's own heap
/// accounting summed over its parts.
fn index_memory(http: SocketAddr) -> (f64, f64) {
    (
        metric(http, "inferencecache_index_entries"),
        metric(http, "inferencecache_index_memory_bytes"),
    )
}

fn memory_parts(http: SocketAddr) -> String {
    let (_, text) = http_get(http, "/metrics");
    text.lines()
        .filter(|l| l.starts_with("inferencecache_index_memory_bytes{"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A flood of stored blocks twenty times the index's capacity, from ten
/// engines' streams: resident entries stay at the bound, the index's memory within
/// 10 % of what it holds when merely full, and lookups keep answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_far_above_capacity_stays_within_the_memory_budget_and_lookups_answer() {
    use ic_e2e::ingest::{Replica, ingest, resync, stored};
    const CAPACITY: u64 = 100_000;
    // Ten engines, each streaming 200 k new blocks (a hundred batches of 2 k).
    const FLOOD_REPLICAS: u64 = 10;
    const BATCHES: u64 = 100;
    const PER_BATCH: u64 = 2_000;
    const RESYNC_BEYOND_CAPACITY: u64 = CAPACITY + CAPACITY / 5;
    let capacity = CAPACITY.to_string();
    let mut server = index_server(0, &["--capacity-entries", &capacity]);
    let port = server.addr("grpc").port();
    let http = server.admin_addr();
    let grpc = format!("http://127.0.0.1:{port}");
    let fingerprints = |replica: u64, n: u64| -> Vec<u64> {
        // Distinct, well-spread values (splitmix64 of a counter).
        (0..n)
            .map(|i| {
                let mut z = (replica << 32 | i).wrapping_add(0x9e37_79b9_7f4a_7c15);
                z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                z ^ (z >> 31)
            })
            .collect()
    };
    fn replica(id: &str) -> Replica<'_> {
        Replica {
            tenant: TENANT,
            model: MODEL,
            replica_id: id,
            address: "10.0.0.1:8000",
            dp_rank: 0,
        }
    }
    // Merely full: exactly the capacity, from one replica.
    ingest(
        &grpc,
        resync(
            &replica("full"),
            vec![stored(fingerprints(1000, CAPACITY), BLOCK, pb::Tier::T1)],
        ),
    )
    .await;
    let (entries, full_bytes) = index_memory(http);
    assert_eq!(entries, CAPACITY as f64);
    let parts_full = memory_parts(http);
    let rss_full = metric(http, "process_resident_memory_bytes");

    // Lookups run throughout the flood.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let lookups = tokio::spawn({
        let (grpc, stop) = (grpc.clone(), stop.clone());
        async move {
            let mut client = IndexServiceClient::connect(grpc).await.unwrap();
            let (mut answered, mut slowest) = (0u64, Duration::ZERO);
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let started = Instant::now();
                client
                    .lookup_route(ic_e2e::ingest::token_lookup(
                        TENANT,
                        MODEL,
                        (0..64 * BLOCK).collect(),
                    ))
                    .await
                    .unwrap_or_else(|e| panic!("a lookup failed during the flood: {e}"));
                slowest = slowest.max(started.elapsed());
                answered += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (answered, slowest)
        }
    });
    let flood_started = Instant::now();
    let mut client = IndexServiceClient::connect(grpc.clone()).await.unwrap();
    for r in 0..FLOOD_REPLICAS {
        let id = format!("flood-{r}");
        let all = fingerprints(r, BATCHES * PER_BATCH);
        // Each stream opens with a resync, the rest deltas. The first
        // stream's resync is larger than the whole index (in batches of
        // 20 k); the others' is one batch.
        let (resync_blocks, resync_batch) = if r == 0 {
            (RESYNC_BEYOND_CAPACITY, 20_000)
        } else {
            (PER_BATCH, PER_BATCH)
        };
        let (opening, rest) = all.split_at(resync_blocks as usize);
        let chunks: Vec<&[u64]> = opening
            .chunks(resync_batch as usize)
            .chain(rest.chunks(PER_BATCH as usize))
            .collect();
        let resync_batches = resync_blocks.div_ceil(resync_batch);
        let batches: Vec<pb::IngestBatch> = chunks
            .iter()
            .zip(1u64..)
            .map(|(chunk, seq)| {
                let mut batch = resync(
                    &replica(&id),
                    vec![stored(chunk.to_vec(), BLOCK, pb::Tier::T1)],
                );
                batch.seq = seq;
                batch.resync_begin = seq == 1;
                batch.resync_end = seq == resync_batches;
                batch
            })
            .collect();
        let sent = batches.len() as u64;
        let ack = client
            .ingest_events(futures::stream::iter(batches))
            .await
            .unwrap_or_else(|e| panic!("IngestEvents of {id} failed: {e}"))
            .into_inner();
        assert!(
            !ack.resync_required && ack.last_applied_seq == sent,
            "{id}: {ack:?}"
        );
    }
    let flood_took = flood_started.elapsed();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (answered, slowest) = lookups.await.unwrap();
    assert!(answered > 0, "no lookup ran during the flood");

    let (entries, flooded_bytes) = index_memory(http);
    assert!(
        entries <= CAPACITY as f64,
        "{entries} entries resident, capacity {CAPACITY}"
    );
    assert!(
        metric(http, "inferencecache_index_capacity_evictions_total")
            >= (FLOOD_REPLICAS * BATCHES * PER_BATCH) as f64 - CAPACITY as f64,
    );
    assert!(
        flooded_bytes <= full_bytes * 1.10,
        "index memory {flooded_bytes} B after the flood, {full_bytes} B when merely full: {} / {parts_full}",
        memory_parts(http)
    );
    let rss_flooded = metric(http, "process_resident_memory_bytes");
    figure(
        "flood into a bounded index",
        format!(
            "{} blocks ({FLOOD_REPLICAS} streams of {BATCHES} x {PER_BATCH}, one opening with a {RESYNC_BEYOND_CAPACITY}-block resync) into {CAPACITY} entries in {} ms; index memory {full_bytes} B full, {flooded_bytes} B after ({:.1} %); RSS {:.1} MiB -> {:.1} MiB; {answered} lookups answered meanwhile, slowest {} ms",
            FLOOD_REPLICAS * BATCHES * PER_BATCH,
            flood_took.as_millis(),
            (flooded_bytes / full_bytes - 1.0) * 100.0,
            rss_full / 1_048_576.0,
            rss_flooded / 1_048_576.0,
            slowest.as_millis()
        ),
    );
    assert!(server.stop().success());
}

/// Writes a request line, then one header byte every 2 s (never idle for
/// the idle timer), until the server closes the connection; the bytes
/// trickled before the close, or `None` if it never closed within 30.
fn trickle_headers(addr: SocketAddr) -> Option<usize> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let mut buf = [0u8; 1024];
    for sent in 0..30 {
        if conn.write_all(b"X").is_err() {
            return Some(sent);
        }
        match conn.read(&mut buf) {
            // Closed (possibly after a 408): cut.
            Ok(_) => return Some(sent + 1),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return Some(sent + 1),
        }
    }
    None
}

/// A client trickling one header byte every 2 s keeps a connection alive
/// past any idle timer; the header-read deadline
/// (`--header-read-timeout-seconds`) cuts it, on the index server's HTTP
/// port, the coordinator and a subscriber's admin port, and counts it.
#[test]
fn a_client_trickling_its_headers_is_cut_by_the_header_deadline() {
    let mut index = index_server(0, &["--header-read-timeout-seconds", "3"]);
    let http = index.admin_addr();
    let mut coordinator = ServiceProcess::start(
        &workspace_binary("ic-coordinator"),
        &[
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--header-read-timeout-seconds",
            "3",
        ],
    );
    let coordinator_http = coordinator.admin_addr();
    // A subscriber's admin port (no engine needed: ZMQ connects lazily).
    let engine_port = ic_e2e::free_port().to_string();
    let engine_endpoint = format!("tcp://127.0.0.1:{engine_port}");
    let mut subscriber = ServiceProcess::start(
        &workspace_binary("ic-kvevent-subscriber"),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--engine-endpoint",
            &engine_endpoint,
            "--index-server",
            "http://127.0.0.1:9",
            "--model-id",
            fleet::MODEL,
            "--replica-id",
            "engine-0",
            "--tenant",
            fleet::TENANT,
            "--address",
            "10.0.0.0:8000",
            "--header-read-timeout-seconds",
            "3",
        ],
    );
    let subscriber_http = subscriber.admin_addr();
    for (name, addr, counter) in [
        (
            "index server",
            http,
            "inferencecache_index_header_read_timeouts_total",
        ),
        (
            "coordinator",
            coordinator_http,
            "lmcache_coordinator_header_read_timeouts_total",
        ),
        (
            "subscriber admin port",
            subscriber_http,
            "inferencecache_subscriber_header_read_timeouts_total",
        ),
    ] {
        let sent = trickle_headers(addr);
        assert!(sent.is_some(), "the {name} never cut a trickling client");
        figure(
            &format!("{name} header deadline 3 s, one byte per 2 s"),
            format!("cut after {} bytes", sent.unwrap_or(0)),
        );
        assert_eq!(metric(addr, counter), 1.0, "{name}");
        // An ordinary request on a fresh connection is served.
        assert_eq!(http_get(addr, "/metrics").0, 200, "{name}");
    }
    assert!(index.stop().success());
    assert!(coordinator.stop().success());
    assert!(subscriber.stop().success());
}
