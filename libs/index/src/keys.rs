//! Block key → record id: cuckoo tables of cache-line buckets, each holding
//! ten slots of a 16-bit tag (the top bits of the key's hash) and a record
//! id. Keys themselves live in the records, so callers confirm a tag match
//! by reading the record.
//!
//! A key may sit in either of two buckets, both derived from its tag: a
//! search reads at most those two cache lines (whose loads overlap), an
//! insert takes a free slot in the emptier one (moving a resident to its
//! other bucket when both are full), and a removal just empties the slot.
//! With two choices of ten slots the tables run 70–90% full, so a key costs
//! about 7–9 bytes of table.
//!
//! Because buckets come from the tag alone (scaled to the table's size),
//! growing and shrinking never read a record. The price is that a table
//! tells apart at most 2^16 tags: the store keeps many small tables (a few
//! thousand keys each, see [`crate::store`]), where two keys sharing a tag
//! are rare and cost one extra record read. Keys that cannot be placed in
//! their buckets (only when very many share a tag) wait in a small
//! overflow list that searches also read.

use crate::arena::RecId;

/// `rec` of an empty slot (the id of the very last record of the very last
/// page, which the store never hands out).
pub(crate) const NO_REC: RecId = RecId::MAX;

const MAX_LOAD_NUM: usize = 9;
const MAX_LOAD_DEN: usize = 10;
/// Slots per bucket: ten 6-byte slots fill a 64-byte line.
const BUCKET_SLOTS: usize = 10;
const MIN_BUCKETS: usize = 2;
/// Residents moved, at most, to make room for one insert.
const MAX_KICKS: usize = 32;

/// Tag and record id, as 16-bit halves so that a slot is 6 bytes.
#[derive(Clone, Copy, Debug)]
struct KeySlot {
    tag: u16,
    rec: [u16; 2],
}

impl KeySlot {
    fn new(tag: u16, rec: RecId) -> Self {
        // Split into halves; each fits 16 bits by construction.
        #[allow(clippy::cast_possible_truncation)]
        let rec = [rec as u16, (rec >> 16) as u16];
        Self { tag, rec }
    }

    fn rec(self) -> RecId {
        RecId::from(self.rec[0]) | (RecId::from(self.rec[1]) << 16)
    }

    fn vacant(self) -> bool {
        self.rec == VACANT.rec
    }
}

#[allow(clippy::cast_possible_truncation)]
const VACANT: KeySlot = KeySlot {
    tag: 0,
    rec: [NO_REC as u16, (NO_REC >> 16) as u16],
};

/// One cache line of slots.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Bucket {
    slots: [KeySlot; BUCKET_SLOTS],
}

const EMPTY: Bucket = Bucket {
    slots: [VACANT; BUCKET_SLOTS],
};

impl Bucket {
    fn free(&self) -> Option<usize> {
        self.slots.iter().position(|s| s.vacant())
    }

    fn used(&self) -> usize {
        self.slots.iter().filter(|s| !s.vacant()).count()
    }
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
        [(tag as usize * n) >> 16, (other(tag) as usize * n) >> 16]
    }

    fn capacity(&self) -> usize {
        self.buckets.len() * BUCKET_SLOTS
    }

    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Reads both buckets of hash `h`, so their cache lines are on their
    /// way before [`KeyTable::find`] needs them; pass the value to
    /// `std::hint::black_box`.
    pub(crate) fn touch(&self, h: u64) -> u32 {
        if self.buckets.is_empty() {
            return 0;
        }
        let [a, b] = self.buckets_of(tag(h));
        u32::from(self.buckets[a].slots[0].tag) ^ u32::from(self.buckets[b].slots[0].tag)
    }

    /// The first slot of hash `h` that `wanted` accepts.
    fn probe(&self, h: u64, mut wanted: impl FnMut(KeySlot) -> bool) -> Option<At> {
        if self.buckets.is_empty() {
            return None;
        }
        let t = tag(h);
        let [a, b] = self.buckets_of(t);
        for bucket in [a, b] {
            for (slot, s) in self.buckets[bucket].slots.iter().enumerate() {
                if s.tag == t && !s.vacant() && wanted(*s) {
                    return Some(At::Slot(bucket, slot));
                }
            }
        }
        self.overflow
            .iter()
            .position(|s| s.tag == t && wanted(*s))
            .map(At::Overflow)
    }

    fn get(&self, at: At) -> KeySlot {
        match at {
            At::Slot(b, s) => self.buckets[b].slots[s],
            At::Overflow(i) => self.overflow[i],
        }
    }

    fn set(&mut self, at: At, slot: KeySlot) {
        match at {
            At::Slot(b, s) => self.buckets[b].slots[s] = slot,
            At::Overflow(i) => self.overflow[i] = slot,
        }
    }

    /// The record with hash `h` that `is_it` confirms.
    pub(crate) fn find(&self, h: u64, mut is_it: impl FnMut(RecId) -> bool) -> Option<RecId> {
        self.probe(h, |s| is_it(s.rec()))
            .map(|at| self.get(at).rec())
    }

    /// Adds `rec` under hash `h` (the caller knows its key is absent).
    pub(crate) fn insert(&mut self, h: u64, rec: RecId) {
        if (self.len + 1) * MAX_LOAD_DEN > self.capacity() * MAX_LOAD_NUM {
            self.rebuild(buckets_for(self.len + 1));
        }
        self.place(KeySlot::new(tag(h), rec));
        self.len += 1;
    }

    /// Puts `slot` in the emptier of its buckets; when both are full, moves
    /// residents to their other buckets to make room, and failing that adds
    /// it to the overflow list.
    fn place(&mut self, mut slot: KeySlot) {
        let [a, b] = self.buckets_of(slot.tag);
        let target = if self.buckets[b].used() < self.buckets[a].used() {
            b
        } else {
            a
        };
        if let Some(free) = self.buckets[target].free() {
            self.buckets[target].slots[free] = slot;
            return;
        }
        // Both full: evict a resident to its other bucket, and so on.
        let mut bucket = target;
        for kick in 0..MAX_KICKS {
            // Vary the victim so that chains do not cycle.
            let victim = (usize::from(slot.tag) + kick) % BUCKET_SLOTS;
            std::mem::swap(&mut slot, &mut self.buckets[bucket].slots[victim]);
            let [x, y] = self.buckets_of(slot.tag);
            bucket = if x == bucket { y } else { x };
            if let Some(free) = self.buckets[bucket].free() {
                self.buckets[bucket].slots[free] = slot;
                return;
            }
        }
        self.overflow.push(slot);
    }

    fn position(&self, h: u64, rec: RecId) -> Option<At> {
        self.probe(h, |s| s.rec() == rec)
    }

    /// Points the entry of `old` (hash `h`) at `new`; false if absent.
    pub(crate) fn relocate(&mut self, h: u64, old: RecId, new: RecId) -> bool {
        match self.position(h, old) {
            Some(at) => {
                self.set(at, KeySlot::new(tag(h), new));
                true
            }
            None => false,
        }
    }

    /// Removes the entry of `rec` (hash `h`); false if absent.
    pub(crate) fn remove(&mut self, h: u64, rec: RecId) -> bool {
        match self.position(h, rec) {
            Some(At::Slot(b, s)) => self.buckets[b].slots[s] = VACANT,
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
            for s in &mut bucket.slots {
                if !s.vacant() && dead(s.rec()) {
                    *s = VACANT;
                    removed += 1;
                }
            }
        }
        let before = self.overflow.len();
        self.overflow.retain(|s| !dead(s.rec()));
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
            && self.len * MAX_LOAD_DEN * 4 < self.capacity() * MAX_LOAD_NUM
        {
            self.rebuild(buckets_for(self.len));
        }
    }

    fn rebuild(&mut self, buckets: usize) {
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; buckets]);
        let overflow = std::mem::take(&mut self.overflow);
        for s in old.iter().flat_map(|b| b.slots).chain(overflow) {
            if !s.vacant() {
                self.place(s);
            }
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
        assert_eq!(std::mem::size_of::<KeySlot>(), 6);
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
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
