//! Which replicas of a scope the ranking scores in full: every replica
//! holding part of the prompt (really or speculatively) and the best
//! [`OTHERS_RANKED`] of the rest by [`OtherKey`], ranked with the whole
//! scope's [`Fleet`] figures. [`rank_in`] then answers exactly what
//! [`crate::pick::rank`] of every replica answers, while a replica that is
//! neither costs one load read and one key instead of a full score, a name
//! hash, two holder searches and a sort entry.

use std::sync::Arc;

use crate::load::{LoadReader, MemberLoads, ReplicaLoad};
use crate::pick::{
    Fleet, OTHERS_RANKED, OtherKey, PickInput, ScoreWeights, Scored, id_hash, rank_in,
};
use crate::registry::ReplicaMeta;
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
    /// The whole scope's figures, when these are only part of it (a
    /// [`Shortlist`]'s); else computed from `loads`.
    pub(super) fleet: Option<Fleet>,
}

impl<'a> Eligible<'a> {
    pub(super) fn with_capacity(n: usize) -> Self {
        Self {
            replicas: Vec::with_capacity(n),
            loads: Vec::with_capacity(n),
            id_hashes: Vec::with_capacity(n),
            fleet: None,
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
    let fleet = eligible
        .fleet
        .unwrap_or_else(|| Fleet::of(n, &eligible.loads));
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

/// Scopes with more replicas than this (stale ones counted) keep a [`Shortlist`]
/// between lookups; smaller ones read every load (a few hundred
/// instructions in all).
pub(super) const SHORTLIST_ABOVE: usize = 64;

/// Replicas a [`Shortlist`] keeps (and every replica tied with the last):
/// twice [`OTHERS_RANKED`], so that a prompt held by some of them, or a
/// member gone stale, still leaves that many others inside (else every
/// replica is ranked). No room helps against picks: a replica outside that
/// they left less loaded than those inside is missed until the rebuild.
const SHORTLISTED: usize = 2 * OTHERS_RANKED;

/// A large scope's least loaded replicas, as of one moment, and the whole
/// scope's [`Fleet`] figures then: a lookup reads the loads of these and of
/// its holders only. Rebuilt (by a lookup that reads every load anyway)
/// once [`crate::load::LoadSettings::shortlist_refresh_ms`] old or
/// [`crate::load::LoadSettings::shortlist_refresh_changes`] load changes
/// on. Until then a lookup answers as ranking every replica would have at
/// the moment it was built, with the current loads of the replicas it
/// scores: a replica outside is missed only if it became less loaded than
/// the best others inside within that bound, and the scores are relative to
/// a busiest replica and a fair share that old.
#[derive(Debug)]
pub(crate) struct Shortlist {
    at_ms: i64,
    changes: u64,
    weights: ScoreWeights,
    /// By TTFT a shortlist serves prompts of its own power of two of
    /// tokens only.
    prompt_class: u32,
    /// By TTFT with prefill rates that differ between replicas, a
    /// replica's key depends on the prompt's exact length (its own rate
    /// prices the prefill): the shortlist serves that many tokens only.
    exact_tokens: Option<u64>,
    fleet: Fleet,
    /// Member positions, ascending.
    members: Box<[u32]>,
}

fn prompt_tokens(input: &PickInput<'_>) -> u64 {
    u64::from(input.prompt_blocks.max(1)) * u64::from(input.block_size.max(1))
}

fn prompt_class(input: &PickInput<'_>) -> u32 {
    prompt_tokens(input).ilog2()
}

impl Shortlist {
    /// Built from every eligible member (`positions` in the scope's member
    /// list, `loads` theirs).
    pub(super) fn build(
        positions: &[u32],
        loads: &[ReplicaLoad],
        input: &PickInput<'_>,
        weights: &ScoreWeights,
        reader: &LoadReader<'_>,
    ) -> Self {
        let fleet = Fleet::of(positions.len(), loads);
        let rates_differ = weights.ttft.is_some()
            && loads
                .windows(2)
                .any(|w| w[0].prefill_tokens_per_ms != w[1].prefill_tokens_per_ms);
        let mut keys: Vec<(OtherKey, u32)> = positions
            .iter()
            .zip(loads)
            .map(|(&p, load)| (OtherKey::new(input, weights, &fleet, load, 0), p))
            .collect();
        if keys.len() > SHORTLISTED {
            let (_, last, _) =
                keys.select_nth_unstable_by(SHORTLISTED - 1, |a, b| a.0.load_cmp(&b.0));
            let last = last.0;
            // Every replica tied with the last too: one left out would be
            // missed by a prompt whose tie-break prefers it.
            keys.retain(|(k, _)| k.load_cmp(&last).is_le());
        }
        let mut members: Vec<u32> = keys.into_iter().map(|(_, p)| p).collect();
        members.sort_unstable();
        Self {
            at_ms: reader.now_ms(),
            changes: reader.changes(),
            weights: *weights,
            prompt_class: prompt_class(input),
            exact_tokens: rates_differ.then(|| prompt_tokens(input)),
            fleet,
            members: members.into(),
        }
    }

    /// Whether this shortlist may answer `input` under `weights` now.
    pub(super) fn serves(
        &self,
        input: &PickInput<'_>,
        weights: &ScoreWeights,
        reader: &LoadReader<'_>,
    ) -> bool {
        let settings = reader.settings();
        let age = reader.now_ms().saturating_sub(self.at_ms);
        (0..settings.shortlist_refresh_ms).contains(&age)
            && reader.changes().wrapping_sub(self.changes) < settings.shortlist_refresh_changes
            && self.weights == *weights
            && (weights.ttft.is_none() || self.prompt_class == prompt_class(input))
            && self.exact_tokens.is_none_or(|t| t == prompt_tokens(input))
    }

    /// The eligible replicas to rank for a prompt held by the replicas
    /// hashing to `holders` ([`id_hash`]): those and the shortlisted ones,
    /// with the shortlist's fleet figures; `None` when fewer than
    /// [`OTHERS_RANKED`] shortlisted replicas besides the holders are
    /// eligible now (ranking every replica answers then).
    pub(super) fn eligible<'a>(
        &self,
        members: &'a [Arc<ReplicaMeta>],
        resolved: &MemberLoads,
        reader: &LoadReader<'_>,
        holders: &[u64],
        fresh_since: Option<i64>,
    ) -> Option<Eligible<'a>> {
        if self.members.len() > 2 * SHORTLISTED {
            // Most of the scope tied (an idle fleet): reading every load
            // is no dearer.
            return None;
        }
        let mut positions: Vec<usize> = Vec::with_capacity(self.members.len() + holders.len());
        for &h in holders {
            positions.extend(resolved.with_hash(h));
        }
        let mut others = 0;
        for &p in self.members.iter() {
            let p = p as usize;
            if resolved
                .id_hashes
                .get(p)
                .is_some_and(|h| !holders.contains(h))
            {
                if !members.get(p)?.answers(None, fresh_since) {
                    continue;
                }
                others += 1;
            }
            positions.push(p);
        }
        if others < OTHERS_RANKED {
            return None;
        }
        positions.sort_unstable();
        positions.dedup();
        let mut eligible = Eligible::with_capacity(positions.len());
        eligible.fleet = Some(self.fleet);
        for p in positions {
            let m = members.get(p)?;
            if m.answers(None, fresh_since) {
                eligible.push(
                    (&m.key, m.address.as_str()),
                    reader.member(resolved, p),
                    resolved.id_hashes[p],
                );
            }
        }
        Some(eligible)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(prompt_blocks: u32, block_size: u32) -> PickInput<'static> {
        PickInput {
            replicas: &[],
            matches: &[],
            speculative: &[],
            prompt_blocks,
            block_size,
            tie_seed: 0,
        }
    }

    #[test]
    fn a_prompt_class_is_its_power_of_two_of_tokens_at_any_size() {
        assert_eq!(prompt_class(&input(128, 16)), 11);
        assert_eq!(prompt_class(&input(255, 16)), 11);
        assert_eq!(prompt_class(&input(256, 16)), 12);
        assert_eq!(prompt_class(&input(0, 0)), 0);
        // No overflow at the largest sizes a request could name.
        assert_eq!(prompt_class(&input(u32::MAX, u32::MAX)), 63);
    }
}
