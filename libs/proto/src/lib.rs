//! The `inferencecache.index.v1` gRPC contract, generated from
//! `proto/inferencecache/index/v1/index.proto` at build time.
//!
//! The `.proto` file is the source of truth and documents every message and
//! field; this crate re-exports the generated types and holds the one set of
//! conversions between them and the domain vocabulary ([`tier`]).

#![allow(missing_docs, unreachable_pub, clippy::all)]

/// `inferencecache.index.v1`: LookupRoute, IngestEvents, SetPolicies.
pub mod index_v1 {
    tonic::include_proto!("inferencecache.index.v1");
    // Hand-written (build.rs maps the message to it); named here as the
    // generated one was.
    pub use crate::packed::BlockHashes;
    pub use crate::score::CandidateScore;
}

pub mod packed;
pub mod score;

/// `indexer.v1`: llm-d's remote indexer API (GetPodScores), byte-compatible
/// with llm-d-kv-cache's `indexer.proto`.
pub mod llmd_indexer_v1 {
    tonic::include_proto!("indexer.v1");
}

pub use index_v1::index_service_client::IndexServiceClient;
pub use index_v1::index_service_server::{IndexService, IndexServiceServer};

/// Bearer tokens on calls to the index server (its access control reads
/// `authorization: Bearer <token>`).
pub mod bearer {
    /// The `authorization` metadata value for `token`; `None` when it
    /// cannot be a header value.
    pub fn metadata(token: &str) -> Option<tonic::metadata::AsciiMetadataValue> {
        format!("Bearer {}", token.trim()).parse().ok()
    }
}

/// Channels to the index server: plaintext for `http://` URLs, TLS
/// trusting only the given CA for `https://` ones.
pub mod channel {
    use std::time::Duration;

    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

    /// An endpoint for `url`; `ca_pem` is the CA bundle an `https://`
    /// server must chain to (required there, refused for `http://`).
    /// Errors name `flag`, the option the URL came from.
    pub fn endpoint(url: &str, ca_pem: Option<&[u8]>, flag: &str) -> Result<Endpoint, String> {
        endpoint_at(url, None, ca_pem, flag)
    }

    /// Like [`endpoint`], but connecting to `addr` (one address the URL's
    /// host resolved to, such as one pod behind a headless Service) while
    /// TLS still verifies the certificate against the URL's host name.
    pub fn endpoint_at(
        url: &str,
        addr: Option<std::net::SocketAddr>,
        ca_pem: Option<&[u8]>,
        flag: &str,
    ) -> Result<Endpoint, String> {
        let uri: tonic::codegen::http::Uri =
            url.parse().map_err(|e| format!("{flag} {url}: {e}"))?;
        let host = uri.host().unwrap_or_default().to_owned();
        let target = match addr {
            Some(addr) => format!("{}://{addr}", uri.scheme_str().unwrap_or("http")),
            None => url.to_owned(),
        };
        let endpoint = Endpoint::from_shared(target)
            .map_err(|e| format!("{flag} {url}: {e}"))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        match (url.starts_with("https://"), ca_pem) {
            (true, Some(pem)) => endpoint
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(pem))
                        .domain_name(host.trim_start_matches('[').trim_end_matches(']')),
                )
                .map_err(|e| format!("{flag} {url}: {e}")),
            (true, None) => Err(format!(
                "{flag} {url}: an https:// index server needs its CA bundle (the --*-ca-file flag)"
            )),
            (false, Some(_)) => Err(format!(
                "{flag} {url}: a CA bundle is set but the URL is not https://"
            )),
            (false, None) => Ok(endpoint),
        }
    }
}

/// Index-server URLs as the subscriber and the controller take them: a
/// comma-separated list, each URL resolved to every address its host names
/// when the index servers sit behind a headless Service.
pub mod urls {
    use std::net::SocketAddr;

    /// `value` as a list of URLs: comma-separated, blanks trimmed,
    /// duplicates dropped (possibly empty). Errors name `flag`.
    pub fn parse_list(value: &str, flag: &str) -> Result<Vec<String>, String> {
        let mut urls: Vec<String> = Vec::new();
        for url in value.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            host_port(url, flag)?;
            if !urls.iter().any(|u| u == url) {
                urls.push(url.to_owned());
            }
        }
        Ok(urls)
    }

    /// The host and port `url` names (the scheme's port when it names
    /// none); only `http://` and `https://` URLs. Errors name `flag`.
    pub fn host_port(url: &str, flag: &str) -> Result<(String, u16), String> {
        let uri: tonic::codegen::http::Uri =
            url.parse().map_err(|e| format!("{flag} {url}: {e}"))?;
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("{flag} {url}: no host"))?;
        let port = match (uri.port_u16(), uri.scheme_str()) {
            (Some(port), Some("http" | "https")) => port,
            (None, Some("https")) => 443,
            (None, Some("http")) => 80,
            _ => return Err(format!("{flag} {url}: expected http:// or https://")),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Ok((host.to_owned(), port))
    }

    /// Every address `url`'s host names, IPv4 and IPv6 alike (at least one).
    pub async fn resolve(url: &str, flag: &str) -> Result<Vec<SocketAddr>, String> {
        let (host, port) = host_port(url, flag)?;
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
            .await
            .map_err(|e| format!("resolving {host}: {e}"))?
            .collect();
        if addrs.is_empty() {
            return Err(format!("{host} has no address"));
        }
        Ok(addrs)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn lists_are_split_trimmed_and_deduplicated() {
            assert_eq!(
                parse_list(" http://a:9090, https://b:9090 ,,http://a:9090", "--f").unwrap(),
                vec!["http://a:9090".to_owned(), "https://b:9090".to_owned()]
            );
            assert!(parse_list(" , ", "--f").unwrap().is_empty());
            let err = parse_list("http://:9090", "--f").unwrap_err();
            assert!(err.starts_with("--f http://:9090"), "{err}");
            let err = parse_list("index:9090", "--f").unwrap_err();
            assert!(err.contains("--f index:9090"), "{err}");
        }

        #[test]
        fn the_port_defaults_to_the_scheme() {
            assert_eq!(
                host_port("https://idx", "--f").unwrap(),
                ("idx".into(), 443)
            );
            assert_eq!(host_port("http://idx", "--f").unwrap(), ("idx".into(), 80));
            assert_eq!(
                host_port("http://[::1]:9090", "--f").unwrap(),
                ("::1".into(), 9090)
            );
        }

        #[tokio::test]
        async fn a_name_resolves_to_every_address() {
            let addrs = resolve("http://localhost:9090", "--f").await.unwrap();
            assert!(!addrs.is_empty());
            assert!(
                addrs
                    .iter()
                    .all(|a| a.port() == 9090 && a.ip().is_loopback())
            );
            let addrs = resolve("http://127.0.0.1:1", "--f").await.unwrap();
            assert_eq!(addrs, vec!["127.0.0.1:1".parse().unwrap()]);
        }
    }
}

/// The cache tier between the domain ([`ic_kvevents::Tier`], which the
/// index re-exports) and the protobuf contract.
pub mod tier {
    use super::index_v1 as pb;
    use ic_kvevents::Tier;

    /// A domain tier in the protobuf contract.
    pub fn to_pb(tier: Tier) -> i32 {
        match tier {
            Tier::T1 => pb::Tier::T1 as i32,
            Tier::T2 => pb::Tier::T2 as i32,
        }
    }

    /// A protobuf tier, `None` when unspecified or unknown.
    pub fn from_pb(tier: i32) -> Option<Tier> {
        match pb::Tier::try_from(tier) {
            Ok(pb::Tier::T1) => Some(Tier::T1),
            Ok(pb::Tier::T2) => Some(Tier::T2),
            _ => None,
        }
    }
}
