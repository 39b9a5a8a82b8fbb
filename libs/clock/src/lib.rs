//! Time, injectable. Services read the current time from a [`Clock`] and
//! pass instants into the pure libraries (which read no clock themselves),
//! so every timeout, staleness bound and deadline is testable by moving a
//! [`ManualClock`] instead of sleeping.
//!
//! Two times: *wall* time (since the Unix epoch; what records and statuses
//! carry) and *monotonic* time (since an arbitrary origin; what liveness
//! and deadlines are measured on, immune to clock steps).

use std::fmt::Debug;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of the current time.
pub trait Clock: Send + Sync + Debug {
    /// Wall time since the Unix epoch.
    fn wall(&self) -> Duration;
    /// Monotonic time since an arbitrary origin.
    fn monotonic(&self) -> Duration;
    /// Wall time in Unix milliseconds.
    fn unix_ms(&self) -> i64 {
        i64::try_from(self.wall().as_millis()).unwrap_or(i64::MAX)
    }
    /// Wall time in (fractional) Unix seconds.
    fn unix_seconds(&self) -> f64 {
        self.wall().as_secs_f64()
    }
}

/// Wall time since the Unix epoch, now (zero before 1970).
pub fn wall_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// Unix milliseconds, now: the one `now` of code that takes no clock.
pub fn unix_ms() -> i64 {
    i64::try_from(wall_now().as_millis()).unwrap_or(i64::MAX)
}

/// The real clocks.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn wall(&self) -> Duration {
        wall_now()
    }

    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that moves only when told to (tests, simulations). Both times
/// move together.
#[derive(Debug)]
pub struct ManualClock {
    times: Mutex<(Duration, Duration)>,
}

impl Default for ManualClock {
    /// Stopped at the real wall time of its creation.
    fn default() -> Self {
        Self::at(wall_now())
    }
}

impl ManualClock {
    /// Stopped at `wall` after the Unix epoch (monotonic zero).
    pub fn at(wall: Duration) -> Self {
        Self {
            times: Mutex::new((wall, Duration::ZERO)),
        }
    }

    /// Stopped at `seconds` after the Unix epoch.
    pub fn at_second(seconds: i64) -> Self {
        Self::at(Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
    }

    /// Moves both times forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut t = self.times.lock().unwrap_or_else(PoisonError::into_inner);
        t.0 = t.0.saturating_add(by);
        t.1 = t.1.saturating_add(by);
    }

    /// Sets the wall time (monotonic time is left alone: it never goes back).
    pub fn set_wall(&self, wall: Duration) {
        self.times.lock().unwrap_or_else(PoisonError::into_inner).0 = wall;
    }
}

impl Clock for ManualClock {
    fn wall(&self) -> Duration {
        self.times.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    fn monotonic(&self) -> Duration {
        self.times.lock().unwrap_or_else(PoisonError::into_inner).1
    }
}

/// Exponential backoff between attempts (reconnects, receive errors):
/// starts at `initial`, doubles up to `max`, back to `initial` after a
/// success. Every retry loop in the workspace uses this one.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Starts at `initial`, doubles up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            next: initial,
        }
    }

    /// Delay before the next attempt; each call doubles the following one.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        delay
    }

    /// Back to the initial delay after a success.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::at_second(1_000);
        assert_eq!(clock.unix_ms(), 1_000_000);
        assert_eq!(clock.monotonic(), Duration::ZERO);
        clock.advance(Duration::from_millis(1_500));
        assert_eq!(clock.unix_ms(), 1_001_500);
        assert_eq!(clock.monotonic(), Duration::from_millis(1_500));
        assert!((clock.unix_seconds() - 1_001.5).abs() < 1e-9);
        clock.set_wall(Duration::from_secs(5));
        assert_eq!(clock.unix_ms(), 5_000);
        assert_eq!(clock.monotonic(), Duration::from_millis(1_500));
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let got: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }

    #[test]
    fn system_clock_is_close_to_now() {
        let clock = SystemClock::default();
        assert!((clock.unix_ms() - unix_ms()).abs() < 5_000);
        assert!(clock.monotonic() < Duration::from_secs(5));
    }
}
