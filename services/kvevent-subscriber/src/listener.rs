//! Reads one DP rank's KV-event stream from the engine over ZMQ.
//!
//! A SUB socket receives `topic | seq | payload` messages. Sequence numbers
//! reveal loss (a gap: replay it from the engine's buffer over a DEALER when
//! a replay endpoint is configured, otherwise count it as lost) and engine
//! restarts (the sequence goes backwards: forget the rank's state). Malformed
//! messages are counted and skipped; the state already built is kept.
//!
//! A restart does not always move the sequence backwards: the new engine may
//! publish more batches before the subscriber reconnects than the old one
//! ever did, or publish nothing at all afterwards. The engine is on the
//! pod's loopback, so its connection dropping means its process went away.
//! From then on the engine is probed — when the socket reconnects, every
//! `PROBE_INTERVAL` while the reconnect is pending, and at the latest when
//! a message arrives — without waiting for the engine's next batch: its
//! replay buffer is read and compared with the digests of the batches
//! applied (a window of them, not only the last, so one byte-identical
//! batch of a new incarnation is not mistaken for the old one). The same
//! history means the same engine: what it published meanwhile is applied.
//! A different one is a new incarnation: the rank is reset and rebuilt
//! from the buffer. Without a replay endpoint the reconnect itself counts
//! as a restart.
//!
//! At start-up the rank first rebuilds what the engine's replay buffer
//! still holds, before its first resync, so a restarted subscriber does not
//! replace the index's view of an idle engine with an empty one. What the
//! buffer no longer had is reported (`history_incomplete`).

use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use bytes::Bytes;
use ic_kvevents::frames::{ReplayReply, parse_event_message, parse_replay_reply, replay_request};
use ic_kvevents::{ApplyStats, KvEvent, SeqEvent, SeqTracker, decode_batch};
use tokio_util::sync::CancellationToken;
use zeromq::{Socket, SocketEvent, SocketRecv, SocketSend};

use crate::forwarder::Backoff;
use crate::metrics::{KindLabel, Metrics, ReasonLabel};
use crate::outbox::{Outbox, Wakers, lock};

/// How often the engine is probed while its connection is lost and the
/// socket's own reconnect (which backs off to 30 s) is still pending.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// Digests of the last batches applied kept per rank to recognise the
/// engine after a reconnect (16 bytes each).
const DIGEST_WINDOW: usize = 1024;

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
    /// Wakes the forwarders.
    pub wakers: Arc<Wakers>,
    /// Metrics.
    pub metrics: Metrics,
    /// Consecutive receive errors before the socket is replaced.
    pub max_receive_errors: u32,
    /// Largest forward sequence jump believed from one frame.
    pub max_sequence_jump: u64,
    /// How long a rank without a replay buffer waits for its first batch
    /// before resyncing what it has (nothing), keeping the index's view
    /// of the engine meanwhile.
    pub startup_grace: Duration,
    /// How long one replay request may take (`--replay-timeout-ms`).
    pub replay_timeout: Duration,
}

/// What one rank's listener knows about its stream.
#[derive(Debug)]
struct Stream {
    seq: SeqTracker,
    /// Digests of the payloads of the last batches applied, by sequence,
    /// oldest first (at most `DIGEST_WINDOW`).
    digests: std::collections::VecDeque<(u64, u64)>,
    /// The engine's connection dropped and the engine was not probed since.
    peer_lost: bool,
}

impl Stream {
    fn applied(&mut self, seq: u64, payload: &[u8]) {
        if self.digests.back().is_some_and(|(last, _)| *last >= seq) {
            // Out of order (a replay after a reset): the window restarts.
            self.digests.clear();
        }
        if self.digests.len() == DIGEST_WINDOW {
            self.digests.pop_front();
        }
        self.digests.push_back((seq, digest(payload)));
    }

    fn forget(&mut self) {
        self.seq.reset();
        self.digests.clear();
    }
}

fn digest(payload: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    payload.hash(&mut h);
    h.finish()
}

/// Backoff after one receive error (the socket may be broken for good; a
/// tight loop would burn a core logging the same error).
const RECV_ERROR_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(1));

/// Runs one rank's listener until `shutdown`, reconnecting with backoff.
pub async fn run(endpoints: RankEndpoints, ctx: ListenerContext, shutdown: CancellationToken) {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut stream = Stream {
        seq: SeqTracker::with_max_jump(ctx.max_sequence_jump),
        digests: std::collections::VecDeque::new(),
        peer_lost: false,
    };
    // The flag's range keeps this far from the clock's end; saturated anyway.
    let now = tokio::time::Instant::now();
    let mut ready_by = Some(now.checked_add(ctx.startup_grace).unwrap_or(now));
    if endpoints.replay.is_some() {
        tokio::select! {
            () = rebuild_from_replay(&endpoints, &ctx, &mut stream) => {}
            () = shutdown.cancelled() => return,
        }
        if stream.seq.last().is_some() || lock(&ctx.outbox).is_ready(endpoints.rank) {
            ready_by = None;
        }
    }
    while !shutdown.is_cancelled() {
        let mut socket = zeromq::SubSocket::new();
        let mut monitor = socket.monitor();
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
        let mut next_probe = None;
        loop {
            let grace = async {
                match ready_by {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            let probe_timer = async {
                match next_probe {
                    Some(at) if stream.peer_lost => tokio::time::sleep_until(at).await,
                    _ => std::future::pending().await,
                }
            };
            let message = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                Some(event) = monitor.next() => {
                    match event {
                        SocketEvent::Disconnected(_) => {
                            stream.peer_lost = true;
                            next_probe = Some(tokio::time::Instant::now() + PROBE_INTERVAL);
                            tracing::info!(rank = endpoints.rank, "engine connection lost");
                        }
                        SocketEvent::Connected(..) if stream.peer_lost => {
                            // The engine answers again: whoever it is, find
                            // out now, not at its next batch (it may be idle).
                            probe(&endpoints, &ctx, &mut stream, true).await;
                        }
                        _ => {}
                    }
                    continue;
                }
                () = probe_timer => {
                    next_probe = Some(tokio::time::Instant::now() + PROBE_INTERVAL);
                    probe(&endpoints, &ctx, &mut stream, false).await;
                    continue;
                }
                () = grace => {
                    // Nothing to rebuild from and nothing heard: the engine
                    // is idle or gone; say what we know (nothing).
                    ready_by = None;
                    mark_ready(&endpoints, &ctx, false);
                    continue;
                }
                m = socket.recv() => m,
            };
            match message {
                Ok(message) => {
                    errors_in_a_row = 0;
                    recv_backoff.reset();
                    handle(&endpoints, &ctx, &mut stream, message.into_vec()).await;
                    if ready_by.take().is_some() {
                        mark_ready(&endpoints, &ctx, false);
                    }
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

/// The rank may resync now (its first view is as complete as it will
/// get); `incomplete` says batches before it could not be recovered.
fn mark_ready(endpoints: &RankEndpoints, ctx: &ListenerContext, incomplete: bool) {
    if incomplete {
        note_incomplete(endpoints, ctx, true);
    }
    let mut outbox = lock(&ctx.outbox);
    if !outbox.is_ready(endpoints.rank) {
        outbox.set_ready(endpoints.rank);
        drop(outbox);
        ctx.wakers.wake_all();
    }
}

/// Records whether the rank's view misses batches nobody can deliver any
/// more (forwarded to the index, and a gauge for alerts).
fn note_incomplete(endpoints: &RankEndpoints, ctx: &ListenerContext, incomplete: bool) {
    lock(&ctx.outbox).set_incomplete(endpoints.rank, incomplete);
    ctx.metrics
        .history_incomplete
        .get_or_create(&crate::metrics::RankLabel {
            rank: endpoints.rank,
        })
        .set(i64::from(incomplete));
}

/// Start-up: applies everything the engine's replay buffer still holds, so
/// the first resync carries the engine's state instead of an empty one.
/// When the buffer starts after batch 0, the batches before it are gone
/// for good: counted, and the rank is marked incomplete.
async fn rebuild_from_replay(
    endpoints: &RankEndpoints,
    ctx: &ListenerContext,
    stream: &mut Stream,
) {
    let Some(replay) = &endpoints.replay else {
        return;
    };
    let batches = match replay_whole(replay, ctx.replay_timeout).await {
        Ok(batches) => batches,
        Err(failure) => {
            ctx.metrics.replay_failures.inc();
            tracing::info!(rank = endpoints.rank, %failure, "no replay at start-up; waiting for the engine");
            return;
        }
    };
    let first = batches.first().map(|(seq, _)| *seq);
    for (seq, payload) in &batches {
        stream.seq.observe(*seq);
        apply_payload(endpoints.rank, ctx, payload);
        ctx.metrics.replayed_batches.inc();
        stream.applied(*seq, payload);
    }
    let missing = first.unwrap_or(0);
    if missing > 0 {
        ctx.metrics.unreplayable_batches.inc_by(missing);
    }
    tracing::info!(
        rank = endpoints.rank,
        replayed = batches.len(),
        missing,
        "rebuilt from the engine's replay buffer"
    );
    mark_ready(endpoints, ctx, missing > 0);
}

/// After the engine's connection dropped: finds out whether the engine
/// answering is the one whose batches were applied, and brings the rank up
/// to date either way. `answering` says the engine is known to be back (it
/// reconnected or sent a message): then a replay buffer that does not
/// answer, or no replay endpoint at all, means a new incarnation; on the
/// timer it only means the engine is not back yet (probed again later).
async fn probe(
    endpoints: &RankEndpoints,
    ctx: &ListenerContext,
    stream: &mut Stream,
    answering: bool,
) {
    let Some(replay) = &endpoints.replay else {
        if answering {
            stream.peer_lost = false;
            if stream.seq.last().is_some() {
                new_incarnation(endpoints, ctx, stream);
            }
        }
        return;
    };
    let batches = match replay_whole(replay, ctx.replay_timeout).await {
        Ok(batches) => batches,
        Err(failure) => {
            tracing::debug!(rank = endpoints.rank, %failure, "engine not answering its replay socket yet");
            if answering {
                ctx.metrics.replay_failures.inc();
                stream.peer_lost = false;
                if stream.seq.last().is_some() {
                    new_incarnation(endpoints, ctx, stream);
                }
            }
            return;
        }
    };
    stream.peer_lost = false;
    if stream.seq.last().is_some() && same_history(stream, &batches) {
        // The same engine: apply what it published while unheard.
        let last = stream.seq.last().unwrap_or(0);
        let mut caught_up = 0usize;
        for (seq, payload) in batches.iter().filter(|(seq, _)| *seq > last) {
            stream.seq.observe(*seq);
            apply_payload(endpoints.rank, ctx, payload);
            ctx.metrics.replayed_batches.inc();
            stream.applied(*seq, payload);
            caught_up += 1;
        }
        tracing::info!(
            rank = endpoints.rank,
            caught_up,
            "engine reconnected as the same incarnation"
        );
        return;
    }
    if stream.seq.last().is_some() {
        new_incarnation(endpoints, ctx, stream);
    }
    let first = batches.first().map(|(seq, _)| *seq);
    for (seq, payload) in &batches {
        stream.seq.observe(*seq);
        apply_payload(endpoints.rank, ctx, payload);
        ctx.metrics.replayed_batches.inc();
        stream.applied(*seq, payload);
    }
    let missing = first.unwrap_or(0).min(ctx.max_sequence_jump);
    if missing > 0 {
        ctx.metrics.unreplayable_batches.inc_by(missing);
        note_incomplete(endpoints, ctx, true);
    }
    tracing::info!(
        rank = endpoints.rank,
        rebuilt = batches.len(),
        missing,
        "rank rebuilt from the engine's replay buffer"
    );
}

/// Whether the engine's replay buffer holds the history applied: it has the
/// last batch applied, and every batch it holds within the window of
/// digests matches (one identical batch is not enough: a new incarnation
/// may repeat one byte for byte).
fn same_history(stream: &Stream, batches: &[(u64, Bytes)]) -> bool {
    let Some(last) = stream.seq.last() else {
        return false;
    };
    let Some(&(first_kept, _)) = stream.digests.front() else {
        return false;
    };
    let mut compared_last = false;
    for (seq, payload) in batches {
        if *seq < first_kept || *seq > last {
            continue;
        }
        // A sequence not in the window (a batch lost for good) is no
        // evidence either way.
        if let Ok(i) = stream.digests.binary_search_by_key(seq, |(s, _)| *s) {
            if stream.digests[i].1 != digest(payload) {
                return false;
            }
            compared_last |= *seq == last;
        }
    }
    compared_last
}

/// The engine answering is a new incarnation: its predecessor's blocks are
/// gone, so the rank's replica is cleared (the index follows with a resync).
fn new_incarnation(endpoints: &RankEndpoints, ctx: &ListenerContext, stream: &mut Stream) {
    let m = &ctx.metrics;
    m.engine_resets.inc();
    m.engine_restarts
        .get_or_create(&crate::metrics::SignalLabel {
            signal: "reconnect",
        })
        .inc();
    tracing::info!(
        rank = endpoints.rank,
        previous = stream.seq.last(),
        "engine reconnected as a new incarnation; clearing replica state"
    );
    lock(&ctx.outbox).reset_rank(endpoints.rank);
    note_incomplete(endpoints, ctx, false);
    stream.forget();
}

async fn handle(
    endpoints: &RankEndpoints,
    ctx: &ListenerContext,
    stream: &mut Stream,
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
    if stream.peer_lost {
        // A message before the probe ran: the engine is back; probe now.
        probe(endpoints, ctx, stream, true).await;
    }
    let seq = &mut stream.seq;
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
            // still buffers; what it no longer has is reported.
            if message.seq > 0 {
                recover(
                    endpoints,
                    ctx,
                    stream,
                    0,
                    message.seq - 1,
                    Losses::Unreplayable,
                )
                .await;
            }
        }
        SeqEvent::Gap { from, to } => {
            m.seq_gaps.inc();
            tracing::info!(rank = endpoints.rank, from, to, "sequence gap");
            recover(endpoints, ctx, stream, from, to, Losses::Lost).await;
        }
        SeqEvent::Reset { previous } => {
            // Forward means a far jump confirmed by the next frame: the
            // stream moved (a publisher numbering from elsewhere), not
            // billions of batches lost; only the replay buffer can say what
            // came before it, and nothing is counted for the jump itself.
            let signal = if message.seq > previous {
                "jump"
            } else {
                "sequence"
            };
            m.engine_resets.inc();
            m.engine_restarts
                .get_or_create(&crate::metrics::SignalLabel { signal })
                .inc();
            tracing::info!(
                rank = endpoints.rank,
                previous,
                seq = message.seq,
                "engine restarted; clearing replica state"
            );
            lock(&ctx.outbox).reset_rank(endpoints.rank);
            note_incomplete(endpoints, ctx, false);
            stream.digests.clear();
            if message.seq > 0 {
                let losses = if signal == "jump" {
                    Losses::Unknown
                } else {
                    Losses::Unreplayable
                };
                recover(endpoints, ctx, stream, 0, message.seq - 1, losses).await;
            }
        }
    }
    apply_payload(endpoints.rank, ctx, message.payload);
    stream.applied(message.seq, message.payload);
}

/// How the batches a replay cannot deliver are counted.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Losses {
    /// A real gap: lost for good.
    Lost,
    /// Before this subscriber's view or a new incarnation's start: unknown
    /// blocks, the rank is incomplete.
    Unreplayable,
    /// A confirmed far jump: the numbers skipped were never batches.
    Unknown,
}

/// Replays batches `from ..= to` and applies them in order; what the replay
/// does not deliver is counted as `losses` says, never more than
/// `max_sequence_jump` at once.
async fn recover(
    endpoints: &RankEndpoints,
    ctx: &ListenerContext,
    stream: &mut Stream,
    from: u64,
    to: u64,
    losses: Losses,
) {
    let wanted = to - from + 1;
    let mut applied = 0u64;
    if let Some(replay) = &endpoints.replay {
        // What arrived before a failure or the timeout is a run of batches
        // in order from `from`: applied, and only the rest is missing.
        let mut batches = Vec::new();
        let fetched = tokio::time::timeout(
            ctx.replay_timeout,
            fetch_replay(replay, from, to, &mut batches),
        )
        .await;
        match fetched {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                ctx.metrics.replay_failures.inc();
                tracing::warn!(rank = endpoints.rank, %error, received = batches.len(), "replay failed");
            }
            Err(_) => {
                ctx.metrics.replay_failures.inc();
                tracing::warn!(
                    rank = endpoints.rank,
                    received = batches.len(),
                    "replay timed out"
                );
            }
        }
        for (seq, payload) in batches {
            if (from..=to).contains(&seq) {
                apply_payload(endpoints.rank, ctx, &payload);
                ctx.metrics.replayed_batches.inc();
                stream.applied(seq, &payload);
                applied += 1;
            }
        }
    }
    let missing = wanted.saturating_sub(applied).min(ctx.max_sequence_jump);
    if losses == Losses::Lost {
        ctx.metrics.lost_batches.inc_by(missing);
        // What the lost batches stored is unknown to the view (and what
        // they freed still in it): said, not kept silent.
        if missing > 0 {
            note_incomplete(endpoints, ctx, true);
        }
    } else if losses == Losses::Unreplayable && missing > 0 {
        // The start of the engine's stream (before this subscriber's view,
        // or of a new incarnation) is gone: blocks stored then are unknown.
        ctx.metrics.unreplayable_batches.inc_by(missing);
        note_incomplete(endpoints, ctx, true);
    }
}

/// Why the whole replay buffer could not be read.
#[derive(Debug, thiserror::Error)]
enum ReplayFailed {
    #[error("{0}")]
    Socket(#[from] zeromq::ZmqError),
    #[error("no complete answer within {0:?} (--replay-timeout-ms)")]
    TimedOut(Duration),
}

/// Everything the engine's replay buffer holds, or why not: a partial
/// answer is no answer here (the callers judge the engine by all of it).
async fn replay_whole(
    endpoint: &str,
    timeout: Duration,
) -> Result<Vec<(u64, Bytes)>, ReplayFailed> {
    let mut batches = Vec::new();
    match tokio::time::timeout(timeout, fetch_replay(endpoint, 0, u64::MAX, &mut batches)).await {
        Ok(Ok(())) => Ok(batches),
        Ok(Err(error)) => Err(error.into()),
        Err(_) => Err(ReplayFailed::TimedOut(timeout)),
    }
}

/// Asks the engine's replay ROUTER for everything from `from` on and puts
/// the batches up to `to` in `out`, in sequence order, without duplicates,
/// as they arrive (so a caller that stops waiting keeps what came).
async fn fetch_replay(
    endpoint: &str,
    from: u64,
    to: u64,
    out: &mut Vec<(u64, Bytes)>,
) -> Result<(), zeromq::ZmqError> {
    let mut dealer = zeromq::DealerSocket::new();
    dealer.connect(endpoint).await?;
    let request: Vec<Bytes> = replay_request(from).into_iter().map(Bytes::from).collect();
    let request = zeromq::ZmqMessage::try_from(request)
        .map_err(|_| zeromq::ZmqError::Other("empty replay request"))?;
    dealer.send(request).await?;
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
    Ok(())
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
    if let Some(error) = &batch.damaged {
        // Counted as a failed frame; the events before the damage apply.
        m.failed(error.reason());
        tracing::debug!(rank, %error, kept = batch.events.len(), "damaged batch: its events before the damage kept");
    }
    for (index, error) in &batch.rejected {
        tracing::debug!(rank, index, %error, "event skipped");
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
    let (applied, queued, blocks, adapters) = {
        let mut outbox = lock(&ctx.outbox);
        let applied = outbox.apply(rank, &batch, &mut stats);
        let adapters = outbox.adapters();
        (applied, outbox.queued(), outbox.blocks(), adapters)
    };
    m.record_apply(&stats);
    m.record_adapters(&adapters);
    if applied.dropped > 0 {
        m.queue_dropped.inc_by(applied.dropped as u64);
    }
    if applied.overflowed > 0 {
        m.forward_overflow_resyncs.inc_by(applied.overflowed as u64);
    }
    if applied.history_completed {
        m.history_turnovers.inc();
        m.history_incomplete
            .get_or_create(&crate::metrics::RankLabel { rank })
            .set(0);
        tracing::info!(
            rank,
            "the engine's cache turned over; history complete again"
        );
    }
    m.queue_depth.set(i64::try_from(queued).unwrap_or(i64::MAX));
    m.tracked_blocks
        .set(i64::try_from(blocks).unwrap_or(i64::MAX));
    if batch.ts.is_finite() && batch.ts > 0.0 {
        #[allow(clippy::cast_possible_truncation)]
        m.last_event_timestamp_seconds.set(batch.ts as i64);
    }
    ctx.wakers.wake_all();
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
