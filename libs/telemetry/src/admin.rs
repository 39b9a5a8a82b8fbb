//! The admin HTTP server: `/live`, `/ready`, `/metrics`, plus any routes a
//! service adds (the index server's `/snapshot`, the coordinator's REST API).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::MetricsRegistry;

/// Liveness and readiness of the process, shared between the service and its
/// admin server. Live means the process is running its event loop; ready means
/// it has finished start-up and can take traffic.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
    draining: AtomicBool,
}

impl Health {
    /// A new, not-yet-ready health handle.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Marks the service ready (or not). Once draining, it stays not
    /// ready whatever a readiness check later decides.
    pub fn set_ready(&self, ready: bool) {
        let ready = ready && !self.is_draining();
        self.ready.store(ready, Ordering::Release);
    }

    /// The process is stopping ([`crate::drain`]): not ready from now on.
    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Release);
        self.ready.store(false, Ordering::Release);
    }

    /// Whether a drain has begun.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Whether `/ready` currently answers 200.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct AdminState {
    health: Arc<Health>,
    metrics: MetricsRegistry,
}

/// Failure to start the admin server.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The listen address could not be bound.
    #[error("cannot bind admin server to {addr}: {source}")]
    Bind {
        /// The address that was requested.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The server stopped with an I/O error.
    #[error("admin server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// A bound (but not yet serving) admin server.
#[derive(Debug)]
pub struct AdminServer {
    listener: AdminListener,
    router: Router,
    metrics: MetricsRegistry,
    header_read_timeout: std::time::Duration,
    header_read_timeouts: prometheus_client::metrics::counter::Counter,
}

#[derive(Debug)]
enum AdminListener {
    Plain(TcpListener),
    /// TLS and/or idle limits ([`crate::serving`]).
    Serving(crate::serving::ServingListener),
}

/// Builds the admin router. Exposed so services can test routes with
/// `tower::ServiceExt::oneshot` without a socket.
pub fn router(health: Arc<Health>, metrics: MetricsRegistry) -> Router {
    Router::new()
        .route("/live", get(live))
        .route("/ready", get(ready))
        .route("/metrics", get(render_metrics))
        .with_state(AdminState { health, metrics })
}

impl AdminServer {
    /// Binds `addr` and prepares the standard routes merged with `extra`.
    ///
    /// Binding happens here, before serving, so a port conflict is reported at
    /// start-up and the actual address (for `:0`) is known to the caller.
    pub async fn bind(
        addr: SocketAddr,
        health: Arc<Health>,
        metrics: MetricsRegistry,
        extra: Router,
    ) -> Result<Self, AdminError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| AdminError::Bind { addr, source })?;
        Ok(Self {
            listener: AdminListener::Plain(listener),
            router: router(health, metrics.clone()).merge(extra),
            metrics,
            header_read_timeout: crate::serving::DEFAULT_HEADER_READ_TIMEOUT,
            header_read_timeouts: prometheus_client::metrics::counter::Counter::default(),
        })
    }

    /// Like [`AdminServer::bind`], serving with `options` (TLS, idle limit).
    pub async fn bind_with(
        addr: SocketAddr,
        options: crate::serving::ServeOptions,
        health: Arc<Health>,
        metrics: MetricsRegistry,
        extra: Router,
    ) -> Result<Self, AdminError> {
        let listener = crate::serving::ServingListener::bind(addr, options)
            .await
            .map_err(|source| AdminError::Bind { addr, source })?;
        Ok(Self {
            listener: AdminListener::Serving(listener),
            router: router(health, metrics.clone()).merge(extra),
            metrics,
            header_read_timeout: crate::serving::DEFAULT_HEADER_READ_TIMEOUT,
            header_read_timeouts: prometheus_client::metrics::counter::Counter::default(),
        })
    }

    /// Cuts connections whose request headers take longer than `timeout`
    /// (default [`crate::serving::DEFAULT_HEADER_READ_TIMEOUT`]), counting
    /// them in `counter`.
    #[must_use]
    pub fn with_header_read_timeout(
        mut self,
        timeout: std::time::Duration,
        counter: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        self.header_read_timeout = timeout;
        self.header_read_timeouts = counter;
        self
    }

    /// [`AdminServer::with_header_read_timeout`] with the counter registered
    /// in the server's own registry as `<component>_header_read_timeouts`.
    #[must_use]
    pub fn with_counted_header_read_timeout(
        self,
        flags: crate::serving::HeaderDeadlineFlags,
        component: &str,
    ) -> Self {
        let counter = prometheus_client::metrics::counter::Counter::default();
        self.metrics.register_with(|r| {
            r.sub_registry_with_prefix(component).register(
                "header_read_timeouts",
                "HTTP connections closed because a request's headers took longer than the header-read timeout",
                counter.clone(),
            );
        });
        self.with_header_read_timeout(flags.timeout(), counter)
    }

    /// The address actually bound (resolves a requested port 0).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match &self.listener {
            AdminListener::Plain(l) => l.local_addr(),
            AdminListener::Serving(l) => Ok(l.local_addr()),
        }
    }

    /// Serves until `shutdown` is cancelled, then finishes in-flight
    /// requests. With `--otlp-endpoint` set, the same metrics are also
    /// pushed over OTLP for as long.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), AdminError> {
        let addr = self.local_addr().map_err(AdminError::Serve)?;
        let metrics = self.metrics.clone();
        crate::otel::push::spawn(
            std::sync::Arc::new(move || metrics.encode()),
            shutdown.clone(),
        );
        tracing::info!(%addr, "admin server listening");
        crate::listening::listening("admin", addr);
        let (timeout, counter) = (self.header_read_timeout, self.header_read_timeouts);
        match self.listener {
            AdminListener::Plain(l) => {
                crate::serving::serve_http(l, self.router, timeout, counter, shutdown).await
            }
            AdminListener::Serving(l) => {
                crate::serving::serve_http(l, self.router, timeout, counter, shutdown).await
            }
        }
        .map_err(AdminError::Serve)
    }
}

async fn live() -> &'static str {
    "ok\n"
}

async fn ready(State(state): State<AdminState>) -> impl IntoResponse {
    if state.health.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn render_metrics(State(state): State<AdminState>) -> Response {
    // Collectors computed at scrape time may walk large structures (the
    // index server counts its index's memory, up to ~10 ms): on the blocking
    // pool, so that a scrape never holds up a runtime worker.
    match tokio::task::spawn_blocking(move || state.metrics.encode()).await {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "encoding metrics failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                "encoding metrics failed\n",
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use std::time::Duration;
    use tower::ServiceExt;

    async fn get_status(app: Router, path: &str) -> (StatusCode, String) {
        let response = app
            .oneshot(Request::get(path).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn ready_follows_health_flag() {
        let health = Health::new();
        let app = router(
            health.clone(),
            MetricsRegistry::new("inferencecache", "ic-test"),
        );
        assert_eq!(
            get_status(app.clone(), "/ready").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(get_status(app.clone(), "/live").await.0, StatusCode::OK);
        health.set_ready(true);
        assert_eq!(get_status(app.clone(), "/ready").await.0, StatusCode::OK);
        let (status, body) = get_status(app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("inferencecache_build_info"), "{body}");
    }

    /// A collector that holds its scrape until the test lets it go (or,
    /// were the scrape stuck on the runtime's only thread, until 10 s pass).
    #[derive(Debug)]
    struct HeldCollector {
        entered: std::sync::mpsc::Sender<()>,
        release: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
        timed_out: Arc<AtomicBool>,
    }

    impl prometheus_client::collector::Collector for HeldCollector {
        fn encode(
            &self,
            mut encoder: prometheus_client::encoding::DescriptorEncoder,
        ) -> Result<(), std::fmt::Error> {
            use prometheus_client::encoding::EncodeMetric;
            let _ = self.entered.send(());
            let released = self
                .release
                .lock()
                .map(|r| r.recv_timeout(Duration::from_secs(10)).is_ok())
                .unwrap_or(false);
            self.timed_out.store(!released, Ordering::SeqCst);
            let mut family = encoder.encode_descriptor(
                "held",
                "Held until released",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            prometheus_client::metrics::gauge::ConstGauge::new(1i64)
                .encode(family.encode_family(&[("part", "all")])?)
        }
    }

    // One runtime thread: a scrape encoded on it would leave nothing to
    // answer `/live` until the collector gave up.
    #[tokio::test(flavor = "current_thread")]
    async fn a_slow_scrape_does_not_hold_up_the_runtime() {
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (release, release_rx) = std::sync::mpsc::channel();
        let timed_out = Arc::new(AtomicBool::new(false));
        let metrics = MetricsRegistry::new("inferencecache", "ic-test");
        metrics.register_with(|r| {
            r.register_collector(Box::new(HeldCollector {
                entered: entered_tx,
                release: std::sync::Mutex::new(release_rx),
                timed_out: timed_out.clone(),
            }));
        });
        let app = router(Health::new(), metrics);
        let scrape = tokio::spawn(get_status(app.clone(), "/metrics"));
        // Wait (yielding to the runtime) until the collector is running.
        while entered.try_recv().is_err() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(get_status(app, "/live").await.0, StatusCode::OK);
        release.send(()).unwrap();
        let (status, body) = scrape.await.unwrap();
        assert!(
            !timed_out.load(Ordering::SeqCst),
            "/live waited for the scrape"
        );
        assert_eq!(status, StatusCode::OK);
        assert!(
            body.contains("inferencecache_held{part=\"all\"} 1"),
            "{body}"
        );
    }
}
