//! The record space under resyncs of every replica at full capacity.

use crate::*;

fn scope() -> Scope {
    Scope {
        tenant: "t".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    }
}

fn key(id: usize) -> ReplicaKey {
    ReplicaKey {
        tenant: "t".into(),
        replica_id: format!("r{id}"),
        dp_rank: 0,
    }
}

fn chain(from: u64, n: u64) -> Vec<Change> {
    vec![Change::Stored {
        start_depth: 0,
        fingerprints: Fingerprint::from_raw((from..from + n).collect()),
        block_size: 16,
        tier: Tier::T1,
    }]
}

#[test]
fn every_replica_resyncing_at_full_capacity_stays_within_the_record_space() {
    // Eight replicas; round after round each one resyncs to a whole
    // capacity's worth of new blocks (the old state stays, hidden, until
    // the new one is built), then stores more on top. Fails if the page
    // directory's bound is too tight for that (a chain is then refused
    // with OutOfSpace).
    const CAPACITY: u64 = 20_000;
    let ix = Index::new(IndexConfig {
        capacity_entries: CAPACITY,
        shards: 4,
    });
    let bound = ix.store.directory().max_pages();
    let mut peak = 0;
    let mut next = 1u64;
    for round in 0..6 {
        for r in 0..8 {
            let errors = ix.replace(&key(r), &scope(), "a:1", &chain(next, CAPACITY), 1_000);
            assert!(errors.is_empty(), "round {round} replica {r}: {errors:?}");
            next += CAPACITY;
            peak = peak.max(ix.store.directory().len());
            let errors = ix.apply(&key(r), &scope(), "a:1", &chain(next, CAPACITY / 8), 1_000);
            assert!(errors.is_empty(), "round {round} replica {r}: {errors:?}");
            next += CAPACITY / 8;
            peak = peak.max(ix.store.directory().len());
        }
    }
    assert!(ix.len() <= CAPACITY + CAPACITY / 16);
    assert_eq!(ix.chains_out_of_space(), 0);
    eprintln!("peak pages {peak} of {bound}");
    assert!(peak * 10 <= bound * 9, "peak pages {peak} of {bound}");
}
