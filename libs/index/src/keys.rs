//! Block key → record id: cuckoo tables of cache-line buckets, each holding
//! ten slots of a 16-bit tag (the top bits of the key's hash) and a record
//! id. Keys themselves live in the records, so callers confirm a tag match
//! by reading the record.
//!
//! A key may sit in either of two buckets, both derived from its tag: a
//! search reads at most those two cache lines (whose loads overlap), an
//! insert takes a free slot in the emptier one (moving a resident to its
//! other bucket when both are full), and a removal just clears the slot's
//! bit in the bucket's occupancy mask. With two choices of ten slots the
//! tables run 70–90% full, so a key costs about 7–9 bytes of table.
//!
//! A bucket keeps its ten tags together, then the ten record ids, then the
//! occupancy mask, so that matching a tag, counting or finding free slots
//! are a few register operations rather than a walk over the slots.
//!
//! Because buckets come from the tag alone (scaled to the table's size),
//! growing and shrinking never read a record. The price is that a table
//! tells apart at most 2^16 tags, and the keys of one bucket share the
//! tag's top bits: the store keeps many small tables (one or two thousand
//! keys each, see [`crate::store`] and `KEYS_PER_TABLE`), where a probe
//! meets a foreign key with its tag only a few percent of the time (one
//! extra record read). Keys that cannot be placed in their buckets (only
//! when very many share a tag) wait in a small overflow list that searches
//! also read.

use crate::arena::RecId;
use crate::prefetch::prefetch;

const MAX_LOAD_NUM: usize = 9;
const MAX_LOAD_DEN: usize = 10;
/// Below this load a table is rebuilt smaller (at 72%, like a grown one).
const SHRINK_LOAD_NUM: usize = 3;
const SHRINK_LOAD_DEN: usize = 5;
/// Slots per bucket: ten 2-byte tags and ten 4-byte ids, plus a 2-byte
/// mask, fill a 64-byte line.
const BUCKET_SLOTS: usize = 10;
/// The occupancy mask of a full bucket.
const FULL: u16 = (1 << BUCKET_SLOTS) - 1;
const MIN_BUCKETS: usize = 2;
/// Residents moved, at most, to make room for one insert.
const MAX_KICKS: usize = 32;

/// A key's tag and record id.
#[derive(Clone, Copy, Debug)]
struct KeySlot {
    tag: u16,
    rec: RecId,
}

/// One cache line of slots.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Bucket {
    tags: [u16; BUCKET_SLOTS],
    /// Record ids as 16-bit halves, so that the line has no padding holes.
    recs: [[u16; 2]; BUCKET_SLOTS],
    /// Bit `i` set: slot `i` is occupied.
    used: u16,
}

const EMPTY: Bucket = Bucket {
    tags: [0; BUCKET_SLOTS],
    recs: [[0; 2]; BUCKET_SLOTS],
    used: 0,
};

impl Bucket {
    /// The occupied slots carrying `tag`, as a mask.
    #[inline]
    fn matching(&self, tag: u16) -> u16 {
        let mut mask = 0u16;
        for (i, &t) in self.tags.iter().enumerate() {
            mask |= u16::from(t == tag) << i;
        }
        mask & self.used
    }

    fn rec(&self, i: usize) -> RecId {
        let [lo, hi] = self.recs[i];
        RecId::from(lo) | (RecId::from(hi) << 16)
    }

    fn slot(&self, i: usize) -> KeySlot {
        KeySlot {
            tag: self.tags[i],
            rec: self.rec(i),
        }
    }

    fn put(&mut self, i: usize, slot: KeySlot) {
        self.tags[i] = slot.tag;
        // Split into halves; each fits 16 bits by construction.
        #[allow(clippy::cast_possible_truncation)]
        let halves = [slot.rec as u16, (slot.rec >> 16) as u16];
        self.recs[i] = halves;
        self.used |= 1 << i;
    }

    fn clear(&mut self, i: usize) {
        self.used &= !(1 << i);
    }

    fn free(&self) -> Option<usize> {
        let i = (!self.used & FULL).trailing_zeros() as usize;
        (i < BUCKET_SLOTS).then_some(i)
    }

    fn count(&self) -> u32 {
        self.used.count_ones()
    }

    /// The occupied slots, lowest first.
    fn occupied(&self) -> impl Iterator<Item = usize> + use<> {
        bits(self.used)
    }
}

/// The set bits of `mask`, lowest first.
fn bits(mut mask: u16) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let i = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        Some(i)
    })
}

/// The table.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    buckets: Vec<Bucket>,
    /// Keys no bucket had room for.
    overflow: Vec<KeySlot>,
    len: usize,
}

/// The tag of a hash.
fn tag(h: u64) -> u16 {
    // The top 16 bits (the store picks tables with lower ones).
    #[allow(clippy::cast_possible_truncation)]
    let t = (h >> 48) as u16;
    t
}

/// The tag mixed, for the second bucket.
fn other(tag: u16) -> u16 {
    // The high half of a 32-bit product: 16 bits.
    #[allow(clippy::cast_possible_truncation)]
    let t = (u32::from(tag).wrapping_mul(0x9e37_79b1) >> 16) as u16;
    t
}

/// Bucket count for `len` keys right after a rebuild (72% full).
fn buckets_for(len: usize) -> usize {
    (len * MAX_LOAD_DEN * 5 / (MAX_LOAD_NUM * 4 * BUCKET_SLOTS) + 1).max(MIN_BUCKETS)
}

/// The bucket of 16-bit hash `u` among `n`: its share of the range, so
/// that a bucket's keys go to neighbouring buckets in a table of another size.
fn scaled(u: u16, n: usize) -> usize {
    (usize::from(u) * n) >> 16
}

/// Where a key sits: bucket and slot, or overflow list index.
#[derive(Clone, Copy, Debug)]
enum At {
    Slot(usize, usize),
    Overflow(usize),
}

impl KeyTable {
    /// The two buckets of `tag`.
    fn buckets_of(&self, tag: u16) -> [usize; 2] {
        let n = self.buckets.len();
        [scaled(tag, n), scaled(other(tag), n)]
    }

    fn capacity(&self) -> usize {
        self.buckets.len() * BUCKET_SLOTS
    }

    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes this table holds on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.buckets.capacity() * size_of::<Bucket>()
            + self.overflow.capacity() * size_of::<KeySlot>()
    }

    /// Starts loading both buckets of hash `h`, so that their cache lines
    /// are on their way before [`KeyTable::find`] needs them.
    pub(crate) fn prefetch(&self, h: u64) {
        if self.buckets.is_empty() {
            return;
        }
        let [a, b] = self.buckets_of(tag(h));
        prefetch(&self.buckets[a]);
        prefetch(&self.buckets[b]);
    }

    /// The first slot of hash `h` that `wanted` accepts.
    #[inline]
    fn probe(&self, h: u64, mut wanted: impl FnMut(KeySlot) -> bool) -> Option<At> {
        if self.buckets.is_empty() {
            return None;
        }
        let t = tag(h);
        let [a, b] = self.buckets_of(t);
        for bucket in [a, b] {
            let found = &self.buckets[bucket];
            for i in bits(found.matching(t)) {
                if wanted(found.slot(i)) {
                    return Some(At::Slot(bucket, i));
                }
            }
        }
        if self.overflow.is_empty() {
            return None;
        }
        self.overflow
            .iter()
            .position(|s| s.tag == t && wanted(*s))
            .map(At::Overflow)
    }

    fn get(&self, at: At) -> KeySlot {
        match at {
            At::Slot(b, s) => self.buckets[b].slot(s),
            At::Overflow(i) => self.overflow[i],
        }
    }

    fn set(&mut self, at: At, slot: KeySlot) {
        match at {
            At::Slot(b, s) => self.buckets[b].put(s, slot),
            At::Overflow(i) => self.overflow[i] = slot,
        }
    }

    /// Whether some entry carries the tag of hash `h` (false: no key of
    /// that hash is here, without reading a record).
    #[inline]
    pub(crate) fn has_tag(&self, h: u64) -> bool {
        self.probe(h, |_| true).is_some()
    }

    /// The record with hash `h` that `is_it` confirms.
    pub(crate) fn find(&self, h: u64, mut is_it: impl FnMut(RecId) -> bool) -> Option<RecId> {
        self.probe(h, |s| is_it(s.rec)).map(|at| self.get(at).rec)
    }

    /// Adds `rec` under hash `h` (the caller knows its key is absent).
    pub(crate) fn insert(&mut self, h: u64, rec: RecId) {
        if (self.len + 1) * MAX_LOAD_DEN > self.capacity() * MAX_LOAD_NUM {
            self.rebuild(buckets_for(self.len + 1));
        }
        self.place(KeySlot { tag: tag(h), rec });
        self.len += 1;
    }

    /// Puts `slot` in the emptier of its buckets; when both are full, moves
    /// residents to their other buckets to make room, and failing that adds
    /// it to the overflow list.
    fn place(&mut self, mut slot: KeySlot) {
        let [a, b] = self.buckets_of(slot.tag);
        let target = if self.buckets[b].count() < self.buckets[a].count() {
            b
        } else {
            a
        };
        if let Some(free) = self.buckets[target].free() {
            self.buckets[target].put(free, slot);
            return;
        }
        // Both full: evict a resident to its other bucket, and so on.
        let mut bucket = target;
        for kick in 0..MAX_KICKS {
            // Vary the victim so that chains do not cycle.
            let victim = (usize::from(slot.tag) + kick) % BUCKET_SLOTS;
            let evicted = self.buckets[bucket].slot(victim);
            self.buckets[bucket].put(victim, slot);
            slot = evicted;
            let [x, y] = self.buckets_of(slot.tag);
            bucket = if x == bucket { y } else { x };
            if let Some(free) = self.buckets[bucket].free() {
                self.buckets[bucket].put(free, slot);
                return;
            }
        }
        self.overflow.push(slot);
    }

    fn position(&self, h: u64, rec: RecId) -> Option<At> {
        self.probe(h, |s| s.rec == rec)
    }

    /// Points the entry of `old` (hash `h`) at `new`; false if absent.
    pub(crate) fn relocate(&mut self, h: u64, old: RecId, new: RecId) -> bool {
        match self.position(h, old) {
            Some(at) => {
                self.set(
                    at,
                    KeySlot {
                        tag: tag(h),
                        rec: new,
                    },
                );
                true
            }
            None => false,
        }
    }

    /// Removes the entry of `rec` (hash `h`); false if absent.
    pub(crate) fn remove(&mut self, h: u64, rec: RecId) -> bool {
        match self.position(h, rec) {
            Some(At::Slot(b, s)) => self.buckets[b].clear(s),
            Some(At::Overflow(i)) => {
                self.overflow.swap_remove(i);
            }
            None => return false,
        }
        self.len -= 1;
        true
    }

    /// Removes every entry whose record `dead` names, in one pass over the
    /// table (cheaper than a probe each when they are many).
    pub(crate) fn remove_all(&mut self, dead: impl Fn(RecId) -> bool) {
        let mut removed = 0;
        for bucket in &mut self.buckets {
            // Every slot, used or not, without a branch per slot: a share
            // of dead keys scattered at random mispredicts a branch often
            // enough to double the sweep.
            let mut gone = 0u16;
            for i in 0..BUCKET_SLOTS {
                gone |= u16::from(dead(bucket.rec(i))) << i;
            }
            gone &= bucket.used;
            bucket.used &= !gone;
            removed += gone.count_ones() as usize;
        }
        let before = self.overflow.len();
        self.overflow.retain(|s| !dead(s.rec));
        self.len -= removed + (before - self.overflow.len());
    }

    /// Gives memory back when the table is mostly empty.
    pub(crate) fn shrink(&mut self) {
        if self.len == 0 {
            self.buckets = Vec::new();
            self.overflow = Vec::new();
            return;
        }
        if self.buckets.len() > MIN_BUCKETS
            && self.len * SHRINK_LOAD_DEN < self.capacity() * SHRINK_LOAD_NUM
        {
            self.rebuild(buckets_for(self.len));
        }
    }

    /// Moves every key into a table of `buckets` buckets: into its first
    /// bucket while that has room, otherwise placed as an insert would be.
    /// Bucket numbers scale with the table, so the keys of old bucket `i`
    /// go to the new buckets around `i * buckets / old`: the writes walk the
    /// new table in order. It also leaves the buckets' counts spread rather
    /// than all near the mean, so later inserts find an emptier choice more
    /// often: sampled on the way to 2,000 keys, 2.4% of buckets were full,
    /// against 10.1% when each key was re-placed in the emptier of its two.
    fn rebuild(&mut self, buckets: usize) {
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; buckets]);
        let overflow = std::mem::take(&mut self.overflow);
        for bucket in &old {
            for s in bucket.occupied() {
                let slot = bucket.slot(s);
                let first = &mut self.buckets[scaled(slot.tag, buckets)];
                match first.free() {
                    Some(free) => first.put(free, slot),
                    None => self.place(slot),
                }
            }
        }
        for s in overflow {
            self.place(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// A deliberately weak hash so runs collide and wrap; the record id
    /// stands in for the key.
    fn weak(key: u32) -> u64 {
        // Tags spread over the whole range, so the last home's run wraps.
        u64::from(key % 7 * 10_000 + 5_000) << 48
    }

    #[test]
    fn a_bucket_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }

    #[test]
    fn the_mask_tracks_slots() {
        let mut b = EMPTY;
        assert_eq!(b.free(), Some(0));
        for i in 0..BUCKET_SLOTS {
            b.put(
                i,
                KeySlot {
                    tag: 7,
                    rec: u32::MAX - i as u32,
                },
            );
        }
        assert_eq!((b.free(), b.count()), (None, 10));
        b.clear(3);
        assert_eq!(b.free(), Some(3));
        assert_eq!(b.matching(7), FULL & !(1 << 3));
        assert_eq!(b.matching(8), 0);
        assert_eq!(b.rec(9), u32::MAX - 9);
        assert_eq!(b.occupied().count(), 9);
    }

    #[test]
    fn keys_sharing_a_tag_overflow_and_are_all_found() {
        // One tag for every key: two buckets hold twenty of them and the
        // rest overflow; each is still found (by its record).
        let mut t = KeyTable::default();
        let n = 100u32;
        let h = |_: u32| 0xabcd_u64 << 48;
        for k in 0..n {
            t.insert(h(k), k);
        }
        assert!(!t.overflow.is_empty());
        for k in 0..n {
            assert_eq!(t.find(h(k), |r| r == k), Some(k));
        }
        assert_eq!(t.find(h(n), |r| r == n), None);
        t.remove_all(|r| r % 2 == 0);
        assert_eq!(t.len(), (n / 2) as usize);
        assert_eq!(t.find(h(3), |r| r == 3), Some(3));
        assert_eq!(t.find(h(4), |r| r == 4), None);
        for k in (1..n).step_by(2) {
            assert!(t.remove(h(k), k));
        }
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_full_table_of_distinct_tags_stays_in_its_buckets() {
        let mut t = KeyTable::default();
        let h = |k: u32| crate::store::hash(u64::from(k));
        for k in 0..5000 {
            t.insert(h(k), k);
        }
        assert!(t.overflow.is_empty());
        assert!(t.len() * 10 >= t.capacity() * 7, "at least 70% full");
        for k in 0..5000 {
            assert_eq!(t.find(h(k), |r| r == k), Some(k));
        }
    }

    #[test]
    fn growing_keeps_few_buckets_full() {
        // Full buckets make inserts move keys. Sampled every 50 keys on the
        // way to 2,000 keys (through every rebuild), in 100 tables.
        let (mut full, mut buckets) = (0, 0);
        for table in 0..100u64 {
            let mut t = KeyTable::default();
            for k in 0..2000u32 {
                t.insert(crate::store::hash(table << 32 | u64::from(k)), k);
                if k % 50 == 49 {
                    full += t.buckets.iter().filter(|b| b.used == FULL).count();
                    buckets += t.buckets.len();
                }
            }
            assert!(t.overflow.is_empty());
        }
        let share = full as f64 / buckets as f64;
        assert!(share < 0.03, "{:.1}% of buckets full", share * 100.0);
    }

    proptest! {
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec((0u8..5, 0u32..40, 0u32..1000), 1..300)) {
            let mut t = KeyTable::default();
            // key -> record
            let mut model: HashMap<u32, RecId> = HashMap::new();
            for (op, key, rec) in ops {
                // Records are unique per key here: key * 1000 + n.
                let rec = key * 1000 + rec;
                let find = |t: &KeyTable, key: u32| t.find(weak(key), |r| r / 1000 == key);
                match op {
                    0 => if let std::collections::hash_map::Entry::Vacant(e) = model.entry(key) {
                        t.insert(weak(key), rec);
                        e.insert(rec);
                    },
                    1 => {
                        let had = model.remove(&key);
                        prop_assert_eq!(had.is_some(), had.is_some_and(|r| t.remove(weak(key), r)));
                    }
                    2 => if let Some(old) = model.get_mut(&key) {
                        prop_assert!(t.relocate(weak(key), *old, rec));
                        *old = rec;
                    },
                    3 => {
                        t.remove_all(|r| r % 2 == 0);
                        model.retain(|_, r| *r % 2 != 0);
                    }
                    _ => t.shrink(),
                }
                prop_assert_eq!(t.len(), model.len());
                for k in 0..40 {
                    prop_assert_eq!(find(&t, k), model.get(&k).copied());
                }
            }
        }
    }
}
