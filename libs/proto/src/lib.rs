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
}

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
