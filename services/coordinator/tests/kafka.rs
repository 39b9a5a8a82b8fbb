//! The Kafka event transport against a real Kafka-protocol broker (tansu):
//! records apply like `POST /events`, malformed ones are skipped and
//! counted, readiness waits for the consumer, and the real binary resumes
//! from its checkpoint with no loss and no double apply.
//!
//! These tests need tansu; without it they fail with install instructions.
#![allow(clippy::unwrap_used)]

mod common;
mod kafka_support;

use std::time::Instant;

use common::Coord;
use ic_e2e::ServiceProcess;
use kafka_support::{
    Broker, DEADLINE, Record, batch_record, consumed, produce, scripted_batch, views,
};
use serde_json::{Value, json};

const TOPIC: &str = "lmcache-cache-events";

fn kafka_flags(bootstrap: &str) -> Vec<String> {
    [
        "--event-transport",
        "kafka",
        "--kafka-bootstrap-servers",
        bootstrap,
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Polls `GET /status` (JSON) until `done` holds, or panics with the last
/// status after [`DEADLINE`].
async fn wait_status(
    http: &reqwest::Client,
    base: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let status = status(http, base).await;
        if done(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "coordinator at {base} never reached: {what}; last status: {status:#}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn status(http: &reqwest::Client, base: &str) -> Value {
    http.get(format!("{base}/status"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn get_json(http: &reqwest::Client, base: &str, path: &str) -> Value {
    http.get(format!("{base}{path}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Every view a client reads, canonicalized (see [`views`]).
async fn read_views(http: &reqwest::Client, base: &str) -> Value {
    views(
        &get_json(http, base, "/directory/stats").await,
        &get_json(http, base, "/directory/keys?limit=10000").await,
        &get_json(http, base, "/instances/usage").await,
        &status(http, base).await,
    )
}

async fn metrics(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Value of one sample line (`name{labels} value`), 0 when absent.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_apply_in_order_like_http_and_malformed_ones_are_skipped() {
    let broker = tokio::task::block_in_place(Broker::start);
    // One partition: the global order is the send order, so even insertion
    // order of the directory must match the HTTP-fed coordinator.
    broker.create_topic(TOPIC, 1);
    let mut valid = Vec::new();
    for seq in 1..=30 {
        for id in ["mp-a", "mp-b", "mp-c"] {
            valid.push(scripted_batch(id, 100, seq));
        }
    }
    // A restart of mp-b (fences its L1) and a redelivered batch (duplicate).
    valid.push(scripted_batch("mp-b", 101, 2));
    valid.push(scripted_batch("mp-a", 100, 30));
    let malformed: Vec<Record> = vec![
        (Some("mp-a".into()), Some(b"{not json".to_vec())),
        (Some("mp-a".into()), None),
        (
            Some("mp-b".into()),
            Some(serde_json::to_vec(&json!({"batches": [scripted_batch("mp-b", 100, 99), scripted_batch("mp-b", 100, 100)]})).unwrap()),
        ),
        (Some("mp-zz".into()), batch_record(&scripted_batch("mp-c", 100, 99)).1),
        (Some("mp-c".into()), batch_record(&json!({"instance_id": "mp-c", "incarnation": 100, "seq": 0,
                 "event_type": "store", "tier": "l2", "backend": "fs"})).1),
    ];
    // Interleave the bad records between good ones of the same partition:
    // what follows them must still be applied.
    let mut records: Vec<Record> = Vec::new();
    let mut bad = malformed.iter();
    for (i, b) in valid.iter().enumerate() {
        records.push(batch_record(b));
        if i % 17 == 5
            && let Some(r) = bad.next()
        {
            records.push(r.clone());
        }
    }
    records.extend(bad.cloned());
    let total = i64::try_from(records.len()).unwrap();
    tokio::task::block_in_place(|| produce(&broker.producer(), TOPIC, &records));

    let bootstrap = broker.bootstrap();
    let flags = kafka_flags(&bootstrap);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let kafka = Coord::start(&flags).await;
    let http = reqwest::Client::new();
    let kbase = kafka.url("");
    let st = wait_status(&http, &kbase, "every record consumed", |s| {
        consumed(s) == total
    })
    .await;
    assert_eq!(st["event_transport"], "kafka");
    assert_eq!(st["kafka"]["topic"], TOPIC);
    assert_eq!(st["kafka"]["partitions"][0]["last_offset"], total - 1);

    let reference = Coord::start(&[]).await;
    for b in &valid {
        reference.events(vec![b.clone()]).await;
    }
    let rbase = reference.url("");
    // Exact, uncanonicalized equality too: one partition keeps the order.
    for path in [
        "/directory/stats",
        "/directory/keys?limit=10000",
        "/instances/usage",
    ] {
        assert_eq!(
            get_json(&http, &kbase, path).await,
            get_json(&http, &rbase, path).await,
            "{path}"
        );
    }
    assert_eq!(
        read_views(&http, &kbase).await,
        read_views(&http, &rbase).await
    );
    let km = metrics(&http, &kbase).await;
    let rm = metrics(&http, &rbase).await;
    assert_eq!(
        sample(
            &km,
            "lmcache_coordinator_kafka_records_total{result=\"malformed\"}"
        ),
        5.0
    );
    assert_eq!(
        sample(
            &km,
            "lmcache_coordinator_kafka_records_total{result=\"duplicate\"}"
        ),
        1.0
    );
    for outcome in ["applied", "duplicate", "stale"] {
        let series = format!("lmcache_coordinator_events_batches_total{{outcome=\"{outcome}\"}}");
        assert_eq!(sample(&km, &series), sample(&rm, &series), "{series}");
    }
    assert_eq!(
        sample(
            &km,
            "lmcache_coordinator_kafka_last_offset{partition=\"0\"}"
        ),
        (total - 1) as f64
    );
    // The reference's 404 while Kafka is the transport.
    let (code, body) = kafka
        .post(
            "/events",
            json!({"batches": [scripted_batch("mp-a", 100, 31)]}),
        )
        .await;
    assert_eq!(code, 404);
    assert!(body["detail"].as_str().unwrap().contains("Kafka"), "{body}");
    kafka.stop().await;
    reference.stop().await;
}

/// Forwards `listen` to `to` once started: a bootstrap address that is dead
/// until the test decides the broker becomes reachable.
async fn forward(listen: u16, to: u16) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", listen))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_ready_lag_holds_readiness_until_caught_up() {
    let broker = tokio::task::block_in_place(Broker::start);
    broker.create_topic(TOPIC, 2);
    // Four instances so both partitions get records.
    let records = phase(&["mp-a", "mp-b", "mp-c", "mp-d"], 1..=20);
    let total = i64::try_from(records.len()).unwrap();
    tokio::task::block_in_place(|| produce(&broker.producer(), TOPIC, &records));

    // The coordinator bootstraps through a port nothing listens on yet: to
    // it, the broker is down.
    let gate_port = ic_e2e::free_port();
    let flags = kafka_flags(&format!("127.0.0.1:{gate_port}"));
    let mut flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    flags.extend(["--max-ready-lag", "10"]);
    let coord = Coord::start(&flags).await;
    let http = reqwest::Client::new();
    let base = coord.url("");
    let st = wait_status(&http, &base, "a failed broker call", |s| {
        s["kafka"]["failures"].as_u64() >= Some(1)
    })
    .await;
    assert_eq!(st["kafka"]["connected"], false, "{st:#}");
    assert!(st["kafka"]["last_error"].is_string(), "{st:#}");
    let (code, _) = coord.get("/ready").await;
    assert_eq!(code, 503, "ready while the broker is unreachable");
    let m = metrics(&http, &base).await;
    assert_eq!(sample(&m, "lmcache_coordinator_kafka_connected"), 0.0);
    assert!(
        m.lines()
            .any(|l| l.starts_with("lmcache_coordinator_kafka_errors_total{kind=\"metadata\"}")),
        "{m}"
    );
    assert_eq!(coord.get("/live").await.0, 200);

    // Broker reachable: readiness comes once within 10 records of the end.
    let fwd = forward(gate_port, broker.port).await;
    let deadline = Instant::now() + DEADLINE;
    loop {
        if coord.get("/ready").await.0 == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "never became ready");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The position only grows, so what we read now bounds it when ready flipped.
    let st = status(&http, &base).await;
    assert!(consumed(&st) >= total - 2 * 10, "ready too early: {st:#}");
    let st = wait_status(&http, &base, "every record consumed", |s| {
        consumed(s) == total
    })
    .await;
    assert_eq!(st["kafka"]["connected"], true, "{st:#}");
    assert_eq!(st["kafka"]["caught_up"], true, "{st:#}");
    // Lag is measured against the broker's high watermarks, per partition.
    let st = wait_status(&http, &base, "lag 0 at the high watermarks", |s| {
        let ps = s["kafka"]["partitions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ps.iter().all(|p| p["lag"] == 0)
            && ps
                .iter()
                .filter_map(|p| p["high_watermark"].as_i64())
                .sum::<i64>()
                == total
    })
    .await;
    let m = metrics(&http, &base).await;
    for p in st["kafka"]["partitions"].as_array().unwrap() {
        let part = p["partition"].as_i64().unwrap();
        let lag = format!("lmcache_coordinator_kafka_consumer_lag_records{{partition=\"{part}\"}}");
        assert_eq!(sample(&m, &lag), 0.0, "{lag}");
        if let Some(last) = p["last_offset"].as_f64() {
            let series = format!("lmcache_coordinator_kafka_last_offset{{partition=\"{part}\"}}");
            assert_eq!(sample(&m, &series), last, "{series}");
        }
    }
    assert_eq!(sample(&m, "lmcache_coordinator_kafka_caught_up"), 1.0);
    coord.stop().await;
    fwd.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn position_moves_with_the_views_and_the_checkpoint_carries_it() {
    use ic_coordinator::ingest::{GateOutcome, RecordOutcome};
    use ic_coordinator_core::kafka::StartAt;
    // No broker needed: records are handed to the ingest path directly, the
    // consumer meanwhile retries against a dead address.
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("c.ckpt");
    let dead = format!("127.0.0.1:{}", ic_e2e::free_port());
    let flags = kafka_flags(&dead);
    let mut flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    flags.extend([
        "--checkpoint-path",
        ckpt.to_str().unwrap(),
        "--checkpoint-interval",
        "0",
    ]);
    let c = Coord::start(&flags).await;
    let batch = |seq| {
        ic_coordinator_core::events::EventsRequest {
            batches: vec![serde_json::from_value(scripted_batch("mp-a", 1, seq)).unwrap()],
        }
        .validate()
        .unwrap()
        .remove(0)
    };
    let app = &c.app;
    assert_eq!(
        app.ingest.ingest_record(TOPIC, 0, 0, Some(&batch(1))),
        RecordOutcome::Offered(GateOutcome::Applied)
    );
    assert_eq!(
        app.ingest.ingest_record(TOPIC, 0, 1, None),
        RecordOutcome::Malformed
    );
    assert_eq!(
        app.ingest.ingest_record(TOPIC, 0, 2, Some(&batch(1))),
        RecordOutcome::Offered(GateOutcome::Duplicate)
    );
    // Re-read after a reassignment: not offered to the gate again.
    assert_eq!(
        app.ingest.ingest_record(TOPIC, 0, 0, Some(&batch(2))),
        RecordOutcome::AlreadyConsumed
    );
    assert_eq!(
        app.ingest.ingest_record(TOPIC, 1, 5, Some(&batch(3))),
        RecordOutcome::Offered(GateOutcome::Applied)
    );
    assert_eq!(app.views.read(|v| v.gate.cursors()["mp-a"].last_seq), 3);
    let keys = c.get("/directory/keys").await.1;
    c.stop().await;

    let sections = ic_coordinator_core::checkpoint::decode_file(&std::fs::read(&ckpt).unwrap())
        .unwrap()
        .sections;
    assert_eq!(
        sections.kafka_stream_position.unwrap().offsets,
        vec![(TOPIC.to_owned(), 0, 2), (TOPIC.to_owned(), 1, 5)]
    );
    let c = Coord::start(&flags).await;
    assert_eq!(
        c.app.views.read(|v| v.kafka.resume_at(TOPIC, 0)),
        StartAt::Offset(3)
    );
    assert_eq!(
        c.app.views.read(|v| v.kafka.resume_at(TOPIC, 2)),
        StartAt::Earliest
    );
    assert_eq!(c.get("/directory/keys").await.1, keys);
    c.stop().await;
}

fn start_binary(ckpt: &str, bootstrap: &str) -> (ServiceProcess, String) {
    let mut p = ServiceProcess::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator")),
        &[
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--checkpoint-path",
            ckpt,
            "--checkpoint-interval",
            "0.05",
            "--event-transport",
            "kafka",
            "--kafka-bootstrap-servers",
            bootstrap,
        ],
    );
    let addr = p.admin_addr();
    (p, format!("http://{addr}"))
}

fn phase(instances: &[&str], seqs: std::ops::RangeInclusive<u64>) -> Vec<Record> {
    seqs.flat_map(|seq| {
        instances
            .iter()
            .map(move |id| batch_record(&scripted_batch(id, 3, seq)))
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_resumes_from_checkpoint_without_loss_or_double_apply() {
    let broker = tokio::task::block_in_place(Broker::start);
    broker.create_topic(TOPIC, 3);
    let producer = broker.producer();
    let ids = ["mp-a", "mp-b", "mp-c", "mp-d"];
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("coord.ckpt");
    let ckpt = ckpt.to_str().unwrap();
    let bootstrap = broker.bootstrap();
    let http = reqwest::Client::new();
    let mut sent = 0i64;
    let mut send = |records: Vec<Record>| {
        sent += i64::try_from(records.len()).unwrap();
        tokio::task::block_in_place(|| produce(&producer, TOPIC, &records));
        sent
    };

    // Run 1: consume a phase, then get SIGKILLed while the next one arrives,
    // so whatever the last periodic checkpoint holds is all that survives.
    let after_one = send(phase(&ids, 1..=25));
    let (mut p1, base) = tokio::task::block_in_place(|| start_binary(ckpt, &bootstrap));
    wait_status(&http, &base, "phase 1 consumed", |s| {
        consumed(s) == after_one
    })
    .await;
    let deadline = Instant::now() + DEADLINE;
    while !std::path::Path::new(ckpt).exists() {
        assert!(Instant::now() < deadline, "no periodic checkpoint written");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let after_two = send(phase(&ids, 26..=50));
    p1.signal(nix::sys::signal::Signal::SIGKILL);
    tokio::task::block_in_place(|| p1.wait_exit());

    // Run 2: restart on the checkpoint, stop cleanly with SIGTERM mid-stream.
    send(phase(&ids, 51..=75));
    let (mut p2, base) = tokio::task::block_in_place(|| start_binary(ckpt, &bootstrap));
    wait_status(&http, &base, "phases 1-2 consumed", |s| {
        consumed(s) >= after_two
    })
    .await;
    let total = send(phase(&ids, 76..=100));
    let code = tokio::task::block_in_place(|| p2.stop());
    assert!(code.success(), "{code:?}");
    // What the clean stop saved is where run 3 must pick up.
    let sections = ic_coordinator_core::checkpoint::decode_file(&std::fs::read(ckpt).unwrap())
        .unwrap()
        .sections;
    let saved: i64 = sections
        .kafka_stream_position
        .unwrap()
        .offsets
        .iter()
        .map(|(_, _, last)| last + 1)
        .sum();
    assert!(saved >= after_two && saved <= total, "{saved}");

    // Run 3: finish the stream.
    let (mut p3, base) = tokio::task::block_in_place(|| start_binary(ckpt, &bootstrap));
    wait_status(&http, &base, "every record consumed", |s| {
        consumed(s) == total
    })
    .await;
    let restarted = read_views(&http, &base).await;
    let m = metrics(&http, &base).await;
    // Run 3 read exactly the records after the saved position: it sought
    // there rather than re-reading the topic.
    let read: f64 = [
        "applied",
        "duplicate",
        "stale",
        "malformed",
        "already_consumed",
    ]
    .iter()
    .map(|r| {
        sample(
            &m,
            &format!("lmcache_coordinator_kafka_records_total{{result=\"{r}\"}}"),
        )
    })
    .sum();
    assert_eq!(read, (total - saved) as f64, "{m}");
    assert_eq!(
        sample(
            &m,
            "lmcache_coordinator_kafka_records_total{result=\"duplicate\"}"
        ),
        0.0
    );

    // Reference: one uninterrupted run over the whole topic.
    let fresh = dir.path().join("fresh.ckpt");
    let (mut p4, fbase) =
        tokio::task::block_in_place(|| start_binary(fresh.to_str().unwrap(), &bootstrap));
    wait_status(&http, &fbase, "every record consumed", |s| {
        consumed(s) == total
    })
    .await;
    let uninterrupted = read_views(&http, &fbase).await;
    assert_eq!(restarted["stats"], uninterrupted["stats"]);
    assert_eq!(restarted, uninterrupted);
    assert_eq!(
        uninterrupted["streams"].as_array().unwrap().len(),
        ids.len()
    );
    for s in uninterrupted["streams"].as_array().unwrap() {
        assert_eq!(s[2], 100, "last seq of {s}");
        assert_eq!(s[3], false, "no gap in {s}");
    }
    for p in [&mut p3, &mut p4] {
        let code = tokio::task::block_in_place(|| p.stop());
        assert!(code.success(), "{code:?}");
    }
}
