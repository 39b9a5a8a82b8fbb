use std::collections::BTreeSet;

use super::*;
use crate::directory::KeyDirectory;
use crate::events::EventType;
use crate::testutil::batch;

fn key(hash: u8, group: i64) -> ObjectKey {
    ObjectKey {
        chunk_hash: vec![hash; 16],
        model_name: "m".into(),
        kv_rank: 0,
        object_group_id: group,
        cache_salt: String::new(),
    }
}

fn place() -> Place {
    Place {
        size_bytes: 1,
        incarnation: 1,
        instance: 0,
        backend: 0,
        tier: StorageLevel::L2,
        shared: false,
    }
}

/// A batch of `event` on `keys` from instance `a` (L2, `fs`), 1 byte each.
fn on_keys(event: EventType, keys: &[ObjectKey]) -> crate::events::Batch {
    let entries: Vec<(ObjectKey, u64)> = keys.iter().map(|k| (k.clone(), 1)).collect();
    batch("a", event, StorageLevel::L2, "fs", false, &entries)
}

/// `d` written to its checkpoint image and read back (ids filed again by
/// [`Table::file_all`]).
fn reloaded(d: &KeyDirectory) -> KeyDirectory {
    let mut raw = Vec::new();
    d.encode_image(&mut raw);
    KeyDirectory::read_image(&raw[..], raw.len()).unwrap()
}

/// A fixed shuffle (xorshift), so a failure repeats.
fn shuffle<T>(v: &mut [T], mut x: u64) {
    for i in (1..v.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
}

/// Checks a chunk hash's chain against the model (the groups it holds):
/// walked forwards it holds exactly those keys, each once, every back link
/// names the key before it, the first has none, and the chain is filed
/// under its hash only while it holds a key.
fn check_chain(t: &Table, hash: u8, model: &BTreeSet<i64>) {
    let h = [hash; 16];
    let ids: Vec<Id> = t.same_hash(&h).collect();
    let groups: BTreeSet<i64> = ids.iter().map(|&id| t.rec(id).object_group_id).collect();
    assert_eq!(&groups, model, "chain of hash {hash}");
    assert_eq!(ids.len(), model.len(), "a key twice in the chain of {hash}");
    let mut prev = NIL;
    for &id in &ids {
        assert_eq!(t.rec(id).same_hash_prev, prev, "back link of {id}");
        assert_eq!(t.hash_of(id), &h[..]);
        prev = id;
    }
    assert_eq!(t.first_of_hash(&h).is_some(), !model.is_empty());
    for &g in model {
        assert!(t.find(&key(hash, g)).is_some(), "key ({hash}, {g}) lost");
    }
}

#[test]
fn a_record_stays_112_bytes() {
    // The chain's back link fits because the LRU flag shares the hash
    // class's word; a larger record costs every key.
    assert_eq!(std::mem::size_of::<Rec>(), 112);
}

#[test]
fn the_lru_flag_leaves_the_hash_class_alone() {
    let mut t = Table::default();
    let short = t.insert(&key(1, 0), place());
    let long = t.insert(
        &ObjectKey {
            chunk_hash: vec![2; 32],
            ..key(2, 0)
        },
        place(),
    );
    for id in [short, long] {
        let (class, hash) = (t.rec(id).hash_class(), t.hash_of(id).to_vec());
        t.rec_mut(id).set_in_lru(true);
        assert!(t.rec(id).in_lru());
        assert_eq!((t.rec(id).hash_class(), t.hash_of(id)), (class, &hash[..]));
        t.rec_mut(id).set_in_lru(false);
        assert!(!t.rec(id).in_lru());
        assert_eq!(t.rec(id).hash_class(), class);
    }
}

#[test]
fn keys_of_one_chunk_hash_leave_in_any_order() {
    // 300 keys under hash 1 (groups), a few under hashes 2 and 3 so the
    // tables hold other chains, removed in a shuffled order with inserts in
    // between (freed ids reused, keys filed behind a chain's first).
    let mut t = Table::default();
    let mut model: [BTreeSet<i64>; 4] = Default::default();
    let mut ids = std::collections::HashMap::new();
    for g in 0..300 {
        ids.insert((1u8, g), t.insert(&key(1, g), place()));
        model[1].insert(g);
    }
    for (hash, g) in [(2u8, 0), (2, 1), (3, 0)] {
        ids.insert((hash, g), t.insert(&key(hash, g), place()));
        model[hash as usize].insert(g);
    }
    let mut order: Vec<(u8, i64)> = ids.keys().copied().collect();
    order.sort_unstable();
    shuffle(&mut order, 0x9E37_79B9_7F4A_7C15);
    for (step, (hash, g)) in order.into_iter().enumerate() {
        let id = ids.remove(&(hash, g)).unwrap();
        let last = t.remove(id);
        model[hash as usize].remove(&g);
        assert_eq!(last, model[hash as usize].is_empty(), "step {step}");
        assert!(t.find(&key(hash, g)).is_none());
        if step % 7 == 3 {
            // Back in, under a new group.
            let g = 1_000 + step as i64;
            ids.insert((hash, g), t.insert(&key(hash, g), place()));
            model[hash as usize].insert(g);
        }
        for h in 1..=3 {
            check_chain(&t, h, &model[h as usize]);
        }
    }
    assert_eq!(t.len(), ids.len());
}

#[test]
fn keys_of_a_loaded_chain_leave_in_any_order() {
    // The chain a load links (file_all) carries the same back links; the
    // keys leave through the directory's delete, as a node reports them.
    let mut d = KeyDirectory::new();
    let keys: Vec<ObjectKey> = (0..200).map(|g| key(5, g)).chain([key(6, 0)]).collect();
    d.apply(&on_keys(EventType::Store, &keys));
    let mut back = reloaded(&d);
    let mut model: BTreeSet<i64> = (0..200).collect();
    check_chain(&back.table, 5, &model);
    let mut order: Vec<i64> = (0..200).collect();
    shuffle(&mut order, 42);
    for g in order {
        back.apply(&on_keys(EventType::Delete, &[key(5, g)]));
        model.remove(&g);
        check_chain(&back.table, 5, &model);
        check_chain(&back.table, 6, &BTreeSet::from([0]));
    }
    assert_eq!((back.len(), back.lru_len()), (1, 1));
}

/// Keys and chunk hashes whose filed tags collide (this crate's tests keep
/// 12 bits of a tag: 20 k keys share 4,096 tags) are each found as
/// themselves, through the tables' growth, removals and a load; a chunk
/// hash's first key hands its slot on to the next of that hash only.
#[test]
fn keys_whose_tags_collide_are_told_apart_by_their_bytes() {
    let hash = |i: u32| {
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&i.to_le_bytes());
        h
    };
    // 10 k chunk hashes, two groups each.
    let k = |i: u32, g: i64| ObjectKey {
        chunk_hash: hash(i).to_vec(),
        ..key(0, g)
    };
    let mut t = Table::default();
    let mut ids = std::collections::HashMap::new();
    for i in 0..10_000u32 {
        for g in 0..2 {
            assert!(t.find(&k(i, g)).is_none(), "({i}, {g}) before its insert");
            ids.insert((i, g), t.insert(&k(i, g), place()));
        }
    }
    let tags: BTreeSet<u32> = (0..10_000u32)
        .map(|i| tag_of(t.hasher.hash_one(key_parts(&k(i, 0)))))
        .collect();
    assert!(
        tags.len() < 5_000,
        "tags collide in this test: {}",
        tags.len()
    );
    let found = |t: &Table, i: u32, g: i64| t.find(&k(i, g));
    for (&(i, g), &id) in &ids {
        assert_eq!(found(&t, i, g), Some(id), "({i}, {g})");
        assert_eq!(t.hash_of(id), &hash(i)[..]);
    }
    // Every even hash loses its first key (group 0, filed by its hash):
    // group 1 takes the slot; every odd one loses group 1.
    for i in 0..10_000u32 {
        let g = i64::from(i % 2);
        let id = ids.remove(&(i, g)).unwrap_or(NIL);
        assert!(!t.remove(id), "({i}, {g}) was not its hash's last key");
    }
    for i in 0..10_000u32 {
        let g = 1 - i64::from(i % 2);
        let id = ids[&(i, g)];
        assert_eq!(found(&t, i, g), Some(id));
        assert_eq!(found(&t, i, 1 - g), None, "({i}, {}) removed", 1 - g);
        assert_eq!(t.same_hash(&hash(i)).collect::<Vec<_>>(), vec![id]);
    }
    // Loaded from an image: filed again in bucket order, the tags' runs
    // told apart by their bytes.
    let mut d = KeyDirectory::new();
    let keys: Vec<ObjectKey> = (0..10_000u32).flat_map(|i| [k(i, 0), k(i, 1)]).collect();
    d.apply(&on_keys(EventType::Store, &keys));
    let back = reloaded(&d);
    for i in 0..10_000u32 {
        let chain: Vec<Id> = back.table.same_hash(&hash(i)).collect();
        let groups: BTreeSet<i64> = chain
            .iter()
            .map(|&id| back.table.rec(id).object_group_id)
            .collect();
        assert_eq!(groups, BTreeSet::from([0, 1]), "chain of {i}");
        assert_eq!(chain.len(), 2, "chain of {i}");
        let mut prev = NIL;
        for &id in &chain {
            assert_eq!(back.table.hash_of(id), &hash(i)[..]);
            assert_eq!(back.table.rec(id).same_hash_prev, prev, "back link of {id}");
            prev = id;
        }
        for g in 0..2 {
            let id = back.table.find(&k(i, g)).unwrap_or(NIL);
            assert_eq!(back.table.rec(id).object_group_id, g);
            assert_eq!(back.table.hash_of(id), &hash(i)[..]);
        }
    }
}

/// The interner's shortcut for the last names acquired never hands out a
/// freed slot or a slot that now holds another name: each id keeps naming
/// what was acquired, and the counts still free a name with its last key.
#[test]
fn recently_acquired_names_stay_live_and_exact() {
    let mut s = pools::Interner::default();
    let a = s.acquire("a");
    s.release(a);
    // "" equals the freed slot's placeholder: it must get a live slot.
    let empty = s.acquire("");
    let b = s.acquire("b");
    assert_eq!(&**s.name(empty), "");
    assert_eq!(&**s.name(b), "b");
    // A repeat through the shortcut counts as a reference.
    assert_eq!(s.acquire("b"), b);
    assert_eq!(s.acquire(""), empty);
    s.release(b);
    assert_eq!(s.get("b"), Some(b));
    s.release(b);
    assert_eq!(s.get("b"), None);
    // Its slot, reused for another name, is not "b" to the shortcut.
    let c = s.acquire("c");
    assert_eq!(s.acquire("b"), s.get("b").unwrap());
    assert_ne!(s.get("b"), Some(c));
    assert_eq!(&**s.name(c), "c");
    assert_eq!(&**s.name(empty), "");
}
