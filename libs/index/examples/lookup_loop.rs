//! A fixed amount of lookup work for instruction counting with callgrind,
//! shaped as `ic-loadgen` preloads the server: replicas in groups of four,
//! each group holding the same prompt families (each replica reporting
//! every chain in its own event), and lookups of whole chains cycling
//! through the groups and their families.
//!
//! `valgrind --tool=callgrind target/release/examples/lookup_loop [LOOKUPS] [REPLICAS] [BLOCKS] [HOLDERS]`
//! (defaults 20,000, 4, 128, 4); then `callgrind_annotate --inclusive=yes`
//! for `Index>::score` over the lookups. It prints the matched blocks summed,
//! so that a change in the answers shows.

use ic_index::{
    Change, Fingerprint, HashScheme, Index, IndexConfig, LookupView, NoDeadline, ReplicaKey, Scope,
    Tier,
};

/// Blocks each replica holds.
const PER_REPLICA: u64 = 8_192;

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

/// A distinct, well-mixed fingerprint per (family, depth), as ic-loadgen's.
fn fingerprint(family: u64, depth: u64) -> Fingerprint {
    let x = (family << 20 | depth).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    Fingerprint(x ^ (x >> 31))
}

fn main() {
    let lookups = arg(1, 20_000);
    let replicas = arg(2, 4).max(1);
    let blocks = arg(3, 128).max(1);
    let group = arg(4, 4).clamp(1, replicas);
    let families = PER_REPLICA.div_ceil(blocks);
    let index = Index::new(IndexConfig {
        capacity_entries: 2_000_000,
        ..IndexConfig::default()
    });
    let scope = Scope {
        tenant: "t".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    };
    let key = |r: u64| ReplicaKey {
        tenant: "t".into(),
        replica_id: format!("engine-{r}"),
        dp_rank: 0,
    };
    for r in 0..replicas {
        for i in 0..families {
            let family = (r / group) * 1_000_000 + i;
            let change = Change::Stored {
                start_depth: 0,
                fingerprints: (0..blocks).map(|d| fingerprint(family, d)).collect(),
                block_size: 16,
                tier: Tier::T1,
            };
            index.apply(&key(r), &scope, &format!("10.0.0.{r}:8000"), &[change], 1);
        }
    }
    let Some(handle) = index.resolve_scope(&scope) else {
        return;
    };
    let groups = replicas.div_ceil(group);
    let prompts: Vec<Vec<Fingerprint>> = (0..groups * families.min(64))
        .map(|p| {
            let family = (p % groups) * 1_000_000 + (p / groups) % families;
            (0..blocks).map(|d| fingerprint(family, d)).collect()
        })
        .collect();
    let mut matched = 0u64;
    for i in 0..lookups {
        let prompt = &prompts[(i % prompts.len() as u64) as usize];
        matched +=
            index.lookup_resolved_until(
                handle,
                prompt,
                None,
                None,
                &NoDeadline,
                |view| match view {
                    LookupView::Matches(m) => m.iter().map(|m| u64::from(m.matched_blocks)).sum(),
                    _ => 0,
                },
            );
    }
    println!("{lookups} lookups, {matched} blocks matched");
}
