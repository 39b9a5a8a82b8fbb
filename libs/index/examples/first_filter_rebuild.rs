//! How long a rebuild of the first-block filter holds stores up, and how
//! often it runs: `first_filter_rebuild PAIRS CAPACITY CHAIN` stores
//! PAIRS blocks as chains of CHAIN blocks (one replica, one change an
//! apply) into an index of CAPACITY entries, timing every apply; the
//! applies during which the rebuild counter moved are the ones whose
//! capacity enforcement ran a rebuild (the placement mutex is held
//! throughout it).

use std::time::Instant;

use ic_index::{Change, Fingerprint, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};

fn arg(n: usize, default: u64) -> u64 {
    std::env::args()
        .nth(n)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let pairs = arg(1, 10_000_000);
    let capacity = arg(2, 5_000_000);
    let chain = arg(3, 4).max(1);
    let index = Index::new(IndexConfig {
        capacity_entries: capacity,
        ..IndexConfig::default()
    });
    let scope = Scope {
        tenant: "t".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    };
    let key = ReplicaKey {
        tenant: "t".into(),
        replica_id: "engine-0".into(),
        dp_rank: 0,
    };
    let mut with_rebuild: Vec<f64> = Vec::new();
    let mut without: Vec<f64> = Vec::new();
    let mut rebuilds = index.first_filter_rebuilds();
    let started = Instant::now();
    for family in 0..pairs / chain {
        let change = Change::Stored {
            start_depth: 0,
            fingerprints: (0..chain)
                .map(|d| Fingerprint((family << 20 | d).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
                .collect(),
            block_size: 16,
            tier: Tier::T1,
        };
        let t = Instant::now();
        index.apply(&key, &scope, "10.0.0.1:8000", &[change], 1);
        let us = t.elapsed().as_secs_f64() * 1e6;
        let now = index.first_filter_rebuilds();
        if now != rebuilds {
            with_rebuild.push(us);
            rebuilds = now;
        } else {
            without.push(us);
        }
    }
    let total = started.elapsed().as_secs_f64();
    without.sort_by(f64::total_cmp);
    with_rebuild.sort_by(f64::total_cmp);
    let q = |v: &[f64], p: f64| {
        v.get(((v.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "pairs {pairs} capacity {capacity} chain {chain}: {} entries, {total:.2} s, filter {} B",
        index.len(),
        index.first_filter_bytes()
    );
    println!(
        "applies without a rebuild: {} (p50 {:.2} us, p99 {:.2} us, max {:.0} us)",
        without.len(),
        q(&without, 0.5),
        q(&without, 0.99),
        q(&without, 1.0)
    );
    println!(
        "applies with a rebuild: {} (min {:.0} us, p50 {:.0} us, max {:.0} us)",
        with_rebuild.len(),
        q(&with_rebuild, 0.0),
        q(&with_rebuild, 0.5),
        q(&with_rebuild, 1.0)
    );
}
