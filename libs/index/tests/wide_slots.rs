//! A walk through a block held by more than eight replicas marks them in a
//! bit set over the replica slots; when the scope's replicas sit at high
//! slots and few of them hold a block, only their words are cleared
//! afterwards. Every holder must still be answered with its own length and
//! tier, block after block, lookup after lookup.

use ic_index::{
    Change, Fingerprint, HashScheme, Index, IndexConfig, LookupOutcome, ReplicaKey, Scope, Tier,
};

fn scope(model: &str) -> Scope {
    Scope {
        tenant: "t".into(),
        model: model.into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    }
}

fn store(ix: &Index, model: &str, replica: &str, chain: &[Fingerprint], tier: Tier) {
    let key = ReplicaKey {
        tenant: "t".into(),
        replica_id: replica.into(),
        dp_rank: 0,
    };
    let change = Change::Stored {
        start_depth: 0,
        fingerprints: chain.to_vec(),
        block_size: 16,
        tier,
    };
    ix.apply(&key, &scope(model), "10.0.0.1:8000", &[change], 1);
}

#[test]
fn holders_at_high_slots_are_answered_block_by_block() {
    let ix = Index::new(IndexConfig::default());
    // 2,000 replicas of another model take the low slots.
    for r in 0..2_000u64 {
        store(
            &ix,
            "other",
            &format!("o{r}"),
            &[Fingerprint(1_000_000 + r)],
            Tier::T1,
        );
    }
    // Then 24 replicas of this model: replica k holds the first 2 + k % 6
    // blocks of one prompt, every third at T2.
    let prompt: Vec<Fingerprint> = (1..=8).map(Fingerprint).collect();
    let expected = |k: usize| (2 + k % 6) as u32;
    for k in 0..24 {
        let tier = if k % 3 == 0 { Tier::T2 } else { Tier::T1 };
        store(
            &ix,
            "m",
            &format!("r{k}"),
            &prompt[..expected(k) as usize],
            tier,
        );
    }
    for round in 0..3 {
        let LookupOutcome::Matches(found) = ix.lookup(&scope("m"), &prompt, None, None) else {
            panic!("round {round}: no match");
        };
        let mut got: Vec<(String, u32, Tier)> = found
            .into_iter()
            .map(|c| (c.replica.replica_id, c.matched_blocks, c.tier))
            .collect();
        got.sort();
        let mut want: Vec<(String, u32, Tier)> = (0..24)
            .map(|k| {
                let tier = if k % 3 == 0 { Tier::T2 } else { Tier::T1 };
                (format!("r{k}"), expected(k), tier)
            })
            .collect();
        want.sort();
        assert_eq!(got, want, "round {round}");
    }
}
