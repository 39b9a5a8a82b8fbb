//! A fixed amount of ingest work for instruction counting with callgrind:
//! `valgrind --tool=callgrind target/release/examples/apply_loop 2000`.

use ic_index::{Change, Fingerprint, HashScheme, Index, IndexConfig, ReplicaKey, Scope, Tier};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let capacity: u64 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10_000_000);
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
    for family in 0..n {
        let key = ReplicaKey {
            tenant: "t".into(),
            replica_id: format!("engine-{}", family % 256),
            dp_rank: 0,
        };
        let change = Change::Stored {
            start_depth: 0,
            fingerprints: (0..64u64)
                .map(|d| Fingerprint((family << 20 | d).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
                .collect(),
            block_size: 16,
            tier: Tier::T1,
        };
        index.apply(&key, &scope, "10.0.0.1:8000", &[change], 1);
    }
    println!("{} entries", index.len());
}
