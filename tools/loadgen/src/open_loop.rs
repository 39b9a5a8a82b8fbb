//! The open loop: one OS thread keeps the schedule and hands each request
//! to the tokio runtime at its own instant.
//!
//! Tokio's timer has a 1 ms granularity: workers sleeping on it wake
//! together once a millisecond, so a 10,000/s load left in bursts of ten
//! and the client's burst was measured as latency. This thread sleeps
//! (timer slack lowered to 1 ns) to `--spin-us` before each due time and
//! spins the rest, so sends leave at their own instants. Latency counts
//! from the due time: a send that leaves late, or waits for one of the
//! `--concurrency` slots, is charged for it (no coordinated omission); how
//! late sends left is reported apart, so client and server can be told
//! apart.
//!
//! The measured window holds the sends due in it, whenever they leave: a
//! stalled machine makes them late (and charged), never absent. A window
//! in which no send is due at all (a rate too low for the duration, or a
//! Poisson gap) is stretched along the schedule to the first send due
//! after it, as the closed loop stretches its window to the first answer,
//! rather than the run failing with "a phase completed no requests". The
//! stretched window is that send's own gap: from halfway between the send
//! due before it and it, to halfway to the one after it (ending at the
//! send, or starting at the window's start, biased the rate by the gap's
//! share left out or let in: 1/s in a 0.2 s window read 1.25/s, then
//! 0.77/s); the rate is over it (the scheduled rate for a uniform
//! spacing), and a window stretched past twice the requested duration is
//! warned about.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ic_loadgen::schedule::{Schedule, Spacing};
use ic_loadgen::stalls::{self, CpuSteal, StallReport};
use ic_loadgen::{PhaseStats, Quantiles, summarize};
use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};
use serde::Serialize;
use tokio::io::unix::AsyncFd;
use tokio::sync::{Notify, Semaphore, oneshot};

/// Time for the thread to start before the first due send.
const LEAD: Duration = Duration::from_millis(20);

/// The open loop's settings.
#[derive(Clone, Copy, Debug)]
pub struct OpenLoop {
    /// Sends per second.
    pub rate: f64,
    /// How sends are spaced.
    pub spacing: Spacing,
    /// Fixes a Poisson schedule.
    pub seed: u64,
    /// Spin this long before each due time instead of sleeping.
    pub spin: Duration,
    /// Requests in flight at most; later sends wait (and are charged).
    pub concurrency: usize,
    /// Unmeasured time first.
    pub warmup: Duration,
    /// Measured time.
    pub duration: Duration,
}

/// How exactly the client kept the schedule in one phase.
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleStats {
    /// Sends due in the measured window (all of them complete: requests
    /// plus errors).
    pub scheduled: u64,
    /// Due time to the thread's hand-over: the scheduler's own accuracy.
    pub dispatch_lateness_us: Quantiles,
    /// Due time to the request starting on the runtime (hand-over, the
    /// runtime's wake-up, waiting for one of `--concurrency` slots): what
    /// of a latency is the client's, not the server's.
    pub send_lateness_us: Quantiles,
    /// Latency from the request's start instead of its due time (answered
    /// requests): the round trip with the client's lateness taken out.
    pub from_start_us: Quantiles,
    /// Share of the phase the thread spent spinning (a core's share).
    pub spin_fraction: f64,
    /// The measured window, seconds: the requested duration, or, when no
    /// send was due in it, the gap around the first send due after it
    /// (halfway from the send before to halfway to the send after).
    pub window_seconds: f64,
    /// Each CPU's steal time over the phase, warm-up included (from
    /// /proc/stat; absent where it cannot be read): the host running
    /// something else while a vCPU wanted to run. Costs nothing.
    pub steal: Option<Vec<CpuSteal>>,
    /// `--host-probe-us`: the moments in the window the CPUs were
    /// unavailable to the priority-90 probe, and the requests they touched.
    pub cpu_stalls: Option<StallReport>,
}

struct Sample {
    due: Instant,
    dispatched: Instant,
    started: Instant,
    done: Instant,
    /// `Some(hit)` on success.
    hit: Option<bool>,
}

/// The schedule's walk over one phase: each send's index and due time,
/// in order, until the measured window is over, and the window itself
/// (stretched along the schedule when no send was due in it).
struct Pacer {
    schedule: std::iter::Enumerate<Schedule>,
    start: Instant,
    measure_from: Instant,
    end: Instant,
    window_start: Instant,
    window_end: Instant,
    /// The last send due before the window.
    before: Option<Instant>,
    /// The last send due after `end` (the window stretched to it).
    stretched_to: Option<Instant>,
    /// Sends due in the window so far.
    measured: u64,
    /// Each CPU's steal count when the phase began.
    steal_from: Option<Vec<(usize, u64)>>,
}

/// Each CPU's steal count now, if /proc/stat can be read.
fn steal_now() -> Option<Vec<(usize, u64)>> {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .map(|text| stalls::steal_ticks(&text))
}

impl Pacer {
    fn new(open: &OpenLoop, start: Instant) -> anyhow::Result<Self> {
        let schedule =
            Schedule::new(open.rate, open.spacing, open.seed).map_err(anyhow::Error::msg)?;
        let measure_from = start + open.warmup;
        let end = measure_from + open.duration;
        Ok(Self {
            schedule: schedule.enumerate(),
            start,
            measure_from,
            end,
            window_start: measure_from,
            window_end: end,
            before: None,
            stretched_to: None,
            measured: 0,
            steal_from: steal_now(),
        })
    }

    /// The next send, or `None` when the phase is over. The window is
    /// `measure_from..end`, or, when no send was due in it, from halfway
    /// between the send due before it and the first due after it, on to
    /// halfway to the next: the gap around that one send (1/g for a
    /// uniform spacing g).
    fn next_send(&mut self) -> Option<(usize, Instant)> {
        let (k, offset) = self.schedule.next()?;
        let due = self.start + offset;
        if due >= self.end && self.measured > 0 {
            if let Some(last) = self.stretched_to {
                self.window_end = last + (due - last) / 2;
                if let Some(prev) = self.before {
                    self.window_start = prev + (last - prev) / 2;
                }
            }
            return None;
        }
        if due >= self.measure_from {
            self.measured += 1;
            if due >= self.end {
                self.stretched_to = Some(due);
            }
        } else {
            self.before = Some(due);
        }
        Some((k, due))
    }

    /// What the thread reports when the phase's sends are out.
    fn finish(&self, sent: u64, spun: Duration) -> Sent {
        Sent {
            sent,
            spun,
            start: self.start,
            measure_from: self.measure_from,
            window_start: self.window_start,
            window_end: self.window_end,
            steal_from: self.steal_from.clone(),
        }
    }
}

/// A phase's sends, handed out.
struct Sent {
    sent: u64,
    spun: Duration,
    start: Instant,
    measure_from: Instant,
    window_start: Instant,
    window_end: Instant,
    steal_from: Option<Vec<(usize, u64)>>,
}

/// Spreads prompts over the families as the closed loop does.
fn request_index(k: usize) -> u64 {
    (k as u64).wrapping_mul(1_000_003)
}

/// The measured window's stats, hits and schedule stats from the phase's
/// samples.
fn tally(samples: Vec<Sample>, sent: &Sent) -> (PhaseStats, u64, ScheduleStats) {
    let (mut latencies, mut dispatch, mut send) = (Vec::new(), Vec::new(), Vec::new());
    let (mut from_start, mut lives) = (Vec::new(), Vec::new());
    let (mut errors, mut hits) = (0, 0);
    for s in samples {
        if s.due < sent.measure_from {
            continue;
        }
        dispatch.push(s.dispatched.saturating_duration_since(s.due));
        send.push(s.started.saturating_duration_since(s.due));
        match s.hit {
            Some(hit) => {
                latencies.push(s.done.saturating_duration_since(s.due));
                from_start.push(s.done.saturating_duration_since(s.started));
                lives.push((s.due, s.done));
                hits += u64::from(hit);
            }
            None => errors += 1,
        }
    }
    let stats = ScheduleStats {
        scheduled: dispatch.len() as u64,
        dispatch_lateness_us: Quantiles::of(dispatch),
        send_lateness_us: Quantiles::of(send),
        from_start_us: Quantiles::of(from_start),
        spin_fraction: sent.spun.as_secs_f64() / (sent.window_end - sent.start).as_secs_f64(),
        window_seconds: sent
            .window_end
            .saturating_duration_since(sent.window_start)
            .as_secs_f64(),
        steal: sent
            .steal_from
            .as_ref()
            .zip(steal_now())
            .map(|(from, to)| stalls::steal_between(from, &to)),
        cpu_stalls: crate::host_probe::running().map(|probe| {
            stalls::attribute(
                &probe.take(),
                &lives,
                (sent.window_start, sent.window_end),
                (&probe.cpus, probe.period, probe.prioritized),
                (probe.over, stalls::SLOW),
            )
        }),
    };
    let measured = sent.window_end.saturating_duration_since(sent.window_start);
    (summarize(latencies, errors, measured), hits, stats)
}

/// Sends `call` on the schedule `open` describes over `channels` (round
/// robin: gRPC channels, or the floor's connection pool) from the
/// runtime's workers (`--open-loop-client channel`): the schedule thread
/// hands each request over at its due time; returns the measured window's
/// stats, hits and schedule stats.
pub async fn run<C, F, Fut, E>(
    channels: &[C],
    open: &OpenLoop,
    call: F,
) -> anyhow::Result<(PhaseStats, u64, ScheduleStats)>
where
    C: Clone + Send + 'static,
    F: Fn(C, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<bool, E>> + Send + 'static,
    E: Send + 'static,
{
    let call = Arc::new(call);
    let handle = tokio::runtime::Handle::current();
    let permits = Arc::new(Semaphore::new(open.concurrency));
    // Each request leaves its sample here and counts itself done: nothing
    // waits on them while the phase runs, so an answer wakes no other
    // thread (a channel woke the collecting task for every answer, a
    // context switch per request on the client's core).
    let samples = Arc::new(Mutex::new(Vec::<Sample>::with_capacity(slots(open))));
    let finished = Arc::new((AtomicU64::new(0), Notify::new()));
    let (sent_tx, sent_rx) = oneshot::channel::<Sent>();
    let mut pacer = Pacer::new(open, Instant::now() + LEAD)?;
    let channels = channels.to_vec();
    let spin = open.spin;
    let (to_samples, to_finished) = (samples.clone(), finished.clone());
    let thread = std::thread::Builder::new()
        .name("ic-loadgen-schedule".into())
        .spawn(move || {
            // Without it a sleep ends up to 50 µs late (the default
            // slack); the lateness figures show what remains.
            let _ = nix::sys::prctl::set_timerslack(1);
            let mut spun = Duration::ZERO;
            let mut sent = 0;
            while let Some((k, due)) = pacer.next_send() {
                spun += wait_until(due, spin);
                let dispatched = Instant::now();
                let channel = channels[k % channels.len()].clone();
                let (call, permits) = (call.clone(), permits.clone());
                let (samples, finished) = (to_samples.clone(), to_finished.clone());
                let i = request_index(k);
                sent += 1;
                handle.spawn(async move {
                    // The semaphore is never closed.
                    if let Ok(_permit) = permits.acquire_owned().await {
                        let started = Instant::now();
                        let result = call(channel, i).await;
                        let done = Instant::now();
                        let sample = Sample {
                            due,
                            dispatched,
                            started,
                            done,
                            hit: result.ok(),
                        };
                        samples
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(sample);
                    }
                    finished.0.fetch_add(1, Ordering::Release);
                    // Stores a permit when no one waits yet: no wake-up.
                    finished.1.notify_one();
                });
            }
            let _ = sent_tx.send(pacer.finish(sent, spun));
        })?;
    let sent = sent_rx
        .await
        .map_err(|_| anyhow::anyhow!("the schedule thread panicked"))?;
    let _ = thread.join();
    loop {
        let next = finished.1.notified();
        if finished.0.load(Ordering::Acquire) >= sent.sent {
            break;
        }
        next.await;
    }
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(tally(samples, &sent))
}

/// Samples a phase keeps room for ahead.
fn slots(open: &OpenLoop) -> usize {
    (open.rate * (LEAD + open.warmup + open.duration).as_secs_f64() * 1.1).min(f64::from(1 << 20))
        as usize
}

/// Sends `call` on the schedule `open` describes from the schedule thread
/// itself (`--open-loop-client direct`): the thread runs its own
/// one-thread runtime, `connect` opens the connections on it (round
/// robin over them), and at each due time the thread starts the request
/// there, so no other thread is woken to send it; between sends it waits
/// on a timer file descriptor beside the connections' sockets, so answers
/// are read as they arrive. Returns as [`run`] does.
pub async fn run_owned<C, M, MF, F, Fut, E>(
    open: &OpenLoop,
    connect: M,
    call: F,
) -> anyhow::Result<(PhaseStats, u64, ScheduleStats)>
where
    C: Clone + 'static,
    M: FnOnce() -> MF + Send + 'static,
    MF: Future<Output = anyhow::Result<Vec<C>>>,
    F: Fn(C, u64) -> Fut + Send + 'static,
    Fut: Future<Output = Result<bool, E>> + 'static,
{
    let open = *open;
    let (done_tx, done_rx) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("ic-loadgen-schedule".into())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("building the schedule thread's runtime")
                .and_then(|runtime| {
                    tokio::task::LocalSet::new()
                        .block_on(&runtime, owned_phase(open, connect, call))
                });
            let _ = done_tx.send(result);
        })?;
    let result = done_rx
        .await
        .map_err(|_| anyhow::anyhow!("the schedule thread panicked"))?;
    let _ = thread.join();
    result
}

async fn owned_phase<C, M, MF, F, Fut, E>(
    open: OpenLoop,
    connect: M,
    call: F,
) -> anyhow::Result<(PhaseStats, u64, ScheduleStats)>
where
    C: Clone + 'static,
    M: FnOnce() -> MF,
    MF: Future<Output = anyhow::Result<Vec<C>>>,
    F: Fn(C, u64) -> Fut,
    Fut: Future<Output = Result<bool, E>> + 'static,
{
    let _ = nix::sys::prctl::set_timerslack(1);
    let conns = connect().await?;
    if conns.is_empty() {
        anyhow::bail!("no connection to send on");
    }
    let alarm = Alarm::new().context("creating the schedule's timer")?;
    let permits = Arc::new(Semaphore::new(open.concurrency));
    let samples = Rc::new(RefCell::new(Vec::<Sample>::with_capacity(slots(&open))));
    let finished = Rc::new((Cell::new(0u64), Notify::new()));
    let mut pacer = Pacer::new(&open, Instant::now() + LEAD)?;
    let (mut spun, mut sent) = (Duration::ZERO, 0);
    while let Some((k, due)) = pacer.next_send() {
        spun += alarm.wait_until(due, open.spin).await?;
        let dispatched = Instant::now();
        let request = call(conns[k % conns.len()].clone(), request_index(k));
        let (permits, samples, finished) = (permits.clone(), samples.clone(), finished.clone());
        sent += 1;
        // Runs when this loop next waits: before the next send is due.
        tokio::task::spawn_local(async move {
            if let Ok(_permit) = permits.acquire_owned().await {
                let started = Instant::now();
                let result = request.await;
                let done = Instant::now();
                samples.borrow_mut().push(Sample {
                    due,
                    dispatched,
                    started,
                    done,
                    hit: result.ok(),
                });
            }
            finished.0.set(finished.0.get() + 1);
            finished.1.notify_one();
        });
    }
    let sent = pacer.finish(sent, spun);
    while finished.0.get() < sent.sent {
        finished.1.notified().await;
    }
    let samples = std::mem::take(&mut *samples.borrow_mut());
    Ok(tally(samples, &sent))
}

/// A one-shot timer the runtime waits on beside its sockets: exact to the
/// microsecond where tokio's timer rounds to the millisecond.
struct Alarm(AsyncFd<TimerFdRaw>);

/// `AsyncFd` needs `AsRawFd`, which nix's `TimerFd` lacks.
struct TimerFdRaw(TimerFd);

impl AsRawFd for TimerFdRaw {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl Alarm {
    fn new() -> std::io::Result<Self> {
        let fd = TimerFd::new(
            ClockId::CLOCK_MONOTONIC,
            TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC,
        )?;
        Ok(Self(AsyncFd::with_interest(
            TimerFdRaw(fd),
            tokio::io::Interest::READABLE,
        )?))
    }

    /// Waits (the runtime serving its other tasks) to `spin` before `due`,
    /// then spins to it; returns the time spun.
    async fn wait_until(&self, due: Instant, spin: Duration) -> std::io::Result<Duration> {
        let now = Instant::now();
        if due <= now || due - now <= spin {
            // The requests started since the last wait go out first.
            tokio::task::yield_now().await;
        }
        let now = Instant::now();
        if due <= now {
            return Ok(Duration::ZERO);
        }
        if due - now > spin {
            // Relative to CLOCK_MONOTONIC, the clock of `Instant`.
            let wait = TimeSpec::from_duration(due - now - spin);
            self.0
                .get_ref()
                .0
                .set(Expiration::OneShot(wait), TimerSetTimeFlags::empty())?;
            loop {
                let mut ready = self.0.readable().await?;
                // Non-blocking: `WouldBlock` until it fires, which clears
                // the readiness so the next wait sleeps.
                match ready.try_io(|fd| fd.get_ref().0.wait().map_err(std::io::Error::from)) {
                    Ok(result) => {
                        result?;
                        break;
                    }
                    Err(_would_block) => continue,
                }
            }
        }
        let spin_from = Instant::now();
        while Instant::now() < due {
            std::hint::spin_loop();
        }
        Ok(spin_from.elapsed())
    }
}

/// The warning for a phase whose window was stretched past twice the
/// requested `duration` (a rate too low for it), if it was: the run took
/// that much longer, and its figures rest on a few sends.
pub fn stretch_warning(phase: &str, duration: Duration, stats: &ScheduleStats) -> Option<String> {
    (stats.window_seconds > 2.0 * duration.as_secs_f64()).then(|| {
        format!(
            "warning: no send was due in the {phase} phase's {:.3} s window at this --rate: \
             it was stretched to {:.3} s along the schedule (sends measured: {}); raise \
             --duration-secs or --rate for a steadier figure",
            duration.as_secs_f64(),
            stats.window_seconds,
            stats.scheduled
        )
    })
}

/// Above this share of a core spent spinning, the run warns: on a machine
/// where client and server share the cores the spin takes CPU from the
/// server it measures.
pub const SPIN_WARN_FRACTION: f64 = 0.1;

/// The warning for a phase whose schedule thread spun more than
/// [`SPIN_WARN_FRACTION`] of a core, if it did.
pub fn spin_warning(phase: &str, spin_us: u64, stats: &ScheduleStats) -> Option<String> {
    (stats.spin_fraction > SPIN_WARN_FRACTION).then(|| {
        format!(
            "warning: --spin-us {spin_us}: the schedule thread spun {:.0}% of a core in the \
             {phase} phase (above {:.0}%), CPU the server it measures may need; \
             lower --spin-us (0 sleeps only) when client and server share the cores",
            stats.spin_fraction * 100.0,
            SPIN_WARN_FRACTION * 100.0
        )
    })
}

/// Sleeps to `spin` before `due`, then spins to it; returns the time spun.
fn wait_until(due: Instant, spin: Duration) -> Duration {
    let now = Instant::now();
    if due <= now {
        return Duration::ZERO;
    }
    if due - now > spin {
        std::thread::sleep(due - now - spin);
    }
    let spin_from = Instant::now();
    while Instant::now() < due {
        std::hint::spin_loop();
    }
    spin_from.elapsed()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The open loop with an answer that costs nothing (what is tested is
    /// the schedule and the window, not a server), sent from the runtime's
    /// workers ([`run`]) or from the schedule thread itself ([`run_owned`]).
    async fn answered_at_once(
        rate: f64,
        warmup: f64,
        duration: f64,
        owned: bool,
    ) -> (PhaseStats, ScheduleStats) {
        let open = OpenLoop {
            rate,
            spacing: Spacing::Uniform,
            seed: 1,
            spin: Duration::ZERO,
            concurrency: 4,
            warmup: Duration::from_secs_f64(warmup),
            duration: Duration::from_secs_f64(duration),
        };
        let answer = |(), _| async { Ok::<bool, ()>(true) };
        let (stats, hits, schedule) = if owned {
            run_owned(&open, || async { Ok(vec![()]) }, answer).await
        } else {
            run(&[()], &open, answer).await
        }
        .unwrap();
        assert_eq!(hits, stats.requests);
        (stats, schedule)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_window_no_send_is_due_in_is_stretched_to_the_next_send() {
        for owned in [false, true] {
            stretched(owned).await;
        }
    }

    async fn stretched(owned: bool) {
        // One send a second, due at 0 s (warm-up) and 1 s; the window is
        // 0.2-0.25 s. Before, it measured nothing and the run failed with
        // "a phase completed no requests".
        let (stats, schedule) = answered_at_once(1.0, 0.2, 0.05, owned).await;
        assert_eq!((stats.requests, stats.errors), (1, 0), "{stats:?}");
        assert_eq!(schedule.scheduled, 1);
        // The rate is over the stretched window, halfway from the send
        // before it to the send it holds and on halfway to the next:
        // 0.5-1.5 s (due times), the schedule's own 1/s. Ending at the
        // send reported 1.25/s; ending halfway to the next but starting at
        // 0.2 s reported 1/1.3 s.
        assert!((stats.qps - 1.0).abs() < 1e-9, "{stats:?}");
        assert!((schedule.window_seconds - 1.0).abs() < 1e-9, "{schedule:?}");
        // 1 s for 0.05 s asked: warned about.
        let warning = stretch_warning("LookupRoute", Duration::from_secs_f64(0.05), &schedule);
        assert!(
            warning
                .as_deref()
                .is_some_and(|w| w.contains("LookupRoute") && w.contains("1.000 s")),
            "{warning:?}"
        );
        // Stretched, but not past twice the duration asked: no warning.
        assert_eq!(
            stretch_warning("LookupRoute", Duration::from_secs_f64(0.5), &schedule),
            None
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_alarm_never_ends_a_wait_before_its_due_time() {
        let alarm = Alarm::new().unwrap();
        for spin_us in [0, 5, 50] {
            for wait_us in [1, 20, 80, 300, 1500] {
                let due = Instant::now() + Duration::from_micros(wait_us);
                alarm
                    .wait_until(due, Duration::from_micros(spin_us))
                    .await
                    .unwrap();
                assert!(Instant::now() >= due, "spin {spin_us}, wait {wait_us}");
            }
        }
        // Due already: no wait, no spin.
        let past = Instant::now();
        assert_eq!(
            alarm
                .wait_until(past, Duration::from_micros(50))
                .await
                .unwrap(),
            Duration::ZERO
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_window_with_sends_due_is_not_stretched() {
        for owned in [false, true] {
            not_stretched(owned).await;
        }
    }

    async fn not_stretched(owned: bool) {
        // 100/s: the sends due at 0.10-0.29 s (and perhaps the one on the
        // edge), over exactly the 0.2 s window.
        let (stats, schedule) = answered_at_once(100.0, 0.1, 0.2, owned).await;
        assert!((20..=21).contains(&schedule.scheduled), "{schedule:?}");
        assert_eq!(stats.requests, schedule.scheduled);
        assert!(
            (stats.qps - stats.requests as f64 / 0.2).abs() < 1e-9,
            "{stats:?}"
        );
        assert!((schedule.window_seconds - 0.2).abs() < 1e-9, "{schedule:?}");
        assert_eq!(
            stretch_warning("LookupRoute", Duration::from_secs_f64(0.2), &schedule),
            None
        );
    }
}
