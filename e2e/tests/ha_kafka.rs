//! Active-active index servers over Kafka, with the real binaries on
//! loopback and the real tansu broker: engines publishing the real vLLM
//! wire, `ic-kvevent-subscriber --transport kafka` producing every batch to
//! one topic, and `ic-index-server --transport kafka` replicas each
//! consuming every partition on their own. Replicas are killed and
//! restarted (from their snapshot plus the log's tail), started late
//! (from the earliest offset), subscribers restarted, the broker frozen
//! past the delivery timeout and stopped and restarted on its log; every
//! scenario ends with every replica equal to what the engines hold (its
//! `/snapshot` block count per replica and a full-length `LookupRoute`
//! match on each engine's newest prompt) and all replicas giving the same
//! LookupRoute answers. The broker is `ic_sim`'s ([`Broker`]), shared with
//! the subscriber's producer tests; the replicas and the checks are in
//! `ha_kafka/replicas.rs`.
//!
//! Times are printed as `kafka figure:` lines; nothing asserts a duration
//! beyond the generous "it converges at all" deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ic_e2e::tansu::Broker;
use ic_e2e::{ServiceProcess, workspace_binary};
use nix::sys::signal::Signal;

#[path = "support/fleet.rs"]
mod fleet;
#[path = "support/gateway.rs"]
mod gateway;
#[path = "ha_kafka/replicas.rs"]
mod replicas;

use fleet::{Engine, MODEL, TENANT, metric, rounds};
use gateway::{Gateway, WORKERS};
use replicas::{
    CONVERGE, NO_INDEX_SERVER, converge, diagnose, event_to_visible, figure, get, kafka_flags,
    matches_engines, producers, records_dropped, replica, replica_with, snapshot_blocks,
};

const TOPIC: &str = "inferencecache.index-events";
const PARTITIONS: u32 = 3;

/// A broker on a free loopback port (a restart takes the same one), its
/// log in SQLite, with the topic.
fn start_broker() -> Broker {
    let broker = Broker::start(ic_e2e::free_port());
    broker.create_topic(TOPIC, PARTITIONS);
    broker
}

/// Two replicas consuming; one killed with -9 and restarted from its
/// snapshot plus the tail; a third started late from the earliest offset;
/// a subscriber killed and replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_survive_kills_late_starts_and_subscriber_restarts() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut a = replica(&bootstrap, Some(dirs[0].path()));
    let mut b = replica(&bootstrap, Some(dirs[1].path()));
    let (mut engines, mut sidecars) =
        fleet::fleet(3, NO_INDEX_SERVER, &kafka_flags(&bootstrap)).await;
    rounds(&mut engines, 20).await;
    let took = converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "two replicas",
    )
    .await;
    figure(
        "two replicas, 3 engines",
        format!("converged in {} ms", took.as_millis()),
    );
    let gateway = Gateway::start([a.endpoint(), b.endpoint()]);
    gateway.wait_ready(0, "at start").await;
    gateway.wait_ready(1, "at start").await;

    let (p50, p99) = event_to_visible(&mut engines[0], a.grpc, 40).await;
    figure(
        "event to visible in LookupRoute through Kafka, 40 events",
        format!("p50 {} ms, p99 {} ms", p50.as_millis(), p99.as_millis()),
    );

    // kill -9 one replica once it has written a snapshot; the engines go on.
    a.process.wait_for_log("snapshot written");
    a.process.signal(Signal::SIGKILL);
    assert!(!a.process.wait_exit().success());
    rounds(&mut engines, 20).await;
    let restarted_at = Instant::now();
    let mut a = replica(&bootstrap, Some(dirs[0].path()));
    gateway.replace(0, a.endpoint());
    let loaded = a
        .process
        .wait_for_log("snapshot loaded; replaying the topic from its offsets");
    assert!(
        loaded["fields"]["entries"].as_u64().unwrap_or(0) > 0,
        "the restarted replica loaded a non-empty snapshot: {loaded}"
    );
    rounds(&mut engines, 5).await;
    converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "after kill -9 and restart",
    )
    .await;
    figure(
        "replica kill -9, restart from snapshot + tail",
        format!(
            "converged {} ms after the restart",
            restarted_at.elapsed().as_millis()
        ),
    );
    assert!(metric(a.http, "inferencecache_index_kafka_snapshots_total") >= 1.0);
    gateway.wait_ready(0, "after kill -9 and restart").await;
    let (_, failed_at_kill) = gateway.counts();
    assert!(
        failed_at_kill <= WORKERS as u64,
        "a kill -9 costs at most the picks in flight ({WORKERS}): {failed_at_kill} failed, {:?}",
        gateway.failures.lock()
    );

    // A replica started late reads the whole retained log.
    let started = Instant::now();
    let mut c = replica(&bootstrap, None);
    gateway.add(c.endpoint());
    converge(
        &mut [&mut a, &mut b, &mut c],
        &engines,
        &broker,
        &mut sidecars,
        "a late replica",
    )
    .await;
    gateway.wait_ready(2, "a late replica").await;
    figure(
        "replica started late (no snapshot)",
        format!("converged {} ms after start", started.elapsed().as_millis()),
    );

    // A subscriber killed and replaced: the new one resyncs its engine.
    sidecars[0].signal(Signal::SIGKILL);
    assert!(!sidecars[0].wait_exit().success());
    rounds(&mut engines, 5).await;
    sidecars[0] = fleet::subscriber(&engines[0], NO_INDEX_SERVER, &kafka_flags(&bootstrap));
    engines[0].engine.wait_for_subscriber().await;
    rounds(&mut engines, 5).await;
    let took = converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "after a subscriber restart",
    )
    .await;
    figure(
        "subscriber kill -9",
        format!(
            "converged {} ms after the new sidecar subscribed",
            took.as_millis()
        ),
    );
    let (ok, failed, failures) = gateway.stop().await;
    figure(
        "gateway picks through the kill, the late replica and the subscriber restart",
        format!("{ok} made, {failed} failed"),
    );
    assert_eq!(
        failed, failed_at_kill,
        "only the kill -9 may cost picks: {failures:?}"
    );
    assert!(ok > 0, "the gateway picked at all");
    assert!(c.process.stop().success());
    broker.assert_no_panic("kills, late start, subscriber restart");

    for mut s in sidecars {
        assert!(s.stop().success());
    }
    assert!(a.process.stop().success());
    assert!(b.process.stop().success());
}

/// The broker stops answering for longer than the producers' delivery
/// timeout (frozen with SIGSTOP: the connections stay open and silent, the
/// harder case for a client). The subscribers drop
/// what does not reach it, count it and resync; the replicas keep serving
/// their last view meanwhile and converge once the broker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_converge_after_a_broker_outage() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut a = replica(&bootstrap, None);
    let mut b = replica(&bootstrap, None);
    let (mut engines, mut sidecars) =
        fleet::fleet(3, NO_INDEX_SERVER, &kafka_flags(&bootstrap)).await;
    rounds(&mut engines, 20).await;
    converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "before the outage",
    )
    .await;
    let before = snapshot_blocks(&mut a).unwrap();

    // Until every thread of it is stopped: kill returns before that.
    broker.freeze();
    rounds(&mut engines, 5).await;
    // Longer than --kafka-delivery-timeout-ms: what was sent is dropped.
    tokio::time::sleep(Duration::from_secs(6)).await;
    // The replicas kept their view and kept answering.
    assert_eq!(snapshot_blocks(&mut a).unwrap(), before);
    broker.thaw();
    let back = Instant::now();
    rounds(&mut engines, 5).await;
    converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "after the outage",
    )
    .await;
    figure(
        "broker frozen 6 s (deliveries timed out)",
        format!(
            "converged {} ms after it came back",
            back.elapsed().as_millis()
        ),
    );
    let dropped = records_dropped(&mut sidecars);
    assert!(
        dropped >= 1.0,
        "the outage dropped records and counted them"
    );
    figure("broker frozen 6 s: producers", producers(&mut sidecars));
    // sqlite:// panics on a producer epoch it did not create (memory://
    // would only fence it): our producers never send one.
    broker.assert_no_panic("after the outage");
    for mut s in sidecars {
        assert!(s.stop().success());
    }
    assert!(a.process.stop().success());
    assert!(b.process.stop().success());
}

/// The broker is stopped and started again on its log while the engines
/// keep publishing: producers and consumers reconnect on their own,
/// what did not reach the broker in time is dropped, counted and resynced,
/// and the replicas, which kept serving their last view, converge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_converge_after_a_broker_restart() {
    let mut broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut a = replica(&bootstrap, None);
    let mut b = replica(&bootstrap, None);
    let (mut engines, mut sidecars) =
        fleet::fleet(3, NO_INDEX_SERVER, &kafka_flags(&bootstrap)).await;
    rounds(&mut engines, 20).await;
    converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "before the restart",
    )
    .await;
    let before = snapshot_blocks(&mut a).unwrap();
    let gateway = Gateway::start([a.endpoint(), b.endpoint()]);
    gateway.wait_ready(0, "before the restart").await;
    gateway.wait_ready(1, "before the restart").await;

    broker.stop();
    rounds(&mut engines, 5).await;
    // Longer than --kafka-delivery-timeout-ms: what was sent is dropped.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        snapshot_blocks(&mut a).unwrap(),
        before,
        "a replica keeps serving its last view while the broker is down"
    );
    broker.start_again();
    let back = Instant::now();
    rounds(&mut engines, 5).await;
    converge(
        &mut [&mut a, &mut b],
        &engines,
        &broker,
        &mut sidecars,
        "after the restart",
    )
    .await;
    figure(
        "broker stopped, down 4 s, restarted on its log",
        format!(
            "converged {} ms after it came back",
            back.elapsed().as_millis()
        ),
    );
    let dropped = records_dropped(&mut sidecars);
    assert!(
        dropped >= 1.0,
        "the restart dropped records and counted them"
    );
    figure("broker restart: producers", producers(&mut sidecars));
    broker.assert_no_panic("after the restart");
    let (ok, failed, failures) = gateway.stop().await;
    figure(
        "gateway picks through the broker restart",
        format!("{ok} made, {failed} failed"),
    );
    assert_eq!(failed, 0, "a broker restart costs no pick: {failures:?}");
    assert!(ok > 0, "the gateway picked at all");
    for mut s in sidecars {
        assert!(s.stop().success());
    }
    assert!(a.process.stop().success());
    assert!(b.process.stop().success());
}

/// What the webhook injects with `--subscriber-transport kafka` is enough
/// for a subscriber to produce to the topic: the sidecar is started with
/// exactly the injected arguments and the downward-API env (nothing
/// added but a loopback admin address), and an index replica that no
/// subscriber can reach over gRPC converges on the engine from the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_with_the_injected_kafka_arguments_feeds_the_replicas() {
    use ic_adapters::admission::{InjectionConfig, SubscriberKafka, admit_pod};
    use serde_json::json;
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let mut a = replica(&bootstrap, None);
    let engine =
        ic_e2e::engine::FakeEngine::start(ic_kvevents::encode::Era::VllmMap, "kv-events").await;
    let port = |endpoint: String| endpoint.rsplit_once(':').unwrap().1.to_owned();
    let events = json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": format!("tcp://*:{}", port(engine.events_endpoint())),
        "replay_endpoint": format!("tcp://*:{}", port(engine.replay_endpoint())),
        "topic": "kv-events",
    });
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "engine-0", "namespace": TENANT, "labels": {"app": "engine"}},
        "spec": {"containers": [{
            "name": "server",
            "image": "vllm/vllm-openai:v0.11.0",
            "args": ["--model", MODEL, "--kv-events-config", events.to_string()],
            "ports": [{"containerPort": 8000, "name": "http"}],
        }]},
    }))
    .unwrap();
    let backend: ic_api::CacheBackend = serde_json::from_value(json!({
        "apiVersion": "inferencecache.io/v1alpha1",
        "kind": "CacheBackend",
        "metadata": {"name": "events", "namespace": TENANT, "uid": "uid-events"},
        "spec": {
            "runtime": "VLLM",
            "type": "LMCache",
            "engineSelector": {"matchLabels": {"app": "engine"}},
            "integration": {"mode": "EventsOnly"},
            "observation": {"modelID": MODEL},
        },
    }))
    .unwrap();
    let config = InjectionConfig {
        subscriber_image: Some("ghcr.io/inferencecache/kvevent-subscriber:test".into()),
        // What the chart sets; the Kafka transport must not dial it.
        index_server: "http://127.0.0.1:9".into(),
        index_server_audience: Some("inferencecache-index-server".into()),
        subscriber_kafka: Some(SubscriberKafka {
            brokers: bootstrap.clone(),
            topic: TOPIC.into(),
            security_protocol: "plaintext".into(),
            ..SubscriberKafka::default()
        }),
        ..InjectionConfig::default()
    };
    let admitted = admit_pod(&pod, std::slice::from_ref(&backend), &config);
    let sidecar = admitted
        .pod
        .spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .find(|c| c.name == "kvevent-subscriber")
        .unwrap_or_else(|| panic!("no subscriber injected: {:?}", admitted.warnings))
        .clone();
    let mut args = sidecar.args.clone().unwrap();
    assert!(args.contains(&"--transport=kafka".to_owned()), "{args:?}");
    args.extend(["--admin-addr".to_owned(), "127.0.0.1:0".to_owned()]);
    // The downward API's values for the env the container declares.
    let downward = [
        ("POD_NAME", "engine-0"),
        ("POD_NAMESPACE", TENANT),
        ("POD_IP", "10.0.0.0"),
    ];
    for e in sidecar.env.iter().flatten() {
        assert!(
            e.value.is_some() || downward.iter().any(|(n, _)| *n == e.name) || e.name == "HOST_IP",
            "an env the test cannot give: {e:?}"
        );
    }
    let mut env: Vec<(&str, &str)> = downward.to_vec();
    let literal: Vec<(String, String)> = sidecar
        .env
        .iter()
        .flatten()
        .filter_map(|e| e.value.clone().map(|v| (e.name.clone(), v)))
        .collect();
    env.extend(literal.iter().map(|(n, v)| (n.as_str(), v.as_str())));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut subscriber =
        ServiceProcess::start_with_env(&workspace_binary("ic-kvevent-subscriber"), &args, &env);
    let mut engines = vec![Engine {
        engine,
        replica: "engine-0".into(),
        index: 0,
        chains: BTreeMap::new(),
        next_chain: 0,
    }];
    engines[0].engine.wait_for_subscriber().await;
    rounds(&mut engines, 10).await;
    let took = converge(
        &mut [&mut a],
        &engines,
        &broker,
        std::slice::from_mut(&mut subscriber),
        "injected Kafka arguments",
    )
    .await;
    figure(
        "a subscriber with the webhook's injected Kafka arguments",
        format!("replica converged in {} ms", took.as_millis()),
    );
    let admin = subscriber.admin_addr();
    assert!(
        metric(
            admin,
            "inferencecache_subscriber_kafka_records_delivered_total"
        ) >= 1.0,
        "the sidecar produced to the topic"
    );
    broker.assert_no_panic("injected Kafka arguments");
    assert!(subscriber.stop().success());
    assert!(a.process.stop().success());
}

/// The replica's lag and partition queries go to a loopback listener that
/// accepts and never answers (the hidden --kafka-probe-brokers), its
/// reading client to the real broker: every lag query hangs until its
/// timeout and fails, yet the records are read and applied all along (the
/// replica comes to equal the engines), the failed queries are counted and
/// the replica, its lag unknown, stays not ready. With the lag check on the
/// reading thread and a failed query ending the round, the first failed query kept
/// the replica from reading at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_reads_while_its_lag_queries_fail() {
    let broker = start_broker();
    let bootstrap = broker.bootstrap();
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    // Holds every connection open, unanswered, until the test ends.
    std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().filter_map(Result::ok).collect();
        drop(held);
    });
    let mut a = replica_with(
        &bootstrap,
        None,
        &["--kafka-probe-brokers", silent_addr.as_str()],
    );
    let (mut engines, mut sidecars) =
        fleet::fleet(3, NO_INDEX_SERVER, &kafka_flags(&bootstrap)).await;
    rounds(&mut engines, 20).await;
    let started = Instant::now();
    loop {
        match matches_engines(&mut a, &engines).await {
            Ok(_) => break,
            Err(why) if started.elapsed() >= CONVERGE => panic!(
                "the replica did not apply the records while its lag queries hung: {why}\n{}",
                diagnose(&[&mut a], &mut sidecars, &broker)
            ),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let errors = "inferencecache_index_kafka_consumer_errors_total";
    while metric(a.http, errors) < 1.0 {
        assert!(
            started.elapsed() < CONVERGE,
            "the hung lag queries were never counted\n{}",
            diagnose(&[&mut a], &mut sidecars, &broker)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // More records while the queries keep failing: still applied.
    rounds(&mut engines, 5).await;
    loop {
        match matches_engines(&mut a, &engines).await {
            Ok(_) => break,
            Err(why) if started.elapsed() >= CONVERGE => {
                panic!("later records were not applied: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    assert_eq!(
        metric(a.http, "inferencecache_index_kafka_consumer_ready"),
        0.0,
        "no lag known: not ready"
    );
    assert_ne!(get(&mut a, "/ready").0, 200, "no lag known: /ready fails");
    broker.assert_no_panic("with the lag queries failing");
    for mut s in sidecars {
        assert!(s.stop().success());
    }
    assert!(a.process.stop().success());
}
