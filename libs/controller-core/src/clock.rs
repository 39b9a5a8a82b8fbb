//! Time, injectable: the reconciler asks a [`Clock`] (the workspace's one
//! clock, `ic-clock`) for `now` once per reconcile and hands the instant to
//! the pure decisions, so every gate with a timeout is testable by moving a
//! [`ManualClock`] instead of sleeping.
//!
//! Instants are [`Timestamp`] (jiff, as re-exported by k8s-openapi, the
//! same type inside [`Time`]). Everything written into a status is truncated
//! to whole seconds, because that is all the API server keeps: a decision
//! fed its own status back after a round trip must compare equal.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
pub use k8s_openapi::jiff::Timestamp;

pub use ic_clock::{Clock, ManualClock, SystemClock};

/// The current instant of a [`Clock`] as a [`Timestamp`] (the workspace's
/// one clock, read the way statuses need it).
pub trait ClockExt {
    /// The current wall instant.
    fn now(&self) -> Timestamp;
}

impl<C: Clock + ?Sized> ClockExt for C {
    fn now(&self) -> Timestamp {
        let wall = self.wall();
        let nanos = i128::try_from(wall.as_nanos()).unwrap_or(i128::MAX);
        Timestamp::from_nanosecond(nanos).unwrap_or(Timestamp::MAX)
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
    use ic_clock::ManualClock;

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
