//! Where blocks live: records in pages (see [`crate::arena`]) and key
//! tables pointing at them (see [`crate::keys`]).
//!
//! Keys are spread over many small tables (a few thousand keys each: see
//! [`crate::keys`] for why), `shards × tables` of them in one slice (the
//! shards, once lock shards, now only size it).
//!
//! Locking: the page directory and every page have their own `RwLock`;
//! the key tables have none (readers load their slots, see
//! [`crate::keys`]). Lookups take read locks only and hold them for the
//! lookup. There is a single writer at a time (the placement mutex, whose
//! [`Sole`] token every key-table change takes), and it never waits for a
//! lock while holding a write lock, nor holds the directory's read lock
//! while waiting for its write lock — so nothing deadlocks, and a lookup
//! waits for at most one write of a few records (at most [`WRITE_BATCH`]).
//!
//! Consistency without a global lock: a new record is written (appended,
//! or into a dead slot whose key was withdrawn) before its key is
//! published, and a dead record is marked dead before its key is
//! withdrawn, so a reader that reaches a record through a stale key or a
//! neighbouring record checks that it is live and carries the key it wants.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLockWriteGuard};
use smallvec::SmallVec;

use crate::arena::{
    EpochSet, Holder, PAGE_RECORDS, Page, RecId, Stored, offset_of, page_of, rec_id,
};
use crate::keys::{KeyTable, Sole};

mod compact;
mod directory;
mod firsts;
mod reader;
mod refill;
mod withdraw;

pub(crate) use directory::Directory;
use firsts::{Firsts, FirstsCount};
use withdraw::Doomed;

/// Most records written under one page lock.
const WRITE_BATCH: usize = 16;
/// Key slots the writer prefetches before probing them.
const PREFETCH_BATCH: usize = 16;
/// Below this many keys the writer does not prefetch key slots (the
/// tables, some 8 bytes a key, fit in the core's cache).
#[cfg(not(test))]
const PREFETCH_MIN_KEYS: usize = 1 << 16;
// Small under test, so that the model tests take both paths.
#[cfg(test)]
const PREFETCH_MIN_KEYS: usize = 8;

/// Spreads a key over the tables (fingerprints are random already, but test
/// and synthetic ones are not).
pub(crate) fn hash(key: u64) -> u64 {
    let x = (key ^ (key >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^ (x >> 29)
}

/// A block the writer stores.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Block {
    pub(crate) key: u64,
    pub(crate) h: u64,
    pub(crate) depth: u32,
}

impl Block {
    pub(crate) fn new(key: u64, depth: u32) -> Self {
        Self {
            key,
            h: hash(key),
            depth,
        }
    }
}

/// The record space is exhausted: the page directory's bound (four times
/// the pages the capacity fills, see [`directory::Directory::for_records`])
/// is reached. Not expected below it (a resync of every replica at full
/// capacity peaks at about half of it), but reported rather than assumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct OutOfSpace;

/// Writer-side bookkeeping of the pages.
#[derive(Debug, Default)]
struct Placement {
    /// The page new records go to.
    current: Option<usize>,
    /// Allocated pages to fill after `current`.
    ready: Vec<usize>,
    /// Page numbers free for reuse.
    free: Vec<usize>,
    /// Pages whose last live record died since the last [`Store::compact`].
    emptied: Vec<usize>,
    /// Records in allocated pages, live or dead.
    records: usize,
    /// Dead records in allocated pages.
    dead: usize,
    /// Pages whose runs of dead slots take new records before `current`
    /// does, the next one last; and where to look on in that one.
    refill: Vec<usize>,
    refill_from: usize,
    /// Slots left of those found when the pages were queued.
    queued: usize,
    /// No pages are queued for refilling until `dead` exceeds this.
    pick_after: usize,
    /// Working lists of one write, kept so that an event allocates none.
    scratch: Scratch,
    /// The key tables' writer token.
    sole: Sole,
    /// The first-block filter's bookkeeping.
    firsts: FirstsCount,
}

/// The writer's per-event working lists, emptied and reused.
#[derive(Debug, Default)]
struct Scratch {
    /// The record of each block of the event, where it exists.
    recs: Vec<Option<RecId>>,
    /// (hash, record) of the records created.
    created: Vec<(u64, RecId)>,
    /// (hash, record) of the records that died.
    dead: Vec<(u64, RecId)>,
}

/// Lists longer than this are not kept (a resync's chunk would keep tens
/// of bytes per block of it).
const SCRATCH_KEEP: usize = 256;

impl Scratch {
    fn heap_bytes(&self) -> usize {
        self.recs.capacity() * size_of::<Option<RecId>>()
            + (self.created.capacity() + self.dead.capacity()) * size_of::<(u64, RecId)>()
    }
}

/// The store.
#[derive(Debug)]
pub(crate) struct Store {
    /// Shard-major: table `t` of shard `s` at `s | t << shard bits`, so
    /// that one mask of the hash's bits 16 and up picks it (one bounds
    /// check, no second pointer per probe).
    keys: Box<[KeyTable]>,
    /// `keys.len() - 1` (a power of two less one).
    key_mask: usize,
    /// Which keys may have a depth-0 record, consulted before the key
    /// tables by a lookup's first block (see [`firsts`]).
    firsts: Firsts,
    pages: Directory,
    place: Mutex<Placement>,
    /// Records moved by compaction, since start.
    relocations: AtomicU64,
}

/// The writer's single page write guard, switched as records move on.
struct PageWriter<'a> {
    dir: &'a Directory,
    held: Option<(usize, RwLockWriteGuard<'a, Page>)>,
    writes: usize,
}

impl<'a> PageWriter<'a> {
    fn new(dir: &'a Directory) -> Self {
        Self {
            dir,
            held: None,
            writes: 0,
        }
    }

    /// Page `n`, write-locked, to write one record to.
    // Inlined by request (as `look`): every stored or removed block calls
    // it, and the partition of the crate into codegen units otherwise
    // decides, so unrelated edits moved `Index::apply` by 3 % (129.5 M →
    // 133.5 M instructions at 16 k pairs with no change on its path).
    #[inline]
    fn page(&mut self, n: usize) -> Option<&mut Page> {
        self.writes += 1;
        self.look(n)
    }

    /// Page `n`, write-locked, to look at (not counted as a write).
    #[inline]
    fn look(&mut self, n: usize) -> Option<&mut Page> {
        let keep = self.held.as_ref().is_some_and(|h| h.0 == n) && self.writes <= WRITE_BATCH;
        if !keep {
            // Release first: the writer never waits while holding a write lock.
            self.held = None;
            self.writes = 1;
            let page = self.dir.get(n)?;
            self.held = Some((n, page.write()));
        }
        self.held.as_mut().map(|h| &mut *h.1)
    }
}

/// Slots of [`has_duplicate`]'s set kept in a fixed array (chains of up to
/// 32 new blocks).
const SMALL_SET: usize = 64;

/// Whether `keys` (`n` of them) repeat one: a small open-addressing set,
/// cheaper than sorting for the chain lengths engines report.
fn has_duplicate(keys: impl Iterator<Item = u64>, n: usize) -> bool {
    let capacity = (n * 2).next_power_of_two();
    let mask = capacity - 1;
    // Key 0 marks an empty slot; it is tracked on the side. On the stack
    // for the chains most events carry (an allocation per event showed in
    // the apply profile), zeroed whole: `SmallVec::from_elem` wrote its
    // slots one by one (some 400 instructions for 32 slots).
    let mut small = [0u64; SMALL_SET];
    let mut large: SmallVec<[u64; 256]> = SmallVec::new();
    let seen: &mut [u64] = if capacity <= SMALL_SET {
        &mut small[..capacity]
    } else {
        large.resize(capacity, 0);
        &mut large
    };
    let mut zero = false;
    for key in keys {
        if key == 0 {
            if zero {
                return true;
            }
            zero = true;
            continue;
        }
        // Masked to the set's size.
        #[allow(clippy::cast_possible_truncation)]
        let mut i = (hash(key) as usize) & mask;
        loop {
            if seen[i] == 0 {
                seen[i] = key;
                break;
            }
            if seen[i] == key {
                return true;
            }
            i = (i + 1) & mask;
        }
    }
    false
}

/// The page with room for the next new record, moving on to a ready page
/// when the current one is full.
fn next_room(place: &mut Placement, writer: &mut PageWriter<'_>) -> Option<usize> {
    loop {
        if let Some(c) = place.current
            && writer.look(c).is_some_and(|p| p.room() > 0)
        {
            return Some(c);
        }
        if place.ready.is_empty() {
            return None;
        }
        // In allocation order, so consecutive records stay in consecutive pages.
        place.current = Some(place.ready.remove(0));
    }
}

/// Items keyed by a block hash.
trait HashOf {
    fn hash(&self) -> u64;
}

impl HashOf for (u64, RecId) {
    fn hash(&self) -> u64 {
        self.0
    }
}

impl HashOf for (u64, RecId, RecId) {
    fn hash(&self) -> u64 {
        self.0
    }
}

impl Store {
    /// An empty store with `shards` key shards of `tables` key tables each
    /// (both powers of two, `shards` at most 1024), each table sized for
    /// `table_keys` keys (allocated on its first key).
    #[cfg(test)]
    pub(crate) fn new(shards: usize, tables: usize, table_keys: usize) -> Self {
        Self::with_records(shards, tables, table_keys, 1 << 16)
    }

    /// [`Store::new`] with a directory sized for about `records` records
    /// (see [`Directory::for_records`]).
    pub(crate) fn with_records(
        shards: usize,
        tables: usize,
        table_keys: usize,
        records: usize,
    ) -> Self {
        let all = shards.max(1).next_power_of_two() * tables.max(1).next_power_of_two();
        Self {
            keys: (0..all).map(|_| KeyTable::sized(table_keys)).collect(),
            key_mask: all - 1,
            firsts: Firsts::for_records(records),
            pages: Directory::for_records(records),
            place: Mutex::default(),
            relocations: AtomicU64::new(0),
        }
    }

    /// The key table of hash `h`: bits 16 and up (tables home by the top
    /// 16 bits, so the two stay independent).
    #[inline]
    fn table(&self, h: u64) -> Option<&KeyTable> {
        // Masked to the table count: always a valid index.
        #[allow(clippy::cast_possible_truncation)]
        let i = ((h >> 16) as usize) & self.key_mask;
        self.keys.get(i)
    }

    /// The first probe of a lookup (of a prompt's first block), before it
    /// takes any lock: `None` when no depth-0 record of hash `h` can exist
    /// (the first-block filter says so, or no entry of the key tables
    /// carries its tag: a sure miss, answered with no lock at all);
    /// otherwise the record of the first entry carrying the tag, which is
    /// the key's unless another key shares the tag (the caller checks, and
    /// probes again if not).
    #[inline]
    pub(crate) fn first_probe(&self, h: u64) -> Option<RecId> {
        if !self.firsts.may_hold(h) {
            return None;
        }
        self.table(h).and_then(|t| t.tagged(h))
    }

    /// The page directory (no lock: see [`Directory`]).
    pub(crate) fn directory(&self) -> &Directory {
        &self.pages
    }

    /// Makes sure `n` more records fit: `current` and `ready` pages.
    fn reserve(&self, place: &mut Placement, n: usize) -> Result<(), OutOfSpace> {
        if n == 0 {
            // Only holders added (no lock needed to know that).
            return Ok(());
        }
        let dir = &self.pages;
        let room_of = |p: usize| dir.get(p).map_or(0, |p| p.read().room());
        let mut room = place.current.map_or(0, room_of) + place.ready.len() * PAGE_RECORDS;
        while room < n {
            let page = match place.free.pop() {
                Some(p) => p,
                None => dir.push().ok_or(OutOfSpace)?,
            };
            *dir.get(page).ok_or(OutOfSpace)?.write() = Page::default();
            place.ready.push(page);
            room += PAGE_RECORDS;
        }
        Ok(())
    }

    /// The records of `blocks`, where they exist, into `recs` (emptied
    /// first).
    fn locate(&self, place: &Placement, blocks: &[Block], recs: &mut Vec<Option<RecId>>) {
        recs.clear();
        recs.reserve(blocks.len());
        let mut reader = self.reader(&self.pages);
        let mut prev = None;
        // Whether the last block was found just before its predecessor.
        let mut back = false;
        // Key tables this small stay in cache: prefetching them saves no
        // wait and costs a shard lookup per block (an eighth of `locate`'s
        // instructions at 16,000 keys).
        if place.records.saturating_sub(place.dead) < PREFETCH_MIN_KEYS {
            for b in blocks {
                let rec = reader.find_near(prev, back, b.key, b.h);
                if let Some(r) = rec {
                    back = prev.is_some_and(|p| r.wrapping_add(1) == p);
                    prev = Some(r);
                }
                recs.push(rec);
            }
            return;
        }
        // Prefetch a batch's key slots, then probe them: the misses overlap.
        // (A window prefetching a fixed distance ahead of the probe measured
        // slower, and so did batches of 32.)
        for chunk in blocks.chunks(PREFETCH_BATCH) {
            for b in chunk {
                reader.prefetch(b.h);
            }
            for b in chunk {
                let rec = reader.find_near(prev, back, b.key, b.h);
                if let Some(r) = rec {
                    back = prev.is_some_and(|p| r.wrapping_add(1) == p);
                    prev = Some(r);
                }
                recs.push(rec);
            }
        }
    }

    /// Stores `holder(i)` on every block, creating the records of blocks
    /// not seen before, in order. Puts per block what happened
    /// (`Err(known_depth)` for a depth conflict) into `results` (emptied
    /// first). The caller does its bookkeeping afterwards, outside every
    /// lock.
    pub(crate) fn store_chain(
        &self,
        blocks: &[Block],
        holder: impl Fn(usize) -> Holder,
        results: &mut Vec<Result<Stored, u32>>,
    ) -> Result<(), OutOfSpace> {
        let mut place = self.place.lock();
        let mut recs = std::mem::take(&mut place.scratch.recs);
        let mut created = std::mem::take(&mut place.scratch.created);
        // Which blocks exist already.
        self.locate(&place, blocks, &mut recs);
        // A block repeated within the chain gets one record: later copies
        // point at the first (`first_copy[i]`).
        let new = recs.iter().filter(|r| r.is_none()).count();
        let mut first_copy: Vec<usize> = Vec::new();
        let fresh_keys = || {
            (0..blocks.len())
                .filter(|&i| recs[i].is_none())
                .map(|i| blocks[i].key)
        };
        if new > 1 && has_duplicate(fresh_keys(), new) {
            let mut fresh: Vec<(u64, usize)> = (0..blocks.len())
                .filter(|&i| recs[i].is_none())
                .map(|i| (blocks[i].key, i))
                .collect();
            fresh.sort_unstable();
            first_copy = (0..blocks.len()).collect();
            for run in fresh.chunk_by(|a, b| a.0 == b.0) {
                for &(_, i) in &run[1..] {
                    first_copy[i] = run[0].1;
                }
            }
        }
        self.reserve(&mut place, new)?;
        results.clear();
        results.reserve(blocks.len());
        // (hash, record) of the records created here.
        created.clear();
        created.reserve(new);
        {
            let mut writer = PageWriter::new(&self.pages);
            for (i, b) in blocks.iter().enumerate() {
                let existing = match first_copy.get(i) {
                    Some(&first) if first != i => recs[first],
                    _ => recs[i],
                };
                if let Some(rec) = existing {
                    let result = writer.page(page_of(rec)).map_or(Err(b.depth), |p| {
                        p.store(offset_of(rec), b.depth, holder(i))
                    });
                    results.push(result);
                    continue;
                }
                let holders = [holder(i).raw()];
                let rec = if let Some((page_no, at)) = refill::next_hole(&mut place, &mut writer)
                    && writer
                        .page(page_no)
                        .is_some_and(|p| p.refill(at, b.key, b.depth, &holders))
                {
                    place.dead -= 1;
                    rec_id(page_no, at)
                } else {
                    let page_no = next_room(&mut place, &mut writer).ok_or(OutOfSpace)?;
                    let page = writer.page(page_no).ok_or(OutOfSpace)?;
                    place.records += 1;
                    rec_id(page_no, page.append(b.key, b.depth, &holders))
                };
                if b.depth == 0 {
                    // Before its key is published.
                    let place = &mut *place;
                    self.firsts.add(&mut place.sole, &mut place.firsts, b.h);
                }
                recs[i] = Some(rec);
                created.push((b.h, rec));
                results.push(Ok(Stored::Added));
            }
        }
        self.publish(&mut place.sole, &created, |table, sole, &(h, rec)| {
            table.insert(sole, h, rec);
        });
        if recs.capacity() <= SCRATCH_KEEP {
            place.scratch.recs = recs;
            place.scratch.created = created;
        }
        Ok(())
    }

    /// Applies `edit` to the key table of each item, in order (no lock:
    /// `sole` proves this is the only writer).
    fn publish<T: HashOf>(
        &self,
        sole: &mut Sole,
        items: &[T],
        edit: impl Fn(&KeyTable, &mut Sole, &T),
    ) {
        for item in items {
            if let Some(table) = self.table(item.hash()) {
                edit(table, sole, item);
            }
        }
    }

    /// Drops the holders of `blocks` for which `drop` is true, reporting
    /// each.
    pub(crate) fn remove(
        &self,
        blocks: &[Block],
        mut drop: impl FnMut(Holder) -> bool,
        mut removed: impl FnMut(Holder),
    ) {
        let mut place = self.place.lock();
        let mut recs = std::mem::take(&mut place.scratch.recs);
        self.locate(&place, blocks, &mut recs);
        let mut dead = Doomed::reusing(std::mem::take(&mut place.scratch.dead));
        {
            let mut writer = PageWriter::new(&self.pages);
            for (b, &rec) in blocks.iter().zip(&recs) {
                let Some(rec) = rec else {
                    continue;
                };
                let Some(page) = writer.page(page_of(rec)) else {
                    continue;
                };
                if page.remove_holders(offset_of(rec), &mut drop, &mut removed) {
                    dead.add(b.h, rec);
                    place.dead += 1;
                    if page.live() == 0 {
                        place.emptied.push(page_of(rec));
                    }
                }
            }
        }
        if recs.capacity() <= SCRATCH_KEEP {
            place.scratch.recs = recs;
        }
        if !dead.is_empty()
            && let Some(list) = self.withdraw(&mut place.sole, dead)
            && list.capacity() <= SCRATCH_KEEP
        {
            place.scratch.dead = list;
        }
    }

    /// Drops every holder for which `drop` is true, reporting each: one
    /// pass over the pages, each locked only for its own part.
    /// With `epochs`, only holders of those epochs can be dropped, and
    /// pages holding none of them are skipped.
    pub(crate) fn remove_where(
        &self,
        epochs: Option<&EpochSet>,
        mut drop: impl FnMut(Holder) -> bool,
        mut removed: impl FnMut(Holder),
    ) {
        let mut place = self.place.lock();
        let pages = self.pages.len();
        let mut dead = Doomed::default();
        for n in 0..pages {
            {
                let Some(page) = self.pages.get(n) else {
                    continue;
                };
                if epochs.is_some_and(|e| !page.read().may_hold(e)) {
                    continue;
                }
                let mut page = page.write();
                for offset in 0..page.len() {
                    let key = page.key(offset);
                    if page.remove_holders(offset, &mut drop, &mut removed)
                        && let Some(key) = key
                    {
                        dead.add(hash(key), rec_id(n, offset));
                        place.dead += 1;
                    }
                }
                page.recount_epochs();
                if page.live() == 0 && page.len() > 0 {
                    place.emptied.push(n);
                    dead.emptied(n);
                }
            }
        }
        // Keys of dead records stay published until here (readers check
        // liveness), so that a large pass sweeps the tables once.
        let _ = self.withdraw(&mut place.sole, dead);
    }

    /// Records appended and not yet freed, and live records (for tests and
    /// the memory figures).
    #[cfg(test)]
    pub(crate) fn record_counts(&self) -> (usize, usize) {
        self.pages
            .iter()
            .map(|(_, p)| p)
            .map(|p| {
                let p = p.read();
                (p.len(), p.live())
            })
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// The writer's running counts of records and live records (which
    /// must agree with [`Store::record_counts`]).
    #[cfg(test)]
    pub(crate) fn counted(&self) -> (usize, usize) {
        let place = self.place.lock();
        (place.records, place.records - place.dead)
    }

    /// Records moved by compaction, since start.
    pub(crate) fn relocations(&self) -> u64 {
        self.relocations.load(Ordering::Relaxed)
    }

    /// Heap bytes of the record pages (with the page directory and the
    /// writer's page lists) and of the key tables. Walks every page and
    /// shard, one lock at a time: for scrapes, not for the write path.
    /// Exact when no writes run meanwhile; otherwise off by the pages that
    /// changed during the walk.
    pub(crate) fn heap_bytes(&self) -> (usize, usize) {
        let lists = {
            let place = self.place.lock();
            [&place.ready, &place.free, &place.emptied, &place.refill]
                .iter()
                .map(|l| l.capacity() * size_of::<usize>())
                .sum::<usize>()
                + place.scratch.heap_bytes()
        };
        // One page's read lock at a time.
        let records = self.pages.heap_bytes()
            + self
                .pages
                .iter()
                .map(|(_, p)| p.read().heap_bytes())
                .sum::<usize>();
        let keys = self.keys.len() * size_of::<KeyTable>()
            + self.keys.iter().map(KeyTable::heap_bytes).sum::<usize>()
            + self.firsts.heap_bytes();
        (records + lists, keys)
    }

    /// Keys that found no room in their buckets (in overflow slots or a
    /// spill list: searches of their tables read those too).
    pub(crate) fn overflowed_keys(&self) -> usize {
        self.keys.iter().map(KeyTable::overflowed).sum()
    }

    /// Rebuilds of the first-block filter so far.
    pub(crate) fn firsts_rebuilds(&self) -> u64 {
        self.place.lock().firsts.rebuilds
    }

    /// Heap bytes of the first-block filter (fixed at start from the
    /// record capacity; also counted in [`Self::heap_bytes`]' key part).
    pub(crate) fn firsts_bytes(&self) -> usize {
        self.firsts.heap_bytes()
    }

    /// Keys published.
    #[cfg(test)]
    pub(crate) fn key_count(&self) -> usize {
        self.keys.iter().map(KeyTable::len).sum()
    }
}

#[cfg(test)]
mod tests;
