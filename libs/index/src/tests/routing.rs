//! The routing core over a real index: deadlines during the walk and the
//! fingerprinting, staleness as the clock moves, the policy's rules in order.

use std::cell::Cell;
use std::time::Duration;

use super::*;
use crate::route::{NoHintReason, RouteKey, RouteOutcome, RoutePolicy, RouteQuery, route};

/// A manual clock for deadlines: every look at the deadline moves time
/// by `step_ms`; it expires once `budget_ms` has passed.
struct ManualDeadline {
    now_ms: Cell<u64>,
    step_ms: u64,
    budget_ms: u64,
    looks: Cell<u32>,
}

impl ManualDeadline {
    fn new(step_ms: u64, budget_ms: u64) -> Self {
        Self {
            now_ms: Cell::new(0),
            step_ms,
            budget_ms,
            looks: Cell::new(0),
        }
    }
}

impl Deadline for ManualDeadline {
    fn expired(&self) -> bool {
        self.looks.set(self.looks.get() + 1);
        self.now_ms.set(self.now_ms.get() + self.step_ms);
        self.now_ms.get() > self.budget_ms
    }
}

fn decide(
    ix: &Index,
    key: RouteKey<'_>,
    policy: &RoutePolicy,
    now_ms: i64,
    deadline: &dyn Deadline,
) -> (Result<Vec<(String, u32)>, NoHintReason>, u32) {
    let s = scope("t");
    let query = RouteQuery {
        scope: &s,
        key,
        candidates: None,
        extras: None,
    };
    route(ix, &query, policy, 16, now_ms, deadline, |d| {
        let outcome = match d.outcome {
            RouteOutcome::Route(m) => Ok(m
                .iter()
                .map(|m| (m.replica.replica_id.clone(), m.matched_blocks))
                .collect()),
            RouteOutcome::NoHint { reason, .. } => Err(reason),
        };
        (outcome, d.prompt_blocks)
    })
}

fn big_index(blocks: u64) -> Index {
    let ix = Index::new(IndexConfig {
        capacity_entries: 200_000,
        shards: 8,
        ..IndexConfig::default()
    });
    let chain: Vec<Fingerprint> = (1..=blocks).map(Fingerprint).collect();
    put(&ix, "t", "a", &[stored(0, &chain, Tier::T1)]);
    ix
}

#[test]
fn the_deadline_stops_a_long_walk_midway() {
    let ix = big_index(50_000);
    let chain: Vec<Fingerprint> = (1..=50_000).map(Fingerprint).collect();
    let policy = RoutePolicy::default();
    // Unlimited: the whole chain matches.
    let (all, _) = decide(&ix, RouteKey::Blocks(&chain), &policy, 1_000, &NoDeadline);
    assert_eq!(all, Ok(vec![("a".into(), 50_000)]));
    // 1 ms per look, 5 ms budget: it gives up during the walk, after a
    // handful of looks, long before the chain's 195 windows.
    let deadline = ManualDeadline::new(1, 5);
    let (timed_out, blocks) = decide(&ix, RouteKey::Blocks(&chain), &policy, 1_000, &deadline);
    assert_eq!(timed_out, Err(NoHintReason::LookupTimeout));
    assert_eq!(blocks, 50_000);
    assert_eq!(deadline.looks.get(), 6, "looked during the walk, not after");
    // A budget spent before the walk (fingerprinting) answers at once.
    let spent = ManualDeadline::new(10, 5);
    let tokens: Vec<u32> = (0..16 * 100).collect();
    let (outcome, blocks) = decide(&ix, RouteKey::Tokens(&tokens), &policy, 1_000, &spent);
    assert_eq!(outcome, Err(NoHintReason::LookupTimeout));
    assert_eq!(blocks, 0, "nothing fingerprinted past the deadline");
    assert_eq!(spent.looks.get(), 2);
}

#[test]
fn the_deadline_stops_fingerprinting_a_huge_prompt() {
    let ix = big_index(10);
    let policy = RoutePolicy::default();
    // 2 M tokens, 131 072 blocks; the budget lasts three looks, so only
    // three pieces of 256 blocks are hashed before it gives up.
    let tokens: Vec<u32> = (0..(1u32 << 21)).collect();
    let deadline = ManualDeadline::new(1, 3);
    let (outcome, blocks) = decide(&ix, RouteKey::Tokens(&tokens), &policy, 1_000, &deadline);
    assert_eq!(outcome, Err(NoHintReason::LookupTimeout));
    assert_eq!(blocks, 3 * 256);
    // Piece by piece gives the same chain as all at once.
    let whole = ic_kvevents::chain_fingerprints(None, &tokens[..16 * 1000], 16);
    let s = scope("t");
    let query = RouteQuery {
        scope: &s,
        key: RouteKey::Tokens(&tokens[..16 * 1000]),
        candidates: None,
        extras: None,
    };
    assert_eq!(query.blocks_for_test(16).as_slice(), whole.as_slice());
}

#[test]
fn stale_replicas_drop_out_as_the_clock_moves() {
    let ix = index();
    // put() reports at 1_000 ms.
    put(&ix, "t", "a", &[stored(0, &fps(&[1, 2, 3]), Tier::T1)]);
    let policy = RoutePolicy {
        replica_stale_after: Duration::from_secs(120),
        ..RoutePolicy::default()
    };
    let at = |now_ms| {
        decide(
            &ix,
            RouteKey::Blocks(&fps(&[1, 2, 3])),
            &policy,
            now_ms,
            &NoDeadline,
        )
        .0
    };
    assert_eq!(at(1_000 + 120_000), Ok(vec![("a".into(), 3)]));
    assert_eq!(at(1_000 + 120_001), Err(NoHintReason::NoEntry));
}

#[test]
fn policy_rules_in_order() {
    let ix = index();
    put(&ix, "t", "a", &[stored(0, &fps(&[1, 2, 3]), Tier::T2)]);
    put(&ix, "t", "b", &[stored(0, &fps(&[1]), Tier::T1)]);
    let run =
        |policy: RoutePolicy, key: RouteKey<'_>| decide(&ix, key, &policy, 1_000, &NoDeadline).0;
    let blocks = RouteKey::Blocks(&fps(&[1, 2, 3]));
    assert_eq!(
        run(RoutePolicy::default(), blocks),
        Ok(vec![("a".into(), 3), ("b".into(), 1)])
    );
    let no_t2 = RoutePolicy {
        allow_tier2_matches: false,
        ..RoutePolicy::default()
    };
    assert_eq!(run(no_t2, blocks), Ok(vec![("b".into(), 1)]));
    let min = RoutePolicy {
        allow_tier2_matches: false,
        minimum_prefix_tokens: 32,
        ..RoutePolicy::default()
    };
    assert_eq!(run(min, blocks), Err(NoHintReason::BelowMinimumPrefix));
    assert_eq!(
        run(RoutePolicy::default(), RouteKey::Tokens(&[1, 2, 3])),
        Err(NoHintReason::PromptTooShort)
    );
    let other = Scope {
        model: "other".into(),
        ..scope("t")
    };
    let query = RouteQuery {
        scope: &other,
        key: blocks,
        candidates: None,
        extras: None,
    };
    let unknown = route(
        &ix,
        &query,
        &RoutePolicy::default(),
        16,
        1_000,
        &NoDeadline,
        |d| {
            matches!(
                d.outcome,
                RouteOutcome::NoHint {
                    reason: NoHintReason::UnknownModel,
                    ..
                }
            )
        },
    );
    assert!(unknown);
}
