//! A stand-in engine that speaks the real KV-event wire: a ZMQ PUB socket
//! publishing `topic | seq | payload` batches encoded exactly as an engine
//! era does, and a ZMQ ROUTER answering replay requests from its buffer.
//! Tests can make the PUB socket "lose" batches (they stay in the replay
//! buffer) and restart the engine (sequence numbers start over).
//!
//! The socket is an XPUB so the engine can see a subscriber's subscription
//! arrive: `wait_for_subscriber` returns when the subscription to the topic
//! has been registered, not after a guessed delay. (XPUB registers a
//! subscription only when the application reads it, so every send first
//! reads whatever subscriptions are pending.)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use ic_kvevents::KvEvent;
use ic_kvevents::encode::{Era, encode_batch};
use zeromq::{Endpoint, Socket, SocketRecv, SocketSend};

/// One engine DP rank: PUB on `events_port`, replay ROUTER on `replay_port`.
// Holds sockets, which have no Debug.
#[allow(missing_debug_implementations)]
pub struct FakeEngine {
    socket: zeromq::XPubSocket,
    topic: Bytes,
    era: Era,
    next_seq: u64,
    buffer: Arc<Mutex<Vec<(u64, Bytes)>>>,
    pub events_port: u16,
    pub replay_port: u16,
    replay_task: tokio::task::JoinHandle<()>,
    /// Reply to replay requests in the pre-0.26 framing.
    pub old_replay_framing: Arc<std::sync::atomic::AtomicBool>,
    /// Replay at most this many batches per request, then fall silent
    /// (no end marker): a replay that stalls part way. `usize::MAX`: never.
    pub replay_stalls_after: Arc<std::sync::atomic::AtomicUsize>,
}

impl FakeEngine {
    /// An engine on ports the OS picks (read them back from the fields).
    pub async fn start(era: Era, topic: &str) -> Self {
        Self::start_on(era, topic, 0, 0).await
    }

    /// An engine on the given ports; 0 lets the OS pick.
    pub async fn start_on(era: Era, topic: &str, events_port: u16, replay_port: u16) -> Self {
        let mut socket = zeromq::XPubSocket::new();
        let events_port = bound_port(
            socket
                .bind(&format!("tcp://127.0.0.1:{events_port}"))
                .await
                .expect("bind PUB"),
        );
        let buffer: Arc<Mutex<Vec<(u64, Bytes)>>> = Arc::default();
        let old_replay_framing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut router = zeromq::RouterSocket::new();
        let replay_port = bound_port(
            router
                .bind(&format!("tcp://127.0.0.1:{replay_port}"))
                .await
                .expect("bind ROUTER"),
        );
        let replay_buffer = buffer.clone();
        let topic_bytes = Bytes::copy_from_slice(topic.as_bytes());
        let old = old_replay_framing.clone();
        let replay_stalls_after = Arc::new(std::sync::atomic::AtomicUsize::new(usize::MAX));
        let stalls_after = replay_stalls_after.clone();
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
                let stall = stalls_after.load(std::sync::atomic::Ordering::SeqCst);
                let stalls = batches.len() > stall;
                for (seq, payload) in batches.into_iter().take(stall) {
                    let mut reply = vec![identity.clone(), Bytes::new()];
                    if !old {
                        reply.push(topic_bytes.clone());
                    }
                    reply.push(Bytes::copy_from_slice(&seq.to_be_bytes()));
                    reply.push(payload);
                    let _ = router.send(reply.try_into().unwrap()).await;
                }
                if stalls {
                    continue;
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
            old_replay_framing,
            replay_stalls_after,
        }
    }

    pub fn events_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.events_port)
    }

    pub fn replay_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.replay_port)
    }

    /// Flags for an `ic-kvevent-subscriber` reading this engine (topic
    /// `kv-events`, replay enabled) and forwarding to `index_url`.
    pub fn subscriber_args(
        &self,
        index_url: &str,
        replica_id: &str,
        tenant: &str,
        model: &str,
        address: &str,
    ) -> Vec<String> {
        [
            "--admin-addr",
            "127.0.0.1:0",
            "--engine-endpoint",
            &self.events_endpoint(),
            "--replay-endpoint",
            &self.replay_endpoint(),
            "--topic",
            "kv-events",
            "--index-server",
            index_url,
            "--model-id",
            model,
            "--replica-id",
            replica_id,
            "--tenant",
            tenant,
            "--address",
            address,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    }

    /// Waits until a subscriber's subscription to this engine's topic has
    /// been registered, so the next batch published reaches it.
    pub async fn wait_for_subscriber(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match tokio::time::timeout_at(deadline, self.socket.recv()).await {
                Ok(Ok(message)) if self.subscribes_to_topic(&message) => return,
                Ok(Ok(_)) => continue,
                Ok(Err(error)) => {
                    panic!("XPUB socket failed while waiting for a subscriber: {error}")
                }
                Err(_) => panic!("no subscriber subscribed to the topic within 30 s"),
            }
        }
    }

    /// A subscribe message (`0x01` + prefix) whose prefix matches the topic.
    fn subscribes_to_topic(&self, message: &zeromq::ZmqMessage) -> bool {
        message.len() == 1
            && message.get(0).is_some_and(|frame| {
                frame.first() == Some(&1) && self.topic.starts_with(&frame[1..])
            })
    }

    /// Registers subscriptions that arrived since the last read (a
    /// subscriber that reconnected on its own), without waiting.
    fn absorb_subscriptions(&mut self) {
        while let Some(Ok(_)) = self.socket.recv().now_or_never() {}
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
        self.absorb_subscriptions();
        self.socket
            .send(frames.try_into().unwrap())
            .await
            .expect("publish");
    }

    /// The replay buffer rolled over: batches before `seq` are gone from it.
    pub fn forget_before(&mut self, seq: u64) {
        self.buffer.lock().unwrap().retain(|(s, _)| *s >= seq);
    }

    /// The engine restarted: sequence numbers start over, the buffer is gone.
    pub fn restart(&mut self) {
        self.next_seq = 0;
        self.buffer.lock().unwrap().clear();
    }
}

/// The port a TCP bind ended up on (zeromq resolves port 0).
fn bound_port(endpoint: Endpoint) -> u16 {
    match endpoint {
        Endpoint::Tcp(_, port) => port,
        other => panic!("a tcp:// bind answered {other}"),
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.replay_task.abort();
    }
}

/// A publisher that completes the ZMTP 3.0 handshake (NULL mechanism, as a
/// PUB) and then sends a frame header whose length no reader can accept, on
/// every connection: the subscriber's receive fails each time. Counts the
/// connections it accepted.
#[allow(missing_debug_implementations)]
pub struct GarbagePublisher {
    pub port: u16,
    pub connections: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl GarbagePublisher {
    pub fn start() -> Self {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (count, stopped) = (connections.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                let mut stream = match listener.accept() {
                    Ok((stream, _)) => stream,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                };
                count.fetch_add(1, Ordering::SeqCst);
                stream.set_nonblocking(false).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(5)))
                    .unwrap();
                let mut greeting = [0u8; 64];
                greeting[0] = 0xff;
                greeting[9] = 0x7f;
                greeting[10] = 3;
                greeting[12..16].copy_from_slice(b"NULL");
                let mut ready = vec![0x04, 0];
                ready.push(5);
                ready.extend_from_slice(b"READY");
                ready.push(11);
                ready.extend_from_slice(b"Socket-Type");
                ready.extend_from_slice(&3u32.to_be_bytes());
                ready.extend_from_slice(b"PUB");
                ready[1] = u8::try_from(ready.len() - 2).unwrap();
                // A long frame claiming u64::MAX bytes: a decode error.
                let mut garbage = vec![0x02];
                garbage.extend_from_slice(&u64::MAX.to_be_bytes());
                let mut peer = [0u8; 64];
                let _ = (|| -> std::io::Result<()> {
                    stream.write_all(&greeting)?;
                    stream.read_exact(&mut peer)?;
                    stream.write_all(&ready)?;
                    // The peer's READY (and perhaps its subscription).
                    let mut buf = [0u8; 256];
                    let _ = stream.read(&mut buf)?;
                    stream.write_all(&garbage)?;
                    std::thread::sleep(Duration::from_millis(20));
                    Ok(())
                })();
            }
        });
        Self {
            port,
            connections,
            stop,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }
}

impl Drop for GarbagePublisher {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}
