//! The first-block filter never hides a held chain: not while chains are
//! stored and looked up at once, not after the records were refilled or
//! moved, and not across the filter's rebuilds. And the contract it sets: a
//! lookup's fingerprints start at a prompt's first block; a block after it
//! is asked through `lookup_prefix_hash`.

use super::*;
use std::sync::Arc;

#[test]
fn the_first_block_filter_never_hides_a_held_chain() {
    // Round k stores chain k of replica "stable" (kept) and a short chain
    // of replica "churn", which is looked up, then evicted: its first
    // blocks pile up in the filter (an eighth of its 16,384 bits at this
    // capacity), so it is rebuilt every 1,024 rounds or so, while two readers
    // look up the stable chains, half the time the one just stored.
    // Evicted churn leaves holes that later records refill, and pages that
    // compaction empties (pages hold 8 records under test).
    const ROUNDS: u64 = 5_000;
    const LEN: u64 = 3;
    let chain = |k: u64| chain_readers::chain(k, LEN);
    let ix = Arc::new(Index::new(IndexConfig {
        capacity_entries: 20_000,
        shards: 4,
        ..IndexConfig::default()
    }));
    let readers = chain_readers::ChainReaders::spawn(&ix, LEN);
    for k in 0..ROUNDS {
        put(&ix, "t", "stable", &[stored(0, &chain(k), Tier::T1)]);
        readers.publish(k + 1);
        let churn: Vec<Fingerprint> = (0..2)
            .map(|d| Fingerprint(1_000_000_000 + k * 1_000 + d))
            .collect();
        put(&ix, "t", "churn", &[stored(0, &churn, Tier::T1)]);
        assert_eq!(
            matches(ix.lookup(&scope("t"), &churn, None, None)),
            [("churn".into(), 2, Tier::T1)],
            "churn chain of round {k}"
        );
        put(
            &ix,
            "t",
            "churn",
            &[Change::Evicted {
                fingerprints: churn,
            }],
        );
    }
    readers.finish();
    assert!(
        ix.store.firsts_rebuilds() >= 3,
        "rebuilt {} times",
        ix.store.firsts_rebuilds()
    );
    assert_eq!(ix.len(), ROUNDS * LEN);
    // After the last rebuild too, every stable chain is found.
    for k in 0..ROUNDS {
        assert_eq!(
            matches(ix.lookup(&scope("t"), &chain(k), None, None)),
            [("stable".into(), LEN as u32, Tier::T1)],
            "chain {k}"
        );
    }
}

#[test]
fn a_block_after_the_first_is_asked_by_prefix_hash_not_as_a_prompt() {
    // One chain stored at depths 0..4, its block 3 held only in the
    // offload tier (as an engine that offloaded it reports it).
    let ix = index();
    let chain = fps(&[11, 12, 13, 14, 15]);
    put(
        &ix,
        "t",
        "a",
        &[
            stored(0, &chain[..3], Tier::T1),
            stored(3, &chain[3..4], Tier::T2),
            stored(4, &chain[4..], Tier::T1),
        ],
    );
    // Asked by itself, block 3 is found at any depth: its holder with the
    // four blocks of the prefix it ends, and this block's own tier. (Asked
    // as a one-block prompt, as llm-d's GetPodScores once did, it misses.)
    assert_eq!(
        matches(ix.lookup_prefix_hash(&scope("t"), chain[3], None, None)),
        [("a".into(), 4, Tier::T2)]
    );
    assert_eq!(
        matches(ix.lookup_prefix_hash(&scope("t"), chain[4], None, None)),
        [("a".into(), 5, Tier::T1)]
    );
    // The prompt from its first block: five blocks at the coldest tier.
    assert_eq!(
        matches(ix.lookup(&scope("t"), &chain, None, None)),
        [("a".into(), 5, Tier::T2)]
    );
    // A list starting at block 3 is not a prompt: the first-block filter
    // holds only depth-0 keys, so it is a miss (documented on
    // `Index::lookup`), by name and by resolved scope alike.
    let handle = ix.resolve_scope(&scope("t")).expect("t reported");
    for late in [&chain[3..4], &chain[3..]] {
        assert_eq!(
            ix.lookup(&scope("t"), late, None, None),
            LookupOutcome::NoEntry,
            "{late:?}"
        );
        assert_eq!(
            ix.lookup_resolved_until(handle, late, None, None, &NoDeadline, |v| v.to_outcome()),
            LookupOutcome::NoEntry,
            "{late:?}"
        );
    }
}
