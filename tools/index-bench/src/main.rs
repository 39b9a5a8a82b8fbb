//! `ic-index-bench`: one event stream from the Mooncake trace replayed into
//! ic-index and into Dynamo's `RadixTree` in the same process, by the same
//! procedure, the order alternating between repetitions.
//!
//! ```text
//! cargo run --release -p ic-index-bench -- --trace /work/shared/data/traces/mooncake_synthetic_trace.jsonl --pairs 16000
//! ```

mod alloc;
mod ours;
mod run;
mod stream;
mod theirs;

use clap::Parser;

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

#[derive(Debug, Parser)]
#[command(about = "ic-index against Dynamo's RadixTree on one Mooncake event stream")]
struct Args {
    /// A Mooncake trace (JSON lines with `hash_ids`).
    #[arg(long)]
    trace: std::path::PathBuf,
    /// Resident (worker, block) pairs to aim for: the workers' capacities
    /// add up to this.
    #[arg(long, default_value_t = 16_000)]
    pairs: u64,
    /// Simulated workers (0: one per 65,536 pairs, at least 4).
    #[arg(long, default_value_t = 0)]
    workers: u32,
    /// Times the trace is replayed under distinct block ids (0: enough for
    /// a working set of 1.5× the pairs).
    #[arg(long, default_value_t = 0)]
    copies: u32,
    /// Repetitions; odd ones run Dynamo first.
    #[arg(long, default_value_t = 2)]
    reps: u32,
    /// Final lookups (sampled evenly over the prompts) after the replay.
    #[arg(long, default_value_t = 20_000)]
    finals: usize,
    /// Run only one side (for profiling): `ours` or `theirs`.
    #[arg(long)]
    only: Option<run::Side>,
    /// Also read this thread's time on CPU around each of ic-index's
    /// interleaved applies (`/proc/thread-self/schedstat`), to tell its own
    /// slow applies from the machine's preemptions (slows the replay).
    #[arg(long)]
    slow_applies: bool,
    /// Also write the figures as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.pairs == 0 {
        anyhow::bail!("--pairs must be positive");
    }
    if args.reps == 0 {
        anyhow::bail!("--reps must be positive");
    }
    let trace = stream::read_trace(&args.trace)?;
    let unique: std::collections::HashSet<u64> = trace
        .iter()
        .flat_map(|r| r.hash_ids.iter().copied())
        .collect();
    let workers = if args.workers > 0 {
        args.workers
    } else {
        u32::try_from(args.pairs / 65_536)
            .unwrap_or(u32::MAX)
            .clamp(4, 256)
    };
    let copies = if args.copies > 0 {
        args.copies
    } else {
        u32::try_from((args.pairs * 3 / 2).div_ceil(unique.len().max(1) as u64))
            .unwrap_or(u32::MAX)
            .max(1)
    };
    let shape = stream::Shape {
        workers,
        capacity: usize::try_from(args.pairs / u64::from(workers))
            .unwrap_or(usize::MAX)
            .max(1),
        copies,
        finals: args.finals,
    };
    let started = std::time::Instant::now();
    let stream = stream::generate(&trace, shape)?;
    drop(trace);
    eprintln!(
        "stream: {} workers × {} blocks, {} copies of the trace: {} block events ({} stored, {} removed), {} queries, {} resident pairs at the end, {} final lookups; generated in {:.1} s",
        stream.workers,
        stream.capacity,
        stream.copies,
        stream.block_events,
        stream.stored_blocks,
        stream.removed_blocks,
        stream.queries,
        stream.resident,
        stream.finals.len(),
        started.elapsed().as_secs_f64()
    );
    let shape = stream.query_shape();
    eprintln!(
        "queries: {} of {} match no worker; blocks a walk reads (longest overlap + 1, at most the prompt): {} in all, {:.1} a query; finals: {} of {} match none, {} blocks, {:.1} a lookup",
        shape.queries_unmatched,
        stream.queries,
        shape.query_blocks,
        shape.query_blocks as f64 / stream.queries.max(1) as f64,
        shape.finals_unmatched,
        stream.finals.len(),
        shape.final_blocks,
        shape.final_blocks as f64 / stream.finals.len().max(1) as f64,
    );
    let report = run::run(&stream, args.reps, args.only, args.slow_applies)?;
    println!("{}", report.table());
    if let Some(path) = args.json {
        std::fs::write(&path, serde_json::to_string_pretty(&report)?)?;
    }
    report.check()
}
