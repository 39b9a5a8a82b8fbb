//! One cache line of a key table: ten 16-bit tags (words 0–2, four per
//! word), the occupancy mask (word 2's bits 32–41) and ten 32-bit record
//! ids (words 3–7, two per word), each word an `AtomicU64` so that readers
//! need no lock (see [`super`] for the protocol).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Sole;
use crate::arena::RecId;

/// Slots per bucket: ten 2-byte tags and ten 4-byte ids, plus a 2-byte
/// mask, fill a 64-byte line.
pub(super) const BUCKET_SLOTS: usize = 10;
/// The occupancy mask of a full bucket.
pub(super) const FULL: u16 = (1 << BUCKET_SLOTS) - 1;
/// Where word 2 keeps the occupancy mask.
const USED_SHIFT: u32 = 32;

/// A key's tag and record id.
#[derive(Clone, Copy, Debug)]
pub(super) struct KeySlot {
    pub(super) tag: u16,
    pub(super) rec: RecId,
}

/// One cache line of slots.
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub(super) struct Bucket {
    w: [AtomicU64; 8],
}

/// Bit `i` set for each of the ten tag lanes `i` of words 0–2 equal to
/// `tag` (bits 10–15 are junk: callers mask with the occupancy). SSE2 (in
/// every x86-64): two 8-lane compares, one pack, one mask move — a tenth
/// of the word-wise compare's instructions, and every probe of the
/// writer and of a lookup does it once or twice.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(super) fn tags_equal(w: [u64; 3], tag: u16) -> u16 {
    use std::arch::x86_64::{
        _mm_cmpeq_epi16, _mm_movemask_epi8, _mm_packs_epi16, _mm_set_epi64x, _mm_set1_epi16,
    };
    #[allow(unsafe_code)]
    // SAFETY: register arithmetic only (no memory is read or written); it
    // needs SSE2, which every x86_64 target has.
    let m = unsafe {
        let t = _mm_set1_epi16(tag.cast_signed());
        let lo = _mm_cmpeq_epi16(_mm_set_epi64x(w[1].cast_signed(), w[0].cast_signed()), t);
        let hi = _mm_cmpeq_epi16(_mm_set_epi64x(0, w[2].cast_signed()), t);
        // An equal lane is all ones, which packs (signed saturation) to a
        // byte of all ones: byte i of the pack is lane i.
        _mm_movemask_epi8(_mm_packs_epi16(lo, hi))
    };
    // The mask has 16 bits.
    #[allow(clippy::cast_possible_truncation)]
    let m = m.cast_unsigned() as u16;
    m
}

/// [`tags_equal`] word by word, where SSE2 is not to be had.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
pub(super) fn tags_equal(w: [u64; 3], tag: u16) -> u16 {
    lanes_equal(w[0], tag) | lanes_equal(w[1], tag) << 4 | (lanes_equal(w[2], tag) & 0b11) << 8
}

/// Bit `i` set for each 16-bit lane `i` of `w` equal to `tag`: four
/// compares in a few word operations (loads of atomics are not vectorised,
/// and a compare per slot doubled the writer's probes).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
#[inline]
pub(super) fn lanes_equal(w: u64, tag: u16) -> u16 {
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
    pub(super) fn used(&self) -> u16 {
        // Masked to ten bits.
        #[allow(clippy::cast_possible_truncation)]
        let m = (self.w[2].load(Ordering::Acquire) >> USED_SHIFT) as u16 & FULL;
        m
    }

    /// The occupied slots carrying `tag`, as a mask.
    #[inline]
    pub(super) fn matching(&self, tag: u16) -> u16 {
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
        tags_equal([w0, w1, w2], tag) & used
    }

    #[inline]
    pub(super) fn rec(&self, i: usize) -> RecId {
        // A 32-bit half.
        #[allow(clippy::cast_possible_truncation)]
        let r = (self.w[3 + i / 2].load(Ordering::Relaxed) >> ((i % 2) * 32)) as RecId;
        r
    }

    pub(super) fn slot(&self, i: usize) -> KeySlot {
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
    pub(super) fn put(&self, _: &mut Sole, i: usize, slot: KeySlot) {
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
    pub(super) fn clear(&self, _: &mut Sole, mask: u16) {
        let w = self.w[2].load(Ordering::Relaxed);
        self.w[2].store(w & !(u64::from(mask) << USED_SHIFT), Ordering::Release);
    }

    pub(super) fn free(&self) -> Option<usize> {
        let i = (!self.used() & FULL).trailing_zeros() as usize;
        (i < BUCKET_SLOTS).then_some(i)
    }

    pub(super) fn count(&self) -> u32 {
        self.used().count_ones()
    }
}

/// The set bits of `mask`, lowest first.
pub(super) fn bits(mut mask: u16) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if mask == 0 {
            return None;
        }
        let i = mask.trailing_zeros() as usize;
        mask &= mask - 1;
        Some(i)
    })
}
