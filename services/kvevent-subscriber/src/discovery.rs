//! Which index servers the changes go to, and one forwarder for each.
//!
//! Index-server replicas are all active and each keeps the whole index, so
//! every subscriber streams to every replica. `--index-server` lists them
//! (static), or names a headless Service whose host the subscriber
//! resolves again every few seconds (dns), starting a forwarder for each
//! address that appears and stopping the forwarder of each that goes. A
//! new replica is thereby found within one resolve period and converges
//! from one resync per subscriber; a replica that is slow or gone delays
//! no other (each forwarder has its own stream, backoff and backlog).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::forwarder::{self, Identity, Target};
use crate::metrics::Metrics;
use crate::outbox::{Outbox, Wakers};

/// How the index servers are found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DiscoveryMode {
    /// Each `--index-server` URL is one destination (its host resolved by
    /// the connection, as for a Service's virtual IP).
    Static,
    /// Each URL's host is resolved every `--index-server-resolve-seconds`
    /// and every address it names is a destination (a headless Service).
    Dns,
}

/// Where the forwarders go.
#[derive(Clone, Debug)]
pub struct Discovery {
    /// The `--index-server` URLs (each with its token and CA settings).
    pub targets: Vec<Target>,
    /// How they become destinations.
    pub mode: DiscoveryMode,
    /// How often hosts are resolved again (dns).
    pub resolve_every: Duration,
}

/// The `--index-server` value as a list of URLs: comma-separated, blanks
/// trimmed, duplicates dropped; an empty list is an error naming the flag.
pub fn parse_urls(value: &str) -> Result<Vec<String>, String> {
    let mut urls: Vec<String> = Vec::new();
    for url in value.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        host_port(url)?;
        if !urls.iter().any(|u| u == url) {
            urls.push(url.to_owned());
        }
    }
    if urls.is_empty() {
        return Err("--index-server: at least one URL is required".into());
    }
    Ok(urls)
}

/// The host and port a URL names (the scheme's port when it names none).
fn host_port(url: &str) -> Result<(String, u16), String> {
    let uri: tonic::codegen::http::Uri = url
        .parse()
        .map_err(|e| format!("--index-server {url}: {e}"))?;
    let host = uri
        .host()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("--index-server {url}: no host"))?;
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(port), _) => port,
        (None, Some("https")) => 443,
        (None, Some("http")) => 80,
        (None, _) => {
            return Err(format!(
                "--index-server {url}: expected http:// or https://"
            ));
        }
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    Ok((host, port))
}

/// Runs the forwarders until `shutdown`.
pub async fn run(
    discovery: Discovery,
    identity: Identity,
    outbox: Arc<Mutex<Outbox>>,
    wakers: Arc<Wakers>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let spawn = |tasks: &mut JoinSet<()>, target: Target, stop: CancellationToken| {
        tasks.spawn(forwarder::run(
            target,
            identity.clone(),
            outbox.clone(),
            wakers.clone(),
            metrics.clone(),
            stop,
        ));
    };
    let mut tasks = JoinSet::new();
    if discovery.mode == DiscoveryMode::Static {
        for target in discovery.targets {
            spawn(&mut tasks, target, shutdown.clone());
        }
        while tasks.join_next().await.is_some() {}
        return;
    }
    // (URL index, address) → the forwarder's own stop token.
    let mut running: BTreeMap<(usize, SocketAddr), CancellationToken> = BTreeMap::new();
    let mut tick = tokio::time::interval(discovery.resolve_every.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => break,
        }
        let mut wanted: BTreeSet<(usize, SocketAddr)> = BTreeSet::new();
        for (i, target) in discovery.targets.iter().enumerate() {
            match resolve(&target.url).await {
                Ok(addrs) => wanted.extend(addrs.into_iter().map(|a| (i, a))),
                Err(error) => {
                    // Keep what this URL resolved to last time: a DNS hiccup
                    // must not cut every stream.
                    metrics.discovery_failures.inc();
                    tracing::warn!(url = %target.url, %error, "cannot resolve the index servers");
                    wanted.extend(running.keys().filter(|(u, _)| *u == i).copied());
                }
            }
        }
        // Addresses seen under several URLs go to the first only.
        let mut seen = BTreeSet::new();
        wanted.retain(|(_, addr)| seen.insert(*addr));
        running.retain(|key, stop| {
            let keep = wanted.contains(key);
            if !keep {
                tracing::info!(url = %discovery.targets[key.0].url, addr = %key.1, "index server gone");
                stop.cancel();
            }
            keep
        });
        for key in wanted {
            if running.contains_key(&key) {
                continue;
            }
            tracing::info!(url = %discovery.targets[key.0].url, addr = %key.1, "index server found");
            let stop = shutdown.child_token();
            let target = Target {
                addr: Some(key.1),
                ..discovery.targets[key.0].clone()
            };
            spawn(&mut tasks, target, stop.clone());
            running.insert(key, stop);
        }
        // Reap forwarders that have stopped.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Every address `url`'s host names, IPv4 and IPv6 alike.
async fn resolve(url: &str) -> Result<Vec<SocketAddr>, String> {
    let (host, port) = host_port(url)?;
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| e.to_string())?
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
    fn urls_are_split_trimmed_and_deduplicated() {
        assert_eq!(
            parse_urls(" http://a:9090, http://b:9090 ,,http://a:9090").unwrap(),
            vec!["http://a:9090".to_owned(), "http://b:9090".to_owned()]
        );
        assert_eq!(
            parse_urls(" , ").unwrap_err(),
            "--index-server: at least one URL is required"
        );
        assert!(
            parse_urls("http://:9090")
                .unwrap_err()
                .contains("--index-server")
        );
        assert!(
            parse_urls("a-host-only")
                .unwrap_err()
                .contains("a-host-only")
        );
    }

    #[test]
    fn the_port_defaults_to_the_scheme() {
        assert_eq!(host_port("https://idx").unwrap(), ("idx".into(), 443));
        assert_eq!(host_port("http://idx").unwrap(), ("idx".into(), 80));
        assert_eq!(
            host_port("http://[::1]:9090").unwrap(),
            ("::1".into(), 9090)
        );
    }

    #[tokio::test]
    async fn a_name_resolves_to_every_address() {
        let addrs = resolve("http://localhost:9090").await.unwrap();
        assert!(!addrs.is_empty());
        assert!(
            addrs
                .iter()
                .all(|a| a.port() == 9090 && a.ip().is_loopback())
        );
        let addrs = resolve("http://127.0.0.1:1").await.unwrap();
        assert_eq!(addrs, vec!["127.0.0.1:1".parse().unwrap()]);
    }
}
