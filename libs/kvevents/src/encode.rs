//! Encoding of KV-event payloads exactly as the engines put them on the wire.
//!
//! Used by the simulated engines of the local fleet and by tests that play an
//! engine. Three eras are supported: vLLM ≤ 0.23 (positional arrays with
//! every field of that version), vLLM ≥ 0.24 (maps tagged by `"type"`, with
//! defaults omitted), and SGLang ≤ 0.5.19 (short positional arrays, signed
//! hashes). The outer batch is always the positional `[ts, events, rank]`.

use crate::extra::ExtraKey;
use crate::wire::{BlockRemoved, BlockStored, EngineHash, KvEvent, Medium};

/// Which engine release's encoding to produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Era {
    /// vLLM up to 0.23: 12-element array events.
    VllmArray,
    /// vLLM from 0.24: map events.
    VllmMap,
    /// SGLang up to 0.5.19: 7-element array events, signed hashes.
    SglangArray,
}

/// Encodes one batch.
pub fn encode_batch(era: Era, ts: f64, events: &[KvEvent], dp_rank: Option<u32>) -> Vec<u8> {
    let mut w = Writer::default();
    w.array(3);
    w.f64(ts);
    w.array(events.len());
    for event in events {
        match era {
            Era::VllmArray => vllm_array(&mut w, event),
            Era::VllmMap => vllm_map(&mut w, event),
            Era::SglangArray => sglang_array(&mut w, event),
        }
    }
    match dp_rank {
        Some(rank) => w.uint(u64::from(rank)),
        None => w.nil(),
    }
    w.buf
}

fn medium_name(m: &Medium) -> &str {
    match m {
        Medium::Gpu => "GPU",
        Medium::Offload(name) => name,
    }
}

fn vllm_array(w: &mut Writer, event: &KvEvent) {
    match event {
        KvEvent::BlockStored(s) => {
            w.array(12);
            w.str("BlockStored");
            w.hashes(&s.block_hashes, false);
            w.opt_hash(s.parent_block_hash, false);
            w.tokens(&s.token_ids);
            w.uint(u64::from(s.block_size));
            w.opt_i64(s.lora_id);
            w.str(medium_name(&s.medium));
            w.opt_str(s.lora_name.as_deref());
            w.extra_keys(s.extra_keys.as_deref());
            w.opt_u32(s.group_idx);
            w.opt_str(s.kv_cache_spec_kind.as_deref());
            w.nil(); // sliding window
        }
        KvEvent::BlockRemoved(r) => {
            w.array(4);
            w.str("BlockRemoved");
            w.hashes(&r.block_hashes, false);
            w.str(medium_name(&r.medium));
            w.opt_u32(r.group_idx);
        }
        KvEvent::AllBlocksCleared => {
            w.array(1);
            w.str("AllBlocksCleared");
        }
        KvEvent::Unknown(tag) => {
            w.array(1);
            w.str(tag);
        }
    }
}

fn vllm_map(w: &mut Writer, event: &KvEvent) {
    match event {
        KvEvent::BlockStored(s) => {
            let optional = usize::from(s.group_idx.is_some_and(|g| g != 0))
                + usize::from(s.kv_cache_spec_kind.is_some())
                + usize::from(s.extra_keys.is_some());
            w.map(8 + optional);
            w.str("type");
            w.str("BlockStored");
            w.str("block_hashes");
            w.hashes(&s.block_hashes, false);
            w.str("parent_block_hash");
            w.opt_hash(s.parent_block_hash, false);
            w.str("token_ids");
            w.tokens(&s.token_ids);
            w.str("block_size");
            w.uint(u64::from(s.block_size));
            w.str("lora_id");
            w.opt_i64(s.lora_id);
            w.str("medium");
            w.str(medium_name(&s.medium));
            w.str("lora_name");
            w.opt_str(s.lora_name.as_deref());
            if let Some(keys) = &s.extra_keys {
                w.str("extra_keys");
                w.extra_keys(Some(keys));
            }
            if let Some(g) = s.group_idx.filter(|g| *g != 0) {
                w.str("group_idx");
                w.uint(u64::from(g));
            }
            if let Some(kind) = &s.kv_cache_spec_kind {
                w.str("kv_cache_spec_kind");
                w.str(kind);
            }
        }
        KvEvent::BlockRemoved(r) => {
            let optional = usize::from(r.group_idx.is_some_and(|g| g != 0));
            w.map(3 + optional);
            w.str("type");
            w.str("BlockRemoved");
            w.str("block_hashes");
            w.hashes(&r.block_hashes, false);
            w.str("medium");
            w.str(medium_name(&r.medium));
            if let Some(g) = r.group_idx.filter(|g| *g != 0) {
                w.str("group_idx");
                w.uint(u64::from(g));
            }
        }
        KvEvent::AllBlocksCleared => {
            w.map(1);
            w.str("type");
            w.str("AllBlocksCleared");
        }
        KvEvent::Unknown(tag) => {
            w.map(1);
            w.str("type");
            w.str(tag);
        }
    }
}

fn sglang_array(w: &mut Writer, event: &KvEvent) {
    match event {
        KvEvent::BlockStored(s) => {
            // A salted store (0.5.18+) carries an eighth element.
            w.array(if s.cache_salt.is_some() { 8 } else { 7 });
            w.str("BlockStored");
            w.hashes(&s.block_hashes, true);
            w.opt_hash(s.parent_block_hash, true);
            w.tokens(&s.token_ids);
            w.uint(u64::from(s.block_size));
            w.opt_i64(s.lora_id);
            w.str(medium_name(&s.medium));
            if let Some(salt) = &s.cache_salt {
                w.map(1);
                w.str("cache_salt");
                w.str(salt);
            }
        }
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes,
            medium,
            ..
        }) => {
            w.array(3);
            w.str("BlockRemoved");
            w.hashes(block_hashes, true);
            w.str(medium_name(medium));
        }
        KvEvent::AllBlocksCleared => {
            w.array(1);
            w.str("AllBlocksCleared");
        }
        KvEvent::Unknown(tag) => {
            w.array(1);
            w.str(tag);
        }
    }
}

/// A new `BlockStored` on the GPU with no adapter (a convenience for engines
/// simulated in tests and the local fleet, which number their blocks with
/// plain integers).
pub fn gpu_store(
    block_hashes: Vec<u64>,
    parent_block_hash: Option<u64>,
    token_ids: Vec<u32>,
    block_size: u32,
) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: block_hashes.into_iter().map(EngineHash).collect(),
        parent_block_hash: parent_block_hash.map(EngineHash),
        token_ids,
        block_size,
        lora_id: None,
        medium: Medium::Gpu,
        lora_name: None,
        group_idx: None,
        kv_cache_spec_kind: None,
        cache_salt: None,
        extra_keys: None,
    })
}

/// A `BlockRemoved` from `medium`.
pub fn removal(block_hashes: Vec<u64>, medium: Medium) -> KvEvent {
    KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: block_hashes.into_iter().map(EngineHash).collect(),
        medium,
        group_idx: None,
    })
}

#[derive(Default)]
struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    fn nil(&mut self) {
        self.buf.push(0xc0);
    }
    fn array(&mut self, n: usize) {
        self.header(n, 0x90, 0xdc, 0xdd);
    }
    fn map(&mut self, n: usize) {
        self.header(n, 0x80, 0xde, 0xdf);
    }
    fn header(&mut self, n: usize, fix: u8, m16: u8, m32: u8) {
        if n < 16 {
            self.buf.push(fix | n as u8);
        } else if let Ok(n) = u16::try_from(n) {
            self.buf.push(m16);
            self.buf.extend_from_slice(&n.to_be_bytes());
        } else {
            self.buf.push(m32);
            self.buf
                .extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
        }
    }
    fn uint(&mut self, v: u64) {
        if v < 128 {
            self.buf.push(v as u8);
        } else if let Ok(v) = u8::try_from(v) {
            self.buf.extend_from_slice(&[0xcc, v]);
        } else if let Ok(v) = u16::try_from(v) {
            self.buf.push(0xcd);
            self.buf.extend_from_slice(&v.to_be_bytes());
        } else if let Ok(v) = u32::try_from(v) {
            self.buf.push(0xce);
            self.buf.extend_from_slice(&v.to_be_bytes());
        } else {
            self.buf.push(0xcf);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }
    fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v.unsigned_abs());
        } else if v >= -32 {
            self.buf.push(v.to_be_bytes()[7]);
        } else {
            self.buf.push(0xd3);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }
    fn f64(&mut self, v: f64) {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }
    fn str(&mut self, s: &str) {
        let n = s.len();
        if n < 32 {
            self.buf.push(0xa0 | n as u8);
        } else if let Ok(n) = u8::try_from(n) {
            self.buf.extend_from_slice(&[0xd9, n]);
        } else if let Ok(n) = u16::try_from(n) {
            self.buf.push(0xda);
            self.buf.extend_from_slice(&n.to_be_bytes());
        } else {
            self.buf.push(0xdb);
            self.buf
                .extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
        }
        self.buf.extend_from_slice(s.as_bytes());
    }
    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.str(s),
            None => self.nil(),
        }
    }
    fn opt_u32(&mut self, v: Option<u32>) {
        match v {
            Some(v) => self.uint(u64::from(v)),
            None => self.nil(),
        }
    }
    fn opt_i64(&mut self, v: Option<i64>) {
        match v {
            Some(v) => self.int(v),
            None => self.nil(),
        }
    }
    /// SGLang sends hashes as signed integers.
    fn hash(&mut self, h: u64, signed: bool) {
        if signed {
            self.int(i64::from_ne_bytes(h.to_ne_bytes()));
        } else {
            self.uint(h);
        }
    }
    fn opt_hash(&mut self, h: Option<EngineHash>, signed: bool) {
        match h {
            Some(h) => self.hash(h.0, signed),
            None => self.nil(),
        }
    }
    fn hashes(&mut self, hs: &[EngineHash], signed: bool) {
        self.array(hs.len());
        for &h in hs {
            self.hash(h.0, signed);
        }
    }
    fn bin(&mut self, b: &[u8]) {
        if let Ok(n) = u8::try_from(b.len()) {
            self.buf.extend_from_slice(&[0xc4, n]);
        } else if let Ok(n) = u16::try_from(b.len()) {
            self.buf.push(0xc5);
            self.buf.extend_from_slice(&n.to_be_bytes());
        } else {
            self.buf.push(0xc6);
            self.buf
                .extend_from_slice(&u32::try_from(b.len()).unwrap_or(u32::MAX).to_be_bytes());
        }
        self.buf.extend_from_slice(b);
    }
    /// vLLM's per-block tuples: nil for a block without keys.
    fn extra_keys(&mut self, keys: Option<&[Vec<ExtraKey>]>) {
        let Some(blocks) = keys else {
            return self.nil();
        };
        self.array(blocks.len());
        for block in blocks {
            if block.is_empty() {
                self.nil();
                continue;
            }
            self.array(block.len());
            for key in block {
                match key {
                    ExtraKey::Adapter(s) | ExtraKey::Key(s) => self.str(s),
                    ExtraKey::Digest(b) => self.bin(b),
                    ExtraKey::Opaque(raw) => self.buf.extend_from_slice(raw),
                }
            }
        }
    }
    fn tokens(&mut self, ts: &[u32]) {
        self.array(ts.len());
        for &t in ts {
            self.uint(u64::from(t));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode_batch;

    #[test]
    fn every_era_round_trips_through_the_decoder() {
        let events = vec![
            gpu_store(vec![u64::MAX - 3, 5], None, (0..32).collect(), 16),
            gpu_store(vec![6], Some(5), (100..116).collect(), 16),
            removal(vec![5], Medium::Offload("CPU".into())),
            KvEvent::AllBlocksCleared,
        ];
        for era in [Era::VllmArray, Era::VllmMap, Era::SglangArray] {
            let bytes = encode_batch(era, 12.5, &events, Some(1));
            let batch = decode_batch(&bytes).unwrap();
            assert!(batch.rejected.is_empty(), "{era:?}: {:?}", batch.rejected);
            assert_eq!(batch.ts, 12.5);
            assert_eq!(batch.data_parallel_rank, Some(1));
            assert_eq!(batch.events, events, "{era:?}");
        }
    }
}
