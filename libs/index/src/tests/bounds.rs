//! The replica and scope bounds: one past either is refused whole and
//! leaves nothing behind; what is known already keeps working, resyncs
//! included, and a forgotten replica's place is taken again.

use super::*;

fn bounded(max_replicas: u32, max_scopes: u32) -> Index {
    Index::new(IndexConfig {
        capacity_entries: 1_000,
        shards: 2,
        max_replicas,
        max_scopes,
    })
}

fn scope_of(tenant: &str, model: &str) -> Scope {
    Scope {
        model: model.into(),
        ..scope(tenant)
    }
}

fn store(ix: &Index, id: &str, model: &str, chain: &[u64]) -> Vec<ContentError> {
    ix.apply(
        &key("t", id),
        &scope_of("t", model),
        "10.0.0.1:8000",
        &[stored(0, &fps(chain), Tier::T1)],
        1_000,
    )
}

fn holders(ix: &Index, model: &str, chain: &[u64]) -> Vec<String> {
    match ix.lookup(&scope_of("t", model), &fps(chain), None, None) {
        LookupOutcome::Matches(c) => c.into_iter().map(|c| c.replica.replica_id).collect(),
        _ => Vec::new(),
    }
}

#[test]
fn a_replica_past_the_bound_is_refused_whole_until_one_is_forgotten() {
    let ix = bounded(2, 16);
    assert!(store(&ix, "a", "m", &[1, 2]).is_empty());
    assert!(store(&ix, "b", "m", &[1, 2]).is_empty());
    assert_eq!(
        store(&ix, "c", "m", &[1, 2]),
        [ContentError::TooManyReplicas]
    );
    assert_eq!(ix.snapshot().len(), 2);
    assert_eq!(ix.len(), 4);
    let mut got = holders(&ix, "m", &[1, 2]);
    got.sort();
    assert_eq!(got, ["a", "b"]);

    // Known replicas go on: a batch, and a resync (which builds the new
    // state in a slot of its own before swapping it in).
    assert!(store(&ix, "a", "m", &[1, 2, 3]).is_empty());
    let resync = ix.replace(
        &key("t", "b"),
        &scope_of("t", "m"),
        "10.0.0.1:8000",
        &[stored(0, &fps(&[7, 8]), Tier::T1)],
        2_000,
    );
    assert!(resync.is_empty(), "{resync:?}");
    assert_eq!(holders(&ix, "m", &[7, 8]), ["b"]);
    assert_eq!(holders(&ix, "m", &[1, 2, 3]), ["a"]);

    // A forgotten replica's place is free again.
    assert!(ix.remove_replica(&key("t", "a")));
    assert!(store(&ix, "c", "m", &[1, 2]).is_empty());
    assert_eq!(holders(&ix, "m", &[1, 2]), ["c"]);
}

#[test]
fn a_scope_past_the_bound_is_refused_and_not_kept() {
    let ix = bounded(16, 2);
    assert!(store(&ix, "a", "m1", &[1]).is_empty());
    assert!(store(&ix, "b", "m2", &[1]).is_empty());
    assert_eq!(store(&ix, "c", "m3", &[1]), [ContentError::TooManyScopes]);
    // Neither the scope nor the replica was kept.
    assert_eq!(ix.snapshot().len(), 2);
    assert_eq!(ix.block_size(&scope_of("t", "m3")), None);
    // A known replica moving to a new scope is refused too, and keeps
    // what it held where it was.
    assert_eq!(store(&ix, "a", "m3", &[1]), [ContentError::TooManyScopes]);
    assert_eq!(holders(&ix, "m1", &[1]), ["a"]);
    // Known scopes take new replicas.
    assert!(store(&ix, "c", "m2", &[1]).is_empty());
    let mut got = holders(&ix, "m2", &[1]);
    got.sort();
    assert_eq!(got, ["b", "c"]);
}
