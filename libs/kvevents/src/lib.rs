//! The engines' KV-event wire and the content fingerprints the index is keyed
//! by. Pure: no sockets, no clocks, no threads.
//!
//! * [`frames`] — the three-frame ZMQ message and the replay replies.
//! * [`wire`] — msgpack payloads of every vLLM and SGLang release.
//! * [`fingerprint`] — the documented content-fingerprint scheme.
//! * [`extra`] — extra keys (adapter, multimodal items, salt) in it.
//! * [`seq`] — per-stream sequence tracking (gaps, duplicates, restarts).
//! * [`replica`] — one replica's block state, turning engine events into
//!   exact index changes (tiers, refcounts, parent resolution).

pub mod encode;
mod error;
pub mod extra;
pub mod fingerprint;
pub mod frames;
mod msgpack;
pub mod replica;
pub mod seq;
pub mod wire;

pub use error::WireError;
pub use extra::{
    ExtraKey, MediaSpan, PromptExtras, keyed_block_fingerprint, keyed_chain_fingerprints,
    keyed_chain_fingerprints_from,
};
pub use fingerprint::{Fingerprint, block_fingerprint, chain_fingerprints};
pub use replica::{ApplyStats, IndexChange, ReplicaConfig, ReplicaState, Tier};
pub use seq::{SeqEvent, SeqTracker};
pub use wire::{
    BlockRemoved, BlockStored, DecodedBatch, EngineHash, KvEvent, Medium, decode_batch,
};
