//! Real peers for the subscriber's component tests: an engine that publishes
//! the real wire over ZMQ (with a replay ROUTER), and a gRPC IndexService
//! that records every batch it receives and folds them into the index view
//! the real server would build.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ic_proto::index_v1 as pb;
use ic_proto::{IndexService, IndexServiceServer};
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------- helpers

pub use ic_e2e::free_port;

/// Polls `cond` until it holds or `timeout` passes.
pub async fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads one metric value (summing label sets) from a Prometheus text page.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

// ---------------------------------------------------------------- engine

pub use ic_e2e::engine::FakeEngine;

// ---------------------------------------------------------------- index server

type Key = (String, u32); // (replica id, dp rank)

/// What the recording server has seen.
#[derive(Debug, Default)]
pub struct Recorded {
    pub batches: Vec<pb::IngestBatch>,
    /// fingerprint → (tier, depth) per (replica, rank), as the index would hold it.
    pub view: HashMap<Key, BTreeMap<u64, (i32, u32)>>,
    shadow: HashMap<Key, BTreeMap<u64, (i32, u32)>>,
    pub resyncs: usize,
}

impl Recorded {
    fn apply(&mut self, batch: pb::IngestBatch) {
        let replica = batch.replica.clone().unwrap_or_default();
        let key = (replica.replica_id.clone(), replica.dp_rank);
        if batch.resync_begin {
            self.shadow.insert(key.clone(), BTreeMap::new());
        }
        let in_resync = self.shadow.contains_key(&key);
        {
            let target = if in_resync {
                self.shadow.get_mut(&key).unwrap()
            } else {
                self.view.entry(key.clone()).or_default()
            };
            for event in &batch.events {
                match event.kind.as_ref().unwrap() {
                    pb::index_event::Kind::Stored(s) => {
                        for (i, fp) in s.fingerprints.iter().enumerate() {
                            target.insert(*fp, (s.tier, s.start_depth + i as u32));
                        }
                    }
                    pb::index_event::Kind::Evicted(e) => {
                        for fp in &e.fingerprints {
                            target.remove(fp);
                        }
                    }
                    pb::index_event::Kind::Cleared(c) => target.retain(|_, (t, _)| *t != c.tier),
                }
            }
        }
        if batch.resync_end
            && let Some(state) = self.shadow.remove(&key)
        {
            self.view.insert(key, state);
            self.resyncs += 1;
        }
        self.batches.push(batch);
    }

    /// The index view of one replica rank: fingerprint → tier.
    pub fn tiers(&self, replica: &str, rank: u32) -> BTreeMap<u64, i32> {
        self.view
            .get(&(replica.to_owned(), rank))
            .map(|m| m.iter().map(|(fp, (t, _))| (*fp, *t)).collect())
            .unwrap_or_default()
    }
}

#[derive(Clone, Default)]
struct Recorder {
    recorded: Arc<Mutex<Recorded>>,
    /// Ends every stream when cancelled: in-process, aborting the server
    /// future would leave accepted connections alive, unlike a real restart.
    stop: CancellationToken,
    /// While true, streams are not read (a stalled server).
    paused: Arc<tokio::sync::watch::Sender<bool>>,
}

#[tonic::async_trait]
impl IndexService for Recorder {
    async fn lookup_route(
        &self,
        _: tonic::Request<pb::LookupRouteRequest>,
    ) -> Result<tonic::Response<pb::LookupRouteResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("recording server"))
    }

    async fn ingest_events(
        &self,
        request: tonic::Request<tonic::Streaming<pb::IngestBatch>>,
    ) -> Result<tonic::Response<pb::IngestAck>, tonic::Status> {
        let mut stream = request.into_inner();
        let mut last = 0;
        let mut paused = self.paused.subscribe();
        loop {
            let _ = paused.wait_for(|p| !*p).await;
            let batch = tokio::select! {
                m = stream.message() => m?,
                () = self.stop.cancelled() => return Err(tonic::Status::unavailable("stopping")),
            };
            let Some(batch) = batch else { break };
            last = batch.seq;
            self.recorded.lock().unwrap().apply(batch);
        }
        Ok(tonic::Response::new(pb::IngestAck {
            last_applied_seq: last,
            ..Default::default()
        }))
    }

    async fn set_policies(
        &self,
        _: tonic::Request<pb::SetPoliciesRequest>,
    ) -> Result<tonic::Response<pb::SetPoliciesResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("recording server"))
    }
}

/// A real gRPC server on loopback recording what subscribers send.
pub struct RecordingIndex {
    pub addr: SocketAddr,
    pub recorded: Arc<Mutex<Recorded>>,
    paused: Arc<tokio::sync::watch::Sender<bool>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl RecordingIndex {
    pub async fn start() -> Self {
        Self::start_on(0).await
    }

    pub async fn start_on(port: u16) -> Self {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("bind gRPC");
        let addr = listener.local_addr().unwrap();
        let recorder = Recorder::default();
        let recorded = recorder.recorded.clone();
        let paused = recorder.paused.clone();
        let stop = recorder.stop.clone();
        let token = stop.clone();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(IndexServiceServer::new(recorder))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::TcpListenerStream::new(listener),
                    token.cancelled_owned(),
                )
                .await
                .expect("serve");
        });
        Self {
            addr,
            recorded,
            paused,
            stop,
            task,
        }
    }

    /// Stops (or resumes) reading ingest streams.
    pub fn pause(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Whether any batch received said its rank's history is incomplete.
    pub fn flagged_incomplete(&self) -> bool {
        self.recorded
            .lock()
            .unwrap()
            .batches
            .iter()
            .any(|b| b.history_incomplete)
    }

    pub fn tiers(&self, replica: &str, rank: u32) -> BTreeMap<u64, i32> {
        self.recorded.lock().unwrap().tiers(replica, rank)
    }

    pub fn resyncs(&self) -> usize {
        self.recorded.lock().unwrap().resyncs
    }

    pub async fn stop(self) {
        self.stop.cancel();
        // In-flight streams are not graceful-shutdown aware; abort them.
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.task.abort();
        let _ = self.task.await;
    }
}

// ---------------------------------------------------------------- subscriber

pub struct Subscriber {
    pub admin: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

pub struct SubscriberOptions {
    pub replay: bool,
    pub dp_ranks: u32,
    pub ignore_block_removed: bool,
    pub queue_capacity: usize,
    pub hash_scheme: &'static str,
    pub topic: String,
    pub engine_metrics_url: Option<String>,
    /// Read events from here instead of the engine's PUB socket.
    pub events_endpoint: Option<String>,
    pub max_receive_errors: Option<u32>,
    pub replay_timeout_ms: Option<u64>,
}

impl Default for SubscriberOptions {
    fn default() -> Self {
        Self {
            replay: true,
            dp_ranks: 1,
            ignore_block_removed: false,
            queue_capacity: 100_000,
            hash_scheme: "vllm",
            topic: String::new(),
            engine_metrics_url: None,
            events_endpoint: None,
            max_receive_errors: None,
            replay_timeout_ms: None,
        }
    }
}

impl Subscriber {
    pub fn start(engine: &FakeEngine, index_url: &str, opts: SubscriberOptions) -> Self {
        let events = opts
            .events_endpoint
            .clone()
            .unwrap_or_else(|| engine.events_endpoint());
        let replay = opts.replay.then(|| engine.replay_endpoint());
        Self::start_at(&events, replay.as_deref(), index_url, opts)
    }

    /// A subscriber reading `events` (and replaying from `replay`), for
    /// engines that are not a [`FakeEngine`] (a separate process).
    pub fn start_at(
        events: &str,
        replay: Option<&str>,
        index_url: &str,
        opts: SubscriberOptions,
    ) -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Args {
            #[command(flatten)]
            config: ic_kvevent_subscriber::Config,
        }
        let admin_port = free_port();
        let mut argv = vec![
            "ic-kvevent-subscriber".to_owned(),
            format!("--admin-addr=127.0.0.1:{admin_port}"),
            format!("--engine-endpoint={events}"),
            format!("--index-server={index_url}"),
            "--model-id=test/model".into(),
            "--replica-id=engine-0".into(),
            "--tenant=team-a".into(),
            "--address=10.0.0.7:8000".into(),
            format!("--hash-scheme={}", opts.hash_scheme),
            format!("--dp-ranks={}", opts.dp_ranks),
            format!("--queue-capacity={}", opts.queue_capacity),
            format!("--ignore-block-removed={}", opts.ignore_block_removed),
            format!("--topic={}", opts.topic),
        ];
        if let Some(url) = &opts.engine_metrics_url {
            argv.push(format!("--engine-metrics-url={url}"));
            argv.push("--tier2-scrape-interval-seconds=1".into());
        }
        if let Some(n) = opts.max_receive_errors {
            argv.push(format!("--max-receive-errors={n}"));
        }
        if let Some(replay) = replay {
            argv.push(format!("--replay-endpoint={replay}"));
        }
        if let Some(ms) = opts.replay_timeout_ms {
            argv.push(format!("--replay-timeout-ms={ms}"));
        }
        let config = Args::try_parse_from(argv).expect("flags").config;
        let stop = CancellationToken::new();
        let task = tokio::spawn(ic_kvevent_subscriber::run(config, stop.clone()));
        Self {
            admin: SocketAddr::from(([127, 0, 0, 1], admin_port)),
            stop,
            task,
        }
    }

    /// Waits until the admin server accepts connections (the tests that
    /// do not wait for an engine subscription first).
    pub async fn wait_for_admin(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(self.admin).await.is_err() {
            assert!(Instant::now() < deadline, "admin server never came up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn metrics(&self) -> String {
        let addr = self.admin;
        tokio::task::spawn_blocking(move || ic_e2e::http_get(addr, "/metrics").1)
            .await
            .unwrap()
    }

    pub async fn metric(&self, name: &str) -> f64 {
        metric(&self.metrics().await, name)
    }

    pub async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap().unwrap();
    }
}
