//! Which index servers the CachePolicy pusher pushes to.
//!
//! Index-server replicas are all active and each keeps its own policies, so
//! the pusher must reach every one of them, not whichever the load-balanced
//! Service picks. `--index-server-grpc` lists URLs: with `static` discovery
//! each URL is one index server (its host resolved by the connection, as
//! for a Service's virtual IP); with `dns` each URL's host is resolved again
//! every `--index-server-resolve-seconds` and every address it names is an
//! index server of its own (a headless Service), dialled by address while
//! TLS still verifies the URL's host name. The subscriber finds its index
//! servers the same way (`services/kvevent-subscriber/src/discovery.rs`).

use std::collections::BTreeSet;
use std::net::SocketAddr;

/// The flag the URLs come from, named in every error about them.
pub const FLAG: &str = "--index-server-grpc";

/// How the index servers are found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum DiscoveryMode {
    /// Each `--index-server-grpc` URL is one index server.
    #[default]
    Static,
    /// Each URL's host is resolved periodically and every address it names
    /// is an index server (a headless Service).
    Dns,
}

/// One index server: a URL and, with dns discovery, one address its host
/// resolved to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Destination {
    /// The URL as configured (scheme, host for TLS, port).
    pub url: String,
    /// The address dialled instead of the URL's host (dns discovery).
    pub addr: Option<SocketAddr>,
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.addr {
            Some(addr) => write!(f, "{} at {addr}", self.url),
            None => f.write_str(&self.url),
        }
    }
}

/// The `--index-server-grpc` value as a list of URLs: comma-separated,
/// blanks trimmed, duplicates dropped. Empty means no pusher.
pub fn parse_urls(value: &str) -> Result<Vec<String>, String> {
    ic_proto::urls::parse_list(value, FLAG)
}

/// Where the pusher pushes.
#[derive(Clone, Debug)]
pub struct Discovery {
    /// The `--index-server-grpc` URLs.
    pub urls: Vec<String>,
    /// How they become destinations.
    pub mode: DiscoveryMode,
}

/// What one round of discovery found.
#[derive(Debug, Default)]
pub struct Found {
    /// The index servers to push to.
    pub destinations: BTreeSet<Destination>,
    /// One message per URL that could not be resolved.
    pub failures: Vec<String>,
}

impl Discovery {
    /// The destinations now. A URL whose host cannot be resolved keeps the
    /// addresses it had in `previous`: a DNS hiccup must not make the
    /// pusher forget replicas that still hold (and need) the policies.
    pub async fn destinations(&self, previous: &BTreeSet<Destination>) -> Found {
        let mut found = Found::default();
        if self.mode == DiscoveryMode::Static {
            found.destinations = self
                .urls
                .iter()
                .map(|url| Destination {
                    url: url.clone(),
                    addr: None,
                })
                .collect();
            return found;
        }
        let mut seen = BTreeSet::new();
        for url in &self.urls {
            let addrs = match ic_proto::urls::resolve(url, FLAG).await {
                Ok(addrs) => addrs,
                Err(error) => {
                    found.failures.push(format!("{FLAG} {url}: {error}"));
                    previous
                        .iter()
                        .filter(|d| &d.url == url)
                        .filter_map(|d| d.addr)
                        .collect()
                }
            };
            // An address named by several URLs is pushed to once, under
            // the first.
            for addr in addrs {
                if seen.insert(addr) {
                    found.destinations.insert(Destination {
                        url: url.clone(),
                        addr: Some(addr),
                    });
                }
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn urls_are_split_trimmed_and_deduplicated() {
        assert_eq!(
            parse_urls(" http://a:9090, https://b:9090 ,,http://a:9090").unwrap(),
            vec!["http://a:9090".to_owned(), "https://b:9090".to_owned()]
        );
        assert!(parse_urls(" , ").unwrap().is_empty());
        let err = parse_urls("http://:9090").unwrap_err();
        assert!(err.starts_with("--index-server-grpc http://:9090"), "{err}");
        let err = parse_urls("index:9090").unwrap_err();
        assert!(err.contains("--index-server-grpc index:9090"), "{err}");
    }

    #[tokio::test]
    async fn static_discovery_takes_each_url_as_it_is() {
        let discovery = Discovery {
            urls: vec!["http://a:1".into(), "http://b:2".into()],
            mode: DiscoveryMode::Static,
        };
        let found = discovery.destinations(&BTreeSet::new()).await;
        assert!(found.failures.is_empty());
        let urls: Vec<(&str, Option<SocketAddr>)> = found
            .destinations
            .iter()
            .map(|d| (d.url.as_str(), d.addr))
            .collect();
        assert_eq!(urls, vec![("http://a:1", None), ("http://b:2", None)]);
    }

    #[tokio::test]
    async fn dns_discovery_yields_every_address_of_every_url_once() {
        let discovery = Discovery {
            urls: vec![
                "http://localhost:9090".into(),
                "http://127.0.0.1:9090".into(),
                "https://127.0.0.2:9443".into(),
            ],
            mode: DiscoveryMode::Dns,
        };
        let found = discovery.destinations(&BTreeSet::new()).await;
        assert!(found.failures.is_empty(), "{:?}", found.failures);
        let localhost: Vec<SocketAddr> = found
            .destinations
            .iter()
            .filter(|d| d.url == "http://localhost:9090")
            .map(|d| d.addr.unwrap())
            .collect();
        assert!(!localhost.is_empty());
        assert!(
            localhost
                .iter()
                .all(|a| a.port() == 9090 && a.ip().is_loopback()),
            "{localhost:?}"
        );
        let loopback: SocketAddr = "127.0.0.1:9090".parse().unwrap();
        // 127.0.0.1:9090 appears once, whichever URL named it first.
        assert_eq!(
            found
                .destinations
                .iter()
                .filter(|d| d.addr == Some(loopback))
                .count(),
            1
        );
        assert!(found.destinations.contains(&Destination {
            url: "https://127.0.0.2:9443".into(),
            addr: Some("127.0.0.2:9443".parse().unwrap()),
        }));
        assert_eq!(
            found.destinations.len(),
            localhost.len() + 1 + usize::from(!localhost.contains(&loopback))
        );
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_keeps_its_previous_addresses() {
        // `.invalid` never resolves (RFC 6761).
        let url = "http://index.invalid:9090";
        let discovery = Discovery {
            urls: vec![url.into()],
            mode: DiscoveryMode::Dns,
        };
        let found = discovery.destinations(&BTreeSet::new()).await;
        assert!(found.destinations.is_empty());
        assert_eq!(found.failures.len(), 1);
        assert!(
            found.failures[0].starts_with("--index-server-grpc http://index.invalid:9090"),
            "{:?}",
            found.failures
        );
        let known = Destination {
            url: url.into(),
            addr: Some("127.0.0.1:9090".parse().unwrap()),
        };
        let found = discovery
            .destinations(&BTreeSet::from([known.clone()]))
            .await;
        assert_eq!(found.destinations, BTreeSet::from([known]));
        assert_eq!(found.failures.len(), 1);
    }
}
