//! Real peers for the subscriber's component tests: an engine that publishes
//! the real wire over ZMQ (with a replay ROUTER), and a gRPC IndexService
//! that records every batch it receives and folds them into the index view
//! the real server would build.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ic_kvevents::KvEvent;
use ic_kvevents::encode::{Era, encode_batch};
use ic_proto::index_v1 as pb;
use ic_proto::{IndexService, IndexServiceServer};
use tokio_util::sync::CancellationToken;
use zeromq::{Socket, SocketRecv, SocketSend};

// ---------------------------------------------------------------- helpers

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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

/// One engine DP rank: PUB on `events_port`, replay ROUTER on `replay_port`.
pub struct FakeEngine {
    socket: zeromq::PubSocket,
    topic: Bytes,
    era: Era,
    next_seq: u64,
    buffer: Arc<Mutex<Vec<(u64, Bytes)>>>,
    pub events_port: u16,
    pub replay_port: u16,
    replay_task: tokio::task::JoinHandle<()>,
    connected: futures::channel::mpsc::Receiver<zeromq::SocketEvent>,
    /// Reply to replay requests in the pre-0.26 framing.
    pub old_replay_framing: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeEngine {
    pub async fn start(era: Era, topic: &str) -> Self {
        Self::start_on(era, topic, free_port(), free_port()).await
    }

    pub async fn start_on(era: Era, topic: &str, events_port: u16, replay_port: u16) -> Self {
        let mut socket = zeromq::PubSocket::new();
        let connected = socket.monitor();
        socket
            .bind(&format!("tcp://127.0.0.1:{events_port}"))
            .await
            .expect("bind PUB");
        let buffer: Arc<Mutex<Vec<(u64, Bytes)>>> = Arc::default();
        let old_replay_framing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut router = zeromq::RouterSocket::new();
        router
            .bind(&format!("tcp://127.0.0.1:{replay_port}"))
            .await
            .expect("bind ROUTER");
        let replay_buffer = buffer.clone();
        let topic_bytes = Bytes::copy_from_slice(topic.as_bytes());
        let old = old_replay_framing.clone();
        let replay_task = tokio::spawn(async move {
            while let Ok(request) = router.recv().await {
                let frames = request.into_vec();
                let (Some(identity), Some(start)) = (frames.first(), frames.get(2)) else {
                    continue;
                };
                let start = u64::from_be_bytes(start[..8].try_into().unwrap());
                let batches: Vec<(u64, Bytes)> = replay_buffer
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(s, _)| *s >= start)
                    .cloned()
                    .collect();
                let old = old.load(std::sync::atomic::Ordering::SeqCst);
                for (seq, payload) in batches {
                    let mut reply = vec![identity.clone(), Bytes::new()];
                    if !old {
                        reply.push(topic_bytes.clone());
                    }
                    reply.push(Bytes::copy_from_slice(&seq.to_be_bytes()));
                    reply.push(payload);
                    let _ = router.send(reply.try_into().unwrap()).await;
                }
                let mut end = vec![identity.clone(), Bytes::new()];
                if !old {
                    end.push(Bytes::new());
                }
                end.push(Bytes::from_static(&[0xff; 8]));
                end.push(Bytes::new());
                let _ = router.send(end.try_into().unwrap()).await;
            }
        });
        Self {
            socket,
            topic: Bytes::copy_from_slice(topic.as_bytes()),
            era,
            next_seq: 0,
            buffer,
            events_port,
            replay_port,
            replay_task,
            connected,
            old_replay_framing,
        }
    }

    pub fn events_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.events_port)
    }

    pub fn replay_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.replay_port)
    }

    /// Waits until a subscriber has connected (and had time to subscribe).
    pub async fn wait_for_subscriber(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match tokio::time::timeout_at(deadline, futures::StreamExt::next(&mut self.connected))
                .await
            {
                Ok(Some(zeromq::SocketEvent::Accepted(..))) => break,
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => panic!("no subscriber connected"),
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    fn next(&mut self, events: &[KvEvent]) -> (u64, Bytes) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = Bytes::from(encode_batch(
            self.era,
            1_700_000_000.0 + seq as f64,
            events,
            Some(0),
        ));
        self.buffer.lock().unwrap().push((seq, payload.clone()));
        (seq, payload)
    }

    /// Publishes a batch; returns its sequence number.
    pub async fn publish(&mut self, events: &[KvEvent]) -> u64 {
        let (seq, payload) = self.next(events);
        self.send_raw(vec![
            self.topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ])
        .await;
        seq
    }

    /// A batch the PUB socket "lost": buffered for replay, never sent live.
    pub fn publish_lost(&mut self, events: &[KvEvent]) -> u64 {
        self.next(events).0
    }

    /// Sends arbitrary frames (for malformed-input tests).
    pub async fn send_raw(&mut self, frames: Vec<Bytes>) {
        self.socket
            .send(frames.try_into().unwrap())
            .await
            .expect("publish");
    }

    /// The engine restarted: sequence numbers start over, the buffer is gone.
    pub fn restart(&mut self) {
        self.next_seq = 0;
        self.buffer.lock().unwrap().clear();
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.replay_task.abort();
    }
}

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
        }
    }
}

impl Subscriber {
    pub fn start(engine: &FakeEngine, index_url: &str, opts: SubscriberOptions) -> Self {
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
            format!("--engine-endpoint={}", engine.events_endpoint()),
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
        if opts.replay {
            argv.push(format!("--replay-endpoint={}", engine.replay_endpoint()));
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
