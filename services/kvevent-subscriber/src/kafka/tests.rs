//! Unit tests of the producer's pure parts: the replacement wait, the
//! healthy span, the flags. The producer against a real broker is in
//! `broker_tests.rs`.

#![allow(clippy::unwrap_used)]

use super::*;
use clap::{CommandFactory as _, Parser};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    kafka: KafkaProducerFlags,
}

#[test]
fn only_a_healthy_producer_is_replaced_at_once_and_resets_the_wait() {
    let healthy = Duration::from_secs(10);
    let mut waits = ic_clock::Backoff::new(REPLACE_FIRST, REPLACE_MAX);
    let s = Duration::from_secs;
    // Nothing delivered, then a record or two over a short span: the
    // waits grow (the old rule reset them after any delivery).
    assert_eq!(replacement_delay(None, healthy, &mut waits), s(1));
    assert_eq!(replacement_delay(Some(s(0)), healthy, &mut waits), s(2));
    assert_eq!(replacement_delay(Some(s(9)), healthy, &mut waits), s(4));
    // Healthy for the whole interval: at once, and the waits start over.
    assert_eq!(replacement_delay(Some(s(10)), healthy, &mut waits), s(0));
    assert_eq!(replacement_delay(Some(s(1)), healthy, &mut waits), s(1));
    for _ in 0..6 {
        replacement_delay(None, healthy, &mut waits);
    }
    assert_eq!(replacement_delay(None, healthy, &mut waits), REPLACE_MAX);
}

#[test]
fn the_healthy_span_runs_from_the_first_to_the_last_acknowledgement() {
    // Deliveries land at the age of `created`, so moving it back stands
    // for time passing between acknowledgements, without sleeping.
    let mut o = Outcomes {
        created: std::time::Instant::now()
            .checked_sub(Duration::from_secs(5))
            .unwrap(),
        ..Outcomes::new()
    };
    assert_eq!(o.healthy_for(), None, "nothing acknowledged yet");
    let started = std::time::Instant::now();
    // The first acknowledgement, 5 s after the creation: the span starts.
    o.delivered();
    assert_eq!(o.healthy_for(), Some(Duration::ZERO));
    // The last, 3 s later: the 3 s between them (plus this test's own
    // time meanwhile, and a millisecond of rounding).
    o.created = o.created.checked_sub(Duration::from_secs(3)).unwrap();
    o.delivered();
    let span = o.healthy_for().unwrap();
    let at_most = Duration::from_secs(3) + started.elapsed() + Duration::from_millis(1);
    assert!(
        span >= Duration::from_secs(3) && span <= at_most,
        "{span:?}, not 3 s to {at_most:?}"
    );
    assert_eq!(o.delivered.load(Ordering::Relaxed), 2);
    // Its end at a failure: a_refused_record_ends_the_healthy_span_as_a_lost_one_does.
}

#[test]
fn a_refused_record_ends_the_healthy_span_as_a_lost_one_does() {
    // Created 5 s ago, so a delivery now lands well after the span's
    // end (1 ms) if it were counted.
    let backdated = || Outcomes {
        created: std::time::Instant::now()
            .checked_sub(Duration::from_secs(5))
            .unwrap(),
        ..Outcomes::new()
    };
    for failure in ["lost", "refused"] {
        let o = backdated();
        o.first_delivered.store(1, Ordering::Relaxed);
        o.last_delivered.store(1, Ordering::Relaxed);
        match failure {
            "lost" => o.failures.store(1, Ordering::Relaxed),
            _ => o.refused.store(1, Ordering::Relaxed),
        }
        assert!(o.failed());
        o.delivered();
        assert_eq!(o.healthy_for(), Some(Duration::ZERO), "{failure}");
    }
    // Without a failure the same delivery lengthens it.
    let o = backdated();
    o.first_delivered.store(1, Ordering::Relaxed);
    o.delivered();
    assert!(o.healthy_for() >= Some(Duration::from_secs(5)));
}

#[test]
fn the_flags_make_an_idempotent_bounded_producer() {
    Cli::command().debug_assert();
    assert!(
        Cli::try_parse_from(["x"])
            .unwrap()
            .kafka
            .settings()
            .unwrap()
            .is_none()
    );
    let cli = Cli::try_parse_from([
        "x",
        "--transport",
        "kafka",
        "--kafka-brokers",
        "127.0.0.1:9092",
        "--kafka-queue-messages",
        "50",
        "--kafka-delivery-timeout-ms",
        "1500",
    ])
    .unwrap();
    let s = cli.kafka.settings().unwrap().unwrap();
    assert_eq!(s.client.get("enable.idempotence"), Some("true"));
    assert_eq!(s.client.get("acks"), Some("all"));
    assert_eq!(s.client.get("queue.buffering.max.messages"), Some("50"));
    assert_eq!(s.client.get("delivery.timeout.ms"), Some("1500"));
    assert_eq!(s.resync_every, Duration::from_secs(600));
    assert_eq!(s.healthy, Duration::from_secs(10));
    assert!(
        Cli::try_parse_from(["x", "--kafka-producer-healthy-seconds", "0"]).is_err(),
        "a healthy interval of at least 1 s"
    );
    assert!(
        Cli::try_parse_from(["x", "--kafka-queue-messages", "0"]).is_err(),
        "the queue holds at least one record"
    );
}
