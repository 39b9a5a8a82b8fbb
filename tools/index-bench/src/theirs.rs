//! Dynamo's `RadixTree` (dynamo-kv-router) through its public API.

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
};

use crate::stream::{Item, Stream};

/// The stream's events in Dynamo's form (None for queries). `apply_event`
/// takes its event by value, so a fresh set is built for every replay.
pub fn events(stream: &Stream) -> Vec<Option<RouterEvent>> {
    stream
        .items
        .iter()
        .enumerate()
        .map(|(id, item)| event(id, item))
        .collect()
}

/// Item `id` of the stream in Dynamo's form (None for a query).
pub fn event(id: usize, item: &Item) -> Option<RouterEvent> {
    let (worker, data) = match item {
        Item::Stored {
            worker,
            start_depth,
            parent,
            blocks,
        } => (
            *worker,
            KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: parent.map(ExternalSequenceBlockHash),
                start_position: Some(*start_depth),
                blocks: blocks
                    .iter()
                    .map(|b| KvCacheStoredBlockData {
                        block_hash: ExternalSequenceBlockHash(b.chained),
                        tokens_hash: LocalBlockHash(b.local),
                        mm_extra_info: None,
                    })
                    .collect(),
            }),
        ),
        Item::Removed { worker, chained } => (
            *worker,
            KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: chained
                    .iter()
                    .map(|&c| ExternalSequenceBlockHash(c))
                    .collect(),
            }),
        ),
        Item::Query { .. } => return None,
    };
    Some(RouterEvent::new(
        u64::from(worker),
        KvCacheEvent {
            event_id: id as u64,
            data,
            dp_rank: 0,
        },
    ))
}

/// The prompts as `find_matches` takes them.
pub fn prompts(stream: &Stream) -> Vec<Vec<LocalBlockHash>> {
    stream
        .prompts
        .iter()
        .map(|p| p.iter().map(|b| LocalBlockHash(b.local)).collect())
        .collect()
}

/// (worker, overlap) of a `find_matches` answer, by worker.
pub fn answer(scores: &dynamo_kv_router::protocols::OverlapScores) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = scores
        .scores
        .iter()
        .filter(|&(_, &s)| s > 0)
        .map(|(w, &s)| (w.worker_id as u32, s))
        .collect();
    out.sort_unstable();
    out
}

/// A fresh tree.
pub fn tree() -> RadixTree {
    RadixTree::new()
}
