//! A Prometheus histogram read from a `/metrics` text page, the difference
//! of two scrapes, and quantiles estimated from its buckets: the server's
//! own view of a phase, set beside the client's.

use serde::Serialize;

/// One histogram's cumulative buckets, sum and count.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// `(le, cumulative count)` in the page's order (ascending `le`,
    /// `+Inf` last).
    pub buckets: Vec<(f64, f64)>,
    /// Sum of the observations.
    pub sum: f64,
    /// Observations.
    pub count: f64,
}

/// What a phase's share of a histogram says, microseconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ServerQuantiles {
    /// Observations in the phase.
    pub count: u64,
    /// Mean (exact: from the sum).
    pub mean_us: f64,
    /// Median, interpolated within its bucket.
    pub p50_us: f64,
    /// 99th percentile, interpolated within its bucket.
    pub p99_us: f64,
    /// 99.9th percentile, interpolated within its bucket.
    pub p999_us: f64,
}

impl Histogram {
    /// The histogram `name` (without `_bucket`) of a text page with no
    /// labels on it but `le`; `None` when absent.
    pub fn parse(page: &str, name: &str) -> Option<Self> {
        let bucket = format!("{name}_bucket{{le=\"");
        let sum = format!("{name}_sum ");
        let count = format!("{name}_count ");
        let mut h = Self {
            buckets: Vec::new(),
            sum: f64::NAN,
            count: f64::NAN,
        };
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix(&bucket) {
                let (le, n) = rest.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                h.buckets.push((le, first_number(n)?));
            } else if let Some(v) = line.strip_prefix(&sum) {
                h.sum = first_number(v)?;
            } else if let Some(v) = line.strip_prefix(&count) {
                h.count = first_number(v)?;
            }
        }
        (!h.buckets.is_empty() && h.sum.is_finite() && h.count.is_finite()).then_some(h)
    }

    /// What was observed between `before` and `self` (same buckets).
    pub fn since(&self, before: &Self) -> Option<Self> {
        if self.buckets.len() != before.buckets.len() {
            return None;
        }
        Some(Self {
            buckets: self
                .buckets
                .iter()
                .zip(&before.buckets)
                .map(|((le, a), (_, b))| (*le, a - b))
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        })
    }

    /// Quantile `q` (0..1) of a seconds histogram, in seconds: linear
    /// within the bucket it falls in, as Prometheus' `histogram_quantile`
    /// does (the bucket's lower bound when it falls in `+Inf`).
    pub fn quantile(&self, q: f64) -> f64 {
        if self.count <= 0.0 {
            return 0.0;
        }
        let rank = q * self.count;
        let mut lower = (0.0, 0.0);
        for &(le, n) in &self.buckets {
            if n >= rank {
                if le.is_infinite() {
                    return lower.0;
                }
                let inside = n - lower.1;
                let frac = if inside > 0.0 {
                    (rank - lower.1) / inside
                } else {
                    1.0
                };
                return lower.0 + (le - lower.0) * frac;
            }
            lower = (le, n);
        }
        lower.0
    }

    /// The phase's figures, microseconds, of a seconds histogram.
    pub fn summary(&self) -> ServerQuantiles {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let count = self.count.max(0.0) as u64;
        ServerQuantiles {
            count,
            mean_us: if count == 0 {
                0.0
            } else {
                self.sum / self.count * 1e6
            },
            p50_us: self.quantile(0.5) * 1e6,
            p99_us: self.quantile(0.99) * 1e6,
            p999_us: self.quantile(0.999) * 1e6,
        }
    }
}

/// The sample value of an exposition line's tail (`12 1700000000` or
/// `12 # {exemplar}`).
fn first_number(s: &str) -> Option<f64> {
    s.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAME: &str = "inferencecache_index_lookup_duration_seconds";

    fn page(counts: [u64; 4], sum: f64) -> String {
        format!(
            "# TYPE {NAME} histogram\n\
             {NAME}_sum {sum}\n{NAME}_count {}\n\
             {NAME}_bucket{{le=\"0.0001\"}} {}\n\
             {NAME}_bucket{{le=\"0.0002\"}} {}\n\
             {NAME}_bucket{{le=\"0.0004\"}} {}\n\
             {NAME}_bucket{{le=\"+Inf\"}} {}\n\
             other_metric_count 5\n",
            counts[3], counts[0], counts[1], counts[2], counts[3]
        )
    }

    #[test]
    fn a_phase_is_the_difference_of_two_scrapes() {
        let before = Histogram::parse(&page([10, 10, 10, 10], 0.001), NAME).unwrap();
        // The phase: 100 observations, 50 in (100, 200] µs, 49 in
        // (200, 400], 1 beyond.
        let after = Histogram::parse(&page([10, 60, 109, 110], 0.031), NAME).unwrap();
        let phase = after.since(&before).unwrap().summary();
        assert_eq!(phase.count, 100);
        assert!((phase.mean_us - 300.0).abs() < 1e-6, "{phase:?}");
        // Rank 50 is the last of the second bucket: its upper bound.
        assert!((phase.p50_us - 200.0).abs() < 1e-6, "{phase:?}");
        // Rank 99 is the 49th of 49 in (200, 400].
        assert!((phase.p99_us - 400.0).abs() < 1e-6, "{phase:?}");
        // Rank 99.9 falls in +Inf: its lower bound.
        assert!((phase.p999_us - 400.0).abs() < 1e-6, "{phase:?}");
        let mid = Histogram::parse(&page([0, 100, 100, 100], 0.015), NAME).unwrap();
        assert!((mid.quantile(0.25) * 1e6 - 125.0).abs() < 1e-6);
    }

    #[test]
    fn absent_or_mismatched_histograms_are_none() {
        assert_eq!(Histogram::parse("up 1\n", NAME), None);
        let h = Histogram::parse(&page([1, 2, 3, 4], 0.1), NAME).unwrap();
        let fewer = Histogram {
            buckets: h.buckets[1..].to_vec(),
            ..h.clone()
        };
        assert_eq!(h.since(&fewer), None);
        assert_eq!(Histogram { count: 0.0, ..h }.summary().p99_us, 0.0);
    }
}
