//! Block records, kept in the order they were first stored.
//!
//! A record is 14 bytes: the block's table key, its depth and one holder
//! inline (or, when several replicas hold the block, a handle into the
//! page's own holder lists, see [`crate::holders`]). Records live in
//! fixed-size pages and are appended, so the blocks of a chain an engine
//! reported in one event sit next to each other: a lookup walking a prompt
//! reads consecutive records (a cache line holds four and a half) instead
//! of one random location per block.
//!
//! A removed record is marked dead in place. Its slot is given back with
//! the page when every record on it died, refilled with new records when
//! it lies in a long enough run of dead ones, or reclaimed by compaction
//! (see [`crate::store`]).

use crate::holders::{HolderLists, Left};
use crate::types::Tier;

/// Records per page (28 KiB pages; tiny under test so that page
/// boundaries, compaction and freeing happen in small scenarios).
#[cfg(not(test))]
pub(crate) const PAGE_BITS: u32 = 11;
#[cfg(test)]
pub(crate) const PAGE_BITS: u32 = 3;
pub(crate) const PAGE_RECORDS: usize = 1 << PAGE_BITS;
/// Most pages a record id can name.
pub(crate) const MAX_PAGES: usize = 1 << (32 - PAGE_BITS);

/// A record's id: page number and offset in the page.
pub(crate) type RecId = u32;

pub(crate) fn rec_id(page: usize, offset: usize) -> RecId {
    // Pages are numbered below MAX_PAGES and offsets below PAGE_RECORDS.
    #[allow(clippy::cast_possible_truncation)]
    let id = ((page << PAGE_BITS) | offset) as RecId;
    id
}

pub(crate) fn page_of(id: RecId) -> usize {
    (id >> PAGE_BITS) as usize
}

pub(crate) fn offset_of(id: RecId) -> usize {
    (id as usize) & (PAGE_RECORDS - 1)
}

/// Bits of a packed holder.
const REPLICA_BITS: u32 = 21;
const TIER_BIT: u32 = 1 << REPLICA_BITS;
const EPOCH_SHIFT: u32 = REPLICA_BITS + 1;
/// Most replica slots a packed holder can name.
pub(crate) const MAX_REPLICAS: u32 = 1 << REPLICA_BITS;
/// Number of distinct store epochs (the eviction clock wraps at this).
pub(crate) const EPOCHS: u32 = 1 << (32 - EPOCH_SHIFT);

/// `meta` of a dead record.
const DEAD: u16 = u16::MAX;
/// Marks `meta` as pointing into the page's holder lists.
const SPILLED: u16 = 1 << 15;
/// Depths are stored in the remaining 15 bits (all ones is a dead record);
/// deeper blocks are recorded at this depth.
pub(crate) const MAX_DEPTH: u32 = (SPILLED - 2) as u32;

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
    pub(crate) fn raw(self) -> u32 {
        self.0
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

/// A set of store epochs, one bit each.
pub(crate) type EpochSet = [u64; (EPOCHS / 64) as usize];

/// Adds `epoch` to `set`.
pub(crate) fn add_epoch(set: &mut EpochSet, epoch: u32) {
    set[(epoch / 64) as usize] |= 1 << (epoch % 64);
}

/// What storing a holder did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// A new (replica, block) entry.
    Added,
    /// The replica already held the block; this was its previous holder.
    Refreshed(Holder),
}

/// What a walk along records ([`Page::walk`]) hands each record's holders
/// to; false stops the walk. A trait rather than a closure so that the
/// lookup's step is inlined into the walk's loop by its own
/// `#[inline(always)]`: a closure's call was left out of line by unrelated
/// edits (a call a block, +1.5 k instructions a 128-block lookup).
pub(crate) trait Visit {
    fn visit(&mut self, holders: &[u32]) -> bool;

    /// [`Visit::visit`] of a record with one holder, kept inline: a visitor
    /// that compares it as a word leaves it in a register (a slice of it
    /// needs it in memory, four instructions of a block's twenty-two).
    #[inline(always)]
    fn visit_one(&mut self, holder: u32) -> bool {
        self.visit(std::slice::from_ref(&holder))
    }

    /// [`Visit::visit`] of a pooled list of two to four holders: the first
    /// `len` of `slot`. A visitor may compare the whole slot at once under
    /// a mask of `len` (no branch on the length).
    #[inline(always)]
    fn visit_four(&mut self, slot: &[u32; 4], len: usize) -> bool {
        self.visit(&slot[..len.min(4)])
    }

    /// [`Visit::visit_four`] for a pooled list of five to eight holders.
    #[inline(always)]
    fn visit_eight(&mut self, slot: &[u32; 8], len: usize) -> bool {
        self.visit(&slot[..len.min(8)])
    }
}

impl<F: FnMut(&[u32]) -> bool> Visit for F {
    #[inline(always)]
    fn visit(&mut self, holders: &[u32]) -> bool {
        self(holders)
    }
}

/// Key, meta (depth | SPILLED, or DEAD) and payload (a holder or a holder
/// list handle), as little-endian bytes: byte arrays have no alignment, so a
/// record takes 14 bytes rather than 16, and each field is still one load.
#[derive(Clone, Copy, Debug)]
struct Record {
    key: [u8; 8],
    meta: [u8; 2],
    payload: [u8; 4],
}

impl Record {
    fn new(key: u64, meta: u16, payload: u32) -> Self {
        Self {
            key: key.to_le_bytes(),
            meta: meta.to_le_bytes(),
            payload: payload.to_le_bytes(),
        }
    }
    #[inline]
    fn key(&self) -> u64 {
        u64::from_le_bytes(self.key)
    }
    #[inline]
    fn meta(&self) -> u16 {
        u16::from_le_bytes(self.meta)
    }
    #[inline]
    fn payload(&self) -> u32 {
        u32::from_le_bytes(self.payload)
    }
    fn set_meta(&mut self, meta: u16) {
        self.meta = meta.to_le_bytes();
    }
    fn set_payload(&mut self, payload: u32) {
        self.payload = payload.to_le_bytes();
    }
    #[inline]
    fn live(&self) -> bool {
        self.meta() != DEAD
    }
    fn spilled(&self) -> bool {
        self.live() && self.meta() & SPILLED != 0
    }
    fn depth(&self) -> u32 {
        u32::from(self.meta() & !SPILLED)
    }
}

/// A depth as stored (saturated at [`MAX_DEPTH`]).
fn stored_depth(depth: u32) -> u16 {
    // Saturated below 2^15 first.
    #[allow(clippy::cast_possible_truncation)]
    let d = depth.min(MAX_DEPTH) as u16;
    d
}

/// One page of records with the holder lists of its shared blocks.
#[derive(Debug)]
pub(crate) struct Page {
    records: Vec<Record>,
    lists: HolderLists,
    live: usize,
    /// Every epoch a holder on this page may carry (a superset: bits are
    /// added on store and recomputed by [`Page::recount_epochs`]), so an
    /// eviction pass skips the pages that hold none of its epochs.
    epochs: EpochSet,
}

impl Default for Page {
    fn default() -> Self {
        Self {
            records: Vec::with_capacity(PAGE_RECORDS),
            lists: HolderLists::default(),
            live: 0,
            epochs: [0; (EPOCHS / 64) as usize],
        }
    }
}

impl Page {
    /// A page given back: no records, nothing allocated.
    pub(crate) fn vacant() -> Self {
        Self {
            records: Vec::new(),
            lists: HolderLists::default(),
            live: 0,
            epochs: [0; (EPOCHS / 64) as usize],
        }
    }
}

/// A live record as it is read: key, depth, holders.
#[derive(Clone, Copy, Debug)]
pub(crate) struct View<'a> {
    pub(crate) key: u64,
    pub(crate) depth: u32,
    /// The holder when there is one (records are not aligned for a slice).
    inline: u32,
    /// The holder list when there are several.
    list: &'a [u32],
}

impl View<'_> {
    /// The raw holders.
    pub(crate) fn holders(&self) -> &[u32] {
        if self.list.is_empty() {
            std::slice::from_ref(&self.inline)
        } else {
            self.list
        }
    }
}

impl Page {
    /// Records appended so far (live or dead).
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Live records.
    pub(crate) fn live(&self) -> usize {
        self.live
    }

    /// Bytes this page holds on the heap: its record array and its holder
    /// lists.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.records.capacity() * size_of::<Record>() + self.lists.heap_bytes()
    }

    /// Room for `n` more records.
    pub(crate) fn room(&self) -> usize {
        PAGE_RECORDS - self.records.len()
    }

    /// The live record at `offset`.
    pub(crate) fn view(&self, offset: usize) -> Option<View<'_>> {
        let r = self.records.get(offset).filter(|r| r.live())?;
        let list = if r.spilled() {
            self.lists.get(r.payload())
        } else {
            &[]
        };
        Some(View {
            key: r.key(),
            depth: r.depth(),
            inline: r.payload(),
            list,
        })
    }

    /// Visits the live records from `offset` on while they carry `keys` in
    /// order, passing each one's holders; stops early when `visit` returns
    /// false. Returns the records visited and whether `visit` stopped it.
    /// (`key_of` gives each key.) Out of line, so that the loop's code is
    /// its own: inlined into the lookup, what the compiler made of it
    /// moved with unrelated edits anywhere in the crate (40 or 44
    /// instructions a block, the record's address kept or recomputed as
    /// count × 14). The records are iterated by pointer and the keys by
    /// the count; see docs/benchmarks.md for the forms tried.
    #[inline(never)]
    pub(crate) fn walk<K>(
        &self,
        offset: usize,
        keys: &[K],
        key_of: impl Fn(&K) -> u64,
        visit: &mut impl Visit,
    ) -> (usize, bool) {
        let records = self.records.get(offset..).unwrap_or(&[]);
        let n = records.len().min(keys.len());
        let (records, keys) = (&records[..n], &keys[..n]);
        for (i, r) in records.iter().enumerate() {
            let k = &keys[i];
            if r.key() != key_of(k) || !r.live() {
                return (i, false);
            }
            let payload = r.payload();
            let goes_on = if r.meta() & SPILLED == 0 {
                visit.visit_one(payload)
            } else if let Some((slot, len)) = self.lists.four(payload) {
                visit.visit_four(slot, len)
            } else if let Some((slot, len)) = self.lists.eight(payload) {
                visit.visit_eight(slot, len)
            } else {
                visit.visit(self.lists.get(payload))
            };
            if !goes_on {
                return (i + 1, true);
            }
        }
        (n, false)
    }

    /// The key of the live record at `offset`.
    pub(crate) fn key(&self, offset: usize) -> Option<u64> {
        self.records
            .get(offset)
            .filter(|r| r.live())
            .map(Record::key)
    }

    /// Whether a holder on this page may carry an epoch of `set`.
    pub(crate) fn may_hold(&self, set: &EpochSet) -> bool {
        self.epochs.iter().zip(set).any(|(a, b)| a & b != 0)
    }

    /// Recomputes the page's epoch set exactly.
    pub(crate) fn recount_epochs(&mut self) {
        let mut set = [0; (EPOCHS / 64) as usize];
        for offset in 0..self.records.len() {
            if let Some(view) = self.view(offset) {
                for &h in view.holders() {
                    add_epoch(&mut set, Holder(h).epoch());
                }
            }
        }
        self.epochs = set;
    }

    /// Appends a live record with `holders` (at least one); returns its
    /// offset. The caller checks [`Page::room`] first.
    pub(crate) fn append(&mut self, key: u64, depth: u32, holders: &[u32]) -> usize {
        let record = self.new_record(key, depth, holders);
        self.records.push(record);
        self.live += 1;
        self.records.len() - 1
    }

    /// The first dead slot at or after `from` that starts or lies in a run
    /// of at least `min_run` dead slots; a dead slot right at `from > 0`
    /// (the run the caller is filling) qualifies on its own.
    pub(crate) fn hole(&self, from: usize, min_run: usize) -> Option<usize> {
        let rest = self.records.get(from..)?;
        if from > 0 && rest.first().is_some_and(|r| !r.live()) {
            return Some(from);
        }
        let mut run = 0;
        for (i, r) in rest.iter().enumerate() {
            if r.live() {
                run = 0;
                continue;
            }
            run += 1;
            if run >= min_run {
                return Some(from + i + 1 - run);
            }
        }
        None
    }

    /// Dead slots in runs of at least `min_run` (what [`Page::hole`] would
    /// hand out, starting from the page's first slot).
    pub(crate) fn holes(&self, min_run: usize) -> usize {
        let mut run = 0;
        let mut total = 0;
        for r in &self.records {
            if r.live() {
                if run >= min_run {
                    total += run;
                }
                run = 0;
            } else {
                run += 1;
            }
        }
        if run >= min_run {
            total += run;
        }
        total
    }

    /// Writes a live record with `holders` (at least one) into the dead
    /// slot at `offset`; false (and nothing written) if it is not dead.
    pub(crate) fn refill(&mut self, offset: usize, key: u64, depth: u32, holders: &[u32]) -> bool {
        if self.records.get(offset).is_none_or(Record::live) {
            return false;
        }
        let record = self.new_record(key, depth, holders);
        self.records[offset] = record;
        self.live += 1;
        true
    }

    fn new_record(&mut self, key: u64, depth: u32, holders: &[u32]) -> Record {
        let depth = stored_depth(depth);
        for &h in holders {
            add_epoch(&mut self.epochs, Holder(h).epoch());
        }
        match holders {
            [one] => Record::new(key, depth, *one),
            many => Record::new(key, depth | SPILLED, self.lists.insert(many)),
        }
    }

    /// Records `holder` on the live record at `offset`; `Err(known_depth)`
    /// when it was recorded at another depth (nothing changes then).
    /// Inlined into the index's apply (see [`HolderLists::insert`]).
    #[inline]
    pub(crate) fn store(
        &mut self,
        offset: usize,
        depth: u32,
        holder: Holder,
    ) -> Result<Stored, u32> {
        let depth = u32::from(stored_depth(depth));
        let Some(record) = self.records.get(offset).copied().filter(Record::live) else {
            // Callers only pass offsets of live records.
            return Err(depth);
        };
        if record.depth() != depth {
            return Err(record.depth());
        }
        add_epoch(&mut self.epochs, holder.epoch());
        let replica = holder.replica();
        if !record.spilled() {
            let current = Holder(record.payload());
            if current.replica() == replica {
                self.records[offset].set_payload(holder.0);
                return Ok(Stored::Refreshed(current));
            }
            // A second holder: move both to a list.
            let list = self.lists.insert(&[current.0, holder.0]);
            let r = &mut self.records[offset];
            r.set_meta(r.meta() | SPILLED);
            r.set_payload(list);
            return Ok(Stored::Added);
        }
        let list = record.payload();
        let known = self.lists.get_mut(list);
        if let Some(x) = known.iter_mut().find(|x| Holder(**x).replica() == replica) {
            let previous = Holder(*x);
            *x = holder.0;
            return Ok(Stored::Refreshed(previous));
        }
        let moved = self.lists.push(list, holder.0);
        self.records[offset].set_payload(moved);
        Ok(Stored::Added)
    }

    /// Drops holders of the record at `offset` for which `drop` is true,
    /// reporting each; returns whether the record died (no holder left).
    pub(crate) fn remove_holders(
        &mut self,
        offset: usize,
        drop: &mut impl FnMut(Holder) -> bool,
        removed: &mut impl FnMut(Holder),
    ) -> bool {
        let Some(record) = self.records.get(offset).copied().filter(Record::live) else {
            return false;
        };
        if !record.spilled() {
            let h = Holder(record.payload());
            if !drop(h) {
                return false;
            }
            removed(h);
            self.kill(offset);
            return true;
        }
        let left = self.lists.retain(record.payload(), |x| {
            let h = Holder(x);
            let gone = drop(h);
            if gone {
                removed(h);
            }
            !gone
        });
        match left {
            Left::None => {
                // The list is gone already: kill the record as unspilled.
                let r = &mut self.records[offset];
                r.set_meta(r.meta() & !SPILLED);
                self.kill(offset);
                true
            }
            Left::One(last) => {
                // Back to a single inline holder.
                let r = &mut self.records[offset];
                r.set_meta(r.meta() & !SPILLED);
                r.set_payload(last);
                false
            }
            Left::List(list) => {
                self.records[offset].set_payload(list);
                false
            }
        }
    }

    /// Marks the record at `offset` dead (releasing its holder list).
    pub(crate) fn kill(&mut self, offset: usize) {
        let Some(record) = self.records.get(offset).copied().filter(Record::live) else {
            return;
        };
        if record.spilled() {
            self.lists.release(record.payload());
        }
        self.records[offset].set_meta(DEAD);
        self.live -= 1;
        if self.live == 0 {
            self.lists = HolderLists::default();
        }
    }

    /// Offsets of the live records.
    pub(crate) fn live_offsets(&self) -> impl Iterator<Item = usize> + '_ {
        self.records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.live())
            .map(|(i, _)| i)
    }

    /// The keys of the live records at depth 0 (chains' first blocks).
    pub(crate) fn first_keys(&self) -> impl Iterator<Item = u64> + '_ {
        // Depth bits zero: depth 0, and not dead (all ones).
        self.records
            .iter()
            .filter(|r| r.meta() & !SPILLED == 0)
            .map(Record::key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(r: u32) -> Holder {
        Holder::new(r, Tier::T1, 0)
    }

    fn replicas(p: &Page, offset: usize) -> Vec<u32> {
        let mut v: Vec<u32> = p
            .view(offset)
            .map(|v| v.holders().iter().map(|&h| Holder(h).replica()).collect())
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
    fn record_ids_round_trip() {
        let id = rec_id(MAX_PAGES - 1, PAGE_RECORDS - 1);
        assert_eq!(
            (page_of(id), offset_of(id)),
            (MAX_PAGES - 1, PAGE_RECORDS - 1)
        );
        assert_eq!(id, u32::MAX);
    }

    #[test]
    fn a_record_is_fourteen_bytes_and_depths_saturate() {
        assert_eq!(std::mem::size_of::<Record>(), 14);
        let mut p = Page::default();
        let at = p.append(9, MAX_DEPTH + 100, &[holder(1).raw()]);
        assert_eq!(p.view(at).map(|v| v.depth), Some(MAX_DEPTH));
        assert_eq!(p.store(at, u32::MAX, holder(2)), Ok(Stored::Added));
    }

    #[test]
    fn spills_and_unspills() {
        let mut p = Page::default();
        let at = p.append(1, 0, &[holder(1).raw()]);
        assert_eq!(p.store(at, 0, holder(2)), Ok(Stored::Added));
        assert_eq!(p.store(at, 0, holder(3)), Ok(Stored::Added));
        assert!(matches!(
            p.store(at, 0, Holder::new(2, Tier::T2, 5)),
            Ok(Stored::Refreshed(h)) if h.tier() == Tier::T1 && h.epoch() == 0
        ));
        assert_eq!(p.store(at, 4, holder(9)), Err(0), "depth conflict");
        assert_eq!(replicas(&p, at), [1, 2, 3]);
        let mut n = 0;
        assert!(!p.remove_holders(at, &mut |h| h.replica() != 3, &mut |_| n += 1));
        assert_eq!((n, replicas(&p, at)), (2, vec![3]));
        assert_eq!(p.lists.in_use(), 0, "the list was released");
        assert!(p.remove_holders(at, &mut |_| true, &mut |_| {}));
        assert!(p.view(at).is_none() && p.live() == 0);
    }

    #[test]
    fn only_long_enough_runs_of_dead_slots_are_refilled() {
        let mut p = Page::default();
        for k in 0..8u64 {
            p.append(k, 0, &[holder(1).raw()]);
        }
        // Dead: 1 (alone), 3-5 (a run of three), 7 (alone, at the end).
        for at in [1, 3, 4, 5, 7] {
            p.kill(at);
        }
        assert_eq!(p.holes(2), 3);
        assert_eq!(p.holes(1), 5);
        assert_eq!(p.hole(0, 2), Some(3));
        assert_eq!(p.hole(0, 4), None);
        // Continuing the run being filled, even where what is left of it
        // is shorter than the minimum.
        assert_eq!(p.hole(5, 2), Some(5));
        assert!(p.refill(3, 30, 2, &[holder(2).raw(), holder(3).raw()]));
        assert!(!p.refill(0, 99, 0, &[holder(2).raw()]), "0 is live");
        assert_eq!(p.live(), 4);
        assert_eq!(p.key(3), Some(30));
        assert_eq!(replicas(&p, 3), [2, 3]);
        assert_eq!(p.len(), 8, "refilling appends nothing");
        assert_eq!(p.hole(4, 2), Some(4));
    }

    #[test]
    fn appended_records_keep_their_order_and_die_in_place() {
        let mut p = Page::default();
        for k in 0..6u64 {
            let holders: Vec<u32> = (0..=(k % 3) as u32).map(|r| holder(r).raw()).collect();
            assert_eq!(p.append(k, u32::try_from(k).unwrap(), &holders), k as usize);
        }
        p.kill(4);
        assert_eq!(p.key(4), None);
        assert_eq!(p.key(5), Some(5));
        assert_eq!(
            p.view(5).map(|v| (v.depth, v.holders().len())),
            Some((5, 3))
        );
        assert_eq!(p.live_offsets().count(), 5);
        assert_eq!(p.room(), PAGE_RECORDS - 6);
    }
}
