//! Draining on SIGTERM: stop being ready, keep serving a while, then stop.
//!
//! Kubernetes removes a terminating pod from its Services' endpoints at
//! about the time it sends SIGTERM, but every client (kube-proxy, Envoy,
//! the API server calling a webhook) learns of the removal a little later.
//! A server that stops at once fails whatever those clients send in that
//! window. So a draining server first answers `/ready` with 503 (its
//! readiness probe fails, which also removes it from endpoints that did
//! not see the deletion), keeps serving new and in-flight requests for a
//! drain period, and only then closes its listeners.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::Health;

/// The drain period, as a flag every serving binary shares.
#[derive(Clone, Debug, clap::Args)]
pub struct DrainFlags {
    /// Seconds the server keeps serving after SIGTERM, not ready, before
    /// it stops (keep the pod's terminationGracePeriodSeconds above it).
    #[arg(long, env = "IC_DRAIN_SECONDS", default_value_t = 5)]
    pub drain_seconds: u64,
}

impl DrainFlags {
    /// The drain period.
    pub fn period(&self) -> Duration {
        Duration::from_secs(self.drain_seconds)
    }
}

/// Returns the token the servers stop on: cancelled `period` after
/// `signal` (SIGTERM), during which `health` reports not ready. A second
/// cancellation of `signal` changes nothing; with a zero period the
/// servers stop at once.
pub fn drain(
    signal: CancellationToken,
    health: Arc<Health>,
    period: Duration,
) -> CancellationToken {
    let stop = CancellationToken::new();
    let trigger = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = signal.cancelled() => {}
            // Stopped for another reason (a server failed): nothing to drain.
            () = trigger.cancelled() => return,
        }
        health.set_ready(false);
        health.set_draining();
        tracing::info!(
            drain_seconds = period.as_secs_f64(),
            "draining: not ready, still serving"
        );
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = trigger.cancelled() => {}
        }
        tracing::info!("drain over: stopping");
        trigger.cancel();
    });
    stop
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn not_ready_at_once_then_stops_after_the_period() {
        let signal = CancellationToken::new();
        let health = Health::new();
        health.set_ready(true);
        let stop = drain(signal.clone(), health.clone(), Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(health.is_ready(), "nothing happens before the signal");
        assert!(!stop.is_cancelled());
        signal.cancel();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!health.is_ready(), "not ready as soon as the drain starts");
        assert!(health.is_draining());
        assert!(!stop.is_cancelled(), "still serving during the drain");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(stop.is_cancelled(), "stopped once the period is over");
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_period_stops_at_once() {
        let signal = CancellationToken::new();
        let health = Health::new();
        let stop = drain(signal.clone(), health, Duration::ZERO);
        signal.cancel();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(stop.is_cancelled());
    }
}
