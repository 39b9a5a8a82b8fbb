//! The ranking runs after the index's registry is released (F7): the load
//! board, the speculation and a shortlist rebuild never hold it, so a
//! registry writer (a replica joining, leaving or resyncing) waits for the
//! walk only, and no lookup queues behind that writer meanwhile.

use std::cell::Cell;

use super::*;
use crate::route::ScoringSource;

/// A scoring source that, while the ranking asks it, looks whether the
/// registry could be written, and then removes the replica holding the
/// prompt (a registry write) when it could.
struct Removing<'a> {
    boards: Boards<'a>,
    index: &'a Index,
    writable: Cell<Option<bool>>,
}

impl ScoringSource for Removing<'_> {
    fn speculative(
        &self,
        scope_tag: u64,
        blocks: &[Fingerprint],
        holders: &[(&str, u32)],
        now_ms: i64,
    ) -> Vec<(String, u32)> {
        // `try_write`, not `write`: with the registry still read-locked
        // by this thread, a write would never return.
        let writable = self.index.registry.try_write().is_some();
        self.writable.set(Some(writable));
        if writable {
            assert!(self.index.remove_replica(&ReplicaKey {
                tenant: "t".into(),
                replica_id: "c".into(),
                dp_rank: 0,
            }));
        }
        self.boards.speculative(scope_tag, blocks, holders, now_ms)
    }

    fn loads(&self, replica_ids: &[&str], now_ms: i64) -> Vec<crate::load::ReplicaLoad> {
        self.boards.loads(replica_ids, now_ms)
    }

    fn board(&self) -> Option<&LoadBoard> {
        self.boards.board()
    }
}

#[test]
fn the_ranking_holds_no_registry_lock_and_keeps_its_holders_names() {
    let fleet = Fleet::new(&["a", "b", "c", "d"], ScoreWeights::default());
    hold(&fleet.index, "c", &fps(&[1, 10, 11, 12]));
    let scope = scope();
    let source = Removing {
        boards: Boards {
            load: &fleet.load,
            speculation: &fleet.speculation,
        },
        index: &fleet.index,
        writable: Cell::new(None),
    };
    let blocks = fps(&[1, 10, 11, 12]);
    let ranked = route_ranked(
        &fleet.index,
        &RouteQuery {
            scope: &scope,
            key: RouteKey::Blocks(&blocks),
            candidates: None,
            extras: None,
        },
        &RoutePolicy::default(),
        16,
        T0,
        &NoDeadline,
        Scoring {
            weights: &fleet.weights,
            source: &source,
            scope_tag: scope_tag(&scope),
            pool: None,
            others: fleet.others,
            holders: fleet.holders,
        },
    );
    assert_eq!(
        source.writable.get(),
        Some(true),
        "the registry was still locked while the ranking read the speculation"
    );
    // Removed while the ranking ran: its answer still names the holder
    // the walk found, as the walk found it.
    let best = ranked.best().expect("a hint");
    assert_eq!(best.replica.replica_id, "c");
    assert_eq!(best.address, "c:8000");
    assert_eq!(best.matched_blocks, 4);
    // ...and the index no longer has it.
    assert!(
        fleet
            .ask(&blocks, T0)
            .ranked
            .iter()
            .all(|s| s.replica.replica_id != "c")
    );
}
