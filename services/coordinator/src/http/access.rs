//! Who may call the operator endpoints that change or destroy cache state:
//! quotas (`PUT`/`DELETE /quota/…`), pins (`POST`/`DELETE /cache/pins`),
//! `POST /cache/delete` and `POST /cache/prefetches`.
//!
//! Off by default, as in LMCache's coordinator, whose clients send no
//! credentials. With `--api-audience` a caller presents a service-account
//! token bound to that audience (TokenReview, cached a minute), and must be
//! one of the `--api-admin` identities (the chart names the controller's
//! service account, which pushes CacheTenant quotas and pins).
//! `--api-static-token` is the local-mode equivalent. Reads, instance
//! registration, heartbeats and `/events` stay open: LMCache's MP workers
//! call them and send no credentials.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ic_kube_auth::{AuthError, TokenReviewer, bearer, same_secret};
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
    /// are one of these usernames.
    Kube {
        /// Reviews tokens for the audience.
        reviewer: TokenReviewer,
        /// Usernames allowed (`system:serviceaccount:<ns>:<name>`).
        admins: Vec<String>,
    },
}

/// Whether `method path` is an operator endpoint that changes state.
pub fn is_operator_mutation(method: &Method, path: &str) -> bool {
    if *method == Method::GET || *method == Method::HEAD {
        return false;
    }
    path == "/quota" || path.starts_with("/quota/") || path.starts_with("/cache/")
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
            OperatorAccess::Kube { .. } => "kubernetes",
        }
    }

    /// Decides a request by its `Authorization` header.
    pub async fn check(&self, authorization: Option<&str>) -> Result<(), Refusal> {
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
            OperatorAccess::Kube { reviewer, admins } => {
                let user = reviewer.review(token).await.map_err(|e| refusal(&e))?;
                if admins.contains(&user.username) {
                    Ok(())
                } else {
                    Err(Refusal {
                        status: StatusCode::FORBIDDEN,
                        reason: "not_an_admin",
                        detail: format!(
                            "{} may not change quotas, pins or cached data: only --api-admin \
                             identities may",
                            user.username
                        ),
                    })
                }
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
    if matches!(*access, OperatorAccess::Open)
        || !is_operator_mutation(req.method(), req.uri().path())
    {
        return next.run(req).await;
    }
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match access.check(authorization).await {
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
    fn only_operator_mutations_are_guarded() {
        for (method, path) in [
            (Method::PUT, "/quota/t"),
            (Method::DELETE, "/quota/t"),
            (Method::PUT, "/quota/config"),
            (Method::POST, "/cache/pins"),
            (Method::DELETE, "/cache/pins"),
            (Method::POST, "/cache/delete"),
            (Method::POST, "/cache/prefetches"),
        ] {
            assert!(is_operator_mutation(&method, path), "{method} {path}");
        }
        for (method, path) in [
            (Method::GET, "/quota/t"),
            (Method::GET, "/cache/pins"),
            (Method::POST, "/instances"),
            (Method::PUT, "/instances/i/heartbeat"),
            (Method::POST, "/events"),
            (Method::POST, "/directory/lookup"),
        ] {
            assert!(!is_operator_mutation(&method, path), "{method} {path}");
        }
    }

    #[tokio::test]
    async fn static_tokens_are_compared() {
        let access = OperatorAccess::Static("s3cret".into());
        assert_eq!(access.check(Some("Bearer s3cret")).await, Ok(()));
        let wrong = access.check(Some("Bearer nope")).await.unwrap_err();
        assert_eq!(
            (wrong.status, wrong.reason),
            (StatusCode::UNAUTHORIZED, "rejected_token")
        );
        let missing = access.check(None).await.unwrap_err();
        assert_eq!(missing.reason, "missing_token");
        assert_eq!(OperatorAccess::Open.check(None).await, Ok(()));
    }
}
