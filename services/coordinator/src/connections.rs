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

use std::net::SocketAddr;
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
        let thread = std::thread::Builder::new()
            .name(format!("ic-http-{i}"))
            .spawn(move || {
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
                if let Err(error) = served {
                    tracing::error!(%error, thread = i, "connection thread failed");
                }
            })
            .context("cannot start a connection thread")?;
        threads.push(thread);
    }
    let accept = tokio::spawn(accept_loop(listener, senders, shutdown));
    Ok(ConnectionThreads { threads, accept })
}

impl ConnectionThreads {
    /// Waits for the accept loop and every serving thread to end.
    pub async fn join(self) {
        let _ = self.accept.await;
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

/// Accepts until `shutdown`, dealing connections to the threads in turn.
async fn accept_loop(
    listener: TcpListener,
    senders: Vec<mpsc::UnboundedSender<Handoff>>,
    shutdown: CancellationToken,
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
            // A thread is gone only when shutting down.
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
