//! The table's stores of shared bytes: interned strings and chunk-hash
//! pools (their own module to keep table.rs short).

use crate::FastMap;

use super::Name;

// === Interner ===

/// Strings by id, refcounted when the caller releases them (models and
/// salts leave with their last key; instance and backend names are kept,
/// as few as the fleet's reporters).
#[derive(Clone, Debug, Default)]
pub(crate) struct Interner {
    names: Vec<Name>,
    // u64: every key holds two references (model, salt), possibly to one
    // string, and there may be u32::MAX - 1 keys.
    refs: Vec<u64>,
    free: Vec<u32>,
    index: FastMap<Name, u32>,
    /// The ids of the last two names acquired: a batch's keys repeat one
    /// model and one salt, so these are compared before the index is
    /// hashed and probed (a hit is checked live and equal, so a stale id
    /// only misses).
    recent: [u32; 2],
}

impl Interner {
    pub(crate) fn get(&self, s: &str) -> Option<u32> {
        self.index.get(s).copied()
    }

    /// The id of `s`, one reference more.
    pub(crate) fn acquire(&mut self, s: &str) -> u32 {
        for id in self.recent {
            let i = id as usize;
            if let (Some(refs), Some(name)) = (self.refs.get_mut(i), self.names.get(i))
                && *refs > 0
                && **name == *s
            {
                *refs += 1;
                return id;
            }
        }
        let id = self.acquire_indexed(s);
        self.recent = [id, self.recent[0]];
        id
    }

    /// [`Self::acquire`] through the index.
    fn acquire_indexed(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.index.get(s) {
            self.refs[id as usize] += 1;
            return id;
        }
        let name: Name = s.into();
        let id = match self.free.pop() {
            Some(id) => {
                self.names[id as usize] = name.clone();
                self.refs[id as usize] = 1;
                id
            }
            None => {
                self.names.push(name.clone());
                self.refs.push(1);
                u32::try_from(self.names.len() - 1).unwrap_or(u32::MAX)
            }
        };
        self.index.insert(name, id);
        id
    }

    /// The id of `s`, kept for good (instance and backend names).
    pub(crate) fn acquire_kept(&mut self, s: &str) -> u32 {
        match self.index.get(s) {
            Some(&id) => id,
            None => self.acquire(s),
        }
    }

    /// One reference less; the string goes at zero.
    pub(crate) fn release(&mut self, id: u32) {
        let refs = &mut self.refs[id as usize];
        *refs -= 1;
        if *refs == 0 {
            let name = std::mem::replace(&mut self.names[id as usize], Name::from(""));
            self.index.remove(&name);
            self.free.push(id);
        }
    }

    pub(crate) fn name(&self, id: u32) -> &Name {
        &self.names[id as usize]
    }

    /// Every slot, freed ones as `""` (a checkpoint image keeps the ids).
    pub(crate) fn slots(&self) -> &[Name] {
        &self.names
    }

    /// Slots to resolve ids while a checkpoint image loads; no lookups by
    /// name until [`Self::from_slots`] replaces it.
    pub(crate) fn loading(names: Vec<Name>) -> Self {
        Self {
            names,
            ..Self::default()
        }
    }

    /// Takes the slots back (end of a load).
    pub(crate) fn into_slots(self) -> Vec<Name> {
        self.names
    }

    /// Rebuilds an interner from its slots and their reference counts; a
    /// slot with none is free. `None` when a name is in two live slots.
    pub(crate) fn from_slots(names: Vec<Name>, refs: Vec<u64>) -> Option<Self> {
        let mut index = FastMap::default();
        index.reserve(names.len());
        let mut free = Vec::new();
        for (i, (name, &r)) in names.iter().zip(&refs).enumerate() {
            let id = u32::try_from(i).unwrap_or(u32::MAX);
            if r == 0 {
                free.push(id);
            } else if index.insert(name.clone(), id).is_some() {
                return None;
            }
        }
        Some(Self {
            names,
            refs,
            free,
            index,
            recent: [0; 2],
        })
    }
}

// === Hash pools ===

/// Chunk hashes of one length, back to back, with the free places.
#[derive(Clone, Debug, Default)]
struct Pool {
    len: usize,
    bytes: Vec<u8>,
    free: Vec<u32>,
}

/// Every chunk hash, in one pool per length (in practice one or two: 16
/// bytes from LMCache's hex keys, 32 from BLAKE3).
#[derive(Clone, Debug, Default)]
pub(crate) struct Hashes {
    pools: Vec<Pool>,
}

impl Hashes {
    /// Stores `h`; returns (pool, place).
    pub(crate) fn insert(&mut self, h: &[u8]) -> (u32, u32) {
        let class = match self.pools.iter().position(|p| p.len == h.len()) {
            Some(c) => c,
            None => {
                self.pools.push(Pool {
                    len: h.len(),
                    ..Pool::default()
                });
                self.pools.len() - 1
            }
        };
        let pool = &mut self.pools[class];
        let place = match pool.free.pop() {
            Some(place) => {
                let at = place as usize * pool.len;
                pool.bytes[at..at + pool.len].copy_from_slice(h);
                place
            }
            None => {
                let place = pool.bytes.len().checked_div(pool.len).unwrap_or(0);
                pool.bytes.extend_from_slice(h);
                u32::try_from(place).unwrap_or(u32::MAX)
            }
        };
        (u32::try_from(class).unwrap_or(u32::MAX), place)
    }

    pub(crate) fn get(&self, class: u32, place: u32) -> &[u8] {
        let pool = &self.pools[class as usize];
        let at = place as usize * pool.len;
        &pool.bytes[at..at + pool.len]
    }

    pub(crate) fn remove(&mut self, class: u32, place: u32) {
        let pool = &mut self.pools[class as usize];
        if pool.len > 0 {
            pool.free.push(place);
        }
    }

    /// Makes room for `additional` hashes of `len` bytes (a hint: an
    /// overflowing product reserves nothing).
    pub(crate) fn reserve(&mut self, len: usize, additional: usize) {
        let bytes = additional.checked_mul(len).unwrap_or(0);
        if let Some(p) = self.pools.iter_mut().find(|p| p.len == len) {
            p.bytes.reserve(bytes);
        } else {
            self.pools.push(Pool {
                len,
                bytes: Vec::with_capacity(bytes),
                free: Vec::new(),
            });
        }
    }
}
