//! A linear-probing hash table of 16-byte slots: key, metadata and payload
//! in one cache line, so a probe costs one memory access, and callers can
//! touch a slot's line ahead of probing it ([`SlotTable::touch`]) to have
//! many blocks' misses in flight at once — the lookup's main cost at scale.
//!
//! Deletion shifts the following run back (no tombstones), so probe runs
//! stay as short as the load factor allows.

/// `meta` of an empty slot (never a live value: depths stop below it).
pub(crate) const EMPTY: u32 = u32::MAX;

/// Grow beyond 13/16 full.
const MAX_LOAD_NUM: usize = 13;
const MAX_LOAD_DEN: usize = 16;
/// Smallest non-empty table.
const MIN_CAPACITY: usize = 16;

/// One slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub(crate) key: u64,
    pub(crate) meta: u32,
    pub(crate) payload: u32,
}

const VACANT: Slot = Slot {
    key: 0,
    meta: EMPTY,
    payload: 0,
};

/// The table. `hash` must be the same function of the key on every call.
#[derive(Debug, Default)]
pub(crate) struct SlotTable {
    slots: Vec<Slot>,
    len: usize,
}

/// Where a key is, or where it would go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The key's slot.
    Found(usize),
    /// The empty slot it would take.
    Vacant(usize),
}

impl SlotTable {
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// Home position of a hash (its low bits).
    fn home(&self, h: u64) -> usize {
        // Masked to the table size: the truncation is the point.
        #[allow(clippy::cast_possible_truncation)]
        let low = h as usize;
        low & self.mask()
    }

    /// Live slots.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Reads the first slot a key with hash `h` would probe, so its cache
    /// line is on its way before [`SlotTable::probe`] needs it. The value
    /// means nothing; pass it to `std::hint::black_box`.
    pub(crate) fn touch(&self, h: u64) -> u64 {
        self.slots.get(self.home(h)).map_or(0, |s| s.key)
    }

    /// Finds `key`.
    pub(crate) fn probe(&self, h: u64, key: u64) -> Probe {
        if self.slots.is_empty() {
            return Probe::Vacant(0);
        }
        let mask = self.mask();
        let mut i = self.home(h);
        loop {
            let s = &self.slots[i];
            if s.meta == EMPTY {
                return Probe::Vacant(i);
            }
            if s.key == key {
                return Probe::Found(i);
            }
            i = (i + 1) & mask;
        }
    }

    pub(crate) fn get(&self, i: usize) -> &Slot {
        &self.slots[i]
    }

    pub(crate) fn get_mut(&mut self, i: usize) -> &mut Slot {
        &mut self.slots[i]
    }

    /// Makes room for one more slot (call before `probe` for an insert:
    /// growing moves every slot).
    pub(crate) fn reserve_one(&mut self, hash: impl Fn(u64) -> u64) {
        if (self.len + 1) * MAX_LOAD_DEN > self.slots.len() * MAX_LOAD_NUM {
            let capacity = (self.slots.len() * 2).max(MIN_CAPACITY);
            self.rebuild(capacity, hash);
        }
    }

    /// Fills the vacant slot `i` (from a `probe` after `reserve_one`).
    pub(crate) fn fill(&mut self, i: usize, slot: Slot) {
        debug_assert_eq!(self.slots[i].meta, EMPTY);
        self.slots[i] = slot;
        self.len += 1;
    }

    fn rebuild(&mut self, capacity: usize, hash: impl Fn(u64) -> u64) {
        let old = std::mem::replace(&mut self.slots, vec![VACANT; capacity]);
        let mask = capacity - 1;
        for s in old.into_iter().filter(|s| s.meta != EMPTY) {
            // Masked to the table size.
            #[allow(clippy::cast_possible_truncation)]
            let mut i = (hash(s.key) as usize) & mask;
            while self.slots[i].meta != EMPTY {
                i = (i + 1) & mask;
            }
            self.slots[i] = s;
        }
    }

    /// Removes slot `i`, shifting later members of its run back.
    pub(crate) fn remove_at(&mut self, i: usize, hash: impl Fn(u64) -> u64) {
        let mask = self.mask();
        let mut hole = i;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.slots[j];
            if s.meta == EMPTY {
                break;
            }
            let home = self.home(hash(s.key));
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

    /// Visits every live slot; those for which `keep` returns false are
    /// removed. `keep` may modify the slot it keeps.
    pub(crate) fn retain(
        &mut self,
        mut keep: impl FnMut(&mut Slot) -> bool,
        hash: impl Fn(u64) -> u64,
    ) {
        let n = self.slots.len();
        if n == 0 {
            return;
        }
        // Start just after an empty slot so no run wraps past the start:
        // back-shifts then only ever move unvisited slots into the cursor.
        let Some(start) = self.slots.iter().position(|s| s.meta == EMPTY) else {
            return;
        };
        let mask = self.mask();
        let mut visited = 0;
        let mut i = (start + 1) & mask;
        while visited < n {
            if self.slots[i].meta != EMPTY && !keep(&mut self.slots[i]) {
                self.remove_at(i, &hash);
                // A later slot may have moved into `i`: look again.
                continue;
            }
            visited += 1;
            i = (i + 1) & mask;
        }
        if self.len * MAX_LOAD_DEN * 4 < self.slots.len() * MAX_LOAD_NUM
            && self.slots.len() > MIN_CAPACITY
        {
            // Mostly empty after a purge: give memory back.
            let capacity = (self.len * MAX_LOAD_DEN / MAX_LOAD_NUM * 2)
                .next_power_of_two()
                .max(MIN_CAPACITY);
            if self.len == 0 {
                self.slots = Vec::new();
            } else {
                self.rebuild(capacity, hash);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    /// A deliberately weak hash so runs collide and wrap.
    fn weak(key: u64) -> u64 {
        key % 7
    }

    fn insert(t: &mut SlotTable, key: u64, payload: u32) {
        t.reserve_one(weak);
        match t.probe(weak(key), key) {
            Probe::Found(i) => t.get_mut(i).payload = payload,
            Probe::Vacant(i) => t.fill(
                i,
                Slot {
                    key,
                    meta: 0,
                    payload,
                },
            ),
        }
    }

    fn lookup(t: &SlotTable, key: u64) -> Option<u32> {
        match t.probe(weak(key), key) {
            Probe::Found(i) => Some(t.get(i).payload),
            Probe::Vacant(_) => None,
        }
    }

    proptest! {
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec((0u8..3, 0u64..40, any::<u32>()), 1..300)) {
            let mut t = SlotTable::default();
            let mut model: HashMap<u64, u32> = HashMap::new();
            for (op, key, value) in ops {
                match op {
                    0 => {
                        insert(&mut t, key, value);
                        model.insert(key, value);
                    }
                    1 => {
                        if let Probe::Found(i) = t.probe(weak(key), key) {
                            t.remove_at(i, weak);
                        }
                        model.remove(&key);
                    }
                    _ => {
                        // Drop keys whose payload is odd.
                        t.retain(|s| s.payload % 2 == 0, weak);
                        model.retain(|_, v| *v % 2 == 0);
                    }
                }
                prop_assert_eq!(t.len(), model.len());
                for k in 0..40 {
                    prop_assert_eq!(lookup(&t, k), model.get(&k).copied());
                }
            }
        }
    }
}
