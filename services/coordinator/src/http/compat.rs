//! Starlette's routing edges, as the reference coordinator answers them:
//! routes are matched against the percent-decoded path (uvicorn's
//! `scope["path"]`: `/%69nstances` is `/instances`, `a%2Fb` is two
//! segments) in the reference's registration order; a path that matches
//! only with another method is `405` with the `Allow` of the first such
//! route (so `HEAD` on a `GET` route is 405, as in FastAPI); a path that
//! matches nothing but would with its trailing slashes stripped (or one
//! added) is a `307` to that URL; anything else is `404`, whatever axum's
//! router matched (it takes an empty segment as a parameter).
//! `/openapi.json`, `/docs`, `/docs/oauth2-redirect` and `/redoc` are
//! served as FastAPI serves them.

use std::borrow::Cow;

use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::MethodRouter;
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
    // FastAPI's other pages: no other route shares their paths, so their
    // place in the order only sets what the exact match scans first.
    ("/docs/oauth2-redirect", "GET", None),
    ("/redoc", "GET", None),
    // House extensions (not in the reference).
    ("/status", "GET", None),
    ("/live", "GET", None),
    ("/ready", "GET", None),
];

/// The methods uvicorn's HTTP parser (httptools, llhttp 9) reads, case
/// included; it answers any other with [`invalid_request`] before the
/// application sees it.
const PARSER_METHODS: [&str; 35] = [
    "DELETE",
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "CONNECT",
    "OPTIONS",
    "TRACE",
    "COPY",
    "LOCK",
    "MKCOL",
    "MOVE",
    "PROPFIND",
    "PROPPATCH",
    "SEARCH",
    "UNLOCK",
    "BIND",
    "REBIND",
    "UNBIND",
    "ACL",
    "REPORT",
    "MKACTIVITY",
    "CHECKOUT",
    "MERGE",
    "M-SEARCH",
    "NOTIFY",
    "SUBSCRIBE",
    "UNSUBSCRIBE",
    "PATCH",
    "PURGE",
    "MKCALENDAR",
    "LINK",
    "UNLINK",
    "SOURCE",
    "QUERY",
];

/// uvicorn's answer to a request its parser refuses (a method outside
/// [`PARSER_METHODS`]): 400, plain text, and the connection closed.
fn invalid_request() -> Response {
    (
        StatusCode::BAD_REQUEST,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CONNECTION, "close"),
        ],
        "Invalid HTTP request received.",
    )
        .into_response()
}

/// FastAPI's own pages: Starlette routes, so `GET` and `HEAD`.
const PAGES: [&str; 4] = ["/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"];

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

/// Whether axum's router matches a table pattern on the raw path: a
/// parameter takes any one segment, an empty one too.
fn axum_matches(pattern: &str, raw: &str) -> bool {
    let (mut p, mut s) = (pattern.split('/'), raw.split('/'));
    loop {
        match (p.next(), s.next()) {
            (None, None) => return true,
            (Some("{}"), Some(_)) => {}
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
    if exact(method, path, enabled) {
        return Routing::Serve;
    }
    walk(method, path, enabled)
}

/// A live route's own path and method is served whatever comes before it
/// (the walk serves the first route taking both): one compare a route
/// instead of splitting the path against each pattern. No pattern holds a
/// `%`, so a path this takes is its own decoding.
fn exact(method: &Method, path: &str, enabled: &dyn Fn(&str) -> bool) -> bool {
    ROUTES
        .iter()
        .any(|&(p, m, c)| p == path && m == method.as_str() && c.is_none_or(enabled))
}

/// [`route`] by walking every pattern.
fn walk(method: &Method, path: &str, enabled: &dyn Fn(&str) -> bool) -> Routing {
    let live = || ROUTES.iter().filter(|(_, _, c)| c.is_none_or(enabled));
    let mut partial = None;
    for &(pattern, m, _) in live() {
        if path_matches(pattern, path) {
            // FastAPI's own pages are Starlette routes: GET and HEAD.
            let page = PAGES.contains(&pattern);
            if m == method.as_str() || page && method == Method::HEAD {
                return Routing::Serve;
            }
            partial.get_or_insert(if page { "GET, HEAD" } else { m });
        }
    }
    if let Some(allow) = partial {
        return Routing::MethodNotAllowed(allow);
    }
    if path != "/" {
        // Starlette strips every trailing slash (`rstrip("/")`).
        let other = if path.ends_with('/') {
            path.trim_end_matches('/').to_owned()
        } else {
            format!("{path}/")
        };
        if live().any(|(pattern, _, _)| path_matches(pattern, &other)) {
            return Routing::Redirect(other);
        }
    }
    Routing::NotFound
}

/// Python's `urllib.parse.unquote` (what uvicorn makes `scope["path"]`
/// of): `%XX` escapes decoded, the bytes read as UTF-8 with U+FFFD for
/// what is not, a `%` not followed by two hex digits kept.
pub fn unquote(path: &str) -> Cow<'_, str> {
    if !path.as_bytes().contains(&b'%') {
        return Cow::Borrowed(path);
    }
    let b = path.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| char::from(c).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            // Two hex digits: at most 0xff.
            out.push(u8::try_from(h * 16 + l).unwrap_or(u8::MAX));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

/// Python's `urllib.parse.quote(s, safe)`: every byte of the UTF-8 form
/// outside the unreserved set and `safe` becomes `%XX`.
fn quote(s: &str, safe: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || b"_.-~".contains(&c) || safe.contains(&c) {
            out.push(char::from(c));
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// A route's method router that adds no `Allow` of its own. The edges
/// answer every method a route does not serve (405 with the reference's
/// `Allow`, a 404, uvicorn's 400); axum's method router would add the
/// route's `Allow` to each of those answers.
pub fn no_allow<S: Clone + Send + Sync + 'static>(m: MethodRouter<S>) -> MethodRouter<S> {
    m.merge(axum::routing::any(super::method_not_allowed))
}

/// The middleware: applies [`route`] to the decoded path. A request whose
/// path decodes to another is handed to `reroute` (the routes without this
/// layer) with that path, escaped again so that axum's extractors decode it
/// once to Starlette's values; any other goes on to the route axum matched.
pub async fn starlette_edges(
    enabled: std::sync::Arc<dyn Fn(&str) -> bool + Send + Sync>,
    reroute: std::sync::Arc<axum::Router>,
    mut req: Request,
    next: Next,
) -> Response {
    // The usual request (a route's own path) is served without decoding.
    if exact(req.method(), req.uri().path(), &*enabled) {
        return next.run(req).await;
    }
    if !PARSER_METHODS.contains(&req.method().as_str()) {
        return invalid_request();
    }
    let decoded = unquote(req.uri().path());
    match walk(req.method(), &decoded, &*enabled) {
        Routing::Serve => {
            if let Cow::Owned(path) = decoded {
                let mut parts = req.uri().clone().into_parts();
                let query = req
                    .uri()
                    .query()
                    .map(|q| format!("?{q}"))
                    .unwrap_or_default();
                // Path-segment characters stay; `%` and the rest are escaped.
                let escaped = quote(&path, b"/:@!$&'()*+,;=");
                parts.path_and_query = format!("{escaped}{query}").parse().ok();
                if let Ok(uri) = Uri::from_parts(parts) {
                    *req.uri_mut() = uri;
                }
                // What the first routing recorded (matched path, path
                // parameters) would be added to by the second.
                req.extensions_mut().clear();
                return match tower::ServiceExt::oneshot((*reroute).clone(), req).await {
                    Ok(resp) => resp,
                    Err(never) => match never {},
                };
            }
            next.run(req).await
        }
        // A route of the table that axum would match where Starlette does
        // not (an empty segment as a parameter) is not found; a path the
        // table does not list (a controller's own route) is axum's to
        // answer.
        Routing::NotFound => {
            let raw = req.uri().path();
            if ROUTES.iter().any(|(p, _, _)| axum_matches(p, raw)) {
                super::not_found().await
            } else {
                next.run(req).await
            }
        }
        Routing::MethodNotAllowed(allow) => (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, HeaderValue::from_static(allow))],
            axum::Json(json!({"detail": "Method Not Allowed"})),
        )
            .into_response(),
        Routing::Redirect(path) => {
            let host = req.headers().get(header::HOST).map_or_else(
                || "localhost".to_owned(),
                |h| String::from_utf8_lossy(h.as_bytes()).into_owned(),
            );
            let query = req
                .uri()
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            // Starlette's RedirectResponse quotes the whole URL.
            let location = quote(
                &format!("http://{host}{path}{query}"),
                b":/%#?=@[]!$&'()*+,;",
            );
            match HeaderValue::from_str(&location) {
                Ok(loc) => {
                    (StatusCode::TEMPORARY_REDIRECT, [(header::LOCATION, loc)]).into_response()
                }
                Err(_) => super::not_found().await,
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

/// FastAPI's Swagger UI page over `/openapi.json`, as the reference serves
/// it (byte for byte).
pub(crate) async fn docs() -> Html<&'static str> {
    Html(include_str!("docs.html"))
}

/// FastAPI's Swagger UI OAuth2 redirect page, as the reference serves it.
pub(crate) async fn oauth2_redirect() -> Html<&'static str> {
    Html(include_str!("oauth2-redirect.html"))
}

/// FastAPI's ReDoc page over `/openapi.json`, as the reference serves it.
pub(crate) async fn redoc() -> Html<&'static str> {
    Html(include_str!("redoc.html"))
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
            route(&Method::PUT, "/redoc", &all),
            Routing::MethodNotAllowed("GET, HEAD")
        );
        assert_eq!(
            route(&Method::GET, "/quota//", &all),
            Routing::Redirect("/quota".into())
        );
        assert_eq!(
            route(&Method::PUT, "/instances//heartbeat", &all),
            Routing::NotFound
        );
        assert_eq!(
            route(&Method::POST, "/instances/", &all),
            Routing::Redirect("/instances".into())
        );
        assert_eq!(route(&Method::GET, "/nothing/", &all), Routing::NotFound);
        assert_eq!(route(&Method::GET, "/quota", &|_| false), Routing::NotFound);
    }

    #[test]
    fn table_patterns_match_as_axum_matches_raw_paths() {
        assert!(axum_matches(
            "/instances/{}/heartbeat",
            "/instances//heartbeat"
        ));
        assert!(axum_matches(
            "/instances/{}/heartbeat",
            "/instances/a%2Fb/heartbeat"
        ));
        assert!(axum_matches("/quota", "/quota"));
        assert!(!axum_matches("/quota/{}", "/quota/a/b"));
        assert!(!axum_matches("/quota", "/acme/reaper"));
    }

    #[test]
    fn paths_are_unquoted_as_python_does() {
        assert_eq!(unquote("/instances"), "/instances");
        assert_eq!(unquote("/%69nstances%2F"), "/instances/");
        assert_eq!(unquote("/a%2fb%zz%4"), "/a/b%zz%4");
        assert_eq!(unquote("/%C3%A9/%FF"), "/\u{e9}/\u{fffd}");
        assert_eq!(quote("/a b%/\u{e9}", b"/"), "/a%20b%25/%C3%A9");
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
