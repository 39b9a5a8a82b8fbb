//! Tests of the ranking ([`super`]): scores, order, load bound, TTFT.

use super::*;
use crate::Candidate;

#[test]
fn by_ttft_the_prefix_weight_prices_a_prefill_against_a_wait() {
    let r = replicas(&["a", "b"]);
    let r = refs(&r);
    // a holds 9 of 10 blocks (16 tokens each) behind a 30 ms queue; b
    // holds nothing and is idle. At 8 tokens per ms and 2 ms a request:
    // a 30 + 2 + 2 = 34 ms, b 2 + 20 = 22 ms.
    let m = [matched("a", 9, Tier::T1)];
    let m = as_matches(&m);
    let mut load = loads(&r, |_| 0.0);
    load[0].queued_ms = 30.0;
    let ttft = |prefix: f64| ScoreWeights {
        prefix,
        load_bound: None,
        ttft: Some(TtftModel {
            tokens_per_ms: 8.0,
            overhead_ms: 2.0,
        }),
        ..ScoreWeights::default()
    };
    let first = |w: &ScoreWeights| {
        rank(&input(&r, &m, &[], 1), w, &load)[0]
            .replica
            .replica_id
            .clone()
    };
    assert_eq!(first(&ttft(1.0)), "b", "the user's wait alone");
    // Weighed twice, b's cold prefill (44) costs more than a's wait (38).
    assert_eq!(first(&ttft(2.0)), "a");
    assert_eq!(first(&ScoreWeights::default()), "a", "weights: the holder");
}

#[test]
fn by_ttft_at_the_default_the_ranking_does_not_depend_on_the_rate_assumed() {
    // Queues the server built from picks at the rate it assumed, not yet
    // drained: at any assumed rate every score scales alike, so the
    // order is the same (with a fixed cost per request it would not be:
    // the default has none).
    let ids: Vec<String> = (0..12).map(|i| format!("r{i}")).collect();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let r = replicas(&names);
    let r = refs(&r);
    let mut seed = 7u64;
    let mut next = move |n: u64| {
        seed = mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15));
        seed % n
    };
    for case in 0..200 {
        let m: Vec<Candidate> = (0..next(5))
            .map(|_| matched(&format!("r{}", next(12)), 1 + next(10) as u32, Tier::T1))
            .collect();
        let m = as_matches(&m);
        let queued_tokens: Vec<f64> = (0..12).map(|_| (next(6) * 160) as f64).collect();
        let order = |tokens_per_ms: f64| {
            let model = TtftModel {
                tokens_per_ms,
                ..TtftModel::DEFAULT
            };
            let load: Vec<ReplicaLoad> = queued_tokens
                .iter()
                .map(|q| ReplicaLoad {
                    requests: 1.0,
                    queued_ms: model.work_ms(*q),
                    ..ReplicaLoad::default()
                })
                .collect();
            rank(
                &input(&r, &m, &[], case),
                &ScoreWeights::by_ttft(model),
                &load,
            )
            .into_iter()
            .map(|s| s.replica.replica_id)
            .collect::<Vec<_>>()
        };
        let assumed = order(TtftModel::DEFAULT.tokens_per_ms);
        // Powers of two: scaling by them is exact in floating point,
        // so ties stay ties.
        for faster in [0.0625, 0.5, 2.0, 16.0] {
            assert_eq!(
                order(TtftModel::DEFAULT.tokens_per_ms * faster),
                assumed,
                "case {case}, rate x{faster}"
            );
        }
    }
}

fn key(id: &str) -> ReplicaKey {
    ReplicaKey {
        tenant: "t".into(),
        replica_id: id.into(),
        dp_rank: 0,
    }
}

fn replicas(ids: &[&str]) -> Vec<(ReplicaKey, String)> {
    ids.iter()
        .map(|id| (key(id), format!("{id}:8000")))
        .collect()
}

fn refs(r: &[(ReplicaKey, String)]) -> Vec<(&ReplicaKey, &str)> {
    r.iter().map(|(k, a)| (k, a.as_str())).collect()
}

fn matched(id: &str, blocks: u32, tier: Tier) -> Candidate {
    Candidate {
        replica: key(id),
        address: format!("{id}:8000"),
        matched_blocks: blocks,
        block_size: 16,
        tier,
    }
}

/// The matches as the ranking reads them.
fn as_matches(c: &[Candidate]) -> Vec<Match<'_>> {
    c.iter().map(Candidate::as_match).collect()
}

fn input<'a>(
    replicas: &'a [(&'a ReplicaKey, &'a str)],
    matches: &'a [Match<'a>],
    speculative: &'a [(String, u32)],
    seed: u64,
) -> PickInput<'a> {
    PickInput {
        replicas,
        matches,
        speculative,
        prompt_blocks: 10,
        block_size: 16,
        tie_seed: seed,
    }
}

fn loads(r: &[(&ReplicaKey, &str)], f: impl Fn(&str) -> f64) -> Vec<ReplicaLoad> {
    r.iter()
        .map(|(k, _)| ReplicaLoad {
            requests: f(&k.replica_id),
            ..ReplicaLoad::default()
        })
        .collect()
}

#[test]
fn the_longest_match_wins_when_loads_are_equal() {
    let r = replicas(&["a", "b", "c"]);
    let r = refs(&r);
    let m = [matched("a", 4, Tier::T1), matched("b", 8, Tier::T1)];
    let m = as_matches(&m);
    let ranked = rank(&input(&r, &m, &[], 1), &ScoreWeights::default(), &[]);
    assert_eq!(ranked[0].replica.replica_id, "b");
    assert_eq!(ranked[1].replica.replica_id, "a");
    assert_eq!(ranked[2].matched_blocks, 0);
}

#[test]
fn t1_beats_t2_at_equal_length() {
    let r = replicas(&["a", "b"]);
    let r = refs(&r);
    let m = [matched("a", 8, Tier::T2), matched("b", 8, Tier::T1)];
    let m = as_matches(&m);
    let ranked = rank(&input(&r, &m, &[], 1), &ScoreWeights::default(), &[]);
    assert_eq!(ranked[0].replica.replica_id, "b");
}

#[test]
fn equal_matches_spread_over_requests_instead_of_piling_up() {
    // Every replica holds the shared first block only: the choice must
    // depend on the request, not on which replica was active last.
    let r = replicas(&["a", "b", "c", "d"]);
    let r = refs(&r);
    let m: Vec<Candidate> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| matched(id, 1, Tier::T1))
        .collect();
    let m = as_matches(&m);
    let picks: std::collections::BTreeSet<String> = (0..64)
        .map(|seed| {
            rank(&input(&r, &m, &[], seed), &ScoreWeights::default(), &[])[0]
                .replica
                .replica_id
                .clone()
        })
        .collect();
    assert_eq!(picks.len(), 4, "{picks:?}");
}

#[test]
fn by_ttft_equal_predictions_go_by_the_own_picks_not_the_peers() {
    // Idle replicas holding the shared first block predict the same TTFT;
    // the pick count with the peers' differs (within the bound), this
    // server's own does not. Index replicas see each other's picks only
    // every report, so breaking the tie by the shared count would send
    // every replica's tied pick to "a" between two reports.
    let r = replicas(&["a", "b", "c", "d"]);
    let r = refs(&r);
    let m: Vec<Candidate> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| matched(id, 1, Tier::T1))
        .collect();
    let m = as_matches(&m);
    let l = loads(&r, |id| if id == "a" { 10.0 } else { 11.0 });
    let weights = ScoreWeights::by_ttft(TtftModel::DEFAULT);
    let picks: std::collections::BTreeSet<String> = (0..64)
        .map(|seed| {
            rank(&input(&r, &m, &[], seed), &weights, &l)[0]
                .replica
                .replica_id
                .clone()
        })
        .collect();
    assert_eq!(picks.len(), 4, "{picks:?}");
    // This server's own picks still order the tie.
    let mut own = l.clone();
    own[2].own_requests = 1.0;
    for seed in 0..64 {
        let best = &rank(&input(&r, &m, &[], seed), &weights, &own)[0];
        assert_ne!(best.replica.replica_id, "c", "seed {seed}");
    }
    // By the weights the count is the load, and the least picked wins.
    let by_weights = rank(&input(&r, &m, &[], 3), &ScoreWeights::default(), &l);
    assert_eq!(by_weights[0].replica.replica_id, "a");
}

#[test]
fn a_replica_over_the_load_bound_is_passed_over() {
    let r = replicas(&["a", "b", "c", "d"]);
    let r = refs(&r);
    let m = [matched("a", 10, Tier::T1)];
    let m = as_matches(&m);
    // a: 9 requests, the rest 1 each: fair share after this one is
    // (12 + 1) / 4 = 3.25, the bound 1.25 × 3.25 ≈ 4.06 < 9 + 1.
    let load = loads(&r, |id| if id == "a" { 9.0 } else { 1.0 });
    let ranked = rank(&input(&r, &m, &[], 1), &ScoreWeights::default(), &load);
    assert_ne!(ranked[0].replica.replica_id, "a");
    assert!(
        ranked
            .last()
            .is_some_and(|s| s.over_bound && s.replica.replica_id == "a")
    );
    // Unbounded and prefix only, the full match wins regardless.
    let ranked = rank(&input(&r, &m, &[], 1), &ScoreWeights::prefix_only(), &load);
    assert_eq!(ranked[0].replica.replica_id, "a");
}

#[test]
fn load_outweighs_a_small_prefix_difference() {
    let r = replicas(&["a", "b"]);
    let r = refs(&r);
    let m = [matched("a", 6, Tier::T1), matched("b", 5, Tier::T1)];
    let m = as_matches(&m);
    let load = loads(&r, |id| if id == "a" { 4.0 } else { 0.0 });
    let weights = ScoreWeights {
        load_bound: None,
        ..ScoreWeights::default()
    };
    let ranked = rank(&input(&r, &m, &[], 1), &weights, &load);
    assert_eq!(ranked[0].replica.replica_id, "b");
}

#[test]
fn a_speculative_holding_counts_until_the_real_one_is_longer() {
    let r = replicas(&["a", "b"]);
    let r = refs(&r);
    let spec = [("b".to_owned(), 10)];
    let ranked = rank(&input(&r, &[], &spec, 1), &ScoreWeights::default(), &[]);
    assert_eq!(ranked[0].replica.replica_id, "b");
    assert!(ranked[0].speculative);
    let m = [matched("b", 10, Tier::T1)];
    let m = as_matches(&m);
    let ranked = rank(&input(&r, &m, &spec, 1), &ScoreWeights::default(), &[]);
    assert!(!ranked[0].speculative, "the real match replaces it");
}

#[test]
fn every_holder_and_only_the_least_loaded_others_are_returned_in_order() {
    let ids: Vec<String> = (0..40).map(|i| format!("r{i:02}")).collect();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let r = replicas(&names);
    let r = refs(&r);
    // Two holders, the second heavily loaded; the others loaded in
    // reverse order of their names, so the least loaded come last.
    let m = [matched("r00", 10, Tier::T1), matched("r01", 10, Tier::T1)];
    let m = as_matches(&m);
    let load = loads(&r, |id| match id {
        "r00" => 0.0,
        "r01" => 50.0,
        _ => f64::from(40 - id[1..].parse::<u8>().unwrap_or(0)),
    });
    let weights = ScoreWeights {
        load_bound: None,
        ..ScoreWeights::default()
    };
    let ranked = rank(&input(&r, &m, &[], 1), &weights, &load);
    let got: Vec<&str> = ranked
        .iter()
        .map(|s| s.replica.replica_id.as_str())
        .collect();
    assert_eq!(
        got,
        [
            "r00", "r01", "r39", "r38", "r37", "r36", "r35", "r34", "r33", "r32"
        ]
    );
    assert_eq!(ranked.len(), 2 + OTHERS_RANKED);
}

#[test]
fn the_load_order_is_the_rank_order_without_the_tie_break() {
    let weights = ScoreWeights::default();
    let fleet = Fleet::of(2, &[]);
    let input = PickInput {
        replicas: &[],
        matches: &[],
        speculative: &[],
        prompt_blocks: 4,
        block_size: 16,
        tie_seed: 7,
    };
    let load = |requests| ReplicaLoad {
        requests,
        ..ReplicaLoad::default()
    };
    let a = OtherKey::new(&input, &weights, &fleet, &load(1.0), id_hash("a"));
    let b = OtherKey::new(&input, &weights, &fleet, &load(1.0), id_hash("b"));
    let c = OtherKey::new(&input, &weights, &fleet, &load(2.0), id_hash("a"));
    assert_eq!(a.load_cmp(&b), std::cmp::Ordering::Equal);
    assert_ne!(
        a.rank_cmp(&b),
        std::cmp::Ordering::Equal,
        "ties differ by hash"
    );
    assert_eq!(a.load_cmp(&c), std::cmp::Ordering::Less);
    assert_eq!(c.load_cmp(&b), std::cmp::Ordering::Greater);
}

#[test]
fn ranking_the_holders_and_the_best_others_by_their_key_is_ranking_all() {
    // Loads drawn from a small set, so ties (on score, requests and the
    // load bound) are frequent; dp ranks share an id and a tie hash.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        seed = mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15));
        seed % n
    };
    for case in 0..300 {
        let n = 1 + next(40) as usize;
        let all: Vec<(ReplicaKey, String)> = (0..n)
            .map(|i| {
                let mut k = key(&format!("r{}", i / 2));
                k.dp_rank = (i % 2) as u32;
                (k, format!("r{i}:8000"))
            })
            .collect();
        let r = refs(&all);
        let m: Vec<Candidate> = (0..next(4))
            .map(|_| {
                matched(
                    &format!("r{}", next(n as u64) / 2),
                    1 + next(10) as u32,
                    Tier::T1,
                )
            })
            .collect();
        let m = as_matches(&m);
        let loads: Vec<ReplicaLoad> = (0..n)
            .map(|_| ReplicaLoad {
                requests: next(4) as f64,
                kv_usage: next(3) as f64 / 2.0,
                queued_ms: next(3) as f64 * 10.0,
                prefill_tokens_per_ms: (next(2) == 0).then_some(8.0),
                own_requests: next(4) as f64,
            })
            .collect();
        let ttft = case % 2 == 1;
        let weights = ScoreWeights {
            ttft: ttft.then_some(TtftModel {
                tokens_per_ms: 16.0,
                overhead_ms: 2.0,
            }),
            ..ScoreWeights::default()
        };
        let whole = input(&r, &m, &[], case);
        let expected = rank(&whole, &weights, &loads);
        let fleet = Fleet::of(r.len(), &loads);
        let held = |k: &ReplicaKey| m.iter().any(|c| c.replica.replica_id == k.replica_id);
        let mut others: Vec<usize> = (0..n).filter(|&i| !held(r[i].0)).collect();
        let other_key = |i: usize| {
            OtherKey::new(
                &whole,
                &weights,
                &fleet,
                &loads[i],
                id_hash(&r[i].0.replica_id),
            )
        };
        others.sort_by(|&a, &b| {
            other_key(a)
                .rank_cmp(&other_key(b))
                .then(r[a].0.cmp(r[b].0))
        });
        others.truncate(OTHERS_RANKED);
        let part: Vec<usize> = (0..n)
            .filter(|&i| held(r[i].0) || others.contains(&i))
            .collect();
        let part_replicas: Vec<(&ReplicaKey, &str)> = part.iter().map(|&i| r[i]).collect();
        let part_loads: Vec<ReplicaLoad> = part.iter().map(|&i| loads[i]).collect();
        let got = rank_in(
            &input(&part_replicas, &m, &[], case),
            &weights,
            &part_loads,
            &fleet,
        );
        assert_eq!(got, expected, "case {case}");
    }
}

#[test]
fn the_best_by_load_are_the_rank_order_of_a_prompt_nobody_holds() {
    let ids: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let r = replicas(&names);
    let r = refs(&r);
    let mut seed = 11u64;
    let mut next = move |n: u64| {
        seed = mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15));
        seed % n
    };
    let weights = [
        ScoreWeights::default(),
        ScoreWeights::by_ttft(TtftModel::DEFAULT),
        ScoreWeights {
            load_bound: None,
            ..ScoreWeights::default()
        },
    ];
    for case in 0..300 {
        // Few distinct figures: ties are the hard part.
        let load: Vec<ReplicaLoad> = (0..r.len())
            .map(|_| ReplicaLoad {
                requests: next(4) as f64,
                own_requests: next(3) as f64,
                queued_ms: (next(3) * 10) as f64,
                kv_usage: next(2) as f64 * 0.5,
                prefill_tokens_per_ms: None,
            })
            .collect();
        let w = &weights[case % weights.len()];
        let i = PickInput {
            prompt_blocks: 0,
            block_size: 0,
            ..input(&r, &[], &[], next(1 << 20))
        };
        let ranked: Vec<usize> = rank(&i, w, &load)
            .iter()
            .map(|s| {
                r.iter()
                    .position(|(k, _)| **k == s.replica)
                    .expect("a pool replica")
            })
            .collect();
        for n in [1, 3, OTHERS_RANKED] {
            assert_eq!(
                best_by_load(&i, w, &load, n),
                ranked[..n],
                "case {case}, {n} best"
            );
        }
        // rank returns OTHERS_RANKED of them; asked for every one, the
        // rest follow in the same order.
        let all = best_by_load(&i, w, &load, r.len() + 1);
        assert_eq!(all[..OTHERS_RANKED], ranked[..], "case {case}");
        let mut seen = all.clone();
        seen.sort_unstable();
        assert_eq!(seen, (0..r.len()).collect::<Vec<_>>(), "case {case}");
    }
}
