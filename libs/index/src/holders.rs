//! The holder lists of a page's shared blocks (held by two replicas or
//! more).
//!
//! Lists of two to four holders share a pool of 16-byte slots and lists of
//! five to eight a pool of 32-byte slots, their length kept in the handle:
//! a block two to four replicas share costs its record plus 16 bytes,
//! where a small vector would take 24 (and 24 more on the heap past four).
//! A list that gains or loses a holder stays in its slot until it crosses
//! a pool's bounds; a pool per exact length would strand a slot at every
//! step as sharing grows. Longer lists get their own allocation.

/// A list's handle: a 3-bit tag (the length of a pooled list minus two, or
/// [`LONG`]) and a slot number.
pub(crate) type Handle = u32;

const TAG_SHIFT: u32 = 29;
const SLOT_MASK: u32 = (1 << TAG_SHIFT) - 1;
/// Tag of a list of more than [`EIGHT`] holders.
const LONG: u32 = 7;
const FOUR: usize = 4;
const EIGHT: usize = 8;

fn handle(tag: u32, slot: usize) -> Handle {
    // A page holds far fewer than 2^29 lists.
    tag << TAG_SHIFT | (u32::try_from(slot).unwrap_or(SLOT_MASK) & SLOT_MASK)
}

/// The handle of a pooled list of `len` (2 to 8) holders.
fn pooled(len: usize, slot: usize) -> Handle {
    handle(u32::try_from(len.saturating_sub(2)).unwrap_or(0), slot)
}

/// Where a list is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum At {
    /// In the pool of four, with this many holders, in this slot.
    Four(usize, usize),
    /// In the pool of eight.
    Eight(usize, usize),
    /// A long list.
    Long(usize),
}

impl At {
    /// Whether a list of `len` holders belongs where this one is.
    fn fits(self, len: usize) -> bool {
        match self {
            At::Four(..) => (2..=FOUR).contains(&len),
            At::Eight(..) => (FOUR + 1..=EIGHT).contains(&len),
            At::Long(_) => len > EIGHT,
        }
    }
}

fn at(handle: Handle) -> At {
    let tag = handle >> TAG_SHIFT;
    let slot = (handle & SLOT_MASK) as usize;
    let len = tag as usize + 2;
    match tag {
        LONG => At::Long(slot),
        _ if len <= FOUR => At::Four(len, slot),
        _ => At::Eight(len, slot),
    }
}

/// Slots of one element type, with the freed ones reused first.
#[derive(Debug)]
struct Pool<T> {
    slots: Vec<T>,
    free: Vec<u32>,
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Pool<T> {
    fn put(&mut self, value: T) -> usize {
        match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = value;
                slot as usize
            }
            None => {
                self.slots.push(value);
                self.slots.len() - 1
            }
        }
    }

    fn release(&mut self, slot: usize) {
        if slot < self.slots.len() {
            self.free.push(u32::try_from(slot).unwrap_or(u32::MAX));
        }
    }

    fn heap_bytes(&self) -> usize {
        self.slots.capacity() * size_of::<T>() + self.free.capacity() * size_of::<u32>()
    }
}

/// A page's holder lists.
#[derive(Debug, Default)]
pub(crate) struct HolderLists {
    four: Pool<[u32; FOUR]>,
    eight: Pool<[u32; EIGHT]>,
    long: Pool<Vec<u32>>,
}

/// What is left of a list after [`HolderLists::retain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Left {
    /// No holder: the list is released.
    None,
    /// One holder: the list is released, the holder goes back inline.
    One(u32),
    /// Two or more, under this (possibly new) handle.
    List(Handle),
}

impl HolderLists {
    /// Stores a list of at least two holders. Inlined, as `push`, into the
    /// index's apply: left to the compiler, either moved out of line with
    /// unrelated edits to the crate (+5 % of `apply_locked`'s instructions).
    #[inline]
    pub(crate) fn insert(&mut self, holders: &[u32]) -> Handle {
        let len = holders.len();
        if len <= FOUR {
            let mut slot = [0; FOUR];
            slot[..len].copy_from_slice(holders);
            pooled(len, self.four.put(slot))
        } else if len <= EIGHT {
            let mut slot = [0; EIGHT];
            slot[..len].copy_from_slice(holders);
            pooled(len, self.eight.put(slot))
        } else {
            handle(LONG, self.long.put(holders.to_vec()))
        }
    }

    /// The holders under `handle` (empty for a handle not in use).
    #[inline]
    pub(crate) fn get(&self, handle: Handle) -> &[u32] {
        match at(handle) {
            At::Four(len, slot) => self.four.slots.get(slot).map(|l| &l[..len]),
            At::Eight(len, slot) => self.eight.slots.get(slot).map(|l| &l[..len]),
            At::Long(slot) => self.long.slots.get(slot).map(|l| &l[..]),
        }
        .unwrap_or(&[])
    }

    /// A list of two to four holders as its whole 16-byte slot and its
    /// length (`None` for a longer list): the holders are the slot's first
    /// `len`, the rest of the slot is not theirs.
    #[inline(always)]
    pub(crate) fn four(&self, handle: Handle) -> Option<(&[u32; FOUR], usize)> {
        match at(handle) {
            At::Four(len, slot) => self.four.slots.get(slot).map(|l| (l, len)),
            _ => None,
        }
    }

    /// [`HolderLists::four`] for a list of five to eight holders.
    #[inline(always)]
    pub(crate) fn eight(&self, handle: Handle) -> Option<(&[u32; EIGHT], usize)> {
        match at(handle) {
            At::Eight(len, slot) => self.eight.slots.get(slot).map(|l| (l, len)),
            _ => None,
        }
    }

    /// The holders under `handle`, to overwrite in place.
    pub(crate) fn get_mut(&mut self, handle: Handle) -> &mut [u32] {
        match at(handle) {
            At::Four(len, _) | At::Eight(len, _) => self.pooled_slot(handle).map(|l| &mut l[..len]),
            At::Long(slot) => self.long.slots.get_mut(slot).map(|l| &mut l[..]),
        }
        .unwrap_or(&mut [])
    }

    /// The whole slot (used or not) of a pooled list.
    fn pooled_slot(&mut self, handle: Handle) -> Option<&mut [u32]> {
        match at(handle) {
            At::Four(_, slot) => self.four.slots.get_mut(slot).map(|l| &mut l[..]),
            At::Eight(_, slot) => self.eight.slots.get_mut(slot).map(|l| &mut l[..]),
            At::Long(_) => None,
        }
    }

    /// Adds `holder` to the list; returns the list's handle now.
    #[inline]
    pub(crate) fn push(&mut self, handle: Handle, holder: u32) -> Handle {
        match at(handle) {
            place @ (At::Four(len, slot) | At::Eight(len, slot)) if place.fits(len + 1) => {
                if let Some(l) = self.pooled_slot(handle) {
                    l[len] = holder;
                }
                pooled(len + 1, slot)
            }
            At::Long(slot) => {
                if let Some(l) = self.long.slots.get_mut(slot) {
                    l.push(holder);
                }
                handle
            }
            At::Four(..) | At::Eight(..) => {
                // Full: on to the next pool.
                let mut longer: smallvec::SmallVec<[u32; 9]> = self.get(handle).into();
                longer.push(holder);
                self.release(handle);
                self.insert(&longer)
            }
        }
    }

    /// Keeps the holders for which `keep` is true.
    pub(crate) fn retain(&mut self, handle: Handle, mut keep: impl FnMut(u32) -> bool) -> Left {
        let kept: smallvec::SmallVec<[u32; 8]> = self
            .get(handle)
            .iter()
            .copied()
            .filter(|&h| keep(h))
            .collect();
        let n = kept.len();
        if n < 2 {
            self.release(handle);
            return kept.first().map_or(Left::None, |&h| Left::One(h));
        }
        match at(handle) {
            // Still within its pool's bounds: rewritten in place.
            place @ (At::Four(_, slot) | At::Eight(_, slot)) if place.fits(n) => {
                if let Some(l) = self.pooled_slot(handle) {
                    l[..n].copy_from_slice(&kept);
                }
                Left::List(pooled(n, slot))
            }
            place @ At::Long(slot) if place.fits(n) => {
                if let Some(l) = self.long.slots.get_mut(slot) {
                    l.clear();
                    l.extend_from_slice(&kept);
                    // A list most of whose holders left gives the room back.
                    if l.capacity() > 2 * n {
                        l.shrink_to_fit();
                    }
                }
                Left::List(handle)
            }
            _ => {
                // Down to a smaller pool.
                self.release(handle);
                Left::List(self.insert(&kept))
            }
        }
    }

    /// Gives the list's slot back (a long list frees its allocation).
    pub(crate) fn release(&mut self, handle: Handle) {
        match at(handle) {
            At::Four(_, slot) => self.four.release(slot),
            At::Eight(_, slot) => self.eight.release(slot),
            At::Long(slot) => {
                if let Some(l) = self.long.slots.get_mut(slot) {
                    *l = Vec::new();
                    self.long.release(slot);
                }
            }
        }
    }

    /// Bytes held on the heap: the pools and the long lists' allocations.
    pub(crate) fn heap_bytes(&self) -> usize {
        let long: usize = self
            .long
            .slots
            .iter()
            .map(|l| l.capacity() * size_of::<u32>())
            .sum();
        self.four.heap_bytes() + self.eight.heap_bytes() + self.long.heap_bytes() + long
    }

    /// Lists in use.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        fn used<T>(p: &Pool<T>) -> usize {
            p.slots.len() - p.free.len()
        }
        used(&self.four) + used(&self.eight) + used(&self.long)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_stay_in_their_slot_within_a_pool_and_move_across_pools() {
        let mut lists = HolderLists::default();
        let mut h = lists.insert(&[1, 2]);
        let mut places = vec![at(h)];
        for next in 3..=12 {
            h = lists.push(h, next);
            places.push(at(h));
            assert_eq!(lists.in_use(), 1);
        }
        use At::{Eight, Four, Long};
        assert_eq!(
            places,
            [
                Four(2, 0),
                Four(3, 0),
                Four(4, 0),
                Eight(5, 0),
                Eight(6, 0),
                Eight(7, 0),
                Eight(8, 0),
                Long(0),
                Long(0),
                Long(0),
                Long(0)
            ]
        );
        assert_eq!(lists.get(h), (1..=12).collect::<Vec<_>>());
        for next in 13..=40 {
            assert_eq!(lists.push(h, next), h, "long lists grow in place");
        }
        assert_eq!(lists.retain(h, |x| x <= 10), Left::List(h));
        assert!(lists.long.slots[0].capacity() <= 20, "room given back");
        let Left::List(h) = lists.retain(h, |x| x <= 6) else {
            panic!("six are left")
        };
        assert_eq!(at(h), Eight(6, 0));
        let Left::List(h) = lists.retain(h, |x| x % 2 == 1) else {
            panic!("three are left")
        };
        assert_eq!((at(h), lists.get(h)), (Four(3, 0), &[1, 3, 5][..]));
        lists.get_mut(h)[1] = 7;
        let Left::List(h) = lists.retain(h, |x| x != 5) else {
            panic!("two are left")
        };
        assert_eq!(lists.get(h), [1, 7]);
        assert_eq!(lists.retain(h, |x| x == 7), Left::One(7));
        assert_eq!(lists.in_use(), 0);
        let h = lists.insert(&[8, 9]);
        assert_eq!(lists.retain(h, |_| false), Left::None);
        assert_eq!(lists.in_use(), 0);
    }

    #[test]
    fn released_slots_are_reused() {
        let mut lists = HolderLists::default();
        let a = lists.insert(&[1, 2, 3]);
        let b = lists.insert(&[3, 4]);
        lists.release(a);
        let c = lists.insert(&[5, 6]);
        assert_eq!((at(a), at(c)), (At::Four(3, 0), At::Four(2, 0)));
        assert_eq!((lists.get(b), lists.get(c)), (&[3, 4][..], &[5, 6][..]));
        assert!(lists.get(handle(LONG, 9)).is_empty(), "unknown handle");
    }

    #[test]
    fn heap_bytes_count_pools_and_long_lists() {
        let mut lists = HolderLists::default();
        assert_eq!(lists.heap_bytes(), 0);
        lists.insert(&[1, 2]);
        lists.insert(&[1, 2, 3, 4, 5]);
        lists.insert(&(0..9).collect::<Vec<_>>());
        let pools = lists.four.slots.capacity() * 16
            + lists.eight.slots.capacity() * 32
            + lists.long.slots.capacity() * 24;
        assert_eq!(lists.heap_bytes(), pools + 9 * 4);
    }
}
