//! A listening socket that hands out ready connections: TLS already
//! negotiated (when a certificate store is given) and every connection
//! wrapped in an [`IdleTimeout`].
//!
//! Handshakes run on their own tasks with a deadline, so a client that
//! opens a socket and never speaks holds neither the accept loop nor a
//! connection slot for longer than its handshake deadline
//! (`--tls-handshake-timeout-seconds`, [`HANDSHAKE_TIMEOUT`] by default).
//! The same listener
//! feeds axum (it is an [`axum::serve::Listener`]) and tonic
//! ([`ServingListener::into_stream`]).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::idle::IdleTimeout;
use crate::tls::{CertStore, TlsError};

/// How long a client may take to finish the TLS handshake, by default.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send one request's headers, unless a
/// server's flag says otherwise: one definition for every HTTP server, so
/// a client trickling a header byte now and then (which the idle timer
/// never sees as idle) is cut.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Thirty years: the idle deadline of a listener without one.
const NEVER: Duration = Duration::from_secs(30 * 365 * 24 * 3600);

/// Connections accepted but not yet taken by the server.
const BACKLOG: usize = 128;

/// How a listener serves its connections.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Serve TLS from this store (`None`: plaintext).
    pub tls: Option<Arc<CertStore>>,
    /// ALPN protocols offered under TLS (gRPC: `h2`).
    pub alpn: Vec<Vec<u8>>,
    /// Close connections with no traffic for this long (`None`: never).
    pub idle: Option<Duration>,
    /// Counts connections closed for idleness.
    pub idle_closed: Option<Counter>,
    /// Counts failed or timed-out TLS handshakes.
    pub handshake_failures: Option<Counter>,
    /// How long a TLS handshake may take.
    pub handshake_timeout: Duration,
}

impl ServeOptions {
    /// Plaintext, no idle limit.
    pub fn plain() -> Self {
        Self {
            tls: None,
            alpn: Vec::new(),
            idle: None,
            idle_closed: None,
            handshake_failures: None,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }
}

/// One accepted connection, plaintext or TLS, with its idle limit.
#[derive(Debug)]
pub enum ServedConn {
    /// Plain TCP.
    Plain(IdleTimeout<TcpStream>, SocketAddr, SocketAddr),
    /// TLS over TCP.
    Tls(
        Box<IdleTimeout<TlsStream<TcpStream>>>,
        SocketAddr,
        SocketAddr,
    ),
}

impl ServedConn {
    /// The client's address.
    pub fn remote_addr(&self) -> SocketAddr {
        match self {
            Self::Plain(_, _, remote) | Self::Tls(_, _, remote) => *remote,
        }
    }

    /// Our end's address.
    pub fn local_addr(&self) -> SocketAddr {
        match self {
            Self::Plain(_, local, _) | Self::Tls(_, local, _) => *local,
        }
    }
}

impl AsyncRead for ServedConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s, ..) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s, ..) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServedConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s, ..) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s, ..) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s, ..) => Pin::new(s).poll_flush(cx),
            Self::Tls(s, ..) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s, ..) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s, ..) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A bound listener handing out [`ServedConn`]s; accepting stops when it
/// is dropped.
#[derive(Debug)]
pub struct ServingListener {
    local: SocketAddr,
    ready: mpsc::Receiver<ServedConn>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl Drop for ServingListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

impl ServingListener {
    /// Binds `addr` and starts accepting (within a tokio runtime).
    pub async fn bind(addr: SocketAddr, options: ServeOptions) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Self::from_listener(listener, options)
    }

    /// Serves an already bound listener.
    pub fn from_listener(listener: TcpListener, options: ServeOptions) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let acceptor = match &options.tls {
            Some(store) => {
                let mut config = store.server_config().map_err(tls_io)?;
                config.alpn_protocols.clone_from(&options.alpn);
                Some(TlsAcceptor::from(Arc::new(config)))
            }
            None => None,
        };
        let (tx, ready) = mpsc::channel(BACKLOG);
        let accept_task = tokio::spawn(accept_loop(listener, acceptor, options, tx));
        Ok(Self {
            local,
            ready,
            accept_task,
        })
    }

    /// The address bound (resolves a requested port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The next ready connection; `None` once accepting has stopped.
    pub async fn next(&mut self) -> Option<ServedConn> {
        self.ready.recv().await
    }

    /// The connections as a stream (for tonic's `serve_with_incoming`).
    pub fn into_stream(self) -> impl futures::Stream<Item = io::Result<ServedConn>> {
        futures::stream::unfold(self, |mut listener| async move {
            listener.next().await.map(|conn| (Ok(conn), listener))
        })
    }
}

fn tls_io(error: TlsError) -> io::Error {
    io::Error::other(error)
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: Option<TlsAcceptor>,
    options: ServeOptions,
    ready: mpsc::Sender<ServedConn>,
) {
    loop {
        let (stream, remote) = match listener.accept().await {
            Ok(pair) => pair,
            Err(error) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(local) = stream.local_addr() else {
            continue;
        };
        // No limit: a deadline no connection reaches.
        let idle = options.idle.unwrap_or(NEVER);
        let idle_closed = options.idle_closed.clone();
        match &acceptor {
            None => {
                let conn =
                    ServedConn::Plain(IdleTimeout::new(stream, idle, idle_closed), local, remote);
                if ready.send(conn).await.is_err() {
                    return;
                }
            }
            Some(acceptor) => {
                let acceptor = acceptor.clone();
                let ready = ready.clone();
                let failures = options.handshake_failures.clone();
                let deadline = options.handshake_timeout;
                tokio::spawn(async move {
                    match tokio::time::timeout(deadline, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let tls = IdleTimeout::new(tls, idle, idle_closed);
                            let _ = ready
                                .send(ServedConn::Tls(Box::new(tls), local, remote))
                                .await;
                        }
                        Ok(Err(error)) => {
                            if let Some(f) = failures {
                                f.inc();
                            }
                            tracing::debug!(%error, %remote, "TLS handshake failed");
                        }
                        Err(_) => {
                            if let Some(f) = failures {
                                f.inc();
                            }
                            tracing::debug!(%remote, "TLS handshake timed out");
                        }
                    }
                });
            }
        }
    }
}

impl axum::serve::Listener for ServingListener {
    type Io = ServedConn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.next().await {
            Some(conn) => {
                let remote = conn.remote_addr();
                (conn, remote)
            }
            // The accept task only ends when the listener is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// Serves `router` over HTTP/1.1 on `listener` until `shutdown`, cutting a
/// connection whose request headers take longer than `header_read_timeout`
/// (counted in `timeouts`); open connections then finish their requests.
/// `axum::serve` has no such deadline, hence this loop.
pub async fn serve_http<L>(
    mut listener: L,
    router: axum::Router,
    header_read_timeout: Duration,
    timeouts: Counter,
    shutdown: tokio_util::sync::CancellationToken,
) -> io::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    // Every connection task holds a sender; all dropped = all finished.
    let (open, mut all_closed) = mpsc::channel::<()>(1);
    loop {
        let (io, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            conn = listener.accept() => conn,
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let connection = builder
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades();
        let (open, timeouts, shutdown) = (open.clone(), timeouts.clone(), shutdown.clone());
        // Reading a body wakes the connection's own task: polled again at
        // once rather than requeued with an idle worker woken (repoll.rs).
        tokio::spawn(crate::repoll::Repoll::new(async move {
            let _open = open;
            let mut connection = std::pin::pin!(connection);
            let result = tokio::select! {
                r = connection.as_mut() => r,
                () = shutdown.cancelled() => {
                    // Finish the request in flight, take no more.
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = result {
                if error.is_timeout() {
                    timeouts.inc();
                    tracing::debug!(?peer, "request headers too slow; connection closed");
                } else {
                    tracing::debug!(%error, ?peer, "connection ended with an error");
                }
            }
        }));
    }
    drop(listener);
    drop(open);
    // Bounded like a drain: a client holding a request open forever does
    // not hold the process.
    let _ = tokio::time::timeout(Duration::from_secs(30), all_closed.recv()).await;
    Ok(())
}

/// Flags of a server's TLS and connection limits, shared by the binaries
/// that serve data-plane ports.
#[derive(Clone, Debug, clap::Args)]
pub struct ServingFlags {
    /// PEM certificate chain to serve TLS with (with --tls-key-file); the
    /// files are re-read when they change. Plaintext when unset.
    #[arg(long, env = "IC_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<std::path::PathBuf>,

    /// PEM private key of --tls-cert-file.
    #[arg(long, env = "IC_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<std::path::PathBuf>,

    /// How often the certificate files are checked for a rotation, seconds.
    #[arg(long, env = "IC_TLS_RELOAD_INTERVAL_SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub tls_reload_interval_seconds: u64,

    /// Close a connection whose TLS handshake has not finished this many
    /// seconds after it was accepted (counted in
    /// `tls_handshake_failures_total`).
    #[arg(long, env = "IC_TLS_HANDSHAKE_TIMEOUT_SECONDS", default_value_t = HANDSHAKE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub tls_handshake_timeout_seconds: u64,

    /// Close a connection that moves no bytes either way for this long,
    /// seconds (clients reconnect on their next request); 0 never does.
    #[arg(
        long,
        env = "IC_CONNECTION_IDLE_TIMEOUT_SECONDS",
        default_value_t = 300
    )]
    pub connection_idle_timeout_seconds: u64,

    #[command(flatten)]
    pub header_deadline: HeaderDeadlineFlags,
}

/// The header-read deadline of an HTTP server, one flag for every binary.
#[derive(Clone, Copy, Debug, clap::Args)]
pub struct HeaderDeadlineFlags {
    /// Close an HTTP/1.1 connection whose request headers have not all
    /// arrived this many seconds after they began (a client trickling
    /// bytes); counted in `header_read_timeouts_total`.
    #[arg(long, env = "IC_HEADER_READ_TIMEOUT_SECONDS", default_value_t = DEFAULT_HEADER_READ_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub header_read_timeout_seconds: u64,
}

impl HeaderDeadlineFlags {
    /// `--header-read-timeout-seconds`.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.header_read_timeout_seconds)
    }
}

/// Counters of the serving listeners.
#[derive(Clone, Debug, Default)]
pub struct ServingMetrics {
    /// Connections closed after `--connection-idle-timeout-seconds`.
    pub idle_connections_closed: Counter,
    /// TLS handshakes that failed or timed out.
    pub tls_handshake_failures: Counter,
    /// HTTP connections cut because their request headers were too slow.
    pub header_read_timeouts: Counter,
    /// Serving-certificate reloads, by result.
    pub tls_reloads: prometheus_client::metrics::family::Family<ReloadResult, Counter>,
}

/// Label of [`ServingMetrics::tls_reloads`].
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct ReloadResult {
    /// `success` or `failure`.
    pub result: &'static str,
}

impl ServingMetrics {
    /// Registers the counters in `r` (the binary's own sub-registry).
    pub fn register(r: &mut prometheus_client::registry::Registry) -> Self {
        let metrics = Self::default();
        {
            r.register(
                "idle_connections_closed",
                "Connections closed after moving no bytes for the idle timeout",
                metrics.idle_connections_closed.clone(),
            );
            r.register(
                "tls_handshake_failures",
                "TLS handshakes that failed or did not finish in time",
                metrics.tls_handshake_failures.clone(),
            );
            r.register(
                "header_read_timeouts",
                "HTTP connections closed because a request's headers took longer than the header-read timeout",
                metrics.header_read_timeouts.clone(),
            );
            r.register(
                "tls_reloads",
                "Serving-certificate reloads after the files changed, by result",
                metrics.tls_reloads.clone(),
            );
        }
        metrics
    }

    /// Counts a reload.
    pub fn tls_reload(&self, ok: bool) {
        let result = if ok { "success" } else { "failure" };
        self.tls_reloads
            .get_or_create(&ReloadResult { result })
            .inc();
    }
}

/// A server's certificate store, loaded from the flags and watched for
/// rotation until `shutdown` (`None` when TLS is off).
pub fn certificates(
    flags: &ServingFlags,
    metrics: &ServingMetrics,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<Option<Arc<CertStore>>, TlsError> {
    let (Some(cert), Some(key)) = (&flags.tls_cert_file, &flags.tls_key_file) else {
        return Ok(None);
    };
    let store = Arc::new(CertStore::load(cert, key)?);
    let metrics = metrics.clone();
    tokio::spawn(store.clone().watch(
        Duration::from_secs(flags.tls_reload_interval_seconds),
        move |ok| metrics.tls_reload(ok),
        shutdown,
    ));
    Ok(Some(store))
}

impl ServingFlags {
    /// `--header-read-timeout-seconds`.
    pub fn header_read_timeout(&self) -> Duration {
        self.header_deadline.timeout()
    }

    /// Options for one listener: `store` for TLS, `alpn` offered under it.
    pub fn options(
        &self,
        store: Option<&Arc<CertStore>>,
        alpn: &[&[u8]],
        metrics: &ServingMetrics,
    ) -> ServeOptions {
        ServeOptions {
            tls: store.cloned(),
            alpn: alpn.iter().map(|p| p.to_vec()).collect(),
            idle: (self.connection_idle_timeout_seconds > 0)
                .then(|| Duration::from_secs(self.connection_idle_timeout_seconds)),
            idle_closed: Some(metrics.idle_connections_closed.clone()),
            handshake_failures: Some(metrics.tls_handshake_failures.clone()),
            handshake_timeout: Duration::from_secs(self.tls_handshake_timeout_seconds),
        }
    }
}
