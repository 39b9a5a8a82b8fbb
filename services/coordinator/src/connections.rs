//! HTTP connections served on threads of their own, each running a
//! single-threaded runtime; one accept loop deals the connections to them
//! in turn.
//!
//! Why not the multi-threaded runtime: hyper's server task wakes itself
//! while it serves a request with a body (its body channel signals the
//! connection's own task), and tokio's work-stealing scheduler treats a
//! self-wake as a yield, which unparks an idle worker to steal it — a futex
//! wake and two context switches per `/directory/lookup` or `/events` on an
//! idle server, on the cores the clients share (`strace -f -e futex` on one
//! request; docs/coordinator.md). On a current-thread runtime the wake
//! stays a push onto the thread's own queue. Each connection lives on one
//! thread for its life; event batches still apply on the writer thread.
//!
//! A serving thread that stops while the coordinator serves (its runtime
//! failed or panicked) stops the whole process, with an error and a
//! non-zero exit: its share of new connections would otherwise go nowhere
//! while the process looks healthy.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use ic_telemetry::idle::IdleTimeout;
use prometheus_client::metrics::counter::Counter;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Thirty years: the idle deadline of `--timeout-keep-alive 0`.
const NEVER: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// How connections are served.
#[derive(Clone, Debug)]
pub struct ConnectionOptions {
    /// Serving threads (at least one).
    pub threads: usize,
    /// Close a connection with no traffic for this long (`None`: never).
    pub idle: Option<Duration>,
    /// Counts connections closed for idleness.
    pub idle_closed: Counter,
    /// Deadline for one request's headers.
    pub header_read_timeout: Duration,
    /// Counts connections cut for slow headers.
    pub header_read_timeouts: Counter,
}

/// The serving threads; [`ConnectionThreads::join`] waits for them after
/// `shutdown`.
#[derive(Debug)]
pub struct ConnectionThreads {
    threads: Vec<std::thread::JoinHandle<()>>,
    accept: tokio::task::JoinHandle<()>,
    /// Set when a serving thread or the accept loop stopped before
    /// `shutdown` (and cancelled it).
    failed: Arc<AtomicBool>,
}

/// A connection accepted by the loop, on its way to a serving thread.
type Handoff = (std::net::TcpStream, SocketAddr);

/// Starts `options.threads` serving threads over `router` and the accept
/// loop on `listener` (on the caller's runtime); everything stops at
/// `shutdown`, open connections finishing their requests first.
pub fn start(
    listener: TcpListener,
    router: axum::Router,
    options: ConnectionOptions,
    shutdown: CancellationToken,
) -> anyhow::Result<ConnectionThreads> {
    let local = listener.local_addr()?;
    let failed = Arc::new(AtomicBool::new(false));
    let mut senders = Vec::new();
    let mut threads = Vec::new();
    for i in 0..options.threads.max(1) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start a connection thread's runtime")?;
        let (tx, rx) = mpsc::unbounded_channel::<Handoff>();
        senders.push(tx);
        let (router, options, shutdown) = (router.clone(), options.clone(), shutdown.clone());
        let guard = StopOnExit {
            shutdown: shutdown.clone(),
            failed: failed.clone(),
            thread: i,
            armed: true,
        };
        let thread = std::thread::Builder::new()
            .name(format!("ic-http-{i}"))
            .spawn(move || {
                // Fires on a panic too (dropped while unwinding).
                let mut guard = guard;
                // Ends this thread's serving when the accept loop is gone
                // too (a runtime dropped without `shutdown`).
                let stop = shutdown.child_token();
                let incoming = Incoming {
                    rx,
                    local,
                    idle: options.idle.unwrap_or(NEVER),
                    idle_closed: options.idle_closed.clone(),
                    stop: stop.clone(),
                };
                let served = runtime.block_on(ic_telemetry::serving::serve_http(
                    incoming,
                    router,
                    options.header_read_timeout,
                    options.header_read_timeouts,
                    stop,
                ));
                match served {
                    // Stopped by `shutdown`, or by the accept loop gone.
                    Ok(()) => guard.armed = false,
                    Err(error) => tracing::error!(%error, thread = i, "connection thread failed"),
                }
            })
            .context("cannot start a connection thread")?;
        threads.push(thread);
    }
    let accept = tokio::spawn(accept_loop(listener, senders, shutdown, failed.clone()));
    Ok(ConnectionThreads {
        threads,
        accept,
        failed,
    })
}

/// Stops the coordinator when a serving thread ends other than by
/// `shutdown`.
struct StopOnExit {
    shutdown: CancellationToken,
    failed: Arc<AtomicBool>,
    thread: usize,
    armed: bool,
}

impl Drop for StopOnExit {
    fn drop(&mut self) {
        if self.armed && !self.shutdown.is_cancelled() {
            tracing::error!(
                thread = self.thread,
                panicked = std::thread::panicking(),
                "a connection thread stopped while serving; stopping the coordinator"
            );
            stop_failed(&self.shutdown, &self.failed);
        }
    }
}

fn stop_failed(shutdown: &CancellationToken, failed: &AtomicBool) {
    failed.store(true, Ordering::SeqCst);
    shutdown.cancel();
}

impl ConnectionThreads {
    /// Waits for the accept loop and every serving thread to end; an
    /// error when one of them stopped before `shutdown` (logged then).
    pub async fn join(self) -> anyhow::Result<()> {
        let _ = self.accept.await;
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
        if self.failed.load(Ordering::SeqCst) {
            anyhow::bail!("HTTP serving stopped: a connection thread stopped while serving");
        }
        Ok(())
    }
}

/// Accepts until `shutdown`, dealing connections to the threads in turn.
async fn accept_loop(
    listener: TcpListener,
    senders: Vec<mpsc::UnboundedSender<Handoff>>,
    shutdown: CancellationToken,
    failed: Arc<AtomicBool>,
) {
    let mut next = 0usize;
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, remote) = match accepted {
            Ok(pair) => pair,
            Err(error) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        // Registered again with the serving thread's own I/O driver there.
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(error) => {
                tracing::debug!(%error, %remote, "cannot hand over a connection");
                continue;
            }
        };
        next = (next + 1) % senders.len();
        if senders[next].send((stream, remote)).is_err() {
            // Threads end at shutdown; one gone before has already
            // stopped the coordinator (`StopOnExit`), unless it ended
            // without unwinding: stop it here then.
            if !shutdown.is_cancelled() {
                tracing::error!(
                    thread = next,
                    %remote,
                    "a connection thread is gone while serving; stopping the coordinator"
                );
                stop_failed(&shutdown, &failed);
            }
            return;
        }
    }
}

/// One serving thread's connections, as `serve_http` takes them.
struct Incoming {
    rx: mpsc::UnboundedReceiver<Handoff>,
    local: SocketAddr,
    idle: Duration,
    idle_closed: Counter,
    stop: CancellationToken,
}

impl axum::serve::Listener for Incoming {
    type Io = IdleTimeout<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Some((stream, remote)) = self.rx.recv().await else {
                self.stop.cancel();
                return std::future::pending().await;
            };
            match TcpStream::from_std(stream) {
                Ok(stream) => {
                    let io = IdleTimeout::new(stream, self.idle, Some(self.idle_closed.clone()));
                    return (io, remote);
                }
                Err(error) => tracing::debug!(%error, %remote, "cannot take a connection"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Serving threads for `--worker-threads`: the flag's value, or one per
/// core for 0.
pub fn threads_for(flag: u16) -> usize {
    match flag {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => usize::from(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connection dealt to a thread that is gone while serving stops
    /// the coordinator (the loop used to return silently, leaving the
    /// process up with no listener).
    #[tokio::test]
    async fn a_dead_thread_stops_the_coordinator() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel::<Handoff>();
        drop(rx);
        let (shutdown, failed) = (CancellationToken::new(), Arc::new(AtomicBool::new(false)));
        let accept = tokio::spawn(accept_loop(
            listener,
            vec![tx],
            shutdown.clone(),
            failed.clone(),
        ));
        let _client = TcpStream::connect(addr).await.unwrap();
        accept.await.unwrap();
        assert!(shutdown.is_cancelled(), "shutdown not cancelled");
        assert!(failed.load(Ordering::SeqCst), "failure not recorded");
    }

    /// At shutdown a thread gone is no failure.
    #[tokio::test]
    async fn a_thread_gone_at_shutdown_is_no_failure() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (tx, rx) = mpsc::unbounded_channel::<Handoff>();
        drop(rx);
        let (shutdown, failed) = (CancellationToken::new(), Arc::new(AtomicBool::new(false)));
        shutdown.cancel();
        accept_loop(listener, vec![tx], shutdown, failed.clone()).await;
        assert!(!failed.load(Ordering::SeqCst));
    }

    /// A serving thread that panics stops the coordinator at once, before
    /// any connection is dealt to it; one that ends by `shutdown` does not.
    #[test]
    fn a_panicking_thread_stops_the_coordinator() {
        let (shutdown, failed) = (CancellationToken::new(), Arc::new(AtomicBool::new(false)));
        let guard = StopOnExit {
            shutdown: shutdown.clone(),
            failed: failed.clone(),
            thread: 0,
            armed: true,
        };
        let thread = std::thread::spawn(move || {
            let _guard = guard;
            panic!("a serving runtime's panic");
        });
        assert!(thread.join().is_err());
        assert!(shutdown.is_cancelled(), "shutdown not cancelled");
        assert!(failed.load(Ordering::SeqCst), "failure not recorded");

        let (shutdown, failed) = (CancellationToken::new(), Arc::new(AtomicBool::new(false)));
        let mut guard = StopOnExit {
            shutdown: shutdown.clone(),
            failed: failed.clone(),
            thread: 0,
            armed: true,
        };
        guard.armed = false;
        drop(guard);
        assert!(!shutdown.is_cancelled() && !failed.load(Ordering::SeqCst));
    }

    /// `join` reports the failure, so the process exits non-zero.
    #[tokio::test]
    async fn join_reports_a_failure() {
        let failed = Arc::new(AtomicBool::new(true));
        let threads = ConnectionThreads {
            threads: Vec::new(),
            accept: tokio::spawn(async {}),
            failed,
        };
        let error = threads.join().await.unwrap_err();
        assert!(error.to_string().contains("connection thread"), "{error}");
    }
}
