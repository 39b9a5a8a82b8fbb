//! One shard's storage: a compact open-addressing table of blocks, each
//! with its holders packed into 32 bits, spilling to a side list only when
//! several replicas hold the same block.
//!
//! A slot is 16 bytes (key, depth, one holder or a spill index), so a block
//! held by one replica costs one slot and a block held by `n` costs one
//! slot plus a list shared by the `n`.

use smallvec::SmallVec;

use crate::slots::{Probe, Slot, SlotTable};

use crate::types::Tier;

/// Bits of a packed holder.
const REPLICA_BITS: u32 = 21;
const TIER_BIT: u32 = 1 << REPLICA_BITS;
const EPOCH_SHIFT: u32 = REPLICA_BITS + 1;
/// Most replica slots a packed holder can name.
pub(crate) const MAX_REPLICAS: u32 = 1 << REPLICA_BITS;
/// Number of distinct store epochs (the eviction clock wraps at this).
pub(crate) const EPOCHS: u32 = 1 << (32 - EPOCH_SHIFT);

/// Marks `Slot::meta` as pointing into the spill lists.
const SPILLED: u32 = 1 << 31;
/// Depths are stored in the remaining bits (all ones is the empty slot).
pub(crate) const MAX_DEPTH: u32 = SPILLED - 2;

/// A holder: replica slot, tier and the epoch it was (re)stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Holder(u32);

impl Holder {
    pub(crate) fn new(replica: u32, tier: Tier, epoch: u32) -> Self {
        let tier_bit = if tier == Tier::T2 { TIER_BIT } else { 0 };
        Self((replica & (MAX_REPLICAS - 1)) | tier_bit | ((epoch % EPOCHS) << EPOCH_SHIFT))
    }
    pub(crate) fn from_raw(raw: u32) -> Self {
        Self(raw)
    }
    pub(crate) fn replica(self) -> u32 {
        self.0 & (MAX_REPLICAS - 1)
    }
    pub(crate) fn tier(self) -> Tier {
        if self.0 & TIER_BIT == 0 {
            Tier::T1
        } else {
            Tier::T2
        }
    }
    pub(crate) fn epoch(self) -> u32 {
        self.0 >> EPOCH_SHIFT
    }
}

fn depth_of(slot: &Slot) -> u32 {
    slot.meta & !SPILLED
}

fn spilled(slot: &Slot) -> bool {
    slot.meta & SPILLED != 0
}

/// A slot's metadata and holder word, as [`Shard::find`] copies them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Found(u32, u32);

/// What storing a holder did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// A new (replica, block) entry.
    Added,
    /// The replica already held the block; this was its previous holder.
    Refreshed(Holder),
}

/// Four inline holders cost no more than three (the heap form is as big).
type HolderList = SmallVec<[u32; 4]>;

/// One shard.
#[derive(Debug, Default)]
pub(crate) struct Shard {
    table: SlotTable,
    spill: Vec<HolderList>,
    free_spill: Vec<u32>,
}

/// Spreads a key over the table (fingerprints are random already, but test
/// and synthetic ones are not).
pub(crate) fn hash(key: u64) -> u64 {
    let x = (key ^ (key >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ (x >> 29)
}

impl Shard {
    /// Starts loading the slot a key with hash `h` lives near.
    pub(crate) fn touch(&self, h: u64) -> u64 {
        self.table.touch(h)
    }

    /// The block's depth and holders.
    pub(crate) fn get(&self, h: u64, key: u64) -> Option<(u32, &[u32])> {
        match self.table.probe(h, key) {
            Probe::Found(i) => {
                let slot = self.table.get(i);
                let holders = if spilled(slot) {
                    self.spill
                        .get(slot.payload as usize)
                        .map_or(&[][..], |l| l.as_slice())
                } else {
                    std::slice::from_ref(&slot.payload)
                };
                Some((depth_of(slot), holders))
            }
            Probe::Vacant(_) => None,
        }
    }

    /// The block's slot, copied out (one table probe, no spill access), for
    /// lookups that probe many blocks before reading any holder list.
    pub(crate) fn find(&self, h: u64, key: u64) -> Option<Found> {
        match self.table.probe(h, key) {
            Probe::Found(i) => {
                let slot = self.table.get(i);
                Some(Found(slot.meta, slot.payload))
            }
            Probe::Vacant(_) => None,
        }
    }

    /// Starts loading the spill list a found slot points to.
    pub(crate) fn touch_holders(&self, found: &Found) -> u64 {
        if found.0 & SPILLED != 0 {
            self.spill
                .get(found.1 as usize)
                .map_or(0, |l| u64::from(l.len() as u32))
        } else {
            0
        }
    }

    /// The holders of a block found by [`Shard::find`].
    pub(crate) fn holders<'a>(&'a self, found: &'a Found) -> &'a [u32] {
        if found.0 & SPILLED != 0 {
            self.spill
                .get(found.1 as usize)
                .map_or(&[], |l| l.as_slice())
        } else {
            std::slice::from_ref(&found.1)
        }
    }

    fn new_spill(&mut self, list: HolderList) -> u32 {
        match self.free_spill.pop() {
            Some(i) => {
                self.spill[i as usize] = list;
                i
            }
            None => {
                self.spill.push(list);
                u32::try_from(self.spill.len() - 1).unwrap_or(u32::MAX)
            }
        }
    }

    /// Records `holder` for the block; `Err(known_depth)` when the block is
    /// already held at another depth (nothing changes then).
    pub(crate) fn store(
        &mut self,
        h: u64,
        key: u64,
        depth: u32,
        holder: Holder,
    ) -> Result<Stored, u32> {
        let depth = depth.min(MAX_DEPTH);
        self.table.reserve_one(hash);
        let i = match self.table.probe(h, key) {
            Probe::Vacant(i) => {
                self.table.fill(
                    i,
                    Slot {
                        key,
                        meta: depth,
                        payload: holder.0,
                    },
                );
                return Ok(Stored::Added);
            }
            Probe::Found(i) => i,
        };
        let slot = *self.table.get(i);
        if depth_of(&slot) != depth {
            return Err(depth_of(&slot));
        }
        let replica = holder.replica();
        if !spilled(&slot) {
            let current = Holder(slot.payload);
            if current.replica() == replica {
                self.table.get_mut(i).payload = holder.0;
                return Ok(Stored::Refreshed(current));
            }
            // A second holder: move both to a spill list.
            let index = self.new_spill(SmallVec::from_slice(&[current.0, holder.0]));
            let slot = self.table.get_mut(i);
            slot.meta |= SPILLED;
            slot.payload = index;
            return Ok(Stored::Added);
        }
        let list = &mut self.spill[slot.payload as usize];
        match list.iter_mut().find(|x| Holder(**x).replica() == replica) {
            Some(x) => {
                let previous = Holder(*x);
                *x = holder.0;
                Ok(Stored::Refreshed(previous))
            }
            None => {
                list.push(holder.0);
                Ok(Stored::Added)
            }
        }
    }

    /// Removes `replica` as holder of the block (only at `tier`, if given);
    /// returns the removed holder.
    pub(crate) fn remove(
        &mut self,
        h: u64,
        key: u64,
        replica: u32,
        tier: Option<Tier>,
    ) -> Option<Holder> {
        let wanted = |x: Holder| x.replica() == replica && tier.is_none_or(|t| x.tier() == t);
        let Probe::Found(i) = self.table.probe(h, key) else {
            return None;
        };
        let slot = *self.table.get(i);
        if !spilled(&slot) {
            let current = Holder(slot.payload);
            if !wanted(current) {
                return None;
            }
            self.table.remove_at(i, hash);
            return Some(current);
        }
        let list = &mut self.spill[slot.payload as usize];
        let pos = list.iter().position(|x| wanted(Holder(*x)))?;
        let removed = Holder(list.remove(pos));
        if list.len() == 1 {
            // Back to a single inline holder.
            let last = list[0];
            list.clear();
            list.shrink_to_fit();
            self.free_spill.push(slot.payload);
            let slot = self.table.get_mut(i);
            slot.meta &= !SPILLED;
            slot.payload = last;
        }
        Some(removed)
    }

    /// Removes every holder for which `drop` is true, reporting each.
    pub(crate) fn remove_where(
        &mut self,
        mut drop: impl FnMut(Holder) -> bool,
        mut removed: impl FnMut(Holder),
    ) {
        let spill = &mut self.spill;
        let free_spill = &mut self.free_spill;
        self.table.retain(
            |slot| {
                if !spilled(slot) {
                    let h = Holder(slot.payload);
                    if drop(h) {
                        removed(h);
                        return false;
                    }
                    return true;
                }
                let list = &mut spill[slot.payload as usize];
                list.retain(|x| {
                    let h = Holder(*x);
                    let gone = drop(h);
                    if gone {
                        removed(h);
                    }
                    !gone
                });
                match list.len() {
                    0 | 1 => {
                        let last = list.first().copied();
                        list.clear();
                        list.shrink_to_fit();
                        free_spill.push(slot.payload);
                        match last {
                            Some(x) => {
                                slot.meta &= !SPILLED;
                                slot.payload = x;
                                true
                            }
                            None => false,
                        }
                    }
                    _ => true,
                }
            },
            hash,
        );
        if self.table.len() == 0 {
            // Give memory back once a shard empties (e.g. after a drain).
            self.spill = Vec::new();
            self.free_spill = Vec::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(
        s: &mut Shard,
        key: u64,
        depth: u32,
        r: u32,
        tier: Tier,
        epoch: u32,
    ) -> Result<Stored, u32> {
        s.store(hash(key), key, depth, Holder::new(r, tier, epoch))
    }

    fn replicas(s: &Shard, key: u64) -> Vec<u32> {
        let mut v: Vec<u32> = s
            .get(hash(key), key)
            .map(|(_, hs)| hs.iter().map(|h| Holder(*h).replica()).collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    #[test]
    fn holder_packing_round_trips() {
        let h = Holder::new(MAX_REPLICAS - 1, Tier::T2, EPOCHS - 1);
        assert_eq!(
            (h.replica(), h.tier(), h.epoch()),
            (MAX_REPLICAS - 1, Tier::T2, EPOCHS - 1)
        );
        let h = Holder::new(7, Tier::T1, EPOCHS + 3);
        assert_eq!((h.replica(), h.tier(), h.epoch()), (7, Tier::T1, 3));
    }

    #[test]
    fn spills_and_unspills() {
        let mut s = Shard::default();
        assert_eq!(store(&mut s, 1, 0, 1, Tier::T1, 0), Ok(Stored::Added));
        assert_eq!(store(&mut s, 1, 0, 2, Tier::T1, 0), Ok(Stored::Added));
        assert_eq!(store(&mut s, 1, 0, 3, Tier::T2, 0), Ok(Stored::Added));
        assert!(matches!(
            store(&mut s, 1, 0, 2, Tier::T2, 5),
            Ok(Stored::Refreshed(h)) if h.tier() == Tier::T1 && h.epoch() == 0
        ));
        assert_eq!(store(&mut s, 1, 4, 9, Tier::T1, 0), Err(0));
        assert_eq!(replicas(&s, 1), [1, 2, 3]);
        assert_eq!(
            s.remove(hash(1), 1, 2, Some(Tier::T1)),
            None,
            "held at T2 now"
        );
        assert!(s.remove(hash(1), 1, 2, None).is_some());
        assert!(s.remove(hash(1), 1, 1, None).is_some());
        assert_eq!(replicas(&s, 1), [3]);
        assert_eq!(s.free_spill.len(), 1, "the list was released");
        assert!(s.remove(hash(1), 1, 3, None).is_some());
        assert_eq!(s.get(hash(1), 1), None);
    }

    #[test]
    fn remove_where_reports_every_removed_holder() {
        let mut s = Shard::default();
        for key in 0..100u64 {
            for r in 0..(key % 4) + 1 {
                store(
                    &mut s,
                    key,
                    0,
                    u32::try_from(r).unwrap(),
                    Tier::T1,
                    u32::try_from(key % 3).unwrap(),
                )
                .unwrap();
            }
        }
        let mut removed = 0;
        s.remove_where(|h| h.epoch() == 0, |_| removed += 1);
        let left: usize = (0..100u64).map(|k| replicas(&s, k).len()).sum();
        let total: usize = (0..100u64).map(|k| (k % 4 + 1) as usize).sum();
        assert_eq!(left + removed, total);
        assert!(
            (0..100u64)
                .filter(|k| k % 3 == 0)
                .all(|k| replicas(&s, k).is_empty())
        );
        s.remove_where(|_| true, |_| {});
        assert!(s.table.len() == 0 && s.spill.is_empty());
    }
}
