//! The load board's estimates, with time passed in.

use super::*;

#[test]
fn picks_decay_with_their_half_life() {
    let board = LoadBoard::new(LoadSettings {
        pick_half_life_ms: 1_000,
        engine_report_ttl_ms: 5_000,
        ..LoadSettings::default()
    });
    board.picked("a", 0);
    board.picked("a", 0);
    assert!((board.load("a", 0).requests - 2.0).abs() < 1e-9);
    assert!((board.load("a", 1_000).requests - 1.0).abs() < 1e-9);
    board.picked("a", 1_000);
    assert!((board.load("a", 1_000).requests - 2.0).abs() < 1e-9);
    assert_eq!(board.load("nobody", 0), ReplicaLoad::default());
}

#[test]
fn the_largest_estimate_wins_and_old_reports_are_ignored() {
    let board = LoadBoard::new(LoadSettings::default());
    board.started("a");
    board.started("a");
    board.finished("a");
    assert_eq!(board.load("a", 0).requests, 1.0);
    board.report_engine(
        "a",
        EngineLoad {
            waiting: 3,
            running: 4,
            kv_usage: 0.5,
        },
        0,
    );
    let now = board.load("a", 10);
    assert_eq!(now.requests, 7.0);
    assert!((now.kv_usage - 0.5).abs() < 1e-6);
    let later = board.load("a", 31_000);
    assert_eq!(later.requests, 1.0, "a stale report no longer counts");
    assert_eq!(later.kv_usage, 0.0);
    board.finished("a");
    board.finished("a");
    assert_eq!(board.load("a", 31_000).requests, 0.0, "never negative");
}

#[test]
fn retain_drops_replicas_gone_from_the_index() {
    let board = LoadBoard::default();
    board.picked("a", 0);
    board.picked("b", 0);
    board.retain(|id| id == "b");
    assert_eq!(board.len(), 1);
    assert_eq!(board.load("a", 0).requests, 0.0);
}

#[test]
fn an_upkeep_keeps_resolved_scopes_until_a_replica_leaves() {
    let members = crate::registry::members_named(&["a", "b"]);
    let board = LoadBoard::default();
    let resolved = || board.with_members(7, &members, 0, |_, m| m.id_hashes.as_ptr() as usize);
    let first = resolved();
    assert_eq!(board.retain(|_| true), 0);
    let kept = board
        .scopes
        .read()
        .get(&7)
        .map(|m| m.id_hashes.as_ptr() as usize);
    assert_eq!(kept, Some(first), "kept: its shortlist lives on");
    // Not looked up between two upkeeps (gone, or its replicas moved to
    // another scope): forgotten; looked up again, resolved again.
    assert_eq!(board.retain(|_| true), 0);
    assert!(board.scopes.read().is_empty(), "an unused scope forgotten");
    assert_ne!(resolved(), 0);
    let _ = resolved();
    assert_eq!(board.retain(|_| true), 0);
    assert_eq!(board.scopes.read().len(), 1, "used since: kept");
    assert_eq!(board.retain(|id| id == "b"), 1);
    assert!(board.scopes.read().is_empty(), "every resolution forgotten");
    // Resolved again, "a" given its idle entry back.
    let _ = resolved();
    assert_eq!(board.len(), 2);
}

#[test]
fn peers_picks_add_to_the_own_and_expire() {
    let board = LoadBoard::new(LoadSettings {
        pick_half_life_ms: 1_000,
        engine_report_ttl_ms: 5_000,
        ..LoadSettings::default()
    });
    board.started("a");
    board.picked("a", 0);
    board.add_work("a", 100.0, 0);
    let own = board.own_picks(0);
    assert_eq!(own.len(), 1);
    assert_eq!(own[0].1.in_flight, 1.0);
    assert_eq!(own[0].1.queued_ms, 100.0);
    let peers = PeerPicks {
        in_flight: 2.0,
        recent: 4.0,
        queued_ms: 50.0,
    };
    board.peer_picks("a", peers, 0, 500);
    let load = board.load("a", 0);
    assert_eq!(load.requests, 5.0, "own recent 1 + the peers' 4");
    assert_eq!(load.queued_ms, 150.0);
    assert_eq!(board.own_picks(0)[0].1, own[0].1, "never echoed back");
    let later = board.load("a", 500);
    assert!((later.requests - (2.0f64.powf(-0.5) * 5.0)).abs() < 1e-9);
    assert_eq!(board.load("a", 501).requests, 1.0, "a silent peer expires");
    board.peer_picks("b", peers, 0, 500);
    assert_eq!(
        board.load("b", 0).requests,
        4.0,
        "a replica only peers picked"
    );
    board.peer_picks(
        "b",
        PeerPicks {
            recent: f64::NAN,
            ..peers
        },
        0,
        500,
    );
    assert_eq!(
        board.load("b", 0).requests,
        2.0,
        "not-finite figures count as 0"
    );
}

/// Between two reports the peers are assumed to pick as this server
/// does, so two replicas reading one shared view do not both fill the
/// same light engine; the next report replaces the estimate.
#[test]
fn own_picks_since_the_peers_report_count_for_each_live_peer() {
    let board = LoadBoard::new(LoadSettings {
        pick_half_life_ms: 1_000_000,
        engine_report_ttl_ms: 5_000,
        ..LoadSettings::default()
    });
    board.set_live_peers(2);
    board.peer_picks("a", PeerPicks::default(), 0, 500);
    assert_eq!(board.load("a", 0).requests, 0.0);
    board.picked("a", 10);
    board.picked("a", 10);
    let requests = board.load("a", 10).requests;
    assert!(
        (requests - 6.0).abs() < 1e-3,
        "own 2 + 2 peers x 2: {requests}"
    );
    board.started("a");
    assert!((board.load("a", 10).requests - 6.0).abs() < 1e-3);
    // The peers' report: what they really picked, and the estimate restarts.
    let peers = PeerPicks {
        recent: 1.0,
        ..PeerPicks::default()
    };
    board.peer_picks("a", peers, 20, 500);
    let requests = board.load("a", 20).requests;
    assert!(
        (requests - 3.0).abs() < 1e-3,
        "own 2 + the peers' 1: {requests}"
    );
    // Own figures are reported as they are, never with the estimate.
    let own = board.own_picks(20);
    assert!((own[0].1.recent - 2.0).abs() < 1e-3);
    // No live peer, no estimate; an expired report, none either.
    board.set_live_peers(0);
    board.picked("a", 30);
    assert!((board.load("a", 30).requests - 4.0).abs() < 1e-3);
    board.set_live_peers(2);
    let requests = board.load("a", 600).requests;
    assert!((requests - 3.0).abs() < 1e-2, "expired: {requests}");
}

#[test]
fn a_pick_with_its_work_is_a_pick_and_the_work() {
    let apart = LoadBoard::default();
    let together = LoadBoard::default();
    for board in [&apart, &together] {
        board.observed_prefill_rate("a", 4.0);
    }
    apart.picked("a", 10);
    apart.add_work("a", 100.0 / 4.0, 10);
    together.picked_with_work("a", 10, |rate| 100.0 / rate.unwrap_or(1.0));
    assert_eq!(together.load("a", 10), apart.load("a", 10));
    assert_eq!(together.load("a", 10).queued_ms, 25.0);
}

#[test]
fn an_observed_prefill_rate_is_part_of_the_load() {
    let board = LoadBoard::default();
    assert_eq!(board.load("a", 0).prefill_tokens_per_ms, None);
    board.observed_prefill_rate("a", 12.5);
    assert_eq!(board.load("a", 0).prefill_tokens_per_ms, Some(12.5));
    assert_eq!(board.prefill_rate("a"), Some(12.5));
    board.observed_prefill_rate("a", -1.0);
    board.observed_prefill_rate("a", f64::INFINITY);
    assert_eq!(board.prefill_rate("a"), Some(12.5));
}

/// Replicas "a" and "b" in one scope, and a board whose picks halve every
/// second: a lookup's rebase tests start 1,000 half-lives after its epoch.
fn a_and_b_on_a_fast_board() -> (crate::registry::Members, LoadBoard) {
    let board = LoadBoard::new(LoadSettings {
        pick_half_life_ms: 1_000,
        ..LoadSettings::default()
    });
    (crate::registry::members_named(&["a", "b"]), board)
}

#[test]
fn a_lookup_under_way_reads_every_load_at_one_scale_through_a_rebase() {
    let (members, board) = a_and_b_on_a_fast_board();
    // 1,000 half-lives after the board's first epoch: the reader's factor
    // is 2^-1000 until the first pick rebases the weights to now.
    let now = 1_000_000;
    board.with_members(7, &members, now, |reader, m| {
        assert_eq!(reader.member(m, 0).requests, 0.0);
        board.picked("a", now);
        assert_eq!(
            reader.member(m, 0).requests,
            1.0,
            "the pick, read at the new epoch's scale by a lookup already under way"
        );
        assert_eq!(reader.member(m, 1).requests, 0.0);
        // Rebased again (a clock stepping back: its weights then count as
        // of the earlier epoch, so both replicas read a quarter at `now`).
        board.picked("b", now - 2_000);
        assert_eq!(reader.member(m, 0).requests, board.load("a", now).requests);
        assert_eq!(reader.member(m, 1).requests, board.load("b", now).requests);
        assert_eq!(reader.member(m, 1).requests, 0.25);
    });
}

#[test]
fn a_lookup_rereading_after_a_rebase_never_waits_for_the_map() {
    // A lookup rebuilding a shortlist holds the scope's `rebuilding` lock
    // while it reads its members; a pick holds the map's read lock while it
    // waits for `rebuilding`; a writer queued on the map (another rebase, a
    // new replica, a retain) then holds off every new reader of the map. A
    // reread that took the map's lock would close the cycle: here the
    // writer holds the map, and the lookup's read must not wait for it.
    const HANG: std::time::Duration = std::time::Duration::from_secs(30);
    let (members, board) = a_and_b_on_a_fast_board();
    let now = 1_000_000;
    board.with_members(7, &members, now, |reader, m| {
        assert_eq!(reader.member(m, 0).requests, 0.0);
        // Rebases the board (its first pick) after the reader was made.
        board.picked("a", now);
        std::thread::scope(|s| {
            let (held_tx, held_rx) = std::sync::mpsc::channel();
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let entries = &board.entries;
            let writer = s.spawn(move || {
                let map = entries.write();
                held_tx.send(()).unwrap();
                // Bounds a hang (released after the bound so the test
                // ends and fails), times nothing.
                let waited_out = done_rx.recv_timeout(HANG).is_err();
                drop(map);
                waited_out
            });
            held_rx.recv().unwrap();
            let load = reader.member(m, 0);
            done_tx.send(()).unwrap();
            assert!(
                !writer.join().unwrap(),
                "the lookup's read waited for the map's writer"
            );
            assert_eq!(load.requests, 1.0, "the pick, at the new epoch's scale");
        });
    });
}

#[test]
fn a_member_s_first_pick_leaves_its_scope_resolved() {
    let members = crate::registry::members_named(&["a", "b"]);
    let board = LoadBoard::default();
    board.picked("a", 0);
    board.with_members(7, &members, 0, |_, _| ());
    let resolved = board.generation.load(Ordering::Relaxed);
    // "b" was never on the board: resolving gave it an idle entry.
    assert_eq!(board.load("b", 0), ReplicaLoad::default());
    board.picked("b", 0);
    board.report_engine("b", EngineLoad::default(), 0);
    assert_eq!(board.generation.load(Ordering::Relaxed), resolved);
    board.with_members(7, &members, 0, |reader, m| {
        assert_eq!(
            reader.member(m, 1).requests,
            1.0,
            "b's pick read through the resolved entry"
        );
    });
}

#[test]
fn the_own_change_listener_hears_every_pick_start_and_end_and_nothing_else() {
    let board = LoadBoard::new(LoadSettings::default());
    let heard = Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
    let h = heard.clone();
    assert!(board.on_own_change(move |id| h.lock().push(id.to_owned())));
    assert!(
        !board.on_own_change(|_| {}),
        "only the first listener is kept"
    );
    board.picked("a", 0);
    board.picked_with_work("b", 0, |_| 5.0);
    board.started("b");
    board.finished("b");
    // Not this server's own picks: the engines' and the peers' figures.
    board.report_engine("a", EngineLoad::default(), 0);
    board.observed_work("a", 3.0, 0);
    board.peer_picks("a", PeerPicks::default(), 0, 1_000);
    // A request ending on a replica never heard of changes nothing.
    board.finished("nobody");
    assert_eq!(*heard.lock(), ["a", "b", "b", "b"]);
}

#[test]
fn own_picks_of_names_the_replicas_asked_for_zero_included() {
    let board = LoadBoard::new(LoadSettings::default());
    board.picked_with_work("a", 0, |_| 40.0);
    board.started("b");
    board.finished("b");
    board.peer_picks(
        "c",
        PeerPicks {
            in_flight: 3.0,
            recent: 3.0,
            queued_ms: 3.0,
        },
        0,
        1_000,
    );
    let got = board.own_picks_of(["a", "b", "c", "nobody"], 10);
    let ids: Vec<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids,
        ["a", "b", "c"],
        "every replica on the board, zero included"
    );
    assert!((got[0].1.recent - 1.0).abs() < 1e-3 && (got[0].1.queued_ms - 30.0).abs() < 1e-9);
    // Only this server's own figures: the peers' are never reported back.
    assert_eq!(got[1].1, PeerPicks::default());
    assert_eq!(got[2].1, PeerPicks::default());
    let all = board.own_picks(10);
    assert_eq!(
        all.iter().find(|(id, _)| id == "a").map(|(_, p)| *p),
        Some(got[0].1)
    );
}

/// Picks of one scope's replicas made concurrently with each other and
/// with lookups of the scope leave the board where the same picks made one
/// by one leave it: none is lost (the scope's entries are the board's), and
/// no lookup reads more than every pick.
#[test]
fn concurrent_picks_and_lookups_leave_the_loads_of_the_picks_one_by_one() {
    const PICKS: usize = 3_000;
    let ids = ["a", "b", "c", "d", "e"];
    let members = crate::registry::members_named(&ids[..4]);
    let board = LoadBoard::default();
    // Resolved: the picks find their entries through the scope ("e" is in
    // none, and is found through the map).
    board.with_members(7, &members, 0, |_, _| ());
    let pickers = 3;
    let done = std::sync::atomic::AtomicUsize::new(0);
    let at = |t: usize, i: usize| ids[(i * (t + 1)) % ids.len()];
    std::thread::scope(|s| {
        for t in 0..pickers {
            let (board, done) = (&board, &done);
            s.spawn(move || {
                for i in 0..PICKS {
                    board.picked_in_scope(7, at(t, i), 0, |_| 0.0);
                }
                done.fetch_add(1, Ordering::Relaxed);
            });
        }
        let bound = (pickers * PICKS) as f64;
        while done.load(Ordering::Relaxed) < pickers {
            board.with_members(7, &members, 0, |reader, m| {
                for (i, id) in ids.iter().enumerate().take(members.len()) {
                    let r = reader.member(m, i).requests;
                    assert!(r.is_finite() && r <= bound, "{id} read {r}");
                }
            });
        }
    });
    let replay = LoadBoard::default();
    for t in 0..pickers {
        for i in 0..PICKS {
            replay.picked(at(t, i), 0);
        }
    }
    for id in ids {
        let (got, want) = (board.load(id, 0), replay.load(id, 0));
        assert_eq!(got, want, "{id}: concurrently, one by one");
        assert!(want.requests >= 1.0);
    }
}
