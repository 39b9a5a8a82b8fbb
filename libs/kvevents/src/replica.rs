//! One replica's block state, and the index changes its events imply.
//!
//! The engine reports blocks by its own hashes; the index wants content
//! fingerprints and tiers. This state machine keeps, per engine hash, the
//! block's fingerprint, its position in the prompt and how many stores each
//! medium class holds, and emits an [`IndexChange`] exactly when the tier the
//! index should show for a block changes:
//!
//! * a store on the GPU makes a block T1; a store on an offload medium (CPU,
//!   CPU_PINNED, …) makes it T2 unless it is also on the GPU;
//! * a GPU removal drops the block from T1. With `ignore_block_removed`
//!   (Offload mode, where LMCache/HiCache keep evicted blocks) the block is
//!   re-reported at T2 anchored at the eviction time; otherwise (EventsOnly)
//!   it is evicted from the index unless an offload medium still holds it;
//! * `AllBlocksCleared` clears the replica's T1 entries;
//! * duplicate stores and removes are refcounted per medium class, so the
//!   index sees one transition, not one per duplicate.
//!
//! A block's fingerprint covers its extra keys (see [`crate::extra`]): the
//! LoRA adapter it was stored under (`lora_name`, else `lora_id` in
//! decimal), vLLM's per-block `extra_keys` and SGLang's `cache_salt`, so
//! adapters, images and salts each get their own fingerprint domain and
//! never match a lookup that lacks them. At most
//! [`ReplicaConfig::max_adapters`] adapters are held at once; blocks of
//! further adapters are skipped and counted.
//!
//! Blocks whose parent is unknown (the subscriber joined mid-stream, or
//! batches were lost) cannot be fingerprinted: their content hash depends on
//! the whole prefix. They are counted and skipped rather than guessed.
//!
//! The index only ever holds whole prefixes: a block is reported while every
//! block before it is held too (it is *rooted*). When a block leaves while
//! blocks after it stay — a GPU reset that leaves a tail in the CPU tier, an
//! offload tier dropping an old parent — those descendants are withdrawn
//! from the index (the engine cannot reuse a block whose prefix it lacks)
//! but remembered, and reported again if the missing block is stored anew.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::extra::{ExtraKey, canonicalize, keyed_block_fingerprint};
use crate::fingerprint::Fingerprint;
use crate::wire::{BlockRemoved, BlockStored, DecodedBatch, EngineHash, KvEvent};

/// Cache tier of a block on a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// In accelerator memory.
    T1,
    /// Evicted from accelerator memory, kept by an offload tier.
    T2,
}

/// A change the index must apply for this replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IndexChange {
    /// A chain of consecutive blocks is held at `tier` (new, or a tier change).
    Stored {
        /// Fingerprint of the block before the first (`None` at depth 0).
        parent: Option<Fingerprint>,
        /// Blocks before the first one.
        start_depth: u32,
        /// The blocks, in prompt order.
        fingerprints: Vec<Fingerprint>,
        /// Tokens per block.
        block_size: u32,
        /// Tier now.
        tier: Tier,
        /// Event time, Unix milliseconds.
        at_ms: i64,
    },
    /// Blocks the replica no longer holds anywhere.
    Evicted {
        /// The blocks.
        fingerprints: Vec<Fingerprint>,
        /// Event time, Unix milliseconds.
        at_ms: i64,
    },
    /// Every block at `tier` is gone.
    Cleared {
        /// The tier cleared.
        tier: Tier,
        /// Event time, Unix milliseconds.
        at_ms: i64,
    },
}

/// How a replica interprets its events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// Offload mode: GPU evictions keep the block at T2.
    pub ignore_block_removed: bool,
    /// Most blocks remembered; beyond it the oldest T2-only blocks are evicted.
    pub max_blocks: usize,
    /// Most LoRA adapters with blocks held at once.
    pub max_adapters: usize,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        Self {
            ignore_block_removed: false,
            max_blocks: 4_000_000,
            max_adapters: 64,
        }
    }
}

/// Counters of what applying events did (for metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Blocks stored (including duplicates).
    pub stored_blocks: u64,
    /// Blocks removed (including duplicates).
    pub removed_blocks: u64,
    /// Stores of a block already held in the same medium class.
    pub duplicate_stores: u64,
    /// Removes of a block not held in that medium class.
    pub duplicate_removes: u64,
    /// Removes of blocks never seen.
    pub unknown_removals: u64,
    /// Stored blocks skipped because their parent is unknown.
    pub unresolved_parent_blocks: u64,
    /// Stored blocks without tokens whose hash was unknown.
    pub contentless_unknown_blocks: u64,
    /// Store events whose token count is not blocks × block_size.
    pub token_count_mismatches: u64,
    /// Events of non-main-attention KV cache groups, ignored.
    pub non_main_attention_events: u64,
    /// Events of unknown classes, ignored.
    pub unknown_events: u64,
    /// T2-only blocks dropped to stay within `max_blocks`.
    pub capacity_evictions: u64,
    /// Blocks of a LoRA adapter skipped because `max_adapters` other
    /// adapters already have blocks held.
    pub adapter_blocks_skipped: u64,
    /// Store events whose `extra_keys` do not have one entry per block.
    pub extra_keys_mismatches: u64,
    /// Blocks withdrawn from the index because a block before them left
    /// (they stay remembered, and return if it is stored again).
    pub unrooted_blocks: u64,
}

#[derive(Clone, Debug)]
struct Block {
    fingerprint: Fingerprint,
    parent: Option<Fingerprint>,
    /// The engine hash of the block before it (`None` at depth 0).
    parent_hash: Option<EngineHash>,
    /// Blocks held whose `parent_hash` is this block.
    children: u32,
    /// Every block before it is held: the index may report it.
    rooted: bool,
    depth: u32,
    block_size: u32,
    gpu_refs: u32,
    offload_refs: u32,
    /// Kept at T2 by the offload tier after leaving the GPU (Offload mode).
    retained: bool,
    /// Generation stamp of the retention, to match `retained_order` entries.
    retained_gen: u64,
    at_ms: i64,
    /// The LoRA adapter it was stored under.
    adapter: Option<Arc<str>>,
}

impl Block {
    /// This one block held at `tier`, as of its last change.
    fn stored_at(&self, tier: Tier) -> IndexChange {
        IndexChange::Stored {
            parent: self.parent,
            start_depth: self.depth,
            fingerprints: vec![self.fingerprint],
            block_size: self.block_size,
            tier,
            at_ms: self.at_ms,
        }
    }

    fn tier(&self) -> Option<Tier> {
        if self.gpu_refs > 0 {
            Some(Tier::T1)
        } else if self.offload_refs > 0 || self.retained {
            Some(Tier::T2)
        } else {
            None
        }
    }

    /// The tier the index shows: none while the block's prefix is broken.
    fn indexed(&self) -> Option<Tier> {
        self.tier().filter(|_| self.rooted)
    }
}

/// The state of one replica's (one DP rank's) event stream.
#[derive(Clone, Debug, Default)]
pub struct ReplicaState {
    config: ReplicaConfig,
    blocks: HashMap<EngineHash, Block>,
    /// Retained (T2-only) blocks in retention order, for capacity eviction.
    retained_order: VecDeque<(EngineHash, u64)>,
    next_gen: u64,
    /// Engine hashes of gone blocks whose children are still held: storing
    /// one of them again re-roots its descendants.
    missing_parents: std::collections::HashSet<EngineHash>,
    /// Children of blocks that left during the current event, by the gone
    /// parent; any left at the event's end break a prefix.
    orphaned: HashMap<EngineHash, u32>,
    /// The current event stored a block some held blocks were missing.
    reparented: bool,
    /// Blocks held per LoRA adapter.
    adapters: HashMap<Arc<str>, u64>,
    /// Whether each KV cache group is main attention, as its stores said
    /// (a removal carries no kind: the group it names is judged by them).
    group_kinds: HashMap<u32, bool>,
}

/// KV cache groups whose kind a replica remembers (a model has a few).
const MAX_GROUP_KINDS: usize = 64;

/// Accumulates consecutive stored blocks into one [`IndexChange::Stored`].
struct Run {
    parent: Option<Fingerprint>,
    start_depth: u32,
    fingerprints: Vec<Fingerprint>,
    block_size: u32,
    tier: Tier,
}

impl ReplicaState {
    /// An empty replica.
    pub fn new(config: ReplicaConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Blocks currently held in some tier.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the replica holds nothing.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Forgets everything (the engine restarted).
    pub fn clear(&mut self) {
        self.blocks.clear();
        self.retained_order.clear();
        self.missing_parents.clear();
        self.orphaned.clear();
        self.reparented = false;
        self.adapters.clear();
        self.group_kinds.clear();
    }

    /// Blocks held per LoRA adapter (adapters with none held are absent).
    pub fn adapters(&self) -> impl Iterator<Item = (&str, u64)> {
        self.adapters.iter().map(|(name, n)| (&**name, *n))
    }

    /// The fingerprint and tier the index should hold for an engine hash.
    pub fn lookup(&self, hash: EngineHash) -> Option<(Fingerprint, Tier)> {
        let block = self.blocks.get(&hash)?;
        Some((block.fingerprint, block.tier()?))
    }

    /// Applies every event of a batch, appending index changes to `out`.
    pub fn apply_batch(
        &mut self,
        batch: &DecodedBatch,
        out: &mut Vec<IndexChange>,
        stats: &mut ApplyStats,
    ) {
        let at_ms = ts_to_ms(batch.ts);
        for event in &batch.events {
            self.apply_event(event, at_ms, out, stats);
        }
    }

    /// Applies one event.
    pub fn apply_event(
        &mut self,
        event: &KvEvent,
        at_ms: i64,
        out: &mut Vec<IndexChange>,
        stats: &mut ApplyStats,
    ) {
        match event {
            KvEvent::BlockStored(stored) => self.store(stored, at_ms, out, stats),
            KvEvent::BlockRemoved(removed) => self.remove(removed, at_ms, out, stats),
            KvEvent::AllBlocksCleared => self.clear_gpu(at_ms, out, stats),
            KvEvent::Unknown(_) => stats.unknown_events += 1,
        }
        self.enforce_capacity(at_ms, out, stats);
        self.settle_prefixes(at_ms, out, stats);
    }

    /// The full current state as index changes (one per block, parents
    /// first), for a resync.
    pub fn snapshot(&self) -> Vec<IndexChange> {
        let mut blocks: Vec<&Block> = self.blocks.values().collect();
        blocks.sort_by_key(|b| (b.depth, b.fingerprint));
        blocks
            .into_iter()
            .filter_map(|b| Some(b.stored_at(b.indexed()?)))
            .collect()
    }

    /// Takes block `hash` out of the map: its parent loses a child, and
    /// children it still has are noted for [`Self::settle_prefixes`].
    fn detach(&mut self, hash: EngineHash) -> Option<Block> {
        let block = self.blocks.remove(&hash)?;
        if let Some(parent) = block.parent_hash {
            if let Some(p) = self.blocks.get_mut(&parent) {
                p.children = p.children.saturating_sub(1);
            } else if let Some(n) = self.orphaned.get_mut(&parent) {
                *n = n.saturating_sub(1);
            }
        }
        if block.children > 0 {
            self.orphaned.insert(hash, block.children);
        }
        if let Some(adapter) = &block.adapter
            && let Some(n) = self.adapters.get_mut(adapter)
        {
            *n -= 1;
            if *n == 0 {
                self.adapters.remove(adapter);
            }
        }
        Some(block)
    }

    /// At the end of an event: when a block left while blocks after it
    /// stayed, or a missing block came back, recompute which blocks are
    /// rooted and tell the index (withdrawn blocks evicted, re-rooted ones
    /// stored).
    fn settle_prefixes(&mut self, at_ms: i64, out: &mut Vec<IndexChange>, stats: &mut ApplyStats) {
        let broken = self.orphaned.values().any(|&n| n > 0);
        if !broken && !self.reparented {
            self.orphaned.clear();
            return;
        }
        let (mut withdrawn, mut restored) = (Vec::new(), Vec::new());
        for hash in self.recompute_roots() {
            let Some(block) = self.blocks.get(&hash) else {
                continue;
            };
            let Some(tier) = block.tier() else { continue };
            if block.rooted {
                restored.push(block.stored_at(tier));
            } else {
                stats.unrooted_blocks += 1;
                withdrawn.push(block.fingerprint);
            }
        }
        push_evicted(out, withdrawn, at_ms);
        out.extend(restored);
    }

    /// Recomputes every block's rootedness and children in depth order (a
    /// full pass: it only runs when a prefix broke or mended) and returns
    /// the blocks whose rootedness changed, shallowest first.
    fn recompute_roots(&mut self) -> Vec<EngineHash> {
        self.orphaned.clear();
        self.reparented = false;
        self.missing_parents.clear();
        let mut order: Vec<(u32, EngineHash)> =
            self.blocks.iter().map(|(h, b)| (b.depth, *h)).collect();
        order.sort_unstable();
        for block in self.blocks.values_mut() {
            block.children = 0;
        }
        let mut changed = Vec::new();
        for (_, hash) in order {
            let parent_hash = self.blocks.get(&hash).and_then(|b| b.parent_hash);
            let rooted = match parent_hash {
                None => true,
                Some(p) => match self.blocks.get_mut(&p) {
                    Some(parent) => {
                        parent.children += 1;
                        parent.rooted
                    }
                    None => {
                        self.missing_parents.insert(p);
                        false
                    }
                },
            };
            if let Some(block) = self.blocks.get_mut(&hash)
                && block.rooted != rooted
            {
                block.rooted = rooted;
                changed.push(hash);
            }
        }
        changed
    }

    fn store(
        &mut self,
        ev: &BlockStored,
        at_ms: i64,
        out: &mut Vec<IndexChange>,
        stats: &mut ApplyStats,
    ) {
        if let (Some(group), Some(_)) = (ev.group_idx, &ev.kv_cache_spec_kind)
            && (self.group_kinds.len() < MAX_GROUP_KINDS || self.group_kinds.contains_key(&group))
        {
            self.group_kinds.insert(group, ev.is_main_attention());
        }
        if !ev.is_main_attention() {
            stats.non_main_attention_events += 1;
            return;
        }
        let n = ev.block_hashes.len();
        let Some(adapter) = self.adapter_of(ev) else {
            stats.adapter_blocks_skipped += n as u64;
            return;
        };
        if ev.extra_keys.as_ref().is_some_and(|k| k.len() != n) {
            stats.extra_keys_mismatches += 1;
            return;
        }
        let block_size = ev.block_size as usize;
        let has_content = block_size > 0 && !ev.token_ids.is_empty();
        if has_content && ev.token_ids.len() != n.saturating_mul(block_size) {
            stats.token_count_mismatches += 1;
            return;
        }
        let gpu = ev.medium.is_gpu();
        // The previous block: (fingerprint, depth of the next, engine hash,
        // rooted), or None when unresolved.
        let mut prev: Option<(Option<Fingerprint>, u32, Option<EngineHash>, bool)> =
            match ev.parent_block_hash {
                None => Some((None, 0, None, true)),
                Some(parent) => self
                    .blocks
                    .get(&parent)
                    .map(|b| (Some(b.fingerprint), b.depth + 1, Some(parent), b.rooted)),
            };
        let mut run: Option<Run> = None;
        for (i, &hash) in ev.block_hashes.iter().enumerate() {
            stats.stored_blocks += 1;
            let known = self.blocks.contains_key(&hash);
            if !known {
                let Some((parent, depth, parent_hash, rooted)) = prev else {
                    stats.unresolved_parent_blocks += 1;
                    flush(&mut run, at_ms, out);
                    continue;
                };
                if !has_content {
                    stats.contentless_unknown_blocks += 1;
                    prev = None;
                    flush(&mut run, at_ms, out);
                    continue;
                }
                let tokens = &ev.token_ids[i * block_size..(i + 1) * block_size];
                let keys = block_keys(ev, adapter.as_deref(), i, depth);
                let fingerprint = keyed_block_fingerprint(parent, tokens, &keys);
                if let Some(adapter) = &adapter {
                    *self.adapters.entry(adapter.clone()).or_default() += 1;
                }
                if let Some(p) = parent_hash.and_then(|p| self.blocks.get_mut(&p)) {
                    p.children += 1;
                }
                // Held blocks were waiting for this one: re-root them at
                // the end of the event.
                self.reparented |= self.missing_parents.contains(&hash);
                self.blocks.insert(
                    hash,
                    Block {
                        fingerprint,
                        parent,
                        parent_hash,
                        children: 0,
                        rooted,
                        depth,
                        block_size: ev.block_size,
                        gpu_refs: 0,
                        offload_refs: 0,
                        retained: false,
                        retained_gen: 0,
                        at_ms,
                        adapter: adapter.clone(),
                    },
                );
            }
            let Some(block) = self.blocks.get_mut(&hash) else {
                continue;
            };
            let before = block.indexed();
            let refs = if gpu {
                &mut block.gpu_refs
            } else {
                &mut block.offload_refs
            };
            if *refs > 0 {
                stats.duplicate_stores += 1;
            }
            *refs = refs.saturating_add(1);
            if gpu {
                block.retained = false;
            }
            let after = block.indexed();
            prev = Some((
                Some(block.fingerprint),
                block.depth + 1,
                Some(hash),
                block.rooted,
            ));
            if before == after {
                flush(&mut run, at_ms, out);
                continue;
            }
            block.at_ms = at_ms;
            let Some(tier) = after else {
                // Not reported: its prefix is broken.
                flush(&mut run, at_ms, out);
                continue;
            };
            // Extend the run when this block directly follows its last block.
            let extends = run.as_ref().is_some_and(|r| {
                r.tier == tier
                    && r.block_size == block.block_size
                    && r.fingerprints.last().copied() == block.parent
            });
            if !extends {
                flush(&mut run, at_ms, out);
                run = Some(Run {
                    parent: block.parent,
                    start_depth: block.depth,
                    fingerprints: Vec::with_capacity(n - i),
                    block_size: block.block_size,
                    tier,
                });
            }
            if let Some(r) = run.as_mut() {
                r.fingerprints.push(block.fingerprint);
            }
        }
        flush(&mut run, at_ms, out);
    }

    /// The adapter a store is under: `Some(None)` for the base model,
    /// `None` when it is a new adapter beyond `max_adapters`.
    fn adapter_of(&self, ev: &BlockStored) -> Option<Option<Arc<str>>> {
        let name: Option<Arc<str>> = match (&ev.lora_name, ev.lora_id) {
            (Some(name), _) => Some(name.as_str().into()),
            (None, Some(id)) => Some(id.to_string().into()),
            (None, None) => None,
        };
        match name {
            Some(name)
                if !self.adapters.contains_key(&name)
                    && self.adapters.len() >= self.config.max_adapters =>
            {
                None
            }
            name => Some(name),
        }
    }

    fn remove(
        &mut self,
        ev: &BlockRemoved,
        at_ms: i64,
        out: &mut Vec<IndexChange>,
        stats: &mut ApplyStats,
    ) {
        // The group's stores said what it is; before any, group 0 (or
        // none) is taken for main attention.
        let main = ev
            .group_idx
            .and_then(|g| self.group_kinds.get(&g).copied())
            .unwrap_or_else(|| ev.is_main_attention());
        if !main {
            stats.non_main_attention_events += 1;
            return;
        }
        let gpu = ev.medium.is_gpu();
        let mut evicted = Vec::new();
        for &hash in &ev.block_hashes {
            stats.removed_blocks += 1;
            let Some(block) = self.blocks.get_mut(&hash) else {
                stats.unknown_removals += 1;
                continue;
            };
            let before = block.indexed();
            let refs = if gpu {
                &mut block.gpu_refs
            } else {
                &mut block.offload_refs
            };
            if *refs == 0 {
                stats.duplicate_removes += 1;
                continue;
            }
            *refs -= 1;
            if gpu && block.gpu_refs == 0 && self.config.ignore_block_removed {
                block.retained = true;
                block.retained_gen = self.next_gen;
                self.retained_order.push_back((hash, self.next_gen));
                self.next_gen += 1;
            }
            if !gpu && block.offload_refs == 0 {
                // The offload tier itself dropped it.
                block.retained = false;
            }
            match (before, block.tier(), block.indexed()) {
                (Some(Tier::T1), _, Some(Tier::T2)) => {
                    block.at_ms = at_ms;
                    out.push(block.stored_at(Tier::T2));
                }
                (_, None, _) => {
                    if before.is_some() {
                        evicted.push(block.fingerprint);
                    }
                    self.detach(hash);
                }
                _ => {}
            }
        }
        push_evicted(out, evicted, at_ms);
    }

    fn clear_gpu(&mut self, at_ms: i64, out: &mut Vec<IndexChange>, stats: &mut ApplyStats) {
        out.push(IndexChange::Cleared {
            tier: Tier::T1,
            at_ms,
        });
        let mut was_t1 = std::collections::HashSet::new();
        let mut gone = Vec::new();
        for (&hash, block) in &mut self.blocks {
            if block.gpu_refs > 0 {
                was_t1.insert(hash);
            }
            block.gpu_refs = 0;
            if block.tier().is_none() {
                gone.push(hash);
            }
        }
        let broke = gone
            .iter()
            .any(|h| self.blocks.get(h).is_some_and(|b| b.children > 0));
        for hash in gone {
            self.detach(hash);
        }
        // Blocks left at T2 whose parent just went only on the GPU no
        // longer hold a whole prefix.
        let unrooted: std::collections::HashSet<EngineHash> = if broke {
            self.recompute_roots().into_iter().collect()
        } else {
            self.orphaned.clear();
            Default::default()
        };
        let mut withdrawn = Vec::new();
        let mut demoted = Vec::new();
        for (hash, block) in &mut self.blocks {
            if was_t1.contains(hash) {
                if block.rooted {
                    // The index just dropped its T1 entry; the offload
                    // medium still holds the block.
                    block.at_ms = at_ms;
                    demoted.push(block.stored_at(Tier::T2));
                } else {
                    stats.unrooted_blocks += 1;
                }
            } else if unrooted.contains(hash) {
                stats.unrooted_blocks += 1;
                withdrawn.push(block.fingerprint);
            }
        }
        push_evicted(out, withdrawn, at_ms);
        demoted.sort_by_key(|c| match c {
            IndexChange::Stored { start_depth, .. } => *start_depth,
            _ => 0,
        });
        out.extend(demoted);
    }

    fn enforce_capacity(&mut self, at_ms: i64, out: &mut Vec<IndexChange>, stats: &mut ApplyStats) {
        let mut evicted = Vec::new();
        while self.blocks.len() > self.config.max_blocks {
            let Some((hash, generation)) = self.retained_order.pop_front() else {
                break;
            };
            let stale = self.blocks.get(&hash).is_none_or(|b| {
                !b.retained || b.retained_gen != generation || b.gpu_refs > 0 || b.offload_refs > 0
            });
            if stale {
                continue;
            }
            if let Some(block) = self.detach(hash) {
                if block.rooted {
                    evicted.push(block.fingerprint);
                }
                stats.capacity_evictions += 1;
            }
        }
        // Drop stale queue entries so the queue cannot outgrow the map.
        if self.retained_order.len() > self.blocks.len().saturating_mul(2) + 1024 {
            let blocks = &self.blocks;
            self.retained_order.retain(|(hash, generation)| {
                blocks
                    .get(hash)
                    .is_some_and(|b| b.retained && b.retained_gen == *generation)
            });
        }
        push_evicted(out, evicted, at_ms);
    }
}

/// The canonical extra keys of block `i` of a store at prompt depth
/// `depth`: the adapter, vLLM's keys for the block (without the adapter
/// name vLLM repeats first) and SGLang's salt on a prompt's first block.
fn block_keys(ev: &BlockStored, adapter: Option<&str>, i: usize, depth: u32) -> Vec<ExtraKey> {
    let mut keys = Vec::new();
    if let Some(adapter) = adapter {
        keys.push(ExtraKey::Adapter(adapter.to_owned()));
    }
    if let Some(engine_keys) = ev.extra_keys.as_ref().and_then(|k| k.get(i)) {
        let skip = usize::from(matches!(
            (engine_keys.first(), &ev.lora_name),
            (Some(ExtraKey::Key(first)), Some(name)) if first == name
        ));
        keys.extend(engine_keys[skip..].iter().cloned());
    }
    if depth == 0
        && let Some(salt) = ev.cache_salt.as_deref().filter(|s| !s.is_empty())
    {
        keys.push(ExtraKey::Key(salt.to_owned()));
    }
    canonicalize(&mut keys);
    keys
}

/// Reports `fingerprints` gone, when there are any.
fn push_evicted(out: &mut Vec<IndexChange>, fingerprints: Vec<Fingerprint>, at_ms: i64) {
    if !fingerprints.is_empty() {
        out.push(IndexChange::Evicted {
            fingerprints,
            at_ms,
        });
    }
}

fn flush(run: &mut Option<Run>, at_ms: i64, out: &mut Vec<IndexChange>) {
    if let Some(r) = run.take() {
        out.push(IndexChange::Stored {
            parent: r.parent,
            start_depth: r.start_depth,
            fingerprints: r.fingerprints,
            block_size: r.block_size,
            tier: r.tier,
            at_ms,
        });
    }
}

/// Engine timestamps are float seconds; non-finite or absurd values map to 0.
pub fn ts_to_ms(ts: f64) -> i64 {
    let ms = (ts * 1000.0).round();
    // 2^53 ms is ~285,000 years: anything beyond is garbage, not time.
    if ms.is_finite() && ms.abs() < 9_007_199_254_740_992.0 {
        #[allow(clippy::cast_possible_truncation)]
        let v = ms as i64;
        v
    } else {
        0
    }
}

#[cfg(test)]
mod tests;
