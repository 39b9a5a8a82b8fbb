//! The closed loop (no `--rate`): each of `--concurrency` tasks sends
//! again as soon as its answer returns.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ic_loadgen::{PhaseStats, summarize};
use tonic::transport::Channel;

/// Closed loop: runs `call` from `concurrency` tasks over `channels`
/// for warmup plus duration, each sending again as soon as its answer
/// returns; latencies are kept for the measured part only. `call` returns
/// whether the answer was a hit. A window in which no request started (a
/// stalled machine: every call in flight from before it until after it)
/// is stretched until one answer is measured, rather than ending the run
/// with "a phase completed no requests"; the rate is then over the
/// stretched window.
pub async fn closed_phase<F, Fut>(
    channels: &[Channel],
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    call: F,
) -> (PhaseStats, u64)
where
    F: Fn(Channel, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<bool, tonic::Status>> + Send,
{
    let call = Arc::new(call);
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + duration;
    let hits = Arc::new(AtomicU64::new(0));
    let answered = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for w in 0..concurrency {
        let channel = channels[w % channels.len()].clone();
        let call = call.clone();
        let hits = hits.clone();
        let answered = answered.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut last_start = None;
            let mut i = w as u64;
            loop {
                let t0 = Instant::now();
                if t0 >= end && answered.load(Ordering::Relaxed) > 0 {
                    break;
                }
                let result = call(channel.clone(), i).await;
                i += 1_000_003;
                if t0 < measure_from {
                    continue;
                }
                answered.fetch_add(1, Ordering::Relaxed);
                last_start = Some(t0);
                match result {
                    Ok(hit) => {
                        latencies.push(t0.elapsed());
                        hits.fetch_add(u64::from(hit), Ordering::Relaxed);
                    }
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors, last_start)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut window_end = end;
    for t in tasks {
        if let Ok((l, e, last)) = t.await {
            latencies.extend(l);
            errors += e;
            window_end = window_end.max(last.unwrap_or(end));
        }
    }
    let measured = window_end.saturating_duration_since(measure_from);
    (
        summarize(latencies, errors, measured),
        hits.load(Ordering::Relaxed),
    )
}
