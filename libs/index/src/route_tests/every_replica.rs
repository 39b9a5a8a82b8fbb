//! A random fleet's ranking against ranking every replica, with every
//! holder answered and with only the best few.

use super::*;

/// [`route_ranked`] of a random fleet of `n` replicas answers what
/// ranking every replica answers: random holdings, loads, speculative
/// picks and candidate sets; loads are drawn from few values so that ties
/// are common. Answering at most `holders` holders ([`Scoring::holders`],
/// LookupRoute's `max_candidates`) keeps the whole ranking's first
/// `holders` holders, its best other, hint, destination and no-hint.
fn ranks_as_every_replica(
    n: usize,
    seed: u64,
    ttft: bool,
    named: bool,
    holders: usize,
) -> Result<(), proptest::test_runner::TestCaseError> {
    let mut next = seeded_below(seed);
    let ids: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let weights = ScoreWeights {
        ttft: ttft.then_some(TtftModel {
            tokens_per_ms: 16.0,
            overhead_ms: 2.0,
        }),
        ..ScoreWeights::default()
    };
    let fleet = Fleet::new(&names, weights);
    // Block 1 (which every replica holds) is not part of it.
    let prompt = fps(&[2, 3, 4, 5, 6, 7, 8, 9]);
    let tag = scope_tag(&scope());
    let mut candidates = std::collections::HashSet::new();
    for id in &ids {
        // A few replicas hold a longer prefix; loads of every kind.
        if next(6) == 0 {
            hold(&fleet.index, id, &prompt[..1 + next(8) as usize]);
        }
        // A large scope: half its replicas idle, so that more are tied for
        // the best than a shortlist holds.
        if n > 64 && next(2) == 0 {
            if next(2) == 0 {
                candidates.insert(id.clone());
            }
            continue;
        }
        for _ in 0..next(3) {
            fleet.load.picked(id, T0 - next(20_000) as i64);
        }
        for _ in 0..next(2) {
            fleet.load.started(id);
        }
        if next(2) == 0 {
            fleet.load.report_engine(
                id,
                crate::load::EngineLoad {
                    waiting: next(3) as u32,
                    running: next(3) as u32,
                    kv_usage: next(3) as f32 / 2.0,
                },
                T0 - next(40_000) as i64,
            );
        }
        if next(3) == 0 {
            fleet.load.add_work(id, next(3) as f64 * 50.0, T0);
        }
        if next(8) == 0 {
            fleet
                .speculation
                .record(tag, id, &prompt[next(4) as usize..], T0);
        }
        if next(2) == 0 {
            candidates.insert(id.clone());
        }
    }
    let candidates = named.then_some(&candidates);
    // Twice at each moment: a large scope's second lookup reads only its
    // holders and the shortlist the first one built.
    for now in [T0, T0, T0 + 1_000, T0 + 1_000] {
        let refreshes = fleet.load.shortlist_refreshes();
        let scope = scope();
        let query = RouteQuery {
            scope: &scope,
            key: RouteKey::Blocks(&prompt),
            candidates,
            extras: None,
        };
        let ask = |holders: usize| {
            route_ranked(
                &fleet.index,
                &query,
                &RoutePolicy::default(),
                16,
                now,
                &NoDeadline,
                Scoring {
                    weights: &fleet.weights,
                    source: &Boards {
                        load: &fleet.load,
                        speculation: &fleet.speculation,
                    },
                    scope_tag: tag,
                    pool: None,
                    others: crate::pick::OTHERS_RANKED,
                    holders,
                },
            )
        };
        let got = ask(usize::MAX);
        let cut = ask(holders);
        let held = |r: &Ranked| -> Vec<crate::pick::Scored> {
            r.ranked
                .iter()
                .filter(|s| s.matched_blocks > 0)
                .cloned()
                .collect()
        };
        let other = |r: &Ranked| r.ranked.iter().find(|s| s.matched_blocks == 0).cloned();
        let mut first = held(&got);
        first.truncate(holders);
        proptest::prop_assert_eq!(held(&cut), first, "at most {} holders", holders);
        proptest::prop_assert_eq!(other(&cut), other(&got));
        proptest::prop_assert_eq!(cut.best(), got.best());
        proptest::prop_assert_eq!(cut.destination(), got.destination());
        proptest::prop_assert_eq!(&cut.no_hint, &got.no_hint);
        proptest::prop_assert_eq!(got.ranked, full_ranking(&fleet, &prompt, candidates, now));
        if candidates.is_none() && n > 64 {
            proptest::prop_assert!(
                fleet.load.shortlist_refreshes() <= refreshes + 1,
                "one rebuild at most"
            );
        }
    }
    if candidates.is_none() && n > 64 {
        proptest::prop_assert_eq!(fleet.load.shortlist_refreshes(), 2, "one build per moment");
    }
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// The shortlist of one lookup (every holder and the best few others by
    /// their key) answers what ranking every replica answers.
    #[test]
    fn ranking_a_shortlist_answers_as_ranking_every_replica(
        n in 1usize..60,
        seed in proptest::prelude::any::<u64>(),
        ttft in proptest::prelude::any::<bool>(),
        named in proptest::prelude::any::<bool>(),
        holders in 1usize..12,
    ) {
        ranks_as_every_replica(n, seed, ttft, named, holders)?;
    }

    /// A large scope's shortlist kept between lookups answers, at the
    /// moment it was built, what ranking every replica answers.
    #[test]
    fn a_shortlist_kept_between_lookups_answers_as_ranking_every_replica(
        n in 65usize..200,
        seed in proptest::prelude::any::<u64>(),
        ttft in proptest::prelude::any::<bool>(),
        named in proptest::prelude::any::<bool>(),
        holders in 1usize..12,
    ) {
        ranks_as_every_replica(n, seed, ttft, named, holders)?;
    }
}
