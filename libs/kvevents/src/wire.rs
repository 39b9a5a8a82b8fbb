//! Decoding of the engines' KV-event payloads (the third ZMQ frame).
//!
//! Every producer in the field is accepted: the outer batch as a positional
//! array or a map; events as positional arrays of any historical length (vLLM
//! 5–12 elements, SGLang 6–8) or as maps tagged by `"type"`; block hashes as
//! unsigned or signed 64-bit integers or raw digests; unknown keys and extra
//! trailing elements ignored.
//!
//! A batch whose msgpack structure is broken is rejected whole. A structurally
//! sound batch with one bad event keeps its other events; the bad one is
//! returned in [`DecodedBatch::rejected`] so the caller can count it.

use crate::error::WireError;
use crate::extra::ExtraKey;
use crate::msgpack::{Item, Reader};

/// An engine's opaque block hash, normalised to 64 bits.
///
/// vLLM sends unsigned integers (often ≥ 2^63), SGLang and TensorRT-LLM
/// signed ones (reinterpreted bit for bit here), and vLLM with integer hashes
/// disabled the raw digest, folded to its last 8 bytes read big-endian (what
/// vLLM's integer mode sends for the same block). Meaningful only inside
/// one engine process: a type of its own, so it is never taken for a
/// [`crate::Fingerprint`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct EngineHash(pub u64);

/// One decoded batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodedBatch {
    /// Engine timestamp, seconds since the Unix epoch.
    pub ts: f64,
    /// Data-parallel rank of the publisher, when sent.
    pub data_parallel_rank: Option<u32>,
    /// The events that decoded, in order.
    pub events: Vec<KvEvent>,
    /// Events that could not be decoded: their index in the batch and why.
    pub rejected: Vec<(usize, WireError)>,
    /// The frame broke off after `events`, or a field beside them was bad:
    /// the first such error (the events kept are those read before it).
    pub damaged: Option<WireError>,
}

/// One engine event.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    /// Blocks were stored (computed, or loaded into a medium).
    BlockStored(BlockStored),
    /// Blocks left a medium.
    BlockRemoved(BlockRemoved),
    /// The engine dropped its whole prefix cache.
    AllBlocksCleared,
    /// An event class we do not know (forks add their own); ignored.
    Unknown(String),
}

/// Where a block lives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Medium {
    /// Accelerator memory (also assumed when an old engine sends none).
    Gpu,
    /// Any offload medium: vLLM `CPU`, SGLang `CPU_PINNED`, disks, …
    Offload(String),
}

impl Medium {
    fn parse(name: Option<&str>) -> Self {
        match name {
            None | Some("GPU" | "gpu" | "cuda" | "CUDA") => Medium::Gpu,
            Some(other) => Medium::Offload(other.to_owned()),
        }
    }

    /// Whether this is accelerator memory.
    pub fn is_gpu(&self) -> bool {
        matches!(self, Medium::Gpu)
    }
}

/// `BlockStored`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockStored {
    /// One hash per stored block, in prompt order.
    pub block_hashes: Vec<EngineHash>,
    /// Hash of the block before the first one, `None` at the prompt start.
    pub parent_block_hash: Option<EngineHash>,
    /// Tokens of all stored blocks, concatenated.
    pub token_ids: Vec<u32>,
    /// Tokens per block (0 from offload connectors that send no tokens).
    pub block_size: u32,
    /// LoRA adapter id.
    pub lora_id: Option<i64>,
    /// Where the blocks now live.
    pub medium: Medium,
    /// LoRA adapter name.
    pub lora_name: Option<String>,
    /// KV cache group (hybrid models).
    pub group_idx: Option<u32>,
    /// KV cache spec kind of the group (`full_attention`, `sliding_window`, …).
    pub kv_cache_spec_kind: Option<String>,
    /// Salt SGLang attaches to salted stores (0.5.18+).
    pub cache_salt: Option<String>,
    /// vLLM's per-block extra hash keys (0.17+), one entry per block (empty
    /// for a block without any); `None` when the event has none.
    pub extra_keys: Option<Vec<Vec<ExtraKey>>>,
}

/// `BlockRemoved`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockRemoved {
    /// Hashes of the removed blocks.
    pub block_hashes: Vec<EngineHash>,
    /// The medium they left.
    pub medium: Medium,
    /// KV cache group (hybrid models).
    pub group_idx: Option<u32>,
}

/// Whether a KV cache group describes prefix reuse: only the main attention
/// groups do; sliding-window, mamba and other state groups are skipped.
pub fn is_main_attention(kind: Option<&str>, group_idx: Option<u32>) -> bool {
    match kind {
        Some(kind) => matches!(
            kind,
            "full_attention" | "mla_attention" | "sink_full_attention"
        ),
        None => group_idx.is_none_or(|g| g == 0),
    }
}

impl BlockStored {
    /// See [`is_main_attention`].
    pub fn is_main_attention(&self) -> bool {
        is_main_attention(self.kv_cache_spec_kind.as_deref(), self.group_idx)
    }
}

impl BlockRemoved {
    /// Removals carry no spec kind; only group 0 (or none) is main attention.
    pub fn is_main_attention(&self) -> bool {
        is_main_attention(None, self.group_idx)
    }
}

/// Decodes one payload frame. A frame that breaks off, or carries a bad
/// field beside its events (timestamp, rank, trailing bytes), keeps the
/// events that decoded before the damage ([`DecodedBatch::damaged`] says
/// what it was); only a frame with no readable events array is an error.
pub fn decode_batch(payload: &[u8]) -> Result<DecodedBatch, WireError> {
    let mut r = Reader::new(payload);
    let mut batch = DecodedBatch::default();
    match r.next()? {
        Item::Array(len) => {
            if len < 2 {
                return Err(WireError::BadBatch("batch array has fewer than 2 elements"));
            }
            match beside(&mut r, &mut batch.damaged, read_ts) {
                Some(ts) => batch.ts = ts.unwrap_or(0.0),
                None => return Err(batch.damaged.unwrap_or(WireError::BadBatch("bad ts"))),
            }
            if let Err(error) = read_events(&mut r, &mut batch) {
                return damaged_events(batch, error);
            }
            if len >= 3 {
                match beside(&mut r, &mut batch.damaged, |r| {
                    read_opt_u32(r, "data_parallel_rank")
                }) {
                    Some(rank) => batch.data_parallel_rank = rank.flatten(),
                    None => return Ok(batch),
                }
            }
            for _ in 3..len {
                if beside(&mut r, &mut batch.damaged, Reader::skip).is_none() {
                    return Ok(batch);
                }
            }
        }
        Item::Map(len) => {
            let mut saw_events = false;
            for _ in 0..len {
                let key = match r.next() {
                    Ok(key) => key,
                    Err(error) if saw_events => {
                        batch.damaged.get_or_insert(error);
                        return Ok(batch);
                    }
                    Err(error) => return Err(error),
                };
                let read = match key {
                    Item::Str(b"ts") => beside(&mut r, &mut batch.damaged, read_ts)
                        .map(|ts| batch.ts = ts.unwrap_or(0.0)),
                    Item::Str(b"events") => {
                        if let Err(error) = read_events(&mut r, &mut batch) {
                            return damaged_events(batch, error);
                        }
                        saw_events = true;
                        Some(())
                    }
                    Item::Str(b"data_parallel_rank") => beside(&mut r, &mut batch.damaged, |r| {
                        read_opt_u32(r, "data_parallel_rank")
                    })
                    .map(|rank| batch.data_parallel_rank = rank.flatten()),
                    _ => beside(&mut r, &mut batch.damaged, Reader::skip).map(drop),
                };
                if read.is_none() {
                    if saw_events {
                        return Ok(batch);
                    }
                    return Err(batch.damaged.unwrap_or(WireError::BadBatch("bad field")));
                }
            }
            if !saw_events {
                return Err(WireError::BadBatch("batch map has no events"));
            }
        }
        other => return Err(WireError::type_mismatch("batch", "array or map", other)),
    }
    if r.remaining() != 0 {
        batch.damaged.get_or_insert(WireError::TrailingBytes {
            offset: r.position(),
        });
    }
    Ok(batch)
}

/// Reads one field beside a batch's events with `read`. A bad one is
/// skipped whole (so what follows stays aligned) and its error kept in
/// `damaged` (the first only): `Some(None)`. `None`: it could not be
/// skipped either, and the frame ends there. (Inlined: a call per field
/// cost every batch some 40 instructions, 0.3 % of a one-block batch's.)
#[inline(always)]
fn beside<'a, T>(
    r: &mut Reader<'a>,
    damaged: &mut Option<WireError>,
    read: impl FnOnce(&mut Reader<'a>) -> Result<T, WireError>,
) -> Option<Option<T>> {
    let start = r.clone();
    match read(r) {
        Ok(value) => Some(Some(value)),
        Err(error) => {
            *r = start;
            let skipped = r.skip().is_ok();
            damaged.get_or_insert(error);
            skipped.then_some(None)
        }
    }
}

/// A frame whose events array broke off: the events before the break are
/// kept; with none, the frame is an error.
fn damaged_events(mut batch: DecodedBatch, error: WireError) -> Result<DecodedBatch, WireError> {
    if batch.events.is_empty() && batch.rejected.is_empty() {
        return Err(error);
    }
    batch.damaged = Some(error);
    Ok(batch)
}

fn read_ts(r: &mut Reader<'_>) -> Result<f64, WireError> {
    match r.next()? {
        Item::Float(f) => Ok(f),
        // Integers are exact up to 2^53; timestamps are far below that.
        #[allow(clippy::cast_precision_loss)]
        Item::UInt(u) => Ok(u as f64),
        Item::Nil => Ok(0.0),
        other => Err(WireError::type_mismatch("ts", "number", other)),
    }
}

fn read_events(r: &mut Reader<'_>, batch: &mut DecodedBatch) -> Result<(), WireError> {
    let len = match r.next()? {
        Item::Array(n) => n,
        other => return Err(WireError::type_mismatch("events", "array", other)),
    };
    batch.events.reserve(len.min(1024));
    for index in 0..len {
        // Decode in one pass; if the event turns out to be bad, rewind and
        // skip it whole so one bad event cannot desynchronise the batch.
        let start = r.clone();
        match decode_event(r) {
            Ok(event) => batch.events.push(event),
            Err(error) => {
                *r = start;
                r.skip()?;
                batch.rejected.push((index, error));
            }
        }
    }
    Ok(())
}

/// Event classes we interpret.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tag {
    Stored,
    Removed,
    Cleared,
}

/// Fields a decoder may meet, whichever encoding carries them.
#[derive(Clone, Copy)]
enum Field {
    BlockHashes,
    ParentBlockHash,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    /// Position 7 of an array BlockStored: vLLM's lora_name, or SGLang
    /// 0.5.18–0.5.19's `{"cache_salt": …}` map.
    LoraNameOrSalt,
    GroupIdx,
    KvCacheSpecKind,
    CacheSalt,
    ExtraKeys,
    Ignored,
}

const STORED_LAYOUT: [Field; 10] = [
    Field::BlockHashes,
    Field::ParentBlockHash,
    Field::TokenIds,
    Field::BlockSize,
    Field::LoraId,
    Field::Medium,
    Field::LoraNameOrSalt,
    Field::ExtraKeys,
    Field::GroupIdx,
    Field::KvCacheSpecKind,
];
const REMOVED_LAYOUT: [Field; 3] = [Field::BlockHashes, Field::Medium, Field::GroupIdx];

/// Decoded fields of one event.
#[derive(Default)]
struct Fields {
    block_hashes: Option<Vec<EngineHash>>,
    parent_block_hash: Option<EngineHash>,
    token_ids: Option<Vec<u32>>,
    block_size: Option<u32>,
    lora_id: Option<i64>,
    medium: Option<Medium>,
    lora_name: Option<String>,
    group_idx: Option<u32>,
    kv_cache_spec_kind: Option<String>,
    cache_salt: Option<String>,
    extra_keys: Option<Vec<Vec<ExtraKey>>>,
}

/// The tag, or the unknown class name.
fn read_tag(r: &mut Reader<'_>) -> Result<Result<Tag, String>, WireError> {
    match r.next()? {
        Item::Str(b"BlockStored") => Ok(Ok(Tag::Stored)),
        Item::Str(b"BlockRemoved") => Ok(Ok(Tag::Removed)),
        Item::Str(b"AllBlocksCleared") => Ok(Ok(Tag::Cleared)),
        Item::Str(other) => std::str::from_utf8(other)
            .map(|s| Err(s.to_owned()))
            .map_err(|_| WireError::InvalidUtf8("event tag")),
        other => Err(WireError::type_mismatch("event tag", "string", other)),
    }
}

fn decode_event(r: &mut Reader<'_>) -> Result<KvEvent, WireError> {
    let mut f = Fields::default();
    let tag = match r.next()? {
        Item::Array(len) => {
            if len == 0 {
                return Err(WireError::BadEvent("empty event array"));
            }
            let tag = read_tag(r)?;
            let layout: &[Field] = match tag {
                Ok(Tag::Stored) => &STORED_LAYOUT,
                Ok(Tag::Removed) => &REMOVED_LAYOUT,
                _ => &[],
            };
            for i in 1..len {
                read_field(
                    r,
                    layout.get(i - 1).copied().unwrap_or(Field::Ignored),
                    &mut f,
                )?;
            }
            tag
        }
        Item::Map(len) => {
            let mut tag = None;
            for _ in 0..len {
                let before = r.clone();
                let field = match r.next()? {
                    Item::Str(b"type") => {
                        tag = Some(read_tag(r)?);
                        continue;
                    }
                    Item::Str(b"block_hashes") => Field::BlockHashes,
                    Item::Str(b"parent_block_hash") => Field::ParentBlockHash,
                    Item::Str(b"token_ids") => Field::TokenIds,
                    Item::Str(b"block_size") => Field::BlockSize,
                    Item::Str(b"lora_id") => Field::LoraId,
                    Item::Str(b"medium") => Field::Medium,
                    Item::Str(b"lora_name") => Field::LoraName,
                    Item::Str(b"group_idx") => Field::GroupIdx,
                    Item::Str(b"kv_cache_spec_kind") => Field::KvCacheSpecKind,
                    Item::Str(b"cache_salt") => Field::CacheSalt,
                    Item::Str(b"extra_keys") => Field::ExtraKeys,
                    Item::Str(_) => Field::Ignored,
                    _ => {
                        // A non-string key (never sent by engines): skip it
                        // whole, then its value below.
                        *r = before;
                        r.skip()?;
                        Field::Ignored
                    }
                };
                read_field(r, field, &mut f)?;
            }
            tag.ok_or(WireError::BadEvent("event has no type tag"))?
        }
        other => return Err(WireError::type_mismatch("event", "array or map", other)),
    };
    build_event(tag, f)
}

fn build_event(tag: Result<Tag, String>, f: Fields) -> Result<KvEvent, WireError> {
    match tag {
        Ok(Tag::Stored) => Ok(KvEvent::BlockStored(BlockStored {
            block_hashes: f
                .block_hashes
                .ok_or(WireError::MissingField("block_hashes"))?,
            parent_block_hash: f.parent_block_hash,
            token_ids: f.token_ids.unwrap_or_default(),
            block_size: f.block_size.unwrap_or(0),
            lora_id: f.lora_id,
            medium: f.medium.unwrap_or(Medium::Gpu),
            lora_name: f.lora_name,
            group_idx: f.group_idx,
            kv_cache_spec_kind: f.kv_cache_spec_kind,
            cache_salt: f.cache_salt,
            extra_keys: f.extra_keys,
        })),
        Ok(Tag::Removed) => Ok(KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: f
                .block_hashes
                .ok_or(WireError::MissingField("block_hashes"))?,
            medium: f.medium.unwrap_or(Medium::Gpu),
            group_idx: f.group_idx,
        })),
        Ok(Tag::Cleared) => Ok(KvEvent::AllBlocksCleared),
        Err(name) => Ok(KvEvent::Unknown(name)),
    }
}

fn read_field(r: &mut Reader<'_>, field: Field, f: &mut Fields) -> Result<(), WireError> {
    match field {
        Field::BlockHashes => f.block_hashes = Some(read_hashes(r)?),
        Field::ParentBlockHash => f.parent_block_hash = read_opt_hash(r)?,
        Field::TokenIds => f.token_ids = Some(read_tokens(r)?),
        Field::BlockSize => f.block_size = read_opt_u32(r, "block_size")?,
        Field::LoraId => f.lora_id = read_opt_i64(r, "lora_id")?,
        Field::Medium => f.medium = Some(read_medium(r)?),
        Field::LoraName => f.lora_name = read_opt_str(r, "lora_name")?,
        Field::CacheSalt => f.cache_salt = read_opt_str(r, "cache_salt")?,
        Field::GroupIdx => f.group_idx = read_opt_u32(r, "group_idx")?,
        Field::KvCacheSpecKind => f.kv_cache_spec_kind = read_opt_str(r, "kv_cache_spec_kind")?,
        Field::LoraNameOrSalt => {
            let mut probe = r.clone();
            if let Item::Map(len) = probe.next()? {
                *r = probe;
                for _ in 0..len {
                    match r.next()? {
                        Item::Str(b"cache_salt") => f.cache_salt = read_opt_str(r, "cache_salt")?,
                        _ => r.skip()?,
                    }
                }
            } else {
                f.lora_name = read_opt_str(r, "lora_name")?;
            }
        }
        Field::ExtraKeys => f.extra_keys = read_extra_keys(r)?,
        Field::Ignored => r.skip()?,
    }
    Ok(())
}

/// vLLM's `extra_keys`: nil, or one entry per block, each nil or a tuple
/// of keys. Strings are adapter names, multimodal identifiers or the salt;
/// `[identifier, offset]` pairs (vLLM 0.19+) are multimodal items whose
/// offset is dropped (see [`crate::extra`]); binaries are digests; anything
/// else is kept as its bytes.
fn read_extra_keys(r: &mut Reader<'_>) -> Result<Option<Vec<Vec<ExtraKey>>>, WireError> {
    let blocks = match r.next()? {
        Item::Nil => return Ok(None),
        Item::Array(n) => n,
        other => return Err(WireError::type_mismatch("extra_keys", "array", other)),
    };
    let mut out = Vec::with_capacity(blocks.min(r.remaining()));
    for _ in 0..blocks {
        let start = r.position();
        let keys = match r.next()? {
            Item::Nil => Vec::new(),
            Item::Array(n) => {
                let mut keys = Vec::with_capacity(n.min(r.remaining()));
                for _ in 0..n {
                    keys.push(read_extra_key(r)?);
                }
                keys
            }
            _ => {
                *r = Reader::at(r, start);
                vec![read_extra_key(r)?]
            }
        };
        out.push(keys);
    }
    Ok(Some(out))
}

fn read_extra_key(r: &mut Reader<'_>) -> Result<ExtraKey, WireError> {
    let start = r.position();
    let mut probe = r.clone();
    let key = match probe.next()? {
        Item::Str(s) => std::str::from_utf8(s)
            .map(|s| ExtraKey::Key(s.to_owned()))
            .map_err(|_| WireError::InvalidUtf8("extra_keys"))?,
        Item::Bin(b) => ExtraKey::Digest(b.to_vec()),
        Item::Array(2) => match (probe.next()?, probe.next()?) {
            (Item::Str(s), Item::UInt(_) | Item::NegInt(_)) => std::str::from_utf8(s)
                .map(|s| ExtraKey::Key(s.to_owned()))
                .map_err(|_| WireError::InvalidUtf8("extra_keys"))?,
            _ => {
                r.skip()?;
                return Ok(ExtraKey::Opaque(r.since(start).to_vec()));
            }
        },
        _ => {
            r.skip()?;
            return Ok(ExtraKey::Opaque(r.since(start).to_vec()));
        }
    };
    *r = probe;
    Ok(key)
}

fn hash_of(item: Item<'_>, field: &'static str) -> Result<EngineHash, WireError> {
    match item {
        Item::UInt(u) => Ok(EngineHash(u)),
        Item::NegInt(i) => Ok(EngineHash(u64::from_ne_bytes(i.to_ne_bytes()))),
        Item::Bin(bytes) | Item::Str(bytes) if !bytes.is_empty() => {
            let tail = &bytes[bytes.len().saturating_sub(8)..];
            let mut buf = [0u8; 8];
            buf[8 - tail.len()..].copy_from_slice(tail);
            Ok(EngineHash(u64::from_be_bytes(buf)))
        }
        other => Err(WireError::type_mismatch(field, "hash", other)),
    }
}

fn read_hashes(r: &mut Reader<'_>) -> Result<Vec<EngineHash>, WireError> {
    match r.next()? {
        Item::Array(n) => {
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                out.push(hash_of(r.next()?, "block_hashes")?);
            }
            Ok(out)
        }
        other => Err(WireError::type_mismatch("block_hashes", "array", other)),
    }
}

fn read_opt_hash(r: &mut Reader<'_>) -> Result<Option<EngineHash>, WireError> {
    match r.next()? {
        Item::Nil => Ok(None),
        item => hash_of(item, "parent_block_hash").map(Some),
    }
}

fn read_tokens(r: &mut Reader<'_>) -> Result<Vec<u32>, WireError> {
    match r.next()? {
        Item::Array(n) => {
            let mut out = Vec::with_capacity(n);
            for _ in 0..n {
                match r.next()? {
                    Item::UInt(u) => {
                        out.push(u32::try_from(u).map_err(|_| WireError::OutOfRange("token_ids"))?)
                    }
                    other => return Err(WireError::type_mismatch("token_ids", "integer", other)),
                }
            }
            Ok(out)
        }
        Item::Nil => Ok(Vec::new()),
        other => Err(WireError::type_mismatch("token_ids", "array", other)),
    }
}

fn read_opt_u32(r: &mut Reader<'_>, field: &'static str) -> Result<Option<u32>, WireError> {
    match r.next()? {
        Item::Nil => Ok(None),
        Item::UInt(u) => u32::try_from(u)
            .map(Some)
            .map_err(|_| WireError::OutOfRange(field)),
        other => Err(WireError::type_mismatch(
            field,
            "non-negative integer",
            other,
        )),
    }
}

fn read_opt_i64(r: &mut Reader<'_>, field: &'static str) -> Result<Option<i64>, WireError> {
    match r.next()? {
        Item::Nil => Ok(None),
        Item::UInt(u) => i64::try_from(u)
            .map(Some)
            .map_err(|_| WireError::OutOfRange(field)),
        Item::NegInt(i) => Ok(Some(i)),
        other => Err(WireError::type_mismatch(field, "integer", other)),
    }
}

fn read_str(r: &mut Reader<'_>, field: &'static str) -> Result<String, WireError> {
    match r.next()? {
        Item::Str(s) => std::str::from_utf8(s)
            .map(str::to_owned)
            .map_err(|_| WireError::InvalidUtf8(field)),
        other => Err(WireError::type_mismatch(field, "string", other)),
    }
}

/// The medium without allocating for the common GPU case.
fn read_medium(r: &mut Reader<'_>) -> Result<Medium, WireError> {
    match r.next()? {
        Item::Nil => Ok(Medium::Gpu),
        Item::Str(s) => std::str::from_utf8(s)
            .map(|s| Medium::parse(Some(s)))
            .map_err(|_| WireError::InvalidUtf8("medium")),
        other => Err(WireError::type_mismatch("medium", "string", other)),
    }
}

fn read_opt_str(r: &mut Reader<'_>, field: &'static str) -> Result<Option<String>, WireError> {
    let mut probe = r.clone();
    if probe.next()? == Item::Nil {
        *r = probe;
        return Ok(None);
    }
    read_str(r, field).map(Some)
}
