//! Who may call the operator endpoints that change or destroy cache state:
//! quotas (`PUT`/`DELETE /quota/…`), pins (`POST`/`DELETE /cache/pins`),
//! `POST /cache/delete` and `POST /cache/prefetches`.
//!
//! Off by default, as in LMCache's coordinator, whose clients send no
//! credentials. With `--api-audience` a caller presents a service-account
//! token bound to that audience (TokenReview, cached a minute), and is
//! allowed if it is one of the `--api-admin` identities (the chart names
//! the controller's service account, which pushes CacheTenant quotas and
//! pins) or if RBAC lets it (a SubjectAccessReview, cached a minute) use
//! the virtual subresource of `coordinators.inferencecache.io` the endpoint
//! touches, cluster-wide ([`operator_action`]). `--api-static-token` is the
//! local-mode equivalent. Reads, instance registration, heartbeats and
//! `/events` stay open: LMCache's MP workers call them and send no
//! credentials.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ic_kube_auth::{Access, AccessReviewer, AuthError, TokenReviewer, bearer, same_secret};
use serde_json::json;

use crate::state::App;

/// How operator endpoints are guarded.
#[derive(Debug)]
pub enum OperatorAccess {
    /// Anyone who reaches the port (LMCache's behaviour; the default).
    Open,
    /// Callers present this token.
    Static(String),
    /// Callers present a token the API server accepts for the audience and
    /// are one of the admins, or RBAC allows them the endpoint.
    Kube(Box<KubeOperators>),
}

/// Kubernetes mode's reviewers and admins.
#[derive(Debug)]
pub struct KubeOperators {
    /// Reviews tokens for the audience.
    pub reviewer: TokenReviewer,
    /// Asks RBAC about callers that are not admins.
    pub access: AccessReviewer,
    /// Usernames always allowed (`system:serviceaccount:<ns>:<name>`).
    pub admins: Vec<String>,
}

/// The API group of the virtual resource operator endpoints are authorized on.
pub const OPERATOR_GROUP: &str = "inferencecache.io";
/// The virtual resource; each kind of endpoint is a subresource of it.
pub const OPERATOR_RESOURCE: &str = "coordinators";

/// What an operator endpoint asks RBAC for: (verb, subresource of
/// `coordinators.inferencecache.io`), or `None` for the endpoints that stay
/// open (reads, registration, heartbeats, events, lookups).
///
/// | endpoint | verb | subresource |
/// |---|---|---|
/// | `PUT /quota/…` | update | quotas |
/// | `DELETE /quota/…` | delete | quotas |
/// | `POST /cache/pins` | create | pins |
/// | `DELETE /cache/pins` | delete | pins |
/// | `POST /cache/delete` | delete | entries |
/// | `POST /cache/prefetches` | create | prefetches |
pub fn operator_action(method: &Method, path: &str) -> Option<(&'static str, &'static str)> {
    if *method == Method::GET || *method == Method::HEAD {
        return None;
    }
    let verb = if *method == Method::DELETE {
        "delete"
    } else if *method == Method::POST {
        "create"
    } else if *method == Method::PATCH {
        "patch"
    } else {
        "update"
    };
    if path == "/quota" || path.starts_with("/quota/") {
        // Quotas are set whether the request is a PUT or a POST.
        let verb = if verb == "delete" { "delete" } else { "update" };
        return Some((verb, "quotas"));
    }
    match path {
        "/cache/pins" => Some((verb, "pins")),
        "/cache/delete" => Some(("delete", "entries")),
        "/cache/prefetches" => Some((verb, "prefetches")),
        // Any other mutation under /cache/ is guarded as a change of
        // cached entries (none exists today; it 404s once through).
        p if p.starts_with("/cache/") => Some((verb, "entries")),
        _ => None,
    }
}

/// A refusal: the status and why.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 401, 403 or 503.
    pub status: StatusCode,
    /// Metric label.
    pub reason: &'static str,
    /// The `detail` of the JSON answer.
    pub detail: String,
}

impl OperatorAccess {
    /// The flags' mode label, logged at start.
    pub fn mode(&self) -> &'static str {
        match self {
            OperatorAccess::Open => "open",
            OperatorAccess::Static(_) => "static",
            OperatorAccess::Kube(_) => "kubernetes",
        }
    }

    /// Decides `action` (from [`operator_action`]) by the request's
    /// `Authorization` header.
    pub async fn check(
        &self,
        authorization: Option<&str>,
        (verb, subresource): (&'static str, &'static str),
    ) -> Result<(), Refusal> {
        let token = match self {
            OperatorAccess::Open => return Ok(()),
            _ => bearer(authorization).ok_or_else(|| refusal(&AuthError::Missing))?,
        };
        match self {
            OperatorAccess::Open => Ok(()),
            OperatorAccess::Static(expected) => {
                if same_secret(token.as_bytes(), expected.as_bytes()) {
                    Ok(())
                } else {
                    Err(refusal(&AuthError::Rejected(
                        "does not match the configured token".into(),
                    )))
                }
            }
            OperatorAccess::Kube(kube) => {
                let KubeOperators {
                    reviewer,
                    access,
                    admins,
                } = kube.as_ref();
                let user = reviewer.review(token).await.map_err(|e| refusal(&e))?;
                if admins.contains(&user.username) {
                    return Ok(());
                }
                let question = Access {
                    group: OPERATOR_GROUP,
                    resource: OPERATOR_RESOURCE,
                    subresource,
                    verb,
                    namespace: "",
                };
                if access
                    .allowed(&user, question)
                    .await
                    .map_err(|e| refusal(&e))?
                {
                    return Ok(());
                }
                Err(Refusal {
                    status: StatusCode::FORBIDDEN,
                    reason: "forbidden",
                    detail: format!(
                        "{} may not {verb} {OPERATOR_RESOURCE}/{subresource}.{OPERATOR_GROUP} \
                         (cluster-wide): grant it with RBAC, or list it in --api-admin",
                        user.username
                    ),
                })
            }
        }
    }
}

fn refusal(error: &AuthError) -> Refusal {
    let status = match error {
        AuthError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::UNAUTHORIZED,
    };
    Refusal {
        status,
        reason: error.reason(),
        detail: error.to_string(),
    }
}

/// Middleware: refuses operator mutations the access rules do not allow,
/// before the request body is read.
pub async fn guard(
    State((app, access)): State<(App, Arc<OperatorAccess>)>,
    req: Request,
    next: Next,
) -> Response {
    let events = app.settings.events_require_auth
        && *req.method() == axum::http::Method::POST
        && req.uri().path() == "/events";
    let action = match operator_action(req.method(), req.uri().path())
        .or(events.then_some(("create", "events")))
    {
        Some(action) if !matches!(*access, OperatorAccess::Open) => action,
        _ => return next.run(req).await,
    };
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match access.check(authorization, action).await {
        Ok(()) => next.run(req).await,
        Err(refused) => {
            app.metrics
                .metrics
                .access_refusals
                .get_or_create(&crate::metrics::ReasonLabel {
                    reason: refused.reason,
                })
                .inc();
            tracing::warn!(
                method = %req.method(),
                path = req.uri().path(),
                reason = refused.reason,
                "operator request refused"
            );
            (
                refused.status,
                axum::Json(json!({"detail": refused.detail})),
            )
                .into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_operator_mutation_names_its_verb_and_subresource() {
        for (method, path, action) in [
            (Method::PUT, "/quota/t", ("update", "quotas")),
            (Method::DELETE, "/quota/t", ("delete", "quotas")),
            (Method::PUT, "/quota/config", ("update", "quotas")),
            (Method::POST, "/quota", ("update", "quotas")),
            (Method::POST, "/cache/pins", ("create", "pins")),
            (Method::DELETE, "/cache/pins", ("delete", "pins")),
            (Method::POST, "/cache/delete", ("delete", "entries")),
            (Method::POST, "/cache/prefetches", ("create", "prefetches")),
            (Method::PATCH, "/cache/other", ("patch", "entries")),
        ] {
            assert_eq!(
                operator_action(&method, path),
                Some(action),
                "{method} {path}"
            );
        }
        for (method, path) in [
            (Method::GET, "/quota/t"),
            (Method::GET, "/cache/pins"),
            (Method::POST, "/instances"),
            (Method::PUT, "/instances/i/heartbeat"),
            (Method::POST, "/events"),
            (Method::POST, "/directory/lookup"),
        ] {
            assert_eq!(operator_action(&method, path), None, "{method} {path}");
        }
    }

    #[tokio::test]
    async fn static_tokens_are_compared() {
        let access = OperatorAccess::Static("s3cret".into());
        let pin = ("create", "pins");
        assert_eq!(access.check(Some("Bearer s3cret"), pin).await, Ok(()));
        let wrong = access.check(Some("Bearer nope"), pin).await.unwrap_err();
        assert_eq!(
            (wrong.status, wrong.reason),
            (StatusCode::UNAUTHORIZED, "rejected_token")
        );
        let missing = access.check(None, pin).await.unwrap_err();
        assert_eq!(missing.reason, "missing_token");
        assert_eq!(OperatorAccess::Open.check(None, pin).await, Ok(()));
    }
}
