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

/// The flag the URLs come from, named in every error about them.
const FLAG: &str = "--index-server";

/// The `--index-server` value as a list of URLs: comma-separated, blanks
/// trimmed, duplicates dropped; an empty list is an error naming the flag.
pub fn parse_urls(value: &str) -> Result<Vec<String>, String> {
    let urls = ic_proto::urls::parse_list(value, FLAG)?;
    if urls.is_empty() {
        return Err(format!("{FLAG}: at least one URL is required"));
    }
    Ok(urls)
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
            match ic_proto::urls::resolve(&target.url, FLAG).await {
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
}
