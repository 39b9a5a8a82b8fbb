//! How far a [`Shortlist`] is read, and what it answers.

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

/// A scope of `n` members, `r0`, `r1`, ... (no loads reported: each
/// reads as idle).
fn members_of(n: usize) -> crate::registry::Members {
    let ids: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    crate::registry::members_named(&names)
}

/// A shortlist of `loads` (one member each, every member eligible),
/// and what a lookup holding nothing makes of it: how many replicas
/// it reads (answering the best one), or whether every load must be
/// read instead.
fn built(loads: &[ReplicaLoad]) -> (Shortlist, Result<usize, bool>) {
    let board = crate::load::LoadBoard::default();
    let members = members_of(loads.len());
    let positions: Vec<u32> = (0..loads.len() as u32).collect();
    let weights = ScoreWeights::default();
    board.with_members(1, &members, 0, |reader, resolved| {
        let list = Shortlist::build(
            loads.len(),
            &positions,
            loads,
            &input(8, 16),
            &weights,
            reader,
        );
        OTHERS_READ.with(|n| n.set(0));
        let read = list
            .eligible(&members, resolved, reader, &input(8, 16), &[], None, 1)
            .map(|e| {
                assert_eq!(e.replicas.len(), 1, "the best other only");
                OTHERS_READ.with(std::cell::Cell::get)
            });
        (list, read)
    })
}

/// A pod's data-parallel ranks share their id, so their keys tie: the
/// list answers the one the whole ranking answers (the lower rank),
/// whichever it reads first.
#[test]
fn tied_ranks_of_one_pod_are_answered_as_the_whole_ranking_answers_them() {
    for rank_one_first in [true, false] {
        let ids: Vec<String> = (0..98).map(|i| format!("r{i}")).collect();
        let mut members: Vec<Arc<ReplicaMeta>> = members_of(0).to_vec();
        let pod = |dp_rank| {
            Arc::new(ReplicaMeta::new(
                ReplicaKey {
                    tenant: "t".into(),
                    replica_id: "pod".into(),
                    dp_rank,
                },
                0,
                "pod:8000".into(),
                0,
            ))
        };
        let ranks = if rank_one_first { [1, 0] } else { [0, 1] };
        members.extend(ranks.map(pod));
        let names: Vec<&str> = ids.iter().map(String::as_str).collect();
        members.extend(crate::registry::members_named(&names).iter().cloned());
        let members: crate::registry::Members = members.into();
        let board = crate::load::LoadBoard::default();
        // Every replica but the pod's two ranks busy (picked): the ranks
        // lead the list, tied.
        for id in &ids {
            board.picked(id, 0);
        }
        let positions: Vec<u32> = (0..members.len() as u32).collect();
        let weights = ScoreWeights::default();
        let answered = board.with_members(1, &members, 0, |reader, resolved| {
            let loads: Vec<ReplicaLoad> = (0..members.len())
                .map(|i| reader.member(resolved, i))
                .collect();
            let list = Shortlist::build(
                members.len(),
                &positions,
                &loads,
                &input(8, 16),
                &weights,
                reader,
            );
            let eligible = list
                .eligible(&members, resolved, reader, &input(8, 16), &[], None, 1)
                .expect("the two ranks lead the list");
            assert_eq!(eligible.replicas.len(), 1, "the best other only");
            eligible.replicas[0].0.clone()
        });
        assert_eq!(answered.replica_id, "pod");
        assert_eq!(answered.dp_rank, 0, "rank 1 read first: {rank_one_first}");
    }
}

#[test]
fn a_list_tied_over_most_of_the_scope_keeps_the_tied_as_a_group() {
    let busy = |requests: f64| ReplicaLoad {
        requests,
        ..ReplicaLoad::default()
    };
    // 200 idle replicas: every one tied with the 24th. A lookup reads
    // the one its prompt's tie-break prefers, proven by the group's
    // floor (its own load) and the tie-breaks of the rest.
    let (list, read) = built(&vec![ReplicaLoad::default(); 200]);
    assert!(list.listed.is_empty());
    assert_eq!(list.tied.as_ref().map(|t| t.positions.len()), Some(200));
    assert_eq!(read, Ok(1));
    // Two less loaded than the rest when built: listed before the
    // group, read first. The board reads them idle now (as every
    // replica here), tied with the group's floor: the group's best
    // tie-break is read too, and the best of the three is proven.
    let mut loads = vec![ReplicaLoad::default(); 200];
    loads[0] = busy(-1.0);
    loads[1] = busy(-1.0);
    let (list, read) = built(&loads);
    assert_eq!(list.listed.len(), 2, "the two less loaded, in order");
    assert_eq!(list.tied.as_ref().map(|t| t.positions.len()), Some(198));
    assert_eq!(read, Ok(3));
    // 24 idle and 73 more tied with them (97 > 96): a group, proven
    // before the busy rest's floor.
    let mut loads = vec![busy(5.0); 103];
    loads[..97].fill(ReplicaLoad::default());
    let (list, read) = built(&loads);
    assert_eq!(list.tied.as_ref().map(|t| t.positions.len()), Some(97));
    assert_eq!(read, Ok(1));
    // 96 tied with the 24th: kept, in order, the tied ones listed.
    loads[96] = busy(5.0);
    let (list, read) = built(&loads);
    assert!(list.tied.is_none());
    assert_eq!(list.listed.len(), 96);
    assert!(list.listed.iter().all(|&p| p < 96));
    // Read through the tied ones, proven by the busy rest's floor: the
    // list answers without reading those 7.
    assert_eq!(read, Ok(96));
}

/// Hashes given for fewer replicas than ranked break
/// [`rank_hashed`]'s contract (both callers build them alongside the
/// replicas): caught, not silently hashed again.
#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "assertion `left == right` failed")]
fn ranking_with_a_hash_missing_is_a_bug() {
    let members = members_of(2);
    let replicas: Vec<(&ReplicaKey, &str)> = members
        .iter()
        .map(|m| (&m.key, m.address.as_str()))
        .collect();
    let part = PickInput {
        replicas: &replicas,
        ..input(8, 16)
    };
    let loads = [ReplicaLoad::default(); 2];
    let fleet = Fleet::of(2, &loads);
    let hashes = [crate::pick::id_hash(&members[0].key.replica_id)];
    let _ = rank_hashed(
        &part,
        &ScoreWeights::default(),
        &loads,
        &fleet,
        1,
        usize::MAX,
        Some(&hashes),
        None,
    );
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
