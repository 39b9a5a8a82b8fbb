//! `ic-loadgen`: preloads a real index server over IngestEvents, then
//! measures an empty RPC (grpc.health.v1 Check: the machine's ceiling for
//! this server and client) and LookupRoute on the same server in the same
//! run. See docs/benchmarks.md for figures.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use futures::StreamExt;
use ic_loadgen::{Fleet, PhaseStats, summarize};
use ic_proto::index_v1 as pb;
use ic_proto::index_v1::index_service_client::IndexServiceClient;
use ic_sim::ServiceProcess;
use serde::Serialize;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// Load generator for the index server.
#[derive(Debug, Parser)]
#[command(name = "ic-loadgen", version)]
struct Args {
    /// Index server gRPC address (host:port). Without it an index server is
    /// started on loopback from --bin-dir.
    #[arg(long)]
    target: Option<String>,
    /// Directory holding ic-index-server (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Replicas to preload.
    #[arg(long, default_value_t = 256)]
    replicas: u32,
    /// Resident (replica, block) entries to preload.
    #[arg(long, default_value_t = 1_000_000)]
    entries: u64,
    /// Blocks per preloaded chain.
    #[arg(long, default_value_t = 1024)]
    chain: u32,
    /// Blocks per LookupRoute prompt.
    #[arg(long, default_value_t = 128)]
    prompt_blocks: u32,
    /// Requests in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections the requests are spread over.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Measured seconds per phase.
    #[arg(long, default_value_t = 10.0)]
    duration_secs: f64,
    /// Unmeasured seconds before each phase.
    #[arg(long, default_value_t = 1.0)]
    warmup_secs: f64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Open loop: issue this many requests per second on a fixed schedule
    /// (at most --concurrency in flight) instead of as fast as responses
    /// return; latency counts from the scheduled send time whenever the
    /// schedule ran late, so backlog is not hidden.
    #[arg(long)]
    rate: Option<f64>,
    /// An extra flag for the ic-index-server this starts (repeatable, e.g.
    /// `--server-arg=--ttft-prefill-tokens-per-second=0` to compare builds
    /// whose defaults differ).
    #[arg(long, allow_hyphen_values = true)]
    server_arg: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    target: String,
    replicas: u32,
    entries: u64,
    prompt_blocks: u32,
    concurrency: usize,
    connections: usize,
    /// Requests per second offered (open loop), if set.
    rate: Option<f64>,
    preload_events: u64,
    preload_seconds: f64,
    preload_events_per_second: f64,
    empty_rpc: PhaseStats,
    lookup_route: PhaseStats,
    lookup_hit_ratio: f64,
    lookup_to_empty_qps_ratio: f64,
}

const TENANT: &str = "loadgen";
const MODEL: &str = "loadgen-model";

fn scope() -> pb::IndexScope {
    pb::IndexScope {
        tenant: TENANT.into(),
        model: MODEL.into(),
        hash_scheme: pb::HashScheme::Vllm as i32,
        adapter: String::new(),
    }
}

/// One replica's resync, a chain per batch.
fn preload_batches(fleet: &Fleet, replica: u32) -> Vec<pb::IngestBatch> {
    let chains = fleet.chains(replica);
    let n = chains.len();
    chains
        .into_iter()
        .enumerate()
        .map(|(i, (family, len))| pb::IngestBatch {
            replica: Some(pb::ReplicaIdentity {
                scope: Some(scope()),
                replica_id: format!("engine-{replica}"),
                address: format!("10.0.{}.{}:8000", replica / 250, replica % 250),
                dp_rank: 0,
                incarnation: 1,
            }),
            seq: i as u64 + 1,
            resync_begin: i == 0,
            resync_end: i + 1 == n,
            events: vec![pb::IndexEvent {
                kind: Some(pb::index_event::Kind::Stored(pb::BlocksStored {
                    parent_fingerprint: 0,
                    start_depth: 0,
                    fingerprints: (0..len)
                        .map(|d| ic_loadgen::fingerprint(family, d))
                        .collect(),
                    block_size: 16,
                    tier: pb::Tier::T1 as i32,
                    at_unix_ms: 0,
                })),
            }],
            tier2_stats: None,
            engine_load: None,
            engine_cache: None,
            history_incomplete: false,
            sent_at_unix_ms: 0,
            trace_context: std::collections::HashMap::new(),
        })
        .collect()
}

async fn preload(channel: Channel, fleet: Fleet) -> anyhow::Result<(u64, Duration)> {
    let started = Instant::now();
    let results: Vec<anyhow::Result<u64>> = futures::stream::iter(0..fleet.replicas)
        .map(|r| {
            let mut client = IndexServiceClient::new(channel.clone());
            async move {
                let batches = preload_batches(&fleet, r);
                let events: u64 = batches
                    .iter()
                    .flat_map(|b| &b.events)
                    .map(|e| match &e.kind {
                        Some(pb::index_event::Kind::Stored(s)) => s.fingerprints.len() as u64,
                        _ => 0,
                    })
                    .sum();
                let ack = client
                    .ingest_events(futures::stream::iter(batches))
                    .await
                    .with_context(|| format!("preloading replica {r}"))?
                    .into_inner();
                if ack.resync_required {
                    bail!("server asked replica {r} to resync: {}", ack.detail);
                }
                Ok(events)
            }
        })
        .buffer_unordered(8)
        .collect()
        .await;
    let mut total = 0;
    for r in results {
        total += r?;
    }
    Ok((total, started.elapsed()))
}

/// Runs `call` from `concurrency` tasks over `channels` for warmup plus
/// duration; latencies are kept for the measured part only. `call` returns
/// whether the answer was a hit.
async fn phase<F, Fut>(channels: &[Channel], args: &Args, call: F) -> (PhaseStats, u64)
where
    F: Fn(Channel, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<bool, tonic::Status>> + Send,
{
    let call = Arc::new(call);
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup_secs);
    let end = measure_from + Duration::from_secs_f64(args.duration_secs);
    let hits = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    // Open loop: worker `w` owns the scheduled slots w, w + n, w + 2n, …
    let interval = args
        .rate
        .filter(|r| *r > 0.0)
        .map(|r| Duration::from_secs_f64(args.concurrency as f64 / r));
    let slot_offset = |w: usize| {
        args.rate
            .filter(|r| *r > 0.0)
            .map(|r| Duration::from_secs_f64(w as f64 / r))
            .unwrap_or_default()
    };
    for w in 0..args.concurrency {
        let channel = channels[w % channels.len()].clone();
        let call = call.clone();
        let hits = hits.clone();
        let first_slot = start + slot_offset(w);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0u64;
            let mut i = w as u64;
            let mut slot = first_slot;
            let mut free_at = start;
            loop {
                // The slot a send belongs to decides whether it is measured:
                // a warm-up slot woken late (a loaded machine) is not.
                let (t0, scheduled) = match interval {
                    Some(every) => {
                        if slot >= end {
                            break;
                        }
                        tokio::time::sleep_until(slot.into()).await;
                        // Late because the previous call overran its slot:
                        // count from the slot. Otherwise from the wake-up
                        // (timer slop is not the server's).
                        let t0 = if free_at > slot { slot } else { Instant::now() };
                        let scheduled = slot;
                        slot += every;
                        (t0, scheduled)
                    }
                    None => {
                        let now = Instant::now();
                        (now, now)
                    }
                };
                if t0 >= end {
                    break;
                }
                let result = call(channel.clone(), i).await;
                free_at = Instant::now();
                i += 1_000_003;
                if scheduled < measure_from {
                    continue;
                }
                match result {
                    Ok(hit) => {
                        latencies.push(t0.elapsed());
                        hits.fetch_add(u64::from(hit), Ordering::Relaxed);
                    }
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        if let Ok((l, e)) = t.await {
            latencies.extend(l);
            errors += e;
        }
    }
    let measured = end.saturating_duration_since(measure_from);
    (
        summarize(latencies, errors, measured),
        hits.load(Ordering::Relaxed),
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.replicas == 0 || args.concurrency == 0 || args.connections == 0 || args.chain == 0 {
        bail!("--replicas, --concurrency, --connections and --chain must be at least 1");
    }
    let mut server = None;
    let target = match &args.target {
        Some(t) => t.clone(),
        None => {
            let bin = ic_loadgen::service_binary(args.bin_dir.as_deref(), "ic-index-server")
                .map_err(anyhow::Error::msg)?;
            let capacity = (args.entries * 2).max(1_000_000).to_string();
            let mut server_args = vec![
                "--http-addr",
                "127.0.0.1:0",
                "--grpc-addr",
                "127.0.0.1:0",
                "--capacity-entries",
                &capacity,
            ];
            server_args.extend(args.server_arg.iter().map(String::as_str));
            let mut p = ServiceProcess::start(&bin, &server_args);
            let addr = p.addr("grpc").to_string();
            server = Some(p);
            addr
        }
    };
    let mut channels = Vec::new();
    for _ in 0..args.connections {
        channels.push(
            Channel::from_shared(format!("http://{target}"))?
                .connect()
                .await
                .with_context(|| format!("connecting to {target}"))?,
        );
    }
    let fleet = Fleet {
        replicas: args.replicas,
        entries: args.entries,
        chain: args.chain,
    };
    let say = |m: String| {
        if !args.json {
            eprintln!("{m}");
        }
    };
    say(format!(
        "preloading {} entries over {} replicas through IngestEvents…",
        args.entries, args.replicas
    ));
    let (events, took) = preload(channels[0].clone(), fleet).await?;

    say("measuring the empty RPC (grpc.health.v1 Check)…".into());
    let (empty, _) = phase(&channels, &args, |channel, _| async move {
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map(|_| true)
    })
    .await;

    say(format!(
        "measuring LookupRoute ({}-block prompts)…",
        args.prompt_blocks
    ));
    let groups = fleet.groups();
    let prompt_blocks = args.prompt_blocks;
    let (lookup, hits) = phase(&channels, &args, move |channel, i| {
        let hashes = fleet.prompt(
            u32::try_from(i % u64::from(groups)).unwrap_or(0),
            i / u64::from(groups),
            prompt_blocks,
        );
        async move {
            let response = IndexServiceClient::new(channel)
                .lookup_route(pb::LookupRouteRequest {
                    scope: Some(scope()),
                    key: Some(pb::lookup_route_request::Key::BlockHashes(
                        pb::BlockHashes { hashes },
                    )),
                    candidate_replicas: vec![],
                    observe_only: false,
                    ..Default::default()
                })
                .await?
                .into_inner();
            Ok(response.outcome == pb::LookupOutcome::PrefixMatch as i32)
        }
    })
    .await;

    if let Some(mut p) = server {
        p.stop();
    }
    let report = Report {
        target,
        replicas: args.replicas,
        entries: args.entries,
        prompt_blocks: args.prompt_blocks,
        concurrency: args.concurrency,
        connections: args.connections,
        rate: args.rate,
        preload_events: events,
        preload_seconds: took.as_secs_f64(),
        preload_events_per_second: events as f64 / took.as_secs_f64().max(1e-9),
        lookup_hit_ratio: hits as f64 / (lookup.requests.max(1)) as f64,
        lookup_to_empty_qps_ratio: lookup.qps / empty.qps.max(1e-9),
        empty_rpc: empty,
        lookup_route: lookup,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    if report.lookup_route.requests == 0 || report.empty_rpc.requests == 0 {
        bail!("a phase completed no requests");
    }
    Ok(())
}

fn print_table(r: &Report) {
    let load = match r.rate {
        Some(rate) => format!(
            "{rate:.0} requests/s offered (open loop, at most {} in flight)",
            r.concurrency
        ),
        None => format!("{} in flight", r.concurrency),
    };
    println!(
        "index server {}: {} replicas, {} entries, {}-block prompts, {load} over {} connections",
        r.target, r.replicas, r.entries, r.prompt_blocks, r.connections
    );
    println!(
        "preload (IngestEvents over gRPC): {} block events in {:.2} s = {:.0} events/s",
        r.preload_events, r.preload_seconds, r.preload_events_per_second
    );
    println!(
        "{:<26} {:>10} {:>10} {:>10} {:>8}",
        "phase", "qps", "p50 µs", "p99 µs", "errors"
    );
    for (name, s) in [
        ("empty RPC (health Check)", &r.empty_rpc),
        ("LookupRoute", &r.lookup_route),
    ] {
        println!(
            "{:<26} {:>10.0} {:>10.0} {:>10.0} {:>8}",
            name, s.qps, s.p50_us, s.p99_us, s.errors
        );
    }
    println!(
        "LookupRoute hit ratio {:.1}%, LookupRoute/empty qps {:.2}",
        r.lookup_hit_ratio * 100.0,
        r.lookup_to_empty_qps_ratio
    );
}
