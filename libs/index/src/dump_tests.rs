use super::*;
use crate::ingest::{IngestBatch, IngestLimits, IngestSession, ResyncBudget, Step};
use crate::{IndexConfig, LookupOutcome};

fn scope(tenant: &str, scheme: HashScheme) -> Scope {
    Scope {
        tenant: tenant.into(),
        model: "m".into(),
        hash_scheme: scheme,
        adapter: String::new(),
    }
}

fn key(tenant: &str, id: &str, rank: u32) -> ReplicaKey {
    ReplicaKey {
        tenant: tenant.into(),
        replica_id: id.into(),
        dp_rank: rank,
    }
}

fn stored(start_depth: u32, fps: std::ops::Range<u64>, tier: Tier) -> Change {
    Change::Stored {
        start_depth,
        fingerprints: Fingerprint::from_raw(fps.collect()),
        block_size: 16,
        tier,
    }
}

/// Two scopes, three replicas sharing prefixes, both tiers, evictions and
/// a depth beyond the saturation point.
fn populated() -> Index {
    let ix = Index::new(IndexConfig {
        capacity_entries: 100_000,
        shards: 4,
        ..IndexConfig::default()
    });
    let a = scope("t", HashScheme::Vllm);
    let b = scope("u", HashScheme::Sglang);
    let errors = ix.apply(
        &key("t", "pod-a", 0),
        &a,
        "10.0.0.1:8000",
        &[
            stored(0, 1..200, Tier::T1),
            stored(3, 1_000..1_010, Tier::T2),
            Change::Evicted {
                fingerprints: Fingerprint::from_raw(vec![150, 151]),
            },
        ],
        1,
    );
    assert!(errors.is_empty(), "{errors:?}");
    let errors = ix.apply(
        &key("t", "pod-b", 1),
        &a,
        "10.0.0.2:8000",
        &[
            stored(0, 1..50, Tier::T1),
            stored(40_000, 5_000..5_003, Tier::T1),
        ],
        1,
    );
    assert!(errors.is_empty(), "{errors:?}");
    ix.set_tier2(&key("t", "pod-b", 1), Some((7, 9)));
    let errors = ix.apply(
        &key("u", "pod-c", 0),
        &b,
        "10.0.0.3:8000",
        &[stored(0, 1..30, Tier::T2)],
        1,
    );
    assert!(errors.is_empty(), "{errors:?}");
    ix
}

/// A replica as the snapshot shows it, without the times.
type Shown = (ReplicaKey, String, u64, u64, u32, Option<(u64, u64)>);

/// What a snapshot and lookups show, without the times.
fn observed(ix: &Index) -> (Vec<Shown>, Vec<LookupOutcome>) {
    let snap = ix
        .snapshot()
        .into_iter()
        .map(|r| {
            (
                r.key,
                r.address,
                r.prefix_count,
                r.t1_count,
                r.block_size,
                r.tier2,
            )
        })
        .collect();
    let prompts: Vec<Vec<Fingerprint>> = vec![
        Fingerprint::from_raw((1..200).collect()),
        Fingerprint::from_raw((1..40).collect()),
        Fingerprint::from_raw(vec![1, 2, 3, 1_000, 1_001]),
        Fingerprint::from_raw(vec![9_999]),
    ];
    let mut lookups = Vec::new();
    for s in [scope("t", HashScheme::Vllm), scope("u", HashScheme::Sglang)] {
        for p in &prompts {
            lookups.push(ix.lookup(&s, p, None, None));
        }
    }
    (snap, lookups)
}

#[test]
fn a_dump_restores_the_same_holdings_and_answers() {
    let ix = populated();
    let dump = ix.dump();
    assert_eq!(dump.replicas.len(), 3);
    assert_eq!(dump.entries(), ix.len());
    let mut enc = Enc::default();
    dump.encode(&mut enc);
    let mut dec = Dec::new(&enc.buf);
    let decoded = Dump::decode(&mut dec).unwrap();
    assert_eq!(dec.remaining(), 0);
    assert_eq!(decoded, dump);

    let restored = Index::new(IndexConfig {
        capacity_entries: 100_000,
        shards: 8,
        ..IndexConfig::default()
    });
    assert!(restored.restore(&decoded, 5).is_empty());
    assert_eq!(restored.len(), ix.len());
    assert_eq!(observed(&restored), observed(&ix));
    // Dumping the restored index gives the same content back.
    assert_eq!(restored.dump(), dump);
}

#[test]
fn runs_follow_consecutive_depths() {
    let ix = populated();
    let dump = ix.dump();
    let a = dump
        .replicas
        .iter()
        .find(|r| r.key.replica_id == "pod-a")
        .unwrap();
    // 1..150 and 152..200 at T1 (150 and 151 evicted; 3..13 was
    // overwritten at T2 from depth 3: blocks 1_000.. are new keys).
    assert_eq!(a.entries(), 199 - 2 + 10);
    assert!(
        a.changes.len() <= 4,
        "runs are merged, got {} changes",
        a.changes.len()
    );
}

#[test]
fn every_truncation_of_a_dump_is_an_error_naming_the_part() {
    let mut enc = Enc::default();
    populated().dump().encode(&mut enc);
    for cut in 0..enc.buf.len() {
        let err = Dump::decode(&mut Dec::new(&enc.buf[..cut])).unwrap_err();
        assert!(
            matches!(err, DumpError::Truncated(_)),
            "cut at {cut}: {err}"
        );
    }
}

#[test]
fn corrupt_values_are_refused_not_trusted() {
    let mut enc = Enc::default();
    enc.len(1);
    enc.replica_key(&key("t", "p", 0));
    enc.scope(&scope("t", HashScheme::Vllm));
    enc.str("addr");
    enc.u8(9); // tier2 flag
    let err = Dump::decode(&mut Dec::new(&enc.buf)).unwrap_err();
    assert_eq!(err.to_string(), "replica.tier2: invalid value 9");
    // A huge count with few bytes behind it allocates nothing.
    let mut enc = Enc::default();
    enc.u64(u64::MAX);
    let err = Dump::decode(&mut Dec::new(&enc.buf)).unwrap_err();
    assert_eq!(err, DumpError::Truncated("replicas"));
}

fn batch(seq: u64, begin: bool, end: bool, fp: u64) -> IngestBatch {
    IngestBatch {
        key: key("t", "pod", 0),
        scope: scope("t", HashScheme::Vllm),
        address: "a:1".into(),
        incarnation: 3,
        seq,
        resync_begin: begin,
        resync_end: end,
        changes: vec![stored(0, fp..fp + 1, Tier::T1)],
        tier2: None,
    }
}

#[test]
fn a_session_survives_export_and_import_mid_resync() {
    let one = crate::ingest::bytes(&batch(0, false, false, 0).changes);
    let budget = ResyncBudget::new(100 * one);
    let limits = IngestLimits {
        max_ranks: 8,
        max_stream_resync_bytes: 50 * one,
        budget: budget.clone(),
        ..IngestLimits::default()
    };
    let mut s = IngestSession::with_limits(limits.clone());
    assert_eq!(s.accept(batch(10, true, false, 1)), Step::Buffered);
    let ranks = s.export();
    let mut enc = Enc::default();
    for r in &ranks {
        enc.rank(r);
    }
    let mut dec = Dec::new(&enc.buf);
    let back = vec![dec.rank().unwrap()];
    assert_eq!(back, ranks);
    drop(s);
    assert_eq!(budget.used(), 0);

    let mut s = IngestSession::with_limits(limits);
    assert!(s.import(back).is_empty());
    assert_eq!(budget.used(), one, "the unfinished resync is charged again");
    assert!(s.knows(&key("t", "pod", 0)));
    match s.accept(batch(11, false, true, 2)) {
        Step::Replace { changes, .. } => assert_eq!(changes.len(), 2),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.accept(batch(12, false, false, 3)),
        Step::Apply { .. }
    ));
    // A gap or a forgotten rank waits for the next resync.
    assert!(s.forget(&key("t", "pod", 0)));
    assert!(matches!(
        s.accept(batch(13, false, false, 4)),
        Step::ResyncRequired(_)
    ));
}

#[test]
fn an_import_beyond_the_bounds_leaves_ranks_out() {
    let budget = ResyncBudget::new(100 << 10);
    let mut s = IngestSession::with_limits(IngestLimits {
        max_ranks: 1,
        max_stream_resync_bytes: 50 << 10,
        budget,
        ..IngestLimits::default()
    });
    let rank = |id: &str| RankState {
        key: key("t", id, 0),
        incarnation: 1,
        last_seq: 1,
        resync: None,
    };
    let left = s.import(vec![rank("a"), rank("b")]);
    assert_eq!(left, vec![key("t", "b", 0)]);
}

#[test]
fn a_restore_keeps_when_each_replica_was_last_seen() {
    let ix = Index::new(IndexConfig::default());
    let s = scope("t", HashScheme::Vllm);
    ix.apply(
        &key("t", "quiet", 0),
        &s,
        "a:1",
        &[stored(0, 1..3, Tier::T1)],
        1_000,
    );
    ix.apply(
        &key("t", "busy", 0),
        &s,
        "b:1",
        &[stored(0, 5..7, Tier::T1)],
        90_000,
    );
    let dump = ix.dump();
    let seen = |ix: &Index, id: &str| {
        ix.snapshot()
            .into_iter()
            .find(|r| r.key.replica_id == id)
            .map(|r| r.last_seen_ms)
    };
    // Restored later: each keeps its own time, so the replica GC and the
    // lookups' freshness bound judge it by its real silence.
    let restored = Index::new(IndexConfig::default());
    assert!(restored.restore(&dump, 100_000).is_empty());
    assert_eq!(seen(&restored, "quiet"), Some(1_000));
    assert_eq!(seen(&restored, "busy"), Some(90_000));
    assert_eq!(
        restored.replicas_silent_since(50_000),
        [key("t", "quiet", 0)]
    );
    // Restored by a clock behind the dump's: never later than now.
    let behind = Index::new(IndexConfig::default());
    assert!(behind.restore(&dump, 50_000).is_empty());
    assert_eq!(seen(&behind, "busy"), Some(50_000));
    // The older form kept no times: restored as seen now.
    let mut enc = Enc::default();
    enc.len(1);
    enc.replica_key(&key("t", "old", 0));
    enc.scope(&s);
    enc.str("c:1");
    enc.u8(0);
    enc.changes(&[stored(0, 9..10, Tier::T1)]);
    let old = Dump::decode_without_seen(&mut Dec::new(&enc.buf)).unwrap();
    assert_eq!(old.replicas[0].last_seen_ms, None);
    let from_old = Index::new(IndexConfig::default());
    assert!(from_old.restore(&old, 100_000).is_empty());
    assert_eq!(seen(&from_old, "old"), Some(100_000));
}
