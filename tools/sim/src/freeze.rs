//! Freezing a process with SIGSTOP, and thawing it with SIGCONT, for tests
//! that need a peer whose connections stay open and silent: one
//! definition, used by [`crate::ServiceProcess::freeze`] and
//! [`crate::tansu::Broker::freeze`].
//!
//! `kill(SIGSTOP)` returns once the signal is queued, before every thread
//! has stopped: the kernel wakes one thread to start the group stop, and
//! the others run on until they are scheduled and see it (on a loaded
//! machine, 49 of 200 stops of tansu had a thread still running, for up to
//! 30 ms). So [`freeze`] waits until `/proc/PID/task/*/stat` shows every
//! thread stopped, and [`thaw`] until none is.

use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How long every thread may take to stop, or to run again.
pub const SIGNAL_DEADLINE: Duration = Duration::from_secs(60);

/// SIGSTOP to process `pid` (`what` names it in panics), then waits until
/// every one of its threads is stopped.
///
/// # Panics
/// When the signal cannot be sent, the process has exited, or a thread
/// still runs after [`SIGNAL_DEADLINE`].
pub fn freeze(pid: u32, what: &str) {
    signal(pid, Signal::SIGSTOP, what);
    wait_threads(pid, what, "stopped", all_stopped);
}

/// SIGCONT to process `pid`, then waits until none of its threads is
/// stopped.
///
/// # Panics
/// When the signal cannot be sent, the process has exited, or a thread
/// is still stopped after [`SIGNAL_DEADLINE`].
pub fn thaw(pid: u32, what: &str) {
    signal(pid, Signal::SIGCONT, what);
    wait_threads(pid, what, "running", none_stopped);
}

fn signal(pid: u32, signal: Signal, what: &str) {
    let raw = i32::try_from(pid).expect("a pid fits in i32");
    kill(Pid::from_raw(raw), signal).unwrap_or_else(|e| panic!("{signal} to {what}: {e}"));
}

fn wait_threads(pid: u32, what: &str, state: &str, done: impl Fn(&[char]) -> bool) {
    let deadline = Instant::now() + SIGNAL_DEADLINE;
    loop {
        let states = thread_states(pid);
        // A process that exited (a zombie until reaped) never gets there.
        assert!(
            !states.is_empty() && !states.iter().all(|s| gone(*s)),
            "{what} (pid {pid}) has exited: its threads cannot be {state}"
        );
        if done(&states) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the threads of {what} (pid {pid}) were not all {state} within {SIGNAL_DEADLINE:?}: {states:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every thread is stopped, a thread that has exited counting as one: it
/// never stops (a process whose leader thread has exited while the others
/// run keeps the leader as a zombie until the last one exits), so waiting
/// for it would wait out [`SIGNAL_DEADLINE`].
fn all_stopped(states: &[char]) -> bool {
    states.iter().all(|s| stopped(*s) || gone(*s))
}

/// No thread is stopped (one that has exited is not: it counts as done).
fn none_stopped(states: &[char]) -> bool {
    !states.iter().any(|s| stopped(*s))
}

/// Stopped by a signal (`T`) or in a tracing stop (`t`).
fn stopped(state: char) -> bool {
    matches!(state, 'T' | 't')
}

/// A zombie (`Z`) or dead (`X`) thread.
fn gone(state: char) -> bool {
    matches!(state, 'Z' | 'X')
}

/// The scheduler state of every thread of process `pid`
/// (`/proc/PID/task/*/stat`, the field after the command name); empty when
/// the process is gone.
fn thread_states(pid: u32) -> Vec<char> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
        .filter_map(|stat| {
            // The command name is in parentheses and may hold anything.
            let (_, after) = stat.rsplit_once(')')?;
            after.trim_start().chars().next()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A child process, thawed, killed and reaped when this drops unless
    /// it has exited: a failed assertion while it is frozen would otherwise
    /// leave it stopped for good.
    struct KillOnDrop(std::process::Child);

    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            // Waited for already, or exited and reaped now: nothing to
            // stop, and its pid may be another process's.
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            if let Ok(raw) = i32::try_from(self.0.id()) {
                let _ = kill(Pid::from_raw(raw), Signal::SIGCONT);
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Set in the environment of [`spinning_child`]'s process.
    const CHILD: &str = "IC_SIM_FREEZE_TEST_CHILD";
    const SPINNERS: usize = 4;

    /// Not a test: the process the test below freezes, this test binary
    /// run again with [`CHILD`] set. Its threads spin (more of them than
    /// the machine's cores, so some wait to run when the stop comes) until
    /// the parent closes its stdin.
    #[test]
    #[ignore = "the child process of freeze_returns_only_once_every_thread_is_stopped"]
    fn spinning_child() {
        if std::env::var_os(CHILD).is_none() {
            return;
        }
        for _ in 0..SPINNERS {
            std::thread::spawn(|| {
                loop {
                    std::hint::spin_loop();
                }
            });
        }
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    }

    /// When `freeze` returns every thread of the process is stopped, and
    /// when `thaw` returns none is, in each of 100 rounds. (`kill` alone
    /// returns with threads still running: this fails without the wait.)
    #[test]
    fn freeze_returns_only_once_every_thread_is_stopped() {
        let mut child = KillOnDrop(
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "freeze::tests::spinning_child", "--ignored"])
                .env(CHILD, "1")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap(),
        );
        let pid = child.0.id();
        // The harness's thread, the test's and the spinners.
        let deadline = Instant::now() + SIGNAL_DEADLINE;
        while thread_states(pid).len() < SPINNERS + 1 {
            assert!(
                Instant::now() < deadline,
                "the child never started its threads"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        for round in 0..100 {
            freeze(pid, "the spinning child");
            let states = thread_states(pid);
            assert!(
                states.iter().all(|s| stopped(*s)),
                "round {round}: frozen, yet {states:?}"
            );
            thaw(pid, "the spinning child");
            let states = thread_states(pid);
            assert!(
                !states.iter().any(|s| stopped(*s)),
                "round {round}: thawed, yet {states:?}"
            );
        }
        drop(child.0.stdin.take());
        assert!(child.0.wait().unwrap().success());
    }

    /// A thread that has exited (`Z`, `X`) among live ones is done for both
    /// waits: a zombie leader never stops, and freeze waited out the
    /// deadline for it. A running or sleeping thread is not stopped.
    #[test]
    fn an_exited_thread_among_live_ones_is_done() {
        assert!(all_stopped(&['Z', 'T', 'T']));
        assert!(all_stopped(&['X', 't']));
        assert!(!all_stopped(&['Z', 'T', 'R']));
        assert!(!all_stopped(&['Z', 'S']));
        assert!(none_stopped(&['Z', 'R', 'S']));
        assert!(!none_stopped(&['Z', 'R', 'T']));
    }

    /// A process that has exited is named as such (at once, not as a
    /// thread that did not stop within the deadline).
    #[test]
    fn freezing_an_exited_process_says_so() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        // Exited, not yet reaped: a zombie.
        while thread_states(pid).iter().any(|s| !gone(*s)) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let panic = std::panic::catch_unwind(|| freeze(pid, "true")).unwrap_err();
        let message = panic.downcast_ref::<String>().unwrap();
        assert!(message.contains("has exited"), "{message}");
        child.wait().unwrap();
    }
}
