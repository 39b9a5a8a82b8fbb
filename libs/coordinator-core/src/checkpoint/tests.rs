use super::*;
use crate::events::EventType;
use crate::testutil::{batch, key};

#[test]
fn views_round_trip_through_the_file() {
    let (mut gate, mut dir, mut usage, mut caps) = (
        Gate::new(),
        KeyDirectory::new(),
        UsageView::new(),
        CapacityRegistry::new(),
    );
    let mut store = batch(
        "a",
        EventType::Store,
        StorageLevel::L2,
        "fs",
        false,
        &[(key(1, "t"), 10), (key(2, ""), 5)],
    );
    store.entries[0].token_ids = vec![7, 8, 9];
    store.entries[0].token_offset = 0;
    let l1 = batch(
        "a",
        EventType::Store,
        StorageLevel::L1,
        "dram",
        false,
        &[(key(2, ""), 3)],
    );
    let mut cfg = batch("a", EventType::Config, StorageLevel::L1, "dram", false, &[]);
    cfg.capacity_bytes = 1000;
    for b in [&store, &l1, &cfg] {
        gate.offer(&b.instance_id, b.incarnation, b.seq, 0);
        let old = dir.apply(b);
        usage.apply(b, &old);
        caps.apply(b);
    }
    let sections = Sections {
        stream_cursors: Some(capture_gate(&gate)),
        key_directory: Some(capture_directory(&dir)),
        cache_usage: Some(capture_usage(&dir)),
        server_config: Some(capture_capacity(&caps)),
        lru_order: Some(capture_lru(&dir)),
        kafka_stream_position: Some(KafkaPositionSection {
            offsets: vec![("lmcache-cache-events".into(), 3, 99)],
        }),
    };
    let raw = encode(&sections).unwrap();
    assert_eq!(&raw[..12], b"LMCKPT\0\0\x01\0\0\0");
    let (back, skipped) = decode(&raw).unwrap();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(back.cache_usage, None, "written, never read back");
    assert_eq!(
        back,
        Sections {
            cache_usage: None,
            ..sections.clone()
        }
    );
    let mut dir2 = restore_directory(back.key_directory.clone().unwrap());
    restore_lru(back.lru_order.as_ref().unwrap(), &mut dir2);
    assert_eq!(dir2.stats(), dir.stats());
    assert_eq!(dir2.tokens_for_hash(&key(1, "").chunk_hash), &[7, 8, 9]);
    assert_eq!(capture_directory(&dir2), capture_directory(&dir));
    assert_eq!(capture_usage(&dir2), capture_usage(&dir));
    let usage2 = restore_usage(&dir2);
    assert_eq!(usage2.salt_bytes(StorageLevel::L2, "t"), 10);
    assert_eq!(
        capture_capacity(&restore_capacity(back.server_config.as_ref().unwrap())),
        capture_capacity(&caps)
    );
    assert_eq!(capture_lru(&dir2), capture_lru(&dir));
    assert_eq!(
        restore_gate(back.stream_cursors.as_ref().unwrap()).cursor("a"),
        gate.cursor("a")
    );
}

#[test]
fn corrupt_files_are_errors_not_panics() {
    assert!(matches!(decode(b""), Err(CheckpointError::Header)));
    assert!(matches!(
        decode(b"LMCKPT\0\0\x02\0\0\0\x80"),
        Err(CheckpointError::Version(2))
    ));
    assert!(matches!(
        decode(b"LMCKPT\0\0\x01\0\0\0\xc1\xff"),
        Err(CheckpointError::Value(_))
    ));
    assert!(matches!(
        decode(b"LMCKPT\0\0\x01\0\0\0\x93\x01\x02\x03"),
        Err(CheckpointError::Value(_))
    ));
    let mut raw = encode(&Sections {
        stream_cursors: Some(StreamCursors::default()),
        ..Sections::default()
    })
    .unwrap();
    raw.truncate(raw.len() - 1);
    assert!(decode(&raw).is_err());
    assert_eq!(
        decode(&encode(&Sections::default()).unwrap()).unwrap().0,
        Sections::default()
    );
}

#[test]
fn version_two_round_trips_and_reads_the_references_file() {
    let (mut gate, mut dir) = (Gate::new(), KeyDirectory::new());
    for (i, salt) in ["t", "", "t"].iter().enumerate() {
        let b = batch(
            "a",
            EventType::Store,
            StorageLevel::L2,
            "fs",
            false,
            &[(key(i as u8, salt), 10)],
        );
        gate.offer(&b.instance_id, b.incarnation, b.seq, 0);
        dir.apply(&b);
    }
    // Key 0 becomes the most recent of tenant "t".
    dir.apply(&batch(
        "a",
        EventType::Access,
        StorageLevel::L2,
        "",
        false,
        &[(key(0, "t"), 0)],
    ));
    let sections = Sections {
        stream_cursors: Some(capture_gate(&gate)),
        kafka_stream_position: Some(KafkaPositionSection {
            offsets: vec![("events".into(), 0, 7)],
        }),
        ..Sections::default()
    };
    let raw = encode_file(&sections, &dir).unwrap();
    assert_eq!(&raw[..12], b"LMCKPT\0\0\x02\0\0\0");
    let back = decode_file(&raw).unwrap();
    assert!(back.skipped.is_empty(), "{:?}", back.skipped);
    assert_eq!(back.sections, sections);
    let d2 = back.directory.unwrap();
    assert_eq!(capture_directory(&d2), capture_directory(&dir));
    assert_eq!(capture_lru(&d2), capture_lru(&dir));
    // The reference's own (version 1) file restores the same directory
    // and LRU order.
    let v1 = encode(&Sections {
        key_directory: Some(capture_directory(&dir)),
        lru_order: Some(capture_lru(&dir)),
        ..sections.clone()
    })
    .unwrap();
    let back = decode_file(&v1).unwrap();
    let d1 = back.directory.unwrap();
    assert_eq!(capture_lru(&d1), capture_lru(&dir));
    assert_eq!(d1.stats(), dir.stats());
    assert_eq!(back.sections.lru_order, None);
    // A corrupt directory frame starts cold, and with it the gate
    // cursors and the Kafka position (the log replays into it).
    let mut bad = raw.clone();
    let n = bad.len();
    bad[n - 9] ^= 0xFF;
    let back = decode_file(&bad).unwrap();
    assert!(back.directory.is_none());
    assert_eq!(back.skipped[0].name, "key_directory");
    assert_eq!(
        back.sections,
        Sections {
            stream_cursors: None,
            kafka_stream_position: None,
            ..sections.clone()
        }
    );
    // So does a version-1 file whose directory section is corrupt.
    let mut v1_bad = b"LMCKPT\0\0\x01\0\0\0".to_vec();
    rmpv::encode::write_value(
        &mut v1_bad,
        &rmpv::Value::Map(vec![
            (
                "stream_cursors".into(),
                rmpv::ext::to_value(sections.stream_cursors.as_ref().unwrap()).unwrap(),
            ),
            (
                "kafka_stream_position".into(),
                rmpv::ext::to_value(sections.kafka_stream_position.as_ref().unwrap()).unwrap(),
            ),
            ("key_directory".into(), "not a section".into()),
        ]),
    )
    .unwrap();
    let back = decode_file(&v1_bad).unwrap();
    assert!(back.directory.is_none());
    assert_eq!(back.skipped[0].name, "key_directory");
    assert_eq!(back.sections, Sections::default());
    // A truncated frame, an unknown version: errors (cold start).
    assert!(decode_file(&raw[..raw.len() - 1]).is_err());
    assert!(matches!(
        decode_file(b"LMCKPT\0\0\x03\0\0\0"),
        Err(CheckpointError::Version(3))
    ));
}

#[test]
fn a_bad_section_starts_cold_alone() {
    let good = StreamCursors {
        cursors: [("a".to_owned(), (1, 2, false))].into(),
    };
    // A map with a good section, a mistyped one and an unknown one.
    let body = rmpv::Value::Map(vec![
        ("stream_cursors".into(), rmpv::ext::to_value(&good).unwrap()),
        ("key_directory".into(), "not a section".into()),
        ("future_section".into(), rmpv::Value::Nil),
    ]);
    let mut raw = b"LMCKPT\0\0\x01\0\0\0".to_vec();
    rmpv::encode::write_value(&mut raw, &body).unwrap();
    let (sections, skipped) = decode(&raw).unwrap();
    assert_eq!(sections.stream_cursors, Some(good));
    assert!(sections.key_directory.is_none());
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].name, "key_directory");
}
