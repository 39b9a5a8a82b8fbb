//! Scores as llm-d's remote indexer API (`GetPodScores`) gives them: per
//! pod, the blocks it holds from the start of the prompt, each weighted by
//! its own tier. Pure: the adapter passes the routing core's matches (with
//! their weighted scores, [`uniform_score`] or [`block_by_block_score`])
//! and the scope's replicas in.
//!
//! llm-d names pods by address (`10.0.0.7`) and, for data-parallel engines,
//! one rank as `10.0.0.7@dp1`; our replicas are named by pod and carry an
//! `ip:port` address. A pod identifier therefore matches a replica by its
//! name, its full address or the address's host, and an `@dpN` suffix
//! narrows it to that rank.

use crate::types::{Candidate, ReplicaKey, Tier};

/// How much a block held at each tier is worth.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierWeights {
    /// A block in the engine's own (GPU) cache.
    pub t1: f64,
    /// A block only in the engine's CPU/offload tier.
    pub t2: f64,
}

impl Default for TierWeights {
    /// llm-d's defaults: GPU 1.0, CPU 0.8.
    fn default() -> Self {
        Self { t1: 1.0, t2: 0.8 }
    }
}

/// A pod as the caller named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIdentifier {
    /// The name or address, without the rank suffix.
    pub base: String,
    /// The data-parallel rank named by an `@dpN` suffix.
    pub dp_rank: Option<u32>,
}

impl PodIdentifier {
    /// Reads `pod`, `ip`, `ip:port`, each optionally with `@dpN`.
    pub fn parse(identifier: &str) -> Self {
        if let Some((base, rank)) = identifier.rsplit_once("@dp")
            && let Ok(rank) = rank.parse::<u32>()
            && !base.is_empty()
        {
            return Self {
                base: base.to_owned(),
                dp_rank: Some(rank),
            };
        }
        Self {
            base: identifier.to_owned(),
            dp_rank: None,
        }
    }

    fn names(&self, replica: &ReplicaKey, address: &str) -> bool {
        let named = self.base == replica.replica_id
            || self.base == address
            || (!address.is_empty() && self.base == host(address));
        named && self.dp_rank.is_none_or(|r| r == replica.dp_rank)
    }
}

/// The host of an `ip:port` (or `[v6]:port`) address.
fn host(address: &str) -> &str {
    match address.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) && !host.is_empty() => {
            host.trim_start_matches('[').trim_end_matches(']')
        }
        _ => address,
    }
}

/// One pod's score.
#[derive(Clone, Debug, PartialEq)]
pub struct PodScore {
    /// The pod as the caller named it; when the caller named none, its
    /// address (`ip:port`, as llm-d's index names pods), or its name when
    /// it reported no address.
    pub pod: String,
    /// Weighted blocks held from the start of the prompt.
    pub score: f64,
    /// The rank, for data-parallel engines only: the one named, or else the
    /// pod's best rank.
    pub dp_rank: Option<u32>,
}

/// The weight of a match whose blocks are all at its (coldest) tier: right
/// for every T1 match, since a match is T1 only when each block is.
pub fn uniform_score(m: &Candidate, weights: TierWeights) -> f64 {
    f64::from(m.matched_blocks) * tier_weight(m.tier, weights)
}

/// The weight of a match block by block, as llm-d's longest-prefix scorer
/// sums it: each held block counts its own tier's weight.
pub fn block_by_block_score(tiers: impl IntoIterator<Item = Tier>, weights: TierWeights) -> f64 {
    tiers.into_iter().map(|t| tier_weight(t, weights)).sum()
}

fn tier_weight(tier: Tier, weights: TierWeights) -> f64 {
    match tier {
        Tier::T1 => weights.t1,
        Tier::T2 => weights.t2,
    }
}

/// Scores `identifiers` (every pod of `known` when empty) from the
/// routing core's matches, each with its weighted score. `known` is the
/// scope's replicas, to tell data-parallel engines (a pod with a rank above
/// 0) from the rest. One entry per identifier (per pod when none are
/// named): a data-parallel pod scores its best rank, unless the identifier
/// names a rank (`@dpN`), since a client keying a map by `pod` keeps only
/// one entry. Pods holding nothing are left out; the order is the
/// caller's.
pub fn pod_scores(
    known: &[(ReplicaKey, String)],
    matches: &[(Candidate, f64)],
    identifiers: &[String],
) -> Vec<PodScore> {
    let is_dp = |replica_id: &str| {
        known
            .iter()
            .any(|(k, _)| k.replica_id == replica_id && k.dp_rank > 0)
    };
    // The best of `held` (highest score, then lowest rank), as `pod`.
    let best = |pod: String, held: &[&(Candidate, f64)]| {
        let (m, score) = held.iter().copied().min_by(|(a, sa), (b, sb)| {
            sb.total_cmp(sa)
                .then(a.replica.dp_rank.cmp(&b.replica.dp_rank))
        })?;
        Some(PodScore {
            pod,
            score: *score,
            dp_rank: is_dp(&m.replica.replica_id).then_some(m.replica.dp_rank),
        })
    };
    let held: Vec<&(Candidate, f64)> = matches
        .iter()
        .filter(|(m, _)| m.matched_blocks > 0)
        .collect();
    let mut scores: Vec<PodScore> = Vec::new();
    if identifiers.is_empty() {
        let mut pods: Vec<&str> = Vec::new();
        for (m, _) in &held {
            if !pods.contains(&m.replica.replica_id.as_str()) {
                pods.push(&m.replica.replica_id);
            }
        }
        for pod in pods {
            let of_pod: Vec<_> = held
                .iter()
                .copied()
                .filter(|(m, _)| m.replica.replica_id == pod)
                .collect();
            let name = of_pod
                .iter()
                .map(|(m, _)| m.address.as_str())
                .find(|a| !a.is_empty())
                .unwrap_or(pod);
            scores.extend(best(name.to_owned(), &of_pod));
        }
    } else {
        for raw in identifiers {
            let id = PodIdentifier::parse(raw);
            let named: Vec<_> = held
                .iter()
                .copied()
                .filter(|(m, _)| id.names(&m.replica, &m.address))
                .collect();
            let Some(score) = best(id.base.clone(), &named) else {
                continue;
            };
            // The same pod (or rank) named twice scores once.
            if !scores
                .iter()
                .any(|s| s.pod == score.pod && s.dp_rank == score.dp_rank)
            {
                scores.push(score);
            }
        }
    }
    scores
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, dp: u32) -> ReplicaKey {
        ReplicaKey {
            tenant: "t".into(),
            replica_id: id.into(),
            dp_rank: dp,
        }
    }

    fn candidate(id: &str, dp: u32, address: &str, blocks: u32, tier: Tier) -> Candidate {
        Candidate {
            replica: key(id, dp),
            address: address.into(),
            matched_blocks: blocks,
            block_size: 16,
            tier,
        }
    }

    fn known(cs: &[Candidate]) -> Vec<(ReplicaKey, String)> {
        cs.iter()
            .map(|c| (c.replica.clone(), c.address.clone()))
            .collect()
    }

    #[test]
    fn identifiers_parse_with_and_without_a_rank() {
        assert_eq!(
            PodIdentifier::parse("10.0.0.7@dp3"),
            PodIdentifier {
                base: "10.0.0.7".into(),
                dp_rank: Some(3)
            }
        );
        assert_eq!(PodIdentifier::parse("10.0.0.7:8000").dp_rank, None);
        // Not a rank: kept whole.
        assert_eq!(PodIdentifier::parse("pod@dpx").base, "pod@dpx");
        assert_eq!(PodIdentifier::parse("@dp1").base, "@dp1");
        assert_eq!(host("[fd00::1]:8000"), "fd00::1");
        assert_eq!(host("engine-0"), "engine-0");
    }

    fn uniform(cs: &[Candidate]) -> Vec<(Candidate, f64)> {
        cs.iter()
            .map(|c| (c.clone(), uniform_score(c, TierWeights::default())))
            .collect()
    }

    #[test]
    fn pods_match_by_name_address_or_host_and_t2_counts_less() {
        let matches = [
            candidate("engine-a", 0, "10.0.0.1:8000", 4, Tier::T1),
            candidate("engine-b", 0, "10.0.0.2:8000", 5, Tier::T2),
            candidate("engine-c", 0, "10.0.0.3:8000", 0, Tier::T1),
        ];
        let ids: Vec<String> = ["10.0.0.1", "10.0.0.2:8000", "engine-c", "10.9.9.9"]
            .map(String::from)
            .to_vec();
        let scores = pod_scores(&known(&matches), &uniform(&matches), &ids);
        assert_eq!(
            scores,
            vec![
                PodScore {
                    pod: "10.0.0.1".into(),
                    score: 4.0,
                    dp_rank: None
                },
                PodScore {
                    pod: "10.0.0.2:8000".into(),
                    score: 4.0,
                    dp_rank: None
                },
            ],
            "engine-c holds nothing and 10.9.9.9 is unknown: both left out"
        );
    }

    #[test]
    fn mixed_tiers_weigh_block_by_block() {
        let w = TierWeights::default();
        // GPU, GPU, CPU, GPU: 1 + 1 + 0.8 + 1, where the coldest tier alone
        // would give 4 × 0.8.
        let tiers = [Tier::T1, Tier::T1, Tier::T2, Tier::T1];
        assert!((block_by_block_score(tiers, w) - 3.8).abs() < 1e-9);
        let m = candidate("a", 0, "10.0.0.1:8000", 4, Tier::T2);
        assert!((uniform_score(&m, w) - 3.2).abs() < 1e-9);
        assert_eq!(block_by_block_score([], w), 0.0);
    }

    #[test]
    fn a_data_parallel_pod_scores_its_best_rank_unless_a_rank_is_named() {
        let matches = [
            candidate("engine-dp", 0, "10.0.0.5:8000", 2, Tier::T1),
            candidate("engine-dp", 1, "10.0.0.5:8000", 6, Tier::T1),
            candidate("engine-dp", 2, "10.0.0.5:8000", 6, Tier::T1),
        ];
        let scored = uniform(&matches);
        let all = pod_scores(&known(&matches), &scored, &["10.0.0.5".into()]);
        assert_eq!(
            all,
            vec![PodScore {
                pod: "10.0.0.5".into(),
                score: 6.0,
                dp_rank: Some(1)
            }],
            "one entry per pod, its best rank (the lowest of equals)"
        );
        let none_named = pod_scores(&known(&matches), &scored, &[]);
        assert_eq!(none_named.len(), 1, "{none_named:?}");
        assert_eq!(none_named[0].dp_rank, Some(1));
        let one = pod_scores(
            &known(&matches),
            &scored,
            &["10.0.0.5@dp0".into(), "10.0.0.5@dp0".into()],
        );
        assert_eq!(one.len(), 1, "named twice, scored once: {one:?}");
        assert_eq!((one[0].score, one[0].dp_rank), (2.0, Some(0)));
        let two = pod_scores(
            &known(&matches),
            &scored,
            &["10.0.0.5@dp0".into(), "10.0.0.5@dp2".into()],
        );
        assert_eq!(
            two.iter().map(|s| s.dp_rank).collect::<Vec<_>>(),
            [Some(0), Some(2)]
        );
    }

    #[test]
    fn no_identifiers_names_pods_by_address_as_llm_d_does() {
        let matches = [
            candidate("engine-a", 0, "10.0.0.1:8000", 3, Tier::T1),
            candidate("engine-x", 0, "", 1, Tier::T1),
        ];
        let scores = pod_scores(&known(&matches), &uniform(&matches), &[]);
        let pods: Vec<&str> = scores.iter().map(|s| s.pod.as_str()).collect();
        assert_eq!(pods, ["10.0.0.1:8000", "engine-x"]);
    }
}
