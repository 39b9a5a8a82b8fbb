//! The eviction clock's wrap: when it comes round to an epoch that still
//! holds entries (stored one whole cycle of the clock ago), exactly those
//! are retired.

use super::test_support::{holders_per_epoch, key, scope, stored};
use crate::*;

/// An epoch is 1/16 of capacity: 10 stores; the clock has 1,024 of them,
/// so it comes back to the first after 10,240 stores.
const CAPACITY: u64 = 160;
/// Blocks per stored chain: 10,240 - 1 is no multiple of it, so the chain
/// that brings the clock round crosses the epoch boundary.
const CHAIN: u64 = 7;

fn evicted(from: u64, n: u64) -> Vec<Change> {
    vec![Change::Evicted {
        fingerprints: Fingerprint::from_raw((from..from + n).collect()),
    }]
}

/// One entry (replica "old"'s) stored first and never again; then replica
/// "new" stores chains of fresh blocks, holding the last `window` of them
/// (engines evicting the rest), for more than one turn of the clock. The
/// index stays far below capacity throughout, so the only eviction due is
/// the old entry's, when the clock comes round to its epoch.
fn wrap_holding(window: u64) {
    let ix = Index::new(IndexConfig {
        capacity_entries: CAPACITY,
        shards: 2,
    });
    let errors = ix.apply(&key("old"), &scope(), "a:1", &stored(1, 1), 1_000);
    assert!(errors.is_empty(), "{errors:?}");
    let wrap = CAPACITY / 16 * u64::from(crate::arena::EPOCHS);
    let mut stores = 1;
    let mut chain = 0;
    while stores < wrap + 1_000 {
        let from = 1_000 + chain * CHAIN;
        let errors = ix.apply(&key("new"), &scope(), "a:1", &stored(from, CHAIN), 1_000);
        assert!(errors.is_empty(), "chain {chain}: {errors:?}");
        stores += CHAIN;
        if chain >= window {
            let gone = from - window * CHAIN;
            let errors = ix.apply(&key("new"), &scope(), "a:1", &evicted(gone, CHAIN), 1_000);
            assert!(errors.is_empty(), "chain {chain}: {errors:?}");
        }
        chain += 1;
        let per = holders_per_epoch(&ix);
        let writer = ix.writer.lock();
        for (e, (&counted, &held)) in writer.epoch_entries.iter().zip(&per).enumerate() {
            assert_eq!(counted, held, "after {stores} stores: epoch {e}");
            assert!(
                counted <= writer.epoch_size,
                "after {stores} stores: epoch {e} holds {counted}"
            );
        }
        drop(writer);
        assert_eq!(ix.len(), per.iter().sum::<u64>(), "after {stores} stores");
        // The clock's retirement is no capacity eviction: the index is
        // far below capacity.
        assert_eq!(ix.capacity_evictions(), 0, "after {stores} stores");
        let expected = u64::from(stores <= wrap);
        assert_eq!(
            ix.clock_evictions(),
            1 - expected,
            "after {stores} stores: retired by the clock"
        );
    }
    let held: Vec<(String, u64)> = ix
        .snapshot()
        .into_iter()
        .map(|r| (r.key.replica_id, r.prefix_count))
        .collect();
    assert_eq!(
        held,
        [("new".to_string(), window * CHAIN), ("old".to_string(), 0)]
    );
    assert_eq!(ix.len(), window * CHAIN);
}

#[test]
fn the_clock_coming_round_retires_only_its_epoch_in_a_lightly_filled_index() {
    // 14 entries and the old one: fewer than the 1/8 of capacity a
    // capacity eviction selects at least.
    wrap_holding(2);
}

#[test]
fn the_clock_coming_round_retires_its_own_epoch_before_any_other() {
    // 35 entries and the old one: more than 1/8 of capacity, all of them
    // stored after the old one.
    wrap_holding(5);
}
