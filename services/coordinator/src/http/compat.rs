//! Starlette's routing edges, as the reference coordinator answers them:
//! routes are tried in the reference's registration order; a path that
//! matches only with another method is `405` with the `Allow` of the first
//! such route (so `HEAD` on a `GET` route is 405, as in FastAPI); a path
//! that matches nothing but would with its trailing slash toggled is a
//! `307` to that URL. `/openapi.json` and `/docs` are served as FastAPI
//! serves them.

use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use serde_json::json;

/// `(path pattern, method, owning controller)`, in the reference's order;
/// `{x}` matches one non-empty segment. House routes come last.
const ROUTES: &[(&str, &str, Option<&str>)] = &[
    ("/openapi.json", "GET", None),
    ("/docs", "GET", None),
    ("/cache/prefetches", "POST", Some("PrefetchManager")),
    ("/cache/prefetches/{}/{}", "GET", Some("PrefetchManager")),
    ("/cache/delete", "POST", Some("FleetEvictionController")),
    ("/directory/lookup", "POST", None),
    ("/directory/blend-lookup", "POST", None),
    ("/directory/keys", "GET", None),
    ("/directory/stats", "GET", None),
    ("/events", "POST", None),
    ("/healthz", "GET", None),
    ("/instances", "POST", None),
    ("/instances/{}/heartbeat", "PUT", None),
    ("/instances/{}", "DELETE", None),
    ("/instances", "GET", None),
    ("/instances/usage", "GET", None),
    ("/instances/{}/usage", "GET", None),
    ("/metrics", "GET", None),
    ("/quota/config", "PUT", Some("FleetEvictionController")),
    ("/quota/config", "GET", Some("FleetEvictionController")),
    ("/quota/{}", "PUT", Some("FleetEvictionController")),
    ("/quota/{}", "DELETE", Some("FleetEvictionController")),
    ("/quota/{}", "GET", Some("FleetEvictionController")),
    ("/quota", "GET", Some("FleetEvictionController")),
    ("/cache/pins", "POST", Some("FleetEvictionController")),
    ("/cache/pins", "DELETE", Some("FleetEvictionController")),
    ("/cache/pins", "GET", Some("FleetEvictionController")),
    // House extensions (not in the reference).
    ("/status", "GET", None),
    ("/live", "GET", None),
    ("/ready", "GET", None),
];

fn path_matches(pattern: &str, path: &str) -> bool {
    let mut p = pattern.split('/');
    let mut s = path.split('/');
    loop {
        match (p.next(), s.next()) {
            (None, None) => return true,
            (Some("{}"), Some(seg)) if !seg.is_empty() => {}
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

/// What the router should do with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Routing {
    /// A route takes it.
    Serve,
    /// 405 with this `Allow`.
    MethodNotAllowed(&'static str),
    /// 307 to the path with its trailing slash toggled.
    Redirect(String),
    /// 404.
    NotFound,
}

/// Decides like Starlette's router, over the routes whose controller is
/// enabled.
pub fn route(method: &Method, path: &str, enabled: &dyn Fn(&str) -> bool) -> Routing {
    // A live route's own path and method is served whatever comes before
    // it (the walk below serves the first route taking both): one compare
    // a route instead of splitting the path against each pattern.
    let exact = ROUTES
        .iter()
        .any(|&(p, m, c)| p == path && m == method.as_str() && c.is_none_or(enabled));
    if exact {
        return Routing::Serve;
    }
    walk(method, path, enabled)
}

/// [`route`] by walking every pattern.
fn walk(method: &Method, path: &str, enabled: &dyn Fn(&str) -> bool) -> Routing {
    let live = || ROUTES.iter().filter(|(_, _, c)| c.is_none_or(enabled));
    let mut partial = None;
    for &(pattern, m, _) in live() {
        if path_matches(pattern, path) {
            if m == method.as_str()
                || (pattern == "/openapi.json" || pattern == "/docs") && method == Method::HEAD
            {
                return Routing::Serve;
            }
            partial.get_or_insert(if pattern == "/openapi.json" || pattern == "/docs" {
                "HEAD, GET"
            } else {
                m
            });
        }
    }
    if let Some(allow) = partial {
        return Routing::MethodNotAllowed(allow);
    }
    if path != "/" {
        let other = match path.strip_suffix('/') {
            Some(p) => p.to_owned(),
            None => format!("{path}/"),
        };
        if live().any(|(pattern, _, _)| path_matches(pattern, &other)) {
            return Routing::Redirect(other);
        }
    }
    Routing::NotFound
}

/// The middleware: applies [`route`] before axum's router sees the request.
pub async fn starlette_edges(
    enabled: std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>,
    req: Request,
    next: Next,
) -> Response {
    match route(req.method(), req.uri().path(), &*enabled) {
        Routing::Serve | Routing::NotFound => next.run(req).await,
        Routing::MethodNotAllowed(allow) => (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, HeaderValue::from_static(allow))],
            axum::Json(json!({"detail": "Method Not Allowed"})),
        )
            .into_response(),
        Routing::Redirect(path) => {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("localhost");
            let query = req
                .uri()
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            let location = format!("http://{host}{path}{query}");
            match HeaderValue::from_str(&location) {
                Ok(loc) => {
                    (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, loc)]).into_response()
                }
                Err(_) => next.run(req).await,
            }
        }
    }
}

/// The reference's OpenAPI document (LMCache 0.5.6, as its `/openapi.json`
/// serves it; the routes here answer it field for field).
pub const OPENAPI: &str = include_str!("openapi.json");

pub(crate) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// FastAPI's Swagger UI page pointing at `/openapi.json`.
pub(crate) async fn docs() -> Html<&'static str> {
    Html(include_str!("docs.html"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(_: &str) -> bool {
        true
    }

    #[test]
    fn routing_follows_starlette() {
        assert_eq!(
            route(&Method::PATCH, "/instances", &all),
            Routing::MethodNotAllowed("POST")
        );
        assert_eq!(
            route(&Method::PATCH, "/instances/usage", &all),
            Routing::MethodNotAllowed("DELETE")
        );
        assert_eq!(
            route(&Method::GET, "/instances/usage", &all),
            Routing::Serve
        );
        assert_eq!(
            route(&Method::HEAD, "/healthz", &all),
            Routing::MethodNotAllowed("GET")
        );
        assert_eq!(route(&Method::HEAD, "/docs", &all), Routing::Serve);
        assert_eq!(
            route(&Method::POST, "/instances/", &all),
            Routing::Redirect("/instances".into())
        );
        assert_eq!(route(&Method::GET, "/nothing/", &all), Routing::NotFound);
        assert_eq!(route(&Method::GET, "/quota", &|_| false), Routing::NotFound);
    }

    /// The exact-match shortcut answers as the walk does, for every route's
    /// path (and its variants) under every method and controller set.
    #[test]
    fn the_shortcut_agrees_with_the_walk() {
        let methods = [
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::DELETE,
            Method::HEAD,
            Method::PATCH,
        ];
        let sets: [&dyn Fn(&str) -> bool; 3] = [&all, &|_| false, &|c| c == "PrefetchManager"];
        let mut paths: Vec<String> = Vec::new();
        for (p, _, _) in ROUTES {
            paths.push((*p).to_owned());
            paths.push(format!("{p}/"));
            paths.push(p.replace("{}", "x"));
        }
        paths.extend(["/".into(), "".into(), "/nothing".into()]);
        for path in &paths {
            for m in &methods {
                for enabled in sets {
                    assert_eq!(
                        route(m, path, enabled),
                        walk(m, path, enabled),
                        "{m} {path}"
                    );
                }
            }
        }
    }
}
