//! Which replicas of a scope the ranking scores in full: every replica
//! holding part of the prompt (really or speculatively) and the best
//! [`OTHERS_RANKED`] of the rest by [`OtherKey`], ranked with the whole
//! scope's [`Fleet`] figures. [`rank_in`] then answers exactly what
//! [`crate::pick::rank`] of every replica answers, while a replica that is
//! neither costs one load read and one key instead of a full score, a name
//! hash, two holder searches and a sort entry.

use crate::load::ReplicaLoad;
use crate::pick::{
    Fleet, OTHERS_RANKED, OtherKey, PickInput, ScoreWeights, Scored, id_hash, rank_in,
};
use crate::types::ReplicaKey;

/// A scope's eligible replicas as the ranking reads them, in one order.
#[derive(Debug, Default)]
pub(super) struct Eligible<'a> {
    /// Replica and address.
    pub(super) replicas: Vec<(&'a ReplicaKey, &'a str)>,
    /// The load of each.
    pub(super) loads: Vec<ReplicaLoad>,
    /// [`id_hash`] of each replica id.
    pub(super) id_hashes: Vec<u64>,
}

impl<'a> Eligible<'a> {
    pub(super) fn with_capacity(n: usize) -> Self {
        Self {
            replicas: Vec::with_capacity(n),
            loads: Vec::with_capacity(n),
            id_hashes: Vec::with_capacity(n),
        }
    }

    pub(super) fn push(&mut self, replica: (&'a ReplicaKey, &'a str), load: ReplicaLoad, h: u64) {
        self.replicas.push(replica);
        self.loads.push(load);
        self.id_hashes.push(h);
    }
}

/// Ranks `eligible` for the prompt of `input` (its `replicas` are ignored):
/// every holder and the best [`OTHERS_RANKED`] others, best first.
pub(super) fn rank_eligible(
    eligible: &Eligible<'_>,
    input: &PickInput<'_>,
    weights: &ScoreWeights,
) -> Vec<Scored> {
    let n = eligible.replicas.len();
    let fleet = Fleet::of(n, &eligible.loads);
    let mut holders: Vec<u64> = input
        .matches
        .iter()
        .map(|m| id_hash(&m.replica.replica_id))
        .chain(input.speculative.iter().map(|(id, _)| id_hash(id)))
        .collect();
    if n <= holders.len() + OTHERS_RANKED {
        // Every replica would be scored anyway.
        let all = PickInput {
            replicas: &eligible.replicas,
            ..*input
        };
        return rank_in(&all, weights, &eligible.loads, &fleet);
    }
    holders.sort_unstable();
    holders.dedup();
    // A hash shared by a holder and another replica only scores that one in
    // full too: a superset of the holders changes nothing.
    let holds = |h: u64| holders.binary_search(&h).is_ok();
    let key_of = |i: usize| eligible.replicas[i].0;
    let better = |a: &(OtherKey, usize), b: &(OtherKey, usize)| {
        a.0.rank_cmp(&b.0)
            .then_with(|| key_of(a.1).cmp(key_of(b.1)))
    };
    let mut chosen: Vec<usize> = Vec::with_capacity(holders.len() + OTHERS_RANKED);
    // The best others so far, best first.
    let mut best: Vec<(OtherKey, usize)> = Vec::with_capacity(OTHERS_RANKED + 1);
    for (i, (&h, load)) in eligible.id_hashes.iter().zip(&eligible.loads).enumerate() {
        if holds(h) {
            chosen.push(i);
            continue;
        }
        let key = (OtherKey::new(input, weights, &fleet, load, h), i);
        if best.len() == OTHERS_RANKED && better(&key, &best[OTHERS_RANKED - 1]).is_ge() {
            continue;
        }
        let at = best.partition_point(|b| better(b, &key).is_lt());
        best.insert(at, key);
        best.truncate(OTHERS_RANKED);
    }
    chosen.extend(best.iter().map(|(_, i)| *i));
    chosen.sort_unstable();
    let replicas: Vec<(&ReplicaKey, &str)> = chosen.iter().map(|&i| eligible.replicas[i]).collect();
    let loads: Vec<ReplicaLoad> = chosen.iter().map(|&i| eligible.loads[i]).collect();
    let part = PickInput {
        replicas: &replicas,
        ..*input
    };
    rank_in(&part, weights, &loads, &fleet)
}
