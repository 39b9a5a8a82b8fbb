//! The provider-specific shape check of an External endpoint, behind the
//! ExternalEndpointAccepted / Missing / Invalid verdicts.
//!
//! LMCacheServer takes `host:port` or `lm://host:port`; Mooncake `host:port`
//! or `mooncakestore://host:port`; Redis bare `host:port` only. The port is
//! numeric in 1-65535; whitespace, paths, queries and fragments are rejected;
//! an IPv6 host must be bracketed. The shape check itself is the adapters'
//! (`ic_adapters::binding::parse_endpoint`), the one the pod webhook uses, so
//! the controller and the webhook cannot disagree on what is valid.

use ic_api::cachebackend::StorageProvider;

/// Why an endpoint was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// Empty or whitespace only.
    #[error("spec.remoteStorage.endpoint is empty")]
    Missing,
    /// Fails the provider's shape check.
    #[error(
        "spec.remoteStorage.endpoint {endpoint:?} is invalid for provider {provider}: {detail}"
    )]
    Invalid {
        /// The trimmed value.
        endpoint: String,
        /// The provider it was checked for.
        provider: &'static str,
        /// What is wrong.
        detail: String,
    },
}

fn provider_name(p: StorageProvider) -> &'static str {
    match p {
        StorageProvider::Redis => "Redis",
        StorageProvider::LMCacheServer => "LMCacheServer",
        StorageProvider::Mooncake => "Mooncake",
    }
}

/// Validates `raw` for `provider`, returning the trimmed endpoint.
pub fn validate(provider: StorageProvider, raw: Option<&str>) -> Result<String, EndpointError> {
    let endpoint = raw.map(str::trim).unwrap_or_default();
    if endpoint.is_empty() {
        return Err(EndpointError::Missing);
    }
    ic_adapters::binding::parse_endpoint(provider, endpoint).map_err(|detail| {
        EndpointError::Invalid {
            endpoint: endpoint.to_owned(),
            provider: provider_name(provider),
            detail,
        }
    })?;
    Ok(endpoint.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use StorageProvider::*;

    #[test]
    fn shapes_per_provider() {
        assert_eq!(
            validate(Redis, Some(" redis.ns:6379 ")),
            Ok("redis.ns:6379".into())
        );
        assert!(validate(Redis, Some("redis://r:6379")).is_err());
        assert!(validate(LMCacheServer, Some("lm://s:65432")).is_ok());
        assert!(validate(LMCacheServer, Some("mooncakestore://s:1")).is_err());
        assert!(validate(Mooncake, Some("mooncakestore://m:50051")).is_ok());
        assert!(validate(Mooncake, Some("[::1]:50051")).is_ok());
        assert!(validate(Mooncake, Some("::1:50051")).is_err());
        assert_eq!(validate(Redis, Some("   ")), Err(EndpointError::Missing));
        assert_eq!(validate(Redis, None), Err(EndpointError::Missing));
        for bad in ["r", "r:0", "r:65536", "r:x", "r:6379/db", "r :1", ":1"] {
            assert!(validate(Redis, Some(bad)).is_err(), "{bad}");
        }
    }
}
