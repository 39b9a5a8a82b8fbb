//! `--host-probe-us`: a thread per benchmark CPU that only sleeps, at a
//! real-time priority above the client's and the server's, and keeps the
//! moments it woke late (see [`ic_loadgen::stalls`]). Each open-loop
//! phase reports them beside its latencies (`cpu_stalls`): moments the CPU
//! was unavailable to a priority-90 thread (the host, interrupts, or any
//! process's kernel path, ours included), apart from a queue in the server.
//!
//! The priority is set with `chrt` on the thread (the workspace forbids
//! the `unsafe` a direct `sched_setscheduler` needs); without the right
//! to (not root, no `chrt`), the probe runs at the process's own priority
//! and says so, on stderr and as `prioritized: false` in each phase.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ic_loadgen::stalls::{Stall, StallLog, Taken};
use nix::sched::{CpuSet, sched_setaffinity};
use nix::unistd::{Pid, gettid};

use crate::placement::Cpus;

/// The probe's real-time priority (SCHED_FIFO): above any priority a
/// benchmark here runs at (`chrt -r 10`), below the kernel's per-CPU
/// threads (99).
const PRIORITY: &str = "90";

/// The running probe.
#[derive(Debug)]
pub struct HostProbe {
    /// Its CPUs.
    pub cpus: Vec<usize>,
    /// How often each thread wakes.
    pub period: Duration,
    /// A wake-up this late is a stall.
    pub over: Duration,
    /// Whether every probe thread got its real-time priority.
    pub prioritized: bool,
    stalls: Arc<Mutex<StallLog>>,
}

static PROBE: OnceLock<HostProbe> = OnceLock::new();

/// The probe's CPUs: the client's and the server's when both are pinned,
/// or every CPU this process may run on when either is not (the unpinned
/// side may run on any of them).
pub fn cpus(client: Option<&Cpus>, server: Option<&Cpus>) -> Vec<usize> {
    let mut cpus: Vec<usize> = match (client, server) {
        (Some(client), Some(server)) => {
            client.list().iter().chain(server.list()).copied().collect()
        }
        _ => Vec::new(),
    };
    if cpus.is_empty() {
        cpus = nix::sched::sched_getaffinity(Pid::from_raw(0))
            .map(|set| {
                (0..CpuSet::count())
                    .filter(|c| set.is_set(*c).unwrap_or(false))
                    .collect()
            })
            .unwrap_or_default();
    }
    cpus.sort_unstable();
    cpus.dedup();
    cpus
}

/// Starts one probe thread per CPU of `cpus`, each waking every `period`;
/// wake-ups `over` late count as stalls. The threads run until the
/// process ends. Returns a warning when they could not be given their
/// real-time priority. Keeps at most `cap` stalls between two phases'
/// tallies, counting the rest. Once per process.
pub fn start(
    cpus: Vec<usize>,
    period: Duration,
    over: Duration,
    cap: usize,
) -> anyhow::Result<Option<String>> {
    let stalls = Arc::new(Mutex::new(StallLog::new(cap)));
    let mut unprioritized = Vec::new();
    for &cpu in &cpus {
        let stalls = stalls.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(format!("ic-loadgen-probe-{cpu}"))
            .spawn(move || {
                let setup = settle(cpu);
                let _ = ready_tx.send(setup);
                probe(cpu, period, over, &stalls);
            })?;
        let priority = ready_rx
            .recv()
            .context("a probe thread ended before it started")?
            .with_context(|| format!("pinning the host probe to CPU {cpu}"))?;
        if !priority {
            unprioritized.push(cpu.to_string());
        }
    }
    let probe = HostProbe {
        cpus,
        period,
        over,
        prioritized: unprioritized.is_empty(),
        stalls,
    };
    PROBE
        .set(probe)
        .map_err(|_| anyhow::anyhow!("the host probe was started twice"))?;
    Ok((!unprioritized.is_empty()).then(|| {
        format!(
            "warning: the host probe on CPU {} runs without its real-time priority \
             (`chrt -f -p {PRIORITY}` failed): its stalls then include every other \
             runnable thread's turn, ours too (`prioritized`: false)",
            unprioritized.join(",")
        )
    }))
}

/// The running probe, if one was started.
pub fn running() -> Option<&'static HostProbe> {
    PROBE.get()
}

impl HostProbe {
    /// The stalls kept since the last take, and how many were dropped;
    /// the next phase starts from none.
    pub fn take(&self) -> Taken {
        self.stalls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }
}

/// Pins the calling thread to `cpu`, lowers its timer slack, raises its
/// priority; whether the priority was raised.
fn settle(cpu: usize) -> nix::Result<bool> {
    let mut set = CpuSet::new();
    set.set(cpu)?;
    sched_setaffinity(Pid::from_raw(0), &set)?;
    // Without it a sleep ends up to 50 µs late (the default slack).
    let _ = nix::sys::prctl::set_timerslack(1);
    let raised = std::process::Command::new("chrt")
        .args(["-f", "-p", PRIORITY, &gettid().to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    Ok(raised)
}

/// Sleeps `period` at a time, keeping the wake-ups `over` late or later.
fn probe(cpu: usize, period: Duration, over: Duration, stalls: &Mutex<StallLog>) {
    loop {
        let due = Instant::now() + period;
        std::thread::sleep(period);
        let woke = Instant::now();
        if woke.saturating_duration_since(due) >= over {
            stalls
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Stall { cpu, due, woke });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn one_side_unpinned_probes_every_cpu_and_both_pinned_probe_theirs() {
        let every = cpus(None, None);
        assert!(!every.is_empty());
        let zero: Cpus = "0".parse().unwrap();
        let last: Cpus = every.last().unwrap().to_string().parse().unwrap();
        // The unpinned side may run anywhere: every CPU is probed.
        assert_eq!(cpus(Some(&zero), None), every);
        assert_eq!(cpus(None, Some(&last)), every);
        let mut both = vec![0, *every.last().unwrap()];
        both.dedup();
        assert_eq!(cpus(Some(&zero), Some(&last)), both);
    }
}
