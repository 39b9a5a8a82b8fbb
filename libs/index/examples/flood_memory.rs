//! Index memory under a flood, against the memory of a merely full index:
//! `cargo run --release -p ic-index --example flood_memory -- CAPACITY PER_BATCH RESYNC`.

use ic_index::{HashScheme, Index, IndexConfig, ReplicaKey, Scope};

#[path = "../tests/support/flood.rs"]
mod flood;
use flood::chain as stored;

fn main() {
    let arg = |i: usize, d: u64| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(d)
    };
    let (capacity, per_batch, resync) = (arg(1, 20_000), arg(2, 1_000), arg(3, 0));
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
    let key = |id: u64| ReplicaKey {
        tenant: "t".into(),
        replica_id: format!("engine-{id}"),
        dp_rank: 0,
    };
    index.replace(&key(1000), &scope, "a", &stored(1000, 0, capacity), 1);
    let full = index.memory();
    let mut peak = full.total();
    let total = capacity * 20;
    for r in 0..10u64 {
        let mut from = 0;
        if resync > 0 {
            index.replace(&key(r), &scope, "a", &stored(r, 0, resync), 1);
            from = resync;
            peak = peak.max(index.memory().total());
        }
        while from < total / 10 {
            index.apply(&key(r), &scope, "a", &stored(r, from, per_batch), 1);
            from += per_batch;
            peak = peak.max(index.memory().total());
        }
    }
    let after = index.memory();
    let pct = |m: u64| (m as f64 / full.total() as f64 - 1.0) * 100.0;
    println!(
        "capacity {capacity} batch {per_batch} resync {resync}: entries {}; full {} B (records {}, keys {}), after {} B (records {}, keys {}) {:+.1}%, peak {:+.1}%",
        index.len(),
        full.total(),
        full.records,
        full.key_tables,
        after.total(),
        after.records,
        after.key_tables,
        pct(after.total()),
        pct(peak)
    );
}
