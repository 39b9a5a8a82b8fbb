//! Time sources. Liveness uses a monotonic clock; records carry wall time.
//! Tests inject a [`ManualClock`] so timeouts need no sleeping.

use std::fmt::Debug;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// Where the coordinator reads time.
pub trait Clock: Send + Sync + Debug {
    /// Monotonic time since an arbitrary origin.
    fn monotonic(&self) -> Duration;
    /// Wall-clock epoch seconds.
    fn wall(&self) -> f64;
}

/// The real clocks.
#[derive(Debug)]
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
    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }

    fn wall(&self) -> f64 {
        wall_now()
    }
}

/// Wall-clock epoch seconds.
pub fn wall_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A clock that moves only when told to (tests).
#[derive(Debug, Default)]
pub struct ManualClock {
    now: Mutex<Duration>,
}

impl ManualClock {
    /// Moves monotonic time forward.
    pub fn advance(&self, by: Duration) {
        *self.now.lock() += by;
    }
}

impl Clock for ManualClock {
    fn monotonic(&self) -> Duration {
        *self.now.lock()
    }

    fn wall(&self) -> f64 {
        wall_now()
    }
}
