//! Taking the keys of dead records out of the key tables: a probe each
//! when they are few (an engine evicting a chain), one sweep of every
//! table holding keys against a bitmap of dead records when they are many
//! next to the slots that sweep walks (an eviction pass or a replica's
//! removal).

use super::{Store, page_of};
use crate::arena::RecId;
use crate::keys::{KeyTable, Sole};

/// Withdrawing 1/`SWEEP_FRACTION` of the slots a sweep would walk or more
/// sweeps the tables instead of probing for each. Slots, not keys: tables
/// are allocated at their share of the capacity, so an index far below it
/// would otherwise sweep many times the table its keys fill.
const SWEEP_FRACTION: usize = 16;
/// Fewer dead records than this are always probed for.
#[cfg(not(test))]
const SWEEP_MIN: usize = 1024;
/// Most (hash, record) pairs kept for probing; past this a pass keeps
/// only the bitmap (and will sweep).
#[cfg(not(test))]
const LIST_LIMIT: usize = 1 << 16;
// Small under test, so that the store's model test takes every path.
#[cfg(test)]
const SWEEP_MIN: usize = 4;
#[cfg(test)]
const LIST_LIMIT: usize = 16;

/// Dead records whose keys are still published.
#[derive(Debug, Default)]
pub(super) struct Doomed {
    /// (hash, record) of each, until there are too many.
    listed: Vec<(u64, RecId)>,
    /// Set once `listed` stopped keeping up and `bits` took over.
    bits: Option<DeadBits>,
    /// Pages left without a live record.
    emptied: Vec<usize>,
    count: usize,
}

/// One bit per dead record, and per page whether it holds dead records
/// among live ones (`pages`) or nothing live at all (`whole`).
#[derive(Debug, Default)]
struct DeadBits {
    recs: Vec<u64>,
    pages: Vec<u64>,
    whole: Vec<u64>,
}

impl DeadBits {
    fn set(&mut self, rec: RecId) {
        set_bit(&mut self.recs, rec as usize);
        set_bit(&mut self.pages, page_of(rec));
    }

    fn has(&self, rec: RecId) -> bool {
        // Dead records cluster in a few pages: the page bits (small enough
        // to stay in cache) settle most slots, and the record bit, a
        // random read into a large bitmap, is needed only on pages that
        // kept some live records. An eviction pass mostly empties pages
        // whole, so the branch on the second page bit is rarely taken.
        let page = page_of(rec);
        has_bit(&self.whole, page)
            | (has_bit(&self.pages, page) && has_bit(&self.recs, rec as usize))
    }
}

fn set_bit(words: &mut Vec<u64>, i: usize) {
    if words.len() <= i / 64 {
        words.resize(i / 64 + 1, 0);
    }
    words[i / 64] |= 1 << (i % 64);
}

fn clear_bit(words: &mut [u64], i: usize) {
    if let Some(w) = words.get_mut(i / 64) {
        *w &= !(1 << (i % 64));
    }
}

fn has_bit(words: &[u64], i: usize) -> bool {
    words.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
}

impl Doomed {
    /// No dead records yet; `list` (emptied) is reused for the first ones.
    pub(super) fn reusing(mut list: Vec<(u64, RecId)>) -> Self {
        list.clear();
        Self {
            listed: list,
            ..Self::default()
        }
    }

    /// Notes the dead record `rec`, whose key hashes to `h`.
    // Inlined by request, with the rare bitmap cases apart: once per block
    // an engine evicts, and out of line it cost a call and a frame each
    // (34 instructions a call at 16 k pairs).
    #[inline(always)]
    pub(super) fn add(&mut self, h: u64, rec: RecId) {
        self.count += 1;
        if self.bits.is_none() && self.listed.len() < LIST_LIMIT {
            self.listed.push((h, rec));
        } else {
            self.mark(rec);
        }
    }

    /// [`Doomed::add`] past the list: into the bitmap, made from the list
    /// the first time.
    #[cold]
    #[inline(never)]
    fn mark(&mut self, rec: RecId) {
        let bits = self.bits.get_or_insert_with(|| {
            let mut bits = DeadBits::default();
            for &(_, r) in &self.listed {
                bits.set(r);
            }
            bits
        });
        bits.set(rec);
        self.listed = Vec::new();
    }

    /// Notes that page `n` holds no live record any more (so every key
    /// pointing into it goes).
    pub(super) fn emptied(&mut self, n: usize) {
        self.emptied.push(n);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }
}

impl Store {
    /// Removes the keys of `doomed` from the tables (see the module docs).
    /// Hands back its list when the keys were probed for, for reuse.
    pub(super) fn withdraw(&self, sole: &mut Sole, doomed: Doomed) -> Option<Vec<(u64, RecId)>> {
        let Doomed {
            listed,
            bits,
            emptied,
            count,
        } = doomed;
        let many = count > SWEEP_MIN && count * SWEEP_FRACTION >= self.swept_slots();
        let mut bits = match bits {
            Some(bits) => bits,
            None if !many => {
                self.publish(sole, &listed, |table, sole, &(h, rec)| {
                    table.remove(sole, h, rec);
                });
                return Some(listed);
            }
            None => {
                let mut bits = DeadBits::default();
                for &(_, rec) in &listed {
                    bits.set(rec);
                }
                bits
            }
        };
        // Both page bitmaps cover every page, so that the bound check in
        // `has` always passes: a bitmap ending partway through the pages
        // makes it a coin toss, mispredicted per slot.
        let words = self.pages.len() / 64 + 1;
        bits.pages.resize(bits.pages.len().max(words), 0);
        bits.whole.resize(words.max(bits.pages.len()), 0);
        for n in emptied {
            if has_bit(&bits.pages, n) {
                set_bit(&mut bits.whole, n);
                clear_bit(&mut bits.pages, n);
            }
        }
        for table in &self.keys {
            table.remove_all(sole, |rec| bits.has(rec));
        }
        None
    }

    /// Slots a sweep of every table walks (tables holding no key skipped).
    pub(super) fn swept_slots(&self) -> usize {
        self.keys.iter().map(KeyTable::swept_slots).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_keys_in_large_empty_tables_are_probed_for_not_swept() {
        // 128 tables sized for 2,048 keys each hold 40 keys: withdrawing
        // ten of them (a quarter of the keys, but a tiny share of the
        // slots a sweep would walk) probes for each. Fails if the
        // threshold compares against the key count.
        use crate::store::{Block, Holder};
        use crate::types::Tier;
        let store = Store::new(2, 64, 2048);
        let blocks: Vec<Block> = (0..40u64).map(|k| Block::new(k * 11 + 1, 0)).collect();
        store
            .store_chain(&blocks, |_| Holder::new(1, Tier::T1, 0), &mut Vec::new())
            .unwrap();
        assert!(
            store.swept_slots() < 128 * 2048 * 2 / 3,
            "empty tables skipped"
        );
        let mut doomed = Doomed::default();
        {
            let mut reader = store.reader(store.directory());
            for b in &blocks[..10] {
                doomed.add(b.h, reader.find(b.key, b.h).unwrap());
            }
        }
        assert!(
            store.withdraw(&mut Sole::default(), doomed).is_some(),
            "probed"
        );
        assert_eq!(store.key_count(), 30);
        let mut reader = store.reader(store.directory());
        assert!(
            blocks[..10]
                .iter()
                .all(|b| reader.find(b.key, b.h).is_none())
        );
        assert!(
            blocks[10..]
                .iter()
                .all(|b| reader.find(b.key, b.h).is_some())
        );
    }

    #[test]
    fn past_the_list_limit_every_record_is_still_marked() {
        let mut doomed = Doomed::default();
        let n = LIST_LIMIT + 10;
        for rec in 0..n as RecId {
            doomed.add(u64::from(rec), rec * 3);
        }
        assert_eq!(doomed.count, n);
        assert!(doomed.listed.is_empty());
        let bits = doomed.bits.as_ref().unwrap();
        assert!((0..n as RecId).all(|r| bits.has(r * 3)));
        assert!(!bits.has(1) && !bits.has(3 * n as RecId));
    }
}
