use std::collections::HashMap;

use proptest::prelude::*;

use super::bucket::{FULL, lanes_equal, tags_equal};
use super::*;

/// A deliberately weak hash so that keys share tags and buckets; the
/// record id stands in for the key.
fn weak(key: u32) -> u64 {
    u64::from(key % 7 * 10_000 + 5_000) << 48
}

#[test]
fn lanes_are_compared_exactly() {
    let w = 0x8000_0000_7fff_0001u64;
    assert_eq!(lanes_equal(w, 0x0001), 0b0001);
    assert_eq!(lanes_equal(w, 0x7fff), 0b0010);
    assert_eq!(lanes_equal(w, 0x0000), 0b0100);
    assert_eq!(lanes_equal(w, 0x8000), 0b1000);
    assert_eq!(lanes_equal(w, 0xffff), 0);
    assert_eq!(lanes_equal(0, 0), 0b1111);
    for lane in 0..4 {
        for t in [0u16, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
            let w = u64::from(t) << (16 * lane) | (u64::from(!t) << (16 * ((lane + 1) % 4)));
            assert_eq!(
                lanes_equal(w, t) & (1 << lane),
                1 << lane,
                "{t:#x} in lane {lane}"
            );
            assert_eq!(lanes_equal(w, t) & (1 << ((lane + 1) % 4)), 0);
        }
    }
}

/// The word-wise reference for [`tags_equal`]'s ten lanes.
fn ten_lanes(w: [u64; 3], tag: u16) -> u16 {
    lanes_equal(w[0], tag) | lanes_equal(w[1], tag) << 4 | (lanes_equal(w[2], tag) & 0b11) << 8
}

#[test]
fn the_ten_tag_lanes_are_compared_exactly() {
    // Word 2's upper half holds the occupancy mask, never a tag.
    let w = [
        0x8000_0000_7fff_0001,
        0xffff_0001_0001_1234,
        0x03ff_0000_0001_8000,
    ];
    assert_eq!(tags_equal(w, 0x0001) & FULL, 0b10_0110_0001);
    assert_eq!(tags_equal(w, 0x8000) & FULL, 0b01_0000_1000);
    assert_eq!(tags_equal(w, 0xffff) & FULL, 0b00_1000_0000);
    assert_eq!(tags_equal(w, 0x0000) & FULL, 0b00_0000_0100);
    assert_eq!(
        tags_equal(w, 0x03ff) & FULL,
        0,
        "the mask's lane is not a tag"
    );
}

proptest! {
    #[test]
    fn tag_lanes_agree_with_the_word_wise_compare(
        w in proptest::array::uniform3(any::<u64>()),
        lanes in proptest::array::uniform10(any::<bool>()),
        tag in any::<u16>(),
    ) {
        // Plant the tag in some lanes so that matches are common.
        let mut w = w;
        for (i, &on) in lanes.iter().enumerate() {
            if on {
                let shift = (i % 4) * 16;
                w[i / 4] = (w[i / 4] & !(0xffff << shift)) | u64::from(tag) << shift;
            }
        }
        prop_assert_eq!(tags_equal(w, tag) & FULL, ten_lanes(w, tag));
    }
}

#[test]
fn a_bucket_is_one_cache_line() {
    assert_eq!(std::mem::size_of::<Bucket>(), 64);
    assert_eq!(std::mem::align_of::<Bucket>(), 64);
}

#[test]
fn the_mask_tracks_slots() {
    let mut sole = Sole::default();
    let b = Bucket::default();
    assert_eq!(b.free(), Some(0));
    for i in 0..BUCKET_SLOTS {
        b.put(
            &mut sole,
            i,
            KeySlot {
                tag: 7,
                rec: u32::MAX - i as u32,
            },
        );
    }
    assert_eq!((b.free(), b.count()), (None, 10));
    b.clear(&mut sole, 1 << 3);
    assert_eq!(b.free(), Some(3));
    assert_eq!(b.matching(7), FULL & !(1 << 3));
    assert_eq!(b.matching(8), 0);
    assert_eq!(b.rec(9), u32::MAX - 9);
    // Each slot's lanes are its own.
    b.put(&mut sole, 3, KeySlot { tag: 8, rec: 5 });
    assert_eq!(b.matching(8), 1 << 3);
    assert_eq!(
        (b.rec(2), b.rec(3), b.rec(4)),
        (u32::MAX - 2, 5, u32::MAX - 4)
    );
    assert_eq!(b.slot(9).tag, 7);
}

#[test]
fn keys_sharing_a_tag_overflow_and_are_all_found() {
    // One tag for every key: two buckets hold twenty of them and the
    // rest overflow; each is still found (by its record).
    let mut sole = Sole::default();
    let t = KeyTable::sized(100);
    let n = 100u32;
    let h = |_: u32| 0xabcd_u64 << 48;
    for k in 0..n {
        t.insert(&mut sole, h(k), k);
    }
    assert!(t.overflow_len.load(Ordering::Relaxed) > 0);
    for k in 0..n {
        assert_eq!(t.find(h(k), |r| r == k), Some(k));
    }
    assert_eq!(t.find(h(n), |r| r == n), None);
    t.remove_all(&mut sole, |r| r % 2 == 0);
    assert_eq!(t.len(), (n / 2) as usize);
    assert_eq!(t.find(h(3), |r| r == 3), Some(3));
    assert_eq!(t.find(h(4), |r| r == 4), None);
    for k in (1..n).step_by(2) {
        assert!(t.remove(&mut sole, h(k), k));
    }
    assert_eq!(t.len(), 0);
}

#[test]
fn a_table_at_its_size_stays_in_its_buckets() {
    let mut sole = Sole::default();
    let t = KeyTable::sized(2048);
    let h = |k: u32| crate::store::hash(u64::from(k));
    for k in 0..2048 {
        t.insert(&mut sole, h(k), k);
    }
    assert_eq!(t.overflow_len.load(Ordering::Relaxed), 0);
    let slots = t.swept_slots();
    assert!(t.len() * 10 >= slots * 7, "at least 70% full");
    for k in 0..2048 {
        assert_eq!(t.find(h(k), |r| r == k), Some(k));
    }
}

#[test]
fn tables_at_the_overshoot_peak_keep_their_keys_in_buckets() {
    // The index holds up to 17/16 of its capacity before it evicts:
    // 256 tables of each share size, each filled to 17/16 of its share
    // and two standard deviations more,
    // keep nearly every key in its buckets (fails with tables sized for
    // the share alone: a few percent of keys then overflow), and every
    // key, overflowed or not, is found.
    let mut sole = Sole::default();
    let h = |k: u32| crate::store::hash(u64::from(k));
    for share in [300u32, 1221, 2048] {
        // A table's keys spread around its share: two standard
        // deviations over it, as one table in fifty holds.
        let peak = share + share / 16;
        let fill = peak + 2 * peak.isqrt();
        let (mut overflowed, mut spilled) = (0, 0);
        for t in 0..256u32 {
            let table = KeyTable::sized(share as usize);
            let keys = t * 10_000..t * 10_000 + fill;
            for k in keys.clone() {
                table.insert(&mut sole, h(k), k);
            }
            overflowed += table.overflowed();
            spilled += table.spill_len.load(Ordering::Relaxed);
            for k in keys {
                assert_eq!(table.find(h(k), |r| r == k), Some(k), "share {share}");
            }
        }
        eprintln!(
            "share {share}: {overflowed} of {} keys overflowed",
            256 * fill
        );
        assert!(
            overflowed <= 2,
            "share {share}: {overflowed} keys overflowed"
        );
        assert_eq!(
            spilled, 0,
            "share {share}: spilled past the lock-free slots"
        );
    }
}

#[test]
fn a_table_is_allocated_on_its_first_key_only() {
    let mut sole = Sole::default();
    let t = KeyTable::sized(1000);
    assert_eq!(t.heap_bytes(), 0);
    assert_eq!(t.find(5, |_| true), None);
    t.insert(&mut sole, crate::store::hash(1), 1);
    // A sixteenth of the full size.
    assert_eq!(t.heap_bytes(), buckets_for(1000).div_ceil(16) * 64);
}

#[test]
fn readers_never_miss_a_key_present_throughout_while_others_move() {
    // A reader thread looks up keys that stay in the table while the
    // writer inserts keys of the same tags (kicking residents between
    // buckets), removes them and re-points others: every search for a
    // resident key must find it. Fails if kicks or relocations are not
    // marked (a miss read during a move is then answered).
    const RESIDENTS: u32 = 70;
    let t = std::sync::Arc::new(KeyTable::sized(40));
    let mut sole = Sole::default();
    // 70 residents in 80 slots (sized for 40: 17/16 of it and slack
    // make seven buckets, grown from four to eight): an insert often
    // finds both its buckets full and kicks.
    let h = |k: u32| crate::store::hash(u64::from(k));
    for k in 0..RESIDENTS {
        t.insert(&mut sole, h(k), k);
    }
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (t, done) = (t.clone(), done.clone());
        std::thread::spawn(move || {
            let mut misses = 0u64;
            let mut i = 0u32;
            while !done.load(Ordering::Relaxed) {
                let k = i % RESIDENTS;
                // Resident k is record k or, relocated, k + 1,000,000.
                if t.find(h(k), |r| r == k || r == k + 1_000_000).is_none() {
                    misses += 1;
                }
                i = i.wrapping_add(1);
            }
            misses
        })
    };
    for round in 0..100_000u32 {
        let extras: Vec<u32> = (0..8).map(|i| 1_000 + (round * 8 + i) % 4_096).collect();
        for &e in &extras {
            t.insert(&mut sole, h(e), e);
        }
        let k = round % RESIDENTS;
        let (from, to) = if (round / RESIDENTS).is_multiple_of(2) {
            (k, k + 1_000_000)
        } else {
            (k + 1_000_000, k)
        };
        t.relocate(&mut sole, h(k), from, to);
        for &e in &extras {
            t.remove(&mut sole, h(e), e);
        }
    }
    done.store(true, Ordering::Relaxed);
    let moves = t.moves.load(Ordering::Relaxed);
    let misses = reader.join().ok();
    eprintln!("{moves} moves, {misses:?} misses");
    assert!(moves >= 120_000, "the writer moved keys: {moves}");
    assert_eq!(misses, Some(0), "misses of resident keys");
}

#[test]
fn readers_never_miss_a_key_present_throughout_a_growth() {
    // Tables fill from empty, one after another, each doubling four
    // times on the way, while a reader looks up keys already in the table
    // being filled: every search must find its key. Fails if a doubling
    // clears the keys it moved before it publishes the new size, or
    // publishes the size before the copies. The reader's speed does not
    // decide the outcome: every few inserts the writer waits until the
    // reader has searched again, so the searches overlap the whole fill.
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
    /// Inserts between two waits for the reader.
    const EVERY: u32 = 4;
    const TABLES: u32 = 1_500;
    const FILL: u32 = 560;
    let tables: Arc<Vec<KeyTable>> = Arc::new((0..TABLES).map(|_| KeyTable::sized(500)).collect());
    assert_eq!(tables[0].doublings, 4);
    let current = Arc::new(AtomicU32::new(0));
    let filled = Arc::new(AtomicU32::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let searched = Arc::new(AtomicU64::new(0));
    let h = |t: u32, k: u32| crate::store::hash(u64::from(t) << 32 | u64::from(k));
    let reader = {
        let (tables, current, filled, done, searched) = (
            tables.clone(),
            current.clone(),
            filled.clone(),
            done.clone(),
            searched.clone(),
        );
        std::thread::spawn(move || {
            let (mut misses, mut searches, mut i) = (0u64, 0u64, 0u32);
            while !done.load(Ordering::Acquire) {
                // The table, then how many of its keys are in (the writer
                // resets the count before it moves on).
                let t = current.load(Ordering::Acquire);
                let n = filled.load(Ordering::Acquire);
                if t >= TABLES || n == 0 || current.load(Ordering::Acquire) != t {
                    continue;
                }
                i = i.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                let k = (i >> 8) % n;
                if tables[t as usize].find(h(t, k), |r| r == k).is_none() {
                    misses += 1;
                }
                searches += 1;
                searched.store(searches, Ordering::Release);
            }
            (misses, searches)
        })
    };
    let mut sole = Sole::default();
    let mut waits = 0u64;
    for t in 0..TABLES {
        filled.store(0, Ordering::Release);
        current.store(t, Ordering::Release);
        for k in 0..FILL {
            tables[t as usize].insert(&mut sole, h(t, k), k);
            filled.store(k + 1, Ordering::Release);
            if (k + 1) % EVERY == 0 {
                // The reader searches this table (it has keys) before the
                // writer goes on: however slow the reader, it keeps up.
                let seen = searched.load(Ordering::Acquire);
                let mut spins = 0u32;
                while searched.load(Ordering::Acquire) == seen {
                    // Spin first (a running reader answers in a search's
                    // time); yield only if it is not running.
                    spins += 1;
                    if spins < 1_000 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                waits += 1;
            }
        }
    }
    done.store(true, Ordering::Release);
    let (misses, searches) = reader.join().unwrap_or((u64::MAX, 0));
    let grown: usize = tables.iter().map(|t| t.grown.load(Ordering::Relaxed)).sum();
    eprintln!("{grown} doublings, {searches} searches, {waits} waits, {misses} misses");
    assert_eq!(grown, 4 * TABLES as usize, "every table doubled four times");
    // Each wait saw at least one more search (the handshake is counted).
    assert!(searches >= waits, "{searches} searches, {waits} waits");
    assert_eq!(misses, 0, "misses of keys present throughout");
    for t in (0..TABLES).step_by(97) {
        for k in 0..FILL {
            assert_eq!(tables[t as usize].find(h(t, k), |r| r == k), Some(k));
        }
    }
}

#[test]
fn keys_overflowed_while_small_go_to_their_buckets_when_the_table_grows() {
    // Twelve keys whose two buckets are both bucket (0, 0) of the first
    // size: ten fill it, two overflow. After the doubling the ten keep
    // (0, 0) and the two have (0, 1), the new segment's empty bucket:
    // they must move there (fails if a doubling leaves them overflowed).
    let mut sole = Sole::default();
    let t = KeyTable::sized(500);
    assert_eq!((t.first, t.doublings), (4, 4));
    let both = |tag: u16, d: u32, home: Home| t.homes(tag, d) == [home, home];
    let crowded: Vec<u16> = (0..=u16::MAX)
        .filter(|&g| both(g, 0, (0, 0)) && both(g, 1, (0, 0)))
        .take(10)
        .chain(
            (0..=u16::MAX)
                .filter(|&g| both(g, 0, (0, 0)) && both(g, 1, (0, 1)))
                .take(2),
        )
        .collect();
    assert_eq!(crowded.len(), 12);
    let h = |tag: u16| u64::from(tag) << 48;
    for (rec, &g) in (0..).zip(&crowded) {
        t.insert(&mut sole, h(g), rec);
    }
    assert_eq!(t.overflowed(), 2, "two keys found no room");
    // Keys that keep clear of bucket 0 of either size, until it doubles.
    let others = (0..=u16::MAX).filter(|&g| {
        let [a, b] = t.homes(g, 1);
        a.0 != 0 && b.0 != 0
    });
    let mut rec = 100;
    for g in others {
        if t.grown.load(Ordering::Relaxed) == 1 {
            break;
        }
        t.insert(&mut sole, h(g), rec);
        rec += 1;
    }
    assert_eq!(t.grown.load(Ordering::Relaxed), 1, "the table doubled");
    assert_eq!(t.overflowed(), 0, "the overflowed keys were re-placed");
    for (rec, &g) in (0..).zip(&crowded) {
        assert_eq!(t.find(h(g), |r| r == rec), Some(rec));
    }
    assert_eq!(t.len(), 12 + (rec - 100) as usize);
}

#[test]
fn readers_find_overflowed_keys_without_a_lock_while_others_move() {
    // Every key has one tag, so two buckets hold twenty and the rest
    // sit in the overflow slots: a reader looks up residents while the
    // writer adds and removes keys of that tag (kicking residents out
    // to the slots and back) and re-points residents. Every search for
    // a resident must find it. Fails if an overflow slot is written
    // outside the sequence's odd spells, or freed by moving another.
    const RESIDENTS: u32 = 26;
    let t = std::sync::Arc::new(KeyTable::sized(8));
    let mut sole = Sole::default();
    let h = 0x5a5a_u64 << 48;
    for k in 0..RESIDENTS {
        t.insert(&mut sole, h, k);
    }
    assert_eq!(t.overflowed(), 6);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (t, done) = (t.clone(), done.clone());
        std::thread::spawn(move || {
            let (mut misses, mut i) = (0u64, 0u32);
            while !done.load(Ordering::Relaxed) {
                let k = i % RESIDENTS;
                if t.find(h, |r| r == k || r == k + 1_000_000).is_none() {
                    misses += 1;
                }
                i = i.wrapping_add(1);
            }
            misses
        })
    };
    let mut spilled = 0;
    for round in 0..50_000u32 {
        let extras = [500 + round % 7, 600 + round % 5];
        for e in extras {
            t.insert(&mut sole, h, e);
        }
        spilled += t.spill_len.load(Ordering::Relaxed);
        let k = round % RESIDENTS;
        let (from, to) = if (round / RESIDENTS).is_multiple_of(2) {
            (k, k + 1_000_000)
        } else {
            (k + 1_000_000, k)
        };
        assert!(t.relocate(&mut sole, h, from, to));
        for e in extras {
            assert!(t.remove(&mut sole, h, e));
        }
    }
    done.store(true, Ordering::Relaxed);
    let misses = reader.join().ok();
    assert_eq!(spilled, 0, "eight slots held every overflowed key");
    assert_eq!(misses, Some(0), "misses of resident keys");
}

proptest! {
    #[test]
    fn behaves_like_a_map(ops in proptest::collection::vec((0u8..4, 0u32..40, 0u32..1000), 1..300)) {
        let mut sole = Sole::default();
        let t = KeyTable::sized(8);
        // key -> record
        let mut model: HashMap<u32, RecId> = HashMap::new();
        for (op, key, rec) in ops {
            // Records are unique per key here: key * 1000 + n.
            let rec = key * 1000 + rec;
            let find = |t: &KeyTable, key: u32| t.find(weak(key), |r| r / 1000 == key);
            match op {
                0 => if let std::collections::hash_map::Entry::Vacant(e) = model.entry(key) {
                    t.insert(&mut sole, weak(key), rec);
                    e.insert(rec);
                },
                1 => {
                    let had = model.remove(&key);
                    prop_assert_eq!(had.is_some(), had.is_some_and(|r| t.remove(&mut sole, weak(key), r)));
                }
                2 => if let Some(old) = model.get_mut(&key) {
                    prop_assert!(t.relocate(&mut sole, weak(key), *old, rec));
                    *old = rec;
                },
                _ => {
                    t.remove_all(&mut sole, |r| r % 2 == 0);
                    model.retain(|_, r| *r % 2 != 0);
                }
            }
            prop_assert_eq!(t.len(), model.len());
            for k in 0..40 {
                prop_assert_eq!(find(&t, k), model.get(&k).copied());
            }
        }
    }
}

#[test]
fn rows_map_to_their_segments() {
    // Segment s > 0 holds rows 2^(s-1)..2^s: row 0 in segment 0, 1 in 1,
    // 2-3 in 2, 4-7 in 3, 8-15 in 4.
    assert_eq!(ROW_PLACE[0], (0, 0));
    assert_eq!(ROW_PLACE[1], (1, 0));
    assert_eq!((ROW_PLACE[2], ROW_PLACE[3]), ((2, 0), (2, 1)));
    assert_eq!((ROW_PLACE[4], ROW_PLACE[7]), ((3, 0), (3, 3)));
    assert_eq!((ROW_PLACE[8], ROW_PLACE[15]), ((4, 0), (4, 7)));
}
