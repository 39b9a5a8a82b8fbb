//! Who may call what on the gRPC API (IngestEvents, LookupRoute,
//! GetPodScores, SetPolicies) and `GET /snapshot`.
//!
//! Three modes. **Open** (no flag): every caller may do everything — the
//! local fleet and tests, logged as such at start. **Static** (local):
//! callers present one shared token and may do everything. **Kubernetes**:
//! callers present a service-account token bound to `--api-audience`,
//! checked with a TokenReview, and then:
//!
//! * IngestEvents only with a *pod-bound* token (a projected token names its
//!   pod), only for the tenant that is the pod's namespace, and only as the
//!   replica that is the pod: a subscriber speaks for its own engine and
//!   nothing else.
//! * SetPolicies only from `--api-admin` identities (the controller).
//! * LookupRoute / GetPodScores for tenant T if the caller may `get`
//!   `routes.inferencecache.io` in namespace T (SubjectAccessReview), or is
//!   an admin.
//! * `/snapshot` if the caller may `list` `routes.inferencecache.io`
//!   cluster-wide, or is an admin.
//!
//! Reviews and decisions are cached for a minute, so a steady caller costs
//! the API server nothing per request.

use crate::auth::{
    Access, AccessReviewer, AuthError, POD_NAME_CLAIM, ReviewedUser, TokenReviewer, bearer,
    same_secret,
};

/// The API group of the virtual resource routes are authorized on.
pub const ROUTES_GROUP: &str = "inferencecache.io";
/// The virtual resource: `get` in a namespace reads its routing hints,
/// `list` cluster-wide reads `/snapshot`.
pub const ROUTES_RESOURCE: &str = "routes";

const SA_PREFIX: &str = "system:serviceaccount:";

/// Why a call was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Denied {
    /// No usable credentials.
    #[error("{0}")]
    Unauthenticated(String),
    /// Authenticated, not allowed.
    #[error("{0}")]
    PermissionDenied(String),
    /// The API server could not be asked.
    #[error("cannot check access with the Kubernetes API: {0}")]
    Unavailable(String),
}

impl Denied {
    /// Metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Unauthenticated(_) => "unauthenticated",
            Self::PermissionDenied(_) => "permission_denied",
            Self::Unavailable(_) => "unavailable",
        }
    }

    /// The gRPC status.
    pub fn to_status(&self) -> tonic::Status {
        match self {
            Self::Unauthenticated(m) => tonic::Status::unauthenticated(m.clone()),
            Self::PermissionDenied(m) => tonic::Status::permission_denied(m.clone()),
            Self::Unavailable(_) => tonic::Status::unavailable(self.to_string()),
        }
    }
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Open or static mode: may do everything.
    Unrestricted,
    /// A Kubernetes identity.
    User {
        /// What the TokenReview said.
        user: ReviewedUser,
        /// Listed in `--api-admin`.
        admin: bool,
    },
}

impl Caller {
    /// The name streams are counted under per client: the pod a
    /// pod-bound token names (every engine pod of a service account gets
    /// its own share), else the identity; `None` for unrestricted callers
    /// (anonymous or static-token), which are counted by peer address.
    pub fn client_key(&self) -> Option<String> {
        match self {
            Self::Unrestricted => None,
            Self::User { user, .. } => Some(
                match (
                    service_account(&user.username),
                    user.extra.get(POD_NAME_CLAIM).and_then(|v| v.first()),
                ) {
                    (Some((namespace, _)), Some(pod)) => format!("pod:{namespace}/{pod}"),
                    _ => format!("user:{}", user.username),
                },
            ),
        }
    }

    fn unrestricted_or_admin(&self) -> bool {
        matches!(self, Self::Unrestricted | Self::User { admin: true, .. })
    }
}

/// The service account's namespace and name, from its username.
pub fn service_account(username: &str) -> Option<(&str, &str)> {
    username.strip_prefix(SA_PREFIX)?.split_once(':')
}

/// The bearer token of an `authorization` value.
fn token_of(authorization: Option<&str>) -> Result<&str, Denied> {
    bearer(authorization).ok_or_else(|| {
        Denied::Unauthenticated("missing bearer token: send 'authorization: Bearer <token>'".into())
    })
}

/// Static-token mode: the caller presents `expected`.
fn static_caller(expected: &str, authorization: Option<&str>) -> Result<Caller, Denied> {
    if same_secret(token_of(authorization)?.as_bytes(), expected.as_bytes()) {
        Ok(Caller::Unrestricted)
    } else {
        Err(Denied::Unauthenticated(
            "bearer token rejected: does not match the configured token".into(),
        ))
    }
}

/// Whether a pod-bound service-account token may report `replica_id` in
/// `tenant` (pure, so every refusal is a unit test).
pub fn may_ingest(user: &ReviewedUser, tenant: &str, replica_id: &str) -> Result<(), Denied> {
    let Some((namespace, _)) = service_account(&user.username) else {
        return Err(Denied::PermissionDenied(format!(
            "IngestEvents: {:?} is not a service account; only the subscriber in an engine pod \
             may report that pod's cache",
            user.username
        )));
    };
    let Some(pod) = user.extra.get(POD_NAME_CLAIM).and_then(|v| v.first()) else {
        return Err(Denied::PermissionDenied(format!(
            "IngestEvents: the token of {:?} is not bound to a pod; present a projected \
             service-account token",
            user.username
        )));
    };
    if tenant != namespace {
        return Err(Denied::PermissionDenied(format!(
            "replica.scope.tenant: {tenant:?} is not the caller's namespace {namespace:?}"
        )));
    }
    if replica_id != pod {
        return Err(Denied::PermissionDenied(format!(
            "replica.replica_id: {replica_id:?} is not the caller's pod {pod:?}"
        )));
    }
    Ok(())
}

/// How the gRPC API and `/snapshot` check callers.
#[derive(Debug)]
pub enum ApiAccess {
    /// Anyone may do anything.
    Open,
    /// Callers present this token.
    Static(String),
    /// Kubernetes identities, as the module documentation says.
    Kubernetes(Box<KubeAccess>),
}

/// Kubernetes mode's token reviewer, admins and access reviews.
#[derive(Debug)]
pub struct KubeAccess {
    reviewer: TokenReviewer,
    admins: Vec<String>,
    access: AccessReviewer,
}

impl KubeAccess {
    /// Tokens checked by `reviewer`; `admins` may set policies and read
    /// everything.
    pub fn new(reviewer: TokenReviewer, admins: Vec<String>) -> Self {
        let access = AccessReviewer::new(reviewer.client().clone());
        Self {
            reviewer,
            admins,
            access,
        }
    }

    /// Whether `user` may `verb` routes in `namespace` ("" = cluster-wide).
    async fn allowed(
        &self,
        user: &ReviewedUser,
        verb: &'static str,
        namespace: &str,
    ) -> Result<bool, Denied> {
        let access = Access {
            group: ROUTES_GROUP,
            resource: ROUTES_RESOURCE,
            subresource: "",
            verb,
            namespace,
        };
        self.access
            .allowed(user, access)
            .await
            .map_err(|e| match e {
                AuthError::Unavailable(e) => Denied::Unavailable(e),
                other => Denied::Unavailable(other.to_string()),
            })
    }
}

impl ApiAccess {
    /// Whether anyone may do anything (for the start-up log).
    pub fn mode(&self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Static(_) => "static_token",
            Self::Kubernetes(_) => "kubernetes",
        }
    }

    /// Who the caller is, from its `authorization` value.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, Denied> {
        match self {
            Self::Open => Ok(Caller::Unrestricted),
            Self::Static(expected) => static_caller(expected, authorization),
            Self::Kubernetes(k) => match k.reviewer.review(token_of(authorization)?).await {
                Ok(user) => {
                    let admin = k.admins.contains(&user.username);
                    Ok(Caller::User { user, admin })
                }
                Err(AuthError::Unavailable(e)) => Err(Denied::Unavailable(e)),
                Err(e) => Err(Denied::Unauthenticated(e.to_string())),
            },
        }
    }

    /// [`Self::authenticate`] when it needs no review, as in open and
    /// static-token modes (`None` in Kubernetes mode, which asks the API
    /// server): a handler then answers without waiting.
    pub fn authenticate_now(&self, authorization: Option<&str>) -> Option<Result<Caller, Denied>> {
        match self {
            Self::Open => Some(Ok(Caller::Unrestricted)),
            Self::Static(expected) => Some(static_caller(expected, authorization)),
            Self::Kubernetes(_) => None,
        }
    }

    /// IngestEvents for `replica_id` in `tenant`.
    pub fn authorize_ingest(caller: &Caller, tenant: &str, replica_id: &str) -> Result<(), Denied> {
        match caller {
            Caller::Unrestricted => Ok(()),
            Caller::User { user, .. } => may_ingest(user, tenant, replica_id),
        }
    }

    /// SetPolicies.
    pub fn authorize_set_policies(caller: &Caller) -> Result<(), Denied> {
        if caller.unrestricted_or_admin() {
            return Ok(());
        }
        Err(Denied::PermissionDenied(
            "SetPolicies: only the controller (an --api-admin identity) may push policies".into(),
        ))
    }

    /// LookupRoute / GetPodScores for `tenant`.
    pub async fn authorize_lookup(&self, caller: &Caller, tenant: &str) -> Result<(), Denied> {
        self.authorize_routes(caller, "get", tenant).await
    }

    /// `GET /snapshot`.
    pub async fn authorize_snapshot(&self, caller: &Caller) -> Result<(), Denied> {
        self.authorize_routes(caller, "list", "").await
    }

    async fn authorize_routes(
        &self,
        caller: &Caller,
        verb: &'static str,
        namespace: &str,
    ) -> Result<(), Denied> {
        if caller.unrestricted_or_admin() {
            return Ok(());
        }
        let (Self::Kubernetes(k), Caller::User { user, .. }) = (self, caller) else {
            return Ok(());
        };
        if k.allowed(user, verb, namespace).await? {
            return Ok(());
        }
        let scope = if namespace.is_empty() {
            "cluster-wide".to_owned()
        } else {
            format!("in namespace {namespace:?}")
        };
        Err(Denied::PermissionDenied(format!(
            "{:?} may not {verb} {ROUTES_RESOURCE}.{ROUTES_GROUP} {scope}",
            user.username
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(namespace: &str, name: &str, pod: Option<&str>) -> ReviewedUser {
        ReviewedUser {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            extra: pod
                .map(|p| (POD_NAME_CLAIM.to_owned(), vec![p.to_owned()]))
                .into_iter()
                .collect(),
            ..ReviewedUser::default()
        }
    }

    #[test]
    fn a_subscriber_reports_only_its_own_pod_in_its_own_namespace() {
        let me = sa("team-a", "default", Some("vllm-0"));
        assert_eq!(may_ingest(&me, "team-a", "vllm-0"), Ok(()));
        let other_tenant = may_ingest(&me, "kube-system", "vllm-0").unwrap_err();
        assert!(other_tenant.to_string().contains("replica.scope.tenant"));
        let other_pod = may_ingest(&me, "team-a", "vllm-1").unwrap_err();
        assert!(other_pod.to_string().contains("replica.replica_id"));
        let unbound = may_ingest(&sa("team-a", "default", None), "team-a", "vllm-0").unwrap_err();
        assert!(unbound.to_string().contains("not bound to a pod"));
        let person = ReviewedUser {
            username: "alice".into(),
            ..ReviewedUser::default()
        };
        assert!(matches!(
            may_ingest(&person, "team-a", "vllm-0"),
            Err(Denied::PermissionDenied(_))
        ));
    }

    #[test]
    fn only_admins_and_unrestricted_callers_set_policies() {
        assert_eq!(
            ApiAccess::authorize_set_policies(&Caller::Unrestricted),
            Ok(())
        );
        let admin = Caller::User {
            user: sa("ic", "controller", None),
            admin: true,
        };
        assert_eq!(ApiAccess::authorize_set_policies(&admin), Ok(()));
        let engine = Caller::User {
            user: sa("team-a", "default", Some("vllm-0")),
            admin: false,
        };
        assert!(ApiAccess::authorize_set_policies(&engine).is_err());
    }

    #[test]
    fn streams_are_counted_per_pod_not_per_service_account() {
        let pod = |name| Caller::User {
            user: sa("team-a", "default", Some(name)),
            admin: false,
        };
        assert_eq!(pod("vllm-0").client_key().unwrap(), "pod:team-a/vllm-0");
        assert_ne!(pod("vllm-0").client_key(), pod("vllm-1").client_key());
        let unbound = Caller::User {
            user: sa("team-a", "default", None),
            admin: false,
        };
        assert_eq!(
            unbound.client_key().unwrap(),
            "user:system:serviceaccount:team-a:default"
        );
        assert_eq!(Caller::Unrestricted.client_key(), None);
    }

    #[test]
    fn service_account_names_parse() {
        assert_eq!(
            service_account("system:serviceaccount:ns:name"),
            Some(("ns", "name"))
        );
        assert_eq!(service_account("system:node:x"), None);
        assert_eq!(service_account("alice"), None);
    }

    #[tokio::test]
    async fn static_mode_needs_the_token() {
        let access = ApiAccess::Static("s3cret".into());
        assert_eq!(
            access.authenticate(Some("Bearer s3cret")).await,
            Ok(Caller::Unrestricted)
        );
        assert!(matches!(
            access.authenticate(Some("Bearer nope")).await,
            Err(Denied::Unauthenticated(_))
        ));
        assert!(matches!(
            access.authenticate(None).await,
            Err(Denied::Unauthenticated(_))
        ));
        assert_eq!(
            ApiAccess::Open.authenticate(None).await,
            Ok(Caller::Unrestricted)
        );
    }

    #[tokio::test]
    async fn open_and_static_modes_decide_at_once_what_they_decide_awaited() {
        for access in [ApiAccess::Open, ApiAccess::Static("s3cret".into())] {
            for authorization in [
                Some("Bearer s3cret"),
                Some("Bearer nope"),
                Some("s3cret"),
                None,
            ] {
                assert_eq!(
                    access.authenticate_now(authorization),
                    Some(access.authenticate(authorization).await),
                    "{} {authorization:?}",
                    access.mode()
                );
            }
        }
    }
}
