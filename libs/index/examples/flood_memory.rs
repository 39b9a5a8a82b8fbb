//! Index memory under a flood, against the memory of a merely full index:
//! `cargo run --release -p ic-index --example flood_memory -- CAPACITY PER_BATCH RESYNC`.

use ic_index::{Change, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};

fn spread(replica: u64, i: u64) -> u64 {
    let mut z = (replica << 32 | i).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn stored(replica: u64, from: u64, n: u64) -> Vec<Change> {
    vec![Change::Stored {
        start_depth: 0,
        fingerprints: (from..from + n).map(|i| spread(replica, i)).collect(),
        block_size: 16,
        tier: Tier::T1,
    }]
}

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
