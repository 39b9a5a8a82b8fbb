//! Engine restarts, seen and hidden by the sequence, and subscriber restarts.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restart_clears_the_replica() {
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmArray, "").await;
    let sub = Subscriber::start(&engine, &index.url(), SubscriberOptions::default());
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1, 2], None, tokens(0, 32), 16)])
        .await;
    engine
        .publish(&[gpu_store(vec![3], Some(2), tokens(32, 16), 16)])
        .await;
    let fps = prompt_fps(3);
    wait_until(WAIT, "first life", || index.tiers("engine-0", 0).len() == 3).await;
    engine.restart();
    engine
        .publish(&[gpu_store(vec![9], None, tokens(0, 16), 16)])
        .await;
    wait_until(WAIT, "state after restart", || {
        index.tiers("engine-0", 0) == expect(&[(fps[0], T1)])
    })
    .await;
    assert_eq!(
        sub.metric("inferencecache_subscriber_engine_resets_total")
            .await,
        1.0
    );
    sub.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_frame_with_an_absurd_sequence_loses_nothing() {
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(&engine, &index.url(), SubscriberOptions::default());
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1, 2], None, tokens(0, 32), 16)])
        .await;
    let fps = prompt_fps(3);
    wait_until(WAIT, "first batch", || {
        index.tiers("engine-0", 0).len() == 2
    })
    .await;
    // A forged (or corrupt) frame claiming sequence 2^62.
    let payload = ic_kvevents::encode::encode_batch(
        Era::VllmMap,
        1.0,
        &[gpu_store(vec![99], None, tokens(500, 16), 16)],
        Some(0),
    );
    engine
        .send_raw(vec![
            bytes::Bytes::new(),
            bytes::Bytes::copy_from_slice(&(1u64 << 62).to_be_bytes()),
            payload.into(),
        ])
        .await;
    engine
        .publish(&[gpu_store(vec![3], Some(2), tokens(32, 16), 16)])
        .await;
    wait_until(WAIT, "the stream carries on", || {
        index.tiers("engine-0", 0) == expect(&[(fps[0], T1), (fps[1], T1), (fps[2], T1)])
    })
    .await;
    let failed = sub
        .metric("inferencecache_subscriber_batches_failed_total{reason=\"implausible_sequence\"}")
        .await;
    assert_eq!(failed, 1.0);
    for counter in [
        "lost_batches_total",
        "engine_resets_total",
        "seq_gaps_total",
    ] {
        assert_eq!(
            sub.metric(&format!("inferencecache_subscriber_{counter}"))
                .await,
            0.0,
            "{counter}"
        );
    }
    sub.stop().await;
}

/// One incarnation of an engine: a real process (Python, pyzmq + msgspec)
/// publishing vLLM's wire and serving its replay protocol.
fn incarnation(
    port: u16,
    replay: u16,
    prompt: u32,
    blocks: u32,
    burst: u32,
) -> std::process::Child {
    incarnation_with(port, replay, prompt, blocks, burst, &[])
}

/// [`incarnation`] with more of the script's flags (`--first-prompt`, `--ts`).
fn incarnation_with(
    port: u16,
    replay: u16,
    prompt: u32,
    blocks: u32,
    burst: u32,
    extra: &[&str],
) -> std::process::Child {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../libs/kvevents/tests/fixtures/engine_incarnation.py");
    let mut child = std::process::Command::new("python3")
        .arg(script)
        .args([
            "--port",
            &port.to_string(),
            "--replay-port",
            &replay.to_string(),
        ])
        .args([
            "--prompt",
            &prompt.to_string(),
            "--blocks",
            &blocks.to_string(),
        ])
        .args(["--burst", &burst.to_string()])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with pyzmq and msgspec is required (./dev.sh test installs them)");
    // Wait until it has bound its sockets and published its burst.
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready", "the engine process did not start");
    child
}

/// The engine process dies (kill -9) and a new one starts on the same ports
/// and publishes a burst before the subscriber is back (it reaches no one
/// live, only the new replay buffer), with a new incarnation longer than
/// the old one, so the sequence never goes backwards: the reconnect gives
/// it away, and the index converges to exactly the new engine's state. At
/// several burst sizes, and without a replay buffer too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restart_the_sequence_hides_is_detected_at_reconnect() {
    for (burst, replay) in [(1u32, true), (5, true), (40, true), (3, false)] {
        let index = RecordingIndex::start().await;
        let (port, replay_port) = (common::free_port(), common::free_port());
        let events = format!("tcp://127.0.0.1:{port}");
        let replay_at = format!("tcp://127.0.0.1:{replay_port}");
        let mut old = incarnation(port, replay_port, 1, 2, 0);
        let sub = Subscriber::start_at(
            &events,
            replay.then_some(replay_at.as_str()),
            &index.url(),
            SubscriberOptions::default(),
        );
        let old_fps = raw_chain(&tokens(1000, 32), 16);
        wait_until(WAIT, "the old incarnation", || {
            index.tiers("engine-0", 0) == expect(&[(old_fps[0], T1), (old_fps[1], T1)])
        })
        .await;
        old.kill().unwrap();
        old.wait().unwrap();
        // The new incarnation: `burst` blocks before anyone listens, then
        // two live ones; its last sequence (burst + 1) is above the old
        // incarnation's (1).
        let blocks = burst + 2;
        let mut new = incarnation(port, replay_port, 2, blocks, burst);
        let fps = raw_chain(&tokens(2000, 16 * blocks), 16);
        let want: Vec<(u64, i32)> = if replay {
            fps.iter().map(|f| (*f, T1)).collect()
        } else {
            // Without replay the burst is gone; the live blocks' parents
            // with it: nothing can be fingerprinted, and nothing of the
            // dead incarnation may stay.
            Vec::new()
        };
        wait_until(WAIT, "exactly the new incarnation", || {
            index.tiers("engine-0", 0) == expect(&want)
        })
        .await;
        let restarts = "inferencecache_subscriber_engine_restarts_total{signal=\"reconnect\"}";
        wait_metric(&sub, restarts, 1.0).await;
        assert_eq!(sub.metric(restarts).await, 1.0, "burst {burst}");
        if !replay {
            assert!(
                sub.metric("inferencecache_subscriber_unresolved_parent_blocks_total")
                    .await
                    >= 1.0
            );
        }
        new.kill().unwrap();
        new.wait().unwrap();
        sub.stop().await;
    }
}

/// A restarted subscriber (a rollout, an OOM kill) on an idle engine: the
/// index keeps the replica's blocks, because the new subscriber rebuilds
/// them from the engine's replay buffer before its first resync; when the
/// buffer has rolled over, it says so instead of pretending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_subscriber_rebuilds_before_it_resyncs_and_reports_what_it_lacks() {
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let first = Subscriber::start(&engine, &index.url(), SubscriberOptions::default());
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1, 2], None, tokens(0, 32), 16)])
        .await;
    engine
        .publish(&[gpu_store(vec![3], Some(2), tokens(32, 16), 16)])
        .await;
    let fps = prompt_fps(3);
    let whole = expect(&[(fps[0], T1), (fps[1], T1), (fps[2], T1)]);
    wait_until(WAIT, "the engine's state", || {
        index.tiers("engine-0", 0) == whole
    })
    .await;
    first.stop().await;
    let resyncs = index.resyncs();
    // The engine stays idle: nothing new is published.
    let second = Subscriber::start(&engine, &index.url(), SubscriberOptions::default());
    wait_until(WAIT, "the new subscriber's resync", || {
        index.resyncs() > resyncs
    })
    .await;
    assert_eq!(
        index.tiers("engine-0", 0),
        whole,
        "the view must not drop to empty"
    );
    assert_eq!(
        second
            .metric("inferencecache_subscriber_history_incomplete")
            .await,
        0.0
    );
    second.stop().await;

    // The engine ran past its replay buffer: batch 0 is gone from it.
    engine.forget_before(1);
    let resyncs = index.resyncs();
    let third = Subscriber::start(
        &engine,
        &index.url(),
        SubscriberOptions {
            engine_metrics_url: Some(
                serve_metrics("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"3\"} 1\n")
                    .await,
            ),
            ..Default::default()
        },
    );
    wait_until(WAIT, "the third subscriber's resync", || {
        index.resyncs() > resyncs
    })
    .await;
    // Block 3's parents were in batch 0: it cannot be fingerprinted, and the
    // subscriber says its view is incomplete rather than staying silent.
    assert_eq!(
        third
            .metric("inferencecache_subscriber_unreplayable_batches_total")
            .await,
        1.0
    );
    assert_eq!(
        third
            .metric("inferencecache_subscriber_history_incomplete")
            .await,
        1.0
    );
    wait_until(WAIT, "batches flagged incomplete", || {
        index.flagged_incomplete()
    })
    .await;

    // The engine reports a 48-token cache. A store extending block 2 (which
    // the view lacks) shows the old history is still in use; then 48 tokens
    // of new prompts turn the cache over and the flag clears.
    engine
        .publish(&[gpu_store(vec![4], Some(2), tokens(48, 16), 16)])
        .await;
    engine
        .publish(&[gpu_store(vec![10, 11], None, tokens(100, 32), 16)])
        .await;
    wait_until(WAIT, "two new blocks", || {
        index.tiers("engine-0", 0).len() == 2
    })
    .await;
    assert_eq!(
        third
            .metric("inferencecache_subscriber_history_incomplete")
            .await,
        1.0,
        "32 clean tokens of a 48-token cache are not a turnover"
    );
    engine
        .publish(&[gpu_store(vec![12], None, tokens(200, 16), 16)])
        .await;
    wait_metric(
        &third,
        "inferencecache_subscriber_history_turnovers_total",
        1.0,
    )
    .await;
    assert_eq!(
        third
            .metric("inferencecache_subscriber_history_incomplete")
            .await,
        0.0,
        "the history never completed after a turnover"
    );
    assert_eq!(
        third
            .metric("inferencecache_subscriber_history_turnovers_total")
            .await,
        1.0
    );
    wait_until(WAIT, "a batch without the flag", || {
        index
            .recorded
            .lock()
            .unwrap()
            .batches
            .last()
            .is_some_and(|b| !b.history_incomplete)
    })
    .await;
    third.stop().await;
}

/// The engine dies and its new incarnation publishes everything it will
/// (fewer batches than the old one, or more) before the subscriber is
/// back, then goes silent: no message ever arrives to reveal the restart,
/// so the probe at the reconnect must. The index converges to exactly the
/// new incarnation's blocks (none of the old one's), without a replay
/// buffer to an empty view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_restarts_and_goes_silent_is_rebuilt_at_reconnect() {
    for (old_blocks, new_blocks, replay) in [(3u32, 1u32, true), (2, 5, true), (2, 2, false)] {
        let index = RecordingIndex::start().await;
        let (port, replay_port) = (common::free_port(), common::free_port());
        let events = format!("tcp://127.0.0.1:{port}");
        let replay_at = format!("tcp://127.0.0.1:{replay_port}");
        let mut old = incarnation(port, replay_port, 1, old_blocks, 0);
        let sub = Subscriber::start_at(
            &events,
            replay.then_some(replay_at.as_str()),
            &index.url(),
            SubscriberOptions::default(),
        );
        let old_fps = raw_chain(&tokens(1000, 16 * old_blocks), 16);
        let old_view: Vec<(u64, i32)> = old_fps.iter().map(|f| (*f, T1)).collect();
        wait_until(WAIT, "the old incarnation", || {
            index.tiers("engine-0", 0) == expect(&old_view)
        })
        .await;
        old.kill().unwrap();
        old.wait().unwrap();
        // Everything before anyone listens; then nothing.
        let mut new = incarnation(port, replay_port, 2, new_blocks, new_blocks);
        let want: Vec<(u64, i32)> = if replay {
            raw_chain(&tokens(2000, 16 * new_blocks), 16)
                .into_iter()
                .map(|f| (f, T1))
                .collect()
        } else {
            Vec::new()
        };
        wait_until(WAIT, "exactly the silent new incarnation", || {
            index.tiers("engine-0", 0) == expect(&want)
        })
        .await;
        let restarts = "inferencecache_subscriber_engine_restarts_total{signal=\"reconnect\"}";
        assert_eq!(
            sub.metric(restarts).await,
            1.0,
            "{old_blocks} -> {new_blocks}"
        );
        assert_eq!(
            sub.metric("inferencecache_subscriber_batches_received_total")
                .await,
            f64::from(old_blocks),
            "the new incarnation sent nothing live"
        );
        new.kill().unwrap();
        new.wait().unwrap();
        sub.stop().await;
    }
}

/// A new incarnation whose last batch is byte-identical to the old one's
/// last batch at the same sequence (same block, same timestamp) but whose
/// history differs before it: a new engine, not the old one back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_identical_batch_does_not_pass_for_the_old_incarnation() {
    let index = RecordingIndex::start().await;
    let (port, replay_port) = (common::free_port(), common::free_port());
    let events = format!("tcp://127.0.0.1:{port}");
    let replay_at = format!("tcp://127.0.0.1:{replay_port}");
    let mut old = incarnation_with(port, replay_port, 1, 2, 0, &["--ts", "1.0"]);
    let sub = Subscriber::start_at(
        &events,
        Some(&replay_at),
        &index.url(),
        SubscriberOptions::default(),
    );
    let old_fps = raw_chain(&tokens(1000, 32), 16);
    wait_until(WAIT, "the old incarnation", || {
        index.tiers("engine-0", 0) == expect(&[(old_fps[0], T1), (old_fps[1], T1)])
    })
    .await;
    old.kill().unwrap();
    old.wait().unwrap();
    // Batch 0 stores another prompt; batch 1 is the old batch 1, byte for
    // byte (its parent is not in this incarnation: it cannot be
    // fingerprinted).
    let mut new = incarnation_with(
        port,
        replay_port,
        1,
        2,
        2,
        &["--ts", "1.0", "--first-prompt", "3"],
    );
    let want = expect(&[(raw_chain(&tokens(3000, 16), 16)[0], T1)]);
    wait_until(WAIT, "the new incarnation's view", || {
        index.tiers("engine-0", 0) == want
    })
    .await;
    assert_eq!(
        sub.metric("inferencecache_subscriber_engine_restarts_total{signal=\"reconnect\"}")
            .await,
        1.0
    );
    new.kill().unwrap();
    new.wait().unwrap();
    sub.stop().await;
}

/// Two frames in a row far ahead (a publisher that numbers from elsewhere)
/// are a restart, not 2^40 lost batches: no loss counter takes the jump.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_far_jump_counts_no_phantom_losses() {
    let index = RecordingIndex::start().await;
    let mut engine = FakeEngine::start(Era::VllmMap, "").await;
    let sub = Subscriber::start(&engine, &index.url(), SubscriberOptions::default());
    engine.wait_for_subscriber().await;
    engine
        .publish(&[gpu_store(vec![1, 2], None, tokens(0, 32), 16)])
        .await;
    let fps = prompt_fps(2);
    wait_until(WAIT, "first batch", || {
        index.tiers("engine-0", 0).len() == 2
    })
    .await;
    let far = 1u64 << 40;
    for (i, seq) in [far, far + 1].into_iter().enumerate() {
        let payload = ic_kvevents::encode::encode_batch(
            Era::VllmMap,
            2.0,
            &[gpu_store(
                vec![90 + i as u64],
                None,
                tokens(500 + 16 * i as u32, 16),
                16,
            )],
            Some(0),
        );
        engine
            .send_raw(vec![
                bytes::Bytes::new(),
                bytes::Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload.into(),
            ])
            .await;
    }
    let jumped = raw_chain(&tokens(516, 16), 16)[0];
    wait_until(WAIT, "the stream moved", || {
        index.tiers("engine-0", 0).contains_key(&jumped)
    })
    .await;
    assert_eq!(
        sub.metric("inferencecache_subscriber_engine_restarts_total{signal=\"jump\"}")
            .await,
        1.0
    );
    for counter in ["lost_batches_total", "unreplayable_batches_total"] {
        assert_eq!(
            sub.metric(&format!("inferencecache_subscriber_{counter}"))
                .await,
            0.0,
            "{counter}"
        );
    }
    // What the replay buffer still had (batch 0) is kept.
    assert_eq!(
        index.tiers("engine-0", 0),
        expect(&[(fps[0], T1), (fps[1], T1), (jumped, T1)])
    );
    sub.stop().await;
}
