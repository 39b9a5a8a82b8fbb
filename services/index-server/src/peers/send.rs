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
use std::sync::atomic::{AtomicU64, Ordering, fence};
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
///
/// Every pick marks its engine here (once per peer), so the usual mark, of
/// an engine already waiting for the next push, takes no lock: `marked`
/// keeps the hash of each waiting engine, direct-mapped (a slot holds the
/// last engine marked into it), and a mark that finds its engine's hash
/// there is done. Others (a new engine, or one whose slot another holds)
/// take the set's lock. Slots are set under that lock and cleared under it
/// when the reporter takes the set, so a slot names an engine in the set.
/// Between a pick and the reporter, a Dekker pairing of fences: the pick
/// writes its figures, fences, reads the slot; the reporter clears the
/// slots, fences, reads the figures. Either the pick sees its slot cleared
/// (and marks its engine for the next push) or the reporter reads the
/// pick's figures. Two engines with one 64-bit hash would make the second's
/// pushes wait for the next full report.
#[derive(Debug)]
pub(super) struct Pending {
    ids: Mutex<HashSet<Box<str>>>,
    marked: Box<[AtomicU64]>,
    max: usize,
    notify: Notify,
}

/// Slots of [`Pending::marked`] (8 KiB a peer): as many engines as a busy
/// scope picks between two pushes, mostly without sharing a slot.
const MARKED_SLOTS: usize = 1 << 10;

/// The slot and the (non-zero) value that mark `replica_id`.
fn slot_of(replica_id: &str) -> (usize, u64) {
    let h = ic_index::pick::id_hash(replica_id).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let slot = usize::try_from(h >> (64 - MARKED_SLOTS.trailing_zeros())).unwrap_or(0);
    (slot, h | 1)
}

impl Pending {
    fn new(max: usize) -> Self {
        Self {
            ids: Mutex::new(HashSet::new()),
            marked: (0..MARKED_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            max,
            notify: Notify::new(),
        }
    }

    /// Notes `replica_id`, whose figures were just written, for the next
    /// push; false when it is left out (already `max` engines waiting: the
    /// next full report carries it). The caller fences (`SeqCst`) between
    /// writing the figures and marking (once for every peer's mark:
    /// [`super::Exchange::changed`]), the pick's half of the pairing.
    pub(super) fn mark(&self, replica_id: &str) -> bool {
        let (slot, h) = slot_of(replica_id);
        if self.marked[slot].load(Ordering::Relaxed) == h {
            return true;
        }
        let mut ids = self.ids.lock();
        if !ids.contains(replica_id) {
            if ids.len() >= self.max {
                return false;
            }
            let first = ids.is_empty();
            ids.insert(replica_id.into());
            if first {
                // Stores a permit when the reporter is busy sending: it
                // sends again right after, with everything marked
                // meanwhile.
                self.notify.notify_one();
            }
        }
        self.marked[slot].store(h, Ordering::Relaxed);
        true
    }

    /// The engines marked since the last take; their figures are to be
    /// read after it.
    fn take(&self) -> HashSet<Box<str>> {
        let mut ids = self.ids.lock();
        let taken = std::mem::take(&mut *ids);
        for id in &taken {
            let (slot, h) = slot_of(id);
            let _ = self.marked[slot].compare_exchange(h, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
        drop(ids);
        // The slots' clearing before the figures' reads (see the type).
        fence(Ordering::SeqCst);
        taken
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

    /// Marks `id` on another thread while this one holds the set's lock:
    /// whether it returned without the lock within `wait`.
    fn marks_without_the_lock(p: &Arc<Pending>, id: &'static str, wait: Duration) -> bool {
        let held = p.ids.lock();
        let (tx, rx) = std::sync::mpsc::channel();
        let q = Arc::clone(p);
        let marker = std::thread::spawn(move || {
            let _ = tx.send(q.mark(id));
        });
        let quick = rx.recv_timeout(wait).is_ok();
        drop(held);
        let _ = marker.join();
        quick
    }

    #[test]
    fn a_pick_of_an_engine_already_waiting_takes_no_lock() {
        let p = Arc::new(Pending::new(16));
        // Returns as soon as it is done (30 s only for a loaded machine);
        // a mark expected to wait for the lock is given 300 ms.
        let (done, waits) = (Duration::from_secs(30), Duration::from_millis(300));
        assert!(p.mark("a"));
        assert!(marks_without_the_lock(&p, "a", done));
        assert!(
            !marks_without_the_lock(&p, "b", waits),
            "a new engine is added under the lock"
        );
        // Taken: the next pick marks it again (its slot was cleared), so
        // the push after carries it.
        assert_eq!(p.take().len(), 2);
        assert!(!marks_without_the_lock(&p, "a", waits));
        assert_eq!(p.take().len(), 1);
    }

    #[test]
    fn engines_sharing_a_slot_are_each_marked() {
        let (slot, _) = slot_of("e0");
        let other = (1..100_000)
            .map(|i| format!("e{i}"))
            .find(|id| slot_of(id).0 == slot)
            .expect("a second id in the slot among 100,000");
        let p = Pending::new(16);
        for _ in 0..3 {
            assert!(p.mark("e0"));
            assert!(p.mark(&other));
            assert!(p.mark("e0"));
            let mut ids: Vec<Box<str>> = p.take().into_iter().collect();
            ids.sort();
            assert_eq!(ids.len(), 2, "{ids:?}");
        }
    }

    /// Pickers write an engine's figure, then mark it; a reporter takes
    /// the marks and reads the figures: the last figure of every engine is
    /// read by some take (a mark that found its engine waiting was carried
    /// by the take that cleared it, or saw the slot cleared and marked it
    /// again).
    #[test]
    fn no_pick_is_left_out_of_every_push() {
        const ENGINES: usize = 8;
        const PICKS: u64 = 20_000;
        let p = Arc::new(Pending::new(ENGINES));
        let figures: Arc<Vec<AtomicU64>> =
            Arc::new((0..ENGINES).map(|_| AtomicU64::new(0)).collect());
        let ids: Vec<String> = (0..ENGINES).map(|i| format!("engine-{i}")).collect();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let pickers: Vec<_> = (0..2)
            .map(|t| {
                let (p, figures, ids) = (Arc::clone(&p), Arc::clone(&figures), ids.clone());
                std::thread::spawn(move || {
                    for n in 1..=PICKS {
                        let e = (n as usize + t) % ENGINES;
                        figures[e].fetch_max(n, Ordering::Relaxed);
                        fence(Ordering::SeqCst);
                        assert!(p.mark(&ids[e]));
                    }
                })
            })
            .collect();
        let reporter = {
            let (p, figures, ids, done) = (
                Arc::clone(&p),
                Arc::clone(&figures),
                ids.clone(),
                Arc::clone(&done),
            );
            std::thread::spawn(move || {
                let mut seen = vec![0u64; ENGINES];
                loop {
                    let last = done.load(Ordering::Acquire);
                    for id in p.take() {
                        let e = ids.iter().position(|x| **x == *id).expect("a known engine");
                        seen[e] = figures[e].load(Ordering::Relaxed);
                    }
                    if last {
                        return seen;
                    }
                }
            })
        };
        for picker in pickers {
            picker.join().expect("a picker");
        }
        done.store(true, Ordering::Release);
        let seen = reporter.join().expect("the reporter");
        for (e, figure) in figures.iter().enumerate() {
            assert_eq!(seen[e], figure.load(Ordering::Relaxed), "engine {e}");
        }
    }
}
