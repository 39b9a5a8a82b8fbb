//! Engine load as the routing core sees it, per replica (engine pod).
//!
//! Three estimates of the same thing — how many requests an engine is busy
//! with — each blind in its own way:
//! * requests in flight that this picker sent and has not seen finish (exact
//!   for the endpoint picker, which sees every request end);
//! * picks this server recommended recently, decayed with a half-life
//!   (LookupRoute never learns when a request ends);
//! * the engine's own waiting + running counts, scraped from its metrics by
//!   the subscriber (covers traffic from every gateway, but lags a scrape).
//!
//! The load of a replica is the largest of the three; the KV-cache usage
//! comes from the engine alone. Times are Unix milliseconds passed in.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering, fence};

use crate::index::FastMap;
use crate::route::Shortlist;
use crate::sharded::ShardedRwLock;

/// A read guard of a [`ShardedRwLock`].
type ReadGuard<'a, T> = crossbeam_utils::sync::ShardedLockReadGuard<'a, T>;

/// A scope's shortlist, read-locked by a pick, and how many of its
/// eligible members are the picked replica.
type ListedPick<'a> = (ReadGuard<'a, Option<Arc<Shortlist>>>, usize);

mod entry;
mod scopes;
use entry::{Entry, enqueue};
pub(crate) use scopes::{LoadReader, MemberLoads};

/// What an engine last reported about itself.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests queued, not yet scheduled.
    pub waiting: u32,
    /// Requests being processed.
    pub running: u32,
    /// Fraction of the KV cache in use, 0..=1.
    pub kv_usage: f32,
}

/// A replica's load, as scored.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReplicaLoad {
    /// Requests the engine is busy with (the largest estimate).
    pub requests: f64,
    /// Fraction of its KV cache in use (0 when unknown).
    pub kv_usage: f64,
    /// Work queued ahead of a new request, ms: the longer of the work this
    /// server's picks sent and the work the engine's own events showed
    /// (see [`LoadBoard::add_work`]).
    pub queued_ms: f64,
    /// Prompt tokens per ms this engine prefilled, as its responses showed
    /// (see [`LoadBoard::observed_prefill_rate`]); `None` until observed.
    pub prefill_tokens_per_ms: Option<f64>,
    /// [`Self::requests`] without the peers' figures: this server's own
    /// picks and the engine's report. Orders equal predicted TTFTs
    /// ([`crate::pick`]): the peers' part is the same on every replica
    /// between two reports, and would send every replica's tied pick to
    /// the same engine.
    pub own_requests: f64,
}

/// The picks other index-server replicas made for one engine, as they
/// report them to this one (summed over the peers): with several replicas
/// each sees only the picks of the gateways that ask it, so each adds the
/// others' to its own.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PeerPicks {
    /// Requests the peers sent and have not seen finish.
    pub in_flight: f64,
    /// The peers' recent pick weight (decayed with the half-life).
    pub recent: f64,
    /// Work the peers' picks queued on the engine, ms from the report.
    pub queued_ms: f64,
}

/// How load estimates age.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSettings {
    /// Half-life of a recommended pick's weight, ms.
    pub pick_half_life_ms: i64,
    /// An engine report older than this is ignored, ms.
    pub engine_report_ttl_ms: i64,
    /// A large scope's shortlist of its least loaded replicas (and its
    /// fleet figures) is rebuilt once it is this old, ms.
    pub shortlist_refresh_ms: i64,
    /// ... or once this many load changes other than picks (engine
    /// reports, requests started or ended, queued work, peers' figures)
    /// happened on the board since it was built: picks only add to a
    /// replica's load, which the shortlist follows exactly.
    pub shortlist_refresh_changes: u64,
}

impl Default for LoadSettings {
    fn default() -> Self {
        Self {
            pick_half_life_ms: 10_000,
            engine_report_ttl_ms: 30_000,
            shortlist_refresh_ms: 20,
            shortlist_refresh_changes: 16,
        }
    }
}

/// Load of every replica the picker has heard of, by replica id.
///
/// Every pick decays at the same rate, so the board keeps each replica's
/// recent picks weighted as of one epoch: a pick at `t` adds
/// `2^((t - epoch) / half_life)`, and the weight at `now` is the sum times
/// `2^(-(now - epoch) / half_life)`, one factor for every replica. Reading
/// a replica's load is then a multiply, not an `exp` per replica, and the
/// order of the replicas' pick weights never changes as time passes.
///
/// The map is write-locked only when a replica first appears, leaves, or
/// the epoch moves (every 64 half-lives); picks, reports and reads take its
/// read lock and change one replica's atomics. A lookup reads its scope's
/// entries through [`MemberLoads`], resolved once per change of the scope's
/// members or of the board's replicas, so it probes no map per replica.
#[derive(Debug, Default)]
pub struct LoadBoard {
    settings: LoadSettings,
    entries: ShardedRwLock<FastMap<Box<str>, Arc<Entry>>>,
    epoch_ms: AtomicI64,
    /// Twice the rebases so far, plus one while one is under way (written
    /// under the map's write lock): a [`LoadReader`] that reads without
    /// the lock checks each read against it.
    rebases: AtomicU64,
    /// Bumped (under the map's write lock) when a replica joins or leaves
    /// the board: resolved [`MemberLoads`] of an older generation are stale.
    generation: AtomicU64,
    /// Each scope's resolved entries, by the caller's scope tag.
    scopes: ShardedRwLock<FastMap<u64, MemberLoads>>,
    /// Peer replicas whose figures are fresh ([`LoadBoard::set_live_peers`]).
    live_peers: AtomicU32,
    /// Load changes other than picks so far (reports, requests started and
    /// ended, queued work, peers' figures): how stale a scope's shortlist is.
    changes: AtomicU64,
    /// Shortlists rebuilt (see [`LoadBoard::shortlist_refreshes`]).
    refreshes: AtomicU64,
    /// Told the replica id whenever this server's own figures of it change
    /// ([`LoadBoard::on_own_change`]).
    own_listener: OwnListener,
}

/// A callback told of every change of this server's own picks.
#[derive(Default)]
struct OwnListener(std::sync::OnceLock<Box<OwnChange>>);

/// What [`LoadBoard::on_own_change`] calls.
type OwnChange = dyn Fn(&str) + Send + Sync;

impl std::fmt::Debug for OwnListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "OwnListener(set)"
        } else {
            "OwnListener(none)"
        })
    }
}

impl OwnListener {
    fn tell(&self, replica_id: &str) {
        if let Some(f) = self.0.get() {
            f(replica_id);
        }
    }
}

/// Half-lives after the epoch when the board rebases its weights, well
/// inside an `f64`'s range.
const REBASE_HALF_LIVES: f64 = 64.0;

impl LoadBoard {
    /// An empty board.
    pub fn new(settings: LoadSettings) -> Self {
        Self {
            settings,
            ..Self::default()
        }
    }

    fn half_life(&self) -> f64 {
        self.settings.pick_half_life_ms.max(1) as f64
    }

    /// Half-lives from the epoch to `t_ms` (negative before it).
    fn ahead(&self, t_ms: i64) -> f64 {
        t_ms.saturating_sub(self.epoch_ms.load(Ordering::Relaxed)) as f64 / self.half_life()
    }

    /// The factor turning epoch weights into weights at `now_ms`.
    fn decay_factor(&self, now_ms: i64) -> f64 {
        // A clock behind the epoch decays nothing (as an age of zero).
        (-self.ahead(now_ms).max(0.0)).max(-2_000.0).exp2()
    }

    /// Shortlists rebuilt so far: each read every replica of its scope.
    pub fn shortlist_refreshes(&self) -> u64 {
        self.refreshes.load(Ordering::Relaxed)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `f` on `replica_id`'s entry, creating it when new; a load
    /// change.
    fn with_entry(&self, replica_id: &str, f: impl FnOnce(&Entry)) {
        self.changed();
        self.with_entry_quiet(replica_id, f);
    }

    /// [`Self::with_entry`] without counting a change.
    fn with_entry_quiet(&self, replica_id: &str, f: impl FnOnce(&Entry)) {
        if let Some(e) = self.entries.read().get(replica_id) {
            return f(e);
        }
        let mut map = self.entries.write();
        let e = map.entry(replica_id.into()).or_insert_with(|| {
            self.generation.fetch_add(1, Ordering::Relaxed);
            Arc::default()
        });
        f(e);
    }

    /// `replica_id` was recommended for a request at `now_ms`.
    pub fn picked(&self, replica_id: &str, now_ms: i64) {
        self.picked_with_work(replica_id, now_ms, |_| 0.0);
    }

    /// [`Self::picked`] and [`Self::add_work`] at once, in one visit of the
    /// replica's entry: `work_ms` turns the replica's observed prefill rate
    /// ([`Self::prefill_rate`]) into the work the pick sent.
    pub fn picked_with_work(
        &self,
        replica_id: &str,
        now_ms: i64,
        work_ms: impl FnOnce(Option<f64>) -> f64,
    ) {
        self.pick(None, replica_id, now_ms, work_ms);
    }

    /// [`Self::picked_with_work`] of a pick routed in the scope tagged
    /// `scope_tag` ([`crate::route::scope_tag`]): when no other scope holds
    /// the replica, only that scope's shortlist is visited.
    pub fn picked_in_scope(
        &self,
        scope_tag: u64,
        replica_id: &str,
        now_ms: i64,
        work_ms: impl FnOnce(Option<f64>) -> f64,
    ) {
        self.pick(Some(scope_tag), replica_id, now_ms, work_ms);
    }

    fn pick(
        &self,
        scope_tag: Option<u64>,
        replica_id: &str,
        now_ms: i64,
        work_ms: impl FnOnce(Option<f64>) -> f64,
    ) {
        let ahead = self.ahead(now_ms);
        if !(0.0..REBASE_HALF_LIVES).contains(&ahead) {
            // Re-express every weight as of now (also the first pick's
            // epoch, and a clock that stepped back).
            let map = self.entries.write();
            let ahead = self.ahead(now_ms);
            if !(0.0..REBASE_HALF_LIVES).contains(&ahead) {
                // A sequence lock's write: odd while the scale changes.
                let rebases = self.rebases.load(Ordering::Relaxed);
                self.rebases.store(rebases + 1, Ordering::Relaxed);
                fence(Ordering::Release);
                let factor = self.decay_factor(now_ms);
                for e in map.values() {
                    e.recent
                        .store((e.recent() * factor).to_bits(), Ordering::Relaxed);
                }
                self.epoch_ms.store(now_ms, Ordering::Relaxed);
                self.rebases.store(rebases + 2, Ordering::Release);
            }
        }
        // A pick only adds to its replica's figures, so a shortlist need
        // not be rebuilt for it: the shortlists listing the replica add it
        // to their fleet figures instead, and it is no change. Each scope
        // holding the replica is held from here until the pick is added,
        // so no list is rebuilt without it meanwhile. Weighed under the
        // map's lock, so a rebase never falls between. Every lock here is
        // read through the thread's shard ([`ShardedRwLock`]), and the
        // lists are borrowed, not cloned: a pick writes no line that the
        // concurrent lookups' locks share, only the figures it changes.
        let scopes = self.scopes.read();
        let map = self.entries.read();
        let Some(e) = map.get(replica_id) else {
            // New to the board: in no resolved scope (resolving gives
            // every member its entry), so in no list.
            drop(map);
            drop(scopes);
            self.with_entry_quiet(replica_id, |e| {
                self.add_pick(e, now_ms, work_ms, &[]);
            });
            self.own_listener.tell(replica_id);
            return;
        };
        let mut held: smallvec::SmallVec<[ReadGuard<'_, ()>; 1]> = smallvec::SmallVec::new();
        let mut lists: smallvec::SmallVec<[ListedPick<'_>; 1]> = smallvec::SmallVec::new();
        let h = crate::pick::id_hash(replica_id);
        let only = scope_tag.filter(|&t| e.only_in(t));
        let visited = only.and_then(|t| scopes.get(&t)).into_iter().chain(
            only.is_none()
                .then(|| scopes.values())
                .into_iter()
                .flatten(),
        );
        for m in visited {
            let mut of = m
                .with_hash(h)
                .filter(|&i| m.members[i].key.replica_id == replica_id)
                .peekable();
            if of.peek().is_none() {
                continue;
            }
            held.push(m.rebuilding.read());
            let list = m.shortlist.read();
            let n = list
                .as_deref()
                .map_or(0, |list| of.filter(|&i| list.counts(i)).count());
            if n > 0 {
                lists.push((list, n));
            }
        }
        let listed: smallvec::SmallVec<[(&Shortlist, usize); 1]> = lists
            .iter()
            .filter_map(|(list, n)| list.as_deref().map(|list| (list, *n)))
            .collect();
        self.add_pick(e, now_ms, work_ms, &listed);
        drop(listed);
        drop(lists);
        drop(held);
        drop(map);
        drop(scopes);
        self.own_listener.tell(replica_id);
    }

    /// Adds a pick at `now_ms` to `e` (and the work `work_ms` makes of
    /// its prefill rate), and to the fleet figures of `lists`, each with
    /// the number of its eligible members that are `e`'s replica.
    fn add_pick(
        &self,
        e: &Entry,
        now_ms: i64,
        work_ms: impl FnOnce(Option<f64>) -> f64,
        lists: &[(&Shortlist, usize)],
    ) {
        let decay = self.decay_factor(now_ms);
        let before = (!lists.is_empty()).then(|| self.entry_load(e, now_ms, decay).requests);
        e.add_recent(self.ahead(now_ms).max(0.0).exp2());
        let work = work_ms(e.prefill_rate());
        if work > 0.0 {
            enqueue(&e.picked_busy_until, now_ms as f64, work);
        }
        if let Some(before) = before {
            let after = self.entry_load(e, now_ms, decay).requests;
            for (list, members) in lists {
                list.picked(*members, after - before, after);
            }
        }
    }

    /// Calls `f` with the replica id after every change of this server's
    /// own figures (a pick, a request started or finished): the peer
    /// exchange pushes a pick to the other replicas at once instead of at
    /// its next interval. Only the first listener set is kept (false for
    /// a later one); `f` runs on the pick's path, so it must be quick.
    pub fn on_own_change(&self, f: impl Fn(&str) + Send + Sync + 'static) -> bool {
        self.own_listener.0.set(Box::new(f)).is_ok()
    }

    /// A request this picker sent to `replica_id` started.
    pub fn started(&self, replica_id: &str) {
        self.with_entry(replica_id, |e| {
            e.in_flight.fetch_add(1, Ordering::Relaxed);
        });
        self.own_listener.tell(replica_id);
    }

    /// A request this picker sent to `replica_id` finished (or failed).
    pub fn finished(&self, replica_id: &str) {
        self.changed();
        if let Some(e) = self.entries.read().get(replica_id) {
            let _ = e
                .in_flight
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(1))
                });
            self.own_listener.tell(replica_id);
        }
    }

    /// A pick sent `work_ms` of work (its prefill, by the TTFT model) to
    /// `replica_id` at `now_ms`.
    pub fn add_work(&self, replica_id: &str, work_ms: f64, now_ms: i64) {
        self.with_entry(replica_id, |e| {
            enqueue(&e.picked_busy_until, now_ms as f64, work_ms);
        });
    }

    /// The engine behind `replica_id` showed `work_ms` of work at `now_ms`
    /// (blocks it stored, whoever sent the request): every index replica
    /// sees every engine's events, so this queue counts the picks of every
    /// gateway and every replica, a little late.
    pub fn observed_work(&self, replica_id: &str, work_ms: f64, now_ms: i64) {
        self.with_entry(replica_id, |e| {
            enqueue(&e.observed_busy_until, now_ms as f64, work_ms);
        });
    }

    /// The engine behind `replica_id` prefills `tokens_per_ms` prompt tokens
    /// per millisecond, as the picker measured from its responses (usage
    /// and time to first byte); a rate that is not finite and positive is
    /// ignored.
    pub fn observed_prefill_rate(&self, replica_id: &str, tokens_per_ms: f64) {
        if tokens_per_ms.is_finite() && tokens_per_ms > 0.0 {
            self.with_entry(replica_id, |e| {
                e.prefill_tokens_per_ms
                    .store(tokens_per_ms.to_bits(), Ordering::Relaxed);
            });
        }
    }

    /// The observed prefill rate of `replica_id`, tokens per ms.
    pub fn prefill_rate(&self, replica_id: &str) -> Option<f64> {
        self.entries
            .read()
            .get(replica_id)
            .and_then(|e| e.prefill_rate())
    }

    /// The engine behind `replica_id` reported its load at `now_ms`.
    pub fn report_engine(&self, replica_id: &str, load: EngineLoad, now_ms: i64) {
        self.with_entry(replica_id, |e| {
            e.waiting.store(load.waiting, Ordering::Relaxed);
            e.running.store(load.running, Ordering::Relaxed);
            e.kv_usage.store(load.kv_usage.to_bits(), Ordering::Relaxed);
            e.reported_at_ms.store(now_ms, Ordering::Relaxed);
        });
    }

    /// The load of `replica_id` at `now_ms` (zero when never heard of).
    pub fn load(&self, replica_id: &str, now_ms: i64) -> ReplicaLoad {
        let map = self.entries.read();
        map.get(replica_id).map_or_else(ReplicaLoad::default, |e| {
            self.entry_load(e, now_ms, self.decay_factor(now_ms))
        })
    }

    fn entry_load(&self, e: &Entry, now_ms: i64, decay: f64) -> ReplicaLoad {
        let at = e.reported_at_ms.load(Ordering::Relaxed);
        let fresh =
            at != i64::MIN && now_ms.saturating_sub(at) <= self.settings.engine_report_ttl_ms;
        let (reported, kv_usage) = if fresh {
            let kv = f32::from_bits(e.kv_usage.load(Ordering::Relaxed));
            (
                f64::from(e.waiting.load(Ordering::Relaxed))
                    + f64::from(e.running.load(Ordering::Relaxed)),
                f64::from(kv).clamp(0.0, 1.0),
            )
        } else {
            (0.0, 0.0)
        };
        let now = now_ms as f64;
        let peer = e.peer(
            now_ms,
            self.half_life(),
            e.recent() * decay,
            self.live_peers.load(Ordering::Relaxed),
        );
        // The peers' picks add to this server's own; the engine's own
        // figures already cover everyone's.
        let picked_ms = (f64::from_bits(e.picked_busy_until.load(Ordering::Relaxed)) - now)
            .max(0.0)
            + peer.queued_ms;
        let observed_ms = f64::from_bits(e.observed_busy_until.load(Ordering::Relaxed)) - now;
        ReplicaLoad {
            requests: (f64::from(e.in_flight.load(Ordering::Relaxed)) + peer.in_flight)
                .max(e.recent() * decay + peer.recent)
                .max(reported),
            kv_usage,
            queued_ms: picked_ms.max(observed_ms).max(0.0),
            prefill_tokens_per_ms: e.prefill_rate(),
            own_requests: f64::from(e.in_flight.load(Ordering::Relaxed))
                .max(e.recent() * decay)
                .max(reported),
        }
    }

    /// The load of each of `replica_ids` at `now_ms`, in order.
    pub fn loads(&self, replica_ids: &[&str], now_ms: i64) -> Vec<ReplicaLoad> {
        let map = self.entries.read();
        let decay = self.decay_factor(now_ms);
        replica_ids
            .iter()
            .map(|id| {
                map.get(*id)
                    .map_or_else(ReplicaLoad::default, |e| self.entry_load(e, now_ms, decay))
            })
            .collect()
    }

    /// This server's own picks of every replica at `now_ms`, without the
    /// peers' (what it reports to them); replicas with none are left out.
    pub fn own_picks(&self, now_ms: i64) -> Vec<(String, PeerPicks)> {
        let map = self.entries.read();
        let decay = self.decay_factor(now_ms);
        map.iter()
            .filter_map(|(id, e)| {
                let picks = PeerPicks {
                    in_flight: f64::from(e.in_flight.load(Ordering::Relaxed)),
                    recent: e.recent() * decay,
                    queued_ms: (f64::from_bits(e.picked_busy_until.load(Ordering::Relaxed))
                        - now_ms as f64)
                        .max(0.0),
                };
                (picks.in_flight > 0.0 || picks.recent >= 1e-3 || picks.queued_ms > 0.0)
                    .then(|| (id.to_string(), picks))
            })
            .collect()
    }

    /// This server's own picks of each of `replica_ids` at `now_ms`, zero
    /// included (a request that ended), for replicas on the board: what
    /// changed since the last report, pushed to the peers at once.
    pub fn own_picks_of<'a>(
        &self,
        replica_ids: impl IntoIterator<Item = &'a str>,
        now_ms: i64,
    ) -> Vec<(String, PeerPicks)> {
        let map = self.entries.read();
        let decay = self.decay_factor(now_ms);
        replica_ids
            .into_iter()
            .filter_map(|id| {
                let e = map.get(id)?;
                let picks = PeerPicks {
                    in_flight: f64::from(e.in_flight.load(Ordering::Relaxed)),
                    recent: e.recent() * decay,
                    queued_ms: (f64::from_bits(e.picked_busy_until.load(Ordering::Relaxed))
                        - now_ms as f64)
                        .max(0.0),
                };
                Some((id.to_owned(), picks))
            })
            .collect()
    }

    /// The peers' picks of `replica_id`, summed, as of `now_ms`: they
    /// replace the previous figures and count until `now_ms + ttl_ms` (a
    /// silent peer's picks expire).
    pub fn peer_picks(&self, replica_id: &str, picks: PeerPicks, now_ms: i64, ttl_ms: i64) {
        let finite = |x: f64| if x.is_finite() { x.max(0.0) } else { 0.0 };
        self.with_entry(replica_id, |e| {
            e.peer_in_flight
                .store(finite(picks.in_flight).to_bits(), Ordering::Relaxed);
            e.peer_recent
                .store(finite(picks.recent).to_bits(), Ordering::Relaxed);
            e.peer_busy_until.store(
                (now_ms as f64 + finite(picks.queued_ms)).to_bits(),
                Ordering::Relaxed,
            );
            e.peer_at_ms.store(now_ms, Ordering::Relaxed);
            e.peer_until_ms
                .store(now_ms.saturating_add(ttl_ms.max(0)), Ordering::Relaxed);
            e.own_recent_at_peer.store(
                (e.recent() * self.decay_factor(now_ms)).to_bits(),
                Ordering::Relaxed,
            );
            e.own_in_flight_at_peer
                .store(e.in_flight.load(Ordering::Relaxed), Ordering::Relaxed);
        });
    }

    /// How many peer replicas' figures are fresh: between two reports each
    /// is assumed to pick as this server does (see [`LoadBoard::peer_picks`]).
    pub fn set_live_peers(&self, live_peers: u32) {
        if self.live_peers.swap(live_peers, Ordering::Relaxed) != live_peers {
            self.changed();
        }
    }

    /// Keeps only the replicas `keep` accepts (those still in the index), so
    /// the board never outlives a replica; returns how many left. Called
    /// every upkeep: it also forgets the resolutions of scopes no lookup
    /// used since the previous call (gone from the index, or their
    /// replicas moved to another scope), and takes a write lock only for
    /// what it removes.
    pub fn retain(&self, mut keep: impl FnMut(&str) -> bool) -> usize {
        let leaving = self.entries.read().keys().any(|id| !keep(id));
        let left = if leaving {
            let mut map = self.entries.write();
            let before = map.len();
            map.retain(|id, _| keep(id));
            before - map.len()
        } else {
            0
        };
        if left > 0 {
            // Every resolved scope is stale now (the generation moved).
            self.generation.fetch_add(1, Ordering::Relaxed);
            self.scopes.write().clear();
            return left;
        }
        // Each scope keeps its resolution and its shortlist while used.
        let unused: smallvec::SmallVec<[u64; 4]> = self
            .scopes
            .read()
            .iter()
            .filter(|(_, m)| !m.used.swap(false, Ordering::Relaxed))
            .map(|(tag, _)| *tag)
            .collect();
        if !unused.is_empty() {
            let mut scopes = self.scopes.write();
            for tag in unused {
                // Unless a lookup used it meanwhile.
                if scopes
                    .get(&tag)
                    .is_some_and(|m| !m.used.load(Ordering::Relaxed))
                {
                    scopes.remove(&tag);
                }
            }
        }
        0
    }

    /// Replicas on the board.
    pub fn len(&self) -> usize {
        self.entries.read().len()
    }

    /// Whether the board is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.read().is_empty()
    }
}

#[cfg(test)]
mod tests;
