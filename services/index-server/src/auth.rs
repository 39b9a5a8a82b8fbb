//! `POST /probe`'s authentication, on the shared bearer-token checks
//! ([`ic_kube_auth`], re-exported here): in a cluster the caller (the
//! controller) presents a projected service-account token bound to an
//! audience, checked by TokenReview, and must be one of the identities
//! `--probe-allowed-identity` names (the audience alone is not enough: the
//! chart gives the subscribers the same one); locally a static token is
//! compared.
//! With neither configured `/probe` is disabled rather than open.
//! [`crate::access`] builds the gRPC API's and `/snapshot`'s rules on the
//! same reviewer.

pub use ic_kube_auth::*;

/// Why `/probe` refuses everything.
pub const PROBE_DISABLED: AuthError = AuthError::Disabled(
    "/probe is disabled: start the index server with --probe-audience (in a cluster) or \
     --probe-static-token (local)",
);

/// How `/probe` callers are authenticated.
#[derive(Debug)]
pub enum ProbeAuth {
    /// `/probe` refuses everything.
    Disabled,
    /// Callers present this token.
    Static(String),
    /// Callers present a token the API server accepts for an audience,
    /// of one of the `allowed` identities (TokenReview usernames).
    TokenReview {
        /// Checks the tokens.
        reviewer: Box<TokenReviewer>,
        /// Usernames that may call `/probe` (the controller's).
        allowed: Vec<String>,
    },
}

impl ProbeAuth {
    /// Authenticates a request by its `Authorization` header.
    pub async fn check(&self, authorization: Option<&str>) -> Result<(), AuthError> {
        if matches!(self, ProbeAuth::Disabled) {
            return Err(PROBE_DISABLED);
        }
        let token = bearer(authorization).ok_or(AuthError::Missing)?;
        match self {
            ProbeAuth::Disabled => Err(PROBE_DISABLED),
            ProbeAuth::Static(expected) => {
                if same_secret(token.as_bytes(), expected.as_bytes()) {
                    Ok(())
                } else {
                    Err(AuthError::Rejected(
                        "does not match the configured token".into(),
                    ))
                }
            }
            ProbeAuth::TokenReview { reviewer, allowed } => {
                let user = reviewer.review(token).await?;
                if allowed.contains(&user.username) {
                    Ok(())
                } else {
                    Err(AuthError::Forbidden(format!(
                        "/probe: {:?} is not an identity --probe-allowed-identity names (the \
                         controller's service account)",
                        user.username
                    )))
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn static_token() {
        let auth = ProbeAuth::Static("s3cret".into());
        assert_eq!(auth.check(Some("Bearer s3cret")).await, Ok(()));
        assert!(matches!(
            auth.check(Some("Bearer wrong")).await,
            Err(AuthError::Rejected(_))
        ));
        assert_eq!(auth.check(None).await, Err(AuthError::Missing));
        assert_eq!(
            ProbeAuth::Disabled.check(Some("Bearer s3cret")).await,
            Err(PROBE_DISABLED)
        );
    }
}
