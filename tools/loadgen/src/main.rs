//! `ic-loadgen`: preloads a real index server over IngestEvents, then
//! measures an empty RPC (grpc.health.v1 Check: the machine's ceiling for
//! this server and client) and LookupRoute on the same server in the same
//! run. See docs/benchmarks.md for figures.

mod closed_loop;
mod direct;
mod floor;
mod host_probe;
mod open_loop;
mod phases;
mod placement;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use ic_loadgen::lean::{self, Bodies};
use ic_loadgen::prom::{Histogram, ServerQuantiles};
use ic_loadgen::schedule::Spacing;
use ic_loadgen::{Fleet, PhaseStats};
use ic_proto::index_v1 as pb;
use ic_proto::index_v1::index_service_client::IndexServiceClient;
use ic_sim::ServiceProcess;
use open_loop::{OpenLoop, ScheduleStats};
use placement::Cpus;
use prost::Message as _;
use serde::Serialize;
use tonic::transport::Channel;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

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
    /// The last this many blocks of each LookupRoute prompt are new: no
    /// replica holds them and no other request names them (a prompt
    /// ending in a new user turn), so each pick records them as
    /// speculative holdings (0: every block is held). Below
    /// --prompt-blocks.
    #[arg(long, default_value_t = 0)]
    new_blocks: u32,
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
    /// Open loop: issue this many requests per second on a schedule kept
    /// by a dedicated thread (at most --concurrency in flight) instead of
    /// as fast as responses return; latency counts from each send's due
    /// time, so lateness and backlog are not hidden.
    #[arg(long)]
    rate: Option<f64>,
    /// Open loop: gaps between sends, `poisson` (exponential: independent
    /// users, the latency a gateway sees) or `uniform` (equal: the
    /// server's best case at the rate).
    #[arg(long, default_value = "poisson", requires = "rate")]
    spacing: Spacing,
    /// Open loop: the schedule thread wakes this many microseconds before
    /// each due time and spins the rest (0: it only waits). Spinning takes
    /// CPU from a server that shares the cores, so the default is small:
    /// where the thread wakes later than that, as it did at the median with
    /// either --open-loop-client on the benchmark host, it seldom spins. A
    /// larger spin takes the wake-up lateness out but spends a share of a
    /// core, and with `direct` answers that arrive while the thread spins
    /// wait for it, which raised LookupRoute's p99 there (docs/benchmarks.md,
    /// "The open loop made exact"). A run warns when the spin passes 10 %
    /// of a core.
    #[arg(long, default_value_t = 10, requires = "rate")]
    spin_us: u64,
    /// Open loop: seed of the Poisson schedule (the same seed, the same
    /// sends).
    #[arg(long, default_value_t = 1, requires = "rate")]
    seed: u64,
    /// The server's Prometheus page, scraped before and after the
    /// LookupRoute phase for its own lookup-duration histogram (default:
    /// the started server's; none with --target).
    #[arg(long)]
    metrics_url: Option<String>,
    /// The client's runtime: 0 one worker thread per core (tokio's
    /// default), 1 a current-thread runtime (requests and answers on one
    /// thread: no idle worker woken per request), N that many workers.
    #[arg(long, default_value_t = 0)]
    client_threads: usize,
    /// How LookupRoute requests are sent: `lean` (each distinct body
    /// encoded once before the phase and cycled, and only the answer's
    /// `outcome` and `best` address decoded, the rest skipped, as a lean
    /// gateway reads it) or `full` (the generated client: each request
    /// built and encoded as it is sent, the whole answer decoded). The
    /// server receives the same requests either way.
    #[arg(long, value_enum, default_value_t = LookupClient::Lean)]
    lookup_client: LookupClient,
    /// LookupRoute's `max_candidates`: at most this many candidates in
    /// each answer (0: every replica with a match, the server's default).
    #[arg(long, default_value_t = 0)]
    max_candidates: u32,
    /// An extra flag for the ic-index-server this starts (repeatable, e.g.
    /// `--server-arg=--ttft-prefill-tokens-per-second=0` to compare builds
    /// whose defaults differ).
    #[arg(long, allow_hyphen_values = true)]
    server_arg: Vec<String>,
    /// Pin the load generator's threads to these CPUs (`taskset -c`
    /// spelling: `0`, `0-1`, `0,2`), a benchmark setting: on a small
    /// machine client and server otherwise take each other's core.
    #[arg(long)]
    client_cpus: Option<Cpus>,
    /// Pin the index server this starts (all its threads) and the
    /// `--floor` echo threads to these CPUs.
    #[arg(long)]
    server_cpus: Option<Cpus>,
    /// Worker threads of the index server this starts (its runtime's
    /// TOKIO_WORKER_THREADS); 0 leaves tokio's default, one per core.
    #[arg(long, default_value_t = 0)]
    server_workers: usize,
    /// Open loop: first measure the host's floor, a 64-byte TCP echo
    /// answered by plain threads, on the same schedule (`tcp_floor`).
    #[arg(long, requires = "rate")]
    floor: bool,
    /// Open loop: how requests are sent. `direct`: the schedule thread
    /// owns the connections (hyper's HTTP/2 client on its own one-thread
    /// runtime) and starts each request itself at its due time; `channel`:
    /// it hands each request to the client's runtime, which sends it
    /// through tonic's `Channel` (a worker's wake-up and a buffer task's
    /// hop per request). The floor's echo is sent the same way.
    #[arg(long, value_enum, default_value_t = OpenLoopClient::Direct, requires = "rate")]
    open_loop_client: OpenLoopClient,
    /// Open loop, a diagnostic run: a probe thread on each of --client-cpus
    /// and --server-cpus (every CPU this process may use unless both are given), at real-time priority
    /// 90, sleeps this many µs at a time and keeps its late wake-ups; each
    /// phase reports them (`cpu_stalls`). Off by default (0): its wake-ups
    /// move the latencies measured (p50 +6-15 µs at 1000, see
    /// docs/benchmarks.md), so figures compared or quoted are taken without it.
    #[arg(long, default_value_t = 0, requires = "rate")]
    host_probe_us: u64,
    /// A probe wake-up this many µs late is a stall (`cpu_stalls`); a
    /// request is slow over the p99 target, 500 µs, whatever this is.
    #[arg(long, default_value_t = 500, requires = "rate")]
    host_stall_us: u64,
    /// The most probe stalls kept between two phases' tallies (about 40
    /// bytes each); those past it are counted (`cpu_stalls.dropped`).
    #[arg(long, default_value_t = 65_536, requires = "rate")]
    host_stall_cap: usize,
}

/// `--open-loop-client`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum OpenLoopClient {
    Direct,
    Channel,
}

/// `--lookup-client`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum LookupClient {
    Lean,
    Full,
}

#[derive(Debug, Serialize)]
struct Report {
    target: String,
    replicas: u32,
    entries: u64,
    prompt_blocks: u32,
    /// `--new-blocks`.
    new_blocks: u32,
    concurrency: usize,
    connections: usize,
    /// Requests per second offered (open loop), if set.
    rate: Option<f64>,
    /// `--client-threads` (0: one worker per core).
    client_threads: usize,
    /// `--lookup-client`.
    lookup_client: LookupClient,
    /// `--max-candidates`.
    max_candidates: u32,
    /// Lean client: the distinct LookupRoute bodies encoded before the
    /// phase (0: too many to keep, each encoded as it is sent).
    lookup_bodies_pooled: Option<usize>,
    /// `--client-cpus`, `--server-cpus`, `--server-workers`.
    client_cpus: Option<String>,
    server_cpus: Option<String>,
    server_workers: usize,
    /// The open loop's schedule and how exactly it was kept, per phase.
    open_loop: Option<OpenLoopReport>,
    /// The LookupRoute phase (warm-up included) as the server's
    /// `inferencecache_index_lookup_duration_seconds` saw it: from the
    /// decoded request to the built answer.
    server_lookup: Option<ServerQuantiles>,
    preload_events: u64,
    preload_seconds: f64,
    preload_events_per_second: f64,
    /// `--floor`: the TCP echo on the same schedule.
    tcp_floor: Option<PhaseStats>,
    empty_rpc: PhaseStats,
    lookup_route: PhaseStats,
    lookup_hit_ratio: f64,
    lookup_to_empty_qps_ratio: f64,
}

#[derive(Debug, Serialize)]
struct OpenLoopReport {
    /// `--open-loop-client`.
    client: OpenLoopClient,
    spacing: Spacing,
    spin_us: u64,
    seed: u64,
    tcp_floor: Option<ScheduleStats>,
    empty_rpc: ScheduleStats,
    lookup_route: ScheduleStats,
}

/// The empty RPC's gRPC path.
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// The server's lookup histogram.
const LOOKUP_HISTOGRAM: &str = "inferencecache_index_lookup_duration_seconds";

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

/// The LookupRoute request for a prompt of `hashes`.
fn lookup_request(hashes: Vec<u64>, max_candidates: u32) -> pb::LookupRouteRequest {
    pb::LookupRouteRequest {
        scope: Some(scope()),
        key: Some(pb::lookup_route_request::Key::BlockHashes(
            pb::BlockHashes { hashes },
        )),
        candidate_replicas: vec![],
        observe_only: false,
        max_candidates,
        ..Default::default()
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

/// Rejects flags no run can use, naming the flag.
fn check(args: &Args) -> Result<(), String> {
    for (flag, value) in [
        ("--replicas", u64::from(args.replicas)),
        ("--concurrency", args.concurrency as u64),
        ("--connections", args.connections as u64),
        ("--chain", u64::from(args.chain)),
    ] {
        if value == 0 {
            return Err(format!("{flag}: must be at least 1"));
        }
    }
    if !args.duration_secs.is_finite() || args.duration_secs <= 0.0 {
        return Err(format!(
            "--duration-secs: {} is not a positive number of seconds",
            args.duration_secs
        ));
    }
    if !args.warmup_secs.is_finite() || args.warmup_secs < 0.0 {
        return Err(format!(
            "--warmup-secs: {} is not a number of seconds (0 or more)",
            args.warmup_secs
        ));
    }
    if let Some(rate) = args.rate {
        ic_loadgen::schedule::Schedule::new(rate, args.spacing, args.seed)?;
    }
    if args.new_blocks >= args.prompt_blocks && args.new_blocks > 0 {
        return Err(format!(
            "--new-blocks: {} leaves no held block of the {} of --prompt-blocks \
             (a prompt nobody holds is routed by load alone)",
            args.new_blocks, args.prompt_blocks
        ));
    }
    if args.client_threads > 64 {
        return Err(format!(
            "--client-threads: {} is above 64",
            args.client_threads
        ));
    }
    if args.server_workers > 64 {
        return Err(format!(
            "--server-workers: {} is above 64",
            args.server_workers
        ));
    }
    if args.spin_us > 10_000 {
        return Err(format!(
            "--spin-us: {} is above 10000 (a spin that long only burns a core)",
            args.spin_us
        ));
    }
    if args.host_probe_us > 0 && !(50..=100_000).contains(&args.host_probe_us) {
        return Err(format!(
            "--host-probe-us: {} is outside 50-100000 (0 turns the probe off)",
            args.host_probe_us
        ));
    }
    if args.host_stall_us == 0 {
        return Err("--host-stall-us: must be at least 1".into());
    }
    if !(1..=10_000_000).contains(&args.host_stall_cap) {
        return Err(format!(
            "--host-stall-cap: {} is outside 1-10000000",
            args.host_stall_cap
        ));
    }
    Ok(())
}

/// The server's lookup histogram, scraped from `url`.
async fn lookup_histogram(url: &str) -> anyhow::Result<Histogram> {
    let page = reqwest::get(url)
        .await
        .and_then(reqwest::Response::error_for_status)
        .with_context(|| format!("scraping {url}"))?
        .text()
        .await
        .with_context(|| format!("reading {url}"))?;
    Histogram::parse(&page, LOOKUP_HISTOGRAM)
        .with_context(|| format!("{LOOKUP_HISTOGRAM} missing from {url}"))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    check(&args).map_err(anyhow::Error::msg)?;
    if let Some(cpus) = &args.client_cpus {
        // Before the runtime: its threads, and the schedule thread, inherit it.
        cpus.pin_this_thread()
            .with_context(|| format!("--client-cpus {cpus}"))?;
    }
    let runtime = match args.client_threads {
        0 => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        1 => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        n => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(n)
            .enable_all()
            .build(),
    }
    .context("building the client's runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut server = None;
    let mut metrics_url = args.metrics_url.clone();
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
            let workers = args.server_workers.to_string();
            let env: &[(&str, &str)] = match args.server_workers {
                0 => &[],
                _ => &[("TOKIO_WORKER_THREADS", &workers)],
            };
            let mut p = ServiceProcess::start_with_env(&bin, &server_args, env);
            let addr = p.addr("grpc").to_string();
            if let Some(cpus) = &args.server_cpus {
                cpus.pin_process(p.pid())
                    .with_context(|| format!("--server-cpus {cpus}"))?;
            }
            metrics_url.get_or_insert_with(|| format!("http://{}/metrics", p.admin_addr()));
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
    if args.rate.is_some() && args.host_probe_us > 0 {
        let cpus = host_probe::cpus(args.client_cpus.as_ref(), args.server_cpus.as_ref());
        let period = Duration::from_micros(args.host_probe_us);
        let over = Duration::from_micros(args.host_stall_us);
        if let Some(warning) = host_probe::start(cpus, period, over, args.host_stall_cap)? {
            eprintln!("{warning}");
        }
    }

    let floor = match args.rate.filter(|_| args.floor) {
        Some(rate) => {
            say("measuring the host's floor (TCP echo)…".into());
            Some(phases::floor_phase(&args, rate).await?)
        }
        None => None,
    };
    let (tcp_floor, floor_schedule) = floor.unzip();

    // `--open-loop-client direct`: the open loop's own connections.
    let direct = args
        .rate
        .filter(|_| args.open_loop_client == OpenLoopClient::Direct)
        .map(|rate| phases::open_loop_settings(&args, rate));
    let direct_phase = |open: &OpenLoop| direct::Phase {
        target: target.clone(),
        connections: args.connections,
        open: *open,
    };
    say("measuring the empty RPC (grpc.health.v1 Check)…".into());
    let (empty, _, empty_schedule) = match &direct {
        Some(open) => {
            let check = Bytes::from(HealthCheckRequest::default().encode_to_vec());
            direct_phase(open)
                .run(
                    HEALTH_CHECK,
                    move |_| check.clone(),
                    |answer| {
                        HealthCheckResponse::decode(answer)?;
                        Ok(true)
                    },
                )
                .await?
        }
        None => {
            phases::phase(&channels, &args, |channel, _| async move {
                HealthClient::new(channel)
                    .check(HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .map(|_| true)
            })
            .await?
        }
    };

    say(format!(
        "measuring LookupRoute ({}-block prompts)…",
        args.prompt_blocks
    ));
    let prompt_blocks = args.prompt_blocks;
    let new_blocks = args.new_blocks;
    let server_before = match &metrics_url {
        Some(url) => Some(lookup_histogram(url).await?),
        None => None,
    };
    let mut lookup_bodies_pooled = None;
    let (lookup, hits, lookup_schedule) = match args.lookup_client {
        LookupClient::Lean => {
            let max = args.max_candidates;
            let bodies = Arc::new(Bodies::new(fleet, prompt_blocks, new_blocks, move |h| {
                lookup_request(h, max)
            }));
            lookup_bodies_pooled = Some(bodies.pooled());
            match &direct {
                Some(open) => {
                    let body = move |i| bodies.get(i);
                    direct_phase(open)
                        .run(lean::LOOKUP_ROUTE, body, |answer| {
                            Ok(lean::LeanAnswer::decode(answer)?.routed_by_prefix())
                        })
                        .await?
                }
                None => {
                    phases::phase(&channels, &args, move |channel, i| {
                        let body = bodies.get(i);
                        async move {
                            lean::lookup_route(channel, body)
                                .await
                                .map(|answer| answer.routed_by_prefix())
                        }
                    })
                    .await?
                }
            }
        }
        LookupClient::Full => {
            let max = args.max_candidates;
            let request = move |i| {
                lookup_request(
                    fleet.lookup_prompt_with_new(i, prompt_blocks, new_blocks),
                    max,
                )
            };
            match &direct {
                Some(open) => {
                    let body = move |i| Bytes::from(request(i).encode_to_vec());
                    direct_phase(open)
                        .run(lean::LOOKUP_ROUTE, body, |answer| {
                            let response = pb::LookupRouteResponse::decode(answer)?;
                            Ok(response.outcome == pb::LookupOutcome::PrefixMatch as i32)
                        })
                        .await?
                }
                None => {
                    phases::phase(&channels, &args, move |channel, i| {
                        let request = request(i);
                        async move {
                            let response = IndexServiceClient::new(channel)
                                .lookup_route(request)
                                .await?
                                .into_inner();
                            Ok(response.outcome == pb::LookupOutcome::PrefixMatch as i32)
                        }
                    })
                    .await?
                }
            }
        }
    };
    let server_lookup = match (&metrics_url, server_before) {
        (Some(url), Some(before)) => Some(
            lookup_histogram(url)
                .await?
                .since(&before)
                .context("the server's lookup histogram changed its buckets")?
                .summary(),
        ),
        _ => None,
    };

    // Off the runtime: the server's graceful stop waits for the client's
    // connections to close, which on a current-thread runtime nothing
    // would do while `stop` blocked its one thread.
    if let Some(mut p) = server {
        tokio::task::spawn_blocking(move || p.stop())
            .await
            .context("stopping the index server")?;
    }
    let report = Report {
        target,
        replicas: args.replicas,
        entries: args.entries,
        prompt_blocks: args.prompt_blocks,
        new_blocks: args.new_blocks,
        concurrency: args.concurrency,
        connections: args.connections,
        rate: args.rate,
        client_threads: args.client_threads,
        lookup_client: args.lookup_client,
        max_candidates: args.max_candidates,
        lookup_bodies_pooled,
        client_cpus: args.client_cpus.as_ref().map(Cpus::to_string),
        server_cpus: args.server_cpus.as_ref().map(Cpus::to_string),
        server_workers: args.server_workers,
        open_loop: empty_schedule
            .zip(lookup_schedule)
            .map(|(empty_rpc, lookup_route)| OpenLoopReport {
                client: args.open_loop_client,
                spacing: args.spacing,
                spin_us: args.spin_us,
                seed: args.seed,
                tcp_floor: floor_schedule,
                empty_rpc,
                lookup_route,
            }),
        server_lookup,
        preload_events: events,
        preload_seconds: took.as_secs_f64(),
        preload_events_per_second: events as f64 / took.as_secs_f64().max(1e-9),
        tcp_floor,
        lookup_hit_ratio: hits as f64 / (lookup.requests.max(1)) as f64,
        lookup_to_empty_qps_ratio: lookup.qps / empty.qps.max(1e-9),
        empty_rpc: empty,
        lookup_route: lookup,
    };
    if let Some(o) = &report.open_loop {
        let floor = o.tcp_floor.as_ref().map(|s| ("TCP floor", s));
        for (name, s) in floor.into_iter().chain([
            ("empty RPC", &o.empty_rpc),
            ("LookupRoute", &o.lookup_route),
        ]) {
            if let Some(warning) = open_loop::spin_warning(name, o.spin_us, s) {
                eprintln!("{warning}");
            }
            let duration = Duration::from_secs_f64(args.duration_secs);
            if let Some(warning) = open_loop::stretch_warning(name, duration, s) {
                eprintln!("{warning}");
            }
        }
    }
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
        "index server {}: {} replicas, {} entries, {}-block prompts, {load} over {} connections, {:?} LookupRoute client",
        r.target, r.replicas, r.entries, r.prompt_blocks, r.connections, r.lookup_client
    );
    println!(
        "preload (IngestEvents over gRPC): {} block events in {:.2} s = {:.0} events/s",
        r.preload_events, r.preload_seconds, r.preload_events_per_second
    );
    println!(
        "{:<26} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "phase", "qps", "p50 µs", "p99 µs", "p99.9 µs", "errors"
    );
    let floor = r.tcp_floor.as_ref().map(|s| ("TCP echo (the floor)", s));
    for (name, s) in floor.into_iter().chain([
        ("empty RPC (health Check)", &r.empty_rpc),
        ("LookupRoute", &r.lookup_route),
    ]) {
        println!(
            "{:<26} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>8}",
            name, s.qps, s.p50_us, s.p99_us, s.p999_us, s.errors
        );
    }
    if let Some(s) = &r.server_lookup {
        println!(
            "{:<26} {:>10} {:>10.0} {:>10.0} {:>10.0}   (server's histogram, mean {:.0} µs)",
            "LookupRoute in the server", "", s.p50_us, s.p99_us, s.p999_us, s.mean_us
        );
    }
    if let Some(o) = &r.open_loop {
        println!(
            "schedule: {} spacing, spin {} µs; sends late by (p50 / p99 / p99.9 µs):",
            o.spacing, o.spin_us
        );
        let floor = o.tcp_floor.as_ref().map(|s| ("TCP floor", s));
        for (name, s) in floor.into_iter().chain([
            ("empty RPC", &o.empty_rpc),
            ("LookupRoute", &o.lookup_route),
        ]) {
            println!(
                "  {name}: {} due; hand-over {:.0} / {:.0} / {:.0}, request start {:.0} / {:.0} / {:.0}; from the start to the answer {:.0} / {:.0} / {:.0}; spinning {:.0}% of a core",
                s.scheduled,
                s.dispatch_lateness_us.p50_us,
                s.dispatch_lateness_us.p99_us,
                s.dispatch_lateness_us.p999_us,
                s.send_lateness_us.p50_us,
                s.send_lateness_us.p99_us,
                s.send_lateness_us.p999_us,
                s.from_start_us.p50_us,
                s.from_start_us.p99_us,
                s.from_start_us.p999_us,
                s.spin_fraction * 100.0
            );
            if let Some(steal) = &s.steal {
                let per_cpu: Vec<String> = steal
                    .iter()
                    .map(|c| format!("CPU {} {:.0} ms", c.cpu, c.ms))
                    .collect();
                println!("    steal over the phase: {}", per_cpu.join(", "));
            }
            if let Some(h) = &s.cpu_stalls {
                println!("    {}", h.describe());
            }
        }
    }
    println!(
        "LookupRoute hit ratio {:.1}%, LookupRoute/empty qps {:.2}",
        r.lookup_hit_ratio * 100.0,
        r.lookup_to_empty_qps_ratio
    );
}
