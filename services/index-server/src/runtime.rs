//! The server's tokio runtime (`--worker-threads`) and, on a one-thread
//! runtime, busy polling of its sockets (`--busy-poll-us`).
//!
//! At a steady rate of single requests (a gateway asking once per
//! incoming prompt, not 64 at a time) the runtime sleeps in `epoll_wait`
//! between requests, and every request pays for waking it: the kernel's
//! wake-up of the thread (on a VM an inter-processor interrupt through
//! the hypervisor) and the runtime's park and unpark. Busy polling keeps
//! the thread polling its sockets (`epoll_wait` with no timeout) for a
//! while after each request instead, so the next one that comes within
//! that time finds it awake. It costs a core's time while it polls, so it
//! is off by default and only for a server with a core of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The runtime's flags.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct RuntimeFlags {
    /// Threads running the server's tasks: 0 one per CPU the process may
    /// use (tokio's multi-thread runtime; TOKIO_WORKER_THREADS sets
    /// another count), 1 a current-thread runtime (every request on the
    /// main thread: no worker woken by another, no task stolen), N a
    /// multi-thread runtime of N workers. Tokenizing and large ingest
    /// batches run on the blocking pool either way.
    #[arg(long, env = "IC_WORKER_THREADS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub worker_threads: u16,

    /// With --worker-threads 1: after each read from a gRPC or endpoint
    /// picker connection, keep polling the sockets for this many
    /// microseconds before sleeping, so a request arriving meanwhile
    /// finds the thread awake (costs that thread's core while it polls;
    /// `index_busy_poll_seconds_total`). 0: never.
    #[arg(long, env = "IC_BUSY_POLL_US", default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub busy_poll_us: u64,
}

impl RuntimeFlags {
    /// Refuses settings that cannot work together, naming the flag.
    pub fn check(&self) -> Result<(), String> {
        if self.busy_poll_us > 0 && self.worker_threads != 1 {
            return Err(format!(
                "--busy-poll-us {} needs --worker-threads 1 (got {}): with several workers \
                 the one polling does not hold the sockets the others sleep on",
                self.busy_poll_us, self.worker_threads
            ));
        }
        Ok(())
    }

    /// The runtime the flags describe.
    pub fn build(&self) -> std::io::Result<tokio::runtime::Runtime> {
        let mut builder = match self.worker_threads {
            1 => tokio::runtime::Builder::new_current_thread(),
            n => {
                let mut b = tokio::runtime::Builder::new_multi_thread();
                if n > 1 {
                    b.worker_threads(usize::from(n));
                }
                b
            }
        };
        builder.enable_all().build()
    }

    /// The busy poller, when `--busy-poll-us` is set.
    pub fn busy_poll(&self, spun: Counter<f64, AtomicU64>) -> Option<Arc<BusyPoll>> {
        (self.busy_poll_us > 0).then(|| {
            Arc::new(BusyPoll {
                spin: Duration::from_micros(self.busy_poll_us),
                read: AtomicBool::new(false),
                wake: Notify::new(),
                spun,
            })
        })
    }
}

/// Keeps the runtime polling its sockets for a while after each read.
#[derive(Debug)]
pub struct BusyPoll {
    spin: Duration,
    read: AtomicBool,
    wake: Notify,
    spun: Counter<f64, AtomicU64>,
}

impl BusyPoll {
    /// A connection read bytes: poll on for `spin` from now.
    pub fn read(&self) {
        self.read.store(true, Ordering::Relaxed);
        self.wake.notify_one();
    }

    /// Runs until `shutdown`: asleep until a read, then yielding to the
    /// runtime — which polls its sockets without sleeping while a task
    /// has yielded — until `spin` has passed without one.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.wake.notified() => {}
            }
            let from = Instant::now();
            let mut until = from + self.spin;
            loop {
                tokio::task::yield_now().await;
                let now = Instant::now();
                if self.read.swap(false, Ordering::Relaxed) {
                    until = now + self.spin;
                }
                if now >= until {
                    // The reads seen while polling left a permit: taken
                    // here, or the next wait would end at once.
                    let _ = self.wake.notified().now_or_never();
                    if !self.read.swap(false, Ordering::Relaxed) {
                        self.spun.inc_by(now.duration_since(from).as_secs_f64());
                        break;
                    }
                    until = now + self.spin;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn flags(worker_threads: u16, busy_poll_us: u64) -> RuntimeFlags {
        RuntimeFlags {
            worker_threads,
            busy_poll_us,
        }
    }

    #[test]
    fn busy_polling_needs_the_one_thread_runtime() {
        for threads in [0, 2, 8] {
            let error = flags(threads, 200).check().unwrap_err();
            assert!(
                error.contains("--busy-poll-us 200") && error.contains("--worker-threads 1"),
                "{error}"
            );
        }
        for ok in [flags(1, 200), flags(0, 0), flags(1, 0), flags(4, 0)] {
            assert_eq!(ok.check(), Ok(()), "{ok:?}");
        }
        assert!(flags(1, 0).busy_poll(Counter::default()).is_none());
    }

    #[test]
    fn one_thread_is_a_current_thread_runtime_and_zero_one_per_cpu() {
        use tokio::runtime::RuntimeFlavor;
        let flavor = |n| flags(n, 0).build().unwrap().handle().runtime_flavor();
        assert_eq!(flavor(1), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(0), RuntimeFlavor::MultiThread);
        assert_eq!(flavor(3), RuntimeFlavor::MultiThread);
        let workers = flags(3, 0).build().unwrap().metrics().num_workers();
        assert_eq!(workers, 3);
    }

    #[test]
    fn a_read_keeps_the_thread_polling_for_the_spin_then_it_sleeps() {
        let runtime = flags(1, 5_000).build().unwrap();
        let spun = Counter::<f64, AtomicU64>::default();
        let poller = flags(1, 5_000).busy_poll(spun.clone()).unwrap();
        let shutdown = CancellationToken::new();
        runtime.block_on(async {
            tokio::spawn(poller.clone().run(shutdown.clone()));
            tokio::task::yield_now().await;
            // Asleep until a read.
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert_eq!(spun.get(), 0.0);
            poller.read();
            // The timer still fires while it polls: the runtime runs
            // other tasks between its yields.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let after_one = spun.get();
            assert!(after_one >= 0.005, "polled {after_one} s for a 5 ms spin");
            // Then asleep again: nothing more is spent.
            tokio::time::sleep(Duration::from_millis(30)).await;
            assert_eq!(spun.get(), after_one);
            shutdown.cancel();
        });
    }
}
