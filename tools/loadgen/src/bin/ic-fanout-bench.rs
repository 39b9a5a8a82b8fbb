//! How fast an engine's event becomes visible in LookupRoute, with one
//! index-server replica and with several fed by fan-out, and how many block
//! events per second each replica applies as replicas are added.
//!
//! Everything is real and on loopback: stand-in engines publishing the vLLM
//! wire over ZMQ, one `ic-kvevent-subscriber` per engine streaming to every
//! replica, and `ic-index-server` replicas (binaries from `--bin-dir`). For
//! each replica count in `--replicas` it measures
//! * latency: an engine publishes a new prompt's blocks; the time until
//!   LookupRoute on a replica names that engine as holding all of them
//!   (polled every 100 µs), per replica and until the last replica sees it;
//! * throughput: every engine publishes `--burst-batches` batches back to
//!   back; blocks divided by the time until every replica's /snapshot holds
//!   them all.
//!
//! One machine runs the engines, subscribers and replicas alike, so the
//! figures are relative: compare replica counts within one run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use ic_kvevents::encode::{Era, gpu_store};
use ic_proto::IndexServiceClient;
use ic_sim::ServiceProcess;
use ic_sim::engine::FakeEngine;
use tonic::transport::Channel;

const TENANT: &str = "bench";
const MODEL: &str = "bench-model";
const BLOCK: u32 = 16;

/// Fan-out latency and throughput benchmark.
#[derive(Debug, Parser)]
#[command(name = "ic-fanout-bench", version)]
struct Args {
    /// Directory holding ic-index-server and ic-kvevent-subscriber
    /// (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Replica counts to measure, in order.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    replicas: Vec<usize>,
    /// Engines, each with its subscriber.
    #[arg(long, default_value_t = 4)]
    engines: u64,
    /// Latency samples per replica count.
    #[arg(long, default_value_t = 300)]
    samples: usize,
    /// Blocks per prompt in the latency samples.
    #[arg(long, default_value_t = 8)]
    prompt_blocks: u32,
    /// Batches each engine publishes back to back in the throughput phase.
    #[arg(long, default_value_t = 2000)]
    burst_batches: u64,
    /// Blocks per batch in the throughput phase.
    #[arg(long, default_value_t = 16)]
    burst_blocks: u32,
}

struct Engine {
    engine: FakeEngine,
    index: u64,
    next_chain: u64,
}

impl Engine {
    fn replica(&self) -> String {
        format!("engine-{}", self.index)
    }

    /// Publishes a new chain of `blocks` blocks; returns its tokens.
    async fn store(&mut self, blocks: u32) -> Vec<u32> {
        let chain = self.next_chain;
        self.next_chain += 1;
        let base =
            u32::try_from((self.index * 100_000_000 + chain * 1_000) % 4_000_000_000).unwrap_or(0);
        let tokens: Vec<u32> = (0..blocks * BLOCK).map(|t| base + t).collect();
        let hashes: Vec<u64> = (0..u64::from(blocks))
            .map(|b| (self.index << 48) | (chain << 16) | (b + 1))
            .collect();
        self.engine
            .publish(&[gpu_store(hashes, None, tokens.clone(), BLOCK)])
            .await;
        tokens
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// Whether `client`'s replica sees `engine` holding all of `tokens`.
async fn visible(
    client: &mut IndexServiceClient<Channel>,
    replica: &str,
    tokens: &[u32],
    blocks: u32,
) -> anyhow::Result<bool> {
    let r = client
        .lookup_route(ic_sim::ingest::token_lookup(TENANT, MODEL, tokens.to_vec()))
        .await?
        .into_inner();
    Ok(r.candidates.iter().any(|c| {
        c.matched_blocks == blocks && c.replica.as_ref().is_some_and(|x| x.replica_id == replica)
    }))
}

/// Blocks the replica's /snapshot holds, over every engine.
fn snapshot_blocks(process: &mut ServiceProcess) -> u64 {
    let (status, body) = ic_sim::http_get(process.admin_addr(), "/snapshot");
    if status != 200 {
        return 0;
    }
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .and_then(|s| {
            Some(
                s["replicas"]
                    .as_array()?
                    .iter()
                    .filter_map(|r| r["prefixCount"].as_u64())
                    .sum(),
            )
        })
        .unwrap_or(0)
}

async fn run_one(args: &Args, bin_dir: &std::path::Path, replicas: usize) -> anyhow::Result<()> {
    let mut servers: Vec<ServiceProcess> = (0..replicas)
        .map(|_| {
            ServiceProcess::start(
                &bin_dir.join("ic-index-server"),
                &[
                    "--http-addr",
                    "127.0.0.1:0",
                    "--grpc-addr",
                    "127.0.0.1:0",
                    "--capacity-entries",
                    "50000000",
                ],
            )
        })
        .collect();
    let urls: Vec<String> = servers
        .iter_mut()
        .map(|s| format!("http://{}", s.addr("grpc")))
        .collect();
    let mut clients = Vec::new();
    for url in &urls {
        clients.push(IndexServiceClient::connect(url.clone()).await?);
    }
    let mut engines = Vec::new();
    let mut sidecars = Vec::new();
    for index in 0..args.engines {
        let engine = FakeEngine::start(Era::VllmMap, "kv-events").await;
        let sidecar_args = engine.subscriber_args(
            &urls.join(","),
            &format!("engine-{index}"),
            TENANT,
            MODEL,
            &format!("10.0.0.{index}:8000"),
        );
        let sidecar_args: Vec<&str> = sidecar_args.iter().map(String::as_str).collect();
        sidecars.push(ServiceProcess::start(
            &bin_dir.join("ic-kvevent-subscriber"),
            &sidecar_args,
        ));
        let mut engine = Engine {
            engine,
            index,
            next_chain: 0,
        };
        engine.engine.wait_for_subscriber().await;
        engines.push(engine);
    }
    // Every subscriber has resynced every replica (an empty first prompt
    // visible everywhere).
    for e in &mut engines {
        let tokens = e.store(1).await;
        for client in &mut clients {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !visible(client, &e.replica(), &tokens, 1).await? {
                anyhow::ensure!(Instant::now() < deadline, "the fleet never converged");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    let mut per_replica = Vec::new();
    let mut all = Vec::new();
    for s in 0..args.samples {
        let n = engines.len();
        let e = &mut engines[s % n];
        let replica = e.replica();
        let tokens = e.store(args.prompt_blocks).await;
        let published = Instant::now();
        let mut seen = vec![None; clients.len()];
        while seen.iter().any(Option::is_none) {
            for (i, client) in clients.iter_mut().enumerate() {
                if seen[i].is_none()
                    && visible(client, &replica, &tokens, args.prompt_blocks).await?
                {
                    seen[i] = Some(published.elapsed());
                }
            }
            anyhow::ensure!(
                published.elapsed() < Duration::from_secs(30),
                "a prompt never became visible"
            );
            tokio::time::sleep(Duration::from_micros(100)).await;
        }
        let seen: Vec<Duration> = seen.into_iter().flatten().collect();
        per_replica.extend(seen.iter().copied());
        all.push(seen.iter().copied().max().unwrap_or_default());
    }
    per_replica.sort();
    all.sort();

    // Throughput: bursts from every engine at once.
    let before: Vec<u64> = servers.iter_mut().map(snapshot_blocks).collect();
    let expected = args.engines * args.burst_batches * u64::from(args.burst_blocks);
    let started = Instant::now();
    let bursts = engines.iter_mut().map(|e| async {
        for _ in 0..args.burst_batches {
            e.store(args.burst_blocks).await;
        }
    });
    futures::future::join_all(bursts).await;
    let publish_seconds = started.elapsed().as_secs_f64();
    let mut applied_seconds = Vec::new();
    for (i, server) in servers.iter_mut().enumerate() {
        let deadline = Instant::now() + Duration::from_secs(600);
        while snapshot_blocks(server) < before[i] + expected {
            anyhow::ensure!(Instant::now() < deadline, "replica {i} never caught up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        applied_seconds.push(started.elapsed().as_secs_f64());
    }
    let slowest = applied_seconds.iter().copied().fold(0.0, f64::max);
    #[allow(clippy::cast_precision_loss)]
    let (rate, published_rate) = (expected as f64 / slowest, expected as f64 / publish_seconds);
    println!(
        "| {replicas} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} |",
        percentile(&per_replica, 0.5),
        percentile(&per_replica, 0.99),
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        publish_seconds,
        rate,
        published_rate,
    );
    for mut s in sidecars {
        s.stop();
    }
    for mut s in servers {
        s.stop();
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("binary directory")?
            .to_path_buf(),
    };
    println!(
        "{} engines, {} latency samples of {} blocks, bursts of {} x {} blocks per engine",
        args.engines, args.samples, args.prompt_blocks, args.burst_batches, args.burst_blocks
    );
    println!(
        "| replicas | visible p50 ms (each) | p99 | visible p50 ms (all) | p99 | burst publish s | blocks/s applied per replica | blocks/s published |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for &replicas in &args.replicas {
        run_one(&args, &bin_dir, replicas).await?;
    }
    Ok(())
}
