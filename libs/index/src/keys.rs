//! Block key → record id: a linear-probing table of 8-byte slots holding
//! the low 32 bits of the key's hash (the tag) and the record id. Keys
//! themselves live in the records, so callers confirm a tag match by
//! reading the record; homes and back-shifts need only the tag.

use crate::arena::RecId;

/// `rec` of an empty slot (the id of the very last record of the very last
/// page, which the store never hands out).
pub(crate) const NO_REC: RecId = RecId::MAX;

const MAX_LOAD_NUM: usize = 7;
const MAX_LOAD_DEN: usize = 8;
const MIN_CAPACITY: usize = 16;

#[derive(Clone, Copy, Debug)]
struct KeySlot {
    tag: u32,
    rec: RecId,
}

const VACANT: KeySlot = KeySlot {
    tag: 0,
    rec: NO_REC,
};

/// The table.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    slots: Vec<KeySlot>,
    len: usize,
}

/// The tag of a hash.
fn tag(h: u64) -> u32 {
    // The low half: the table's home bits come from it.
    #[allow(clippy::cast_possible_truncation)]
    let t = h as u32;
    t
}

impl KeyTable {
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    fn home(&self, tag: u32) -> usize {
        (tag as usize) & self.mask()
    }

    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Reads the first slot hash `h` would probe, so its cache line is on
    /// its way before [`KeyTable::find`] needs it; pass the value to
    /// `std::hint::black_box`.
    pub(crate) fn touch(&self, h: u64) -> u32 {
        self.slots.get(self.home(tag(h))).map_or(0, |s| s.rec)
    }

    /// The first slot of hash `h`'s run that `wanted` accepts.
    fn probe(&self, h: u64, mut wanted: impl FnMut(KeySlot) -> bool) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(tag(h));
        loop {
            let s = self.slots[i];
            if s.rec == NO_REC {
                return None;
            }
            if wanted(s) {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
    }

    /// The record with hash `h` that `is_it` confirms.
    pub(crate) fn find(&self, h: u64, mut is_it: impl FnMut(RecId) -> bool) -> Option<RecId> {
        let t = tag(h);
        self.probe(h, |s| s.tag == t && is_it(s.rec))
            .map(|i| self.slots[i].rec)
    }

    /// Adds `rec` under hash `h` (the caller knows its key is absent).
    pub(crate) fn insert(&mut self, h: u64, rec: RecId) {
        if (self.len + 1) * MAX_LOAD_DEN > self.slots.len() * MAX_LOAD_NUM {
            self.rebuild((self.slots.len() * 2).max(MIN_CAPACITY));
        }
        let t = tag(h);
        let mask = self.mask();
        let mut i = self.home(t);
        while self.slots[i].rec != NO_REC {
            i = (i + 1) & mask;
        }
        self.slots[i] = KeySlot { tag: t, rec };
        self.len += 1;
    }

    fn position(&self, h: u64, rec: RecId) -> Option<usize> {
        self.probe(h, |s| s.rec == rec)
    }

    /// Points the entry of `old` (hash `h`) at `new`; false if absent.
    pub(crate) fn relocate(&mut self, h: u64, old: RecId, new: RecId) -> bool {
        match self.position(h, old) {
            Some(i) => {
                self.slots[i].rec = new;
                true
            }
            None => false,
        }
    }

    /// Removes the entry of `rec` (hash `h`); false if absent.
    pub(crate) fn remove(&mut self, h: u64, rec: RecId) -> bool {
        match self.position(h, rec) {
            Some(i) => {
                self.remove_at(i);
                true
            }
            None => false,
        }
    }

    /// Removes every entry whose record `dead` names, in one sweep over
    /// the table (cheaper than a probe each when they are many).
    pub(crate) fn remove_all(&mut self, dead: impl Fn(RecId) -> bool) {
        let n = self.slots.len();
        // Start just after an empty slot so no run wraps past the start:
        // back-shifts then only ever move unvisited slots into the cursor.
        let Some(start) = self.slots.iter().position(|s| s.rec == NO_REC) else {
            return;
        };
        let mask = self.mask();
        let mut visited = 0;
        let mut i = (start + 1) & mask;
        while visited < n {
            let rec = self.slots[i].rec;
            if rec != NO_REC && dead(rec) {
                self.remove_at(i);
                // A later slot may have moved into `i`: look again.
                continue;
            }
            visited += 1;
            i = (i + 1) & mask;
        }
    }

    /// Empties slot `i`, shifting later members of its run back.
    fn remove_at(&mut self, i: usize) {
        let mask = self.mask();
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.rec == NO_REC {
                break;
            }
            let home = self.home(s.tag);
            // Move `s` into the hole unless its home lies cyclically in
            // (hole, j] (then it is already as close as it may be).
            let stays = if hole <= j {
                hole < home && home <= j
            } else {
                hole < home || home <= j
            };
            if !stays {
                self.slots[hole] = s;
                hole = j;
            }
        }
        self.slots[hole] = VACANT;
        self.len -= 1;
    }

    /// Gives memory back when the table is mostly empty.
    pub(crate) fn shrink(&mut self) {
        if self.len == 0 {
            self.slots = Vec::new();
            return;
        }
        if self.slots.len() > MIN_CAPACITY
            && self.len * MAX_LOAD_DEN * 4 < self.slots.len() * MAX_LOAD_NUM
        {
            let capacity = (self.len * MAX_LOAD_DEN / MAX_LOAD_NUM * 2)
                .next_power_of_two()
                .max(MIN_CAPACITY);
            self.rebuild(capacity);
        }
    }

    fn rebuild(&mut self, capacity: usize) {
        let old = std::mem::replace(&mut self.slots, vec![VACANT; capacity]);
        let mask = capacity - 1;
        for s in old.into_iter().filter(|s| s.rec != NO_REC) {
            let mut i = (s.tag as usize) & mask;
            while self.slots[i].rec != NO_REC {
                i = (i + 1) & mask;
            }
            self.slots[i] = s;
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
        u64::from(key % 7)
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
