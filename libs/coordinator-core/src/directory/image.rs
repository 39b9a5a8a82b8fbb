//! The directory's checkpoint image (checkpoint version 2): the compact
//! table written straight from its records in insertion order, and read
//! back by one linear scan into the same layout. Lists (LRU, L1 index)
//! refer to keys by their position in that order, which is their id once
//! loaded. Little-endian throughout:
//!
//! ```text
//! strings  u32 n, n × (u32 len, bytes)      models and salts, by id ("" = freed)
//! names    u32 n, n × (u32 len, bytes)      instances and backends, by id
//! keys     u64 n, n × (u32 len, hash bytes, u32 model, u32 salt, i64 kv_rank,
//!                      i64 object_group_id, u64 access_count, f64 last_access,
//!                      u32 m ≥ 1, m × (u64 size, u64 incarnation, u32 instance,
//!                      u32 backend, u8 tier (0 l1, 1 l2), u8 shared))
//! lru      u32 n, n × (u32 salt, u64 m, m × u32 position), oldest first
//! l1       u32 n, n × (u32 len, instance bytes, u64 m, m × u32 position)
//! bindings u64 n, n × (u32 len, hash bytes, i64 token_offset, u32 m, m × u32 token)
//! ```

use std::io::Read;

use super::table::{Id, Interner, KeyParts, Links, List, NIL, Name, Place};
use super::{Binding, KeyDirectory, tier_index};
use crate::{FastMap, FastSet, StorageLevel};

/// Why an image does not load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("directory image: {0}")]
pub struct ImageError(pub String);

fn bad(what: impl Into<String>) -> ImageError {
    ImageError(what.into())
}

// Sizes below which a count cannot be honest (caps reservations on a
// corrupt count).
const MIN_KEY: usize = 4 + 4 + 4 + 8 * 4 + 4 + 26;

fn put_u32(out: &mut Vec<u8>, v: usize) {
    out.extend_from_slice(&u32::try_from(v).unwrap_or(u32::MAX).to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len());
    out.extend_from_slice(b);
}

fn put_names(out: &mut Vec<u8>, names: &[Name]) {
    put_u32(out, names.len());
    for n in names {
        put_bytes(out, n.as_bytes());
    }
}

/// The image read from a byte source (a checkpoint file's frame, so a
/// restore never holds the whole image in memory) in chunks of its own, so
/// a field costs what it did from a slice. `len`, the image's length,
/// bounds every count and length read; the source is never read past it.
struct Reader<R> {
    src: R,
    /// Image bytes not yet pulled from `src`.
    src_left: usize,
    /// Pulled bytes; `buf[pos..]` not yet decoded.
    buf: Vec<u8>,
    pos: usize,
    /// Bytes decoded (for error messages).
    at: usize,
}

/// How much a reader pulls from its source at a time.
const CHUNK: usize = 64 * 1024;

impl<R: Read> Reader<R> {
    fn new(src: R, len: usize) -> Self {
        Self {
            src,
            src_left: len,
            buf: Vec::new(),
            pos: 0,
            at: 0,
        }
    }

    fn truncated(&self, what: &str) -> ImageError {
        bad(format!("truncated in {what} at byte {}", self.at))
    }

    /// Makes `n` bytes ready in `buf[pos..]`, pulling a chunk (or `n`, if
    /// larger) at a time; what is pulled grows with the bytes that arrive,
    /// never with a length a corrupt image claims.
    #[inline]
    fn want(&mut self, n: usize, what: &str) -> Result<(), ImageError> {
        if self.buf.len() - self.pos >= n {
            return Ok(());
        }
        self.refill(n, what)
    }

    /// [`Self::want`]'s slow path, out of line so the fast one inlines.
    #[cold]
    #[inline(never)]
    fn refill(&mut self, n: usize, what: &str) -> Result<(), ImageError> {
        if n > self.left() {
            return Err(self.truncated(what));
        }
        self.buf.drain(..self.pos);
        self.pos = 0;
        let target = n.max(CHUNK).min(self.buf.len() + self.src_left);
        while self.buf.len() < n {
            let more = target - self.buf.len();
            let got = (&mut self.src)
                .take(more as u64)
                .read_to_end(&mut self.buf)
                .map_err(|_| self.truncated(what))?;
            if got == 0 {
                return Err(self.truncated(what));
            }
            self.src_left -= got;
        }
        Ok(())
    }

    /// The next `n` bytes, lent until the next read.
    #[inline]
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], ImageError> {
        self.want(n, what)?;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        self.at += n;
        Ok(s)
    }

    fn left(&self) -> usize {
        self.buf.len() - self.pos + self.src_left
    }

    #[inline]
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ImageError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N, what)?);
        Ok(a)
    }

    #[inline]
    fn u8(&mut self, what: &str) -> Result<u8, ImageError> {
        Ok(self.take(1, what)?[0])
    }

    #[inline]
    fn u32(&mut self, what: &str) -> Result<u32, ImageError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    #[inline]
    fn len(&mut self, what: &str) -> Result<usize, ImageError> {
        Ok(self.u32(what)? as usize)
    }

    #[inline]
    fn u64(&mut self, what: &str) -> Result<u64, ImageError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    #[inline]
    fn i64(&mut self, what: &str) -> Result<i64, ImageError> {
        Ok(i64::from_le_bytes(self.array(what)?))
    }

    #[inline]
    fn f64(&mut self, what: &str) -> Result<f64, ImageError> {
        Ok(f64::from_le_bytes(self.array(what)?))
    }

    #[inline]
    fn bytes(&mut self, what: &str) -> Result<&[u8], ImageError> {
        let n = self.len(what)?;
        self.take(n, what)
    }

    fn str(&mut self, what: &str) -> Result<&str, ImageError> {
        std::str::from_utf8(self.bytes(what)?).map_err(|_| bad(format!("{what} is not UTF-8")))
    }

    fn names(&mut self, what: &str) -> Result<Vec<Name>, ImageError> {
        let n = self.len(what)?;
        let mut out = Vec::with_capacity(n.min(self.left() / 4));
        for _ in 0..n {
            out.push(Name::from(self.str(what)?));
        }
        Ok(out)
    }

    /// A u64 count of items of at least `min` bytes each.
    fn count(&mut self, min: usize, what: &str) -> Result<usize, ImageError> {
        let n = self.u64(what)?;
        let n = usize::try_from(n).map_err(|_| bad(format!("{what}: count {n}")))?;
        if n.saturating_mul(min) > self.left() {
            return Err(bad(format!("{what}: count {n} exceeds the image")));
        }
        Ok(n)
    }
}

impl KeyDirectory {
    /// Appends the directory's image to `out` (a linear pass over the
    /// records: the checkpoint's capture, done under the views lock).
    pub fn encode_image(&self, out: &mut Vec<u8>) {
        let t = &self.table;
        out.reserve(64 + t.len() * (MIN_KEY + 24));
        put_names(out, t.strings.slots());
        put_names(out, t.names.slots());
        let mut position = vec![NIL; t.recs.len()];
        put_u64(out, t.len() as u64);
        for (i, id) in t.walk(&self.order, Links::Order).enumerate() {
            position[id as usize] = u32::try_from(i).unwrap_or(NIL);
            let r = t.rec(id);
            put_bytes(out, t.hash_of(id));
            put_u32(out, r.model as usize);
            put_u32(out, r.salt as usize);
            out.extend_from_slice(&r.kv_rank.to_le_bytes());
            out.extend_from_slice(&r.object_group_id.to_le_bytes());
            put_u64(out, r.access_count);
            out.extend_from_slice(&r.last_access.to_le_bytes());
            let places = r.more.as_ref().map_or(1, |m| 1 + m.len());
            put_u32(out, places);
            for p in r.places() {
                put_u64(out, p.size_bytes);
                put_u64(out, p.incarnation);
                put_u32(out, p.instance as usize);
                put_u32(out, p.backend as usize);
                out.push(u8::from(p.tier == StorageLevel::L2));
                out.push(u8::from(p.shared));
            }
        }
        let pos = |id: Id| position[id as usize] as usize;
        put_u32(out, self.lru.len());
        for (&salt, list) in &self.lru {
            put_u32(out, salt as usize);
            put_u64(out, list.len as u64);
            for id in t.walk(list, Links::Lru) {
                put_u32(out, pos(id));
            }
        }
        put_u32(out, self.l1_by_instance.len());
        for (instance, ids) in &self.l1_by_instance {
            put_bytes(out, instance.as_bytes());
            put_u64(out, ids.len() as u64);
            for &id in ids {
                put_u32(out, pos(id));
            }
        }
        put_u64(out, self.bindings.len() as u64);
        for (hash, b) in &self.bindings {
            put_bytes(out, hash);
            out.extend_from_slice(&b.token_offset.to_le_bytes());
            put_u32(out, b.tokens.len());
            for t in &b.tokens {
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
    }

    /// Loads an image [`Self::encode_image`] wrote. Every id, count and
    /// position is checked: a corrupt image is an error, never a panic or
    /// a half-consistent directory.
    pub fn decode_image(raw: &[u8]) -> Result<Self, ImageError> {
        Self::read_image(raw, raw.len())
    }

    /// [`Self::decode_image`] from a reader of an image of `len` bytes
    /// (a checkpoint file's frame): the image is read as it is decoded.
    pub fn read_image<R: Read>(src: R, len: usize) -> Result<Self, ImageError> {
        let mut r = Reader::new(src, len);
        let strings = r.names("strings")?;
        let names = r.names("names")?;
        let (n_strings, n_names) = (strings.len(), names.len());
        let mut dir = KeyDirectory::new();
        dir.table.strings = Interner::loading(strings);
        dir.table.names =
            Interner::from_slots(names, vec![1; n_names]).ok_or_else(|| bad("names repeat"))?;
        let mut refs = vec![0u64; n_strings];
        let n = r.count(MIN_KEY, "keys")?;
        if n > super::MAX_KEYS {
            return Err(bad(format!(
                "keys: {n} exceeds the table's {}",
                super::MAX_KEYS
            )));
        }
        dir.table.reserve(n);
        let place = |r: &mut Reader<R>| -> Result<Place, ImageError> {
            let size_bytes = r.u64("placement")?;
            let incarnation = r.u64("placement")?;
            let instance = r.u32("placement")?;
            let backend = r.u32("placement")?;
            let tier = match r.u8("placement")? {
                0 => StorageLevel::L1,
                1 => StorageLevel::L2,
                t => return Err(bad(format!("placement tier {t}"))),
            };
            let shared = r.u8("placement")? != 0;
            if instance as usize >= n_names || backend as usize >= n_names {
                return Err(bad("placement name id out of range"));
            }
            Ok(Place {
                size_bytes,
                incarnation,
                instance,
                backend,
                tier,
                shared,
            })
        };
        let mut hash = Vec::new();
        for i in 0..n {
            hash.clear();
            hash.extend_from_slice(r.bytes("key hash")?);
            if i == 0 {
                // Both factors come from the file: the hash bytes still to
                // read cannot exceed what is left of it.
                let fit = r.left() / hash.len().max(1) + 1;
                dir.table.hashes.reserve(hash.len(), n.min(fit));
            }
            let (model, salt) = (r.u32("key")?, r.u32("key")?);
            if model as usize >= n_strings || salt as usize >= n_strings {
                return Err(bad(format!("key {i}: string id out of range")));
            }
            let (kv_rank, object_group_id) = (r.i64("key")?, r.i64("key")?);
            let (access_count, last_access) = (r.u64("key")?, r.f64("key")?);
            let m = r.len("key")?;
            if m == 0 {
                return Err(bad(format!("key {i} has no placement")));
            }
            let first = place(&mut r)?;
            let parts = KeyParts {
                hash: &hash,
                model,
                salt,
                kv_rank,
                object_group_id,
            };
            // Filed in the id tables once every record is in (file_all).
            let id = dir.table.push_unfiled(&parts, first);
            if id as usize != i {
                return Err(bad("ids out of order"));
            }
            refs[model as usize] += 1;
            refs[salt as usize] += 1;
            dir.count_place(&first);
            for _ in 1..m {
                let p = place(&mut r)?;
                if dir.table.rec(id).places().any(|q| q.same_identity(&p)) {
                    return Err(bad(format!("key {i} repeats a placement")));
                }
                dir.count_place(&p);
                dir.table.rec_mut(id).push_place(p);
            }
            let rec = dir.table.rec_mut(id);
            rec.access_count = access_count;
            rec.last_access = last_access;
            dir.table.push_back(&mut dir.order, Links::Order, id);
        }
        if !dir.table.file_all() {
            return Err(bad("a key repeats an earlier key"));
        }
        let slots = std::mem::take(&mut dir.table.strings).into_slots();
        dir.table.strings =
            Interner::from_slots(slots, refs).ok_or_else(|| bad("strings repeat"))?;
        // The L1 index and the LRU's membership follow from the records:
        // rebuilt here, the sections only checked against them (a list
        // trusted as written could leave a key filed twice or not at all,
        // and a later unlink or fence corrupt the directory).
        let mut l1: FastMap<String, FastSet<Id>> = FastMap::default();
        let mut l2_keys = 0usize;
        for id in 0..u32::try_from(n).map_err(|_| bad("keys: too many"))? {
            let rec = dir.table.rec(id);
            if rec.places().any(|p| p.tier == StorageLevel::L2) {
                l2_keys += 1;
            }
            for p in rec.places().filter(|p| p.private_l1()) {
                let name = &**dir.table.names.name(p.instance);
                l1.entry(name.to_owned()).or_default().insert(id);
            }
        }
        let position = |r: &mut Reader<R>, what: &str| -> Result<Id, ImageError> {
            let p = r.u32(what)?;
            if p as usize >= n {
                return Err(bad(format!("{what}: position {p} out of range")));
            }
            Ok(p)
        };
        let mut filed = 0usize;
        for _ in 0..r.len("lru")? {
            let salt = r.u32("lru")?;
            if dir.lru.contains_key(&salt) {
                return Err(bad(format!("lru: salt {salt} listed twice")));
            }
            let m = r.count(4, "lru")?;
            filed += m;
            let mut list = List::default();
            for _ in 0..m {
                let id = position(&mut r, "lru")?;
                let rec = dir.table.rec(id);
                if rec.in_lru()
                    || rec.salt != salt
                    || !rec.places().any(|p| p.tier == StorageLevel::L2)
                {
                    return Err(bad(format!("lru: key {id} does not belong")));
                }
                dir.table.push_back(&mut list, Links::Lru, id);
                dir.table.rec_mut(id).set_in_lru(true);
            }
            if list.len > 0 {
                dir.lru.insert(salt, list);
            }
        }
        if filed != l2_keys {
            return Err(bad(format!(
                "lru: {filed} keys filed, {l2_keys} keys have an L2 placement"
            )));
        }
        for _ in 0..r.len("l1")? {
            let instance = r.str("l1")?.to_owned();
            let instance = instance.as_str();
            if dir.l1_by_instance.contains_key(instance) {
                return Err(bad(format!("l1: instance {instance:?} listed twice")));
            }
            let ids = l1.remove(instance).unwrap_or_default();
            let m = r.count(4, "l1")?;
            if m != ids.len() {
                return Err(bad(format!(
                    "l1: instance {instance:?} lists {m} keys, holds {}",
                    ids.len()
                )));
            }
            for _ in 0..m {
                let id = position(&mut r, "l1")?;
                if !ids.contains(&id) {
                    return Err(bad(format!("l1: key {id} does not belong to {instance:?}")));
                }
            }
            dir.l1_by_instance.insert(instance.to_owned(), ids);
        }
        if let Some(instance) = l1.keys().next() {
            return Err(bad(format!("l1: instance {instance:?} missing")));
        }
        let bindings = r.count(16, "bindings")?;
        dir.bindings.reserve(bindings);
        for _ in 0..bindings {
            let hash = r.bytes("binding")?.to_vec();
            let token_offset = r.i64("binding")?;
            let m = r.len("binding")?;
            let raw = r.take(m.saturating_mul(4), "binding")?;
            let tokens = raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            dir.bindings.insert(
                hash,
                Binding {
                    token_offset,
                    tokens,
                },
            );
        }
        if r.left() != 0 {
            return Err(bad(format!("{} bytes after the bindings", r.left())));
        }
        Ok(dir)
    }

    fn count_place(&mut self, p: &Place) {
        let t = &mut self.totals[tier_index(p.tier)];
        t.count += 1;
        t.bytes = t.bytes.saturating_add(p.size_bytes);
    }
}

#[cfg(test)]
mod tests;
