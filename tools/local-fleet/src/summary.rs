//! The run's summary: the JSON report (`--json`) and the table printed
//! otherwise.

use serde::Serialize;

use crate::fleet::PolicyResult;
use crate::replicas::AlikeCheck;

const MIB: f64 = 1024.0 * 1024.0;

/// What a run found, across its routed variants and baselines.
#[derive(Debug, Serialize)]
pub struct Report {
    pub engines: usize,
    pub index_replicas: usize,
    pub capacity_blocks: usize,
    pub requests: usize,
    pub policies: Vec<PolicyResult>,
    pub lookup_p50_us: u128,
    pub lookup_p99_us: u128,
    pub routed_by_hint: u64,
    pub engine_batches_published: u64,
    pub engine_block_events: u64,
    pub block_events_per_second: f64,
    pub index_batches_applied: f64,
    pub index_entries: u64,
    /// Heap bytes the index holds at the end (its `memory_bytes` gauge).
    pub index_memory_bytes: f64,
    pub index_agrees_with_engines: bool,
    /// Per routed variant: whether the index replicas answered alike.
    pub replicas_alike: Vec<AlikeCheck>,
    pub wall_seconds: f64,
}

/// Prints `r` as the terminal table.
pub fn print_table(r: &Report) {
    println!(
        "\n{} requests, {} engines × {} blocks of KV cache, {} index replica(s)\n",
        r.requests, r.engines, r.capacity_blocks, r.index_replicas
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
    if r.index_replicas > 1 {
        for a in &r.replicas_alike {
            println!(
                "replicas alike             {}: snapshots identical {}, {} of {} probes matched, holders differ on {}, best differs on {} of {}",
                a.variant,
                a.snapshots_identical,
                a.probes_matched,
                a.probes,
                a.holders_differ,
                a.best_differ,
                a.best_checked
            );
        }
    }
    println!("wall time                  {:.1} s", r.wall_seconds);
}
