//! Scores as llm-d's remote indexer API (`GetPodScores`) gives them: per
//! pod, the blocks it holds from the start of the prompt, each weighted by
//! its tier. Pure: the adapter passes the routing core's matches and the
//! scope's replicas in.
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
    /// The pod as the caller named it (the address's host when the caller
    /// named none).
    pub pod: String,
    /// Weighted blocks held from the start of the prompt.
    pub score: f64,
    /// The rank, for data-parallel engines only.
    pub dp_rank: Option<u32>,
}

/// Scores `identifiers` (every replica of `known` when empty) from the
/// routing core's `matches`. `known` is the scope's replicas, to tell
/// data-parallel engines (a pod with a rank above 0) from the rest. Pods
/// holding nothing are left out; the order is the caller's, then by rank.
pub fn pod_scores(
    known: &[(ReplicaKey, String)],
    matches: &[Candidate],
    identifiers: &[String],
    weights: TierWeights,
) -> Vec<PodScore> {
    let is_dp = |replica_id: &str| {
        known
            .iter()
            .any(|(k, _)| k.replica_id == replica_id && k.dp_rank > 0)
    };
    let weight = |m: &Candidate| match m.tier {
        Tier::T1 => weights.t1,
        Tier::T2 => weights.t2,
    };
    let score_of = |pod: String, m: &Candidate| PodScore {
        pod,
        score: f64::from(m.matched_blocks) * weight(m),
        dp_rank: is_dp(&m.replica.replica_id).then_some(m.replica.dp_rank),
    };
    let mut scores: Vec<PodScore> = Vec::new();
    if identifiers.is_empty() {
        for m in matches.iter().filter(|m| m.matched_blocks > 0) {
            let pod = if m.address.is_empty() {
                m.replica.replica_id.clone()
            } else {
                host(&m.address).to_owned()
            };
            scores.push(score_of(pod, m));
        }
    } else {
        for raw in identifiers {
            let id = PodIdentifier::parse(raw);
            let mut held: Vec<&Candidate> = matches
                .iter()
                .filter(|m| m.matched_blocks > 0 && id.names(&m.replica, &m.address))
                .collect();
            held.sort_by_key(|m| m.replica.dp_rank);
            for m in held {
                let score = score_of(id.base.clone(), m);
                // The same pod (or rank) named twice scores once.
                if !scores
                    .iter()
                    .any(|s| s.pod == score.pod && s.dp_rank == score.dp_rank)
                {
                    scores.push(score);
                }
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
        let scores = pod_scores(&known(&matches), &matches, &ids, TierWeights::default());
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
    fn data_parallel_ranks_are_scored_apart() {
        let matches = [
            candidate("engine-dp", 0, "10.0.0.5:8000", 2, Tier::T1),
            candidate("engine-dp", 1, "10.0.0.5:8000", 6, Tier::T1),
        ];
        let all = pod_scores(
            &known(&matches),
            &matches,
            &["10.0.0.5".into()],
            TierWeights::default(),
        );
        assert_eq!(
            all.iter()
                .map(|s| (s.pod.as_str(), s.score, s.dp_rank))
                .collect::<Vec<_>>(),
            vec![("10.0.0.5", 2.0, Some(0)), ("10.0.0.5", 6.0, Some(1))]
        );
        let one = pod_scores(
            &known(&matches),
            &matches,
            &["10.0.0.5@dp1".into(), "10.0.0.5@dp1".into()],
            TierWeights::default(),
        );
        assert_eq!(one.len(), 1, "named twice, scored once: {one:?}");
        assert_eq!(one[0].dp_rank, Some(1));
    }

    #[test]
    fn no_identifiers_scores_every_holder_by_host() {
        let matches = [
            candidate("engine-a", 0, "10.0.0.1:8000", 3, Tier::T1),
            candidate("engine-x", 0, "", 1, Tier::T1),
        ];
        let scores = pod_scores(&known(&matches), &matches, &[], TierWeights::default());
        let pods: Vec<&str> = scores.iter().map(|s| s.pod.as_str()).collect();
        assert_eq!(pods, ["10.0.0.1", "engine-x"]);
    }
}
