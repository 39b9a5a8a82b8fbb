//! The replay, the same procedure for both indexes, and the report.

use std::time::Instant;

use anyhow::bail;
use serde::Serialize;

use crate::alloc;
use crate::ours::Ours;
use crate::stream::{Item, Stream};
use crate::theirs;

/// Which index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
pub enum Side {
    /// ic-index.
    Ours,
    /// dynamo-kv-router's RadixTree.
    Theirs,
}

/// Latency percentiles, nanoseconds.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Pct {
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
}

fn pct(mut ns: Vec<u64>) -> Pct {
    if ns.is_empty() {
        return Pct::default();
    }
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)];
    Pct {
        p50: at(0.50),
        p99: at(0.99),
        p999: at(0.999),
    }
}

/// One side's figures in one repetition.
#[derive(Clone, Debug, Serialize)]
pub struct Figures {
    pub side: Side,
    pub rep: u32,
    /// Block events per second, timing only the apply calls of the replay
    /// that interleaves them with the queries.
    pub apply_interleaved: f64,
    /// Block events per second, all events back to back into a fresh index.
    pub apply_back_to_back: f64,
    pub query: Pct,
    pub final_lookup: Pct,
    /// Heap bytes the index held at the end (freed when dropped).
    pub heap_bytes: i64,
    /// Resident-set growth while the index was built.
    pub rss_bytes: i64,
    pub resident_pairs: u64,
    pub queries_correct: u64,
    pub queries: u64,
    pub finals_correct: u64,
    pub finals: u64,
    pub apply_errors: u64,
}

/// Everything one run measured.
#[derive(Debug, Serialize)]
pub struct Report {
    pub workers: u32,
    pub capacity_per_worker: usize,
    pub copies: u32,
    pub block_events: u64,
    pub queries: u64,
    pub resident_pairs: u64,
    pub runs: Vec<Figures>,
}

/// Runs `reps` repetitions, alternating which side goes first.
pub fn run(
    stream: &Stream,
    reps: u32,
    only: Option<Side>,
    slow_applies: bool,
) -> anyhow::Result<Report> {
    let mut runs = Vec::new();
    for rep in 0..reps {
        let order = if rep % 2 == 0 {
            [Side::Ours, Side::Theirs]
        } else {
            [Side::Theirs, Side::Ours]
        };
        for side in order {
            if only.is_some_and(|o| o != side) {
                continue;
            }
            let f = match side {
                Side::Ours => run_ours(stream, rep, slow_applies),
                Side::Theirs => run_theirs(stream, rep),
            };
            eprintln!("{}", line(&f));
            runs.push(f);
        }
    }
    Ok(Report {
        workers: stream.workers,
        capacity_per_worker: stream.capacity,
        copies: stream.copies,
        block_events: stream.block_events,
        queries: stream.queries,
        resident_pairs: stream.resident,
        runs,
    })
}

/// The interleaved replay's applies that took over a millisecond, and
/// how many of them moved records (compaction).
#[derive(Debug, Default)]
struct SlowApplies {
    count: u64,
    relocating: u64,
    /// Of those, the ones also over a millisecond on the CPU.
    on_cpu: u64,
    /// Minor page faults taken by those.
    faults: u64,
    max_ns: u128,
    max_cpu_ns: u64,
    /// Records moved so far, as of the last apply.
    moved: u64,
}

impl SlowApplies {
    fn note(&mut self, ns: u128, cpu_ns: u64, faults: u64, moved: u64) {
        if ns > 1_000_000 {
            self.count += 1;
            self.relocating += u64::from(moved > self.moved);
            if cpu_ns > 1_000_000 {
                self.on_cpu += 1;
                self.faults += faults;
            }
        }
        self.max_ns = self.max_ns.max(ns);
        self.max_cpu_ns = self.max_cpu_ns.max(cpu_ns);
        self.moved = moved;
    }
}

/// This thread's time on CPU so far, in ns, and its minor page faults (0
/// where the kernel does not say).
fn cpu_and_faults() -> (u64, u64) {
    let cpu = std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    // Field 10 of `stat` (minflt), the 8th after the command's ')'.
    let faults = std::fs::read_to_string("/proc/thread-self/stat")
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(7)?
                .parse()
                .ok()
        })
        .unwrap_or(0);
    (cpu, faults)
}

fn sorted(mut v: Vec<(u32, u32)>) -> Vec<(u32, u32)> {
    v.sort_unstable();
    v
}

fn rate(events: u64, ns: u128) -> f64 {
    events as f64 / (ns.max(1) as f64 / 1e9)
}

fn run_ours(stream: &Stream, rep: u32, on_cpu: bool) -> Figures {
    let prompts = Ours::prompts(stream);
    let mut query_ns = Vec::with_capacity(stream.items.len());
    let mut final_ns = Vec::with_capacity(stream.finals.len());
    let capacity = u64::from(stream.workers) * stream.capacity as u64;
    let (mut errors, mut correct, mut finals_correct, mut apply_ns) = (0u64, 0u64, 0u64, 0u128);
    let mut slow = SlowApplies::default();

    alloc::trim();
    let (rss0, live0) = (alloc::rss(), alloc::live());
    let index = Ours::new(stream.workers, capacity);
    let mut prompt_buf = Vec::new();
    // Each event is converted (untimed) right before it is applied, for
    // both sides: Dynamo consumes its events, and a prebuilt set being
    // freed as it is applied would hide the tree's growth in RSS.
    for (i, item) in stream.items.iter().enumerate() {
        if let Some(event) = Ours::event(item) {
            let (cpu0, faults0) = if on_cpu { cpu_and_faults() } else { (0, 0) };
            let t = Instant::now();
            let rejected = index.apply(&event, i as i64);
            let ns = t.elapsed().as_nanos();
            let (cpu, faults) = if on_cpu {
                let (c, f) = cpu_and_faults();
                (c.saturating_sub(cpu0), f.saturating_sub(faults0))
            } else {
                (0, 0)
            };
            apply_ns += ns;
            slow.note(ns, cpu, faults, index.records_relocated());
            errors += rejected as u64;
        } else if let Item::Query { prompt, expected } = item {
            // Copied untimed into a reused buffer, as Dynamo's side clones
            // its prompt untimed: both walk a prompt just written, not one
            // read cold from the stream's arrays inside the timer.
            prompt_buf.clear();
            prompt_buf.extend_from_slice(&prompts[*prompt as usize]);
            let t = Instant::now();
            let got = index.query(&prompt_buf);
            query_ns.push(t.elapsed().as_nanos() as u64);
            correct += u64::from(sorted(got) == *expected);
        }
    }
    for (prompt, expected) in &stream.finals {
        prompt_buf.clear();
        prompt_buf.extend_from_slice(&prompts[*prompt as usize]);
        let t = Instant::now();
        let got = index.query(&prompt_buf);
        final_ns.push(t.elapsed().as_nanos() as u64);
        finals_correct += u64::from(sorted(got) == *expected);
    }
    let rss_bytes = alloc::rss() - rss0;
    let resident_pairs = index.len();
    let live1 = alloc::live();
    // Where the bytes go, as the index counts them (outside the heap
    // figure: counted before the drop that measures it).
    let parts = index.memory();
    let per = |b: u64| b as f64 / resident_pairs.max(1) as f64;
    eprintln!(
        "rep {rep} ours heap by part, per resident pair: records {:.2} B, key tables {:.2} B, replicas {:.2} B; first-block filter rebuilds {}",
        per(parts.records),
        per(parts.key_tables),
        per(parts.replicas),
        index.first_filter_rebuilds()
    );
    eprintln!(
        "rep {rep} ours applies over 1 ms: {} (of which {} moved records: compaction; {} over 1 ms on CPU, with --slow-applies, taking {} page faults), slowest {:.1} ms ({:.1} ms on CPU); records moved in all {}",
        slow.count,
        slow.relocating,
        slow.on_cpu,
        slow.faults,
        slow.max_ns as f64 / 1e6,
        slow.max_cpu_ns as f64 / 1e6,
        index.records_relocated()
    );
    drop(index);
    let heap_bytes = live1 - alloc::live();
    debug_assert!(live0 <= live1);
    alloc::trim();

    let events = Ours::events(stream);
    let index = Ours::new(stream.workers, capacity);
    let t = Instant::now();
    for (i, event) in events.iter().enumerate() {
        if let Some(event) = event {
            errors += index.apply(event, i as i64) as u64;
        }
    }
    let b2b_ns = t.elapsed().as_nanos();
    drop(index);
    Figures {
        side: Side::Ours,
        rep,
        apply_interleaved: rate(stream.block_events, apply_ns),
        apply_back_to_back: rate(stream.block_events, b2b_ns),
        query: pct(query_ns),
        final_lookup: pct(final_ns),
        heap_bytes,
        rss_bytes,
        resident_pairs,
        queries_correct: correct,
        queries: stream.queries,
        finals_correct,
        finals: stream.finals.len() as u64,
        apply_errors: errors,
    }
}

fn run_theirs(stream: &Stream, rep: u32) -> Figures {
    let prompts = theirs::prompts(stream);
    let mut query_ns = Vec::with_capacity(stream.items.len());
    let mut final_ns = Vec::with_capacity(stream.finals.len());
    let (mut errors, mut correct, mut finals_correct, mut apply_ns) = (0u64, 0u64, 0u64, 0u128);

    alloc::trim();
    let rss0 = alloc::rss();
    let mut tree = theirs::tree();
    for (i, item) in stream.items.iter().enumerate() {
        if let Some(event) = theirs::event(i, item) {
            let t = Instant::now();
            let result = tree.apply_event(event);
            apply_ns += t.elapsed().as_nanos();
            errors += u64::from(result.is_err());
        } else if let Item::Query { prompt, expected } = item {
            // `find_matches` takes its prompt by value: copied untimed.
            let sequence = prompts[*prompt as usize].clone();
            let t = Instant::now();
            let got = tree.find_matches(sequence, false);
            query_ns.push(t.elapsed().as_nanos() as u64);
            correct += u64::from(theirs::answer(&got) == *expected);
        }
    }
    for (prompt, expected) in &stream.finals {
        let sequence = prompts[*prompt as usize].clone();
        let t = Instant::now();
        let got = tree.find_matches(sequence, false);
        final_ns.push(t.elapsed().as_nanos() as u64);
        finals_correct += u64::from(theirs::answer(&got) == *expected);
    }
    let rss_bytes = alloc::rss() - rss0;
    let resident_pairs = tree.current_size() as u64;
    let live1 = alloc::live();
    drop(tree);
    let heap_bytes = live1 - alloc::live();
    alloc::trim();

    let events = theirs::events(stream);
    let mut tree = theirs::tree();
    let t = Instant::now();
    for event in events.into_iter().flatten() {
        errors += u64::from(tree.apply_event(event).is_err());
    }
    let b2b_ns = t.elapsed().as_nanos();
    drop(tree);
    Figures {
        side: Side::Theirs,
        rep,
        apply_interleaved: rate(stream.block_events, apply_ns),
        apply_back_to_back: rate(stream.block_events, b2b_ns),
        query: pct(query_ns),
        final_lookup: pct(final_ns),
        heap_bytes,
        rss_bytes,
        resident_pairs,
        queries_correct: correct,
        queries: stream.queries,
        finals_correct,
        finals: stream.finals.len() as u64,
        apply_errors: errors,
    }
}

fn line(f: &Figures) -> String {
    let per = |b: i64| b as f64 / f.resident_pairs.max(1) as f64;
    format!(
        "rep {} {:<6} apply {:>6.2} M/s interleaved, {:>6.2} M/s back to back | query p50/p99/p99.9 {}/{}/{} ns | final {}/{}/{} ns | {:.1} B heap, {:.1} B RSS per pair ({} pairs) | correct {}/{} queries, {}/{} finals | {} apply errors",
        f.rep,
        match f.side {
            Side::Ours => "ours",
            Side::Theirs => "dynamo",
        },
        f.apply_interleaved / 1e6,
        f.apply_back_to_back / 1e6,
        f.query.p50,
        f.query.p99,
        f.query.p999,
        f.final_lookup.p50,
        f.final_lookup.p99,
        f.final_lookup.p999,
        per(f.heap_bytes),
        per(f.rss_bytes),
        f.resident_pairs,
        f.queries_correct,
        f.queries,
        f.finals_correct,
        f.finals,
        f.apply_errors
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A table row: its name and how to read it from one side's figures.
type Row<'a> = (&'a str, &'a dyn Fn(&Figures) -> f64);

impl Report {
    /// Medians over the repetitions, ours against Dynamo's.
    pub fn table(&self) -> String {
        let of = |side: Side, f: &dyn Fn(&Figures) -> f64| {
            median(self.runs.iter().filter(|r| r.side == side).map(f).collect())
        };
        let rows: [Row<'_>; 10] = [
            ("apply, interleaved (M block events/s)", &|f| {
                f.apply_interleaved / 1e6
            }),
            ("apply, back to back (M block events/s)", &|f| {
                f.apply_back_to_back / 1e6
            }),
            ("query p50 (µs)", &|f| f.query.p50 as f64 / 1e3),
            ("query p99 (µs)", &|f| f.query.p99 as f64 / 1e3),
            ("query p99.9 (µs)", &|f| f.query.p999 as f64 / 1e3),
            ("final lookup p50 (µs)", &|f| {
                f.final_lookup.p50 as f64 / 1e3
            }),
            ("final lookup p99 (µs)", &|f| {
                f.final_lookup.p99 as f64 / 1e3
            }),
            ("final lookup p99.9 (µs)", &|f| {
                f.final_lookup.p999 as f64 / 1e3
            }),
            ("heap bytes per resident pair", &|f| {
                f.heap_bytes as f64 / f.resident_pairs.max(1) as f64
            }),
            ("RSS bytes per resident pair", &|f| {
                f.rss_bytes as f64 / f.resident_pairs.max(1) as f64
            }),
        ];
        let mut out = format!(
            "{} workers × {} blocks, {} trace copies, {} block events, {} queries, {} resident pairs; medians of {} repetition(s)\n\n| | ic-index | dynamo-kv-router 1.6.1 | ours / theirs |\n|---|---|---|---|\n",
            self.workers,
            self.capacity_per_worker,
            self.copies,
            self.block_events,
            self.queries,
            self.resident_pairs,
            self.runs
                .iter()
                .filter(|r| r.side == Side::Ours)
                .count()
                .max(self.runs.iter().filter(|r| r.side == Side::Theirs).count()),
        );
        for (name, f) in rows {
            let (a, b) = (of(Side::Ours, f), of(Side::Theirs, f));
            out += &format!("| {name} | {a:.3} | {b:.3} | {:.2} |\n", a / b);
        }
        let correct = |side: Side| {
            self.runs
                .iter()
                .filter(|r| r.side == side)
                .map(|r| {
                    format!(
                        "{}/{} + {}/{}",
                        r.queries_correct, r.queries, r.finals_correct, r.finals
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        out += &format!(
            "| correct (queries + finals) | {} | {} | |\n",
            correct(Side::Ours),
            correct(Side::Theirs)
        );
        out
    }

    /// Fails unless every answer of both indexes matched the simulation.
    pub fn check(&self) -> anyhow::Result<()> {
        for r in &self.runs {
            if r.queries_correct != r.queries || r.finals_correct != r.finals || r.apply_errors > 0
            {
                bail!(
                    "{:?} (rep {}): {}/{} queries and {}/{} final lookups correct, {} apply errors",
                    r.side,
                    r.rep,
                    r.queries_correct,
                    r.queries,
                    r.finals_correct,
                    r.finals,
                    r.apply_errors
                );
            }
        }
        Ok(())
    }
}
