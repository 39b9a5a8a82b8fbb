//! The holder lists of a page's shared blocks (held by two replicas or
//! more), sized by their exact length.
//!
//! Lists of two, three and four holders live in pools of fixed-size arrays
//! (8, 12 and 16 bytes each), so a block two replicas share costs its
//! record plus 8 bytes, not plus a 24-byte small-vector header. Longer
//! lists get their own allocation. A list that grows or shrinks moves to
//! the pool of its new length; its handle changes with it.

/// A list's handle: its pool in the top bits, its slot in the rest.
pub(crate) type Handle = u32;

const POOL_SHIFT: u32 = 29;
const SLOT_MASK: u32 = (1 << POOL_SHIFT) - 1;
const TWO: u32 = 0;
const THREE: u32 = 1;
const FOUR: u32 = 2;
const MANY: u32 = 3;

fn handle(pool: u32, slot: usize) -> Handle {
    // A page holds far fewer than 2^29 lists.
    let slot = u32::try_from(slot).unwrap_or(SLOT_MASK) & SLOT_MASK;
    pool << POOL_SHIFT | slot
}

fn split(handle: Handle) -> (u32, usize) {
    (handle >> POOL_SHIFT, (handle & SLOT_MASK) as usize)
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
    two: Pool<[u32; 2]>,
    three: Pool<[u32; 3]>,
    four: Pool<[u32; 4]>,
    many: Pool<Vec<u32>>,
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
    /// Stores a list of at least two holders.
    pub(crate) fn insert(&mut self, holders: &[u32]) -> Handle {
        match *holders {
            [a, b] => handle(TWO, self.two.put([a, b])),
            [a, b, c] => handle(THREE, self.three.put([a, b, c])),
            [a, b, c, d] => handle(FOUR, self.four.put([a, b, c, d])),
            _ => handle(MANY, self.many.put(holders.to_vec())),
        }
    }

    /// The holders under `handle` (empty for a handle not in use).
    #[inline]
    pub(crate) fn get(&self, handle: Handle) -> &[u32] {
        let (pool, slot) = split(handle);
        match pool {
            TWO => self.two.slots.get(slot).map(|l| &l[..]),
            THREE => self.three.slots.get(slot).map(|l| &l[..]),
            FOUR => self.four.slots.get(slot).map(|l| &l[..]),
            _ => self.many.slots.get(slot).map(|l| &l[..]),
        }
        .unwrap_or(&[])
    }

    /// The holders under `handle`, to overwrite in place.
    pub(crate) fn get_mut(&mut self, handle: Handle) -> &mut [u32] {
        let (pool, slot) = split(handle);
        match pool {
            TWO => self.two.slots.get_mut(slot).map(|l| &mut l[..]),
            THREE => self.three.slots.get_mut(slot).map(|l| &mut l[..]),
            FOUR => self.four.slots.get_mut(slot).map(|l| &mut l[..]),
            _ => self.many.slots.get_mut(slot).map(|l| &mut l[..]),
        }
        .unwrap_or(&mut [])
    }

    /// Adds `holder` to the list; returns the list's handle now.
    pub(crate) fn push(&mut self, handle: Handle, holder: u32) -> Handle {
        let (pool, slot) = split(handle);
        if pool == MANY
            && let Some(list) = self.many.slots.get_mut(slot)
        {
            list.push(holder);
            return handle;
        }
        let mut longer: smallvec::SmallVec<[u32; 5]> = self.get(handle).into();
        longer.push(holder);
        self.release(handle);
        self.insert(&longer)
    }

    /// Keeps the holders for which `keep` is true.
    pub(crate) fn retain(&mut self, handle: Handle, mut keep: impl FnMut(u32) -> bool) -> Left {
        let (pool, slot) = split(handle);
        let kept: smallvec::SmallVec<[u32; 8]> = self
            .get(handle)
            .iter()
            .copied()
            .filter(|&h| keep(h))
            .collect();
        match kept.len() {
            0 => {
                self.release(handle);
                Left::None
            }
            1 => {
                self.release(handle);
                Left::One(kept[0])
            }
            n if pool == MANY && n > 4 => {
                if let Some(list) = self.many.slots.get_mut(slot) {
                    list.clear();
                    list.extend_from_slice(&kept);
                    // A list most of whose holders left gives the room back.
                    if list.capacity() > 2 * n {
                        list.shrink_to_fit();
                    }
                }
                Left::List(handle)
            }
            n if n == self.get(handle).len() => Left::List(handle),
            _ => {
                self.release(handle);
                Left::List(self.insert(&kept))
            }
        }
    }

    /// Gives the list's slot back (a list past four holders frees its
    /// allocation).
    pub(crate) fn release(&mut self, handle: Handle) {
        let (pool, slot) = split(handle);
        match pool {
            TWO => self.two.release(slot),
            THREE => self.three.release(slot),
            FOUR => self.four.release(slot),
            _ => {
                if let Some(list) = self.many.slots.get_mut(slot) {
                    *list = Vec::new();
                    self.many.release(slot);
                }
            }
        }
    }

    /// Bytes held on the heap: the pools and the long lists' allocations.
    pub(crate) fn heap_bytes(&self) -> usize {
        let long: usize = self
            .many
            .slots
            .iter()
            .map(|l| l.capacity() * size_of::<u32>())
            .sum();
        self.two.heap_bytes()
            + self.three.heap_bytes()
            + self.four.heap_bytes()
            + self.many.heap_bytes()
            + long
    }

    /// Lists in use.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        fn used<T>(p: &Pool<T>) -> usize {
            p.slots.len() - p.free.len()
        }
        used(&self.two) + used(&self.three) + used(&self.four) + used(&self.many)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_move_between_pools_as_they_grow_and_shrink() {
        let mut lists = HolderLists::default();
        let mut h = lists.insert(&[1, 2]);
        assert_eq!(split(h).0, TWO);
        for (next, pool) in [(3, THREE), (4, FOUR), (5, MANY), (6, MANY)] {
            h = lists.push(h, next);
            assert_eq!(split(h).0, pool);
            assert_eq!(lists.in_use(), 1);
        }
        assert_eq!(lists.get(h), [1, 2, 3, 4, 5, 6]);
        for next in 7..=20 {
            assert_eq!(lists.push(h, next), h, "long lists grow in place");
        }
        assert_eq!(lists.retain(h, |x| x <= 6), Left::List(h));
        assert!(
            lists.many.slots[split(h).1].capacity() <= 12,
            "room given back"
        );
        assert_eq!(lists.retain(h, |x| x != 6), Left::List(h), "stays long");
        let Left::List(h) = lists.retain(h, |x| x % 2 == 1) else {
            panic!("three are left")
        };
        assert_eq!((split(h).0, lists.get(h)), (THREE, &[1, 3, 5][..]));
        lists.get_mut(h)[1] = 7;
        assert_eq!(lists.retain(h, |x| x == 7), Left::One(7));
        assert_eq!(lists.in_use(), 0);
        let h = lists.insert(&[8, 9]);
        assert_eq!(lists.retain(h, |_| false), Left::None);
        assert_eq!(lists.in_use(), 0);
    }

    #[test]
    fn released_slots_are_reused() {
        let mut lists = HolderLists::default();
        let a = lists.insert(&[1, 2]);
        let b = lists.insert(&[3, 4]);
        lists.release(a);
        let c = lists.insert(&[5, 6]);
        assert_eq!(c, a);
        assert_eq!((lists.get(b), lists.get(c)), (&[3, 4][..], &[5, 6][..]));
        assert!(lists.get(handle(FOUR, 9)).is_empty(), "unknown handle");
    }

    #[test]
    fn heap_bytes_count_pools_and_long_lists() {
        let mut lists = HolderLists::default();
        assert_eq!(lists.heap_bytes(), 0);
        lists.insert(&[1, 2]);
        lists.insert(&[1, 2, 3, 4, 5]);
        let pools = lists.two.slots.capacity() * 8 + lists.many.slots.capacity() * 24;
        assert_eq!(lists.heap_bytes(), pools + 5 * 4);
    }
}
