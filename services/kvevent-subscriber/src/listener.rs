//! Reads one DP rank's KV-event stream from the engine over ZMQ.
//!
//! A SUB socket receives `topic | seq | payload` messages. Sequence numbers
//! reveal loss (a gap: replay it from the engine's buffer over a DEALER when
//! a replay endpoint is configured, otherwise count it as lost) and engine
//! restarts (the sequence goes backwards: forget the rank's state). Malformed
//! messages are counted and skipped; the state already built is kept.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ic_kvevents::frames::{ReplayReply, parse_event_message, parse_replay_reply, replay_request};
use ic_kvevents::{ApplyStats, KvEvent, SeqEvent, SeqTracker, decode_batch};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use zeromq::{Socket, SocketRecv, SocketSend};

use crate::forwarder::Backoff;
use crate::metrics::{KindLabel, Metrics, ReasonLabel};
use crate::outbox::{Outbox, lock};

/// How long one replay may take before the rest of the gap counts as lost.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(3);

/// One rank's endpoints.
#[derive(Clone, Debug)]
pub struct RankEndpoints {
    /// DP rank.
    pub rank: u32,
    /// Publisher endpoint.
    pub events: String,
    /// Replay endpoint, when the engine has one.
    pub replay: Option<String>,
}

/// `tcp://host:port` with `port + offset` (DP rank r publishes on base + r).
pub fn offset_endpoint(endpoint: &str, offset: u32) -> Option<String> {
    if offset == 0 {
        return Some(endpoint.to_owned());
    }
    let (head, port) = endpoint.rsplit_once(':')?;
    let port: u32 = port.parse().ok()?;
    Some(format!("{head}:{}", port.checked_add(offset)?))
}

/// The shared pieces a listener works with.
#[derive(Clone, Debug)]
pub struct ListenerContext {
    /// Topic filter.
    pub topic: String,
    /// Where decoded changes go.
    pub outbox: Arc<Mutex<Outbox>>,
    /// Wakes the forwarder.
    pub notify: Arc<Notify>,
    /// Metrics.
    pub metrics: Metrics,
    /// Consecutive receive errors before the socket is replaced.
    pub max_receive_errors: u32,
    /// Largest forward sequence jump believed from one frame.
    pub max_sequence_jump: u64,
}

/// Backoff after one receive error (the socket may be broken for good; a
/// tight loop would burn a core logging the same error).
const RECV_ERROR_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(1));

/// Runs one rank's listener until `shutdown`, reconnecting with backoff.
pub async fn run(endpoints: RankEndpoints, ctx: ListenerContext, shutdown: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut seq = SeqTracker::with_max_jump(ctx.max_sequence_jump);
    while !shutdown.is_cancelled() {
        let mut socket = zeromq::SubSocket::new();
        let connected = tokio::select! {
            r = async {
                socket.subscribe(&ctx.topic).await?;
                socket.connect(&endpoints.events).await
            } => r,
            () = shutdown.cancelled() => return,
        };
        if let Err(error) = connected {
            tracing::warn!(rank = endpoints.rank, endpoint = %endpoints.events, %error, "cannot connect to engine publisher");
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                () = shutdown.cancelled() => return,
            }
            continue;
        }
        backoff.reset();
        tracing::info!(rank = endpoints.rank, endpoint = %endpoints.events, "subscribed to engine KV events");
        let mut recv_backoff = Backoff::new(RECV_ERROR_BACKOFF.0, RECV_ERROR_BACKOFF.1);
        let mut errors_in_a_row = 0u32;
        loop {
            let message = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                m = socket.recv() => m,
            };
            match message {
                Ok(message) => {
                    errors_in_a_row = 0;
                    recv_backoff.reset();
                    handle(&endpoints, &ctx, &mut seq, message.into_vec()).await;
                }
                Err(error) => {
                    // The socket reconnects by itself, so one error is one
                    // broken peer connection; many in a row mean the socket
                    // itself is stuck, and a fresh one is the way out.
                    ctx.metrics.failed("recv_error");
                    errors_in_a_row += 1;
                    tracing::debug!(rank = endpoints.rank, %error, errors_in_a_row, "receive error");
                    if errors_in_a_row >= ctx.max_receive_errors {
                        ctx.metrics.failed("recv_error_reconnect");
                        tracing::warn!(rank = endpoints.rank, %error, errors_in_a_row, "receive keeps failing; reconnecting");
                        break;
                    }
                    tokio::select! {
                        () = tokio::time::sleep(recv_backoff.next_delay()) => {}
                        () = shutdown.cancelled() => return,
                    }
                }
            }
        }
    }
}

async fn handle(
    endpoints: &RankEndpoints,
    ctx: &ListenerContext,
    seq: &mut SeqTracker,
    frames: Vec<Bytes>,
) {
    let m = &ctx.metrics;
    m.batches_received.inc();
    let message = match parse_event_message(&frames) {
        Ok(message) => message,
        Err(error) => {
            m.failed(error.reason());
            tracing::debug!(rank = endpoints.rank, %error, "malformed message skipped");
            return;
        }
    };
    match seq.observe(message.seq) {
        SeqEvent::Next => {}
        SeqEvent::Duplicate => {
            m.duplicate_batches.inc();
            return;
        }
        SeqEvent::Implausible { last } => {
            m.failed("implausible_sequence");
            tracing::warn!(
                rank = endpoints.rank,
                last,
                seq = message.seq,
                max_jump = ctx.max_sequence_jump,
                "sequence jumped too far ahead; frame refused unless the next one follows it"
            );
            return;
        }
        SeqEvent::First => {
            // A subscriber that starts mid-stream recovers what the engine
            // still buffers.
            if message.seq > 0 && endpoints.replay.is_some() {
                recover(endpoints, ctx, 0, message.seq - 1, false).await;
            }
        }
        SeqEvent::Gap { from, to } => {
            m.seq_gaps.inc();
            tracing::info!(rank = endpoints.rank, from, to, "sequence gap");
            recover(endpoints, ctx, from, to, true).await;
        }
        SeqEvent::Reset { previous } => {
            m.engine_resets.inc();
            tracing::info!(
                rank = endpoints.rank,
                previous,
                seq = message.seq,
                "engine restarted; clearing replica state"
            );
            lock(&ctx.outbox).reset_rank(endpoints.rank);
            if message.seq > 0 {
                recover(endpoints, ctx, 0, message.seq - 1, false).await;
            }
        }
    }
    apply_payload(endpoints.rank, ctx, message.payload);
}

/// Replays batches `from ..= to` and applies them in order. With
/// `count_losses` (a real gap, not a mid-stream start or a restart) every
/// batch the replay does not deliver is counted as lost.
async fn recover(
    endpoints: &RankEndpoints,
    ctx: &ListenerContext,
    from: u64,
    to: u64,
    count_losses: bool,
) {
    let wanted = to - from + 1;
    let mut applied = 0u64;
    if let Some(replay) = &endpoints.replay {
        match tokio::time::timeout(REPLAY_TIMEOUT, fetch_replay(replay, from, to)).await {
            Ok(Ok(batches)) => {
                for (seq, payload) in batches {
                    if (from..=to).contains(&seq) {
                        apply_payload(endpoints.rank, ctx, &payload);
                        ctx.metrics.replayed_batches.inc();
                        applied += 1;
                    }
                }
            }
            Ok(Err(error)) => {
                ctx.metrics.replay_failures.inc();
                tracing::warn!(rank = endpoints.rank, %error, "replay failed");
            }
            Err(_) => {
                ctx.metrics.replay_failures.inc();
                tracing::warn!(rank = endpoints.rank, "replay timed out");
            }
        }
    }
    if count_losses {
        ctx.metrics
            .lost_batches
            .inc_by(wanted.saturating_sub(applied));
    }
}

/// Asks the engine's replay ROUTER for everything from `from` on and returns
/// the batches up to `to`, in sequence order, without duplicates.
async fn fetch_replay(
    endpoint: &str,
    from: u64,
    to: u64,
) -> Result<Vec<(u64, Bytes)>, zeromq::ZmqError> {
    let mut dealer = zeromq::DealerSocket::new();
    dealer.connect(endpoint).await?;
    let request: Vec<Bytes> = replay_request(from).into_iter().map(Bytes::from).collect();
    let request = zeromq::ZmqMessage::try_from(request)
        .map_err(|_| zeromq::ZmqError::Other("empty replay request"))?;
    dealer.send(request).await?;
    let mut out: Vec<(u64, Bytes)> = Vec::new();
    loop {
        let frames = dealer.recv().await?.into_vec();
        match parse_replay_reply(&frames) {
            Ok(ReplayReply::End) => break,
            Ok(ReplayReply::Batch { seq, payload }) => {
                if seq > to {
                    // Everything after `to` arrives live; stop reading.
                    break;
                }
                if seq >= from && out.last().is_none_or(|(last, _)| seq > *last) {
                    out.push((seq, Bytes::copy_from_slice(payload)));
                }
            }
            Err(_) => return Err(zeromq::ZmqError::Other("malformed replay reply")),
        }
    }
    Ok(out)
}

fn apply_payload(rank: u32, ctx: &ListenerContext, payload: &[u8]) {
    let m = &ctx.metrics;
    let batch = match decode_batch(payload) {
        Ok(batch) => batch,
        Err(error) => {
            m.failed(error.reason());
            tracing::debug!(rank, %error, "undecodable batch skipped");
            return;
        }
    };
    m.batches_decoded.inc();
    for (_, error) in &batch.rejected {
        m.events_rejected
            .get_or_create(&ReasonLabel {
                reason: error.reason(),
            })
            .inc();
    }
    for event in &batch.events {
        let kind = match event {
            KvEvent::BlockStored(_) => "stored",
            KvEvent::BlockRemoved(_) => "removed",
            KvEvent::AllBlocksCleared => "cleared",
            KvEvent::Unknown(_) => "unknown",
        };
        m.events.get_or_create(&KindLabel { kind }).inc();
    }
    let mut stats = ApplyStats::default();
    let (dropped, queued, blocks, adapters) = {
        let mut outbox = lock(&ctx.outbox);
        let dropped = outbox.apply(rank, &batch, &mut stats);
        let adapters = outbox.adapters();
        (dropped, outbox.queued(), outbox.blocks(), adapters)
    };
    m.record_apply(&stats);
    m.record_adapters(&adapters);
    if dropped > 0 {
        m.queue_dropped.inc_by(dropped as u64);
    }
    m.queue_depth.set(i64::try_from(queued).unwrap_or(i64::MAX));
    m.tracked_blocks
        .set(i64::try_from(blocks).unwrap_or(i64::MAX));
    if batch.ts.is_finite() && batch.ts > 0.0 {
        #[allow(clippy::cast_possible_truncation)]
        m.last_event_timestamp_seconds.set(batch.ts as i64);
    }
    ctx.notify.notify_one();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dp_rank_endpoints_offset_the_port() {
        assert_eq!(
            offset_endpoint("tcp://127.0.0.1:5557", 0).as_deref(),
            Some("tcp://127.0.0.1:5557")
        );
        assert_eq!(
            offset_endpoint("tcp://127.0.0.1:5557", 2).as_deref(),
            Some("tcp://127.0.0.1:5559")
        );
        assert_eq!(
            offset_endpoint("tcp://[::1]:5557", 1).as_deref(),
            Some("tcp://[::1]:5558")
        );
        assert_eq!(offset_endpoint("ipc:///tmp/x", 1), None);
    }
}
