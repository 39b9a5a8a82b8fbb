use super::*;
use crate::directory::KeyFilter;
use crate::events::EventType;
use crate::testutil::{batch, key};

fn sample() -> KeyDirectory {
    let mut d = KeyDirectory::new();
    let mut store = batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, "t"), 10), (key(2, ""), 5), (key(3, "t"), 7)],
    );
    store.entries[0].token_ids = vec![7, 8, 9];
    store.entries[0].token_offset = 0;
    d.apply(&store);
    let mut g1 = key(1, "t");
    g1.object_group_id = 1;
    d.apply(&batch(
        "b",
        EventType::Store,
        StorageLevel::L1,
        "dram",
        false,
        &[(key(2, ""), 3), (g1, 4)],
    ));
    d.apply(&batch(
        "a",
        EventType::Access,
        StorageLevel::L2,
        "",
        false,
        &[(key(1, "t"), 0)],
    ));
    // A freed string slot and a freed record.
    d.apply(&batch(
        "c",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(9, "gone"), 1)],
    ));
    d.apply(&batch(
        "c",
        EventType::Delete,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(9, "gone"), 0)],
    ));
    d
}

fn image(d: &KeyDirectory) -> Vec<u8> {
    let mut out = Vec::new();
    d.encode_image(&mut out);
    out
}

#[test]
fn image_round_trips_every_answer() {
    let d = sample();
    let back = KeyDirectory::decode_image(&image(&d)).unwrap();
    assert_eq!(back.stats(), d.stats());
    assert_eq!(
        back.iter().collect::<Vec<_>>(),
        d.iter().collect::<Vec<_>>()
    );
    assert_eq!(back.lru_salts(), d.lru_salts());
    for (salt, _) in d.lru_salts() {
        assert_eq!(
            back.lru_oldest(&salt).collect::<Vec<_>>(),
            d.lru_oldest(&salt).collect::<Vec<_>>()
        );
    }
    assert_eq!(back.tokens_for_hash(&key(1, "").chunk_hash), &[7, 8, 9]);
    assert_eq!(back.expand_groups(&key(1, "t")).len(), 2);
    assert_eq!(
        back.list(&KeyFilter::default(), 0, 10),
        d.list(&KeyFilter::default(), 0, 10)
    );
    // A loaded directory saves and keeps working.
    let again = KeyDirectory::decode_image(&image(&back)).unwrap();
    assert_eq!(
        again.iter().collect::<Vec<_>>(),
        d.iter().collect::<Vec<_>>()
    );
    let mut back = back;
    back.fence("b");
    assert_eq!(back.stats().l1.count, 0);
    assert_eq!(back.len(), 3);
    back.apply(&batch(
        "c",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(9, "gone"), 1)],
    ));
    assert_eq!(back.lru_bucket_len("gone"), 1);
}

/// Thousands of keys, a few chunk hashes with several groups and
/// ranks: every key is found after a load, each chunk hash's keys
/// chained together, and deleting every key leaves the tables empty
/// (the load files the id tables in bucket order, not key by key).
#[test]
fn a_large_image_loads_every_key_and_every_sibling() {
    let mut d = KeyDirectory::new();
    let mut keys = Vec::new();
    for i in 0..3000u32 {
        let mut k = key(0, if i % 3 == 0 { "t" } else { "" });
        k.chunk_hash = i.to_le_bytes().repeat(4);
        keys.push(k.clone());
        if i % 7 == 0 {
            for g in 1..4 {
                let mut s = k.clone();
                s.object_group_id = g;
                keys.push(s);
            }
            let mut r = k.clone();
            r.kv_rank += 1;
            keys.push(r);
        }
    }
    let entries: Vec<_> = keys.iter().map(|k| (k.clone(), 1)).collect();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &entries,
    ));
    let mut back = KeyDirectory::decode_image(&image(&d)).unwrap();
    assert_eq!(back.len(), keys.len());
    for k in &keys {
        assert!(back.contains(k), "{k:?}");
        assert_eq!(back.expand_groups(k), d.expand_groups(k), "{k:?}");
        assert_eq!(
            back.table.same_hash(&k.chunk_hash).count(),
            d.table.same_hash(&k.chunk_hash).count()
        );
    }
    back.apply(&batch(
        "a",
        EventType::Delete,
        StorageLevel::L2,
        "fs",
        false,
        &entries,
    ));
    assert!(back.is_empty());
    for k in &keys {
        assert!(back.table.first_of_hash(&k.chunk_hash).is_none());
    }
}

/// 20,000 keys (groups and salts) under one chunk hash: one run of the
/// load's sort, linked in one pass; every key is found and the chain
/// holds them all, lowest id first.
#[test]
fn an_image_with_many_keys_under_one_chunk_hash_loads() {
    let mut d = KeyDirectory::new();
    let keys: Vec<_> = (0..20_000i64)
        .map(|g| {
            let mut k = key(5, if g % 2 == 0 { "t" } else { "" });
            k.object_group_id = g;
            (k, 1)
        })
        .collect();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &keys,
    ));
    let back = KeyDirectory::decode_image(&image(&d)).unwrap();
    assert_eq!(back.len(), keys.len());
    for (k, _) in &keys {
        assert!(back.contains(k), "{k:?}");
    }
    let chain: Vec<_> = back.table.same_hash(&keys[0].0.chunk_hash).collect();
    assert_eq!(chain.len(), keys.len());
    assert!(chain.windows(2).all(|w| w[0] < w[1]));
}

/// An image that holds one key twice is refused (the load finds the
/// two in one run of equal hashes).
#[test]
fn an_image_with_a_key_twice_is_refused() {
    let mut d = KeyDirectory::new();
    let mut twin = key(1, "t");
    twin.object_group_id = 0x1122_3344_5566_7788;
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, "t"), 1), (twin, 2)],
    ));
    let mut raw = image(&d);
    assert!(KeyDirectory::decode_image(&raw).is_ok());
    let marker = 0x1122_3344_5566_7788i64.to_le_bytes();
    let at = raw.windows(8).position(|w| w == marker).unwrap();
    raw[at..at + 8].copy_from_slice(&0i64.to_le_bytes());
    let err = KeyDirectory::decode_image(&raw).unwrap_err().to_string();
    assert!(err.contains("repeats an earlier key"), "{err}");
}

#[test]
fn corrupt_images_are_errors_not_panics() {
    let raw = image(&sample());
    // Every truncation and every single-byte change either loads a
    // directory or is an error; none panics.
    for cut in 0..raw.len() {
        assert!(
            KeyDirectory::decode_image(&raw[..cut]).is_err(),
            "cut {cut}"
        );
    }
    for at in 0..raw.len() {
        let mut bad = raw.clone();
        bad[at] ^= 0xA5;
        let _ = KeyDirectory::decode_image(&bad);
    }
    let mut long = raw.clone();
    long.push(0);
    assert!(
        KeyDirectory::decode_image(&long)
            .unwrap_err()
            .to_string()
            .contains("after the bindings")
    );
}

/// The offset of the first key's hash length in `d`'s image.
fn first_hash_len_at(d: &KeyDirectory) -> usize {
    let names = |ns: &[Name]| 4 + ns.iter().map(|n| 4 + n.len()).sum::<usize>();
    names(d.table.strings.slots()) + names(d.table.names.slots()) + 8
}

#[test]
fn a_flipped_hash_length_is_an_error_not_an_abort() {
    // Many keys and a first hash length that still fits in the file:
    // reserving count × length asked for terabytes and aborted.
    let entries: Vec<_> = (0..200_000u32)
        .map(|i| {
            let mut k = key(0, "t");
            k.chunk_hash = i.to_le_bytes().to_vec();
            (k, 1)
        })
        .collect();
    let mut d = KeyDirectory::new();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &entries,
    ));
    let mut raw = image(&d);
    let at = first_hash_len_at(&d);
    assert_eq!(raw[at..at + 4], 4u32.to_le_bytes());
    let flipped = u32::try_from(raw.len() / 2).unwrap();
    raw[at..at + 4].copy_from_slice(&flipped.to_le_bytes());
    assert!(KeyDirectory::decode_image(&raw).is_err());
}

#[test]
fn lists_that_disagree_with_the_records_are_refused() {
    // Two L2 keys of salt "t" from "a": the image ends with the LRU
    // (one list of both), the L1 index ("a", empty) and no bindings.
    let mut d = KeyDirectory::new();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, "t"), 10), (key(2, "t"), 10)],
    ));
    let raw = image(&d);
    let salt = d.table.strings.get("t").unwrap();
    let lru_at = raw.len() - (24 + 17 + 8);
    let mut lru = Vec::new();
    put_u32(&mut lru, 1);
    put_u32(&mut lru, salt as usize);
    put_u64(&mut lru, 2);
    put_u32(&mut lru, 0);
    put_u32(&mut lru, 1);
    assert_eq!(raw[lru_at..lru_at + 24], lru[..]);
    let tail = raw[lru_at + 24..].to_vec();
    let with_lru = |lru: &[u8]| [&raw[..lru_at], lru, &tail].concat();
    // The salt's list twice, one key each: the second overwrote the
    // first and left key 0 filed in no list.
    let mut twice = Vec::new();
    put_u32(&mut twice, 2);
    for id in [0, 1] {
        put_u32(&mut twice, salt as usize);
        put_u64(&mut twice, 1);
        put_u32(&mut twice, id);
    }
    let e = KeyDirectory::decode_image(&with_lru(&twice)).unwrap_err();
    assert!(e.to_string().contains("listed twice"), "{e}");
    // A key with an L2 placement filed nowhere.
    let mut short = Vec::new();
    put_u32(&mut short, 1);
    put_u32(&mut short, salt as usize);
    put_u64(&mut short, 1);
    put_u32(&mut short, 0);
    assert!(KeyDirectory::decode_image(&with_lru(&short)).is_err());
    // The L1 index claims a key "a" holds no L1 placement of.
    let mut l1 = raw.clone();
    let n = l1.len();
    l1.truncate(n - 16);
    put_u64(&mut l1, 1);
    put_u32(&mut l1, 0);
    put_u64(&mut l1, 0);
    let e = KeyDirectory::decode_image(&l1).unwrap_err();
    assert!(e.to_string().contains("l1:"), "{e}");
    // The honest image loads and survives a fence, the deletes and a
    // re-encode.
    let mut back = KeyDirectory::decode_image(&raw).unwrap();
    back.fence("a");
    back.apply(&batch(
        "a",
        EventType::Delete,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, "t"), 0), (key(2, "t"), 0)],
    ));
    assert!(back.is_empty());
    assert_eq!(back.lru_bucket_len("t"), 0);
    let again = KeyDirectory::decode_image(&image(&back)).unwrap();
    assert!(again.is_empty());
}

/// A source that hands out 1 to 7 bytes a read (a file read in pieces).
struct Trickle<'a>(&'a [u8], usize);

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        self.1 = self.1 % 7 + 1;
        let n = self.1.min(out.len()).min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

/// An image read from a source in small pieces, past the reader's chunk
/// size (a long string, many keys), loads as it does from a slice; cut
/// short, with its length claiming more, it is an error.
#[test]
fn an_image_read_in_pieces_loads_as_from_a_slice() {
    let mut d = sample();
    let entries: Vec<_> = (0..5000u32)
        .map(|i| {
            let mut k = key(0, "");
            k.chunk_hash = i.to_le_bytes().repeat(4);
            (k, 1)
        })
        .collect();
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &entries,
    ));
    let mut long = key(1, "");
    long.model_name = "m".repeat(100_000);
    d.apply(&batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(long, 1)],
    ));
    let raw = image(&d);
    assert!(raw.len() > 2 * CHUNK);
    let back = KeyDirectory::read_image(Trickle(&raw, 0), raw.len()).unwrap();
    assert_eq!(
        back.iter().collect::<Vec<_>>(),
        d.iter().collect::<Vec<_>>()
    );
    assert_eq!(back.stats(), d.stats());
    for cut in [
        0,
        1,
        CHUNK - 1,
        CHUNK,
        CHUNK + 1,
        raw.len() / 2,
        raw.len() - 1,
    ] {
        let err = KeyDirectory::read_image(Trickle(&raw[..cut], 0), raw.len());
        assert!(err.is_err(), "cut {cut}");
    }
}
