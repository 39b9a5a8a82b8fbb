//! Open-loop send schedules: when each request of a fixed-rate load is due,
//! as offsets from the phase's start. Pure (no clock, no I/O), so the
//! spacing is tested by counting slots.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

/// How sends are spaced at a given mean rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Spacing {
    /// Exponential gaps (a Poisson process): independent arrivals from many
    /// clients, as a gateway in front of many users sees them. Bursts and
    /// lulls at the same mean rate, so queueing shows.
    Poisson,
    /// Every gap `1 / rate`: the server's best case at that rate.
    Uniform,
}

impl Spacing {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Poisson => "poisson",
            Self::Uniform => "uniform",
        }
    }
}

impl fmt::Display for Spacing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Spacing {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "poisson" => Ok(Self::Poisson),
            "uniform" => Ok(Self::Uniform),
            other => Err(format!(
                "--spacing: `{other}` is neither `poisson` nor `uniform`"
            )),
        }
    }
}

/// The due offsets of an open-loop load, in order, without end.
#[derive(Clone, Debug)]
pub struct Schedule {
    rate: f64,
    spacing: Spacing,
    rng: u64,
    /// Slots handed out so far.
    k: u64,
    /// Poisson: the running sum of gaps, seconds.
    at: f64,
}

impl Schedule {
    /// `rate` sends per second (finite, > 0), spaced by `spacing`; `seed`
    /// fixes a Poisson schedule so runs can be repeated.
    pub fn new(rate: f64, spacing: Spacing, seed: u64) -> Result<Self, String> {
        if !rate.is_finite() || rate <= 0.0 {
            return Err(format!(
                "--rate: {rate} is not a positive number of requests per second"
            ));
        }
        Ok(Self {
            rate,
            spacing,
            rng: seed,
            k: 0,
            at: 0.0,
        })
    }

    /// splitmix64: well mixed, no state beyond a counter.
    fn next_u64(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl Iterator for Schedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let at = match self.spacing {
            // From the slot number, not a running sum: no drift over a run.
            Spacing::Uniform => self.k as f64 / self.rate,
            Spacing::Poisson => {
                let due = self.at;
                // Uniform in (0, 1]: the top 53 bits, plus one ulp so ln
                // never sees 0.
                let u = ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
                self.at += -u.ln() / self.rate;
                due
            }
        };
        self.k += 1;
        Some(Duration::from_secs_f64(at))
    }
}

/// Slots of `schedule` due in `[from, to)`.
pub fn slots_between(schedule: Schedule, from: Duration, to: Duration) -> u64 {
    schedule
        .take_while(|at| *at < to)
        .filter(|at| *at >= from)
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_slots_are_rate_times_duration() {
        for (rate, secs) in [
            (10_000.0, 5.0),
            (5_000.0, 3.0),
            (200.0, 1.0),
            (20_000.0, 0.5),
        ] {
            let s = Schedule::new(rate, Spacing::Uniform, 0).unwrap();
            let n = slots_between(
                s,
                Duration::from_secs(1),
                Duration::from_secs_f64(1.0 + secs),
            );
            let expect = rate * secs;
            assert!(
                (n as f64 - expect).abs() <= 1.0,
                "{rate}/s over {secs} s: {n}"
            );
        }
        // Equal gaps: slot k is due at k / rate.
        let s: Vec<_> = Schedule::new(1_000.0, Spacing::Uniform, 0)
            .unwrap()
            .take(4)
            .collect();
        assert_eq!(s[3], Duration::from_millis(3));
    }

    #[test]
    fn poisson_slots_match_the_rate_within_counting_noise() {
        // A Poisson count over rate x secs has that mean and its square
        // root as deviation: 5 deviations for any seed.
        for seed in [1, 2, 3, 42] {
            for (rate, secs) in [(10_000.0, 5.0), (5_000.0, 3.0), (200.0, 2.0)] {
                let s = Schedule::new(rate, Spacing::Poisson, seed).unwrap();
                let n = slots_between(
                    s,
                    Duration::from_secs(1),
                    Duration::from_secs_f64(1.0 + secs),
                );
                let mean = rate * secs;
                assert!(
                    (n as f64 - mean).abs() <= 5.0 * mean.sqrt(),
                    "seed {seed}, {rate}/s over {secs} s: {n}"
                );
            }
        }
    }

    #[test]
    fn poisson_gaps_are_exponential_not_equal() {
        // Of exponential gaps with mean m, 1 - 1/e (63 %) are shorter than
        // m and e^-3 (5 %) longer than 3 m; equal gaps give 0 % and 0 %.
        let rate = 10_000.0;
        let at: Vec<f64> = Schedule::new(rate, Spacing::Poisson, 7)
            .unwrap()
            .take(100_001)
            .map(|d| d.as_secs_f64())
            .collect();
        let gaps: Vec<f64> = at.windows(2).map(|w| w[1] - w[0]).collect();
        let short = gaps.iter().filter(|g| **g < 1.0 / rate).count() as f64 / gaps.len() as f64;
        let long = gaps.iter().filter(|g| **g > 3.0 / rate).count() as f64 / gaps.len() as f64;
        assert!((short - 0.632).abs() < 0.01, "{short}");
        assert!((long - 0.0498).abs() < 0.005, "{long}");
        // The same seed, the same schedule.
        let again: Vec<Duration> = Schedule::new(rate, Spacing::Poisson, 7)
            .unwrap()
            .take(5)
            .collect();
        let first: Vec<Duration> = at[..5]
            .iter()
            .map(|s| Duration::from_secs_f64(*s))
            .collect();
        assert_eq!(again, first);
    }

    #[test]
    fn bad_rates_and_spacings_name_the_flag() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let e = Schedule::new(rate, Spacing::Uniform, 0).unwrap_err();
            assert!(e.starts_with("--rate:"), "{e}");
        }
        assert_eq!("uniform".parse::<Spacing>(), Ok(Spacing::Uniform));
        let e = "bursty".parse::<Spacing>().unwrap_err();
        assert!(e.starts_with("--spacing:"), "{e}");
    }
}
