//! What the picker learns from the responses it sees, per endpoint: how
//! many prompt tokens the engine had to prefill (prompt minus cached, when
//! it reports them) and how long the first response byte took after the
//! pick. From them, a smoothed prefill rate (tokens per second of time to
//! first byte) and the share of prompt tokens served from cache: the
//! calibration a TTFT estimate needs. No I/O; times are passed in.

use std::collections::HashMap;

/// Weight of a new observation in the moving averages.
const ALPHA: f64 = 0.2;

/// One response, as the picker saw it end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObservedResponse {
    /// Prompt tokens, when the engine reported its usage.
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens served from the engine's cache, when reported.
    pub cached_tokens: Option<u64>,
    /// Milliseconds from the pick to the first response body byte.
    pub first_byte_ms: Option<u64>,
}

/// An endpoint's calibration so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EndpointStats {
    /// Responses observed.
    pub responses: u64,
    /// Responses that reported their usage.
    pub with_usage: u64,
    /// Moving average of prefilled (uncached) tokens per second of time to
    /// first byte; `None` until a response gave both.
    pub prefill_tokens_per_second: Option<f64>,
    /// Moving average of the fraction of prompt tokens served from cache;
    /// `None` until the engine reported cached tokens.
    pub cached_fraction: Option<f64>,
    /// Moving average of the time to first byte, ms.
    pub first_byte_ms: Option<f64>,
}

fn average(old: Option<f64>, new: f64) -> f64 {
    old.map_or(new, |o| o + ALPHA * (new - o))
}

/// Every endpoint's calibration, by load-board key (replica id).
#[derive(Debug, Default)]
pub struct Observations {
    by_replica: HashMap<String, EndpointStats>,
}

impl Observations {
    /// Records a response served by `replica_id`.
    pub fn record(&mut self, replica_id: &str, r: &ObservedResponse) {
        let s = self.by_replica.entry(replica_id.to_owned()).or_default();
        s.responses += 1;
        if let Some(ms) = r.first_byte_ms {
            s.first_byte_ms = Some(average(s.first_byte_ms, ms as f64));
        }
        let Some(prompt) = r.prompt_tokens else {
            return;
        };
        s.with_usage += 1;
        let cached = r.cached_tokens.map(|c| c.min(prompt));
        if let Some(c) = cached
            && prompt > 0
        {
            s.cached_fraction = Some(average(s.cached_fraction, c as f64 / prompt as f64));
        }
        // The rate needs what was actually prefilled: without the cached
        // count, only a response the engine could not have cached (its
        // whole prompt is prefill) would do, and nothing says which.
        if let (Some(c), Some(ms)) = (cached, r.first_byte_ms) {
            let prefilled = (prompt - c) as f64;
            if prefilled > 0.0 && ms > 0 {
                let rate = prefilled * 1000.0 / ms as f64;
                s.prefill_tokens_per_second = Some(average(s.prefill_tokens_per_second, rate));
            }
        }
    }

    /// The calibration of `replica_id`, if it served any response.
    pub fn get(&self, replica_id: &str) -> Option<EndpointStats> {
        self.by_replica.get(replica_id).copied()
    }

    /// Keeps only the replicas `keep` accepts, so the table never outlives
    /// the pool.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.by_replica.retain(|id, _| keep(id));
    }

    /// Endpoints observed.
    pub fn len(&self) -> usize {
        self.by_replica.len()
    }

    /// Whether nothing was observed.
    pub fn is_empty(&self) -> bool {
        self.by_replica.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_and_first_byte_calibrate_the_prefill_rate() {
        let mut o = Observations::default();
        o.record(
            "a",
            &ObservedResponse {
                prompt_tokens: Some(2_000),
                cached_tokens: Some(1_000),
                first_byte_ms: Some(100),
            },
        );
        let s = o.get("a").unwrap();
        assert_eq!((s.responses, s.with_usage), (1, 1));
        assert_eq!(s.prefill_tokens_per_second, Some(10_000.0));
        assert_eq!(s.cached_fraction, Some(0.5));
        // A second response moves the averages part of the way.
        o.record(
            "a",
            &ObservedResponse {
                prompt_tokens: Some(1_000),
                cached_tokens: Some(1_000),
                first_byte_ms: Some(20),
            },
        );
        let s = o.get("a").unwrap();
        assert!((s.cached_fraction.unwrap() - 0.6).abs() < 1e-9);
        // Fully cached: no prefill to rate.
        assert_eq!(s.prefill_tokens_per_second, Some(10_000.0));
        // Without a cached count or a first byte: counted, not rated.
        o.record(
            "b",
            &ObservedResponse {
                prompt_tokens: Some(500),
                ..ObservedResponse::default()
            },
        );
        let b = o.get("b").unwrap();
        assert_eq!((b.responses, b.with_usage), (1, 1));
        assert_eq!(b.prefill_tokens_per_second, None);
        assert_eq!(o.get("nobody"), None);
        o.retain(|id| id == "a");
        assert_eq!(o.len(), 1);
    }
}
