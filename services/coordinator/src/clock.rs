//! Time sources: the workspace's one clock (`ic-clock`). Liveness uses
//! monotonic time; records carry wall time (as Unix seconds, as LMCache
//! does). Tests inject a [`ManualClock`] so timeouts need no sleeping.

pub use ic_clock::{Clock, ManualClock, SystemClock};

/// Wall-clock epoch seconds.
pub fn wall_now() -> f64 {
    ic_clock::wall_now().as_secs_f64()
}
