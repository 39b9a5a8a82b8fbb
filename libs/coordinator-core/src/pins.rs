//! Refcounted pins: keys fleet eviction and deletes must never touch.

use indexmap::IndexMap;

use crate::key::ObjectKey;

/// The pin table. Keys are stored in object group 0 so one pin covers every
/// group; order is first-pinned order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pins {
    counts: IndexMap<ObjectKey, u64>,
}

impl Pins {
    /// Empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one pin per key.
    pub fn pin<'a>(&mut self, keys: impl IntoIterator<Item = &'a ObjectKey>) {
        for k in keys {
            *self.counts.entry(k.group_zero()).or_insert(0) += 1;
        }
    }

    /// Removes one pin per key; a count reaching 0 drops the key, and
    /// unpinning an unpinned key does nothing.
    pub fn unpin<'a>(&mut self, keys: impl IntoIterator<Item = &'a ObjectKey>) {
        for k in keys {
            let k = k.group_zero();
            if let Some(c) = self.counts.get_mut(&k) {
                *c -= 1;
                if *c == 0 {
                    // Keep first-pinned order for the rest; a re-pin goes last.
                    self.counts.shift_remove(&k);
                }
            }
        }
    }

    /// Drops every pin of the keys, whatever the count. Returns how many were pinned.
    pub fn release<'a>(&mut self, keys: impl IntoIterator<Item = &'a ObjectKey>) -> usize {
        keys.into_iter()
            .filter(|k| self.counts.shift_remove(&k.group_zero()).is_some())
            .count()
    }

    /// Whether a key (any group) is pinned.
    pub fn is_pinned(&self, key: &ObjectKey) -> bool {
        if key.object_group_id == 0 {
            self.counts.contains_key(key)
        } else {
            self.counts.contains_key(&key.group_zero())
        }
    }

    /// Pin count of a key.
    pub fn count(&self, key: &ObjectKey) -> u64 {
        self.counts.get(&key.group_zero()).copied().unwrap_or(0)
    }

    /// Pinned keys with counts, in first-pinned order.
    pub fn iter(&self) -> impl Iterator<Item = (&ObjectKey, u64)> {
        self.counts.iter().map(|(k, c)| (k, *c))
    }

    /// Restores one entry (metadata load); counts ≤ 0 are dropped by the caller.
    pub fn restore(&mut self, key: ObjectKey, count: u64) {
        if count > 0 {
            self.counts.insert(key.group_zero(), count);
        }
    }

    /// Pinned keys.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether nothing is pinned.
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::key;

    #[test]
    fn refcounts_and_order() {
        let mut p = Pins::new();
        let (a, b) = (key(1, ""), key(2, ""));
        p.pin([&a, &b, &a]);
        assert_eq!(p.count(&a), 2);
        p.unpin([&a]);
        assert!(p.is_pinned(&a));
        p.unpin([&a, &a, &key(9, "")]);
        assert!(!p.is_pinned(&a));
        p.pin([&a]);
        let order: Vec<u8> = p.iter().map(|(k, _)| k.chunk_hash[0]).collect();
        assert_eq!(order, vec![2, 1], "re-pinned key moves to the end");
    }

    #[test]
    fn one_pin_covers_every_group() {
        let mut p = Pins::new();
        let mut g3 = key(1, "");
        g3.object_group_id = 3;
        p.pin([&g3]);
        assert!(p.is_pinned(&key(1, "")));
        assert!(p.is_pinned(&g3));
        assert_eq!(p.release([&key(1, ""), &key(2, "")]), 1);
        assert!(p.is_empty());
    }
}
