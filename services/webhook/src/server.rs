//! The HTTPS admission server: routes, body limits, timeouts, and the TLS
//! accept loop (HTTP/1.1 and HTTP/2 by ALPN).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument as _;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use ic_adapters::admission::InjectionConfig;
use ic_adapters::providers::images::ProviderImageDefaults;
use ic_telemetry::serving::{ServeOptions, ServingListener};
use tokio_util::sync::CancellationToken;

use crate::cachebackend::{self, Decision};
use crate::metrics::{AdmissionKind, Metrics};
use crate::pod::{self, BackendSource};
use crate::review::{AdmissionReview, ReviewError};
use crate::tls::CertStore;

/// Everything a request handler needs.
#[derive(Debug)]
pub struct AppState {
    /// Metrics.
    pub metrics: Metrics,
    /// Where pod admission lists CacheBackends.
    pub backends: Arc<dyn BackendSource>,
    /// Injection settings.
    pub injection: InjectionConfig,
    /// Registry and pull secrets filled into Managed backends' providers.
    pub provider_images: ProviderImageDefaults,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// Deadline for reading and answering one request.
    pub request_timeout: Duration,
}

/// A request refused before it became an admission decision.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The body is larger than the limit.
    #[error("request body exceeds {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The body could not be read (client went away, truncated body).
    #[error("cannot read the request body: {0}")]
    BodyRead(String),
    /// The body is not a v1 AdmissionReview with a request.
    #[error(transparent)]
    Review(#[from] ReviewError),
    /// The request took longer than the deadline.
    #[error("request not answered within {0:?}")]
    Timeout(Duration),
    /// The response could not be encoded.
    #[error("cannot encode the response: {0}")]
    Encode(String),
}

impl RequestError {
    fn label(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "too_large",
            Self::BodyRead(_) => "body_read",
            Self::Review(e) => e.label(),
            Self::Timeout(_) => "timeout",
            Self::Encode(_) => "encode",
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            Self::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyRead(_) | Self::Review(_) => StatusCode::BAD_REQUEST,
            Self::Timeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Encode(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for RequestError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.to_string() }).to_string();
        (
            self.status(),
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

/// The admission routes.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/mutate-cachebackend", post(mutate_cachebackend))
        .route("/validate-cachebackend", post(validate_cachebackend))
        .route("/mutate-pod", post(mutate_pod))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(state)
}

async fn mutate_cachebackend(State(state): State<Arc<AppState>>, request: Request) -> Response {
    admit(state, AdmissionKind::CacheBackendDefault, request).await
}

async fn validate_cachebackend(State(state): State<Arc<AppState>>, request: Request) -> Response {
    admit(state, AdmissionKind::CacheBackendValidate, request).await
}

async fn mutate_pod(State(state): State<Arc<AppState>>, request: Request) -> Response {
    admit(state, AdmissionKind::Pod, request).await
}

/// Reads, decides, answers, and records the metrics, within the deadline.
async fn admit(state: Arc<AppState>, kind: AdmissionKind, request: Request) -> Response {
    let started = Instant::now();
    // The API server sends its trace context to webhooks when its tracing
    // is on (APIServerTracing): the review joins the write's trace.
    let span = tracing::debug_span!(
        "admission",
        otel.kind = "server",
        kind = kind.label(),
        result = tracing::field::Empty,
        reason = tracing::field::Empty,
    );
    ic_telemetry::otel::adopt(
        &span,
        ic_telemetry::otel::parent_from_headers(request.headers()),
    );
    let outcome = match tokio::time::timeout(
        state.request_timeout,
        decide(&state, kind, request.into_body()).instrument(span.clone()),
    )
    .await
    {
        Ok(outcome) => outcome,
        Err(_) => Err(RequestError::Timeout(state.request_timeout)),
    };
    let response = outcome.and_then(|decision| {
        span.record("result", decision.result);
        span.record("reason", decision.reason);
        state
            .metrics
            .admission(kind, decision.result, decision.reason);
        serde_json::to_vec(&decision.response.into_review())
            .map_err(|e| RequestError::Encode(e.to_string()))
    });
    state.metrics.observe(kind, started.elapsed());
    match response {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(error) => {
            span.record("result", "error");
            span.record("reason", error.label());
            state.metrics.rejected(error.label());
            state.metrics.admission(kind, "error", error.label());
            tracing::warn!(%error, kind = kind.label(), "admission request refused");
            error.into_response()
        }
    }
}

async fn decide(
    state: &AppState,
    kind: AdmissionKind,
    body: Body,
) -> Result<Decision, RequestError> {
    let bytes = read_body(body, state.max_body_bytes).await?;
    let request = AdmissionReview::parse(&bytes)?;
    Ok(match kind {
        AdmissionKind::CacheBackendDefault => {
            cachebackend::default_with(&request, &state.provider_images)
        }
        AdmissionKind::CacheBackendValidate => cachebackend::validate(&request),
        AdmissionKind::Pod => pod::mutate(&request, &*state.backends, &state.injection).await,
    })
}

async fn read_body(body: Body, limit: usize) -> Result<bytes::Bytes, RequestError> {
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<LengthLimitError>() => Err(RequestError::TooLarge { limit }),
        Err(error) => Err(RequestError::BodyRead(error.to_string())),
    }
}

// === HTTPS serving ===

/// The HTTPS port's connection deadlines, each with the counter of the
/// connections it closes.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// No traffic either way (`--connection-idle-timeout-seconds`).
    pub idle: (Duration, prometheus_client::metrics::counter::Counter),
    /// A request's headers (`--header-read-timeout-seconds`).
    pub header_read: (Duration, prometheus_client::metrics::counter::Counter),
    /// The TLS handshake (`--tls-handshake-timeout-seconds`; failed
    /// handshakes are counted too).
    pub handshake: (Duration, prometheus_client::metrics::counter::Counter),
}

/// A bound (not yet serving) HTTPS server.
pub struct HttpsServer {
    /// TLS handshakes (with their deadline) and the idle limit: a
    /// connection without traffic for that long is closed (one that never
    /// sends a request, or an idle keep-alive or HTTP/2 connection).
    listener: ServingListener,
    router: Router,
    /// `--header-read-timeout-seconds`, and the counter of HTTP/1.1
    /// connections it cut.
    header_read: (Duration, prometheus_client::metrics::counter::Counter),
}

impl std::fmt::Debug for HttpsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpsServer")
            .field("listener", &self.listener)
            .finish_non_exhaustive()
    }
}

impl HttpsServer {
    /// Binds `addr`, serving `certs`; serving starts with [`HttpsServer::serve`].
    pub async fn bind(
        addr: SocketAddr,
        certs: Arc<CertStore>,
        router: Router,
        limits: ConnectionLimits,
    ) -> std::io::Result<Self> {
        let options = ServeOptions {
            tls: Some(certs),
            alpn: vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            idle: Some(limits.idle.0),
            idle_closed: Some(limits.idle.1),
            handshake_failures: Some(limits.handshake.1),
            handshake_timeout: limits.handshake.0,
        };
        Ok(Self {
            listener: ServingListener::bind(addr, options).await?,
            router,
            header_read: limits.header_read,
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.listener.local_addr())
    }

    /// Accepts connections until `shutdown`, then lets open connections
    /// finish their requests.
    pub async fn serve(mut self, shutdown: CancellationToken) -> std::io::Result<()> {
        let addr = self.listener.local_addr();
        tracing::info!(%addr, "admission server listening");
        ic_telemetry::listening::listening("https", addr);
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read.0);
        builder.http2().timer(TokioTimer::new());
        loop {
            let conn = tokio::select! {
                () = shutdown.cancelled() => break,
                conn = self.listener.next() => match conn {
                    Some(conn) => conn,
                    None => break,
                },
            };
            let peer = conn.remote_addr();
            let service = TowerToHyperService::new(self.router.clone());
            let connection = builder
                .serve_connection_with_upgrades(TokioIo::new(conn), service)
                .into_owned();
            let watcher = graceful.watcher();
            let header_timeouts = self.header_read.1.clone();
            tokio::spawn(async move {
                if let Err(error) = watcher.watch(connection).await {
                    if error
                        .downcast_ref::<hyper::Error>()
                        .is_some_and(hyper::Error::is_timeout)
                    {
                        header_timeouts.inc();
                        tracing::debug!(%peer, "request headers too slow; connection closed");
                    } else {
                        tracing::debug!(%error, %peer, "connection ended with an error");
                    }
                }
            });
        }
        drop(self.listener);
        // Bounded: the API server's webhook timeout is at most 30 s.
        let _ = tokio::time::timeout(Duration::from_secs(30), graceful.shutdown()).await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{ListError, ListFuture};
    use tower::ServiceExt as _;

    #[derive(Debug)]
    struct NoBackends;

    impl BackendSource for NoBackends {
        fn list<'a>(&'a self, _namespace: &'a str) -> ListFuture<'a> {
            Box::pin(async { Err(ListError::Other("no API in unit tests".into())) })
        }
    }

    fn app(max_body_bytes: usize) -> (Router, Metrics) {
        let metrics = Metrics::unregistered();
        let state = Arc::new(AppState {
            metrics: metrics.clone(),
            backends: Arc::new(NoBackends),
            injection: InjectionConfig::default(),
            provider_images: ProviderImageDefaults::default(),
            max_body_bytes,
            request_timeout: Duration::from_secs(5),
        });
        (router(state), metrics)
    }

    async fn post(app: Router, path: &str, body: Vec<u8>) -> (StatusCode, serde_json::Value) {
        let response = app
            .oneshot(
                http::Request::post(path)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body))
                    .unwrap(),
            )
            .await
            .unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    fn pod_review() -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "namespace": "ns", "operation": "CREATE",
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                    "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}}}
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn pod_list_failure_is_an_allowed_review() {
        let (app, metrics) = app(1 << 20);
        let (status, answer) = post(app, "/mutate-pod", pod_review()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer["kind"], "AdmissionReview");
        assert_eq!(answer["response"]["uid"], "u-1");
        assert_eq!(answer["response"]["allowed"], true);
        assert_eq!(answer["response"]["status"]["reason"], "list_failed");
        let counted = metrics
            .admissions
            .get_or_create(&crate::metrics::AdmissionLabels {
                kind: "pod",
                result: "fail_open",
                reason: "list_failed",
            })
            .get();
        assert_eq!(counted, 1);
    }

    #[tokio::test]
    async fn oversized_and_malformed_bodies_are_http_errors() {
        let (app, metrics) = app(64);
        let (status, answer) = post(app.clone(), "/mutate-pod", pod_review()).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(answer["error"].as_str().unwrap().contains("64 bytes"));
        let (status, _) = post(
            app.clone(),
            "/validate-cachebackend",
            b"{\"apiVersion\":".to_vec(),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = post(app, "/mutate-cachebackend", b"{}".to_vec()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let rejected = |reason| {
            metrics
                .rejected_requests
                .get_or_create(&crate::metrics::RejectLabel { reason })
                .get()
        };
        assert_eq!(
            (
                rejected("too_large"),
                rejected("malformed"),
                rejected("wrong_type")
            ),
            (1, 1, 1)
        );
    }
}
