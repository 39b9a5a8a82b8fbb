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

/// The scope of [`N`] replicas, each holding [`held`] blocks of the
/// prompt, stored in an order that differs between the blocks.
fn fleet_holding(prompt: &[Fingerprint]) -> Fleet {
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
    Fleet {
        index,
        load: LoadBoard::new(LoadSettings::default()),
        speculation: Speculation::new(SpeculationSettings::default()),
        weights: ScoreWeights::default(),
        others: 1,
        holders: usize::MAX,
    }
}

#[test]
fn every_holder_is_answered_with_its_own_blocks_and_tier() {
    let prompt = fps(&(1..=BLOCKS).collect::<Vec<_>>());
    let fleet = fleet_holding(&prompt);
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

/// Answering the best few holders ([`Scoring::holders`], LookupRoute's
/// `max_candidates`) answers exactly the first few of the whole ranking,
/// the same hint and the same best other, with some holders busy (the load
/// bound) and some speculatively holding more.
#[test]
fn the_best_few_holders_are_the_whole_ranking_s_first() {
    let prompt = fps(&(1..=BLOCKS).collect::<Vec<_>>());
    let mut fleet = fleet_holding(&prompt);
    let tag = scope_tag(&scope());
    for r in (0..N).filter(|r| r % 3 == 0) {
        for _ in 0..(r % 4) {
            fleet.load.picked(&format!("r{r}"), T0);
        }
    }
    fleet
        .speculation
        .record(tag, "r7", &prompt[held(7) as usize..], T0);
    let all = fleet.ask(&prompt, T0);
    let holders = |r: &Ranked| r.ranked.iter().filter(|s| s.matched_blocks > 0).count();
    assert_eq!(holders(&all), N as usize);
    for keep in [1, 3, 10] {
        fleet.holders = keep;
        let few = fleet.ask(&prompt, T0);
        assert_eq!(holders(&few), keep);
        let kept: Vec<_> = all
            .ranked
            .iter()
            .filter(|s| s.matched_blocks > 0)
            .take(keep)
            .collect();
        let few_holders: Vec<_> = few.ranked.iter().filter(|s| s.matched_blocks > 0).collect();
        assert_eq!(few_holders, kept, "keep {keep}");
        assert_eq!(few.best(), all.best(), "keep {keep}");
        assert_eq!(few.destination(), all.destination(), "keep {keep}");
        assert_eq!(few.no_hint, all.no_hint, "keep {keep}");
        let other = |r: &Ranked| r.ranked.iter().find(|s| s.matched_blocks == 0).cloned();
        assert_eq!(other(&few), other(&all), "keep {keep}");
    }
}
