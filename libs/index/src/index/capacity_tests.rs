//! The record space under resyncs of every replica at full capacity.

use super::test_support::{holders_per_epoch, scope, stored as chain};
use crate::*;

fn key(id: usize) -> ReplicaKey {
    super::test_support::key(&format!("r{id}"))
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
        ..IndexConfig::default()
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

#[test]
fn the_eviction_clock_counts_every_holder_in_the_epoch_it_carries() {
    // Chains that cross epoch boundaries (an epoch is 1/16 of capacity:
    // 25 stores here), blocks stored again (refreshed into a later
    // epoch), depth conflicts (which tick the clock but store nothing),
    // removals, and capacity evictions along the way. After every apply
    // the writer's entries per epoch must equal the holders carrying
    // that epoch, and the entry count the holders. Fails if a run of
    // stores is accounted in another epoch than its holders were given.
    let ix = Index::new(IndexConfig {
        capacity_entries: 400,
        shards: 2,
        ..IndexConfig::default()
    });
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for step in 0..400 {
        let r = rand(3) as usize;
        let from = rand(600);
        let n = 1 + rand(60);
        let change = match rand(5) {
            0 => Change::Evicted {
                fingerprints: Fingerprint::from_raw((from..from + n).collect()),
            },
            // A depth other than the one these blocks were stored at
            // (their key), for some of them: conflicts.
            1 => Change::Stored {
                start_depth: 1,
                fingerprints: Fingerprint::from_raw((from..from + n).collect()),
                block_size: 16,
                tier: Tier::T1,
            },
            _ => Change::Stored {
                start_depth: u32::try_from(from).unwrap(),
                fingerprints: Fingerprint::from_raw((from..from + n).collect()),
                block_size: 16,
                tier: if rand(4) == 0 { Tier::T2 } else { Tier::T1 },
            },
        };
        ix.apply(&key(r), &scope(), "a:1", &[change], 1_000);
        let per = holders_per_epoch(&ix);
        let writer = ix.writer.lock();
        for (e, (&counted, &held)) in writer.epoch_entries.iter().zip(&per).enumerate() {
            assert_eq!(counted, held, "step {step}: epoch {e}");
            // Each epoch takes `epoch_size` stores of the clock, no more.
            assert!(
                counted <= writer.epoch_size,
                "step {step}: epoch {e} holds {counted}"
            );
        }
        let held: u64 = per.iter().sum();
        assert_eq!(ix.len(), held, "step {step}: entries");
        let by_replica: u64 = writer.counts.iter().map(|c| c.entries).sum();
        assert_eq!(by_replica, held, "step {step}: entries by replica");
    }
    assert!(
        ix.capacity_evictions() > 0,
        "the clock evicted along the way"
    );
}

#[test]
fn a_chain_that_runs_out_of_record_space_stops_at_the_run_that_failed() {
    // Epochs of 1,000 stores over a record space of 192 pages of 8
    // records (1,536): the chain's first chunk fits, its second does not,
    // its third (300 blocks) would. Nothing after the failed part may be
    // stored: a lookup walks from the first block, so blocks past the
    // hole could never match yet would hold capacity.
    const CAPACITY: u64 = 16_000;
    let mut ix = Index::new(IndexConfig {
        capacity_entries: CAPACITY,
        shards: 1,
        ..IndexConfig::default()
    });
    let tables = super::tables_per_shard(CAPACITY, 1);
    ix.store =
        crate::store::Store::with_records(1, tables, super::table_keys(CAPACITY, 1, tables), 1);
    let errors = ix.apply(&key(0), &scope(), "a:1", &chain(1, 2_300), 1_000);
    assert_eq!(errors, [ContentError::OutOfSpace]);
    assert_eq!(ix.chains_out_of_space(), 1);
    assert_eq!(ix.len(), 1_000, "only the chunk before the failed one");
}
