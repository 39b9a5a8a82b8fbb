//! Provider bindings: the structured `{protocol, endpoint}` a storage
//! provider hands the engine adapter, and the provider-specific endpoint
//! shape rules shared by admission and pod wiring.
//!
//! Managed ownership binds to `status.endpoint` (the controller-observed
//! Service address); External binds to the trimmed `spec.remoteStorage.endpoint`
//! with no fallback to a stale status. No remoteStorage means host-only
//! (`None`).

use ic_api::CacheBackend;
use ic_api::cachebackend::{Ownership, StorageProvider};

/// Wire protocol of a binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// LMCache server (`lm://`).
    Lm,
    /// Redis (`redis://`).
    Resp,
    /// Mooncake store (`mooncakestore://`).
    MooncakeStore,
}

impl Protocol {
    /// The protocol a provider speaks.
    pub fn of(provider: StorageProvider) -> Self {
        match provider {
            StorageProvider::LMCacheServer => Self::Lm,
            StorageProvider::Redis => Self::Resp,
            StorageProvider::Mooncake => Self::MooncakeStore,
        }
    }

    /// URL scheme used in `LMCACHE_REMOTE_URL` / `--l2-adapter`.
    pub fn scheme(self) -> &'static str {
        match self {
            Self::Lm => "lm",
            Self::Resp => "redis",
            Self::MooncakeStore => "mooncakestore",
        }
    }

    /// Stable name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lm => "lm",
            Self::Resp => "resp",
            Self::MooncakeStore => "mooncakestore",
        }
    }
}

/// A resolved remote binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// Wire protocol.
    pub protocol: Protocol,
    /// `host:port` (IPv6 bracketed), scheme stripped.
    pub endpoint: String,
}

impl Binding {
    /// `<scheme>://host:port`.
    pub fn url(&self) -> String {
        format!("{}://{}", self.protocol.scheme(), self.endpoint)
    }

    /// The host as written in the endpoint (IPv6 keeps its brackets).
    pub fn host(&self) -> &str {
        self.endpoint
            .rsplit_once(':')
            .map_or(self.endpoint.as_str(), |(host, _)| host)
    }

    /// The host as a bare name or address (IPv6 without brackets), the form
    /// JSON configs that take `host` and `port` apart expect.
    pub fn bare_host(&self) -> &str {
        let host = self.host();
        host.strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
    }

    /// The port ([`parse_endpoint`] guarantees one in 1-65535).
    pub fn port(&self) -> u16 {
        self.endpoint
            .rsplit_once(':')
            .and_then(|(_, port)| port.parse().ok())
            .unwrap_or_default()
    }
}

/// Why a required binding could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    /// Managed without status.endpoint yet, or External without an endpoint.
    #[error("remote storage endpoint is not known yet")]
    Missing,
    /// The endpoint fails the provider's shape rules.
    #[error("remote storage endpoint is invalid: {0}")]
    Invalid(String),
}

/// The scheme a provider's endpoint may carry, if any.
fn own_scheme(provider: StorageProvider) -> Option<&'static str> {
    match provider {
        StorageProvider::LMCacheServer => Some("lm"),
        StorageProvider::Mooncake => Some("mooncakestore"),
        StorageProvider::Redis => None,
    }
}

/// Validates `raw` (already trimmed) for `provider` and returns the bare
/// `host:port`. Rules: an optional scheme that must be the provider's own,
/// no whitespace, no path/query/fragment/userinfo, bracketed IPv6, numeric
/// port 1-65535.
pub fn parse_endpoint(provider: StorageProvider, raw: &str) -> Result<String, String> {
    if raw.is_empty() {
        return Err("endpoint is empty".into());
    }
    if raw.chars().any(char::is_whitespace) {
        return Err("must not contain whitespace".into());
    }
    let rest = match raw.split_once("://") {
        Some((scheme, rest)) => {
            match own_scheme(provider) {
                Some(own) if own == scheme => {}
                Some(own) => {
                    return Err(format!(
                        "scheme {scheme:?} is not accepted for provider {provider:?}: use host:port or {own}://host:port"
                    ));
                }
                None => {
                    return Err(format!(
                        "scheme {scheme:?} is not accepted for provider {provider:?}: use bare host:port"
                    ));
                }
            }
            rest
        }
        None => raw,
    };
    if rest.contains(['/', '?', '#']) {
        return Err("must be host:port without a path, query or fragment".into());
    }
    if rest.contains('@') {
        return Err("must not carry user information".into());
    }
    let (host, port) = if let Some(after) = rest.strip_prefix('[') {
        let Some((v6, tail)) = after.split_once(']') else {
            return Err("unterminated IPv6 bracket".into());
        };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("{v6:?} is not an IPv6 address"));
        }
        let Some(port) = tail.strip_prefix(':') else {
            return Err("a numeric port (1-65535) is required".into());
        };
        (&rest[..v6.len() + 2], port)
    } else {
        let Some((host, port)) = rest.rsplit_once(':') else {
            return Err("a numeric port (1-65535) is required".into());
        };
        if host.contains(':') {
            return Err("IPv6 addresses must be bracketed, e.g. [::1]:6379".into());
        }
        (host, port)
    };
    if host.is_empty() {
        return Err("host is empty".into());
    }
    // The endpoint ends up in engine env and a worker's shell command line,
    // so only hostname/IP characters are allowed.
    let plain_host = host.starts_with('[')
        || host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !plain_host {
        return Err(format!(
            "host {host:?} contains characters not allowed in a hostname"
        ));
    }
    let valid_port = !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
    if !valid_port {
        return Err(format!("port {port:?} must be a number in 1-65535"));
    }
    Ok(format!("{host}:{port}"))
}

/// The binding `backend` asks for: `Ok(None)` for host-only.
pub fn resolve(backend: &CacheBackend) -> Result<Option<Binding>, BindingError> {
    let Some(rs) = &backend.spec.remote_storage else {
        return Ok(None);
    };
    let raw = match rs.ownership {
        Ownership::Managed => backend
            .status
            .as_ref()
            .and_then(|s| s.endpoint.as_deref())
            .map(str::trim)
            .filter(|e| !e.is_empty()),
        Ownership::External => ic_api::validate::trimmed_endpoint(&backend.spec),
    };
    let raw = raw.ok_or(BindingError::Missing)?;
    let endpoint = parse_endpoint(rs.provider, raw).map_err(BindingError::Invalid)?;
    Ok(Some(Binding {
        protocol: Protocol::of(rs.provider),
        endpoint,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_of_an_endpoint() {
        let v4 = Binding {
            protocol: Protocol::Resp,
            endpoint: "r.ns.svc:6379".into(),
        };
        assert_eq!(
            (v4.host(), v4.bare_host(), v4.port()),
            ("r.ns.svc", "r.ns.svc", 6379)
        );
        let v6 = Binding {
            protocol: Protocol::MooncakeStore,
            endpoint: "[fd00::1]:50051".into(),
        };
        assert_eq!(
            (v6.host(), v6.bare_host(), v6.port()),
            ("[fd00::1]", "fd00::1", 50051)
        );
    }

    #[test]
    fn shapes_per_provider() {
        use StorageProvider::*;
        assert_eq!(parse_endpoint(Redis, "r:6379").as_deref(), Ok("r:6379"));
        assert!(parse_endpoint(Redis, "redis://r:6379").is_err());
        assert!(parse_endpoint(Redis, "lm://r:6379").is_err());
        assert_eq!(
            parse_endpoint(LMCacheServer, "lm://s.ns.svc:65432").as_deref(),
            Ok("s.ns.svc:65432")
        );
        assert!(parse_endpoint(LMCacheServer, "mooncakestore://s:1").is_err());
        assert_eq!(
            parse_endpoint(Mooncake, "mooncakestore://m:50051").as_deref(),
            Ok("m:50051")
        );
        assert_eq!(
            parse_endpoint(Mooncake, "[fd00::1]:50051").as_deref(),
            Ok("[fd00::1]:50051")
        );
        for bad in [
            "host",
            "host:",
            "host:0",
            "host:65536",
            "host:+1",
            ":80",
            "fd00::1:80",
            "h:80/x",
            "h:80?q",
            "h:80#f",
            "u@h:80",
            "h :80",
            "[zz]:80",
            "[::1]",
            "h;x:80",
            "h'x:80",
        ] {
            assert!(parse_endpoint(Mooncake, bad).is_err(), "{bad}");
        }
    }
}
