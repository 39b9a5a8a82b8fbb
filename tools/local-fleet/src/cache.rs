//! A simulated engine's prefix cache: a finite number of blocks, evicted
//! least recently used first (deepest block first among equally recent
//! ones, so a prefix outlives its extensions, as in vLLM).

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

/// What serving one request did to the cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Served {
    /// Leading blocks of the prompt that were already cached.
    pub hit_blocks: usize,
    /// Blocks newly stored, in prompt order, each with its parent (`None`
    /// at the prompt start).
    pub stored: Vec<(u64, Option<u64>)>,
    /// Blocks evicted to make room.
    pub evicted: Vec<u64>,
}

/// One engine's cache of chained block ids.
#[derive(Clone, Debug)]
pub struct PrefixCache {
    capacity: usize,
    /// id -> (last use, depth)
    blocks: HashMap<u64, (u64, usize)>,
    order: BTreeSet<(u64, Reverse<usize>, u64)>,
    clock: u64,
}

impl PrefixCache {
    /// A cache of `capacity` blocks (`usize::MAX` for unbounded).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            blocks: HashMap::new(),
            order: BTreeSet::new(),
            clock: 0,
        }
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// The leading blocks of `ids` that are cached, without touching them.
    pub fn peek_hits(&self, ids: &[u64]) -> usize {
        ids.iter()
            .take_while(|id| self.blocks.contains_key(id))
            .count()
    }

    /// Serves a request: counts the cached prefix, then stores every block
    /// of the prompt (a prefill computes what was missing) and evicts LRU.
    pub fn serve(&mut self, ids: &[u64]) -> Served {
        self.clock += 1;
        let hit_blocks = self.peek_hits(ids);
        let mut stored = Vec::new();
        for (depth, &id) in ids.iter().enumerate() {
            let parent = depth.checked_sub(1).map(|d| ids[d]);
            match self.blocks.insert(id, (self.clock, depth)) {
                Some((used, old_depth)) => {
                    self.order.remove(&(used, Reverse(old_depth), id));
                }
                None => stored.push((id, parent)),
            }
            self.order.insert((self.clock, Reverse(depth), id));
        }
        let mut evicted = Vec::new();
        while self.blocks.len() > self.capacity {
            let Some(victim) = self.order.pop_first() else {
                break;
            };
            self.blocks.remove(&victim.2);
            evicted.push(victim.2);
        }
        // A block stored and evicted in the same request was never visible:
        // report neither.
        let new_ids: std::collections::HashSet<u64> = stored.iter().map(|(id, _)| *id).collect();
        evicted.retain(|id| !new_ids.contains(id));
        stored.retain(|(id, _)| self.blocks.contains_key(id));
        Served {
            hit_blocks,
            stored,
            evicted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_cached_prefix_and_evicts_lru_deepest_first() {
        let mut c = PrefixCache::new(3);
        let s = c.serve(&[1, 2]);
        assert_eq!((s.hit_blocks, s.stored.len()), (0, 2));
        assert_eq!(s.stored, vec![(1, None), (2, Some(1))]);
        let s = c.serve(&[1, 2, 3]);
        assert_eq!(s.hit_blocks, 2);
        assert_eq!(s.stored, vec![(3, Some(2))]);
        // A new prompt evicts the least recently used, deepest first.
        let s = c.serve(&[7]);
        assert_eq!(s.evicted, vec![3]);
        assert_eq!(c.len(), 3);
        assert_eq!(c.peek_hits(&[1, 2]), 2);
        assert_eq!(c.peek_hits(&[7]), 1);
    }

    #[test]
    fn a_gap_ends_the_hit() {
        let mut c = PrefixCache::new(10);
        c.serve(&[1, 2, 3]);
        assert_eq!(c.peek_hits(&[1, 9, 3]), 1);
    }
}
