//! `ic-local-fleet`: the InferenceCache data plane on one machine.
//!
//! Starts the real `ic-index-server` and `ic-coordinator` binaries, N
//! simulated engines that publish their KV-cache changes in the vLLM wire
//! over ZMQ, and one real `ic-kvevent-subscriber` per engine. A trace is then
//! replayed with LookupRoute routing through the real index, and — on
//! identical simulated engines — with round-robin and random routing and the
//! single-cache oracle, so the table shows what cache-aware routing buys.

mod cache;
mod fleet;
mod report;
mod trace;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use ic_e2e::engine::FakeEngine;
use ic_e2e::{ServiceProcess, http_get};
use ic_kvevents::encode::Era;
use serde::Serialize;

use crate::fleet::{PolicyResult, percentile};

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
    /// sessions) instead of a trace file.
    #[arg(long)]
    synthetic: bool,
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.engines == 0 {
        bail!("--engines must be at least 1");
    }
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("binary has no directory")?
            .to_path_buf(),
    };
    let use_synthetic = args.synthetic
        || (args.trace == std::path::Path::new(DEFAULT_TRACE) && !args.trace.exists());
    let mut trace = if use_synthetic {
        if !args.synthetic && !args.json {
            eprintln!(
                "{DEFAULT_TRACE} not found (run from the repository root to use it); \
                 replaying a synthetic chat workload instead"
            );
        }
        trace::synthetic(200, 12, 16)
    } else {
        trace::read_trace(&args.trace).with_context(|| {
            format!(
                "reading the trace (run from the repository root, or pass --trace PATH): {}",
                args.trace.display()
            )
        })?
    };
    if let Some(n) = args.requests {
        trace.truncate(n);
    }
    let started = Instant::now();
    let say = |msg: &str| {
        if !args.json {
            eprintln!("{msg}");
        }
    };

    say("starting index server and coordinator…");
    let mut index = ServiceProcess::start(
        &binary(&bin_dir, "ic-index-server")?,
        &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
    );
    let grpc = index.addr("grpc").to_string();
    let index_http = index.admin_addr();
    let mut coordinator = ServiceProcess::start(
        &binary(&bin_dir, "ic-coordinator")?,
        &["--host", "127.0.0.1", "--port", "0"],
    );
    let coordinator_http = coordinator.admin_addr();

    say(&format!(
        "starting {} simulated engines and their subscribers…",
        args.engines
    ));
    let subscriber_bin = binary(&bin_dir, "ic-kvevent-subscriber")?;
    let mut engines = Vec::new();
    let mut subscribers = Vec::new();
    for i in 0..args.engines {
        let engine = FakeEngine::start(args.era.era(), "kv-events").await;
        let args = engine.subscriber_args(
            &format!("http://{grpc}"),
            &format!("engine-{i}"),
            TENANT,
            MODEL,
            &format!("127.0.0.{}:8000", i + 1),
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        subscribers.push(ServiceProcess::start(&subscriber_bin, &args));
        engines.push(engine);
    }
    for engine in &mut engines {
        engine.wait_for_subscriber().await;
    }

    let mut policies = vec![];
    say(&format!(
        "replaying {} requests ({}x speed)…",
        trace.len(),
        args.speed
    ));
    let total = trace.len();
    let json = args.json;
    let routed_config = fleet::RoutedConfig {
        capacity: args.capacity_blocks,
        grpc_url: format!("http://{grpc}"),
        tenant: TENANT.to_owned(),
        model: MODEL.to_owned(),
        speed: args.speed,
    };
    let routed = fleet::run_routed(&trace, &mut engines, &routed_config, |done| {
        if !json && (done % 50 == 0 || done == total) {
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
    policies.push(routed.result.clone());
    policies.extend(fleet::simulate_baselines(
        &trace,
        args.engines,
        args.capacity_blocks,
        args.seed,
    ));

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
    let mut latencies = routed.latencies.clone();
    latencies.sort();
    let report = Report {
        engines: args.engines,
        capacity_blocks: args.capacity_blocks,
        requests: trace.len(),
        policies,
        lookup_p50_us: percentile(&latencies, 50.0).as_micros(),
        lookup_p99_us: percentile(&latencies, 99.0).as_micros(),
        routed_by_hint: routed.routed_by_hint,
        engine_batches_published: routed.batches_published,
        engine_block_events: routed.block_events_published,
        block_events_per_second: routed.block_events_published as f64
            / routed.elapsed.as_secs_f64().max(1e-9),
        index_batches_applied: metric(
            &index_metrics,
            "inferencecache_index_ingest_batches_total{result=\"applied\"}",
        ),
        index_entries: entries,
        index_memory_bytes: metric(&index_metrics, "inferencecache_index_memory_bytes"),
        index_agrees_with_engines: agrees,
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
        workload: if use_synthetic {
            "synthetic chat workload".to_owned()
        } else {
            format!("trace {}", args.trace.display())
        },
        engines: report.engines,
        capacity_blocks: report.capacity_blocks,
        lookup_p50_us: report.lookup_p50_us,
        lookup_p99_us: report.lookup_p99_us,
        index_entries: report.index_entries,
        index_memory_bytes: report.index_memory_bytes,
        index_agrees: report.index_agrees_with_engines,
        wall_seconds: report.wall_seconds,
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

    if args.keep_running {
        println!("\nServices stay up; press Ctrl-C to stop them.");
        println!("  index server gRPC     http://{grpc}  (LookupRoute)");
        println!("  index server HTTP     http://{index_http}  (/snapshot, /metrics)");
        println!("  coordinator           http://{coordinator_http}");
        for (i, s) in subscribers.iter_mut().enumerate() {
            println!("  subscriber engine-{i}  http://{}/metrics", s.admin_addr());
        }
        wait_for_ctrl_c().await;
    }

    let mut unclean = Vec::new();
    for (name, process) in subscribers
        .iter_mut()
        .map(|p| ("ic-kvevent-subscriber", p))
        .chain([
            ("ic-index-server", &mut index),
            ("ic-coordinator", &mut coordinator),
        ])
    {
        let status = process.stop();
        if !status.success() {
            unclean.push(format!("{name} exited with {status}"));
        }
    }
    if !unclean.is_empty() {
        bail!("unclean shutdown: {}", unclean.join("; "));
    }
    if !report.index_agrees_with_engines {
        bail!("the index did not converge to the engines' cache contents");
    }
    Ok(())
}

fn print_table(r: &Report) {
    println!(
        "\n{} requests, {} engines × {} blocks of KV cache\n",
        r.requests, r.engines, r.capacity_blocks
    );
    println!(
        "{:<30} {:>10} {:>10} {:>22}",
        "ROUTING", "REQUESTS", "HIT RATIO", "PREFILL TOKENS SAVED"
    );
    for p in &r.policies {
        println!(
            "{:<30} {:>10} {:>9.1}% {:>14} ({:>4.1}%)",
            p.policy,
            p.requests,
            100.0 * p.hit_ratio(),
            p.prefill_tokens_saved,
            if p.prompt_tokens == 0 {
                0.0
            } else {
                100.0 * p.prefill_tokens_saved as f64 / p.prompt_tokens as f64
            }
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
