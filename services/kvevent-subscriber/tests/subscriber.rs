//! The subscriber against a real ZMQ engine and a real gRPC index server on
//! loopback: exactly the right fingerprints and tiers arrive, whatever the
//! engine era, losses, restarts, malformed input or index-server outages.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use common::{FakeEngine, RecordingIndex, Subscriber, SubscriberOptions, metric, wait_until};
use ic_kvevents::encode::{Era, gpu_store, removal};
use ic_kvevents::{Fingerprint, Medium, chain_fingerprints};
use ic_proto::index_v1 as pb;

#[path = "subscriber/restarts.rs"]
mod restarts;

const WAIT: Duration = Duration::from_secs(30);
const T1: i32 = pb::Tier::T1 as i32;
const T2: i32 = pb::Tier::T2 as i32;

fn tokens(from: u32, n: u32) -> Vec<u32> {
    (from..from + n).collect()
}

/// Fingerprints of the prompt `tokens(0, 16*n)` in 16-token blocks.
fn prompt_fps(n: u32) -> Vec<u64> {
    raw_chain(&tokens(0, 16 * n), 16)
}

/// Fingerprints of `tokens` as the index's protobuf contract carries them.
fn raw_chain(tokens: &[u32], block_size: usize) -> Vec<u64> {
    Fingerprint::to_raw(chain_fingerprints(None, tokens, block_size))
}

/// Polls the subscriber's /metrics until `name` reaches `value`.
async fn wait_metric(sub: &Subscriber, name: &str, value: f64) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let m = sub.metrics().await;
        if common::metric(&m, name) >= value {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} never reached {value}:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn expect(entries: &[(u64, i32)]) -> BTreeMap<u64, i32> {
    entries.iter().copied().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_era_reaches_the_index_as_exact_fingerprints() {
    for era in [Era::VllmArray, Era::VllmMap, Era::SglangArray] {
        let index = RecordingIndex::start().await;
        let mut engine = FakeEngine::start(era, "kv-events").await;
        let scheme = if era == Era::SglangArray {
            "sglang"
        } else {
            "vllm"
        };
        let sub = Subscriber::start(
            &engine,
            &index.url(),
            SubscriberOptions {
                hash_scheme: scheme,
                topic: "kv-events".into(),
                ..Default::default()
            },
        );
        engine.wait_for_subscriber().await;
        // Engine hashes are opaque: big unsigned values and (for SGLang) negatives.
        let (h0, h1, h2) = (u64::MAX - 1, 1u64 << 63, 42u64);
        engine
            .publish(&[gpu_store(vec![h0, h1], None, tokens(0, 32), 16)])
            .await;
        engine
            .publish(&[gpu_store(vec![h2], Some(h1), tokens(32, 16), 16)])
            .await;
        let fps = prompt_fps(3);
        let all = expect(&[(fps[0], T1), (fps[1], T1), (fps[2], T1)]);
        wait_until(WAIT, &format!("{era:?} whole prompt"), || {
            index.tiers("engine-0", 0) == all
        })
        .await;
        // The leaf leaves (a parent leaving would withdraw its descendants).
        engine.publish(&[removal(vec![h2], Medium::Gpu)]).await;
        let want = expect(&[(fps[0], T1), (fps[1], T1)]);
        wait_until(WAIT, &format!("{era:?} index view"), || {
            index.tiers("engine-0", 0) == want
        })
        .await;

        let first = index.recorded.lock().unwrap().batches[0].clone();
        let replica = first.replica.as_ref().unwrap();
        let scope = replica.scope.as_ref().unwrap();
        assert_eq!(scope.tenant, "team-a");
        assert_eq!(scope.model, "test/model");
        let want_scheme = if era == Era::SglangArray {
            pb::HashScheme::Sglang
        } else {
            pb::HashScheme::Vllm
        };
        assert_eq!(scope.hash_scheme, want_scheme as i32);
        assert_eq!(replica.address, "10.0.0.7:8000");
        assert!(
            first.resync_begin && first.resync_end,
            "a connection starts with a resync"
        );
        sub.stop().await;
        index.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offload_mode_keeps_evicted_prefixes_at_t2() {
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(
        &engine,
        &index.url(),
        SubscriberOptions {
            ignore_block_removed: true,
            ..Default::default()
        },
    );
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1, 2], None, tokens(0, 32), 16)])
        .await;
    engine.publish(&[removal(vec![2], Medium::Gpu)]).await;
    let fps = prompt_fps(2);
    wait_until(WAIT, "T2 re-report", || {
        index.tiers("engine-0", 0) == expect(&[(fps[0], T1), (fps[1], T2)])
    })
    .await;
    sub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tail_left_without_its_prefix_is_withdrawn_until_the_prefix_returns() {
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(&engine, &index.url(), SubscriberOptions::default());
    engine.wait_for_subscriber().await;
    let fps = prompt_fps(3);
    engine
        .publish(&[gpu_store(vec![1, 2, 3], None, tokens(0, 48), 16)])
        .await;
    // Only the tail is offloaded to the CPU tier.
    let ic_kvevents::KvEvent::BlockStored(mut tail) =
        gpu_store(vec![3], Some(2), tokens(32, 16), 16)
    else {
        unreachable!()
    };
    tail.medium = Medium::Offload("CPU".into());
    engine
        .publish(&[ic_kvevents::KvEvent::BlockStored(tail)])
        .await;
    wait_until(WAIT, "the whole prompt at T1", || {
        index.tiers("engine-0", 0) == expect(&[(fps[0], T1), (fps[1], T1), (fps[2], T1)])
    })
    .await;
    // A GPU reset: the CPU tier keeps block 3, whose prefix is gone. The
    // index must not claim the prompt at T2.
    engine
        .publish(&[ic_kvevents::KvEvent::AllBlocksCleared])
        .await;
    wait_metric(&sub, "inferencecache_subscriber_unrooted_blocks_total", 1.0).await;
    wait_until(WAIT, "nothing held", || {
        index.tiers("engine-0", 0).is_empty()
    })
    .await;
    // The engine recomputes the prefix: the tail counts again, at T2.
    engine
        .publish(&[gpu_store(vec![1, 2], None, tokens(0, 32), 16)])
        .await;
    wait_until(WAIT, "the prefix and its tail", || {
        index.tiers("engine-0", 0) == expect(&[(fps[0], T1), (fps[1], T1), (fps[2], T2)])
    })
    .await;
    sub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_are_recovered_from_the_replay_buffer_in_both_framings() {
    for old_framing in [false, true] {
        let index = RecordingIndex::start().await;
        let mut engine = FakeEngine::start(Era::VllmMap, "").await;
        engine
            .old_replay_framing
            .store(old_framing, std::sync::atomic::Ordering::SeqCst);
        let sub = Subscriber::start(&engine, &index.url(), SubscriberOptions::default());
        engine.wait_for_subscriber().await;
        engine
            .publish(&[gpu_store(vec![1], None, tokens(0, 16), 16)])
            .await;
        engine.publish_lost(&[gpu_store(vec![2], Some(1), tokens(16, 16), 16)]);
        engine.publish_lost(&[gpu_store(vec![3], Some(2), tokens(32, 16), 16)]);
        engine
            .publish(&[gpu_store(vec![4], Some(3), tokens(48, 16), 16)])
            .await;
        let fps = prompt_fps(4);
        let want = expect(&[(fps[0], T1), (fps[1], T1), (fps[2], T1), (fps[3], T1)]);
        wait_until(WAIT, "replayed chain", || {
            index.tiers("engine-0", 0) == want
        })
        .await;
        assert_eq!(
            sub.metric("inferencecache_subscriber_seq_gaps_total").await,
            1.0
        );
        assert_eq!(
            sub.metric("inferencecache_subscriber_replayed_batches_total")
                .await,
            2.0
        );
        assert_eq!(
            sub.metric("inferencecache_subscriber_lost_batches_total")
                .await,
            0.0
        );
        sub.stop().await;
        index.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_stalls_part_way_keeps_what_it_delivered() {
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(
        &engine,
        &index.url(),
        SubscriberOptions {
            replay_timeout_ms: Some(300),
            ..Default::default()
        },
    );
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1], None, tokens(0, 16), 16)])
        .await;
    // Three batches lost live; the replay delivers the first, then stalls.
    engine
        .replay_stalls_after
        .store(1, std::sync::atomic::Ordering::SeqCst);
    engine.publish_lost(&[gpu_store(vec![2], Some(1), tokens(16, 16), 16)]);
    engine.publish_lost(&[gpu_store(vec![3], Some(2), tokens(32, 16), 16)]);
    engine.publish_lost(&[gpu_store(vec![4], Some(3), tokens(48, 16), 16)]);
    engine
        .publish(&[gpu_store(vec![9], None, tokens(1000, 16), 16)])
        .await;
    wait_metric(&sub, "inferencecache_subscriber_lost_batches_total", 2.0).await;
    assert_eq!(
        sub.metric("inferencecache_subscriber_replayed_batches_total")
            .await,
        1.0
    );
    assert_eq!(
        sub.metric("inferencecache_subscriber_replay_failures_total")
            .await,
        1.0
    );
    // Block 2 came from the replay; 3 and 4 are lost, and the rank says
    // its view is incomplete.
    let fps = prompt_fps(2);
    let other = raw_chain(&tokens(1000, 16), 16);
    wait_until(WAIT, "the replayed block and the live one", || {
        index.tiers("engine-0", 0) == expect(&[(fps[0], T1), (fps[1], T1), (other[0], T1)])
    })
    .await;
    assert_eq!(
        sub.metric("inferencecache_subscriber_history_incomplete")
            .await,
        1.0
    );
    sub.stop().await;
    index.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_without_replay_are_counted_as_loss() {
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(
        &engine,
        &index.url(),
        SubscriberOptions {
            replay: false,
            ..Default::default()
        },
    );
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1], None, tokens(0, 16), 16)])
        .await;
    engine.publish_lost(&[gpu_store(vec![2], Some(1), tokens(16, 16), 16)]);
    engine
        .publish(&[gpu_store(vec![3], Some(2), tokens(32, 16), 16)])
        .await;
    let fps = prompt_fps(1);
    // Block 3's parent was lost: it cannot be fingerprinted and is not guessed.
    wait_metric(
        &sub,
        "inferencecache_subscriber_unresolved_parent_blocks_total",
        1.0,
    )
    .await;
    assert_eq!(
        sub.metric("inferencecache_subscriber_lost_batches_total")
            .await,
        1.0
    );
    assert_eq!(index.tiers("engine-0", 0), expect(&[(fps[0], T1)]));
    // The view misses what the lost batch stored: the rank says so.
    assert_eq!(
        sub.metric("inferencecache_subscriber_history_incomplete")
            .await,
        1.0
    );
    wait_until(WAIT, "batches flagged incomplete", || {
        index.flagged_incomplete()
    })
    .await;
    sub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_are_counted_and_skipped_keeping_state() {
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(&engine, &index.url(), SubscriberOptions::default());
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1], None, tokens(0, 16), 16)])
        .await;
    let fps = prompt_fps(2);
    wait_until(WAIT, "first block", || {
        index.tiers("engine-0", 0).len() == 1
    })
    .await;

    let seq = |s: u64| Bytes::copy_from_slice(&s.to_be_bytes());
    // Wrong frame count, short sequence frame.
    engine.send_raw(vec![Bytes::new(), seq(1)]).await;
    engine
        .send_raw(vec![
            Bytes::new(),
            Bytes::from_static(&[0, 1]),
            Bytes::from_static(b"\x90"),
        ])
        .await;
    // Garbage msgpack, wrong types, an absurd array length. Each consumes a
    // sequence number, as the engine's own publisher would.
    engine
        .send_raw(vec![
            Bytes::new(),
            seq(1),
            Bytes::from_static(b"\xc1garbage"),
        ])
        .await;
    engine
        .send_raw(vec![
            Bytes::new(),
            seq(2),
            Bytes::from_static(b"\x93\xa1x\x05\x00"),
        ])
        .await;
    engine
        .send_raw(vec![
            Bytes::new(),
            seq(3),
            Bytes::from_static(b"\x93\x00\xdd\xff\xff\xff\xff\x00"),
        ])
        .await;
    // A well-formed batch whose only event has a wrongly typed field.
    let bad_event: &[u8] = b"\x93\x00\x91\x92\xabBlockStored\xa3bad\x00";
    engine
        .send_raw(vec![
            Bytes::new(),
            seq(4),
            Bytes::copy_from_slice(bad_event),
        ])
        .await;
    // Then the stream goes on normally.
    for _ in 0..4 {
        engine.publish_lost(&[]);
    }
    engine
        .publish(&[gpu_store(vec![2], Some(1), tokens(16, 16), 16)])
        .await;
    wait_until(WAIT, "stream resumes", || {
        index.tiers("engine-0", 0) == expect(&[(fps[0], T1), (fps[1], T1)])
    })
    .await;
    let metrics = sub.metrics().await;
    sub.wait_for_admin().await;
    let failed = |reason: &str| {
        common::metric(
            &metrics,
            &format!("inferencecache_subscriber_batches_failed_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(failed("wrong_frame_count"), 1.0, "{metrics}");
    assert_eq!(failed("bad_seq_frame"), 1.0, "{metrics}");
    assert_eq!(failed("invalid_marker"), 1.0, "{metrics}");
    assert_eq!(failed("wrong_type"), 1.0, "{metrics}");
    assert_eq!(failed("truncated"), 1.0, "{metrics}");
    assert_eq!(
        common::metric(&metrics, "inferencecache_subscriber_events_rejected_total"),
        1.0,
        "{metrics}"
    );
    sub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_server_restart_is_healed_by_a_resync() {
    let index = RecordingIndex::start().await;
    let port = index.addr.port();
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(&engine, &index.url(), SubscriberOptions::default());
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1], None, tokens(0, 16), 16)])
        .await;
    wait_until(WAIT, "first block", || {
        index.tiers("engine-0", 0).len() == 1
    })
    .await;
    index.stop().await;

    // While the server is down the engine keeps going.
    engine
        .publish(&[gpu_store(vec![2], Some(1), tokens(16, 16), 16)])
        .await;
    engine
        .publish(&[gpu_store(vec![3], Some(2), tokens(32, 16), 16)])
        .await;
    // Both reached the subscriber before the server comes back.
    let deadline = tokio::time::Instant::now() + WAIT;
    while sub
        .metric("inferencecache_subscriber_batches_received_total")
        .await
        < 3.0
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "batches 2 and 3 never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let restarted = RecordingIndex::start_on(port).await;
    let fps = prompt_fps(3);
    let want = expect(&[(fps[0], T1), (fps[1], T1), (fps[2], T1)]);
    wait_until(WAIT, "resynced state", || {
        restarted.tiers("engine-0", 0) == want
    })
    .await;
    assert!(restarted.resyncs() >= 1);
    assert!(
        sub.metric("inferencecache_subscriber_forward_connects_total")
            .await
            >= 2.0
    );
    sub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_index_server_costs_a_bounded_queue_and_nothing_for_good() {
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(
        &engine,
        &index.url(),
        SubscriberOptions {
            queue_capacity: 64,
            ..Default::default()
        },
    );
    engine.wait_for_subscriber().await;
    wait_until(WAIT, "initial resync", || index.resyncs() >= 1).await;
    // The server stops reading: HTTP/2 flow control and the client channel
    // fill up, then the subscriber's queue overflows. The engine never waits.
    index.pause(true);
    let (batches, per_batch) = (150u32, 32u32);
    let mut parent = None;
    for b in 0..batches {
        let hashes: Vec<u64> = (0..per_batch)
            .map(|i| u64::from(b * per_batch + i) + 1000)
            .collect();
        let last = *hashes.last().unwrap();
        let tokens = tokens(16 * b * per_batch, 16 * per_batch);
        engine
            .publish(&[gpu_store(hashes, parent, tokens, 16)])
            .await;
        parent = Some(last);
    }
    wait_metric(
        &sub,
        "inferencecache_subscriber_batches_decoded_total",
        f64::from(batches),
    )
    .await;
    assert!(
        sub.metric("inferencecache_subscriber_queue_dropped_total")
            .await
            > 0.0
    );
    assert!(sub.metric("inferencecache_subscriber_queue_depth").await <= 64.0);

    index.pause(false);
    let want: BTreeMap<u64, i32> = prompt_fps(batches * per_batch)
        .into_iter()
        .map(|fp| (fp, T1))
        .collect();
    wait_until(WAIT, "full state after the stall", || {
        index.tiers("engine-0", 0) == want
    })
    .await;
    sub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_dp_rank_is_its_own_stream() {
    let index = RecordingIndex::start().await;
    // Rank r publishes on base port + r (and replays on replay port + r):
    // four ports in a row, so no rank's port is another's.
    let base = ic_e2e::free_ports_in_a_row(4);
    let replay = base + 2;
    let mut rank0 = FakeEngine::start_on(Era::VllmMap, "", base, replay).await;
    let mut rank1 = FakeEngine::start_on(Era::VllmMap, "", base + 1, replay + 1).await;
    let sub = Subscriber::start(
        &rank0,
        &index.url(),
        SubscriberOptions {
            dp_ranks: 2,
            ..Default::default()
        },
    );
    rank0.wait_for_subscriber().await;
    rank1.wait_for_subscriber().await;
    rank0
        .publish(&[gpu_store(vec![1], None, tokens(0, 16), 16)])
        .await;
    rank1
        .publish(&[gpu_store(vec![7], None, tokens(0, 32), 32)])
        .await;
    let fp0 = prompt_fps(1)[0];
    let fp1 = raw_chain(&tokens(0, 32), 32)[0];
    wait_until(WAIT, "both ranks", || {
        index.tiers("engine-0", 0) == expect(&[(fp0, T1)])
            && index.tiers("engine-0", 1) == expect(&[(fp1, T1)])
    })
    .await;
    sub.stop().await;
}

/// Serves `page` as an engine's Prometheus `/metrics` on loopback; returns
/// its URL.
async fn serve_metrics(page: &'static str) -> String {
    let app =
        axum::Router::new().route("/metrics", axum::routing::get(move || async move { page }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tier2_counters_are_scraped_from_the_engine_and_forwarded() {
    // The engine's Prometheus endpoint, served for real on loopback.
    let page = "# TYPE vllm:external_prefix_cache_hits_total counter\n\
        vllm:external_prefix_cache_hits_total{engine=\"0\"} 30.0\n\
        vllm:external_prefix_cache_queries_total{engine=\"0\"} 120.0\n";
    let metrics_url = serve_metrics(page).await;

    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(
        &engine,
        &index.url(),
        SubscriberOptions {
            engine_metrics_url: Some(metrics_url),
            ..Default::default()
        },
    );
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1], None, tokens(0, 16), 16)])
        .await;
    wait_until(WAIT, "tier-2 counters in a batch", || {
        index.recorded.lock().unwrap().batches.iter().any(|b| {
            b.tier2_stats
                == Some(pb::Tier2Stats {
                    has_counters: true,
                    hits: 30,
                    queries: 120,
                })
        })
    })
    .await;
    sub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_errors_back_off_and_a_stuck_socket_is_replaced() {
    const ERRORS_BEFORE_RECONNECT: u32 = 6;
    let index = RecordingIndex::start().await;
    let engine = FakeEngine::start(Era::VllmMap, "").await;
    let garbage = ic_e2e::engine::GarbagePublisher::start();
    let started = tokio::time::Instant::now();
    let sub = Subscriber::start(
        &engine,
        &index.url(),
        SubscriberOptions {
            replay: false,
            events_endpoint: Some(garbage.endpoint()),
            max_receive_errors: Some(ERRORS_BEFORE_RECONNECT),
            ..SubscriberOptions::default()
        },
    );
    sub.wait_for_admin().await;
    let failed = |reason: &str| {
        format!("inferencecache_subscriber_batches_failed_total{{reason=\"{reason}\"}}")
    };
    let deadline = started + WAIT;
    loop {
        let text = sub.metrics().await;
        if metric(&text, &failed("recv_error_reconnect")) >= 1.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the listener never replaced its socket: {text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // zeromq's own reconnect (100 ms, doubling) paces a broken peer's
    // errors here, so the listener's backoff between errors is not what
    // this test sees; it sees every error counted, and the socket replaced
    // after the configured number in a row.
    let text = sub.metrics().await;
    assert!(
        metric(&text, &failed("recv_error")) >= f64::from(ERRORS_BEFORE_RECONNECT),
        "{text}"
    );
    assert!(
        garbage
            .connections
            .load(std::sync::atomic::Ordering::SeqCst)
            >= u64::from(ERRORS_BEFORE_RECONNECT),
        "each error was a fresh connection to the publisher"
    );
    // A publisher that never sent a valid message delivered nothing.
    assert_eq!(
        metric(&text, "inferencecache_subscriber_batches_received_total"),
        0.0
    );
    sub.stop().await;
}

/// One event of 70,000 blocks, then a cleared HBM (one removal of all of
/// them): both reach the index in batches of at most 65,536 fingerprints
/// (a single batch would pass the index server's 4 MiB message limit),
/// a stored chain's pieces linked, so the index ends as the engine does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_larger_than_a_batch_go_out_in_pieces() {
    const BLOCKS: u32 = 70_000;
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(&engine, &index.url(), SubscriberOptions::default());
    engine.wait_for_subscriber().await;
    let hashes: Vec<u64> = (1..=u64::from(BLOCKS)).collect();
    engine
        .publish(&[gpu_store(hashes, None, tokens(0, BLOCKS), 1)])
        .await;
    wait_until(WAIT, "the whole chain", || {
        index.tiers("engine-0", 0).len() == BLOCKS as usize
    })
    .await;
    engine
        .publish(&[ic_kvevents::KvEvent::AllBlocksCleared])
        .await;
    wait_until(WAIT, "nothing held", || {
        index.tiers("engine-0", 0).is_empty()
    })
    .await;
    let largest = index
        .recorded
        .lock()
        .unwrap()
        .batches
        .iter()
        .map(|b| {
            b.events
                .iter()
                .map(|e| match &e.kind {
                    Some(pb::index_event::Kind::Stored(s)) => s.fingerprints.len(),
                    Some(pb::index_event::Kind::Evicted(e)) => e.fingerprints.len(),
                    _ => 0,
                })
                .sum::<usize>()
        })
        .max();
    assert_eq!(largest, Some(65_536));
    sub.stop().await;
}
