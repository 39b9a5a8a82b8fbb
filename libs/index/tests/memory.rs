//! `Index::memory` against what the allocator saw: the figure operators
//! read off `/metrics` must be the memory the index really holds.

use std::alloc::System;

use ic_index::{
    Change, Fingerprint, HashScheme, Index, IndexConfig, IndexMemory, ReplicaKey, Scope, Tier,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use support::flood::chain;

mod support {
    pub mod flood;
}

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const BLOCKS: u64 = 32;

fn scope(tenant: &str) -> Scope {
    Scope {
        tenant: tenant.into(),
        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    }
}

fn replica(tenant: &str, r: u64) -> ReplicaKey {
    ReplicaKey {
        tenant: tenant.into(),
        replica_id: format!("vllm-{r}"),
        dp_rank: 0,
    }
}

fn fingerprints(family: u64) -> Vec<Fingerprint> {
    (0..BLOCKS)
        .map(|d| Fingerprint((family << 20 | d).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
        .collect()
}

/// Allocator bytes held now, since `region` began.
fn held(region: &Region<'_, System>) -> i64 {
    let stats = region.change();
    i64::try_from(stats.bytes_allocated).unwrap_or(i64::MAX)
        - i64::try_from(stats.bytes_deallocated).unwrap_or(i64::MAX)
}

fn assert_close(index: &Index, region: &Region<'_, System>, when: &str) -> IndexMemory {
    let reported = index.memory();
    let held = held(region);
    let total = i64::try_from(reported.total()).unwrap_or(i64::MAX);
    // The test's own live allocations are a few hundred bytes; hash map
    // sizes are estimated.
    let slack = held / 100 + 1024;
    assert!(
        (total - held).abs() <= slack,
        "{when}: index reports {reported:?} = {total} B, the allocator holds {held} B"
    );
    eprintln!("{when}: reported {reported:?}, allocator {held} B");
    reported
}

#[test]
fn reported_memory_matches_the_allocator() {
    let region = Region::new(GLOBAL);
    let index = Index::new(IndexConfig {
        capacity_entries: 120_000,
        ..IndexConfig::default()
    });
    assert_close(&index, &region, "empty");

    // Families held by one to six replicas of two tenants: shared blocks
    // spill their holder lists, and past four holders onto the heap.
    let tenants = ["team-a", "team-b"];
    let mut family = 0u64;
    while index.capacity_evictions() == 0 {
        family += 1;
        let tenant = tenants[usize::from(family.is_multiple_of(7))];
        let fps = fingerprints(family);
        for r in 0..=(family % 6) {
            let change = Change::Stored {
                start_depth: 0,
                fingerprints: fps.clone(),
                block_size: 16,
                tier: if r == 5 { Tier::T2 } else { Tier::T1 },
            };
            let key = replica(tenant, (family + r * 13) % 40);
            index.apply(&key, &scope(tenant), "10.0.0.7:8000", &[change], 1);
        }
    }
    assert!(index.len() > 100_000, "{} entries", index.len());
    let full = assert_close(&index, &region, "at capacity");
    assert!(full.records > 0 && full.key_tables > 0 && full.replicas > 0);

    // Engines evict a third of the chains, and a few replicas go away.
    for f in (1..family).filter(|f| f.is_multiple_of(3)) {
        let tenant = tenants[usize::from(f.is_multiple_of(7))];
        let evicted = Change::Evicted {
            fingerprints: fingerprints(f),
        };
        let key = replica(tenant, f % 40);
        index.apply(&key, &scope(tenant), "10.0.0.7:8000", &[evicted], 2);
    }
    for r in 0..5 {
        index.remove_replica(&replica("team-a", r));
    }
    assert_close(&index, &region, "after evictions");
}

/// Bytes per resident entry once full, for chains held by `holders` replicas.
fn bytes_per_entry_when_full(holders: u64) -> f64 {
    let index = Index::new(IndexConfig {
        capacity_entries: 200_000,
        ..IndexConfig::default()
    });
    let mut family = 0u64;
    while index.capacity_evictions() == 0 {
        family += 1;
        for h in 0..holders {
            let change = Change::Stored {
                start_depth: 0,
                fingerprints: fingerprints(family),
                block_size: 16,
                tier: Tier::T1,
            };
            let key = replica("team-a", (family * 7 + h * 31) % 256);
            index.apply(&key, &scope("team-a"), "10.0.0.7:8000", &[change], 1);
        }
    }
    index.memory().total() as f64 / index.len() as f64
}

#[test]
fn every_degree_of_sharing_stays_within_24_bytes_per_entry() {
    // Two holders used to be the costliest case (a 24-byte list header per
    // block shared by only two entries). Half a byte over 24 is the key
    // tables' room for the index's 1/16 overshoot of capacity (about
    // 0.3 B per entry of capacity, issue 39 finding A).
    for holders in [1, 2, 3, 4, 5, 6, 7, 8, 12, 32] {
        let bytes = bytes_per_entry_when_full(holders);
        eprintln!("{holders} holders: {bytes:.1} B per entry");
        assert!(bytes <= 24.5, "{holders} holders: {bytes:.1} B per entry");
    }
}

#[test]
fn a_flood_and_a_resync_beyond_capacity_stay_within_a_tenth_of_a_full_index() {
    const CAPACITY: u64 = 50_000;
    const PER_BATCH: u64 = 1_000;
    let region = Region::new(GLOBAL);
    let index = Index::new(IndexConfig {
        capacity_entries: CAPACITY,
        shards: 32,
        ..IndexConfig::default()
    });
    let s = scope("flood");
    index.replace(
        &replica("flood", 1000),
        &s,
        "a",
        &chain(1000, 0, CAPACITY),
        1,
    );
    let full = assert_close(&index, &region, "merely full").total();
    let budget = full + full / 10;
    let mut peak = 0;
    // Ten engines flood ten times the capacity; each opens with a resync
    // larger than the whole index, then streams new blocks.
    for r in 0..10 {
        let resync = CAPACITY + CAPACITY / 5;
        index.replace(&replica("flood", r), &s, "a", &chain(r, 0, resync), 1);
        assert!(index.len() <= CAPACITY, "{} entries", index.len());
        peak = peak.max(index.memory().total());
        let mut from = resync;
        while from < resync + CAPACITY {
            index.apply(&replica("flood", r), &s, "a", &chain(r, from, PER_BATCH), 1);
            from += PER_BATCH;
            peak = peak.max(index.memory().total());
        }
        // An eviction pass takes whole epochs, at least an eighth.
        assert!(
            (CAPACITY * 7 / 8..=CAPACITY).contains(&index.len()),
            "{}",
            index.len()
        );
    }
    let after = assert_close(&index, &region, "after the flood").total();
    assert!(index.capacity_evictions() >= 10 * CAPACITY);
    assert!(
        peak <= budget && after <= budget,
        "full {full} B, peak {peak} B, after {after} B: over {budget} B"
    );
}
