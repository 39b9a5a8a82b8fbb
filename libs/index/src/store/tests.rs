use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::types::Tier;

#[derive(Clone, Debug)]
enum Op {
    /// Replica stores keys `start..start+len` in `epoch`.
    Store {
        replica: u32,
        start: u64,
        len: u64,
        epoch: u32,
    },
    /// Replica drops keys `start..start+len`, in order or reversed.
    Remove {
        replica: u32,
        start: u64,
        len: u64,
        reversed: bool,
    },
    /// Every holder of a replica goes.
    Drop {
        replica: u32,
    },
    /// Every holder stored in `epoch` goes.
    Evict {
        epoch: u32,
    },
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..10, 0u64..60, 1u64..20, 0u32..3).prop_map(|(replica, start, len, epoch)| Op::Store { replica, start, len, epoch }),
        3 => (0u32..10, 0u64..80, 1u64..6, any::<bool>()).prop_map(|(replica, start, len, reversed)| Op::Remove { replica, start, len, reversed }),
        1 => (0u32..10).prop_map(|replica| Op::Drop { replica }),
        1 => (0u32..3).prop_map(|epoch| Op::Evict { epoch }),
        1 => Just(Op::Compact),
    ]
}

fn holders_of(store: &Store, key: u64) -> Option<BTreeMap<u32, u32>> {
    let dir = store.directory();
    let mut reader = store.reader(dir);
    let b = Block::new(key, 0);
    let rec = reader.find(b.key, b.h)?;
    Some(
        reader
            .view(rec)?
            .holders()
            .iter()
            .map(|&h| (Holder::from_raw(h).replica(), Holder::from_raw(h).epoch()))
            .collect(),
    )
}

/// Drops every holder `gone` selects from the model; returns how many.
fn drop_from(
    model: &mut BTreeMap<u64, BTreeMap<u32, u32>>,
    gone: impl Fn(u32, u32) -> bool,
) -> usize {
    let before: usize = model.values().map(BTreeMap::len).sum();
    for hs in model.values_mut() {
        hs.retain(|&r, &mut e| !gone(r, e));
    }
    model.retain(|_, hs| !hs.is_empty());
    before - model.values().map(BTreeMap::len).sum::<usize>()
}

proptest! {
    #[test]
    fn agrees_with_a_map_through_compaction(ops in proptest::collection::vec(op(), 1..120)) {
        let store = Store::new(4, 2, 8);
        // key -> replica -> epoch
        let mut model: BTreeMap<u64, BTreeMap<u32, u32>> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Store { replica, start, len, epoch } => {
                    // Depth = key, so chains never conflict.
                    let blocks: Vec<Block> = (start..start + len)
                        .map(|k| Block::new(k, u32::try_from(k).unwrap()))
                        .collect();
                    let mut results = Vec::new();
                    store
                        .store_chain(&blocks, |_| Holder::new(replica, Tier::T1, epoch), &mut results)
                        .unwrap();
                    for (k, r) in (start..start + len).zip(results) {
                        let added = model.entry(k).or_default().insert(replica, epoch).is_none();
                        prop_assert_eq!(r.is_ok_and(|s| s == Stored::Added), added);
                    }
                }
                Op::Remove { replica, start, len, reversed } => {
                    let mut keys: Vec<u64> = (start..start + len).collect();
                    if reversed {
                        keys.reverse();
                    }
                    let blocks: Vec<Block> = keys.iter().map(|&k| Block::new(k, 0)).collect();
                    let mut n = 0;
                    store.remove(&blocks, |h| h.replica() == replica, |_| n += 1);
                    let had = keys
                        .iter()
                        .filter(|k| model.get_mut(k).is_some_and(|hs| hs.remove(&replica).is_some()))
                        .count();
                    prop_assert_eq!(n, had);
                    model.retain(|_, hs| !hs.is_empty());
                }
                Op::Drop { replica } => {
                    let mut n = 0usize;
                    store.remove_where(None, |h| h.replica() == replica, |_| n += 1);
                    prop_assert_eq!(n, drop_from(&mut model, |r, _| r == replica));
                }
                Op::Evict { epoch } => {
                    let mut set = [0; (crate::arena::EPOCHS / 64) as usize];
                    crate::arena::add_epoch(&mut set, epoch);
                    let mut n = 0usize;
                    store.remove_where(Some(&set), |h| h.epoch() == epoch, |_| n += 1);
                    prop_assert_eq!(n, drop_from(&mut model, |_, e| e == epoch));
                }
                Op::Compact => {
                    store.compact();
                    // Dead records stay within their share, give or take
                    // the page being filled (never compacted).
                    let (len, live) = store.record_counts();
                    let limit = super::compact::DEAD_LIMIT;
                    prop_assert!((len - live) * limit <= len + limit * PAGE_RECORDS);
                }
            }
            prop_assert_eq!(store.counted(), store.record_counts());
            for k in 0..80 {
                prop_assert_eq!(holders_of(&store, k), model.get(&k).cloned(), "key {}", k);
            }
            let (_, live) = store.record_counts();
            prop_assert_eq!(live, model.len());
            prop_assert_eq!(store.key_count(), model.len());
        }
        // Everything gone: every page is given back.
        store.remove_where(None, |_| true, |_| {});
        store.compact();
        prop_assert_eq!(store.record_counts(), (0, 0));
        // Only pages reserved for records never written may stay.
        prop_assert!(store.directory().iter().all(|(_, p)| p.read().len() == 0));
    }
}

#[test]
fn a_chain_is_laid_out_in_order_and_found_by_its_neighbour() {
    let store = Store::new(4, 2, 8);
    let blocks: Vec<Block> = (0..20u32)
        .map(|k| Block::new(u64::from(k) * 7, k))
        .collect();
    store
        .store_chain(&blocks, |_| Holder::new(1, Tier::T1, 0), &mut Vec::new())
        .unwrap();
    let dir = store.directory();
    let mut reader = store.reader(dir);
    // In order, and tail first (as engines evict), with the hint either
    // way: the right neighbour is found whichever is tried first.
    for back in [false, true] {
        let mut prev = reader.find(blocks[0].key, blocks[0].h).unwrap();
        for b in &blocks[1..] {
            let rec = reader.find_near(Some(prev), back, b.key, b.h).unwrap();
            assert_eq!(
                rec,
                if offset_of(prev) + 1 < PAGE_RECORDS {
                    prev + 1
                } else {
                    rec_id(page_of(prev) + 1, 0)
                }
            );
            prev = rec;
        }
    }
    for back in [true, false] {
        let mut prev = reader.find(blocks[19].key, blocks[19].h).unwrap();
        for b in blocks[..19].iter().rev() {
            let rec = reader.find_near(Some(prev), back, b.key, b.h).unwrap();
            assert_eq!(Some(rec), reader.find(b.key, b.h));
            prev = rec;
        }
    }
}

#[test]
fn a_walk_goes_on_into_the_next_page() {
    // 20 records over three pages of 8: one walk from the first record
    // visits all 19 after it, and stops at the first wrong key.
    let store = Store::new(4, 2, 8);
    let blocks = store_numbered_chain(&store, 3, 20);
    let dir = store.directory();
    let mut reader = store.reader(dir);
    let first = reader.find(blocks[0].key, blocks[0].h).unwrap();
    assert_eq!(offset_of(first), 0, "the chain starts a page");
    let mut seen = 0;
    let walked = reader.walk(
        first,
        &blocks[1..],
        |b| b.key,
        |_: &[u32]| {
            seen += 1;
            true
        },
    );
    assert_eq!((walked.blocks, walked.stopped, seen), (19, false, 19));
    let keys: Vec<u64> = blocks[1..12].iter().map(|b| b.key).chain([7, 8]).collect();
    let walked = reader.walk(first, &keys, |&k| k, |_: &[u32]| true);
    assert_eq!((walked.blocks, walked.stopped), (11, false));
    // Stopping when asked, past the page boundary.
    let mut left = 10;
    let walked = reader.walk(
        first,
        &blocks[1..],
        |b| b.key,
        |_: &[u32]| {
            left -= 1;
            left > 0
        },
    );
    assert_eq!((walked.blocks, walked.stopped), (10, true));
}

#[test]
fn duplicates_are_spotted_including_key_zero() {
    assert!(!has_duplicate([1u64, 2, 3, 0].into_iter(), 4));
    assert!(has_duplicate([0u64, 5, 0].into_iter(), 3));
    assert!(has_duplicate((0..100u64).chain([42]), 101));
    assert!(!has_duplicate(0..100u64, 100));
}

#[test]
fn a_block_repeated_in_one_chain_gets_one_record() {
    let store = Store::new(2, 2, 8);
    let blocks = [Block::new(5, 0), Block::new(6, 1), Block::new(5, 0)];
    let mut results = Vec::new();
    store
        .store_chain(&blocks, |_| Holder::new(3, Tier::T1, 0), &mut results)
        .unwrap();
    assert!(matches!(
        results[..],
        [
            Ok(Stored::Added),
            Ok(Stored::Added),
            Ok(Stored::Refreshed(_))
        ]
    ));
    assert_eq!(store.key_count(), 2);
    assert_eq!(store.record_counts(), (2, 2));
}

/// Chain `c` of `len` blocks, stored by replica 1.
pub(super) fn store_numbered_chain(store: &Store, c: u64, len: u32) -> Vec<Block> {
    let blocks: Vec<Block> = (0..len)
        .map(|d| Block::new(c * 100 + u64::from(d), d))
        .collect();
    store
        .store_chain(&blocks, |_| Holder::new(1, Tier::T1, 0), &mut Vec::new())
        .unwrap();
    blocks
}

#[test]
fn pages_dying_whole_are_freed_without_moving_records() {
    // Chains evicted in the order they were stored: every page empties
    // completely, so nothing is copied and nothing dead lingers.
    let store = Store::new(4, 2, 8);
    let mut chains = Vec::new();
    for c in 0..40u64 {
        chains.push(store_numbered_chain(&store, c, 5));
        if c >= 10 {
            store.remove(&chains[(c - 10) as usize], |_| true, |_| {});
            store.compact();
            let (len, live) = store.record_counts();
            assert_eq!(live, 50);
            // Only the page being filled and the oldest live one can
            // hold dead records.
            assert!(len - live < 2 * PAGE_RECORDS, "{len} records, {live} live");
        }
    }
    assert_eq!(store.relocations(), 0);
    assert_eq!(store.counted(), store.record_counts());
}

#[test]
fn a_scattered_dead_share_is_compacted_away() {
    // Every other chain evicted: no page empties, so the dead share
    // crosses its limit and the sparsest pages are moved out.
    let store = Store::new(4, 2, 8);
    let chains: Vec<Vec<Block>> = (0..50u64)
        .map(|c| store_numbered_chain(&store, c, 4))
        .collect();
    for chain in chains.iter().step_by(2) {
        store.remove(chain, |_| true, |_| {});
    }
    store.compact();
    let (len, live) = store.record_counts();
    assert_eq!(live, 100);
    assert!(
        (len - live) * super::compact::DEAD_LIMIT <= len,
        "{len} records, {live} live"
    );
    assert!(store.relocations() > 0);
    for (c, chain) in chains.iter().enumerate().skip(1).step_by(2) {
        let b = chain[3];
        let dir = store.directory();
        let mut reader = store.reader(dir);
        assert!(reader.find(b.key, b.h).is_some(), "chain {c} still found");
    }
}

#[test]
fn holes_left_by_random_evictions_are_refilled_without_copying() {
    // Chains evicted in random order leave runs of dead slots in every
    // page; new chains go into them, so nothing is copied and the dead
    // share stays far below the compaction limit.
    let store = Store::new(4, 2, 8);
    let mut resident: Vec<(u64, Vec<Block>)> = (0..60u64)
        .map(|c| (c, store_numbered_chain(&store, c, 4)))
        .collect();
    let mut rng = 0x9e37_79b9_u64;
    for c in 60..600u64 {
        rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let slot = usize::try_from(rng >> 33).unwrap() % resident.len();
        store.remove(&resident[slot].1, |_| true, |_| {});
        store.compact();
        resident[slot] = (c, store_numbered_chain(&store, c, 4));
        let (len, live) = store.record_counts();
        assert_eq!(live, 240);
        assert!((len - live) * 8 <= len, "{len} records, {live} live");
    }
    assert_eq!(store.relocations(), 0);
    assert_eq!(store.counted(), store.record_counts());
    // Every chain is found, its blocks side by side (a run of dead slots
    // takes a whole chain).
    let dir = store.directory();
    let mut reader = store.reader(dir);
    for (c, chain) in &resident {
        let mut prev = reader.find(chain[0].key, chain[0].h);
        assert!(prev.is_some(), "chain {c}");
        for b in &chain[1..] {
            let rec = reader.find_near(prev, false, b.key, b.h);
            assert_eq!(rec, reader.find(b.key, b.h), "chain {c}");
            prev = rec;
        }
    }
}

#[test]
fn holes_left_by_evicting_chain_tails_are_refilled_too() {
    // Engines evict a chain's last blocks first: each eviction leaves a
    // run at the end of a chain, long enough to take new records.
    let store = Store::new(4, 2, 8);
    let mut resident: Vec<Vec<Block>> = (0..200u64)
        .map(|c| store_numbered_chain(&store, c, 6))
        .collect();
    let mut rng = 0x2545_f491_u64;
    for c in 200..2000u64 {
        rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let slot = usize::try_from(rng >> 33).unwrap() % resident.len();
        // Its last three blocks, then the rest later (a whole chain goes
        // in two steps).
        if resident[slot].len() == 6 {
            let tail = resident[slot].split_off(3);
            store.remove(&tail, |_| true, |_| {});
        } else {
            store.remove(&resident[slot], |_| true, |_| {});
            resident[slot] = store_numbered_chain(&store, c, 6);
        }
        store.compact();
        let (len, live) = store.record_counts();
        assert!((len - live) * 4 <= len, "{len} records, {live} live");
    }
    assert_eq!(store.relocations(), 0);
    assert_eq!(store.counted(), store.record_counts());
    let dir = store.directory();
    let mut reader = store.reader(dir);
    for chain in &resident {
        for b in chain {
            assert!(reader.find(b.key, b.h).is_some());
        }
    }
}

#[test]
fn a_first_block_moved_into_a_page_the_rebuild_has_read_stays_held() {
    // A rebuild of the first-block filter reads a few pages a compaction;
    // between two slices, compaction moves the live records of sparse
    // pages not yet read into freed pages it has read. Their first blocks
    // must reach the rebuilt filter all the same.
    let store = Store::new(4, 2, 8);
    let chains: Vec<Vec<Block>> = (0..40u64)
        .map(|c| store_numbered_chain(&store, c, 4))
        .collect();
    // Pages 0 and 1 (chains 0-3) empty; the rebuild starts and reads
    // pages 0-7.
    for chain in &chains[..4] {
        store.remove(chain, |_| true, |_| {});
    }
    store.place.lock().firsts.added = usize::MAX / 2;
    store.compact();
    assert!(store.place.lock().firsts.pending.is_some());
    // Every other chain of pages 10-19 goes: the dead share passes its
    // limit, and their live halves move, first into the freed pages 0-1.
    for chain in chains[20..].iter().step_by(2) {
        store.remove(chain, |_| true, |_| {});
    }
    let mut slices = 1;
    loop {
        store.compact();
        slices += 1;
        if store.place.lock().firsts.pending.is_none() {
            break;
        }
        assert!(slices < 100, "the rebuild never ends");
    }
    assert!(store.relocations() > 0, "nothing was moved");
    assert_eq!(store.firsts_rebuilds(), 1);
    let live = (4..20).chain((21..40).step_by(2));
    for c in live {
        let first = chains[c][0];
        assert!(store.firsts.may_hold(first.h), "chain {c}'s first block");
    }
}
