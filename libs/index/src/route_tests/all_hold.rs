//! A prompt most of a large scope holds (a fleet-wide system prompt): the
//! walk keeps hundreds of replicas matching for many blocks, and the
//! ranking answers every one of them with the blocks and the tier it
//! holds, whatever order the replicas stored their blocks in.

use super::*;

/// Replicas in the scope: more than a shortlist's threshold.
const N: u64 = 100;
/// Blocks in the prompt.
const BLOCKS: u64 = 24;

/// Blocks replica `r` holds from the start, 1 to [`BLOCKS`].
fn held(r: u64) -> u64 {
    (r * 7) % BLOCKS + 1
}

/// Whether replica `r` holds its blocks after the first four at T2.
fn cold(r: u64) -> bool {
    r.is_multiple_of(5)
}

fn key(r: u64) -> ReplicaKey {
    ReplicaKey {
        tenant: "t".into(),
        replica_id: format!("r{r}"),
        dp_rank: 0,
    }
}

fn store(ix: &Index, r: u64, blocks: &[Fingerprint], start_depth: u32, tier: Tier) {
    let change = Change::Stored {
        start_depth,
        fingerprints: blocks.to_vec(),
        block_size: 16,
        tier,
    };
    assert!(
        ix.apply(&key(r), &scope(), &format!("r{r}:8000"), &[change], T0)
            .is_empty()
    );
}

#[test]
fn every_holder_is_answered_with_its_own_blocks_and_tier() {
    let prompt = fps(&(1..=BLOCKS).collect::<Vec<_>>());
    let index = Index::new(IndexConfig::default());
    // The first four blocks in one order, the rest in another: each
    // block's holder list orders the replicas differently from the last.
    for r in 0..N {
        let first = held(r).min(4) as usize;
        store(&index, r, &prompt[..first], 0, Tier::T1);
    }
    for r in (0..N)
        .rev()
        .filter(|r| r % 2 == 0)
        .chain((0..N).filter(|r| r % 2 == 1))
    {
        if held(r) > 4 {
            let tier = if cold(r) { Tier::T2 } else { Tier::T1 };
            store(&index, r, &prompt[4..held(r) as usize], 4, tier);
        }
    }
    let fleet = Fleet {
        index,
        load: LoadBoard::new(LoadSettings::default()),
        speculation: Speculation::new(SpeculationSettings::default()),
        weights: ScoreWeights::default(),
        others: 1,
    };
    let ranked = fleet.ask(&prompt, T0);
    let mut answered: Vec<(u64, u32, Tier)> = ranked
        .ranked
        .iter()
        .map(|s| {
            let r = s.replica.replica_id[1..].parse().unwrap();
            (r, s.matched_blocks, s.tier)
        })
        .collect();
    answered.sort_unstable();
    let expected: Vec<(u64, u32, Tier)> = (0..N)
        .map(|r| {
            let tier = if cold(r) && held(r) > 4 {
                Tier::T2
            } else {
                Tier::T1
            };
            (r, held(r) as u32, tier)
        })
        .collect();
    assert_eq!(answered, expected);
    // The hint is a replica holding the whole prompt.
    let best = ranked.best().unwrap();
    assert_eq!(u64::from(best.matched_blocks), BLOCKS);
}
