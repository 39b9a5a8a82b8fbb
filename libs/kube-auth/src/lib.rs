//! Bearer tokens checked the Kubernetes way: a TokenReview against an
//! audience (accepted answers cached for a minute by token digest, refusals
//! for a few seconds, so a flood of garbage tokens costs the API server one
//! review per distinct token per TTL, not one per request), plus the
//! helpers every server that takes bearer tokens shares (header parsing,
//! constant-time comparison of a static token), and SubjectAccessReviews
//! with their answers cached ([`AccessReviewer`]). The index server builds
//! its API and `/probe` rules on it, the coordinator its operator endpoints'.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};

/// How long an accepted token is trusted without asking again.
const REVIEW_CACHE_TTL: Duration = Duration::from_secs(60);
/// Most cached review results (cleared wholesale beyond it).
const REVIEW_CACHE_MAX: usize = 1024;
/// How long a refused token is refused without asking again, by default.
pub const DEFAULT_REFUSAL_CACHE_TTL: Duration = Duration::from_secs(10);
/// Most cached refusals (expired ones dropped, then all, beyond it): a
/// flood of distinct garbage tokens costs at most this many entries.
const REFUSAL_CACHE_MAX: usize = 4096;
/// How long a SubjectAccessReview's answer (either way) is reused.
const DECISION_TTL: Duration = Duration::from_secs(60);
/// Most cached access decisions (cleared wholesale beyond it).
const DECISION_CACHE_MAX: usize = 4096;

/// Why a request was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// Neither a static token nor an audience is configured; the text
    /// names the flags that would enable the endpoint.
    #[error("{0}")]
    Disabled(&'static str),
    /// No `Authorization: Bearer` header.
    #[error("missing bearer token: send 'Authorization: Bearer <token>'")]
    Missing,
    /// The static token did not match, or the API server rejected the token.
    #[error("bearer token rejected: {0}")]
    Rejected(String),
    /// A valid token of an identity the endpoint does not serve.
    #[error("{0}")]
    Forbidden(String),
    /// The API server could not be asked.
    #[error("cannot verify the bearer token with the Kubernetes API: {0}")]
    Unavailable(String),
}

impl AuthError {
    /// Label for the refusal metric.
    pub fn reason(&self) -> &'static str {
        match self {
            AuthError::Disabled(_) => "disabled",
            AuthError::Missing => "missing_token",
            AuthError::Rejected(_) => "rejected_token",
            AuthError::Forbidden(_) => "forbidden_identity",
            AuthError::Unavailable(_) => "review_unavailable",
        }
    }
}

/// Who the API server says a token belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReviewedUser {
    /// `system:serviceaccount:<namespace>:<name>` for service accounts.
    pub username: String,
    /// UID of the user.
    pub uid: String,
    /// Groups (passed on to SubjectAccessReviews).
    pub groups: Vec<String>,
    /// Extra claims; a pod-bound token carries
    /// `authentication.kubernetes.io/pod-name` and `…/pod-uid`.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// The extra claim naming the pod a bound token belongs to.
pub const POD_NAME_CLAIM: &str = "authentication.kubernetes.io/pod-name";

/// Checks tokens with TokenReview, caching accepted ones and (more
/// briefly) refused ones.
pub struct TokenReviewer {
    client: kube::Client,
    audience: String,
    accepted: Mutex<HashMap<[u8; 32], (Instant, ReviewedUser)>>,
    refused: Mutex<HashMap<[u8; 32], (Instant, String)>>,
    refusal_ttl: Duration,
    refusals_cached: prometheus_client::metrics::counter::Counter,
    /// Reviews of tokens neither cache knows, bounded (`None`: unbounded).
    budget: Option<Mutex<ReviewBudget>>,
    throttled: prometheus_client::metrics::counter::Counter,
}

/// A token bucket of TokenReviews: `per_second` refill, up to `burst`.
#[derive(Debug)]
struct ReviewBudget {
    per_second: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl ReviewBudget {
    /// Takes one review if the bucket holds one.
    fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.per_second;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl TokenReviewer {
    /// A reviewer using `client`'s API server.
    pub fn new(client: kube::Client, audience: String) -> Self {
        Self {
            client,
            audience,
            accepted: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            refusal_ttl: DEFAULT_REFUSAL_CACHE_TTL,
            refusals_cached: prometheus_client::metrics::counter::Counter::default(),
            budget: None,
            throttled: prometheus_client::metrics::counter::Counter::default(),
        }
    }

    /// At most `per_second` TokenReviews a second (in bursts of up to
    /// `burst`) for tokens neither cache knows; past it a call is answered
    /// [`AuthError::Unavailable`] without asking, counted in `throttled`.
    /// Without it, every distinct garbage token a caller sends costs the API
    /// server a review. `per_second` 0: unbounded.
    #[must_use]
    pub fn with_review_rate(
        mut self,
        per_second: u32,
        burst: u32,
        throttled: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        self.budget = (per_second > 0).then(|| {
            let burst = f64::from(burst.max(1));
            Mutex::new(ReviewBudget {
                per_second: f64::from(per_second),
                burst,
                tokens: burst,
                at: Instant::now(),
            })
        });
        self.throttled = throttled;
        self
    }

    /// Refusals are reused for `ttl` (zero: never cached), each reuse
    /// counted in `counter`.
    #[must_use]
    pub fn with_refusal_cache(
        mut self,
        ttl: Duration,
        counter: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        self.refusal_ttl = ttl;
        self.refusals_cached = counter;
        self
    }

    /// The API server's client (for SubjectAccessReviews).
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Who `token` is, if the API server accepts it for the audience.
    pub async fn review(&self, token: &str) -> Result<ReviewedUser, AuthError> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some((until, user)) = self.accepted.lock().get(&digest)
            && *until > now
        {
            return Ok(user.clone());
        }
        if let Some((until, why)) = self.refused.lock().get(&digest)
            && *until > now
        {
            self.refusals_cached.inc();
            return Err(AuthError::Rejected(why.clone()));
        }
        if let Some(budget) = &self.budget
            && !budget.lock().take(now)
        {
            self.throttled.inc();
            return Err(AuthError::Unavailable(
                "too many unknown bearer tokens to review at once (--token-reviews-per-second); \
                 retry shortly"
                    .into(),
            ));
        }
        match self.ask(token).await {
            Ok(user) => {
                let mut accepted = self.accepted.lock();
                if accepted.len() >= REVIEW_CACHE_MAX {
                    accepted.clear();
                }
                accepted.insert(digest, (now + REVIEW_CACHE_TTL, user.clone()));
                Ok(user)
            }
            Err(AuthError::Rejected(why)) => {
                // Only the API server's verdict is cached, never its absence.
                if !self.refusal_ttl.is_zero() {
                    let mut refused = self.refused.lock();
                    if refused.len() >= REFUSAL_CACHE_MAX {
                        refused.retain(|_, (until, _)| *until > now);
                        if refused.len() >= REFUSAL_CACHE_MAX {
                            refused.clear();
                        }
                    }
                    refused.insert(digest, (now + self.refusal_ttl, why.clone()));
                }
                Err(AuthError::Rejected(why))
            }
            Err(e) => Err(e),
        }
    }

    async fn ask(&self, token: &str) -> Result<ReviewedUser, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Unavailable(e.to_string()))?;
        let status = answer.status.unwrap_or_default();
        if let Some(error) = status.error.filter(|e| !e.is_empty()) {
            return Err(AuthError::Rejected(error));
        }
        if status.authenticated != Some(true) {
            return Err(AuthError::Rejected("not authenticated".into()));
        }
        // An API server that ignores audiences returns none; one that checked
        // them echoes the intersection.
        if let Some(audiences) = status.audiences
            && !audiences.contains(&self.audience)
        {
            return Err(AuthError::Rejected(format!(
                "token is not valid for audience {:?}",
                self.audience
            )));
        }
        let user = status.user.unwrap_or_default();
        Ok(ReviewedUser {
            username: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default().into_iter().collect(),
        })
    }
}

/// One question for RBAC: may the user `verb` `group/resource[/subresource]`
/// in `namespace` ("" = cluster-wide)?
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Access<'a> {
    /// API group.
    pub group: &'static str,
    /// Resource (plural).
    pub resource: &'static str,
    /// Subresource, or "".
    pub subresource: &'static str,
    /// Verb.
    pub verb: &'static str,
    /// Namespace, or "" for the cluster scope.
    pub namespace: &'a str,
}

/// (username, group, resource, subresource, verb, namespace) of a cached
/// decision.
type DecisionKey = (
    String,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    String,
);

/// Asks the API server SubjectAccessReviews, caching each answer for a
/// minute (refusals too, so a denied caller cannot load the API server).
pub struct AccessReviewer {
    client: kube::Client,
    decisions: Mutex<HashMap<DecisionKey, (Instant, bool)>>,
}

impl std::fmt::Debug for AccessReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessReviewer").finish_non_exhaustive()
    }
}

impl AccessReviewer {
    /// A reviewer using `client`'s API server.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            decisions: Mutex::new(HashMap::new()),
        }
    }

    /// Whether RBAC lets `user` do `access`.
    pub async fn allowed(
        &self,
        user: &ReviewedUser,
        access: Access<'_>,
    ) -> Result<bool, AuthError> {
        let key = (
            user.username.clone(),
            access.group,
            access.resource,
            access.subresource,
            access.verb,
            access.namespace.to_owned(),
        );
        let now = Instant::now();
        if let Some((until, allowed)) = self.decisions.lock().get(&key)
            && *until > now
        {
            return Ok(*allowed);
        }
        let filled = |s: &str| Some(s.to_owned()).filter(|s| !s.is_empty());
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: filled(&user.uid),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone().into_iter().collect()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(access.group.to_owned()),
                    resource: Some(access.resource.to_owned()),
                    subresource: filled(access.subresource),
                    verb: Some(access.verb.to_owned()),
                    namespace: filled(access.namespace),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Unavailable(e.to_string()))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let mut decisions = self.decisions.lock();
        if decisions.len() >= DECISION_CACHE_MAX {
            decisions.clear();
        }
        decisions.insert(key, (now + DECISION_TTL, allowed));
        Ok(allowed)
    }
}

/// Constant-time comparison (the token is a secret).
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    let da = Sha256::digest(a);
    let db = Sha256::digest(b);
    da.iter()
        .zip(db.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y))
        == 0
}

/// The token of an `Authorization` header value, if it is a bearer one.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_review_budget_refills_at_its_rate_up_to_its_burst() {
        let start = Instant::now();
        let mut b = ReviewBudget {
            per_second: 2.0,
            burst: 3.0,
            tokens: 3.0,
            at: start,
        };
        assert!((0..3).all(|_| b.take(start)));
        assert!(!b.take(start));
        // Half a second refills one review.
        assert!(b.take(start + Duration::from_millis(500)));
        assert!(!b.take(start + Duration::from_millis(500)));
        // A long quiet spell refills the burst, not more.
        let later = start + Duration::from_secs(60);
        assert_eq!((0..5).filter(|_| b.take(later)).count(), 3);
    }

    #[test]
    fn parses_bearer_headers() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(Some("Bearer")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn secrets_compare_by_content() {
        assert!(same_secret(b"s3cret", b"s3cret"));
        assert!(!same_secret(b"s3cret", b"s3cre"));
        assert!(!same_secret(b"", b"x"));
    }
}
