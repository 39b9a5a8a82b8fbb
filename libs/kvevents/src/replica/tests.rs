use std::collections::HashMap;

use proptest::prelude::*;

use super::*;
use crate::extra::{PromptExtras, keyed_chain_fingerprints};
use crate::fingerprint::chain_fingerprints;
use crate::wire::Medium;

const BS: u32 = 4;

fn tokens(block: u64) -> Vec<u32> {
    (0..BS).map(|i| (block * 100) as u32 + i).collect()
}

fn stored(hashes: &[u64], parent: Option<u64>, medium: Medium) -> KvEvent {
    KvEvent::BlockStored(BlockStored {
        block_hashes: hashes.iter().copied().map(EngineHash).collect(),
        parent_block_hash: parent.map(EngineHash),
        token_ids: hashes.iter().flat_map(|&h| tokens(h)).collect(),
        block_size: BS,
        lora_id: None,
        medium,
        lora_name: None,
        group_idx: None,
        kv_cache_spec_kind: None,
        cache_salt: None,
        extra_keys: None,
    })
}

fn removed(hashes: &[u64], medium: Medium) -> KvEvent {
    KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: hashes.iter().copied().map(EngineHash).collect(),
        medium,
        group_idx: None,
    })
}

fn cpu() -> Medium {
    Medium::Offload("CPU".into())
}

struct Harness {
    state: ReplicaState,
    stats: ApplyStats,
}

impl Harness {
    fn new(ignore_block_removed: bool) -> Self {
        Self {
            state: ReplicaState::new(ReplicaConfig {
                ignore_block_removed,
                max_blocks: 1_000,
                ..ReplicaConfig::default()
            }),
            stats: ApplyStats::default(),
        }
    }
    fn apply(&mut self, event: KvEvent) -> Vec<IndexChange> {
        let mut out = Vec::new();
        self.state
            .apply_event(&event, 1000, &mut out, &mut self.stats);
        out
    }
}

fn fps(hashes: &[u64]) -> Vec<Fingerprint> {
    let all: Vec<u32> = hashes.iter().flat_map(|&h| tokens(h)).collect();
    chain_fingerprints(None, &all, BS as usize)
}

#[test]
fn gpu_store_of_a_new_chain_is_one_t1_run() {
    let mut h = Harness::new(false);
    let out = h.apply(stored(&[1, 2, 3], None, Medium::Gpu));
    assert_eq!(
        out,
        vec![IndexChange::Stored {
            parent: None,
            start_depth: 0,
            fingerprints: fps(&[1, 2, 3]),
            block_size: BS,
            tier: Tier::T1,
            at_ms: 1000
        }]
    );
}

#[test]
fn parents_resolve_across_batches() {
    let mut h = Harness::new(false);
    h.apply(stored(&[1, 2], None, Medium::Gpu));
    let out = h.apply(stored(&[3], Some(2), Medium::Gpu));
    let chain = fps(&[1, 2, 3]);
    assert_eq!(
        out,
        vec![IndexChange::Stored {
            parent: Some(chain[1]),
            start_depth: 2,
            fingerprints: vec![chain[2]],
            block_size: BS,
            tier: Tier::T1,
            at_ms: 1000
        }]
    );
}

#[test]
fn duplicates_are_refcounted() {
    let mut h = Harness::new(false);
    h.apply(stored(&[1], None, Medium::Gpu));
    assert!(h.apply(stored(&[1], None, Medium::Gpu)).is_empty());
    assert_eq!(h.stats.duplicate_stores, 1);
    // First remove only drops a reference.
    assert!(h.apply(removed(&[1], Medium::Gpu)).is_empty());
    let out = h.apply(removed(&[1], Medium::Gpu));
    assert_eq!(
        out,
        vec![IndexChange::Evicted {
            fingerprints: fps(&[1]),
            at_ms: 1000
        }]
    );
    assert!(h.apply(removed(&[1], Medium::Gpu)).is_empty());
    assert_eq!(h.stats.unknown_removals, 1);
    assert!(h.state.is_empty());
}

#[test]
fn offload_mode_re_reports_evictions_at_t2_and_restores_to_t1() {
    let mut h = Harness::new(true);
    h.apply(stored(&[1, 2], None, Medium::Gpu));
    let chain = fps(&[1, 2]);
    let out = h.apply(removed(&[2], Medium::Gpu));
    assert_eq!(
        out,
        vec![IndexChange::Stored {
            parent: Some(chain[0]),
            start_depth: 1,
            fingerprints: vec![chain[1]],
            block_size: BS,
            tier: Tier::T2,
            at_ms: 1000
        }]
    );
    assert_eq!(h.state.lookup(EngineHash(2)), Some((chain[1], Tier::T2)));
    let out = h.apply(stored(&[2], Some(1), Medium::Gpu));
    assert!(matches!(
        &out[..],
        [IndexChange::Stored { tier: Tier::T1, .. }]
    ));
}

#[test]
fn events_only_evicts_unless_an_offload_medium_holds_the_block() {
    let mut h = Harness::new(false);
    h.apply(stored(&[1], None, Medium::Gpu));
    // The offload connector copies it to CPU: still T1 (GPU wins).
    assert!(h.apply(stored(&[1], None, cpu())).is_empty());
    // Leaving the GPU demotes it to T2.
    let out = h.apply(removed(&[1], Medium::Gpu));
    assert!(matches!(
        &out[..],
        [IndexChange::Stored { tier: Tier::T2, .. }]
    ));
    // Leaving the CPU too evicts it.
    let out = h.apply(removed(&[1], cpu()));
    assert!(matches!(&out[..], [IndexChange::Evicted { .. }]));
}

#[test]
fn contentless_offload_stores_map_through_known_hashes() {
    let mut h = Harness::new(false);
    h.apply(stored(&[1], None, Medium::Gpu));
    let contentless = |hash| {
        KvEvent::BlockStored(BlockStored {
            block_hashes: vec![hash],
            parent_block_hash: None,
            token_ids: vec![],
            block_size: 0,
            lora_id: None,
            medium: cpu(),
            lora_name: None,
            group_idx: None,
            kv_cache_spec_kind: None,
            cache_salt: None,
            extra_keys: None,
        })
    };
    assert!(h.apply(contentless(EngineHash(1))).is_empty());
    assert!(h.apply(contentless(EngineHash(77))).is_empty());
    assert_eq!(h.stats.contentless_unknown_blocks, 1);
    let out = h.apply(removed(&[1], Medium::Gpu));
    assert!(matches!(
        &out[..],
        [IndexChange::Stored { tier: Tier::T2, .. }]
    ));
}

#[test]
fn unknown_parents_are_skipped_not_guessed() {
    let mut h = Harness::new(false);
    assert!(h.apply(stored(&[5, 6], Some(4), Medium::Gpu)).is_empty());
    assert_eq!(h.stats.unresolved_parent_blocks, 2);
    assert!(h.state.is_empty());
}

#[test]
fn non_main_attention_groups_are_ignored() {
    let mut h = Harness::new(false);
    let mut ev = stored(&[1], None, Medium::Gpu);
    if let KvEvent::BlockStored(s) = &mut ev {
        s.group_idx = Some(1);
        s.kv_cache_spec_kind = Some("sliding_window".into());
    }
    assert!(h.apply(ev).is_empty());
    let removal = KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: vec![EngineHash(1)],
        medium: Medium::Gpu,
        group_idx: Some(1),
    });
    assert!(h.apply(removal).is_empty());
    assert_eq!(h.stats.non_main_attention_events, 2);
}

/// A hybrid model whose full-attention group is not group 0: removals are
/// judged by what each group's stores said, not by the group's number.
#[test]
fn removals_follow_the_kind_their_group_was_stored_with() {
    let mut h = Harness::new(false);
    let in_group = |mut ev: KvEvent, group: u32, kind: &str| {
        if let KvEvent::BlockStored(s) = &mut ev {
            s.group_idx = Some(group);
            s.kv_cache_spec_kind = Some(kind.into());
        }
        ev
    };
    let removal = |group| {
        KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![EngineHash(1)],
            medium: Medium::Gpu,
            group_idx: Some(group),
        })
    };
    let stored_out = h.apply(in_group(
        stored(&[1], None, Medium::Gpu),
        1,
        "full_attention",
    ));
    assert_eq!(stored_fps(&stored_out).len(), 1);
    assert!(
        h.apply(in_group(
            stored(&[1], None, Medium::Gpu),
            0,
            "sliding_window"
        ))
        .is_empty()
    );
    // The sliding-window group frees its copy: the block is still held.
    assert!(h.apply(removal(0)).is_empty());
    assert_eq!(h.state.len(), 1);
    // The full-attention group frees it: gone from the index.
    assert!(matches!(
        &h.apply(removal(1))[..],
        [IndexChange::Evicted { .. }]
    ));
    assert!(h.state.is_empty());
}

fn stored_fps(changes: &[IndexChange]) -> Vec<Fingerprint> {
    changes
        .iter()
        .flat_map(|c| match c {
            IndexChange::Stored { fingerprints, .. } => fingerprints.clone(),
            _ => Vec::new(),
        })
        .collect()
}

fn tokens_of(hashes: &[u64]) -> Vec<u32> {
    hashes.iter().flat_map(|&h| tokens(h)).collect()
}

#[test]
fn adapter_blocks_are_fingerprinted_in_the_adapters_domain() {
    let mut h = Harness::new(false);
    let mut ev = stored(&[1, 2], None, Medium::Gpu);
    if let KvEvent::BlockStored(s) = &mut ev {
        s.lora_name = Some("sql-lora".into());
        s.lora_id = Some(3);
        // vLLM 0.17+ repeats the adapter's name first in every block's keys.
        s.extra_keys = Some(vec![
            vec![ExtraKey::Key("sql-lora".into())],
            vec![ExtraKey::Key("sql-lora".into())],
        ]);
    }
    let tokens = tokens_of(&[1, 2]);
    let lora = PromptExtras {
        adapter: "sql-lora".into(),
        ..PromptExtras::default()
    };
    assert_eq!(
        stored_fps(&h.apply(ev)),
        keyed_chain_fingerprints(&tokens, BS as usize, &lora)
    );
    assert_ne!(
        keyed_chain_fingerprints(&tokens, BS as usize, &lora),
        chain_fingerprints(None, &tokens, BS as usize)
    );
    assert_eq!(h.state.adapters().collect::<Vec<_>>(), [("sql-lora", 2)]);
    // Only an id (no name): the adapter is named by the id in decimal.
    let mut ev = stored(&[10], None, Medium::Gpu);
    if let KvEvent::BlockStored(s) = &mut ev {
        s.lora_id = Some(7);
    }
    let by_id = PromptExtras {
        adapter: "7".into(),
        ..PromptExtras::default()
    };
    assert_eq!(
        stored_fps(&h.apply(ev)),
        keyed_chain_fingerprints(&tokens_of(&[10]), BS as usize, &by_id)
    );
    h.apply(removed(&[1, 2], Medium::Gpu));
    assert_eq!(h.state.adapters().collect::<Vec<_>>(), [("7", 1)]);
}

#[test]
fn adapters_beyond_the_bound_are_skipped_and_counted() {
    let mut h = Harness {
        state: ReplicaState::new(ReplicaConfig {
            max_adapters: 1,
            ..ReplicaConfig::default()
        }),
        stats: ApplyStats::default(),
    };
    let under = |hashes: &[u64], name: &str| {
        let mut ev = stored(hashes, None, Medium::Gpu);
        if let KvEvent::BlockStored(s) = &mut ev {
            s.lora_name = Some(name.into());
        }
        ev
    };
    assert!(!h.apply(under(&[1], "a")).is_empty());
    assert!(h.apply(under(&[2, 3], "b")).is_empty());
    assert_eq!(h.stats.adapter_blocks_skipped, 2);
    // Adapter a's blocks leave, so b fits now; the base model never counts.
    h.apply(removed(&[1], Medium::Gpu));
    assert!(!h.apply(under(&[2, 3], "b")).is_empty());
    assert!(!h.apply(stored(&[20], None, Medium::Gpu)).is_empty());
    assert_eq!(h.stats.adapter_blocks_skipped, 2);
}

#[test]
fn extra_keys_and_salts_are_folded_into_the_fingerprint() {
    let mut h = Harness::new(false);
    let mut ev = stored(&[1, 2], None, Medium::Gpu);
    if let KvEvent::BlockStored(s) = &mut ev {
        s.extra_keys = Some(vec![
            vec![ExtraKey::Key("img".into()), ExtraKey::Key("salt".into())],
            vec![],
        ]);
    }
    let tokens = tokens_of(&[1, 2]);
    let extras = PromptExtras {
        media: vec![crate::MediaSpan {
            identifier: "img".into(),
            offset: 1,
            length: 2,
        }],
        cache_salt: "salt".into(),
        ..PromptExtras::default()
    };
    assert_eq!(
        stored_fps(&h.apply(ev)),
        keyed_chain_fingerprints(&tokens, BS as usize, &extras)
    );
    // SGLang's salted store: the salt lands on the prompt's first block
    // only, and every later block inherits it through its parent.
    let mut h = Harness::new(false);
    let mut ev = stored(&[1], None, Medium::Gpu);
    if let KvEvent::BlockStored(s) = &mut ev {
        s.cache_salt = Some("salt".into());
    }
    let mut next = stored(&[2], Some(1), Medium::Gpu);
    if let KvEvent::BlockStored(s) = &mut next {
        s.cache_salt = Some("salt".into());
    }
    let salted = PromptExtras {
        cache_salt: "salt".into(),
        ..PromptExtras::default()
    };
    let mut got = stored_fps(&h.apply(ev));
    got.extend(stored_fps(&h.apply(next)));
    assert_eq!(got, keyed_chain_fingerprints(&tokens, BS as usize, &salted));
    // A tuple per block is required: a short list rejects the event.
    let mut ev = stored(&[5, 6], None, Medium::Gpu);
    if let KvEvent::BlockStored(s) = &mut ev {
        s.extra_keys = Some(vec![vec![]]);
    }
    assert!(h.apply(ev).is_empty());
    assert_eq!(h.stats.extra_keys_mismatches, 1);
}

#[test]
fn token_count_mismatch_rejects_the_event() {
    let mut h = Harness::new(false);
    let mut ev = stored(&[1, 2], None, Medium::Gpu);
    if let KvEvent::BlockStored(s) = &mut ev {
        s.token_ids.pop();
    }
    assert!(h.apply(ev).is_empty());
    assert_eq!(h.stats.token_count_mismatches, 1);
}

#[test]
fn all_blocks_cleared_drops_t1_and_keeps_what_offload_holds() {
    let mut h = Harness::new(false);
    h.apply(stored(&[1, 2, 3], None, Medium::Gpu));
    h.apply(stored(&[1, 2], None, cpu()));
    let out = h.apply(KvEvent::AllBlocksCleared);
    let chain = fps(&[1, 2, 3]);
    // The offloaded prefix stays, at T2, parents first.
    assert_eq!(
        out,
        vec![
            IndexChange::Cleared {
                tier: Tier::T1,
                at_ms: 1000
            },
            IndexChange::Stored {
                parent: None,
                start_depth: 0,
                fingerprints: vec![chain[0]],
                block_size: BS,
                tier: Tier::T2,
                at_ms: 1000
            },
            IndexChange::Stored {
                parent: Some(chain[0]),
                start_depth: 1,
                fingerprints: vec![chain[1]],
                block_size: BS,
                tier: Tier::T2,
                at_ms: 1000
            }
        ]
    );
    assert_eq!(h.state.len(), 2);
}

#[test]
fn a_tail_whose_prefix_is_gone_is_withdrawn_and_returns_with_it() {
    let mut h = Harness::new(false);
    h.apply(stored(&[1, 2, 3], None, Medium::Gpu));
    // Only the tail was offloaded.
    h.apply(stored(&[3], Some(2), cpu()));
    // A GPU reset: blocks 1 and 2 are gone; 3 stays in the CPU tier but
    // no request can reuse it without them.
    let out = h.apply(KvEvent::AllBlocksCleared);
    assert_eq!(
        out,
        vec![IndexChange::Cleared {
            tier: Tier::T1,
            at_ms: 1000
        }],
        "the tail is not re-reported at T2"
    );
    assert_eq!(h.stats.unrooted_blocks, 1);
    assert!(h.state.snapshot().is_empty(), "a resync reports no prefix");
    assert_eq!(h.state.len(), 1, "the tail is remembered");
    // The engine recomputes the prefix: the tail is whole again.
    let out = h.apply(stored(&[1, 2], None, Medium::Gpu));
    let chain = fps(&[1, 2, 3]);
    let mut index = HashMap::new();
    replay(&out, &mut index);
    assert_eq!(
        index,
        HashMap::from([
            (chain[0], Tier::T1),
            (chain[1], Tier::T1),
            (chain[2], Tier::T2)
        ])
    );

    // EventsOnly: the parent removed while its child stays withdraws the
    // child too.
    let out = h.apply(removed(&[2], Medium::Gpu));
    replay(&out, &mut index);
    assert_eq!(index, HashMap::from([(chain[0], Tier::T1)]));
}

#[test]
fn capacity_evicts_oldest_retained_blocks() {
    let mut h = Harness {
        state: ReplicaState::new(ReplicaConfig {
            ignore_block_removed: true,
            max_blocks: 2,
            ..ReplicaConfig::default()
        }),
        stats: ApplyStats::default(),
    };
    h.apply(stored(&[1, 2], None, Medium::Gpu));
    h.apply(removed(&[1], Medium::Gpu)); // 1 retained at T2
    let out = h.apply(stored(&[3], Some(2), Medium::Gpu));
    assert!(
        out.iter().any(
            |c| matches!(c, IndexChange::Evicted { fingerprints, .. } if fingerprints == &fps(&[1]))
        ),
        "{out:?}"
    );
    assert_eq!(h.stats.capacity_evictions, 1);
    assert_eq!(h.state.len(), 2);
}

#[test]
fn batch_timestamps_become_milliseconds() {
    assert_eq!(ts_to_ms(1_700_000_000.25), 1_700_000_000_250);
    assert_eq!(ts_to_ms(f64::NAN), 0);
    assert_eq!(ts_to_ms(f64::INFINITY), 0);
    assert_eq!(ts_to_ms(1e300), 0);
}

/// The index a stream of changes builds: fingerprint → tier.
fn replay(changes: &[IndexChange], index: &mut HashMap<Fingerprint, Tier>) {
    for change in changes {
        match change {
            IndexChange::Stored {
                fingerprints, tier, ..
            } => {
                for fp in fingerprints {
                    index.insert(*fp, *tier);
                }
            }
            IndexChange::Evicted { fingerprints, .. } => {
                for fp in fingerprints {
                    index.remove(fp);
                }
            }
            IndexChange::Cleared { tier, .. } => index.retain(|_, t| t != tier),
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Store { start: u64, len: u64, gpu: bool },
    Remove { hash: u64, gpu: bool },
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..12, 1u64..4, any::<bool>()).prop_map(|(start, len, gpu)| Op::Store { start, len, gpu }),
        4 => (0u64..14, any::<bool>()).prop_map(|(hash, gpu)| Op::Remove { hash, gpu }),
        1 => Just(Op::Clear),
    ]
}

proptest! {
    /// Whatever the event sequence (duplicates, removals of unknown blocks,
    /// clears, capacity pressure), the changes emitted so far rebuild exactly
    /// the state the replica holds — the index never drifts from the engine.
    #[test]
    fn emitted_changes_always_rebuild_the_replica_state(
        ops in proptest::collection::vec(op(), 1..60),
        offload in any::<bool>(),
        max_blocks in 3usize..20,
    ) {
        let mut state = ReplicaState::new(ReplicaConfig { ignore_block_removed: offload, max_blocks, ..ReplicaConfig::default() });
        let mut stats = ApplyStats::default();
        let mut index = HashMap::new();
        for op in ops {
            let event = match op {
                // Hash h always has parent h-1 (h = 0 starts a prompt), so
                // content and parents are consistent as in a real engine.
                Op::Store { start, len, gpu } => {
                    let hashes: Vec<u64> = (start..start + len).collect();
                    let parent = if start == 0 { None } else { Some(start - 1) };
                    stored(&hashes, parent, if gpu { Medium::Gpu } else { cpu() })
                }
                Op::Remove { hash, gpu } => removed(&[hash], if gpu { Medium::Gpu } else { cpu() }),
                Op::Clear => KvEvent::AllBlocksCleared,
            };
            let mut out = Vec::new();
            state.apply_event(&event, 1, &mut out, &mut stats);
            replay(&out, &mut index);
        }
        let mut expected = HashMap::new();
        replay(&state.snapshot(), &mut expected);
        prop_assert_eq!(&index, &expected);
        // Only whole prefixes: every indexed block's parent is indexed.
        for block in state.blocks.values() {
            if block.indexed().is_some()
                && let Some(parent) = block.parent
            {
                prop_assert!(index.contains_key(&parent), "{:?} lacks its parent", block.fingerprint);
            }
        }
    }
}
