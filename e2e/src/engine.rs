//! A stand-in engine that speaks the real KV-event wire: a ZMQ PUB socket
//! publishing `topic | seq | payload` batches encoded exactly as an engine
//! era does, and a ZMQ ROUTER answering replay requests from its buffer.
//! Tests can make the PUB socket "lose" batches (they stay in the replay
//! buffer) and restart the engine (sequence numbers start over).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ic_kvevents::KvEvent;
use ic_kvevents::encode::{Era, encode_batch};
use zeromq::{Socket, SocketRecv, SocketSend};

use crate::free_port;

/// One engine DP rank: PUB on `events_port`, replay ROUTER on `replay_port`.
// Holds sockets, which have no Debug.
#[allow(missing_debug_implementations)]
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
