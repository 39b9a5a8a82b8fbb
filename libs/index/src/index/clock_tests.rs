//! The eviction clock's wrap: when it comes round to an epoch that still
//! holds entries (stored one whole cycle of the clock ago), those stay
//! while the index has room for another epoch, and exactly those are
//! retired when it is within an epoch of capacity.

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
/// index stays below capacity throughout, so no capacity eviction is due;
/// when the clock comes round to the old entry's epoch, the entry is kept
/// if the index has room for another epoch then, else retired alone.
/// `kept` is the branch the caller expects; the fixture is checked to be in
/// that regime before anything is asserted about the index.
fn wrap_holding(window: u64, kept: bool) {
    let ix = Index::new(IndexConfig {
        capacity_entries: CAPACITY,
        shards: 2,
        ..IndexConfig::default()
    });
    let errors = ix.apply(&key("old"), &scope(), "a:1", &stored(1, 1), 1_000);
    assert!(errors.is_empty(), "{errors:?}");
    let epoch = CAPACITY / 16;
    let wrap = epoch * u64::from(crate::arena::EPOCHS);
    // At the wrap the chain that crosses it has stored its part before the
    // boundary (stores run 1 + CHAIN * k before it, so (wrap - 2) % CHAIN
    // + 1 of them): "new" holds `window` chains and that part, "old" 1.
    let at_wrap = window * CHAIN + (wrap - 2) % CHAIN + 1 + 1;
    assert_eq!(
        at_wrap + epoch <= CAPACITY,
        kept,
        "fixture no longer in the intended regime: {at_wrap} entries at the wrap, epoch {epoch}"
    );
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
            // An epoch takes `epoch_size` stores; the old entry's (0) also
            // keeps it once the clock came round, if kept.
            let leftover = u64::from(kept && e == 0 && stores > wrap);
            assert!(
                counted <= writer.epoch_size + leftover,
                "after {stores} stores: epoch {e} holds {counted}"
            );
        }
        drop(writer);
        assert_eq!(ix.len(), per.iter().sum::<u64>(), "after {stores} stores");
        // The clock's retirement is no capacity eviction: the index is
        // far below capacity.
        assert_eq!(ix.capacity_evictions(), 0, "after {stores} stores");
        let retired = u64::from(!kept && stores > wrap);
        assert_eq!(
            ix.clock_evictions(),
            retired,
            "after {stores} stores: retired by the clock"
        );
    }
    let old = u64::from(kept);
    let held: Vec<(String, u64)> = ix
        .snapshot()
        .into_iter()
        .map(|r| (r.key.replica_id, r.prefix_count))
        .collect();
    assert_eq!(
        held,
        [
            ("new".to_string(), window * CHAIN),
            ("old".to_string(), old)
        ]
    );
    assert_eq!(ix.len(), window * CHAIN + old);
    // A lookup of the old entry's block finds it exactly while it is kept.
    let found = ix.lookup(&scope(), &Fingerprint::from_raw(vec![1]), None, None);
    let replicas: Vec<String> = match found {
        LookupOutcome::Matches(m) => m.into_iter().map(|m| m.replica.replica_id).collect(),
        _ => Vec::new(),
    };
    let expected: &[&str] = if kept { &["old"] } else { &[] };
    assert_eq!(replicas, expected);
}

#[test]
fn an_entry_not_stored_again_for_a_turn_stays_while_the_index_has_room() {
    // 14 entries and the old one: far below capacity (fewer than the 1/8
    // of capacity a capacity eviction selects at least), so a hot prefix
    // an engine holds without storing it again is not dropped. Failed
    // before the clock kept leftovers (the old entry retired at the wrap).
    wrap_holding(2, true);
}

#[test]
fn an_entry_not_stored_again_for_a_turn_stays_below_an_epoch_of_capacity() {
    // 35 entries and the old one, more than 1/8 of capacity, all of them
    // stored after the old one, and room for another epoch (10): kept.
    wrap_holding(5, true);
}

#[test]
fn the_clock_coming_round_near_capacity_retires_only_its_own_epoch() {
    // 147 entries, the crossing chain's 5 and the old one at the wrap: 153
    // of 160, within an epoch (10) of capacity, so the old entry, the
    // oldest, is retired, and only it (a capacity eviction would take at
    // least 1/8 of capacity). Fails if leftovers are kept regardless of
    // room, or if the clock retires more than its own epoch.
    wrap_holding(21, false);
}
