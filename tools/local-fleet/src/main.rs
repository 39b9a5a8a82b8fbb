//! `ic-local-fleet`: the InferenceCache data plane on one machine.
//!
//! Starts the real `ic-index-server` and `ic-coordinator` binaries, N
//! simulated engines that publish their KV-cache changes in the vLLM wire
//! over ZMQ, and one real `ic-kvevent-subscriber` per engine. A trace is then
//! replayed with LookupRoute routing through the real index, and — on
//! identical simulated engines — with round-robin and random routing and the
//! single-cache oracle, so the table shows what cache-aware routing buys.

mod cache;
mod epp_client;
mod fleet;
mod report;
mod rng;
mod timing;
mod trace;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use ic_kvevents::encode::Era;
use ic_sim::engine::FakeEngine;
use ic_sim::{ServiceProcess, http_get};
use serde::Serialize;

use crate::fleet::PolicyResult;

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
    /// prefix + load, + speculative holders); otherwise only the default.
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

/// One way of running the real index: a name, its scoring flags, and
/// whether the gateway asks the endpoint picker instead of LookupRoute.
struct Variant {
    name: &'static str,
    flags: &'static [&'static str],
    epp: bool,
}

/// The scoring variants; the default scoring through LookupRoute is last
/// (its services are the ones `--keep-running` keeps).
const VARIANTS: [Variant; 4] = [
    Variant {
        name: "lookup-route, prefix only",
        flags: &[
            "--score-load-weight=0",
            "--score-kv-usage-weight=0",
            "--load-bound=0",
            "--score-t2-credit=1",
            "--speculative-ttl-ms=0",
        ],
        epp: false,
    },
    Variant {
        name: "lookup-route, prefix + load",
        flags: &["--speculative-ttl-ms=0"],
        epp: false,
    },
    Variant {
        name: "endpoint picker (ext_proc), default scoring",
        flags: &[],
        epp: true,
    },
    Variant {
        name: "lookup-route (default: + speculative)",
        flags: &[],
        epp: false,
    },
];

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

#[derive(Debug, Serialize)]
struct Report {
    engines: usize,
    capacity_blocks: usize,
    requests: usize,
    policies: Vec<PolicyResult>,
    lookup_p50_us: u128,
    lookup_p99_us: u128,
    routed_by_hint: u64,
    engine_batches_published: u64,
    engine_block_events: u64,
    block_events_per_second: f64,
    index_batches_applied: f64,
    index_entries: u64,
    /// Heap bytes the index holds at the end (its `memory_bytes` gauge).
    index_memory_bytes: f64,
    index_agrees_with_engines: bool,
    wall_seconds: f64,
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

const MIB: f64 = 1024.0 * 1024.0;

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
    index_metrics: String,
    /// The services, still running (stopped by the caller).
    services: Services,
}

/// The processes of one variant.
struct Services {
    index: ServiceProcess,
    subscribers: Vec<ServiceProcess>,
    grpc: String,
    index_http: std::net::SocketAddr,
}

impl Services {
    /// Stops every process; the names of those that did not exit cleanly.
    fn stop(mut self) -> Vec<String> {
        let mut unclean = Vec::new();
        for (name, process) in self
            .subscribers
            .iter_mut()
            .map(|p| ("ic-kvevent-subscriber", p))
            .chain([("ic-index-server", &mut self.index)])
        {
            let status = process.stop();
            if !status.success() {
                unclean.push(format!("{name} exited with {status}"));
            }
        }
        unclean
    }
}

/// Starts an index server with `variant`'s flags, the engines and their
/// subscribers, replays the trace through LookupRoute, and checks that the
/// index converged to what the engines hold.
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
        .collect();
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
    let mut index =
        ServiceProcess::start_with_env(&binary(bin_dir, "ic-index-server")?, &index_args, &env);
    let grpc = index.addr("grpc").to_string();
    let index_http = index.admin_addr();
    let epp_url = variant.epp.then(|| format!("http://{}", index.addr("epp")));
    let subscriber_bin = binary(bin_dir, "ic-kvevent-subscriber")?;
    let mut engines = Vec::new();
    let mut subscribers = Vec::new();
    for i in 0..args.engines {
        let engine = FakeEngine::start(args.era.era(), "kv-events").await;
        let sub_args = engine.subscriber_args(
            &format!("http://{grpc}"),
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
        grpc_url: format!("http://{grpc}"),
        tenant: TENANT.to_owned(),
        model: MODEL.to_owned(),
        speed: args.speed,
        policy: variant.name.to_owned(),
        timing: timing::TimingModel {
            prefill_tokens_per_second: args.prefill_tokens_per_second,
            overhead_ms: args.request_overhead_ms,
        },
        epp_url,
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
    // The index must end up holding exactly what the engines hold.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (agrees, entries) = loop {
        let (_, body) = http_get(index_http, "/snapshot");
        let snapshot: serde_json::Value = serde_json::from_str(&body)?;
        let entries = snapshot["entries"].as_u64().unwrap_or(0);
        let rows = snapshot["replicas"].as_array().cloned().unwrap_or_default();
        let agrees = routed.caches.iter().enumerate().all(|(i, cache)| {
            rows.iter().any(|r| {
                r["replicaId"] == format!("engine-{i}")
                    && r["prefixCount"].as_u64() == Some(cache.len() as u64)
            })
        });
        if agrees || Instant::now() > deadline {
            break (agrees, entries);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (_, index_metrics) = http_get(index_http, "/metrics");
    Ok(VariantRun {
        routed,
        agrees,
        entries,
        index_metrics,
        services: Services {
            index,
            subscribers,
            grpc,
            index_http,
        },
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.engines == 0 {
        bail!("--engines must be at least 1");
    }
    if !(args.prefill_tokens_per_second.is_finite() && args.prefill_tokens_per_second > 0.0) {
        bail!("--prefill-tokens-per-second must be a positive number");
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
        "each run: an index server, {} simulated engines and their subscribers",
        args.engines
    ));
    let variants: Vec<&Variant> = if args.compare_scoring {
        VARIANTS.iter().collect()
    } else {
        VARIANTS.last().into_iter().collect()
    };
    let mut policies = vec![];
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
        println!(
            "  index server gRPC     http://{}  (LookupRoute)",
            services.grpc
        );
        println!(
            "  index server HTTP     http://{}  (/snapshot, /metrics)",
            services.index_http
        );
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

fn print_table(r: &Report) {
    println!(
        "\n{} requests, {} engines × {} blocks of KV cache\n",
        r.requests, r.engines, r.capacity_blocks
    );
    println!(
        "{:<44} {:>9} {:>22} {:>10} {:>10}",
        "ROUTING", "HIT RATIO", "PREFILL TOKENS SAVED", "TTFT p50", "TTFT p99"
    );
    for p in &r.policies {
        println!(
            "{:<44} {:>8.1}% {:>14} ({:>4.1}%) {:>8.0}ms {:>8.0}ms",
            p.policy,
            100.0 * p.hit_ratio(),
            p.prefill_tokens_saved,
            if p.prompt_tokens == 0 {
                0.0
            } else {
                100.0 * p.prefill_tokens_saved as f64 / p.prompt_tokens as f64
            },
            p.ttft_p50_ms,
            p.ttft_p99_ms,
        );
    }
    println!();
    println!(
        "LookupRoute latency        p50 {} µs, p99 {} µs (gRPC round trip on loopback)",
        r.lookup_p50_us, r.lookup_p99_us
    );
    println!(
        "routed by a prefix hint    {} of {} requests",
        r.routed_by_hint, r.requests
    );
    println!(
        "engine batches → index     {} published, {} applied (with each subscriber's opening resync)",
        r.engine_batches_published, r.index_batches_applied
    );
    println!(
        "block events ingested      {} ({:.0}/s over the replay)",
        r.engine_block_events, r.block_events_per_second
    );
    println!(
        "index size                 {} entries in {:.1} MiB; matches every engine's cache: {}",
        r.index_entries,
        r.index_memory_bytes / MIB,
        if r.index_agrees_with_engines {
            "yes"
        } else {
            "NO"
        }
    );
    println!("wall time                  {:.1} s", r.wall_seconds);
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
