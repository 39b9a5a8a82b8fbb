//! Block key → record id: cuckoo tables of cache-line buckets, each holding
//! ten slots of a 16-bit tag (the top bits of the key's hash) and a record
//! id. Keys themselves live in the records, so callers confirm a tag match
//! by reading the record.
//!
//! A key may sit in either of two buckets, both derived from its tag: a
//! search reads at most those two cache lines (whose loads overlap), an
//! insert takes a free slot in the emptier one (moving a resident to its
//! other bucket when both are full), and a removal just clears the slot's
//! bit in the bucket's occupancy mask.
//!
//! **Read without a lock.** The index has one writer at a time (the
//! store's placement mutex; every change here takes its [`Sole`] token),
//! so a table needs no lock: a bucket is eight `AtomicU64` words, the
//! writer publishes a slot by setting its occupancy bit last (a release
//! store) and a reader loads the mask first (acquire). A reader can then
//! see a slot torn only while it is being reused or moved, and it confirms
//! every hit by reading the record, so a torn slot costs at most a miss.
//! Misses are what a move could fake (a key in flight between its two
//! buckets, or a record re-pointed by compaction), so those bump the
//! table's sequence number (odd while they run) and a miss is only
//! answered when the sequence was even and unchanged around it.
//!
//! Because the tables are read without a lock they are never reallocated,
//! but they grow: a table starts at a sixteenth of the size its share of
//! the index's capacity needs and doubles when an insert would fill more
//! than 9/10 of it, so memory follows the contents (a freshly started
//! index allocates and faults in only what it fills). The buckets live in
//! segments, each allocated once and never moved: the first, then one per
//! doubling as large as the table before it. A bucket is picked by the
//! tag's low bits (within the first segment) and a few high bits (which
//! row of it), so a doubling sends each key either nowhere or to the one
//! new bucket of the new segment that mirrors its bucket: the writer
//! copies those keys there, publishes the new size in the sequence word
//! (made odd, release), clears the originals, and makes the sequence even
//! again. A reader takes the size and the sequence in one load, so it
//! probes one consistent size and retries a miss as for a move. The index
//! runs up to a sixteenth over capacity before it evicts, so a full table
//! is sized for 17/16 of its share plus slack (about 90 % full at
//! capacity, 95 % at the overshoot's peak): some 7.3 bytes of table per
//! entry at capacity, 7–14 bytes per key below it; the tables do not
//! shrink when the index empties.
//!
//! A bucket (see [`bucket`]) keeps its ten tags together (words 0–2, the
//! occupancy mask in word 2's upper half), then the ten record ids (words
//! 3–7), so that matching a tag, counting or finding free slots are a few
//! register operations rather than a walk over the slots.
//!
//! Buckets come from the tag alone (so growing reads no record), so a
//! table tells apart at most 2^16 tags, and the keys of one bucket share
//! most of the tag's bits: the store keeps many small tables (one or two thousand
//! keys each, see [`crate::store`] and `KEYS_PER_TABLE`), where a probe
//! meets a foreign key with its tag only a few percent of the time (one
//! extra record read). Keys that cannot be placed in their buckets (only
//! when very many share a tag, or a table's share ran far over) wait in
//! [`OVERFLOW_SLOTS`] overflow slots read without a lock (a search looks
//! at them only while the table's overflow count is not zero); past those,
//! in a spill list behind a mutex, which only a table with that many
//! overflowed keys makes a search take. A doubling moves them to their
//! buckets where these now have room (within its odd spell), so keys
//! crowded out of a small table do not keep misses on the cold path.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

use parking_lot::Mutex;

use crate::arena::RecId;
use crate::prefetch::prefetch;

mod bucket;

use bucket::{BUCKET_SLOTS, Bucket, KeySlot, bits};

const MIN_BUCKETS: usize = 2;
/// Residents moved, at most, to make room for one insert.
const MAX_KICKS: usize = 32;
/// Overflowed keys a table keeps where searches read them without a lock.
const OVERFLOW_SLOTS: usize = 8;
/// Marks an occupied overflow slot (whose word is `OCCUPIED | tag << 32 | rec`).
const OCCUPIED: u64 = 1 << 63;
/// Doublings from a table's first size to its full one (it starts at a
/// sixteenth, or at [`MIN_FIRST`] buckets if that is more).
const DOUBLINGS: u32 = 4;
/// Tag bits that pick a bucket within a row (the rest pick the row).
const ROW_BITS: u32 = 16 - DOUBLINGS;
/// Row q's segment (its bit length: segment s > 0 holds rows 2^(s-1) to
/// 2^s - 1) and its row within the segment, looked up rather than
/// computed on every probe.
const ROW_PLACE: [(u8, u8); 1 << DOUBLINGS] = {
    let mut t = [(0, 0); 1 << DOUBLINGS];
    let mut q = 1;
    while q < t.len() {
        let s = usize::BITS - q.leading_zeros();
        // At most 2^DOUBLINGS rows: fits a byte.
        #[allow(clippy::cast_possible_truncation)]
        let place = (s as u8, (q - (1 << (s - 1))) as u8);
        t[q] = place;
        q += 1;
    }
    t
};
/// The fewest buckets a table starts with.
const MIN_FIRST: usize = 2;
/// A table doubles when an insert would fill more than 9/10 of its slots.
const GROW_NUM: usize = 9;
const GROW_DEN: usize = 10;
/// The sequence word keeps the doublings made above this bit (the count
/// below it), so that one load gives a reader both.
const SIZE_SHIFT: u32 = 56;
const COUNT_MASK: u64 = (1 << SIZE_SHIFT) - 1;

/// The writer's token: only the holder of the store's placement mutex has
/// it, so a `&mut Sole` proves there is no other writer.
#[derive(Debug, Default)]
pub(crate) struct Sole(());

/// A bucket's place: `r` within a segment row, `q` the row (see
/// [`KeyTable::home`]).
type Home = (usize, usize);

/// The table.
#[derive(Debug, Default)]
#[repr(C)]
pub(crate) struct KeyTable {
    /// Odd while keys move (a miss read meanwhile is not trusted); the
    /// doublings made so far above [`SIZE_SHIFT`].
    seq: AtomicU64,
    /// Overflowed keys, slots and spill list (zero: a search reads neither).
    overflow_len: AtomicUsize,
    /// Buckets of the first segment (the table starts with these).
    first: usize,
    /// Segment 0 holds the first `first` buckets, segment `s > 0` the
    /// `first << (s - 1)` added by the `s`-th doubling: each allocated
    /// once, before the doubling is published, and never moved.
    segments: [OnceLock<Box<[Bucket]>>; DOUBLINGS as usize + 1],
    /// Doublings this table may make (fewer than [`DOUBLINGS`] when small).
    doublings: u32,
    len: AtomicUsize,
    /// Keys no bucket had room for, read without a lock; 0 is a free slot.
    /// Allocated on the first overflow, so that the table's header (read
    /// by every search) stays small.
    overflow: OnceLock<Box<[AtomicU64; OVERFLOW_SLOTS]>>,
    /// Overflowed keys past those slots; `spill_len` mirrors its length so
    /// that searches lock it only when it holds something.
    spill: Mutex<Vec<KeySlot>>,
    spill_len: AtomicUsize,
    /// Moves made (for the tests that race readers against them).
    #[cfg(test)]
    moves: AtomicUsize,
    /// Doublings made (for the tests that race readers against them).
    #[cfg(test)]
    grown: AtomicUsize,
}

/// The tag of a hash.
fn tag(h: u64) -> u16 {
    // The top 16 bits (the store picks tables with lower ones).
    #[allow(clippy::cast_possible_truncation)]
    let t = (h >> 48) as u16;
    t
}

/// The tag mixed, for the second bucket.
fn other(tag: u16) -> u16 {
    // The high half of a 32-bit product: 16 bits.
    #[allow(clippy::cast_possible_truncation)]
    let t = (u32::from(tag).wrapping_mul(0x9e37_79b1) >> 16) as u16;
    t
}

/// Buckets for a table whose share of a full index is `keys`: the index
/// holds up to 17/16 of its capacity before it evicts, so 17/16 of the
/// share, a fortieth more, plus one and a half standard deviations of a
/// hash's share: a table then runs at most about 95 % full (two choices of
/// ten slots place keys past 97 %; the overflow slots take what they
/// cannot). Sized by entries, not keys: blocks shared by several replicas
/// leave their tables emptier.
fn buckets_for(keys: usize) -> usize {
    let peak = keys + keys / 16;
    let spread = 3 * peak.isqrt() / 2 + BUCKET_SLOTS;
    let slots = peak + peak / 40 + spread;
    slots.div_ceil(BUCKET_SLOTS).clamp(MIN_BUCKETS, 1 << 16)
}

/// Where a key sits: bucket and slot, overflow slot, or spill list index.
#[derive(Clone, Copy, Debug)]
enum At {
    Slot(Home, usize),
    Overflow(usize),
    Spill(usize),
}

/// An overflow slot's word for `slot`.
fn packed(slot: KeySlot) -> u64 {
    OCCUPIED | u64::from(slot.tag) << 32 | u64::from(slot.rec)
}

/// The key an overflow slot's word holds, if any.
fn unpacked(w: u64) -> Option<KeySlot> {
    // The fields packed by `packed`.
    #[allow(clippy::cast_possible_truncation)]
    let slot = KeySlot {
        tag: (w >> 32) as u16,
        rec: w as RecId,
    };
    (w & OCCUPIED != 0).then_some(slot)
}

/// The doublings a sequence word records.
fn size_of_seq(seq: u64) -> u32 {
    // The top byte.
    #[allow(clippy::cast_possible_truncation)]
    let d = (seq >> SIZE_SHIFT) as u32;
    d
}

impl KeyTable {
    /// An empty table for at most about `keys` keys (its first, small
    /// segment allocated on its first insert; see the module docs).
    pub(crate) fn sized(keys: usize) -> Self {
        let full = buckets_for(keys);
        let mut doublings = DOUBLINGS;
        while doublings > 0 && full >> doublings < MIN_FIRST {
            doublings -= 1;
        }
        let first = full.div_ceil(1 << doublings);
        Self {
            first,
            doublings,
            ..Self::default()
        }
    }

    /// The bucket of 16-bit hash `x` after `d` doublings: the low
    /// [`ROW_BITS`] bits pick one of the first segment's `first` buckets
    /// (scaled), the next `d` bits the row, so that a doubling sends each
    /// key of bucket `(r, q)` to `(r, q)` or `(r, q + 2^d)`, which is in
    /// the new segment. (Constant shifts: a table that doubles fewer
    /// times leaves the top bits unused.)
    #[inline]
    fn home(&self, x: u16, d: u32) -> Home {
        let x = usize::from(x);
        let r = ((x & ((1 << ROW_BITS) - 1)) * self.first) >> ROW_BITS;
        let q = (x >> ROW_BITS) & ((1 << d) - 1);
        (r, q)
    }

    /// The two buckets of `tag` after `d` doublings.
    #[inline]
    fn homes(&self, tag: u16, d: u32) -> [Home; 2] {
        [self.home(tag, d), self.home(other(tag), d)]
    }

    /// The bucket at `home`, if its segment is allocated.
    #[inline]
    fn at(&self, (r, q): Home) -> Option<&Bucket> {
        let (s, k) = ROW_PLACE[q % ROW_PLACE.len()];
        self.segments
            .get(usize::from(s))?
            .get()?
            .get(r + self.first * usize::from(k))
    }

    /// Doublings made (the writer's view; readers take theirs from `seq`).
    fn doubled(&self) -> u32 {
        size_of_seq(self.seq.load(Ordering::Relaxed))
    }

    /// Buckets allocated.
    fn bucket_count(&self) -> usize {
        self.segments
            .iter()
            .filter_map(OnceLock::get)
            .map(|s| s.len())
            .sum()
    }

    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Bytes this table holds on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.bucket_count() * size_of::<Bucket>()
            + self
                .overflow
                .get()
                .map_or(0, |_| size_of::<[AtomicU64; OVERFLOW_SLOTS]>())
            + self.spill.lock().capacity() * size_of::<KeySlot>()
    }

    /// The overflow slots (none before the first overflow).
    fn overflow_slots(&self) -> &[AtomicU64] {
        self.overflow.get().map_or(&[], |b| &b[..])
    }

    /// Slots [`KeyTable::remove_all`] walks: every slot of a table holding
    /// keys, none of an empty one.
    pub(crate) fn swept_slots(&self) -> usize {
        if self.len() == 0 {
            return 0;
        }
        self.bucket_count() * BUCKET_SLOTS
    }

    /// Keys in overflow slots or the spill list (not in their buckets).
    pub(crate) fn overflowed(&self) -> usize {
        self.overflow_len.load(Ordering::Relaxed)
    }

    /// The overflowed key of tag `t` that `wanted` accepts: the slots
    /// without a lock, the spill list (rarely non-empty) with its mutex.
    #[cold]
    fn probe_overflow(&self, t: u16, wanted: &mut impl FnMut(RecId) -> bool) -> Option<RecId> {
        for w in self.overflow_slots() {
            if let Some(s) = unpacked(w.load(Ordering::Acquire))
                && s.tag == t
                && wanted(s.rec)
            {
                return Some(s.rec);
            }
        }
        if self.spill_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.spill
            .lock()
            .iter()
            .find(|s| s.tag == t && wanted(s.rec))
            .map(|s| s.rec)
    }

    /// Starts loading both buckets of hash `h`, so that their cache lines
    /// are on their way before [`KeyTable::find`] needs them.
    pub(crate) fn prefetch(&self, h: u64) {
        let d = size_of_seq(self.seq.load(Ordering::Relaxed));
        for home in self.homes(tag(h), d) {
            if let Some(b) = self.at(home) {
                prefetch(b);
            }
        }
    }

    /// The first slot of hash `h` that `wanted` accepts after `d`
    /// doublings, as a record id (no sequence check: see
    /// [`KeyTable::search`]).
    #[inline]
    fn probe(&self, h: u64, d: u32, wanted: &mut impl FnMut(RecId) -> bool) -> Option<RecId> {
        let t = tag(h);
        let [a, b] = self.homes(t, d);
        // Not allocated: the table never held a key.
        let (a, b) = (self.at(a)?, self.at(b)?);
        for found in [a, b] {
            for i in bits(found.matching(t)) {
                let rec = found.rec(i);
                if wanted(rec) {
                    return Some(rec);
                }
            }
        }
        if self.overflow_len.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.probe_overflow(t, wanted)
    }

    /// [`KeyTable::probe`] at the size the sequence word names, with a
    /// miss retried until no key moved (nor the table grew) while it was
    /// read (a hit was confirmed by `wanted`).
    #[inline]
    fn search(&self, h: u64, mut wanted: impl FnMut(RecId) -> bool) -> Option<RecId> {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if let Some(rec) = self.probe(h, size_of_seq(before), &mut wanted) {
                return Some(rec);
            }
            fence(Ordering::Acquire);
            if before.is_multiple_of(2) && self.seq.load(Ordering::Relaxed) == before {
                return None;
            }
            std::hint::spin_loop();
        }
    }

    /// The record of some entry carrying the tag of hash `h` (`None`: no
    /// key of that hash is here, found without reading a record). Not
    /// confirmed: the caller checks the record's key.
    #[inline]
    pub(crate) fn tagged(&self, h: u64) -> Option<RecId> {
        self.search(h, |_| true)
    }

    /// The record with hash `h` that `is_it` confirms.
    #[inline]
    pub(crate) fn find(&self, h: u64, is_it: impl FnMut(RecId) -> bool) -> Option<RecId> {
        self.search(h, is_it)
    }

    /// Marks the start of a move (readers' misses meanwhile are retried).
    fn moving(&self, _: &mut Sole) {
        #[cfg(test)]
        self.moves.fetch_add(1, Ordering::Relaxed);
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    /// Marks the end of a move.
    fn moved(&self, _: &mut Sole) {
        let s = self.seq.load(Ordering::Relaxed);
        self.seq.store(s + 1, Ordering::Release);
    }

    /// Adds `rec` under hash `h` (the caller knows its key is absent).
    pub(crate) fn insert(&self, sole: &mut Sole, h: u64, rec: RecId) {
        let first = self.first;
        self.segments[0].get_or_init(|| (0..first).map(|_| Bucket::default()).collect());
        let d = self.doubled();
        let slots = (first << d) * BUCKET_SLOTS;
        if d < self.doublings && (self.len() + 1) * GROW_DEN > slots * GROW_NUM {
            self.grow(sole, d);
        }
        self.place(sole, KeySlot { tag: tag(h), rec });
        self.len.store(self.len() + 1, Ordering::Relaxed);
    }

    /// Doubles the table (from `d` doublings): the new segment is filled
    /// with copies of the keys whose bucket moves into it, then published
    /// (with the sequence made odd), then the originals are cleared, then
    /// the sequence is even again. A reader of the old size finds a key in
    /// its old bucket or retries its miss; one of the new size finds it
    /// in either (the copies were written before the size it read).
    fn grow(&self, sole: &mut Sole, d: u32) {
        let first = self.first;
        let rows = 1 << d;
        let new = &self.segments[d as usize + 1]
            .get_or_init(|| (0..first * rows).map(|_| Bucket::default()).collect());
        // Bucket (r, q) sends its movers to (r, q + rows): index
        // r + first * q of the new segment, into the same slot.
        let leaving = |home: Home, b: &Bucket| {
            let mut mask = 0u16;
            for i in bits(b.used()) {
                let t = b.slot(i).tag;
                let [x, y] = self.homes(t, d + 1);
                mask |= u16::from(x != home && y != home) << i;
            }
            mask
        };
        for q in 0..rows {
            for r in 0..first {
                let Some(b) = self.at((r, q)) else { continue };
                for i in bits(leaving((r, q), b)) {
                    new[r + first * q].put(sole, i, b.slot(i));
                }
            }
        }
        // Publish the size (release: the copies and the segment are
        // visible to a reader that sees it), odd for the clearing.
        #[cfg(test)]
        {
            self.moves.fetch_add(1, Ordering::Relaxed);
            self.grown.fetch_add(1, Ordering::Relaxed);
        }
        let s = self.seq.load(Ordering::Relaxed);
        let odd = ((s & COUNT_MASK) + 1) | u64::from(d + 1) << SIZE_SHIFT;
        self.seq.store(odd, Ordering::Release);
        fence(Ordering::Release);
        // The movers are the new bucket's keys (it took no other).
        for q in 0..rows {
            for r in 0..first {
                let Some(b) = self.at((r, q)) else { continue };
                let gone = new[r + first * q].used();
                if gone != 0 {
                    b.clear(sole, gone);
                }
            }
        }
        // Still odd: keys that overflowed while the table was small go to
        // their (now roomier) buckets, so misses stop taking the cold path.
        if self.overflowed() > 0 {
            self.replace_overflowed(sole, d + 1);
        }
        self.moved(sole);
    }

    /// The free slot of the emptier of `tag`'s buckets after `d`
    /// doublings, if either has one.
    fn room(&self, tag: u16, d: u32) -> Option<(&Bucket, usize)> {
        let [a, b] = self.homes(tag, d);
        let (a, b) = (self.at(a)?, self.at(b)?);
        let emptier = if b.count() < a.count() { b } else { a };
        emptier.free().map(|i| (emptier, i))
    }

    /// Moves overflowed keys into their buckets where these have a free
    /// slot (no kicks), each written there before it leaves its overflow
    /// slot. Only within an odd spell of the sequence: a reader that
    /// probed the bucket before the copy and the slot after its clearing
    /// retries its miss.
    fn replace_overflowed(&self, sole: &mut Sole, d: u32) {
        let mut placed = 0;
        for w in self.overflow_slots() {
            if let Some(slot) = unpacked(w.load(Ordering::Relaxed))
                && let Some((bucket, i)) = self.room(slot.tag, d)
            {
                bucket.put(sole, i, slot);
                w.store(0, Ordering::Release);
                placed += 1;
            }
        }
        if self.spill_len.load(Ordering::Relaxed) > 0 {
            let mut spill = self.spill.lock();
            let before = spill.len();
            spill.retain(|&slot| {
                let Some((bucket, i)) = self.room(slot.tag, d) else {
                    return true;
                };
                bucket.put(sole, i, slot);
                false
            });
            placed += before - spill.len();
            self.spill_len.store(spill.len(), Ordering::Release);
        }
        self.overflow_len
            .store(self.overflowed() - placed, Ordering::Release);
    }

    /// Puts `slot` in the emptier of its buckets; when both are full, moves
    /// residents to their other buckets to make room, and failing that adds
    /// it to the overflow list.
    fn place(&self, sole: &mut Sole, mut slot: KeySlot) {
        let d = self.doubled();
        let [a, b] = self.homes(slot.tag, d);
        // Segments 0..=d exist (insert allocates the first; grow the next
        // before it publishes d) and homes at d lie in them, so a missing
        // bucket is a bug here, never the input's doing.
        let (Some(ba), Some(bb)) = (self.at(a), self.at(b)) else {
            unreachable!("bucket {a:?} or {b:?} of a table doubled {d} times is not allocated");
        };
        let (target, mut bucket) = if bb.count() < ba.count() {
            (bb, b)
        } else {
            (ba, a)
        };
        if let Some(free) = target.free() {
            target.put(sole, free, slot);
            return;
        }
        // Both full: evict a resident to its other bucket, and so on. The
        // evicted key is in no bucket until it lands: readers' misses wait.
        self.moving(sole);
        for kick in 0..MAX_KICKS {
            let Some(here) = self.at(bucket) else { break };
            // Vary the victim so that chains do not cycle.
            let victim = (usize::from(slot.tag) + kick) % BUCKET_SLOTS;
            let evicted = here.slot(victim);
            here.put(sole, victim, slot);
            slot = evicted;
            let [x, y] = self.homes(slot.tag, d);
            bucket = if x == bucket { y } else { x };
            if let Some(there) = self.at(bucket)
                && let Some(free) = there.free()
            {
                there.put(sole, free, slot);
                self.moved(sole);
                return;
            }
        }
        if let Some(free) = self
            .overflow
            .get_or_init(Box::default)
            .iter()
            .find(|w| w.load(Ordering::Relaxed) & OCCUPIED == 0)
        {
            free.store(packed(slot), Ordering::Release);
        } else {
            let mut spill = self.spill.lock();
            spill.push(slot);
            self.spill_len.store(spill.len(), Ordering::Release);
        }
        self.overflow_len
            .store(self.overflowed() + 1, Ordering::Release);
        self.moved(sole);
    }

    fn position(&self, h: u64, rec: RecId) -> Option<At> {
        let t = tag(h);
        let d = self.doubled();
        // The second bucket worked out only when the first lacks the key.
        for x in [t, other(t)] {
            let home = self.home(x, d);
            let found = self.at(home)?;
            if let Some(i) = bits(found.matching(t)).find(|&i| found.rec(i) == rec) {
                return Some(At::Slot(home, i));
            }
        }
        if self.overflowed() == 0 {
            return None;
        }
        let wanted = KeySlot { tag: t, rec };
        if let Some(i) = self
            .overflow_slots()
            .iter()
            .position(|w| w.load(Ordering::Relaxed) == packed(wanted))
        {
            return Some(At::Overflow(i));
        }
        self.spill
            .lock()
            .iter()
            .position(|s| s.tag == t && s.rec == rec)
            .map(At::Spill)
    }

    /// Points the entry of `old` (hash `h`) at `new`; false if absent.
    pub(crate) fn relocate(&self, sole: &mut Sole, h: u64, old: RecId, new: RecId) -> bool {
        let Some(at) = self.position(h, old) else {
            return false;
        };
        // A reader that took `old` and finds its record dead retries.
        self.moving(sole);
        let slot = KeySlot {
            tag: tag(h),
            rec: new,
        };
        match at {
            At::Slot(home, s) => {
                if let Some(b) = self.at(home) {
                    b.put(sole, s, slot);
                }
            }
            At::Overflow(i) => self.overflow_slots()[i].store(packed(slot), Ordering::Release),
            At::Spill(i) => self.spill.lock()[i] = slot,
        }
        self.moved(sole);
        true
    }

    /// Removes the entry of `rec` (hash `h`); false if absent.
    pub(crate) fn remove(&self, sole: &mut Sole, h: u64, rec: RecId) -> bool {
        match self.position(h, rec) {
            Some(At::Slot(home, s)) => {
                if let Some(b) = self.at(home) {
                    b.clear(sole, 1 << s);
                }
            }
            Some(At::Overflow(i)) => {
                // Clearing a slot moves no other key: no sequence bump.
                self.overflow_slots()[i].store(0, Ordering::Release);
                self.overflow_len
                    .store(self.overflowed() - 1, Ordering::Release);
            }
            Some(At::Spill(i)) => {
                let mut spill = self.spill.lock();
                spill.swap_remove(i);
                self.spill_len.store(spill.len(), Ordering::Release);
                drop(spill);
                self.overflow_len
                    .store(self.overflowed() - 1, Ordering::Release);
            }
            None => return false,
        }
        self.len.store(self.len() - 1, Ordering::Relaxed);
        true
    }

    /// Removes every entry whose record `dead` names, in one pass over the
    /// table (cheaper than a probe each when they are many).
    pub(crate) fn remove_all(&self, sole: &mut Sole, dead: impl Fn(RecId) -> bool) {
        // The tables do not shrink: an empty one is not walked.
        if self.len() == 0 {
            return;
        }
        let mut removed = 0;
        // Segment by segment: a flattened iterator costs more per bucket.
        for segment in self.segments.iter().filter_map(OnceLock::get) {
            for bucket in segment.iter() {
                let used = bucket.used();
                if used == 0 {
                    continue;
                }
                // Every slot, used or not, without a branch per slot: a share
                // of dead keys scattered at random mispredicts a branch often
                // enough to double the sweep.
                let mut gone = 0u16;
                for i in 0..BUCKET_SLOTS {
                    gone |= u16::from(dead(bucket.rec(i))) << i;
                }
                gone &= used;
                if gone != 0 {
                    bucket.clear(sole, gone);
                    removed += gone.count_ones() as usize;
                }
            }
        }
        if self.overflowed() > 0 {
            let mut gone = 0;
            for w in self.overflow_slots() {
                if unpacked(w.load(Ordering::Relaxed)).is_some_and(|s| dead(s.rec)) {
                    w.store(0, Ordering::Release);
                    gone += 1;
                }
            }
            if self.spill_len.load(Ordering::Relaxed) > 0 {
                let mut spill = self.spill.lock();
                let before = spill.len();
                spill.retain(|s| !dead(s.rec));
                gone += before - spill.len();
                self.spill_len.store(spill.len(), Ordering::Release);
            }
            removed += gone;
            self.overflow_len
                .store(self.overflowed() - gone, Ordering::Release);
        }
        self.len.store(self.len() - removed, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
