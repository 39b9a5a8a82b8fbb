//! `POST /directory/lookup` served straight from the connection, without
//! axum's routing and the router's layers.
//!
//! With the operator endpoints open (no guard layer), everything the
//! router does for this route is: pass Starlette's edges (the request's own
//! path is a route of the table), match the route, apply the body limit,
//! count and time the request, run the handler. Here the same handler runs
//! under the same body limit and the request is counted and timed under the
//! same labels; the edges, the matching and two `from_fn` layers (a boxed
//! future and a router clone each) are skipped: ~10 K of a lookup's 75 K
//! instructions (docs/benchmarks.md, "Per request under callgrind"). Every
//! other request goes to the router as before.

use std::borrow::Cow;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};
use tower::{Layer, Service, ServiceExt};

use crate::http::directory;
use crate::state::App;

/// The route served here, as the router names it in its metrics.
const LOOKUP: &str = "/directory/lookup";

/// `router` with `POST /directory/lookup` answered before it: only for a
/// router whose operator endpoints are open (a guarded one keeps every
/// request).
pub(crate) fn with_hot_routes(app: App, router: Router) -> Router {
    Router::new().fallback_service(Hot { app, router })
}

#[derive(Clone)]
struct Hot {
    app: App,
    router: Router,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl Service<Request> for Hot {
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Answer {
        if req.method() == Method::POST && req.uri().path() == LOOKUP {
            // The router's `DefaultBodyLimit`, so the body extractor below
            // refuses what the router's would.
            let app = self.app.clone();
            let limited = DefaultBodyLimit::max(app.settings.max_body_bytes)
                .layer(tower::service_fn(move |req| serve_lookup(app.clone(), req)));
            Box::pin(limited.oneshot(req))
        } else {
            Box::pin(self.router.clone().oneshot(req))
        }
    }
}

/// What the router runs for the route: the body read under the limit, the
/// handler, the request counted and timed (its `observe` layer's labels).
async fn serve_lookup(app: App, mut req: Request) -> Result<Response, Infallible> {
    let started = std::time::Instant::now();
    let headers = std::mem::take(req.headers_mut());
    let body = Bytes::from_request(req, &()).await;
    let resp = directory::lookup(State(app.clone()), headers, body)
        .await
        .into_response();
    app.metrics.served(
        "POST",
        Cow::Borrowed(LOOKUP),
        resp.status().as_u16(),
        started.elapsed(),
    );
    Ok(resp)
}
