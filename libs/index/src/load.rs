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

use crate::index::FastMap;

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
}

/// How load estimates age.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSettings {
    /// Half-life of a recommended pick's weight, ms.
    pub pick_half_life_ms: i64,
    /// An engine report older than this is ignored, ms.
    pub engine_report_ttl_ms: i64,
}

impl Default for LoadSettings {
    fn default() -> Self {
        Self {
            pick_half_life_ms: 10_000,
            engine_report_ttl_ms: 30_000,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    in_flight: u32,
    recent: f64,
    recent_at_ms: i64,
    engine: Option<(EngineLoad, i64)>,
}

/// Load of every replica the picker has heard of, by replica id.
#[derive(Clone, Debug, Default)]
pub struct LoadBoard {
    settings: LoadSettings,
    entries: FastMap<String, Entry>,
}

impl LoadBoard {
    /// An empty board.
    pub fn new(settings: LoadSettings) -> Self {
        Self {
            settings,
            entries: FastMap::default(),
        }
    }

    fn decayed(&self, e: &Entry, now_ms: i64) -> f64 {
        let half_life = self.settings.pick_half_life_ms.max(1) as f64;
        let age = now_ms.saturating_sub(e.recent_at_ms).max(0) as f64;
        e.recent * (-age / half_life * std::f64::consts::LN_2).exp()
    }

    /// `replica_id` was recommended for a request at `now_ms`.
    pub fn picked(&mut self, replica_id: &str, now_ms: i64) {
        let e = self.entries.get(replica_id).copied().unwrap_or_default();
        let recent = self.decayed(&e, now_ms) + 1.0;
        let entry = self.entries.entry(replica_id.to_owned()).or_default();
        entry.recent = recent;
        entry.recent_at_ms = now_ms;
    }

    /// A request this picker sent to `replica_id` started.
    pub fn started(&mut self, replica_id: &str) {
        self.entries
            .entry(replica_id.to_owned())
            .or_default()
            .in_flight += 1;
    }

    /// A request this picker sent to `replica_id` finished (or failed).
    pub fn finished(&mut self, replica_id: &str) {
        if let Some(e) = self.entries.get_mut(replica_id) {
            e.in_flight = e.in_flight.saturating_sub(1);
        }
    }

    /// The engine behind `replica_id` reported its load at `now_ms`.
    pub fn report_engine(&mut self, replica_id: &str, load: EngineLoad, now_ms: i64) {
        self.entries
            .entry(replica_id.to_owned())
            .or_default()
            .engine = Some((load, now_ms));
    }

    /// The load of `replica_id` at `now_ms` (zero when never heard of).
    pub fn load(&self, replica_id: &str, now_ms: i64) -> ReplicaLoad {
        let Some(e) = self.entries.get(replica_id) else {
            return ReplicaLoad::default();
        };
        let engine = e
            .engine
            .filter(|(_, at)| now_ms.saturating_sub(*at) <= self.settings.engine_report_ttl_ms)
            .map(|(l, _)| l);
        let reported = engine.map_or(0.0, |l| f64::from(l.waiting) + f64::from(l.running));
        ReplicaLoad {
            requests: f64::from(e.in_flight)
                .max(self.decayed(e, now_ms))
                .max(reported),
            kv_usage: engine.map_or(0.0, |l| f64::from(l.kv_usage).clamp(0.0, 1.0)),
        }
    }

    /// The load of each of `replica_ids` at `now_ms`, in order.
    pub fn loads(&self, replica_ids: &[&str], now_ms: i64) -> Vec<ReplicaLoad> {
        replica_ids.iter().map(|id| self.load(id, now_ms)).collect()
    }

    /// Keeps only the replicas `keep` accepts (those still in the index), so
    /// the board never outlives a replica.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.entries.retain(|id, _| keep(id));
    }

    /// Replicas on the board.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the board is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_decay_with_their_half_life() {
        let mut board = LoadBoard::new(LoadSettings {
            pick_half_life_ms: 1_000,
            engine_report_ttl_ms: 5_000,
        });
        board.picked("a", 0);
        board.picked("a", 0);
        assert!((board.load("a", 0).requests - 2.0).abs() < 1e-9);
        assert!((board.load("a", 1_000).requests - 1.0).abs() < 1e-9);
        board.picked("a", 1_000);
        assert!((board.load("a", 1_000).requests - 2.0).abs() < 1e-9);
        assert_eq!(board.load("nobody", 0), ReplicaLoad::default());
    }

    #[test]
    fn the_largest_estimate_wins_and_old_reports_are_ignored() {
        let mut board = LoadBoard::new(LoadSettings::default());
        board.started("a");
        board.started("a");
        board.finished("a");
        assert_eq!(board.load("a", 0).requests, 1.0);
        board.report_engine(
            "a",
            EngineLoad {
                waiting: 3,
                running: 4,
                kv_usage: 0.5,
            },
            0,
        );
        let now = board.load("a", 10);
        assert_eq!(now.requests, 7.0);
        assert!((now.kv_usage - 0.5).abs() < 1e-6);
        let later = board.load("a", 31_000);
        assert_eq!(later.requests, 1.0, "a stale report no longer counts");
        assert_eq!(later.kv_usage, 0.0);
        board.finished("a");
        board.finished("a");
        assert_eq!(board.load("a", 31_000).requests, 0.0, "never negative");
    }

    #[test]
    fn retain_drops_replicas_gone_from_the_index() {
        let mut board = LoadBoard::default();
        board.picked("a", 0);
        board.picked("b", 0);
        board.retain(|id| id == "b");
        assert_eq!(board.len(), 1);
        assert_eq!(board.load("a", 0).requests, 0.0);
    }
}
