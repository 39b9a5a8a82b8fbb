//! `ic-local-fleet`: the InferenceCache data plane on one machine.
//!
//! Starts the real `ic-index-server` (one or more replicas, all active) and
//! `ic-coordinator` binaries, N simulated engines that publish their
//! KV-cache changes in the vLLM wire over ZMQ, and one real
//! `ic-kvevent-subscriber` per engine streaming to every index replica. A
//! trace is then replayed with LookupRoute routing through the real index,
//! and — on identical simulated engines — with round-robin and random
//! routing and the single-cache oracle, so the table shows what cache-aware
//! routing buys.

mod cache;
mod epp_client;
mod fleet;
mod placements;
mod replicas;
mod report;
mod rng;
mod summary;
mod timing;
mod trace;
mod variants;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use ic_kvevents::encode::Era;
use ic_sim::engine::FakeEngine;
use ic_sim::{ServiceProcess, http_get};

use crate::replicas::{AlikeCheck, IndexReplicas, SnapshotCounts};
use crate::summary::{Report, print_table};
use crate::variants::{VARIANTS, Variant};

const TENANT: &str = "demo";
const DEFAULT_TRACE: &str = "../shared/data/traces/mooncake_synthetic_trace.jsonl";
const MODEL: &str = "demo/llama-3.1-8b";

/// Run the InferenceCache data plane on this machine and replay a trace.
#[derive(Debug, Parser)]
#[command(name = "ic-local-fleet", version)]
struct Args {
    /// Simulated engines (each with its own subscriber).
    #[arg(long, default_value_t = 8)]
    engines: usize,
    /// Index-server replicas, all active: every subscriber streams to each,
    /// and the gateways ask them in turn (round-robin per request).
    #[arg(long, default_value_t = 1)]
    index_replicas: usize,
    /// Blocks each engine's KV cache holds (the HBM budget).
    #[arg(long, default_value_t = 1500)]
    capacity_blocks: usize,
    /// Mooncake-format trace (timestamp, input_length, hash_ids per line).
    /// When the default is absent, a synthetic chat workload is used.
    #[arg(long, default_value = DEFAULT_TRACE)]
    trace: PathBuf,
    /// Replay a synthetic chat workload (shared system prompts, multi-turn
    /// sessions) instead of a trace file (same as `--workload chat`).
    #[arg(long)]
    synthetic: bool,
    /// What to replay: the trace file, a synthetic chat workload with 16
    /// system prompts, or many multi-turn conversations behind one shared
    /// first block with caches far smaller than the working set (where
    /// prefix-only routing collapses).
    #[arg(long, value_enum, default_value = "trace")]
    workload: Workload,
    /// Engine prefill speed of the timing model (TTFT), tokens per second.
    #[arg(long, default_value_t = 30_000.0)]
    prefill_tokens_per_second: f64,
    /// Fixed per-request cost of the timing model, ms.
    #[arg(long, default_value_t = 20.0)]
    request_overhead_ms: f64,
    /// Replay through the real index once per scoring variant (prefix only,
    /// by the weights, TTFT told the rate, through LookupRoute and the
    /// endpoint picker); otherwise only the default.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    compare_scoring: bool,
    /// Replay only the first N requests.
    #[arg(long)]
    requests: Option<usize>,
    /// Time compression of the trace's arrival times.
    #[arg(long, default_value_t = 100.0)]
    speed: f64,
    /// Seed of the random-routing baseline.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Print the results as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Keep the services running (until Ctrl-C) after the replay.
    #[arg(long)]
    keep_running: bool,
    /// KV-event wire encoding the simulated engines publish: vLLM's `map`
    /// (msgspec structs as maps) or `array` (array_like structs).
    #[arg(long, value_enum, default_value = "map")]
    era: WireEra,
    /// Where to write the report (Markdown, with an SVG chart beside it).
    #[arg(long, default_value = "target/local-fleet/report.md")]
    report: PathBuf,
    /// Directory holding the service binaries (default: next to this one).
    #[arg(long, env = "IC_BIN_DIR")]
    bin_dir: Option<PathBuf>,
    /// OTLP/gRPC collector (`http://host:port`) every service of the fleet
    /// pushes its traces and metrics to (their `--otlp-endpoint`).
    #[arg(long, env = "IC_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// Run only the routed variants whose name contains one of these
    /// (comma-separated; default: every variant).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Multiplies the prefill rate the calibrated TTFT variants are told
    /// (a sensitivity check: 0.1 tells them engines ten times slower).
    #[arg(long, default_value_t = 1.0)]
    ttft_rate_scale: f64,
    /// An extra flag for every index server of every variant (repeatable),
    /// e.g. `--index-arg=--ttft-prefill-tokens-per-second=20000`.
    #[arg(long, allow_hyphen_values = true)]
    index_arg: Vec<String>,
    /// Write where each request of each routed variant went to
    /// `DIR/<N>-<variant>.csv`, N the variant's place in the list of
    /// variants (request, replica asked, engine, how chosen, hit blocks,
    /// prompt blocks, the most blocks any engine held, TTFT ms), to compare
    /// two runs request by request.
    #[arg(long)]
    placements: Option<PathBuf>,
    /// How long, in seconds, to wait for every index replica to list every
    /// engine before a variant's replay; past it the run fails naming the
    /// engines missing.
    #[arg(long, default_value_t = 60)]
    ready_timeout_secs: u64,
}

impl Args {
    /// Environment for every service the fleet starts.
    fn service_env(&self) -> Vec<(&'static str, &str)> {
        self.otlp_endpoint
            .as_deref()
            .map(|e| ("IC_OTLP_ENDPOINT", e))
            .into_iter()
            .collect()
    }
}

/// Workloads the fleet can replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Workload {
    /// `--trace` (the Mooncake trace by default).
    Trace,
    /// 200 sessions × 12 turns over 16 shared system prompts.
    Chat,
    /// 12,000 requests of multi-turn conversations (1,000 open at a time, 20 turns of 3 blocks) behind one shared block.
    SharedPrefixChat,
}

/// The vLLM KV-event encodings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum WireEra {
    /// Events as msgpack maps.
    Map,
    /// Events as msgpack arrays (array_like).
    Array,
}

impl WireEra {
    fn era(self) -> Era {
        match self {
            WireEra::Map => Era::VllmMap,
            WireEra::Array => Era::VllmArray,
        }
    }
}

fn binary(dir: &std::path::Path, name: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{name} not found in {}: build with `cargo build --workspace --bins`",
            dir.display()
        );
    }
    Ok(path)
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// What one routed variant left behind.
struct VariantRun {
    routed: fleet::RoutedRun,
    agrees: bool,
    entries: u64,
    alike: AlikeCheck,
    /// The first replica's /metrics (each replica holds the whole index).
    index_metrics: String,
    /// The services, still running (stopped by the caller).
    services: Services,
}

/// The processes of one variant.
struct Services {
    index: IndexReplicas,
    subscribers: Vec<ServiceProcess>,
}

impl Services {
    /// Stops every process; the names of those that did not exit cleanly.
    fn stop(mut self) -> Vec<String> {
        let mut unclean = Vec::new();
        for process in &mut self.subscribers {
            let status = process.stop();
            if !status.success() {
                unclean.push(format!("ic-kvevent-subscriber exited with {status}"));
            }
        }
        unclean.extend(self.index.stop());
        unclean
    }
}

impl AlikeCheck {
    /// Whether the replicas answered alike (always, with one replica).
    fn alike(&self) -> bool {
        self.snapshots_identical && self.holders_differ == 0 && self.best_differ == 0
    }
}

/// Prompts asked of every replica after the replay: the last requests of
/// the trace, whose blocks the engines most likely still hold.
const ALIKE_PROBES: usize = 200;

/// Starts the index replicas with `variant`'s flags, the engines and their
/// subscribers, replays the trace through LookupRoute, and checks that
/// every replica converged to what the engines hold and that they answer
/// alike.
async fn run_variant(
    args: &Args,
    bin_dir: &std::path::Path,
    trace: &[trace::TraceRequest],
    variant: &Variant,
    say: &dyn Fn(&str),
) -> anyhow::Result<VariantRun> {
    let mut index_args: Vec<String> = ["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"]
        .iter()
        .chain(variant.flags)
        .map(|s| (*s).to_owned())
        .chain(args.index_arg.iter().cloned())
        .collect();
    if variant.ttft {
        // The server's clock runs at wall speed, the engines' at the
        // replay's: the rate it is told is the simulated rate, sped up; and
        // each index block (16 token ids) stands for a trace block of 512
        // tokens the engines prefill.
        let tokens_per_index_token =
            fleet::TRACE_BLOCK_TOKENS as f64 / f64::from(fleet::ENGINE_BLOCK_TOKENS);
        index_args.push(format!(
            "--ttft-prefill-tokens-per-second={}",
            args.prefill_tokens_per_second * args.speed / tokens_per_index_token
                * args.ttft_rate_scale
        ));
        index_args.push(format!(
            "--ttft-request-overhead-ms={}",
            args.request_overhead_ms / args.speed
        ));
    }
    if variant.epp {
        let endpoints: Vec<String> = (0..args.engines)
            .map(|i| format!("127.0.0.{}:8000", i + 1))
            .collect();
        index_args.extend([
            "--epp-addr".to_owned(),
            "127.0.0.1:0".to_owned(),
            "--epp-tenant".to_owned(),
            TENANT.to_owned(),
            "--epp-endpoint".to_owned(),
            endpoints.join(","),
        ]);
    }
    let index_args: Vec<&str> = index_args.iter().map(String::as_str).collect();
    let env = args.service_env();
    let index = IndexReplicas::start(
        &binary(bin_dir, "ic-index-server")?,
        &index_args,
        &env,
        args.index_replicas,
        variant.epp,
    );
    let subscriber_bin = binary(bin_dir, "ic-kvevent-subscriber")?;
    let mut engines = Vec::new();
    let mut subscribers = Vec::new();
    for i in 0..args.engines {
        let engine = FakeEngine::start(args.era.era(), "kv-events").await;
        let sub_args = engine.subscriber_args(
            &index.subscriber_target(),
            &format!("engine-{i}"),
            TENANT,
            MODEL,
            &format!("127.0.0.{}:8000", i + 1),
        );
        let sub_args: Vec<&str> = sub_args.iter().map(String::as_str).collect();
        subscribers.push(ServiceProcess::start_with_env(
            &subscriber_bin,
            &sub_args,
            &env,
        ));
        engines.push(engine);
    }
    for engine in &mut engines {
        engine.wait_for_subscriber().await;
    }
    // An engine the index does not list is never a candidate, and an engine
    // never picked publishes nothing: replay only once every replica lists
    // every engine (a late opening resync once left one engine unpicked for
    // the first 100 s of a three-replica replay).
    let deadline = Instant::now() + Duration::from_secs(args.ready_timeout_secs);
    for (r, addr) in index.http.iter().enumerate() {
        loop {
            let missing = SnapshotCounts::read(*addr)?.missing_engines(args.engines);
            if missing.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "index replica #{r} ({addr}) still does not list {missing:?} after {} s \
                     (--ready-timeout-secs)",
                    args.ready_timeout_secs
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    say(&format!(
        "replaying {} requests ({}x speed) with {}…",
        trace.len(),
        args.speed,
        variant.name
    ));
    let total = trace.len();
    let json = args.json;
    let routed_config = fleet::RoutedConfig {
        capacity: args.capacity_blocks,
        grpc_urls: index.grpc_urls.clone(),
        tenant: TENANT.to_owned(),
        model: MODEL.to_owned(),
        speed: args.speed,
        policy: variant.name.to_owned(),
        timing: timing::TimingModel {
            prefill_tokens_per_second: args.prefill_tokens_per_second,
            overhead_ms: args.request_overhead_ms,
        },
        epp_urls: index.epp_urls.clone(),
    };
    let routed = fleet::run_routed(trace, &mut engines, &routed_config, |done| {
        if !json && (done % 200 == 0 || done == total) {
            let width = 30;
            let filled = done * width / total.max(1);
            eprint!(
                "\r  [{}{}] {done}/{total}",
                "#".repeat(filled),
                " ".repeat(width - filled)
            );
            if done == total {
                eprintln!();
            }
        }
    })
    .await?;
    // Every replica must end up holding exactly what the engines hold.
    let held: Vec<usize> = routed.caches.iter().map(|c| c.len()).collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let counts = loop {
        let counts = index
            .http
            .iter()
            .map(|addr| SnapshotCounts::read(*addr))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if counts.iter().all(|c| c.matches_engines(&held)) || Instant::now() > deadline {
            break counts;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let agrees = counts.iter().all(|c| c.matches_engines(&held));
    let entries = counts.first().map_or(0, |c| c.entries);
    let probes: Vec<Vec<u32>> = trace
        .iter()
        .rev()
        .take(ALIKE_PROBES)
        .map(|r| {
            r.hash_ids
                .iter()
                .flat_map(|id| fleet::block_tokens(*id))
                .collect()
        })
        .collect();
    let compared = replicas::compare_answers(
        &index.grpc_urls,
        TENANT,
        MODEL,
        &probes,
        variant.prefix_decides,
    )
    .await?;
    let alike = AlikeCheck {
        variant: variant.name.to_owned(),
        replicas: index.http.len(),
        snapshots_identical: counts.windows(2).all(|w| w[0] == w[1]),
        probes: probes.len(),
        probes_matched: compared.matched,
        holders_differ: compared.holders_differ,
        best_checked: compared.best_checked,
        best_differ: compared.best_differ,
    };
    let (_, index_metrics) = http_get(index.http[0], "/metrics");
    Ok(VariantRun {
        routed,
        agrees,
        entries,
        alike,
        index_metrics,
        services: Services { index, subscribers },
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.engines == 0 {
        bail!("--engines must be at least 1");
    }
    if args.index_replicas == 0 {
        bail!("--index-replicas must be at least 1");
    }
    if args.ready_timeout_secs == 0 {
        bail!("--ready-timeout-secs must be at least 1");
    }
    if !(args.prefill_tokens_per_second.is_finite() && args.prefill_tokens_per_second > 0.0) {
        bail!("--prefill-tokens-per-second must be a positive number");
    }
    if !(args.ttft_rate_scale.is_finite() && args.ttft_rate_scale > 0.0) {
        bail!("--ttft-rate-scale must be a positive number");
    }
    if !(args.request_overhead_ms.is_finite() && args.request_overhead_ms >= 0.0) {
        bail!("--request-overhead-ms must be a non-negative number");
    }
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("binary has no directory")?
            .to_path_buf(),
    };
    let workload = if args.synthetic {
        Workload::Chat
    } else if args.workload == Workload::Trace
        && args.trace == std::path::Path::new(DEFAULT_TRACE)
        && !args.trace.exists()
    {
        if !args.json {
            eprintln!(
                "{DEFAULT_TRACE} not found (run from the repository root to use it); \
                 replaying a synthetic chat workload instead"
            );
        }
        Workload::Chat
    } else {
        args.workload
    };
    let mut trace = match workload {
        Workload::Chat => trace::synthetic(200, 12, 16),
        Workload::SharedPrefixChat => trace::shared_prefix_chat(12_000, 1_000, 20, 3),
        Workload::Trace => trace::read_trace(&args.trace).with_context(|| {
            format!(
                "reading the trace (run from the repository root, or pass --trace PATH): {}",
                args.trace.display()
            )
        })?,
    };
    if let Some(n) = args.requests {
        trace.truncate(n);
    }
    let started = Instant::now();
    let json = args.json;
    let say = move |msg: &str| {
        if !json {
            eprintln!("{msg}");
        }
    };

    say("starting the coordinator…");
    let mut coordinator = ServiceProcess::start_with_env(
        &binary(&bin_dir, "ic-coordinator")?,
        &["--host", "127.0.0.1", "--port", "0"],
        &args.service_env(),
    );
    let coordinator_http = coordinator.admin_addr();

    say(&format!(
        "each run: {} index-server replica(s), {} simulated engines and their subscribers",
        args.index_replicas, args.engines
    ));
    let variants: Vec<&Variant> = if args.compare_scoring {
        VARIANTS.iter().collect()
    } else {
        VARIANTS.last().into_iter().collect()
    };
    let variants: Vec<&Variant> = variants
        .into_iter()
        .filter(|v| args.only.is_empty() || args.only.iter().any(|o| v.name.contains(o.as_str())))
        .collect();
    if variants.is_empty() {
        bail!("--only {:?} matches no routed variant", args.only);
    }
    let mut policies = vec![];
    let mut alike = vec![];
    let mut unclean = Vec::new();
    let mut last = None;
    for (i, variant) in variants.iter().enumerate() {
        let run = run_variant(&args, &bin_dir, &trace, variant, &say).await?;
        if !run.agrees {
            unclean.extend(run.services.stop());
            bail!(
                "{}: the index did not converge to the engines' cache contents",
                variant.name
            );
        }
        if !run.alike.alike() {
            unclean.extend(run.services.stop());
            bail!(
                "{}: the index replicas did not answer alike: {:?}",
                variant.name,
                run.alike
            );
        }
        if let Some(dir) = &args.placements {
            let position = VARIANTS
                .iter()
                .position(|v| v.name == variant.name)
                .context("a variant not in the list")?;
            placements::write(dir, position, variant.name, &run.routed.placements)?;
        }
        alike.push(run.alike.clone());
        policies.push(run.routed.result.clone());
        if i + 1 == variants.len() {
            last = Some(run);
        } else {
            unclean.extend(run.services.stop());
        }
    }
    let Some(run) = last else {
        bail!("no routed run");
    };
    let timing = timing::TimingModel {
        prefill_tokens_per_second: args.prefill_tokens_per_second,
        overhead_ms: args.request_overhead_ms,
    };
    policies.extend(fleet::simulate_baselines(
        &trace,
        args.engines,
        args.capacity_blocks,
        args.seed,
        timing,
    ));
    let routed = &run.routed;
    let latencies: Vec<f64> = routed
        .latencies
        .iter()
        .map(|d| d.as_secs_f64() * 1e6)
        .collect();
    let report = Report {
        engines: args.engines,
        index_replicas: args.index_replicas,
        capacity_blocks: args.capacity_blocks,
        requests: trace.len(),
        policies,
        lookup_p50_us: timing::percentile_ms(&latencies, 50.0) as u128,
        lookup_p99_us: timing::percentile_ms(&latencies, 99.0) as u128,
        routed_by_hint: routed.routed_by_hint,
        engine_batches_published: routed.batches_published,
        engine_block_events: routed.block_events_published,
        block_events_per_second: routed.block_events_published as f64
            / routed.elapsed.as_secs_f64().max(1e-9),
        index_batches_applied: metric(
            &run.index_metrics,
            "inferencecache_index_ingest_batches_total{result=\"applied\"}",
        ),
        index_entries: run.entries,
        index_memory_bytes: metric(&run.index_metrics, "inferencecache_index_memory_bytes"),
        index_agrees_with_engines: run.agrees,
        replicas_alike: alike,
        wall_seconds: started.elapsed().as_secs_f64(),
    };

    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_table(&report);
    }
    let chart = args.report.with_extension("svg");
    let facts = report::RunFacts {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        workload: match workload {
            Workload::Chat => "synthetic chat workload (16 system prompts)".to_owned(),
            Workload::SharedPrefixChat => {
                "multi-turn conversations behind one shared first block".to_owned()
            }
            Workload::Trace => format!("trace {}", args.trace.display()),
        },
        engines: report.engines,
        capacity_blocks: report.capacity_blocks,
        index_replicas: report.index_replicas,
        lookup_p50_us: report.lookup_p50_us,
        lookup_p99_us: report.lookup_p99_us,
        index_entries: report.index_entries,
        index_memory_bytes: report.index_memory_bytes,
        index_agrees: report.index_agrees_with_engines,
        wall_seconds: report.wall_seconds,
        timing: format!("1/{:.0} s", args.prefill_tokens_per_second),
        overhead_ms: args.request_overhead_ms,
    };
    let chart_name = chart
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let written = args
        .report
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| std::fs::write(&chart, report::svg_chart(&report.policies)))
        .and_then(|()| {
            std::fs::write(
                &args.report,
                report::markdown(&facts, &report.policies, &chart_name),
            )
        });
    match written {
        Ok(()) => say(&format!(
            "report: {} (chart {})",
            args.report.display(),
            chart.display()
        )),
        Err(e) => eprintln!(
            "could not write the report to {}: {e}",
            args.report.display()
        ),
    }

    let mut services = run.services;
    if args.keep_running {
        println!("\nServices stay up; press Ctrl-C to stop them.");
        for (i, (grpc, http)) in services
            .index
            .grpc_urls
            .iter()
            .zip(&services.index.http)
            .enumerate()
        {
            println!("  index server #{i} gRPC  {grpc}  (LookupRoute)");
            println!("  index server #{i} HTTP  http://{http}  (/snapshot, /metrics)");
        }
        println!("  coordinator           http://{coordinator_http}");
        for (i, s) in services.subscribers.iter_mut().enumerate() {
            println!("  subscriber engine-{i}  http://{}/metrics", s.admin_addr());
        }
        wait_for_ctrl_c().await;
    }
    unclean.extend(services.stop());
    let status = coordinator.stop();
    if !status.success() {
        unclean.push(format!("ic-coordinator exited with {status}"));
    }
    if !unclean.is_empty() {
        bail!("unclean shutdown: {}", unclean.join("; "));
    }
    Ok(())
}

/// Waits for SIGINT (Ctrl-C) or SIGTERM.
async fn wait_for_ctrl_c() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
