//! Streams this replica's index changes to one index server.
//!
//! One forwarder per destination ([`crate::discovery`] starts one for each
//! index-server replica), each with one client-streaming `IngestEvents`
//! call at a time, its own sequence and its own backoff. After every
//! (re)connect each rank first sends a full resync, so an index-server
//! restart or a broken stream loses nothing for good. The listeners never
//! wait for any of this, and no destination waits for another.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::convert;
use crate::metrics::Metrics;
use crate::outbox::{DestinationId, Outbox, Outgoing, Wakers, lock};

mod split;

/// Changes per message; resync snapshots are split into chunks of this size
/// (and any batch at [`split::MAX_BATCH_FINGERPRINTS`]).
const CHUNK: usize = 4096;
/// An empty batch is sent this often so the server knows the replica is alive.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// Identity stamped on every batch.
#[derive(Clone, Debug)]
pub struct Identity {
    /// Scope (tenant, model, hash scheme, adapter).
    pub scope: pb::IndexScope,
    /// Pod name.
    pub replica_id: String,
    /// Engine serving address.
    pub address: String,
    /// Random id of this subscriber process.
    pub incarnation: u64,
}

pub use ic_clock::Backoff;

/// Where batches go and how the subscriber proves who it is.
#[derive(Clone, Debug)]
pub struct Target {
    /// The index server's gRPC URL.
    pub url: String,
    /// The one address of the URL's host to connect to (a replica behind
    /// a headless Service); `None` lets the connection resolve the host.
    pub addr: Option<std::net::SocketAddr>,
    /// Bearer token file, read on every (re)connect.
    pub token_file: Option<std::path::PathBuf>,
    /// The CA an `https://` index server must chain to.
    pub ca: Option<Trust>,
}

/// Where the index server's CA bundle comes from.
#[derive(Clone, Debug)]
pub enum Trust {
    /// A PEM file, read on every (re)connect.
    File(std::path::PathBuf),
    /// PEM text.
    Pem(String),
}

impl Trust {
    fn load(&self) -> Result<Vec<u8>, String> {
        match self {
            Self::File(path) => std::fs::read(path)
                .map_err(|e| format!("--index-server-ca-file {}: {e}", path.display())),
            Self::Pem(pem) => Ok(pem.as_bytes().to_vec()),
        }
    }
}

/// The `authorization` value from the token file, if one is configured.
fn authorization(target: &Target) -> Result<Option<tonic::metadata::AsciiMetadataValue>, String> {
    let Some(path) = &target.token_file else {
        return Ok(None);
    };
    let token = std::fs::read_to_string(path)
        .map_err(|e| format!("--index-server-token-file {}: {e}", path.display()))?;
    let token = token.trim();
    if token.is_empty() {
        return Err(format!(
            "--index-server-token-file {}: the file is empty",
            path.display()
        ));
    }
    ic_proto::bearer::metadata(token)
        .map(Some)
        .ok_or_else(|| format!("--index-server-token-file {}: not a token", path.display()))
}

/// Streams to `target` until `shutdown`, as one destination of `outbox`
/// (registered here, forgotten on return).
pub async fn run(
    target: Target,
    identity: Identity,
    outbox: Arc<Mutex<Outbox>>,
    wakers: Arc<Wakers>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let destination = lock(&outbox).add_destination();
    let notify = wakers.register();
    metrics.forward_destinations.inc();
    let link = Link {
        identity: &identity,
        outbox: &outbox,
        destination,
        notify: &notify,
        metrics: &metrics,
    };
    // No span around the link: each batch's span is a root of its own trace
    // (the index server's span for the batch joins it), and a long-lived
    // parent would put every batch in one trace.
    link.run(&target, &shutdown).await;
    lock(&outbox).remove_destination(destination);
    wakers.unregister(&notify);
    metrics.forward_destinations.dec();
}

impl Target {
    /// The URL, with the address it connects to when that is pinned.
    pub fn display(&self) -> String {
        match self.addr {
            Some(addr) => format!("{} ({addr})", self.url),
            None => self.url.clone(),
        }
    }
}

/// One destination's share of the forwarder's state.
struct Link<'a> {
    identity: &'a Identity,
    outbox: &'a Mutex<Outbox>,
    destination: DestinationId,
    notify: &'a Notify,
    metrics: &'a Metrics,
}

impl Link<'_> {
    async fn run(&self, target: &Target, shutdown: &CancellationToken) {
        let metrics = self.metrics;
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
        let mut seqs: Vec<u64> = Vec::new();
        let url = target.display();
        while !shutdown.is_cancelled() {
            let started = Instant::now();
            let token = authorization(target);
            if let Err(error) = &token {
                metrics.forward_errors.inc();
                tracing::warn!(%error, "cannot read the index server token");
            }
            let connected = match token {
                Ok(token) => connect(target).await.map(|c| (c, token)),
                Err(error) => Err(error),
            };
            match connected {
                Ok((client, token)) => {
                    metrics.forward_connects.inc();
                    tracing::info!(index_server = %url, "connected to index server");
                    lock(self.outbox).mark_for_resync(self.destination);
                    match self.stream_once(client, token, &mut seqs, shutdown).await {
                        Ok(ack) if ack.resync_required => {
                            tracing::info!(index_server = %url, detail = %ack.detail, "index server asked for a resync");
                        }
                        Ok(_) => {}
                        Err(error) => {
                            metrics.forward_errors.inc();
                            tracing::warn!(index_server = %url, %error, "ingest stream ended");
                        }
                    }
                }
                Err(error) => {
                    metrics.forward_errors.inc();
                    tracing::warn!(index_server = %url, %error, "cannot connect to index server");
                }
            }
            // Whatever happens next starts with a resync: stop logging
            // deltas for this destination that the resync will supersede.
            lock(self.outbox).mark_for_resync(self.destination);
            if started.elapsed() > Duration::from_secs(10) {
                backoff.reset();
            }
            tokio::select! {
                () = tokio::time::sleep(backoff.next_delay()) => {}
                () = shutdown.cancelled() => {}
            }
        }
    }
}

async fn connect(target: &Target) -> Result<IndexServiceClient<tonic::transport::Channel>, String> {
    let ca = target.ca.as_ref().map(Trust::load).transpose()?;
    let endpoint =
        ic_proto::channel::endpoint_at(&target.url, target.addr, ca.as_deref(), "--index-server")?;
    // tonic's transport error says only "transport error"; its source says why.
    let channel = endpoint.connect().await.map_err(|e| {
        std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| format!("{e}: {s}"))
    })?;
    Ok(IndexServiceClient::new(channel))
}

/// What every batch carries beside its events: the engine's tier-2
/// counters, load and cache size at the time it is sent.
pub type EngineStats = (
    Option<crate::tier2::Tier2Counters>,
    Option<crate::tier2::EngineLoad>,
    Option<crate::tier2::EngineCache>,
);

/// One piece of work as the protobuf batches that carry it, numbered from
/// `seqs` (the destination's per-rank sequence): a resync is split into
/// chunks, the first marked `resync_begin` and the last `resync_end`.
pub fn batches(
    identity: &Identity,
    seqs: &mut Vec<u64>,
    item: Outgoing,
    stats: EngineStats,
    incomplete: bool,
) -> Vec<pb::IngestBatch> {
    match item {
        Outgoing::Resync { rank, snapshot } => {
            let events: Vec<pb::IndexEvent> = snapshot.into_iter().map(convert::event).collect();
            let chunks = split::batched(events, CHUNK, split::MAX_BATCH_FINGERPRINTS);
            let last = chunks.len() - 1;
            chunks
                .into_iter()
                .enumerate()
                .map(|(i, events)| {
                    build(
                        identity,
                        rank,
                        seqs,
                        events,
                        i == 0,
                        i == last,
                        stats,
                        incomplete,
                    )
                })
                .collect()
        }
        Outgoing::Delta { rank, changes } => {
            let events = changes.into_iter().map(convert::event).collect();
            split::batched(events, CHUNK, split::MAX_BATCH_FINGERPRINTS)
                .into_iter()
                .map(|events| {
                    build(
                        identity, rank, seqs, events, false, false, stats, incomplete,
                    )
                })
                .collect()
        }
    }
}

/// An empty batch for `rank`: tells the server the replica is alive and
/// carries the engine's current figures.
pub fn heartbeat(
    identity: &Identity,
    seqs: &mut Vec<u64>,
    rank: u32,
    stats: EngineStats,
    incomplete: bool,
) -> pb::IngestBatch {
    build(
        identity,
        rank,
        seqs,
        Vec::new(),
        false,
        false,
        stats,
        incomplete,
    )
}

impl Link<'_> {
    async fn stream_once(
        &self,
        mut client: IndexServiceClient<tonic::transport::Channel>,
        token: Option<tonic::metadata::AsciiMetadataValue>,
        seqs: &mut Vec<u64>,
        shutdown: &CancellationToken,
    ) -> Result<pb::IngestAck, tonic::Status> {
        let (identity, metrics) = (self.identity, self.metrics);
        let (tx, rx) = mpsc::channel::<pb::IngestBatch>(16);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = token {
            request.metadata_mut().insert("authorization", token);
        }
        let mut call = tokio::spawn(async move {
            client
                .ingest_events(request)
                .await
                .map(tonic::Response::into_inner)
        });
        let mut heartbeat = tokio::time::interval(HEARTBEAT);
        // The call's outcome when the server ended it while we waited.
        let mut ended = None;
        'pump: loop {
            let (work, stats, queued, ready) = {
                let mut ob = lock(self.outbox);
                let work = ob.take(self.destination, CHUNK);
                let ready: Vec<(u32, bool)> = (0..ob.ranks())
                    .filter(|r| ob.is_ready(*r))
                    .map(|r| (r, ob.is_incomplete(r)))
                    .collect();
                (
                    work,
                    (ob.tier2, ob.engine_load, ob.engine_cache),
                    ob.queued(),
                    ready,
                )
            };
            metrics
                .queue_depth
                .set(i64::try_from(queued).unwrap_or(i64::MAX));
            if work.is_empty() {
                tokio::select! {
                    () = self.notify.notified() => continue,
                    // The server ended the call (it is draining, say): find
                    // out now, not at the next send, so the reconnect (and
                    // the resync a replacement waits for) starts at once.
                    outcome = &mut call => {
                        ended = Some(outcome);
                        break 'pump;
                    }
                    _ = heartbeat.tick() => {
                        // Only ranks that have resynced on this stream: a
                        // rank still rebuilding sends nothing, so the index
                        // keeps its view of the engine.
                        for &(rank, incomplete) in &ready {
                            if seqs.get(rank as usize).is_none_or(|s| *s == 0) {
                                continue;
                            }
                            let batch = self::heartbeat(identity, seqs, rank, stats, incomplete);
                            if tx.send(batch).await.is_err() { break 'pump; }
                        }
                    }
                    () = shutdown.cancelled() => break 'pump,
                }
                continue;
            }
            let incomplete = |rank: u32| ready.iter().any(|&(r, i)| r == rank && i);
            for item in work {
                // One span per delta or resync, sampled like any root span;
                // its context rides in each batch so the index server's
                // span for the batch joins the same trace.
                let (kind, rank, events) = match &item {
                    Outgoing::Resync { rank, snapshot } => ("resync", *rank, snapshot.len()),
                    Outgoing::Delta { rank, changes } => ("delta", *rank, changes.len()),
                };
                if kind == "resync" {
                    metrics.resyncs.inc();
                }
                let span = tracing::debug_span!(
                    parent: None,
                    "forward_batch",
                    otel.kind = "producer",
                    kind,
                    dp_rank = i64::from(rank),
                    events = i64::try_from(events).unwrap_or(i64::MAX),
                    replica = %identity.replica_id,
                );
                let trace_context = ic_telemetry::otel::context_of(&span);
                let batches = batches(identity, seqs, item, stats, incomplete(rank));
                let sent = async {
                    for mut batch in batches {
                        batch.trace_context.clone_from(&trace_context);
                        if tx.send(batch).await.is_err() {
                            return false;
                        }
                        metrics.forwarded_batches.inc();
                    }
                    true
                }
                .instrument(span)
                .await;
                if !sent {
                    // The server ended the call; its answer says why.
                    break 'pump;
                }
            }
        }
        drop(tx);
        let outcome = match ended {
            Some(outcome) => outcome,
            None => call.await,
        };
        match outcome {
            Ok(result) => result,
            Err(join) => Err(tonic::Status::internal(format!(
                "ingest task failed: {join}"
            ))),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn build(
    identity: &Identity,
    rank: u32,
    seqs: &mut Vec<u64>,
    events: Vec<pb::IndexEvent>,
    resync_begin: bool,
    resync_end: bool,
    (tier2, load, cache): EngineStats,
    history_incomplete: bool,
) -> pb::IngestBatch {
    let index = rank as usize;
    if seqs.len() <= index {
        seqs.resize(index + 1, 0);
    }
    seqs[index] += 1;
    let now_ms = ic_clock::unix_ms();
    pb::IngestBatch {
        replica: Some(pb::ReplicaIdentity {
            scope: Some(identity.scope.clone()),
            replica_id: identity.replica_id.clone(),
            address: identity.address.clone(),
            dp_rank: rank,
            incarnation: identity.incarnation,
        }),
        seq: seqs[index],
        resync_begin,
        resync_end,
        events,
        tier2_stats: Some(match tier2 {
            Some(t) => pb::Tier2Stats {
                has_counters: true,
                hits: t.hits,
                queries: t.queries,
            },
            None => pb::Tier2Stats::default(),
        }),
        sent_at_unix_ms: now_ms,
        engine_load: load.map(|l| pb::EngineLoad {
            waiting: l.waiting,
            running: l.running,
            kv_usage: l.kv_usage,
        }),
        history_incomplete,
        trace_context: std::collections::HashMap::new(),
        // The pod's whole cache, once: on rank 0's rows.
        engine_cache: cache.filter(|_| rank == 0).map(|c| pb::EngineCache {
            memory_bytes: c.memory_bytes,
            capacity_tokens: c.capacity_tokens,
        }),
    }
}
