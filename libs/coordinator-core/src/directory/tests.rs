//! Unit tests of the key directory.

use super::*;
use crate::testutil::{batch, key};

#[test]
fn store_upserts_private_placements_and_counts() {
    let mut d = KeyDirectory::new();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L1,
        "dram",
        false,
        &[(key(1, ""), 10)],
    ));
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L1,
        "dram",
        false,
        &[(key(1, ""), 30)],
    ));
    d.apply(&batch(
        "b",
        EventType::Store,
        StorageLevel::L1,
        "dram",
        false,
        &[(key(1, ""), 5)],
    ));
    let e = d.get(&key(1, "")).unwrap();
    assert_eq!(e.placements.len(), 2);
    assert_eq!(e.placements[0].size_bytes, 30, "re-store replaces the size");
    assert_eq!(
        d.totals(StorageLevel::L1),
        TierTotals {
            count: 2,
            bytes: 35
        }
    );
    assert_eq!(d.stats().l1_keys_by_instance["a"], 1);
}

#[test]
fn shared_placement_has_no_owner_identity() {
    let mut d = KeyDirectory::new();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "s3",
        true,
        &[(key(1, ""), 10)],
    ));
    d.apply(&batch(
        "b",
        EventType::Store,
        StorageLevel::L2,
        "s3",
        true,
        &[(key(1, ""), 12)],
    ));
    let e = d.get(&key(1, "")).unwrap();
    assert_eq!(e.placements.len(), 1);
    assert_eq!(&*e.placements[0].instance_id, "b", "latest reporter wins");
    // Any instance may delete a shared placement.
    d.apply(&batch(
        "c",
        EventType::Delete,
        StorageLevel::L2,
        "s3",
        true,
        &[(key(1, ""), 0)],
    ));
    assert!(d.get(&key(1, "")).is_none());
    assert_eq!(d.totals(StorageLevel::L2), TierTotals::default());
}

#[test]
fn delete_of_other_owner_or_backend_is_noop() {
    let mut d = KeyDirectory::new();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, ""), 10)],
    ));
    d.apply(&batch(
        "b",
        EventType::Delete,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, ""), 0)],
    ));
    d.apply(&batch(
        "a",
        EventType::Delete,
        StorageLevel::L2,
        "s3",
        false,
        &[(key(1, ""), 0)],
    ));
    d.apply(&batch(
        "a",
        EventType::Delete,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(9, ""), 0)],
    ));
    assert_eq!(d.get(&key(1, "")).unwrap().placements.len(), 1);
    d.apply(&batch(
        "a",
        EventType::Delete,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, ""), 0)],
    ));
    assert!(d.is_empty());
}

#[test]
fn access_counts_known_keys_only() {
    let mut d = KeyDirectory::new();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, ""), 10)],
    ));
    d.apply(&batch(
        "a",
        EventType::Access,
        StorageLevel::L2,
        "",
        false,
        &[(key(1, ""), 0), (key(2, ""), 0)],
    ));
    assert_eq!(d.get(&key(1, "")).unwrap().access_count, 1);
    assert!(d.get(&key(2, "")).is_none());
}

#[test]
fn fence_drops_private_l1_only() {
    let mut d = KeyDirectory::new();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L1,
        "dram",
        false,
        &[(key(1, ""), 10), (key(2, ""), 10)],
    ));
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, ""), 20)],
    ));
    d.apply(&batch(
        "b",
        EventType::Store,
        StorageLevel::L1,
        "dram",
        false,
        &[(key(2, ""), 7)],
    ));
    d.fence("a");
    assert_eq!(d.get(&key(1, "")).unwrap().placements.len(), 1);
    assert_eq!(
        d.get(&key(1, "")).unwrap().placements[0].tier,
        StorageLevel::L2
    );
    assert_eq!(&*d.get(&key(2, "")).unwrap().placements[0].instance_id, "b");
    assert!(!d.stats().l1_keys_by_instance.contains_key("a"));
    assert_eq!(
        d.totals(StorageLevel::L1),
        TierTotals { count: 1, bytes: 7 }
    );
    // Any later batch brings the index entry back at 0.
    d.apply(&batch(
        "a",
        EventType::Config,
        StorageLevel::L2,
        "fs",
        false,
        &[],
    ));
    assert_eq!(d.stats().l1_keys_by_instance["a"], 0);
}

#[test]
fn bindings_follow_hash_and_leave_with_last_key() {
    let mut d = KeyDirectory::new();
    let mut b = batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, "x"), 1)],
    );
    b.entries[0].token_ids = vec![1, 2, 3];
    d.apply(&b);
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, "y"), 1)],
    ));
    // Another tenant's key with the same hash shows the tokens.
    assert_eq!(d.tokens_for_hash(&key(1, "z").chunk_hash), &[1, 2, 3]);
    d.apply(&batch(
        "a",
        EventType::Delete,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, "x"), 0)],
    ));
    assert_eq!(d.tokens_for_hash(&key(1, "").chunk_hash).len(), 3);
    d.apply(&batch(
        "a",
        EventType::Delete,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, "y"), 0)],
    ));
    assert!(d.tokens_for_hash(&key(1, "").chunk_hash).is_empty());
}

#[test]
fn list_filters_pages_and_orders_by_first_store() {
    let mut d = KeyDirectory::new();
    for h in 1..=5u8 {
        let tier = if h % 2 == 0 {
            StorageLevel::L1
        } else {
            StorageLevel::L2
        };
        d.apply(&batch(
            "a",
            EventType::Store,
            tier,
            "fs",
            false,
            &[(key(h, ""), 1)],
        ));
    }
    // Remove and re-store key 1: it moves to the end.
    d.apply(&batch(
        "a",
        EventType::Delete,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, ""), 0)],
    ));
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, ""), 1)],
    ));
    let all = KeyFilter::default();
    let (total, page) = d.list(&all, 0, 100);
    assert_eq!(total, 5);
    let order: Vec<u8> = page.iter().map(|k| k.key.chunk_hash[0]).collect();
    assert_eq!(order, vec![2, 3, 4, 5, 1]);
    let (total, page) = d.list(
        &KeyFilter {
            tier: LevelFilter::L2,
            ..all.clone()
        },
        1,
        1,
    );
    assert_eq!(total, 3);
    assert_eq!(page[0].key.chunk_hash[0], 5);
    let (total, _) = d.list(
        &KeyFilter {
            instance_id: "zz",
            ..all
        },
        0,
        10,
    );
    assert_eq!(total, 0);
}

#[test]
fn group_expansion_sorted() {
    let mut d = KeyDirectory::new();
    let mut g2 = key(1, "");
    g2.object_group_id = 2;
    let mut g1 = key(1, "");
    g1.object_group_id = 1;
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(g2.clone(), 1), (g1.clone(), 1)],
    ));
    let expanded = d.expand_groups(&key(1, ""));
    assert_eq!(expanded, vec![key(1, ""), g1, g2]);
}

#[test]
fn a_bounded_directory_drops_its_oldest_keys_and_keeps_its_counts_true() {
    let mut d = KeyDirectory::new();
    d.set_max_keys(Some(3));
    for n in 1..=5 {
        d.apply(&batch(
            "a",
            EventType::Store,
            StorageLevel::L1,
            "dram",
            false,
            &[(key(n, ""), 10)],
        ));
    }
    assert_eq!(d.len(), 3);
    assert_eq!(d.dropped_for_capacity(), 2);
    assert!(d.get(&key(1, "")).is_none() && d.get(&key(2, "")).is_none());
    assert!(d.get(&key(5, "")).is_some());
    // Totals and the per-instance index follow the drops.
    assert_eq!(
        d.totals(StorageLevel::L1),
        TierTotals {
            count: 3,
            bytes: 30
        }
    );
    assert_eq!(d.stats().l1_keys_by_instance["a"], 3);
    // A known key is updated in place: nothing is dropped for it.
    d.apply(&batch(
        "b",
        EventType::Store,
        StorageLevel::L1,
        "dram",
        false,
        &[(key(5, ""), 7)],
    ));
    assert_eq!((d.len(), d.dropped_for_capacity()), (3, 2));
    // Lowering the bound drops at once.
    d.set_max_keys(Some(1));
    assert_eq!(d.len(), 1);
    assert!(d.get(&key(5, "")).is_some());
}

#[test]
fn group_expansion_survives_the_removal_of_any_key_of_the_hash() {
    let mut d = KeyDirectory::new();
    let keys: Vec<ObjectKey> = (0..4)
        .map(|g| {
            let mut k = key(1, "");
            k.object_group_id = g;
            k
        })
        .collect();
    let stored: Vec<(ObjectKey, u64)> = keys.iter().map(|k| (k.clone(), 1)).collect();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &stored,
    ));
    // The first key stored files the hash's slot; drop it, then a middle one.
    for gone in [&keys[0], &keys[2]] {
        d.apply(&batch(
            "a",
            EventType::Delete,
            StorageLevel::L2,
            "fs",
            false,
            &[(gone.clone(), 0)],
        ));
    }
    assert_eq!(
        d.expand_groups(&keys[1]),
        vec![keys[1].clone(), keys[3].clone()]
    );
    assert_eq!(
        d.expand_groups(&keys[0]),
        vec![keys[0].clone(), keys[1].clone(), keys[3].clone()]
    );
}

/// Random stores, deletes, accesses and fences (no bound: the bound's
/// drops are tested on their own above) against a plain model of the
/// contract: every answer agrees, and the LRU holds exactly
/// the keys with an L2 placement, most recently stored or accessed last.
/// Exercises record reuse (freed ids, hash places and salts come back).
#[test]
fn random_operations_agree_with_a_plain_model() {
    type Model = BTreeMap<(u8, u8, String), Vec<(String, StorageLevel, String, bool, u64)>>;
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mk = |h: u8, g: u8, salt: &str| {
        let mut k = key(h, salt);
        k.object_group_id = i64::from(g);
        k
    };
    let mut d = KeyDirectory::new();
    let mut model: Model = BTreeMap::new();
    // Recency per key with an L2 placement, as the LRU must order it.
    let mut recency: BTreeMap<(u8, u8, String), u64> = BTreeMap::new();
    let mut clock = 0u64;
    for step in 0..4000 {
        let (h, g) = (next(12) as u8, next(2) as u8);
        let salt = ["", "t", "u"][next(3) as usize].to_owned();
        let instance = ["a", "b"][next(2) as usize];
        let (tier, backend) =
            [(StorageLevel::L1, "dram"), (StorageLevel::L2, "fs")][next(2) as usize];
        let shared = tier == StorageLevel::L2 && next(4) == 0;
        let id = (h, g, salt.clone());
        let k = mk(h, g, &salt);
        let same = |p: &(String, StorageLevel, String, bool, u64)| {
            p.1 == tier && p.2 == backend && p.3 == shared && (shared || p.0 == instance)
        };
        match next(10) {
            0..=4 => {
                let size = next(100) + 1;
                d.apply(&batch(
                    instance,
                    EventType::Store,
                    tier,
                    backend,
                    shared,
                    &[(k, size)],
                ));
                let ps = model.entry(id.clone()).or_default();
                match ps.iter_mut().find(|p| same(p)) {
                    Some(p) => *p = (instance.to_owned(), tier, backend.to_owned(), shared, size),
                    None => ps.push((instance.to_owned(), tier, backend.to_owned(), shared, size)),
                }
                if tier == StorageLevel::L2 && !recency.contains_key(&id) {
                    clock += 1;
                    recency.insert(id, clock);
                }
            }
            5..=7 => {
                d.apply(&batch(
                    instance,
                    EventType::Delete,
                    tier,
                    backend,
                    shared,
                    &[(k, 0)],
                ));
                if let Some(ps) = model.get_mut(&id) {
                    ps.retain(|p| !same(p));
                    if !ps.iter().any(|p| p.1 == StorageLevel::L2) {
                        recency.remove(&id);
                    }
                    if ps.is_empty() {
                        model.remove(&id);
                    }
                }
            }
            8 => {
                d.apply(&batch(
                    instance,
                    EventType::Access,
                    tier,
                    "",
                    false,
                    &[(k, 0)],
                ));
                if let Some(r) = recency.get_mut(&id) {
                    clock += 1;
                    *r = clock;
                }
            }
            _ => {
                d.fence(instance);
                for ps in model.values_mut() {
                    ps.retain(|p| !(p.1 == StorageLevel::L1 && !p.3 && p.0 == instance));
                }
                model.retain(|_, ps| !ps.is_empty());
            }
        }
        if step % 50 != 0 {
            continue;
        }
        assert_eq!(d.len(), model.len(), "step {step}");
        for ((h, g, salt), ps) in &model {
            let got = d.get(&mk(*h, *g, salt)).expect("present");
            let got: Vec<_> = got
                .placements
                .iter()
                .map(|p| {
                    (
                        p.instance_id.to_string(),
                        p.tier,
                        p.backend.to_string(),
                        p.shared,
                        p.size_bytes,
                    )
                })
                .collect();
            // A shared placement names its latest reporter; compare the rest.
            let strip = |v: &[(String, StorageLevel, String, bool, u64)]| -> Vec<_> {
                v.iter()
                    .map(|p| {
                        (
                            if p.3 { String::new() } else { p.0.clone() },
                            p.1,
                            p.2.clone(),
                            p.3,
                            p.4,
                        )
                    })
                    .collect()
            };
            assert_eq!(strip(&got), strip(ps), "step {step}");
        }
        let placements: usize = model.values().map(Vec::len).sum();
        assert_eq!(d.stats().num_placements as usize, placements, "step {step}");
        for salt in ["", "t", "u"] {
            let mut want: Vec<_> = recency.iter().filter(|(k, _)| k.2 == salt).collect();
            want.sort_by_key(|(_, t)| **t);
            let want: Vec<ObjectKey> = want
                .into_iter()
                .map(|((h, g, s), _)| mk(*h, *g, s))
                .collect();
            assert_eq!(
                d.lru_oldest(salt).collect::<Vec<_>>(),
                want,
                "step {step}, salt {salt:?}"
            );
        }
        let listed: Vec<ObjectKey> = d
            .list(&KeyFilter::default(), 0, usize::MAX)
            .1
            .into_iter()
            .map(|l| l.key)
            .collect();
        assert_eq!(listed.len(), model.len());
        for k in &listed {
            let base = ObjectKey {
                object_group_id: 0,
                ..k.clone()
            };
            let want: Vec<ObjectKey> = std::iter::once(base.clone())
                .chain(
                    model
                        .keys()
                        .filter(|(h, g, s)| *h == k.chunk_hash[0] && *g != 0 && *s == k.cache_salt)
                        .map(|(h, g, s)| mk(*h, *g, s)),
                )
                .collect();
            assert_eq!(d.expand_groups(&base), want, "step {step}");
        }
    }
}

/// No configured bound (or a larger one) lets the table reach `u32::MAX`
/// records, whose last id is the list terminator.
#[test]
fn the_key_bound_is_capped_by_the_record_ids() {
    let mut d = KeyDirectory::new();
    assert_eq!(d.key_bound(), MAX_KEYS);
    d.set_max_keys(Some(usize::MAX));
    assert_eq!(d.key_bound(), u32::MAX as usize - 1);
    d.set_max_keys(Some(5));
    assert_eq!(d.key_bound(), 5);
}

/// Sizes are the reporter's: sums saturate instead of overflowing.
#[test]
fn byte_sums_saturate() {
    let mut d = KeyDirectory::new();
    let store = |d: &mut KeyDirectory, instance: &str, size: u64| {
        d.apply(&batch(
            instance,
            EventType::Store,
            StorageLevel::L2,
            "fs",
            false,
            &[(key(1, ""), size), (key(2, ""), size)],
        ))
    };
    store(&mut d, "a", u64::MAX);
    assert_eq!(d.totals(StorageLevel::L2).bytes, u64::MAX);
    store(&mut d, "b", u64::MAX);
    store(&mut d, "a", 1);
    // Per (salt, tier, owner, backend): b's two keys saturate.
    assert!(d.placement_rollups().iter().any(|r| r.4 == u64::MAX));
    d.fence("a");
    d.apply(&batch(
        "a",
        EventType::Delete,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, ""), 0), (key(2, ""), 0)],
    ));
    assert_eq!(d.len(), 2);
}

/// The borrowed probe a lookup uses answers what `get` materializes: the
/// same placements in the same order, counts and bound tokens.
#[test]
fn probe_lends_what_get_materializes() {
    let mut d = KeyDirectory::new();
    let mut store = batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, "t"), 10), (key(2, ""), 5)],
    );
    store.entries[0].token_ids = vec![4, 5];
    d.apply(&store);
    d.apply(&batch(
        "b",
        EventType::Store,
        StorageLevel::L1,
        "dram",
        true,
        &[(key(1, "t"), 3)],
    ));
    d.apply(&batch(
        "b",
        EventType::Access,
        StorageLevel::L1,
        "",
        false,
        &[(key(1, "t"), 0)],
    ));
    for k in [key(1, "t"), key(2, "")] {
        let got = d.get(&k).unwrap();
        let view = d.probe(&k).unwrap();
        let lent: Vec<Placement> = view
            .placements()
            .map(|p| Placement {
                instance_id: p.instance_id.into(),
                incarnation: p.incarnation,
                tier: p.tier,
                backend: p.backend.into(),
                size_bytes: p.size_bytes,
                shared: p.shared,
            })
            .collect();
        assert_eq!(lent, got.placements);
        assert_eq!(view.access_count(), got.access_count);
        assert_eq!(view.last_access(), got.last_access);
        assert_eq!(view.tokens(), d.tokens_for_hash(&k.chunk_hash));
        let by_parts = d
            .probe_parts(
                &k.chunk_hash,
                &k.model_name,
                k.kv_rank,
                k.object_group_id,
                &k.cache_salt,
            )
            .unwrap();
        assert_eq!(
            by_parts.placements().collect::<Vec<_>>(),
            view.placements().collect::<Vec<_>>()
        );
        assert_eq!(by_parts.access_count(), view.access_count());
    }
    assert_eq!(d.probe(&key(1, "t")).unwrap().placements().count(), 2);
    assert_eq!(d.probe(&key(1, "t")).unwrap().tokens(), &[4, 5]);
    assert!(d.probe(&key(3, "")).is_none());
    let k3 = key(3, "");
    assert!(
        d.probe_parts(&k3.chunk_hash, &k3.model_name, k3.kv_rank, 0, "")
            .is_none()
    );
    let k1 = key(1, "t");
    assert!(
        d.probe_parts(&k1.chunk_hash, &k1.model_name, k1.kv_rank, 0, "u")
            .is_none()
    );
    let k = key(1, "t");
    // By owner: instance, then tier, then backend, whatever the report order.
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L1,
        "dram",
        false,
        &[(key(1, "t"), 2)],
    ));
    let owners: Vec<(&str, StorageLevel, &str)> = d
        .probe(&k)
        .unwrap()
        .placements_by_owner()
        .map(|p| (p.instance_id, p.tier, p.backend))
        .collect();
    assert_eq!(
        owners,
        [
            ("a", StorageLevel::L1, "dram"),
            ("a", StorageLevel::L2, "fs"),
            ("b", StorageLevel::L1, "dram"),
        ]
    );
    let one = key(2, "");
    assert_eq!(d.probe(&one).unwrap().placements_by_owner().count(), 1);
}
