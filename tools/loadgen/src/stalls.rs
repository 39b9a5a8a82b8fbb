//! CPU stalls beside a phase's latencies: the moments a probe thread,
//! pinned to a benchmark CPU at real-time priority 90 (SCHED_FIFO, above
//! the client's and the server's), woke later than it asked to. Such a
//! stall says the CPU was unavailable to a priority-90 thread: the host
//! (the vCPU not running), interrupts, or any process's kernel path,
//! ours included (the guest kernel here runs preempt=none, so a thread of
//! the server or the client in the kernel holds its CPU as rustc does).
//! Without its priority (`prioritized` false) the probe is also delayed
//! by any runnable thread. Pure: intervals in, a summary out.
//!
//! A request is "touched" by a stall when its life (due time to answer)
//! meets the stall, or the queue the stall leaves: the stall is taken to
//! begin up to one probe period before the probe noticed it (it may have
//! begun right after the probe's last wake-up) and to reach on after it
//! ended by its own length (the requests it held back drain at the rate
//! the server answers, which at the loads measured here is faster than
//! they arrived).

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::Quantiles;

/// One late wake-up of the probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stall {
    /// The probe's CPU.
    pub cpu: usize,
    /// When it should have woken.
    pub due: Instant,
    /// When it woke.
    pub woke: Instant,
}

impl Stall {
    /// How late the probe woke.
    pub fn late(&self) -> Duration {
        self.woke.saturating_duration_since(self.due)
    }

    /// The span whose requests the stall may have held back: from one
    /// probe `period` before `due` to the stall's own length after it.
    fn reach(&self, period: Duration) -> (Instant, Instant) {
        let from = self.due.checked_sub(period).unwrap_or(self.due);
        (from, self.woke + self.late())
    }
}

/// The stalls kept since the last phase's tally, at most `cap` of them;
/// those past the cap are counted, not kept.
#[derive(Debug)]
pub struct StallLog {
    kept: Vec<Stall>,
    cap: usize,
    dropped: u64,
}

/// What [`StallLog::take`] hands a phase's tally.
#[derive(Debug, Default)]
pub struct Taken {
    /// The stalls kept.
    pub stalls: Vec<Stall>,
    /// Stalls not kept, the log being full.
    pub dropped: u64,
}

impl StallLog {
    /// An empty log keeping at most `cap` stalls.
    pub fn new(cap: usize) -> Self {
        Self {
            kept: Vec::with_capacity(cap.min(4096)),
            cap,
            dropped: 0,
        }
    }

    /// Keeps `stall`, or counts it dropped when the log is full.
    pub fn push(&mut self, stall: Stall) {
        if self.kept.len() < self.cap {
            self.kept.push(stall);
        } else {
            self.dropped += 1;
        }
    }

    /// The stalls kept and the count dropped since the last take; the log
    /// starts again empty.
    pub fn take(&mut self) -> Taken {
        let fresh = Vec::with_capacity(self.cap.min(4096));
        Taken {
            stalls: std::mem::replace(&mut self.kept, fresh),
            dropped: std::mem::take(&mut self.dropped),
        }
    }
}

/// One CPU's steal time over a phase: time the host ran something else
/// while this vCPU wanted to run, as the guest kernel counts it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CpuSteal {
    /// The CPU (`cpuN` of /proc/stat).
    pub cpu: usize,
    /// Steal time, ms (10 ms ticks).
    pub ms: f64,
}

/// /proc/stat counts in USER_HZ, 100 a second on Linux.
const TICK_MS: f64 = 10.0;

/// Each CPU's steal count (ticks) from /proc/stat's text: the eighth
/// number of each `cpuN` line.
pub fn steal_ticks(proc_stat: &str) -> Vec<(usize, u64)> {
    proc_stat
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let cpu = fields.next()?.strip_prefix("cpu")?.parse().ok()?;
            let steal = fields.nth(7)?.parse().ok()?;
            Some((cpu, steal))
        })
        .collect()
}

/// The steal of each CPU between two readings of [`steal_ticks`].
pub fn steal_between(before: &[(usize, u64)], after: &[(usize, u64)]) -> Vec<CpuSteal> {
    after
        .iter()
        .filter_map(|&(cpu, to)| {
            let &(_, from) = before.iter().find(|(c, _)| *c == cpu)?;
            Some(CpuSteal {
                cpu,
                ms: to.saturating_sub(from) as f64 * TICK_MS,
            })
        })
        .collect()
}

/// A phase's stalls and the requests they touched.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StallReport {
    /// The probe's CPUs.
    pub cpus: Vec<usize>,
    /// Whether every probe thread got its real-time priority; false: its
    /// stalls include any other runnable thread's turn, ours too.
    pub prioritized: bool,
    /// How often each probe woke, µs.
    pub period_us: u64,
    /// A wake-up this late counts as a stall, µs.
    pub over_us: u64,
    /// A request this slow counts as slow, µs: the p99 target
    /// ([`SLOW`]), apart from `over_us` so that ignoring short stalls
    /// does not move it.
    pub slow_over_us: u64,
    /// Stalls that met the measured window (all CPUs).
    pub count: u64,
    /// Stalls not kept since the phase before (`--host-stall-cap` full):
    /// with any, `count` and the rest are short of them.
    pub dropped: u64,
    /// The longest, µs (0 with none).
    pub max_us: f64,
    /// Their sum, µs.
    pub total_us: f64,
    /// Moments every probed CPU was stalled at once (with two or more):
    /// consistent with a pause of the host, not proof of one (two guest
    /// processes in kernel paths, or a guest-wide IPI or stop_machine,
    /// can hold every CPU at once too).
    pub every_cpu: u64,
    /// Answered requests of the window slower than `slow_over_us`.
    pub slow: u64,
    /// Of them, those a stall touched.
    pub slow_touched: u64,
    /// Answered requests a stall touched, slow or not: the base rate to
    /// judge `slow_touched / slow` against (`touched / answered`).
    pub touched: u64,
    /// The latencies of the answered requests no stall touched: a lower
    /// bound, each stall being given its widest reach (a whole period
    /// before its due time, its full length after it ended); when
    /// `touched` is over 1 % of the answered, more than the p99's tail is
    /// left out.
    pub untouched_us: Quantiles,
}

impl StallReport {
    /// One line for the table.
    pub fn describe(&self) -> String {
        format!(
            "CPU unavailable to the priority-90 probe{} over {} µs: {} (max {:.0} µs, total {:.0} µs, {} on every CPU at once, {} not kept); requests over {} µs: {}, \
             {} of them touched by a stall; without the {} touched: p50 / p99 / p99.9 \
             {:.0} / {:.0} / {:.0} µs",
            if self.prioritized {
                ""
            } else {
                " (which lacked its priority: any thread delays it)"
            },
            self.over_us,
            self.count,
            self.max_us,
            self.total_us,
            self.every_cpu,
            self.dropped,
            self.slow_over_us,
            self.slow,
            self.slow_touched,
            self.touched,
            self.untouched_us.p50_us,
            self.untouched_us.p99_us,
            self.untouched_us.p999_us
        )
    }
}

/// A request slower than this is slow: the LookupRoute p99 target.
pub const SLOW: Duration = Duration::from_micros(500);

/// What `stalls` did to a phase whose measured window is `window` and
/// whose answered requests lived `requests` (due time, answer time);
/// stalls are wake-ups at least `over` late of probes that woke every
/// `period` on `cpus` (with their real-time priority when `prioritized`);
/// requests slower than `slow_over` are slow.
pub fn attribute(
    taken: &Taken,
    requests: &[(Instant, Instant)],
    window: (Instant, Instant),
    probe: (&[usize], Duration, bool),
    (over, slow_over): (Duration, Duration),
) -> StallReport {
    let (cpus, period, prioritized) = probe;
    let in_window: Vec<&Stall> = taken
        .stalls
        .iter()
        .filter(|s| s.late() >= over && s.woke >= window.0 && s.due <= window.1)
        .collect();
    let counted: Vec<(Duration, (Instant, Instant))> = in_window
        .iter()
        .map(|s| (s.late(), s.reach(period)))
        .collect();
    let (mut slow, mut slow_touched, mut touched) = (0, 0, 0);
    let mut untouched = Vec::with_capacity(requests.len());
    for &(due, done) in requests {
        let latency = done.saturating_duration_since(due);
        let hit = counted
            .iter()
            .any(|(_, (from, to))| due <= *to && done >= *from);
        let is_slow = latency > slow_over;
        slow += u64::from(is_slow);
        slow_touched += u64::from(is_slow && hit);
        touched += u64::from(hit);
        if !hit {
            untouched.push(latency);
        }
    }
    StallReport {
        cpus: cpus.to_vec(),
        prioritized,
        period_us: period.as_micros().try_into().unwrap_or(u64::MAX),
        over_us: over.as_micros().try_into().unwrap_or(u64::MAX),
        slow_over_us: slow_over.as_micros().try_into().unwrap_or(u64::MAX),
        count: counted.len() as u64,
        dropped: taken.dropped,
        max_us: counted
            .iter()
            .map(|(late, _)| crate::micros(*late))
            .fold(0.0, f64::max),
        total_us: counted.iter().map(|(late, _)| crate::micros(*late)).sum(),
        every_cpu: every_cpu(&in_window, cpus),
        slow,
        slow_touched,
        touched,
        untouched_us: Quantiles::of(untouched),
    }
}

/// The stalls of the first of `cpus` (two or more) that overlap, late
/// wake-up to late wake-up, a stall of each other CPU.
fn every_cpu(stalls: &[&Stall], cpus: &[usize]) -> u64 {
    let Some((first, others)) = cpus.split_first() else {
        return 0;
    };
    if others.is_empty() {
        return 0;
    }
    let meets = |a: &Stall, b: &Stall| a.due < b.woke && b.due < a.woke;
    stalls
        .iter()
        .filter(|s| s.cpu == *first)
        .filter(|s| {
            others
                .iter()
                .all(|c| stalls.iter().any(|t| t.cpu == *c && meets(s, t)))
        })
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn kept(stalls: &[Stall]) -> Taken {
        Taken {
            stalls: stalls.to_vec(),
            dropped: 0,
        }
    }

    #[test]
    fn the_log_keeps_up_to_its_cap_counts_the_rest_and_empties_when_taken() {
        let t0 = Instant::now();
        let stall = |n: u64| Stall {
            cpu: 0,
            due: t0 + us(n),
            woke: t0 + us(n + 600),
        };
        let mut log = StallLog::new(2);
        for n in 0..5 {
            log.push(stall(n * 1_000));
        }
        let taken = log.take();
        assert_eq!(taken.stalls, vec![stall(0), stall(1_000)]);
        assert_eq!(taken.dropped, 3);
        let report = attribute(
            &taken,
            &[],
            (t0, t0 + us(10_000)),
            (&[0], us(1_000), true),
            (us(500), SLOW),
        );
        assert_eq!((report.count, report.dropped), (2, 3), "{report:?}");
        // The next phase starts from nothing.
        log.push(stall(9_000));
        let taken = log.take();
        assert_eq!((taken.stalls, taken.dropped), (vec![stall(9_000)], 0));
    }

    #[test]
    fn requests_a_stall_or_its_queue_meets_are_touched_and_left_out() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + us(n);
        let period = us(250);
        // CPU 1 stalls 2 ms: the probe, due at 10,000 µs, wakes at 12,000.
        // It reaches from 9,750 (a period before) to 14,000 (its length
        // after). A 300 µs stall on CPU 0 is under the threshold.
        let stalls = [
            Stall {
                cpu: 1,
                due: at(10_000),
                woke: at(12_000),
            },
            Stall {
                cpu: 0,
                due: at(20_000),
                woke: at(20_300),
            },
        ];
        let requests = [
            (at(1_000), at(1_200)),   // 200 µs, well before
            (at(9_000), at(9_700)),   // 700 µs, slow, ends before the reach
            (at(9_600), at(9_900)),   // 300 µs, in flight when it may have begun
            (at(11_000), at(12_400)), // 1,400 µs, slow, due in the stall
            (at(13_900), at(14_600)), // 700 µs, slow, due in its queue
            (at(14_100), at(14_300)), // 200 µs, after the queue
            (at(20_000), at(20_450)), // 450 µs, beside the short stall
        ];
        let report = attribute(
            &kept(&stalls),
            &requests,
            (at(0), at(30_000)),
            (&[0, 1], period, true),
            (us(500), SLOW),
        );
        assert_eq!(report.count, 1);
        assert!((report.max_us - 2_000.0).abs() < 1e-6, "{report:?}");
        assert!((report.total_us - 2_000.0).abs() < 1e-6, "{report:?}");
        assert_eq!((report.period_us, report.over_us), (250, 500));
        assert_eq!(report.cpus, vec![0, 1]);
        // CPU 0's stall was too short to count: nothing on both at once.
        assert_eq!(report.every_cpu, 0);
        assert_eq!((report.slow, report.slow_touched), (3, 2), "{report:?}");
        assert_eq!(report.touched, 3, "{report:?}");
        // Left: 200, 700, 200, 450 µs.
        assert!((report.untouched_us.max_us - 700.0).abs() < 1e-6);
        assert!((report.untouched_us.p50_us - 200.0).abs() < 1e-6);
    }

    #[test]
    fn a_pause_of_every_cpu_at_once_is_told_apart() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + us(n);
        let stall = |cpu, due, woke| Stall {
            cpu,
            due: at(due),
            woke: at(woke),
        };
        let stalls = [
            // Both CPUs wake late at the same moment: one pause.
            stall(0, 1_000, 4_000),
            stall(1, 1_700, 4_000),
            // CPU 1 alone, then CPU 0 alone right after it.
            stall(1, 10_000, 11_000),
            stall(0, 11_000, 12_000),
        ];
        let window = (at(0), at(20_000));
        let report = attribute(
            &kept(&stalls),
            &[],
            window,
            (&[0, 1], us(1_000), true),
            (us(500), SLOW),
        );
        assert_eq!((report.count, report.every_cpu), (4, 1), "{report:?}");
        // One CPU probed: nothing to compare.
        let report = attribute(
            &kept(&stalls),
            &[],
            window,
            (&[0], us(1_000), true),
            (us(500), SLOW),
        );
        assert_eq!(report.every_cpu, 0, "{report:?}");
    }

    #[test]
    fn a_stalls_length_is_exact_to_the_nanosecond() {
        let t0 = Instant::now();
        // 500,042 ns: `as_secs_f64() * 1e6` gives 500.04200000000003.
        let stall = Stall {
            cpu: 0,
            due: t0 + us(1_000),
            woke: t0 + us(1_000) + Duration::from_nanos(500_042),
        };
        let report = attribute(
            &kept(&[stall]),
            &[],
            (t0, t0 + us(5_000)),
            (&[0], us(1_000), true),
            (us(500), SLOW),
        );
        assert_eq!((report.max_us, report.total_us), (500.042, 500.042));
    }

    #[test]
    fn ignoring_short_stalls_leaves_what_is_slow_alone() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + us(n);
        // A 1 ms stall, under a 2 ms stall threshold; a 700 µs request.
        let stall = Stall {
            cpu: 0,
            due: at(1_000),
            woke: at(2_000),
        };
        let requests = [(at(10_000), at(10_700)), (at(20_000), at(20_200))];
        let window = (at(0), at(30_000));
        let report = attribute(
            &kept(&[stall]),
            &requests,
            window,
            (&[0], us(1_000), true),
            (us(2_000), SLOW),
        );
        assert_eq!((report.count, report.over_us), (0, 2_000), "{report:?}");
        assert_eq!((report.slow, report.slow_over_us), (1, 500), "{report:?}");
    }

    #[test]
    fn steal_is_read_per_cpu_and_told_between_two_readings() {
        let before = "cpu  10 0 5 100 0 0 1 7 0 0\ncpu0 5 0 2 50 0 0 1 3 0 0\n\
                      cpu1 5 0 3 50 0 0 0 4 0 0\nintr 1 2 3\nctxt 99\n";
        let after = "cpu  10 0 5 100 0 0 1 9 0 0\ncpu0 5 0 2 50 0 0 1 3 0 0\n\
                     cpu1 5 0 3 50 0 0 0 6 0 0\nintr 1 2 3\n";
        assert_eq!(steal_ticks(before), vec![(0, 3), (1, 4)]);
        let steal = steal_between(&steal_ticks(before), &steal_ticks(after));
        assert_eq!(
            steal,
            vec![CpuSteal { cpu: 0, ms: 0.0 }, CpuSteal { cpu: 1, ms: 20.0 }]
        );
    }

    #[test]
    fn stalls_outside_the_window_are_not_counted() {
        let t0 = Instant::now();
        let at = |n: u64| t0 + us(n);
        let stalls = [
            // Ends before the window opens.
            Stall {
                cpu: 0,
                due: at(0),
                woke: at(900),
            },
            // Begins after it closes.
            Stall {
                cpu: 0,
                due: at(6_000),
                woke: at(7_000),
            },
            // Straddles its start.
            Stall {
                cpu: 0,
                due: at(800),
                woke: at(1_600),
            },
        ];
        let report = attribute(
            &kept(&stalls),
            &[(at(1_100), at(1_300))],
            (at(1_000), at(5_000)),
            (&[0], us(100), true),
            (us(500), SLOW),
        );
        assert_eq!(report.count, 1);
        assert!((report.max_us - 800.0).abs() < 1e-6, "{report:?}");
        assert_eq!((report.slow, report.touched), (0, 1));
        assert_eq!(report.untouched_us.max_us, 0.0);
    }
}
