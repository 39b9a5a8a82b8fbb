//! Hostile IngestEvents clients against the real binary: every bound is
//! reached, refused with RESOURCE_EXHAUSTED or DEADLINE_EXCEEDED naming its
//! flag, counted in `ingest_refused_total{reason}`, and loses nothing the
//! server had already accepted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use ic_e2e::ServiceProcess;
use ic_e2e::ingest::{Replica, resync, stored};
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

fn start(extra: &[&str]) -> (ServiceProcess, String, SocketAddr) {
    let mut args = vec!["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut p = ServiceProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-index-server")),
        &args,
    );
    let grpc = format!("http://{}", p.addr("grpc"));
    let admin = p.admin_addr();
    (p, grpc, admin)
}

async fn metrics(admin: SocketAddr) -> String {
    reqwest::get(format!("http://{admin}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The value of `series` (name and labels, as /metrics writes them).
async fn metric_value(admin: SocketAddr, series: &str) -> Option<f64> {
    ic_e2e::metric_value(&metrics(admin).await, series)
}

async fn refused(admin: SocketAddr, reason: &str) -> f64 {
    let series = format!("inferencecache_index_ingest_refused_total{{reason=\"{reason}\"}}");
    metric_value(admin, &series).await.unwrap_or(0.0)
}

const GOOD: Replica<'static> = Replica {
    tenant: "team-a",
    model: "m",
    replica_id: "good",
    address: "10.0.0.1:8000",
    dp_rank: 0,
};

/// A stream the test feeds by hand; the call's outcome arrives on the
/// returned task.
async fn open_stream(
    grpc: &str,
) -> (
    mpsc::Sender<pb::IngestBatch>,
    tokio::task::JoinHandle<Result<pb::IngestAck, tonic::Status>>,
) {
    let mut client = IndexServiceClient::connect(grpc.to_owned()).await.unwrap();
    let (tx, rx) = mpsc::channel(16);
    let call = tokio::spawn(async move {
        client
            .ingest_events(ReceiverStream::new(rx))
            .await
            .map(tonic::Response::into_inner)
    });
    (tx, call)
}

async fn prefix_count(admin: SocketAddr, replica: &str) -> Option<u64> {
    let snapshot: serde_json::Value = reqwest::get(format!("http://{admin}/snapshot"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    snapshot["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["replicaId"] == replica)
        .map(|r| r["prefixCount"].as_u64().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_that_never_ends_is_cut_at_its_bound_and_keeps_what_was_accepted() {
    let (_p, grpc, admin) = start(&[
        // A 100-block event is charged 896 bytes, a 900-block one 7,296.
        "--max-stream-resync-bytes=10000",
        "--resync-budget-bytes=12000",
    ]);
    ic_e2e::ingest::ingest(
        &grpc,
        resync(&GOOD, vec![stored(vec![1, 2, 3], 16, pb::Tier::T1)]),
    )
    .await;

    // Opens a resync and keeps sending 100-block batches without ending it.
    let (tx, call) = open_stream(&grpc).await;
    let hostile = Replica {
        replica_id: "hostile",
        ..GOOD
    };
    let mut first = resync(&hostile, vec![stored((0..100).collect(), 16, pb::Tier::T1)]);
    first.resync_end = false;
    tx.send(first.clone()).await.unwrap();
    for seq in 2..=50u64 {
        let mut next = first.clone();
        next.seq = seq;
        next.resync_begin = false;
        let start = seq * 100;
        next.events = vec![stored((start..start + 100).collect(), 16, pb::Tier::T1)];
        if tx.send(next).await.is_err() {
            break;
        }
    }
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("--max-stream-resync-bytes"),
        "{status:?}"
    );
    assert_eq!(refused(admin, "stream_resync_bytes").await, 1.0);
    // Nothing of the unfinished resync was applied; the good replica is
    // intact and the server still takes new streams.
    assert_eq!(prefix_count(admin, "hostile").await, None);
    assert_eq!(prefix_count(admin, "good").await, Some(3));
    let other = Replica {
        replica_id: "later",
        ..GOOD
    };
    ic_e2e::ingest::ingest(
        &grpc,
        resync(&other, vec![stored(vec![7], 16, pb::Tier::T1)]),
    )
    .await;

    // Two streams that each stay under their own bound still share the
    // server's budget: the second is refused when the budget is spent.
    let (tx_a, call_a) = open_stream(&grpc).await;
    let (tx_b, call_b) = open_stream(&grpc).await;
    let mut a = resync(
        &Replica {
            replica_id: "a",
            ..GOOD
        },
        vec![stored((0..900).collect(), 16, pb::Tier::T1)],
    );
    a.resync_end = false;
    tx_a.send(a).await.unwrap();
    // Wait until the first buffer is charged before the second asks.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut b = resync(
        &Replica {
            replica_id: "b",
            ..GOOD
        },
        vec![stored((0..900).collect(), 16, pb::Tier::T1)],
    );
    b.resync_end = false;
    tx_b.send(b).await.unwrap();
    let status = call_b.await.unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("resync buffer"), "{status:?}");
    assert_eq!(refused(admin, "resync_budget_bytes").await, 1.0);
    drop(tx_a);
    // The first stream ends without finishing its resync: nothing applied.
    call_a.await.unwrap().unwrap();
    assert_eq!(prefix_count(admin, "a").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_streams_time_out_and_streams_are_capped_per_client() {
    let (_p, grpc, admin) = start(&[
        "--ingest-idle-timeout-seconds=1",
        "--max-ingest-streams-per-client=2",
    ]);
    let (_tx1, call1) = open_stream(&grpc).await;
    let (_tx2, call2) = open_stream(&grpc).await;
    // Let both be admitted before the third arrives.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_tx3, call3) = open_stream(&grpc).await;
    let third = call3.await.unwrap().unwrap_err();
    assert_eq!(third.code(), tonic::Code::ResourceExhausted, "{third:?}");
    assert!(
        third.message().contains("--max-ingest-streams-per-client"),
        "{third:?}"
    );
    // The two admitted streams never send: both are closed after a second.
    for call in [call1, call2] {
        let status = tokio::time::timeout(Duration::from_secs(10), call)
            .await
            .expect("an idle stream stayed open")
            .unwrap()
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        assert!(
            status.message().contains("--ingest-idle-timeout-seconds"),
            "{status:?}"
        );
    }
    assert_eq!(refused(admin, "idle").await, 2.0);
    assert_eq!(refused(admin, "streams_per_client").await, 1.0);
    // Their slots are free again.
    ic_e2e::ingest::ingest(
        &grpc,
        resync(&GOOD, vec![stored(vec![1], 16, pb::Tier::T1)]),
    )
    .await;
    assert_eq!(prefix_count(admin, "good").await, Some(1));
}

/// Resident set size of process `pid`, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kb * 1024
}

/// The worst-shaped resync: two streams each open a resync and never end
/// it, sending only one-block removals and clears (no fingerprint for the
/// index, and yet each costs a buffered change). With the default bounds
/// each stream is cut at `--max-stream-resync-bytes` and the server's RSS
/// grows by less than `--resync-budget-bytes`; counted in blocks, the same
/// flood passed 1 GiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_endless_resyncs_of_removals_stay_within_the_byte_budget() {
    const EVENTS_PER_BATCH: u64 = 4096;
    // Each stream may send up to 3 M events (far past its share).
    const MAX_BATCHES: u64 = 3_000_000 / EVENTS_PER_BATCH;
    let (p, grpc, admin) = start(&[]);
    let pid = p.pid();
    let base = rss_bytes(pid);
    let removals = |seq: u64| -> Vec<pb::IndexEvent> {
        (0..EVENTS_PER_BATCH)
            .map(|i| {
                let kind = if i % 2 == 0 {
                    pb::index_event::Kind::Evicted(pb::BlocksEvicted {
                        fingerprints: vec![seq * EVENTS_PER_BATCH + i],
                        at_unix_ms: 0,
                    })
                } else {
                    pb::index_event::Kind::Cleared(pb::ReplicaCleared {
                        tier: pb::Tier::T1 as i32,
                        at_unix_ms: 0,
                    })
                };
                pb::IndexEvent { kind: Some(kind) }
            })
            .collect()
    };
    let mut streams = Vec::new();
    for id in ["flood-a", "flood-b"] {
        let (tx, call) = open_stream(&grpc).await;
        let replica = Replica {
            replica_id: id,
            ..GOOD
        };
        let mut first = resync(&replica, removals(0));
        first.resync_end = false;
        tx.send(first.clone()).await.unwrap();
        streams.push((Some(tx), call, first));
    }
    let mut peak = base;
    for seq in 1..MAX_BATCHES {
        for (tx, call, first) in &mut streams {
            let Some(sender) = tx else { continue };
            let mut next = first.clone();
            next.seq = first.seq + seq;
            next.resync_begin = false;
            next.events = removals(seq);
            if call.is_finished() || sender.send(next).await.is_err() {
                *tx = None;
            }
        }
        if seq % 16 == 0 {
            peak = peak.max(rss_bytes(pid));
        }
        if streams.iter().all(|(tx, ..)| tx.is_none()) {
            break;
        }
    }
    peak = peak.max(rss_bytes(pid));
    for (tx, call, _) in streams {
        drop(tx);
        let status = call.await.unwrap().unwrap_err();
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(
            status.message().contains("--max-stream-resync-bytes"),
            "{status:?}"
        );
    }
    let budget = ic_index::ingest::DEFAULT_RESYNC_BUDGET_BYTES;
    eprintln!(
        "resync flood: RSS {} MiB -> peak {} MiB (budget {} MiB)",
        base >> 20,
        peak >> 20,
        budget >> 20
    );
    assert!(
        peak - base < budget,
        "RSS grew {} MiB, past the {} MiB resync budget",
        (peak - base) >> 20,
        budget >> 20
    );
    assert_eq!(refused(admin, "stream_resync_bytes").await, 2.0);
    assert_eq!(prefix_count(admin, "flood-a").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_ranks_past_their_bounds_end_the_stream_and_keep_what_was_applied() {
    let (_p, grpc, admin) = start(&["--max-ingest-name-bytes=64", "--max-dp-ranks=4"]);
    // One stream: a good resync, then a batch whose model is 1 MiB long.
    let (tx, call) = open_stream(&grpc).await;
    tx.send(resync(&GOOD, vec![stored(vec![1, 2, 3], 16, pb::Tier::T1)]))
        .await
        .unwrap();
    let long = "m".repeat(1 << 20);
    let mut next = resync(
        &Replica {
            model: &long,
            ..GOOD
        },
        vec![stored(vec![4], 16, pb::Tier::T1)],
    );
    next.resync_begin = false;
    next.resync_end = false;
    next.seq = 2;
    tx.send(next).await.unwrap();
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("replica.scope.model: 1048576 bytes")
            && status.message().contains("--max-ingest-name-bytes"),
        "{status:?}"
    );
    assert_eq!(refused(admin, "name_bytes").await, 1.0);
    assert_eq!(prefix_count(admin, "good").await, Some(3));

    // A rank at the bound is refused before it takes a replica slot.
    let (tx, call) = open_stream(&grpc).await;
    let ranked = |dp_rank| Replica {
        replica_id: "ranked",
        dp_rank,
        ..GOOD
    };
    tx.send(resync(&ranked(3), vec![stored(vec![5], 16, pb::Tier::T1)]))
        .await
        .unwrap();
    tx.send(resync(&ranked(4), vec![stored(vec![6], 16, pb::Tier::T1)]))
        .await
        .unwrap();
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("replica.dp_rank: 4 is not below 4 (--max-dp-ranks)"),
        "{status:?}"
    );
    assert_eq!(refused(admin, "dp_ranks").await, 1.0);
    assert_eq!(prefix_count(admin, "ranked").await, Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_or_scope_past_the_index_bounds_ends_the_stream_and_takes_nothing() {
    let (_p, grpc, admin) = start(&["--max-replicas=2", "--max-scopes=2"]);
    let named = |replica_id, model| Replica {
        replica_id,
        model,
        ..GOOD
    };
    for (id, model) in [("a", "m1"), ("b", "m2")] {
        let (tx, call) = open_stream(&grpc).await;
        tx.send(resync(
            &named(id, model),
            vec![stored(vec![1, 2], 16, pb::Tier::T1)],
        ))
        .await
        .unwrap();
        drop(tx);
        call.await.unwrap().unwrap();
    }
    // The status a stream ends with after a resync of `replica`.
    let ended = |replica: Replica<'static>, fp: u64| {
        let grpc = grpc.clone();
        async move {
            let (tx, call) = open_stream(&grpc).await;
            tx.send(resync(&replica, vec![stored(vec![fp], 16, pb::Tier::T1)]))
                .await
                .unwrap();
            call.await.unwrap().unwrap_err()
        }
    };
    // A third replica: refused whole, and the stream ends (its subscriber
    // must not take the batch for applied).
    let status = ended(named("c", "m1"), 3).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("replica.replica_id: \"c\" rank 0")
            && status.message().contains("--max-replicas"),
        "{status:?}"
    );
    assert_eq!(refused(admin, "replicas").await, 1.0);
    assert_eq!(prefix_count(admin, "c").await, None);

    // A known replica moving to a third scope: refused, keeps what it held.
    let status = ended(named("a", "m3"), 4).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().starts_with("replica.scope: model \"m3\"")
            && status.message().contains("--max-scopes"),
        "{status:?}"
    );
    assert_eq!(refused(admin, "scopes").await, 1.0);
    assert_eq!(prefix_count(admin, "a").await, Some(2));
    assert_eq!(prefix_count(admin, "b").await, Some(2));
    // How close to the bounds, as /metrics says it.
    let page = metrics(admin).await;
    for line in [
        "inferencecache_index_replicas_known 2",
        "inferencecache_index_max_replicas 2",
        "inferencecache_index_scopes_known 2",
        "inferencecache_index_max_scopes 2",
    ] {
        assert!(page.lines().any(|l| l == line), "{line} not in {page}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_past_the_grpc_bound_are_refused_and_counted() {
    let (_p, grpc, admin) = start(&["--grpc-max-message-bytes=4096"]);
    let counted = || metric_value(admin, "inferencecache_index_grpc_messages_refused_total");
    assert_eq!(counted().await, Some(0.0));
    let mut client = IndexServiceClient::connect(grpc.clone()).await.unwrap();
    let lookup = |n| pb::LookupRouteRequest {
        scope: Some(pb::IndexScope {
            tenant: "team-a".into(),
            model: "m".into(),
            hash_scheme: pb::HashScheme::Vllm as i32,
            adapter: String::new(),
        }),
        key: Some(pb::lookup_route_request::Key::BlockHashes(
            pb::BlockHashes { hashes: vec![7; n] },
        )),
        ..Default::default()
    };
    client.lookup_route(lookup(100)).await.unwrap();
    let status = client.lookup_route(lookup(1000)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains("the limit is: 4096 bytes"),
        "{status:?}"
    );
    assert_eq!(counted().await, Some(1.0));

    // A batch past it ends its stream; what came before stays.
    let (tx, call) = open_stream(&grpc).await;
    tx.send(resync(&GOOD, vec![stored(vec![1, 2], 16, pb::Tier::T1)]))
        .await
        .unwrap();
    let mut big = resync(&GOOD, vec![stored((3..1000).collect(), 16, pb::Tier::T1)]);
    big.resync_begin = false;
    big.resync_end = false;
    big.seq = 2;
    tx.send(big).await.unwrap();
    let status = call.await.unwrap().unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert_eq!(counted().await, Some(2.0));
    assert_eq!(prefix_count(admin, "good").await, Some(2));
}

/// `/ready`'s status, polled until it is `want` (or 5 s pass).
async fn ready_becomes(admin: SocketAddr, want: u16) -> u16 {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let status = reqwest::get(format!("http://{admin}/ready"))
            .await
            .unwrap()
            .status()
            .as_u16();
        if status == want || std::time::Instant::now() > deadline {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_that_never_ends_holds_readiness_back_only_within_its_wait() {
    let started = std::time::Instant::now();
    let (_p, grpc, admin) = start(&["--ready-warmup-seconds=2", "--ready-resync-wait-seconds=4"]);
    // A resync begun during the warm-up and never ended, its stream kept
    // open (the warm-up leaves seconds for it to begin).
    let (tx, _call) = open_stream(&grpc).await;
    let mut first = resync(&GOOD, vec![stored(vec![1], 16, pb::Tier::T1)]);
    first.resync_end = false;
    tx.send(first).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "began in the warm-up"
    );
    // After the warm-up only the resync holds readiness back...
    tokio::time::sleep(Duration::from_millis(2600).saturating_sub(started.elapsed())).await;
    let status = |admin| async move {
        reqwest::get(format!("http://{admin}/ready"))
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(status(admin).await, 503);
    // ... until its wait is over, counted once.
    assert_eq!(ready_becomes(admin, 200).await, 200);
    let counted = metric_value(
        admin,
        "inferencecache_index_ready_resyncs_not_waited_for_total",
    );
    assert_eq!(counted.await, Some(1.0));
    // Ready now: another subscriber's resync does not take it out again.
    let (tx2, _call2) = open_stream(&grpc).await;
    let mut other = resync(
        &Replica {
            replica_id: "other",
            ..GOOD
        },
        vec![stored(vec![2], 16, pb::Tier::T1)],
    );
    other.resync_end = false;
    tx2.send(other).await.unwrap();
    // Readiness is published every 200 ms.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(status(admin).await, 200);
    drop((tx, tx2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rank_of_a_stream_holds_readiness_until_its_own_resync_ends() {
    let started = std::time::Instant::now();
    let (_p, grpc, admin) = start(&["--ready-warmup-seconds=2", "--ready-resync-wait-seconds=60"]);
    let rank = |dp_rank| Replica { dp_rank, ..GOOD };
    // One stream, two ranks resyncing at once; rank 0 ends first.
    let (tx, _call) = open_stream(&grpc).await;
    for r in [0, 1] {
        let mut begun = resync(
            &rank(r),
            vec![stored(vec![1 + u64::from(r)], 16, pb::Tier::T1)],
        );
        begun.resync_end = false;
        tx.send(begun).await.unwrap();
    }
    let mut ended = resync(&rank(0), vec![]);
    ended.resync_begin = false;
    ended.seq = 2;
    tx.send(ended).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "began in the warm-up"
    );
    // Past the warm-up, rank 1's resync still holds readiness back.
    tokio::time::sleep(Duration::from_millis(2800).saturating_sub(started.elapsed())).await;
    assert_eq!(ready_becomes(admin, 200).await, 503);
    let mut ended = resync(&rank(1), vec![]);
    ended.resync_begin = false;
    ended.seq = 2;
    tx.send(ended).await.unwrap();
    assert_eq!(ready_becomes(admin, 200).await, 200);
}
