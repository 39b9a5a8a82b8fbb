//! One replica's figures on the [`super::LoadBoard`], each its own atomic.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};

use super::PeerPicks;

/// One replica's figures, each its own atomic: a pick or a report changes
/// one replica without a lock that lookups wait on, and a reader that sees
/// one field a moment older than another reads a load that was true a
/// moment ago.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) in_flight: AtomicU32,
    /// Recent picks, weighted as of the board's epoch (`f64` bits).
    pub(super) recent: AtomicU64,
    pub(super) waiting: AtomicU32,
    pub(super) running: AtomicU32,
    /// KV-cache usage (`f32` bits).
    pub(super) kv_usage: AtomicU32,
    /// When the engine last reported (`i64::MIN`: never).
    pub(super) reported_at_ms: AtomicI64,
    /// When the work this server's picks sent is done, ms (`f64` bits).
    pub(super) picked_busy_until: AtomicU64,
    /// When the work the engine's events showed is done, ms (`f64` bits).
    pub(super) observed_busy_until: AtomicU64,
    /// Observed prefill rate, tokens per ms (`f64` bits; 0 = unknown).
    pub(super) prefill_tokens_per_ms: AtomicU64,
    /// Peers' picks ([`super::LoadBoard::peer_picks`]): in flight, recent weight
    /// as of `peer_at_ms`, their work's finish time (`f64` bits each).
    pub(super) peer_in_flight: AtomicU64,
    pub(super) peer_recent: AtomicU64,
    pub(super) peer_busy_until: AtomicU64,
    pub(super) peer_at_ms: AtomicI64,
    /// The peers' figures count until then (`i64::MIN`: never set).
    pub(super) peer_until_ms: AtomicI64,
    /// This server's own recent weight (as of `peer_at_ms`, `f64` bits)
    /// and in flight when the peers' figures were last set: what it picked
    /// since, the peers are assumed to have picked alike.
    pub(super) own_recent_at_peer: AtomicU64,
    pub(super) own_in_flight_at_peer: AtomicU32,
    /// The tag of the first scope resolved with this entry (0: none), and
    /// whether another was too: a pick tagged with its only scope visits
    /// that scope alone ([`super::LoadBoard::picked_in_scope`]).
    pub(super) first_scope: AtomicU64,
    pub(super) many_scopes: AtomicBool,
}

/// Adds `work_ms` of work arriving at `now_ms` to a queue that is done at
/// `busy_until` (a virtual finish time: the engine drains a millisecond of
/// work per millisecond).
pub(super) fn enqueue(busy_until: &AtomicU64, now_ms: f64, work_ms: f64) {
    let _ = busy_until.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
        Some((f64::from_bits(bits).max(now_ms) + work_ms).to_bits())
    });
}

impl Default for Entry {
    fn default() -> Self {
        Self {
            in_flight: AtomicU32::new(0),
            recent: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            running: AtomicU32::new(0),
            kv_usage: AtomicU32::new(0),
            reported_at_ms: AtomicI64::new(i64::MIN),
            picked_busy_until: AtomicU64::new(0),
            observed_busy_until: AtomicU64::new(0),
            prefill_tokens_per_ms: AtomicU64::new(0),
            peer_in_flight: AtomicU64::new(0),
            peer_recent: AtomicU64::new(0),
            peer_busy_until: AtomicU64::new(0),
            peer_at_ms: AtomicI64::new(0),
            peer_until_ms: AtomicI64::new(i64::MIN),
            own_recent_at_peer: AtomicU64::new(0),
            own_in_flight_at_peer: AtomicU32::new(0),
            first_scope: AtomicU64::new(0),
            many_scopes: AtomicBool::new(false),
        }
    }
}

impl Entry {
    /// A scope tagged `tag` was resolved with this entry (set before the
    /// scope's entry is published: a pick that finds it finds this too).
    pub(super) fn note_scope(&self, tag: u64) {
        let other = tag == 0
            || self
                .first_scope
                .compare_exchange(0, tag, Ordering::AcqRel, Ordering::Acquire)
                .is_err_and(|t| t != tag);
        if other {
            self.many_scopes.store(true, Ordering::Release);
        }
    }

    /// Whether no scope but `tag`'s was resolved with this entry.
    pub(super) fn only_in(&self, tag: u64) -> bool {
        !self.many_scopes.load(Ordering::Acquire) && self.first_scope.load(Ordering::Acquire) == tag
    }

    pub(super) fn add_recent(&self, w: f64) {
        let _ = self
            .recent
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + w).to_bits())
            });
    }

    pub(super) fn recent(&self) -> f64 {
        f64::from_bits(self.recent.load(Ordering::Relaxed))
    }

    pub(super) fn prefill_rate(&self) -> Option<f64> {
        let rate = f64::from_bits(self.prefill_tokens_per_ms.load(Ordering::Relaxed));
        (rate > 0.0).then_some(rate)
    }

    /// The peers' picks at `now_ms` (zero once expired), with `live_peers`
    /// times this server's own picks since their figures were set
    /// (`own_recent` now, weighted as of now).
    ///
    /// Why the estimate: every replica reads the same shared figures
    /// between two reports, so each fills the same gap (an idle engine, a
    /// light one) as if alone, and the engine gets the gap `live_peers + 1`
    /// times over at once. Assuming the peers pick as this server does
    /// until their next report lets each fill only its share.
    pub(super) fn peer(
        &self,
        now_ms: i64,
        half_life: f64,
        own_recent: f64,
        live_peers: u32,
    ) -> PeerPicks {
        if now_ms > self.peer_until_ms.load(Ordering::Relaxed) {
            return PeerPicks::default();
        }
        let f = |a: &AtomicU64| f64::from_bits(a.load(Ordering::Relaxed));
        let age = now_ms.saturating_sub(self.peer_at_ms.load(Ordering::Relaxed)) as f64;
        let aged = (-(age.max(0.0)) / half_life).exp2();
        let peers = f64::from(live_peers);
        let recent_since = (own_recent - f(&self.own_recent_at_peer) * aged).max(0.0);
        let in_flight_since = f64::from(
            self.in_flight
                .load(Ordering::Relaxed)
                .saturating_sub(self.own_in_flight_at_peer.load(Ordering::Relaxed)),
        );
        PeerPicks {
            in_flight: f(&self.peer_in_flight) + peers * in_flight_since,
            recent: f(&self.peer_recent) * aged + peers * recent_since,
            queued_ms: (f(&self.peer_busy_until) - now_ms as f64).max(0.0),
        }
    }
}
