//! The load-aware routing core against a real index, with time passed in.

use crate::load::{LoadBoard, LoadSettings};
use crate::pick::ScoreWeights;
use crate::route::{
    Boards, NoHintReason, Ranked, RouteKey, RoutePolicy, RouteQuery, Scoring, route_ranked,
    scope_tag,
};
use crate::speculative::{Speculation, SpeculationSettings};
use crate::*;

const T0: i64 = 1_700_000_000_000;

fn scope() -> Scope {
    Scope {
        tenant: "t".into(),
        model: "m".into(),
        hash_scheme: HashScheme::Vllm,
        adapter: String::new(),
    }
}

fn fps(v: &[u64]) -> Vec<Fingerprint> {
    Fingerprint::from_raw(v.to_vec())
}

fn hold(ix: &Index, id: &str, fps: &[Fingerprint]) {
    let key = ReplicaKey {
        tenant: "t".into(),
        replica_id: id.into(),
        dp_rank: 0,
    };
    let change = Change::Stored {
        start_depth: 0,
        fingerprints: fps.to_vec(),
        block_size: 16,
        tier: Tier::T1,
    };
    assert!(
        ix.apply(&key, &scope(), &format!("{id}:8000"), &[change], T0)
            .is_empty()
    );
}

struct Fleet {
    index: Index,
    load: LoadBoard,
    speculation: Speculation,
    weights: ScoreWeights,
}

impl Fleet {
    fn new(ids: &[&str], weights: ScoreWeights) -> Self {
        let index = Index::new(IndexConfig::default());
        for id in ids {
            // Every replica holds the fleet-wide system prompt (block 1).
            hold(&index, id, &fps(&[1]));
        }
        Self {
            index,
            load: LoadBoard::new(LoadSettings::default()),
            speculation: Speculation::new(SpeculationSettings::default()),
            weights,
        }
    }

    fn ask(&self, blocks: &[Fingerprint], now_ms: i64) -> Ranked {
        let scope = scope();
        let query = RouteQuery {
            scope: &scope,
            key: RouteKey::Blocks(blocks),
            candidates: None,
            extras: None,
        };
        route_ranked(
            &self.index,
            &query,
            &RoutePolicy::default(),
            16,
            now_ms,
            &NoDeadline,
            Scoring {
                weights: &self.weights,
                source: &Boards {
                    load: &self.load,
                    speculation: &self.speculation,
                },
                scope_tag: scope_tag(&scope),
                pool: None,
            },
        )
    }

    /// Routes like a gateway following `best`, recording the pick.
    fn route(&mut self, blocks: &[Fingerprint], now_ms: i64) -> Option<String> {
        let ranked = self.ask(blocks, now_ms);
        let best = ranked.best()?.replica.replica_id.clone();
        self.load.picked(&best, now_ms);
        self.speculation
            .record(scope_tag(&scope()), &best, &ranked.blocks, now_ms);
        Some(best)
    }
}

#[test]
fn a_shared_first_block_does_not_send_everything_to_one_replica() {
    let ids = ["a", "b", "c", "d"];
    for weights in [ScoreWeights::default(), ScoreWeights::prefix_only()] {
        let mut fleet = Fleet::new(&ids, weights);
        let mut per_replica = std::collections::BTreeMap::<String, u32>::new();
        for session in 0..40u64 {
            // A new conversation: the system prompt, then its own turn.
            let best = fleet
                .route(&fps(&[1, 1_000 + session]), T0 + session as i64)
                .unwrap();
            *per_replica.entry(best).or_default() += 1;
        }
        // The old tie-break (most recently active) sent all 40 to one
        // replica; ties now spread, and the load bound caps each.
        assert_eq!(per_replica.len(), 4, "{weights:?}: {per_replica:?}");
        if weights.load_bound.is_some() {
            assert!(per_replica.values().all(|n| *n <= 13), "{per_replica:?}");
        }
    }
}

#[test]
fn a_conversation_sticks_to_its_replica_until_it_is_overloaded() {
    let mut fleet = Fleet::new(&["a", "b", "c", "d"], ScoreWeights::default());
    hold(&fleet.index, "c", &fps(&[1, 10, 11, 12]));
    // The conversation's next turn goes where its history is.
    assert_eq!(
        fleet.route(&fps(&[1, 10, 11, 12, 13]), T0).as_deref(),
        Some("c")
    );
    // c is then picked over and over by other traffic: past its bound the
    // turn goes elsewhere, with no hint (nobody else holds its history).
    for i in 0..20 {
        fleet.load.picked("c", T0 + i);
    }
    let ranked = fleet.ask(&fps(&[1, 10, 11, 12, 13, 14]), T0 + 30);
    assert_eq!(
        ranked.ranked.last().map(|s| s.replica.replica_id.as_str()),
        Some("c")
    );
    assert!(ranked.ranked.last().is_some_and(|s| s.over_bound));
    assert_ne!(ranked.ranked[0].replica.replica_id, "c");
    // The others hold the system prompt, so the hint stands (a partial match).
    assert!(ranked.best().is_some());
}

/// Eight requests of one new conversation, 1 ms apart, on a fleet busy
/// with other traffic (20 recent requests each): which replicas they go to.
fn burst(speculation: SpeculationSettings) -> (Fleet, Vec<String>) {
    let mut fleet = Fleet::new(&["a", "b", "c", "d"], ScoreWeights::default());
    fleet.speculation = Speculation::new(speculation);
    for id in ["a", "b", "c", "d"] {
        for i in 0..20 {
            fleet.load.picked(id, T0 - 1_000 + i);
        }
    }
    let prompt = fps(&[1, 500, 501, 502]);
    let picks = (0..8)
        .map(|i| fleet.route(&prompt, T0 + i).unwrap())
        .collect();
    (fleet, picks)
}

#[test]
fn a_burst_sharing_a_prefix_lands_on_one_replica_before_its_events_arrive() {
    let prompt = fps(&[1, 500, 501, 502]);
    let (fleet, picks) = burst(SpeculationSettings::default());
    let first = &picks[0];
    // The first pick speculatively holds all four blocks.
    let ranked = fleet.ask(&prompt, T0 + 8);
    let held = ranked
        .ranked
        .iter()
        .find(|s| &s.replica.replica_id == first)
        .unwrap();
    assert!(held.speculative);
    assert_eq!(held.matched_blocks, 4);
    // The burst follows it while the load bound allows; without
    // speculation each request sees only the shared block and load
    // spreads them.
    let followed = picks.iter().filter(|p| *p == first).count();
    let (_, blind) = burst(SpeculationSettings {
        ttl_ms: 0,
        ..SpeculationSettings::default()
    });
    let blind_followed = blind.iter().filter(|p| **p == blind[0]).count();
    assert!(followed >= 4, "{picks:?}");
    assert!(followed > blind_followed, "{picks:?} vs {blind:?}");
    // Past the TTL, the speculation is gone.
    let later = fleet.ask(&prompt, T0 + 8 + 2_000);
    assert!(later.ranked.iter().all(|s| !s.speculative));
}

#[test]
fn speculation_never_outlives_its_replica_nor_shows_as_a_holding() {
    let mut fleet = Fleet::new(&["a", "b"], ScoreWeights::default());
    let best = fleet.route(&fps(&[1, 7, 8]), T0).unwrap();
    // Not a real holding: the index and its snapshot know nothing of 7, 8.
    let entries: u64 = fleet.index.snapshot().iter().map(|r| r.prefix_count).sum();
    assert_eq!(entries, 2, "only the two system-prompt blocks");
    // The replica leaves: its speculation goes with it.
    let key = ReplicaKey {
        tenant: "t".into(),
        replica_id: best.clone(),
        dp_rank: 0,
    };
    assert!(fleet.index.remove_replica(&key));
    fleet.speculation.retain(|id| id != best);
    let ranked = fleet.ask(&fps(&[1, 7, 8]), T0 + 1);
    assert!(ranked.ranked.iter().all(|s| s.replica.replica_id != best));
}

#[test]
fn when_every_holder_is_over_its_bound_there_is_no_hint_but_a_ranking() {
    let mut fleet = Fleet::new(&["a", "b"], ScoreWeights::default());
    // Only "a" holds a long private prefix; "b" holds only the system
    // prompt, which this prompt does not start with.
    hold(&fleet.index, "a", &fps(&[40, 41, 42]));
    for i in 0..10 {
        fleet.load.picked("a", T0 + i);
    }
    let ranked = fleet.ask(&fps(&[40, 41, 42]), T0 + 10);
    assert_eq!(
        ranked.no_hint.as_ref().map(|(r, _)| *r),
        Some(NoHintReason::LoadBound)
    );
    assert_eq!(ranked.ranked[0].replica.replica_id, "b");
    assert!(ranked.best().is_none());
}

#[test]
fn debug_long_prompt_shared_block() {
    let ids = ["a", "b", "c", "d", "e", "f", "g", "h"];
    let mut fleet = Fleet::new(&ids, ScoreWeights::default());
    for i in 0..200u64 {
        let prompt: Vec<Fingerprint> = std::iter::once(1)
            .chain(10_000 * i..10_000 * i + 30)
            .map(Fingerprint)
            .collect();
        let r = fleet.ask(&prompt, T0 + i as i64);
        if r.best().is_none() {
            panic!(
                "{i}: {:?} {:#?}",
                r.no_hint,
                r.ranked
                    .iter()
                    .map(|s| (
                        &s.replica.replica_id,
                        s.matched_blocks,
                        s.score,
                        s.over_bound,
                        s.load.requests
                    ))
                    .collect::<Vec<_>>()
            );
        }
        fleet.route(&prompt, T0 + i as i64);
    }
}
