//! A simple engine timing model, so routing shows up as time-to-first-token
//! and not only as a hit ratio: each engine prefills one request at a time,
//! first come first served; a request's prefill costs a fixed overhead plus
//! a time per prompt token not found in the engine's cache. TTFT is the
//! time queued plus the prefill. Times are the trace's milliseconds.

use crate::rng::Rng;

/// Cost of a prefill.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimingModel {
    /// Prompt tokens an engine prefills per second.
    pub prefill_tokens_per_second: f64,
    /// Fixed cost of every request, ms.
    pub overhead_ms: f64,
}

impl Default for TimingModel {
    fn default() -> Self {
        Self {
            prefill_tokens_per_second: 30_000.0,
            overhead_ms: 20.0,
        }
    }
}

impl TimingModel {
    /// Milliseconds to prefill `uncached_tokens`.
    pub fn prefill_ms(&self, uncached_tokens: u64) -> f64 {
        self.overhead_ms + uncached_tokens as f64 * 1000.0 / self.prefill_tokens_per_second.max(1.0)
    }
}

/// When each engine is free again.
#[derive(Clone, Debug)]
pub struct EngineQueues {
    model: TimingModel,
    free_at_ms: Vec<f64>,
}

impl EngineQueues {
    /// `engines` idle engines.
    pub fn new(engines: usize, model: TimingModel) -> Self {
        Self {
            model,
            free_at_ms: vec![0.0; engines],
        }
    }

    /// A request arriving at `arrival_ms` on `engine` with `uncached_tokens`
    /// to prefill: its TTFT, ms.
    pub fn serve(&mut self, engine: usize, arrival_ms: f64, uncached_tokens: u64) -> f64 {
        let start = self.free_at_ms[engine].max(arrival_ms);
        let done = start + self.model.prefill_ms(uncached_tokens);
        self.free_at_ms[engine] = done;
        done - arrival_ms
    }

    /// Milliseconds to prefill `uncached_tokens` on any engine.
    pub fn prefill_ms(&self, uncached_tokens: u64) -> f64 {
        self.model.prefill_ms(uncached_tokens)
    }

    /// Work queued on `engine` at `now_ms`, ms (what a gateway balancing by
    /// load would look at).
    pub fn backlog_ms(&self, engine: usize, now_ms: f64) -> f64 {
        (self.free_at_ms[engine] - now_ms).max(0.0)
    }

    /// The engine with less queued work at `now_ms` of two drawn at random
    /// (power of two choices, as a least-request load balancer does; always
    /// taking the least loaded would send every tie to the same engine).
    pub fn less_loaded_of_two(&self, now_ms: f64, rng: &mut Rng) -> usize {
        let n = self.free_at_ms.len();
        let a = rng.below(n);
        let b = rng.below(n);
        if self.backlog_ms(b, now_ms) < self.backlog_ms(a, now_ms) {
            b
        } else {
            a
        }
    }
}

/// Nearest-rank percentile of unsorted values.
pub fn percentile_ms(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_queue_behind_each_other_and_cached_tokens_are_free() {
        let model = TimingModel {
            prefill_tokens_per_second: 1_000.0,
            overhead_ms: 10.0,
        };
        let mut q = EngineQueues::new(2, model);
        assert_eq!(q.serve(0, 0.0, 1_000), 1_010.0);
        // Arrives while engine 0 is busy: waits for it.
        assert_eq!(q.serve(0, 10.0, 0), 1_010.0);
        let mut rng = Rng::new(3);
        for _ in 0..20 {
            // Whenever engine 1 is drawn it wins: it is idle.
            let pick = q.less_loaded_of_two(10.0, &mut rng);
            assert!(pick == 1 || q.backlog_ms(1, 10.0) >= q.backlog_ms(0, 10.0) || pick == 0);
        }
        assert_eq!(q.serve(1, 10.0, 0), 10.0);
        assert_eq!(q.backlog_ms(0, 1_000.0), 20.0);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile_ms(&v, 50.0), 50.0);
        assert_eq!(percentile_ms(&v, 99.0), 99.0);
        assert_eq!(percentile_ms(&[], 99.0), 0.0);
    }
}
