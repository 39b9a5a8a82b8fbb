//! Time, injectable: the reconciler asks a [`Clock`] for `now` once per
//! reconcile and hands the instant to the pure decisions, so every gate with
//! a timeout is testable by moving a [`ManualClock`] instead of sleeping.
//!
//! Instants are [`Timestamp`] (jiff, as re-exported by k8s-openapi, the
//! same type inside [`Time`]). Everything written into a status is truncated
//! to whole seconds, because that is all the API server keeps: a decision
//! fed its own status back after a round trip must compare equal.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
pub use k8s_openapi::jiff::Timestamp;

/// A source of the current instant.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// The current instant.
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that only moves when told to (tests, simulations).
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<Timestamp>,
}

impl ManualClock {
    /// A clock stopped at `at`.
    pub fn new(at: Timestamp) -> Self {
        Self {
            now: Mutex::new(at),
        }
    }

    /// A clock stopped at `seconds` after the Unix epoch.
    pub fn at_second(seconds: i64) -> Self {
        Self::new(Timestamp::from_second(seconds).unwrap_or(Timestamp::UNIX_EPOCH))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut now = self.now.lock().unwrap_or_else(PoisonError::into_inner);
        *now = add(*now, by);
    }

    /// Sets the clock to `at`.
    pub fn set(&self, at: Timestamp) {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner) = at;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.now.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `at + by`, saturating at the largest representable instant.
pub fn add(at: Timestamp, by: Duration) -> Timestamp {
    at.checked_add(by).unwrap_or(Timestamp::MAX)
}

/// `later - earlier`, zero when `later` is not after `earlier`.
pub fn since(later: Timestamp, earlier: Timestamp) -> Duration {
    Duration::try_from(later.duration_since(earlier)).unwrap_or(Duration::ZERO)
}

/// `at` as a status [`Time`], truncated to whole seconds.
pub fn to_time(at: Timestamp) -> Time {
    Time(truncate(at))
}

/// `at` truncated to whole seconds.
pub fn truncate(at: Timestamp) -> Timestamp {
    Timestamp::from_second(at.as_second()).unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::at_second(1_000);
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        clock.advance(Duration::from_secs(5));
        assert_eq!(since(clock.now(), t0), Duration::from_secs(5));
        assert_eq!(since(t0, clock.now()), Duration::ZERO);
    }

    #[test]
    fn status_times_are_whole_seconds() {
        let at = add(Timestamp::UNIX_EPOCH, Duration::from_millis(1_500));
        assert_eq!(to_time(at).0.as_second(), 1);
        assert_eq!(to_time(at).0.subsec_nanosecond(), 0);
    }
}
