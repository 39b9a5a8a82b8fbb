//! The sending side of the exchange: one reporter per peer.
//!
//! A reporter sends the full report (every engine this replica has picks
//! for) every `--peer-share-interval-ms`. With `--peer-push` it also sends,
//! as soon as this replica's own figures change (a pick, a request started
//! or ended), a partial report of the engines that changed. Why: between
//! two full reports a peer cannot see this replica's picks, and a request
//! it answers in that window may pick the engine this replica just filled
//! (two long prefills queued behind each other: docs/scaling.md, "Alike
//! answers"). One call is in flight per peer; the engines that change
//! meanwhile go in the next call, so a busy replica sends one call per
//! round trip, not one per pick. A peer that fails gets no pushes until a
//! full report reaches it again.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ic_index::load::PeerPicks;
use ic_proto::index_v1 as pb;
use ic_proto::index_v1::index_peer_service_client::IndexPeerServiceClient;
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tonic::Request;

use super::{Exchange, FLAG, PeerSettings, key};
use crate::index_core::IndexCore;

/// The engines one reporter has yet to push, and the wake-up.
#[derive(Debug)]
pub(super) struct Pending {
    ids: Mutex<HashSet<Box<str>>>,
    max: usize,
    notify: Notify,
}

impl Pending {
    fn new(max: usize) -> Self {
        Self {
            ids: Mutex::new(HashSet::new()),
            max,
            notify: Notify::new(),
        }
    }

    /// Notes `replica_id` for the next push; false when it is left out
    /// (already `max` engines waiting: the next full report carries it).
    pub(super) fn mark(&self, replica_id: &str) -> bool {
        let mut ids = self.ids.lock();
        if ids.contains(replica_id) {
            return true;
        }
        if ids.len() >= self.max {
            return false;
        }
        let first = ids.is_empty();
        ids.insert(replica_id.into());
        drop(ids);
        if first {
            // Stores a permit when the reporter is busy sending: it sends
            // again right after, with everything marked meanwhile.
            self.notify.notify_one();
        }
        true
    }

    fn take(&self) -> HashSet<Box<str>> {
        std::mem::take(&mut *self.ids.lock())
    }
}

/// The token to present, read from its file at most every 10 s.
struct Token {
    value: Option<tonic::metadata::AsciiMetadataValue>,
    read_at: Option<Instant>,
}

impl Token {
    fn get(&mut self, settings: &PeerSettings) -> Option<tonic::metadata::AsciiMetadataValue> {
        let Some(path) = &settings.token_file else {
            return settings
                .static_token
                .as_deref()
                .and_then(ic_proto::bearer::metadata);
        };
        if self
            .read_at
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(10))
        {
            self.read_at = Some(Instant::now());
            match std::fs::read_to_string(path) {
                Ok(token) => self.value = ic_proto::bearer::metadata(&token),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "--peer-token-file: cannot read");
                }
            }
        }
        self.value.clone()
    }
}

/// Waits for `pending`'s next mark; forever without push.
async fn marked(pending: Option<&Pending>) {
    match pending {
        Some(p) => p.notify.notified().await,
        None => std::future::pending().await,
    }
}

/// Reports to one peer (a full report every interval and, with push, the
/// engines that changed as they change) until `stop`, or until the peer
/// turns out to be this replica (then `addr` joins `selves`).
pub(super) async fn report_to(
    exchange: Arc<Exchange>,
    core: Arc<IndexCore>,
    url: String,
    addr: Option<SocketAddr>,
    selves: Arc<Mutex<HashSet<String>>>,
    stop: CancellationToken,
) {
    let endpoint =
        match ic_proto::channel::endpoint_at(&url, addr, exchange.settings.ca_pem.as_deref(), FLAG)
        {
            Ok(e) => e.timeout(exchange.settings.interval.max(Duration::from_millis(250))),
            Err(error) => {
                tracing::error!(%url, %error, "peer URL unusable");
                return;
            }
        };
    let mut client = IndexPeerServiceClient::new(endpoint.connect_lazy());
    let mut token = Token {
        value: None,
        read_at: None,
    };
    let mut tick = tokio::time::interval(exchange.settings.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let max = exchange.settings.max_endpoints;
    let pending = exchange.settings.push.then(|| {
        let p = Arc::new(Pending::new(max));
        exchange.pending.write().push(p.clone());
        p
    });
    let mut failing = false;
    exchange.metrics.destinations.inc();
    loop {
        let partial = tokio::select! {
            biased;
            () = stop.cancelled() => break,
            _ = tick.tick() => false,
            () = marked(pending.as_deref()) => true,
        };
        // A full report carries every engine marked so far.
        let changed = pending.as_deref().map(Pending::take).unwrap_or_default();
        if partial && failing {
            // Not one failing call per pick: the next full report tells
            // when the peer is back.
            continue;
        }
        let board = core.routing().load_board();
        let now_ms = core.now_ms();
        let own: Vec<(String, PeerPicks)> = if partial {
            board.own_picks_of(changed.iter().map(|id| &**id), now_ms)
        } else {
            let mut own = board.own_picks(now_ms);
            if own.len() > max {
                // The busiest engines matter most to the peers' bounds.
                own.sort_by(|a, b| b.1.recent.total_cmp(&a.1.recent));
                exchange
                    .metrics
                    .endpoints_cut
                    .inc_by((own.len() - max) as u64);
                own.truncate(max);
            }
            own
        };
        if partial && own.is_empty() {
            continue;
        }
        let mut request = Request::new(pb::SharePicksRequest {
            instance: exchange.instance,
            endpoints: own
                .into_iter()
                .map(|(replica_id, p)| pb::EndpointPicks {
                    replica_id,
                    in_flight: p.in_flight,
                    recent_picks: p.recent,
                    queued_ms: p.queued_ms,
                })
                .collect(),
            partial,
        });
        if let Some(value) = token.get(&exchange.settings) {
            request.metadata_mut().insert("authorization", value);
        }
        match client.share_picks(request).await {
            Ok(answer) if answer.get_ref().instance == exchange.instance => {
                exchange.metrics.share("sent", partial, "self");
                tracing::info!(%url, addr = ?addr, "a --peer address is this replica: not reporting there");
                selves.lock().insert(key(&url, addr));
                break;
            }
            Ok(_) => {
                exchange.metrics.share("sent", partial, "ok");
                if failing {
                    tracing::info!(%url, addr = ?addr, "peer reachable again");
                    failing = false;
                }
            }
            Err(status) => {
                exchange.metrics.share("sent", partial, "error");
                if !failing {
                    tracing::warn!(%url, addr = ?addr, code = ?status.code(), message = status.message(), "cannot report picks to a peer");
                    failing = true;
                }
            }
        }
    }
    if let Some(p) = &pending {
        exchange.pending.write().retain(|q| !Arc::ptr_eq(p, q));
    }
    exchange.metrics.destinations.dec();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_gather_until_taken_and_wake_the_reporter_once() {
        let p = Pending::new(2);
        assert!(p.mark("a"));
        assert!(p.mark("a"));
        assert!(p.mark("b"));
        // Full: the next full report carries it.
        assert!(!p.mark("c"));
        let mut ids: Vec<Box<str>> = p.take().into_iter().collect();
        ids.sort();
        assert_eq!(ids, [Box::from("a"), Box::from("b")]);
        assert!(p.take().is_empty());
        // One permit was stored for the three marks: the reporter wakes
        // once, and again only after the next mark.
        use futures::FutureExt as _;
        assert!(p.notify.notified().now_or_never().is_some());
        assert!(p.notify.notified().now_or_never().is_none());
        assert!(p.mark("c"));
        assert!(p.notify.notified().now_or_never().is_some());
    }
}
