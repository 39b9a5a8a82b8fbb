//! What the fault and high-availability tests share: simulated engines
//! that publish the real vLLM wire and remember what they hold, and the
//! check that an index server holds exactly that.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ic_e2e::engine::FakeEngine;
use ic_e2e::{ServiceProcess, http_get, workspace_binary};
use ic_kvevents::Medium;
use ic_kvevents::encode::{Era, gpu_store, removal};
use ic_proto::IndexServiceClient;

pub const TENANT: &str = "team-a";
pub const MODEL: &str = "meta-llama/Llama-3.1-8B";
pub const BLOCK: u32 = 16;
/// How long any scenario may take to converge before the test fails.
pub const CONVERGE: Duration = Duration::from_secs(90);

/// One engine and what it holds: each prompt is a chain of blocks from the
/// root, with block hashes and tokens no other chain shares.
pub struct Engine {
    pub engine: FakeEngine,
    pub replica: String,
    pub index: u64,
    /// chain number → its blocks' engine hashes, in order.
    pub chains: BTreeMap<u64, Vec<u64>>,
    pub next_chain: u64,
}

impl Engine {
    pub fn tokens(&self, chain: u64, blocks: u32) -> Vec<u32> {
        let base = u32::try_from((self.index * 1_000_000 + chain * 1_000) % 4_000_000_000).unwrap();
        (0..blocks * BLOCK).map(|t| base + t).collect()
    }

    /// Stores a new chain of `blocks` blocks.
    pub async fn store(&mut self, blocks: u32) {
        let chain = self.next_chain;
        self.next_chain += 1;
        let hashes: Vec<u64> = (0..u64::from(blocks))
            .map(|b| (self.index << 40) | (chain << 8) | (b + 1))
            .collect();
        let tokens = self.tokens(chain, blocks);
        self.engine
            .publish(&[gpu_store(hashes.clone(), None, tokens, BLOCK)])
            .await;
        self.chains.insert(chain, hashes);
    }

    /// Evicts the last block of the oldest chain (the whole chain when it
    /// has one block left).
    pub async fn evict_one(&mut self) {
        let Some((&chain, hashes)) = self.chains.iter_mut().next() else {
            return;
        };
        let last = hashes.pop().unwrap();
        if hashes.is_empty() {
            self.chains.remove(&chain);
        }
        self.engine
            .publish(&[removal(vec![last], Medium::Gpu)])
            .await;
    }

    /// A round of traffic: two new prompts and one eviction.
    pub async fn round(&mut self) {
        self.store(4).await;
        self.store(2).await;
        self.evict_one().await;
    }

    pub fn blocks(&self) -> u64 {
        self.chains.values().map(|c| c.len() as u64).sum()
    }

    /// The engine restarted: its cache is empty and sequence numbers start over.
    pub fn restart(&mut self) {
        self.engine.restart();
        self.chains.clear();
    }

    pub fn newest(&self) -> Option<(Vec<u32>, u32)> {
        let (&chain, hashes) = self.chains.iter().next_back()?;
        let blocks = u32::try_from(hashes.len()).unwrap();
        // A chain that lost tail blocks still starts with the same tokens.
        Some((self.tokens(chain, blocks), blocks))
    }
}

/// `n` rounds of traffic on every engine.
pub async fn rounds(engines: &mut [Engine], n: usize) {
    for _ in 0..n {
        for engine in engines.iter_mut() {
            engine.round().await;
        }
    }
}

/// Block count per replica in the index server's `/snapshot`.
pub fn snapshot_blocks(http: SocketAddr) -> Option<BTreeMap<String, u64>> {
    let (status, body) = http_get(http, "/snapshot");
    if status != 200 {
        return None;
    }
    blocks_of_snapshot(&body)
}

/// Block count per replica in a `/snapshot` body.
pub fn blocks_of_snapshot(body: &str) -> Option<BTreeMap<String, u64>> {
    let snapshot: serde_json::Value = serde_json::from_str(body).ok()?;
    Some(
        snapshot["replicas"]
            .as_array()?
            .iter()
            .filter_map(|r| {
                Some((
                    r["replicaId"].as_str()?.to_owned(),
                    r["prefixCount"].as_u64()?,
                ))
            })
            .collect(),
    )
}

/// Whether the index holds exactly what the engines hold.
pub async fn index_matches(
    grpc_port: u16,
    http: SocketAddr,
    engines: &[Engine],
) -> Result<(), String> {
    let want: BTreeMap<String, u64> = engines
        .iter()
        .filter(|e| e.blocks() > 0)
        .map(|e| (e.replica.clone(), e.blocks()))
        .collect();
    let have = snapshot_blocks(http).ok_or("no snapshot")?;
    let have: BTreeMap<String, u64> = have.into_iter().filter(|(_, n)| *n > 0).collect();
    if have != want {
        return Err(format!("snapshot {have:?}, engines hold {want:?}"));
    }
    let mut client = IndexServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .map_err(|e| e.to_string())?;
    for engine in engines {
        let Some((tokens, blocks)) = engine.newest() else {
            continue;
        };
        let r = client
            .lookup_route(ic_e2e::ingest::token_lookup(TENANT, MODEL, tokens))
            .await
            .map_err(|e| e.to_string())?
            .into_inner();
        let holder = r.candidates.iter().find(|c| {
            c.replica
                .as_ref()
                .is_some_and(|id| id.replica_id == engine.replica)
        });
        if holder.map(|c| c.matched_blocks) != Some(blocks) {
            return Err(format!(
                "{}'s newest prompt ({blocks} blocks): {r:?}",
                engine.replica
            ));
        }
    }
    Ok(())
}

/// Waits until the index equals the engines' state; returns how long it took.
pub async fn converge(
    grpc_port: u16,
    http: SocketAddr,
    engines: &[Engine],
    what: &str,
) -> Duration {
    let started = Instant::now();
    loop {
        match index_matches(grpc_port, http, engines).await {
            Ok(()) => return started.elapsed(),
            Err(why) => assert!(
                started.elapsed() < CONVERGE,
                "{what}: the index did not converge within {CONVERGE:?}: {why}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Reads one series (summing its label sets) from a `/metrics` page.
pub fn metric(http: SocketAddr, name: &str) -> f64 {
    let (_, text) = http_get(http, "/metrics");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn figure(scenario: &str, value: impl std::fmt::Display) {
    eprintln!("fault figure: {scenario}: {value}");
}

pub fn subscriber(engine: &Engine, index_url: &str, extra: &[&str]) -> ServiceProcess {
    let mut args = engine.engine.subscriber_args(
        index_url,
        &engine.replica,
        TENANT,
        MODEL,
        &format!("10.0.0.{}:8000", engine.index),
    );
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    ServiceProcess::start(&workspace_binary("ic-kvevent-subscriber"), &args)
}

/// `count` engines, each with its sidecar, all forwarding to `index_url`
/// (one URL or several, comma-separated).
pub async fn fleet(
    count: u64,
    index_url: &str,
    sidecar_flags: &[&str],
) -> (Vec<Engine>, Vec<ServiceProcess>) {
    let mut engines = Vec::new();
    let mut sidecars = Vec::new();
    for index in 0..count {
        let mut engine = Engine {
            engine: FakeEngine::start(Era::VllmMap, "kv-events").await,
            replica: format!("engine-{index}"),
            index,
            chains: BTreeMap::new(),
            next_chain: 0,
        };
        sidecars.push(subscriber(&engine, index_url, sidecar_flags));
        engine.engine.wait_for_subscriber().await;
        engines.push(engine);
    }
    (engines, sidecars)
}

/// The gRPC URL of an index server on loopback.
pub fn url(grpc_port: u16) -> String {
    format!("http://127.0.0.1:{grpc_port}")
}
