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
//! Because the tables are read without a lock they are never reallocated:
//! each is allocated once, on its first key, at the size its share of the
//! index's capacity needs. The index runs up to a sixteenth over capacity
//! before it evicts, so a table is sized for 17/16 of its share plus slack
//! (about 90 % full at capacity, 95 % at the overshoot's peak): some
//! 7.3 bytes of table per entry of capacity, reserved whether or not the
//! index is full; the tables do not shrink when the index empties.
//!
//! A bucket keeps its ten tags together (words 0–2, the occupancy mask in
//! word 2's upper half), then the ten record ids (words 3–7), so that
//! matching a tag, counting or finding free slots are a few register
//! operations rather than a walk over the slots.
//!
//! Buckets come from the tag alone (scaled to the table's size), so a table
//! tells apart at most 2^16 tags, and the keys of one bucket share the
//! tag's top bits: the store keeps many small tables (one or two thousand
//! keys each, see [`crate::store`] and `KEYS_PER_TABLE`), where a probe
//! meets a foreign key with its tag only a few percent of the time (one
//! extra record read). Keys that cannot be placed in their buckets (only
//! when very many share a tag, or a table's share ran far over) wait in
//! [`OVERFLOW_SLOTS`] overflow slots read without a lock (a search looks
//! at them only while the table's overflow count is not zero); past those,
//! in a spill list behind a mutex, which only a table with that many
//! overflowed keys makes a search take.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering, fence};

use parking_lot::Mutex;

use crate::arena::RecId;
use crate::prefetch::prefetch;

/// Slots per bucket: ten 2-byte tags and ten 4-byte ids, plus a 2-byte
/// mask, fill a 64-byte line.
const BUCKET_SLOTS: usize = 10;
/// The occupancy mask of a full bucket.
const FULL: u16 = (1 << BUCKET_SLOTS) - 1;
const MIN_BUCKETS: usize = 2;
/// Residents moved, at most, to make room for one insert.
const MAX_KICKS: usize = 32;
/// Where word 2 keeps the occupancy mask.
const USED_SHIFT: u32 = 32;
/// Overflowed keys a table keeps where searches read them without a lock.
const OVERFLOW_SLOTS: usize = 8;
/// Marks an occupied overflow slot (whose word is `OCCUPIED | tag << 32 | rec`).
const OCCUPIED: u64 = 1 << 63;

/// The writer's token: only the holder of the store's placement mutex has
/// it, so a `&mut Sole` proves there is no other writer.
#[derive(Debug, Default)]
pub(crate) struct Sole(());

/// A key's tag and record id.
#[derive(Clone, Copy, Debug)]
struct KeySlot {
    tag: u16,
    rec: RecId,
}

/// One cache line of slots: tags in words 0–2 (four per word), the
/// occupancy mask in word 2's bits 32–41, record ids in words 3–7 (two per
/// word).
#[derive(Debug, Default)]
#[repr(C, align(64))]
struct Bucket {
    w: [AtomicU64; 8],
}

/// Bit `i` set for each 16-bit lane `i` of `w` equal to `tag`: four
/// compares in a few word operations (loads of atomics are not vectorised,
/// and a compare per slot doubled the writer's probes).
#[inline]
fn lanes_equal(w: u64, tag: u16) -> u16 {
    const ONES: u64 = 0x0001_0001_0001_0001;
    const HIGH: u64 = 0x8000_8000_8000_8000;
    let x = w ^ (u64::from(tag) * ONES);
    // A lane's top bit ends up set unless the lane is zero; no carry
    // crosses lanes (at most 0x7fff + 0x7fff).
    let nonzero = ((x & !HIGH) + !HIGH) | x;
    let zero = !nonzero & HIGH;
    // Four bits, 16 apart, gathered.
    #[allow(clippy::cast_possible_truncation)]
    let m = ((zero >> 15) & 1 | (zero >> 30) & 2 | (zero >> 45) & 4 | (zero >> 60) & 8) as u16;
    m
}

fn tag_at(words: [u64; 3], i: usize) -> u16 {
    // A 16-bit lane.
    #[allow(clippy::cast_possible_truncation)]
    let t = (words[i / 4] >> ((i % 4) * 16)) as u16;
    t
}

impl Bucket {
    /// The occupancy mask (acquire: the slots it names are written).
    #[inline]
    fn used(&self) -> u16 {
        // Masked to ten bits.
        #[allow(clippy::cast_possible_truncation)]
        let m = (self.w[2].load(Ordering::Acquire) >> USED_SHIFT) as u16 & FULL;
        m
    }

    /// The occupied slots carrying `tag`, as a mask.
    #[inline]
    fn matching(&self, tag: u16) -> u16 {
        // Word 2 first (acquire): the slots its mask names are written.
        let w2 = self.w[2].load(Ordering::Acquire);
        // Masked to ten bits.
        #[allow(clippy::cast_possible_truncation)]
        let used = (w2 >> USED_SHIFT) as u16 & FULL;
        if used == 0 {
            return 0;
        }
        let w0 = self.w[0].load(Ordering::Relaxed);
        let w1 = self.w[1].load(Ordering::Relaxed);
        (lanes_equal(w0, tag) | lanes_equal(w1, tag) << 4 | (lanes_equal(w2, tag) & 0b11) << 8)
            & used
    }

    #[inline]
    fn rec(&self, i: usize) -> RecId {
        // A 32-bit half.
        #[allow(clippy::cast_possible_truncation)]
        let r = (self.w[3 + i / 2].load(Ordering::Relaxed) >> ((i % 2) * 32)) as RecId;
        r
    }

    fn slot(&self, i: usize) -> KeySlot {
        let words = [
            self.w[0].load(Ordering::Relaxed),
            self.w[1].load(Ordering::Relaxed),
            self.w[2].load(Ordering::Relaxed),
        ];
        KeySlot {
            tag: tag_at(words, i),
            rec: self.rec(i),
        }
    }

    /// Writes `slot` into slot `i` and marks it occupied, the mask last.
    fn put(&self, _: &mut Sole, i: usize, slot: KeySlot) {
        let r = &self.w[3 + i / 2];
        let shift = (i % 2) * 32;
        let old = r.load(Ordering::Relaxed);
        r.store(
            (old & !(0xffff_ffff << shift)) | (u64::from(slot.rec) << shift),
            Ordering::Relaxed,
        );
        let shift = (i % 4) * 16;
        let lane = !(0xffff_u64 << shift);
        let tag = u64::from(slot.tag) << shift;
        if i / 4 == 2 {
            let w = self.w[2].load(Ordering::Relaxed);
            self.w[2].store(
                (w & lane) | tag | (1 << (USED_SHIFT as usize + i)),
                Ordering::Release,
            );
        } else {
            let t = &self.w[i / 4];
            t.store((t.load(Ordering::Relaxed) & lane) | tag, Ordering::Relaxed);
            let w = self.w[2].load(Ordering::Relaxed);
            self.w[2].store(w | (1 << (USED_SHIFT as usize + i)), Ordering::Release);
        }
    }

    /// Clears the occupancy bits of `mask`.
    fn clear(&self, _: &mut Sole, mask: u16) {
        let w = self.w[2].load(Ordering::Relaxed);
        self.w[2].store(w & !(u64::from(mask) << USED_SHIFT), Ordering::Release);
    }

    fn free(&self) -> Option<usize> {
        let i = (!self.used() & FULL).trailing_zeros() as usize;
        (i < BUCKET_SLOTS).then_some(i)
    }

    fn count(&self) -> u32 {
        self.used().count_ones()
    }
}

/// The set bits of `mask`, lowest first.
fn bits(mut mask: u16) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let i = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        Some(i)
    })
}

/// The table.
#[derive(Debug, Default)]
pub(crate) struct KeyTable {
    /// Allocated on the first insert, never replaced.
    buckets: OnceLock<Box<[Bucket]>>,
    /// Buckets to allocate.
    size: usize,
    /// Odd while a key moves (a miss read meanwhile is not trusted).
    seq: AtomicU64,
    len: AtomicUsize,
    /// Keys no bucket had room for, read without a lock; 0 is a free slot.
    /// Allocated on the first overflow, so that the table's header (read
    /// by every search) stays small.
    overflow: OnceLock<Box<[AtomicU64; OVERFLOW_SLOTS]>>,
    /// Overflowed keys past those slots; `spill_len` mirrors its length so
    /// that searches lock it only when it holds something.
    spill: Mutex<Vec<KeySlot>>,
    spill_len: AtomicUsize,
    /// Overflowed keys, slots and spill list (zero: a search reads neither).
    overflow_len: AtomicUsize,
    /// Moves made (for the tests that race readers against them).
    #[cfg(test)]
    moves: AtomicUsize,
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
/// leave their tables emptier (the price of never reallocating).
fn buckets_for(keys: usize) -> usize {
    let peak = keys + keys / 16;
    let spread = 3 * peak.isqrt() / 2 + BUCKET_SLOTS;
    let slots = peak + peak / 40 + spread;
    slots.div_ceil(BUCKET_SLOTS).clamp(MIN_BUCKETS, 1 << 16)
}

/// The bucket of 16-bit hash `u` among `n`: its share of the range.
fn scaled(u: u16, n: usize) -> usize {
    (usize::from(u) * n) >> 16
}

/// Where a key sits: bucket and slot, overflow slot, or spill list index.
#[derive(Clone, Copy, Debug)]
enum At {
    Slot(usize, usize),
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

impl KeyTable {
    /// An empty table for at most about `keys` keys (allocated on its
    /// first insert).
    pub(crate) fn sized(keys: usize) -> Self {
        Self {
            size: buckets_for(keys),
            ..Self::default()
        }
    }

    /// The two buckets of `tag` among `n`.
    fn buckets_of(tag: u16, n: usize) -> [usize; 2] {
        [scaled(tag, n), scaled(other(tag), n)]
    }

    /// Entries.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Bytes this table holds on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.buckets
            .get()
            .map_or(0, |b| b.len() * size_of::<Bucket>())
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
        self.buckets.get().map_or(0, |b| b.len() * BUCKET_SLOTS)
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
        let Some(buckets) = self.buckets.get() else {
            return;
        };
        let [a, b] = Self::buckets_of(tag(h), buckets.len());
        prefetch(&buckets[a]);
        prefetch(&buckets[b]);
    }

    /// The first slot of hash `h` that `wanted` accepts, as a record id
    /// (no sequence check: see [`KeyTable::search`]).
    #[inline]
    fn probe(&self, h: u64, wanted: &mut impl FnMut(RecId) -> bool) -> Option<RecId> {
        let buckets = self.buckets.get()?;
        let t = tag(h);
        for bucket in Self::buckets_of(t, buckets.len()) {
            let found = &buckets[bucket];
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

    /// [`KeyTable::probe`], with a miss retried until no key moved while it
    /// was read (a hit was confirmed by `wanted`).
    #[inline]
    fn search(&self, h: u64, mut wanted: impl FnMut(RecId) -> bool) -> Option<RecId> {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if let Some(rec) = self.probe(h, &mut wanted) {
                return Some(rec);
            }
            fence(Ordering::Acquire);
            if before.is_multiple_of(2) && self.seq.load(Ordering::Relaxed) == before {
                return None;
            }
            std::hint::spin_loop();
        }
    }

    /// Whether some entry carries the tag of hash `h` (false: no key of
    /// that hash is here, without reading a record).
    #[inline]
    pub(crate) fn has_tag(&self, h: u64) -> bool {
        self.search(h, |_| true).is_some()
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
        let size = self.size;
        let buckets = self
            .buckets
            .get_or_init(|| (0..size).map(|_| Bucket::default()).collect());
        self.place(sole, buckets, KeySlot { tag: tag(h), rec });
        self.len.store(self.len() + 1, Ordering::Relaxed);
    }

    /// Puts `slot` in the emptier of its buckets; when both are full, moves
    /// residents to their other buckets to make room, and failing that adds
    /// it to the overflow list.
    fn place(&self, sole: &mut Sole, buckets: &[Bucket], mut slot: KeySlot) {
        let n = buckets.len();
        let [a, b] = Self::buckets_of(slot.tag, n);
        let target = if buckets[b].count() < buckets[a].count() {
            b
        } else {
            a
        };
        if let Some(free) = buckets[target].free() {
            buckets[target].put(sole, free, slot);
            return;
        }
        // Both full: evict a resident to its other bucket, and so on. The
        // evicted key is in no bucket until it lands: readers' misses wait.
        self.moving(sole);
        let mut bucket = target;
        for kick in 0..MAX_KICKS {
            // Vary the victim so that chains do not cycle.
            let victim = (usize::from(slot.tag) + kick) % BUCKET_SLOTS;
            let evicted = buckets[bucket].slot(victim);
            buckets[bucket].put(sole, victim, slot);
            slot = evicted;
            let [x, y] = Self::buckets_of(slot.tag, n);
            bucket = if x == bucket { y } else { x };
            if let Some(free) = buckets[bucket].free() {
                buckets[bucket].put(sole, free, slot);
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
        let buckets = self.buckets.get()?;
        let t = tag(h);
        for bucket in Self::buckets_of(t, buckets.len()) {
            let found = &buckets[bucket];
            if let Some(i) = bits(found.matching(t)).find(|&i| found.rec(i) == rec) {
                return Some(At::Slot(bucket, i));
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
            At::Slot(b, s) => {
                if let Some(buckets) = self.buckets.get() {
                    buckets[b].put(sole, s, slot);
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
            Some(At::Slot(b, s)) => {
                if let Some(buckets) = self.buckets.get() {
                    buckets[b].clear(sole, 1 << s);
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
        // A table is allocated at its full share whether it holds a key or
        // none: an empty one is not walked.
        if self.len() == 0 {
            return;
        }
        let mut removed = 0;
        for bucket in self.buckets.get().map_or(&[][..], |b| &b[..]) {
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
