use rmpv::Value as Mp;
use serde_json::{Map, Value, json};

use super::frame::map;
use super::*;
use crate::events::{EventType, WireBatch};

fn sample_batch(seq: i64) -> WireBatch {
    serde_json::from_value(json!({
        "instance_id": "mp-a", "incarnation": 7, "seq": seq, "event_type": "store", "tier": "l2",
        "backend": "fs", "entries": [{"key": {"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": 1},
                                      "size_bytes": 3, "token_ids": [1, 2]}]}))
    .unwrap()
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => panic!("not an object"),
    }
}

fn frame(v: Mp) -> Vec<u8> {
    let mut out = Vec::new();
    write_raw_frame(&mut out, &v).unwrap();
    out
}

fn mp(pairs: Vec<(&str, Mp)>) -> Mp {
    map(pairs)
}

fn read_all(raw: &[u8]) -> Result<Vec<TraceEvent>, TraceError> {
    TraceReader::open(raw)?.collect()
}

#[test]
fn writer_and_reader_round_trip() {
    let header = Header {
        lmcache_version: Some("0.4.0".into()),
        t_mono_start: 50.0,
        t_wall_start: 1.7e9,
        sm_config_json: "{}".into(),
        sm_config_digest: "d".into(),
        level_meta: obj(json!({"sink": "file"})),
        ..Header::default()
    };
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    w.lifecycle(
        0.0,
        1.7e9,
        "register",
        obj(json!({"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 1, "extra": true})),
    )
    .unwrap();
    w.batch(0.5, 1.7e9 + 0.5, &sample_batch(1)).unwrap();
    w.lifecycle(0.7, 0.0, "heartbeat", obj(json!({"instance_id": "mp-a"})))
        .unwrap();
    let raw = w.finish().unwrap();
    let reader = TraceReader::open(raw.as_slice()).unwrap();
    assert_eq!(reader.header(), &header);
    let events: Vec<TraceEvent> = reader.collect::<Result<_, _>>().unwrap();
    assert_eq!(events.len(), 3);
    assert_eq!(
        events[0],
        TraceEvent::Lifecycle {
            t_mono: 0.0,
            phase: LifecyclePhase::Register,
            instance_id: "mp-a".into(),
            registration: Some(json!({"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 1})),
        }
    );
    let TraceEvent::Batch { batch, t_mono } = &events[1] else {
        panic!("not a batch: {:?}", events[1])
    };
    assert_eq!(*t_mono, 0.5);
    assert_eq!(**batch, sample_batch(1));
    let valid = batch.validate(0).unwrap();
    assert_eq!(valid.event_type, EventType::Store);
    assert_eq!(valid.entries[0].token_ids, vec![1, 2]);
    assert!(matches!(
        events[2],
        TraceEvent::Lifecycle {
            phase: LifecyclePhase::Heartbeat,
            registration: None,
            ..
        }
    ));
}

/// Frames built by hand the way msgspec lays them out: the tag first,
/// defaults left out, extra fields the reader must ignore.
#[test]
fn hand_built_frames_decode_field_by_field() {
    let mut raw = frame(mp(vec![
        ("type", Mp::from("header")),
        ("magic", Mp::Binary(b"LMCT".to_vec())),
        ("format_version", Mp::from(1)),
        ("level", Mp::from("events")),
        ("trace_schema_version", Mp::from(1)),
        ("t_mono_start", Mp::F64(12.5)),
        ("t_wall_start", Mp::F64(1000.25)),
        ("sm_config_json", Mp::from("{\"a\":1}")),
        ("sm_config_digest", Mp::from("abc")),
        ("future_field", Mp::Array(vec![Mp::from(1)])),
    ]));
    raw.extend(frame(mp(vec![
        ("type", Mp::from("record")),
        ("t_mono", Mp::F64(0.25)),
        ("t_wall", Mp::F64(1000.5)),
        ("qualname", Mp::from("events.batch")),
        (
            "args",
            mp(vec![
                ("instance_id", Mp::from("mp-b")),
                ("incarnation", Mp::from(3u64)),
                ("seq", Mp::from(9)),
                ("event_type", Mp::from("delete")),
                ("tier", Mp::from("l1")),
                ("backend", Mp::from("cpu")),
                ("shared", Mp::Boolean(true)),
                ("ts", Mp::F32(2.5)),
                ("unknown_extra", Mp::Nil),
                (
                    "entries",
                    Mp::Array(vec![mp(vec![(
                        "key",
                        mp(vec![
                            ("chunk_hash_hex", Mp::from("0f")),
                            ("model_name", Mp::from("m")),
                            ("kv_rank", Mp::from(5)),
                        ]),
                    )])]),
                ),
            ]),
        ),
    ])));
    let mut reader = TraceReader::open(raw.as_slice()).unwrap();
    let h = reader.header().clone();
    assert_eq!(h.format_version, 1);
    assert_eq!(h.level, "events");
    assert_eq!(h.trace_schema_version, 1);
    assert!(h.level_meta.is_empty());
    assert_eq!(h.lmcache_version, None);
    assert_eq!((h.t_mono_start, h.t_wall_start), (12.5, 1000.25));
    assert_eq!(h.sm_config_json, "{\"a\":1}");
    assert_eq!(h.sm_config_digest, "abc");
    let rec = reader.next_record().unwrap().unwrap();
    assert_eq!((rec.t_mono, rec.t_wall), (0.25, 1000.5));
    assert_eq!(rec.qualname, "events.batch");
    let TraceEvent::Batch { batch, .. } = rec.into_event(1) else {
        panic!("not a batch")
    };
    assert_eq!(batch.instance_id, "mp-b");
    assert_eq!((batch.incarnation, batch.seq), (3, 9));
    assert_eq!(batch.backend, "cpu");
    assert!(batch.shared);
    assert_eq!(batch.ts, 2.5);
    assert_eq!(batch.entries.len(), 1);
    let valid = batch.validate(0).unwrap();
    assert_eq!(valid.event_type, EventType::Delete);
    assert!(reader.next_record().unwrap().is_none());
}

fn header_with(pairs: Vec<(&str, Mp)>) -> Vec<u8> {
    let mut fields = vec![
        ("type", Mp::from("header")),
        ("magic", Mp::Binary(b"LMCT".to_vec())),
        ("format_version", Mp::from(1)),
        ("level", Mp::from("events")),
    ];
    for (k, v) in pairs {
        fields.retain(|(f, _)| *f != k);
        fields.push((k, v));
    }
    frame(mp(fields))
}

#[test]
fn bad_headers_are_refused() {
    let err = |raw: Vec<u8>| read_all(&raw).unwrap_err().to_string();
    assert!(header_with(vec![]).len() > 4 && read_all(&header_with(vec![])).is_ok());
    assert!(err(header_with(vec![("magic", Mp::Binary(b"LMCX".to_vec()))])).contains("magic"));
    assert!(err(header_with(vec![("format_version", Mp::from(2))])).contains("format_version 2"));
    assert!(
        err(header_with(vec![("trace_schema_version", Mp::from(9))]))
            .contains("trace_schema_version 9")
    );
    assert!(err(header_with(vec![("level", Mp::from("calls"))])).contains("level `calls`"));
    assert!(err(Vec::new()).contains("empty file"));
    let record_first = frame(mp(vec![
        ("type", Mp::from("record")),
        ("qualname", Mp::from("x")),
    ]));
    assert!(err(record_first).contains("not a header"));
    assert!(matches!(
        read_all(&frame(Mp::from(3))),
        Err(TraceError::Frame { index: 0, .. })
    ));
}

#[test]
fn broken_frames_are_errors_not_panics() {
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    w.batch(0.0, 0.0, &sample_batch(1)).unwrap();
    let good = w.finish().unwrap();
    let header_len = TraceWriter::new(Vec::new(), &Header::default())
        .unwrap()
        .finish()
        .unwrap()
        .len();
    // Inside the body, and inside the length prefix.
    for cut in [1, 3, 5, good.len() - header_len - 2] {
        let truncated = &good[..good.len() - cut];
        let results: Vec<_> = TraceReader::open(truncated).unwrap().collect();
        assert!(
            matches!(results.last(), Some(Err(TraceError::Truncated(1)))),
            "cut {cut}: {results:?}"
        );
    }
    let mut huge = header_with(vec![]);
    huge.extend_from_slice(&u32::MAX.to_be_bytes());
    let results: Vec<_> = TraceReader::open(huge.as_slice()).unwrap().collect();
    assert!(matches!(
        results.last(),
        Some(Err(TraceError::TooLarge { .. }))
    ));
    let mut garbage = header_with(vec![]);
    garbage.extend_from_slice(&[0, 0, 0, 2, 0xd9, 0x05]);
    garbage.extend_from_slice(&good);
    let results: Vec<_> = TraceReader::open(garbage.as_slice()).unwrap().collect();
    assert_eq!(results.len(), 1, "stops after the error");
    assert!(matches!(
        results[0],
        Err(TraceError::Decode { index: 1, .. })
    ));
    let mut second_header = header_with(vec![]);
    second_header.extend(header_with(vec![]));
    let results: Vec<_> = TraceReader::open(second_header.as_slice())
        .unwrap()
        .collect();
    assert!(matches!(
        results[0],
        Err(TraceError::Frame { index: 1, .. })
    ));
}

#[test]
fn unknown_qualnames_and_phases_are_skipped() {
    let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
    w.record(&Record {
        t_mono: 1.0,
        t_wall: 0.0,
        qualname: "storage.put".into(),
        args: Map::new(),
    })
    .unwrap();
    w.lifecycle(2.0, 0.0, "suspend", obj(json!({"instance_id": "mp-a"})))
        .unwrap();
    w.lifecycle(3.0, 0.0, "register", Map::new()).unwrap();
    w.record(&Record {
        t_mono: 4.0,
        t_wall: 0.0,
        qualname: QUALNAME_BATCH.into(),
        args: obj(json!({"seq": "nope"})),
    })
    .unwrap();
    w.lifecycle(5.0, 0.0, "deregister", obj(json!({"instance_id": "mp-a"})))
        .unwrap();
    let raw = w.finish().unwrap();
    let events = read_all(&raw).unwrap();
    assert_eq!(events.len(), 5);
    assert_eq!(
        events[0],
        TraceEvent::Skipped {
            t_mono: 1.0,
            index: 1,
            reason: Skipped::Qualname("storage.put".into())
        }
    );
    assert_eq!(
        events[1],
        TraceEvent::Skipped {
            t_mono: 2.0,
            index: 2,
            reason: Skipped::Phase("suspend".into())
        }
    );
    assert!(matches!(
        &events[2],
        TraceEvent::Skipped { reason: Skipped::Malformed { qualname, .. }, .. } if qualname == QUALNAME_LIFECYCLE
    ));
    assert!(matches!(
        &events[3],
        TraceEvent::Skipped { index: 4, reason: Skipped::Malformed { qualname, .. }, .. } if qualname == QUALNAME_BATCH
    ));
    assert!(matches!(
        &events[4],
        TraceEvent::Lifecycle { phase: LifecyclePhase::Deregister, instance_id, t_mono, .. }
            if instance_id == "mp-a" && *t_mono == 5.0
    ));
}

#[test]
fn pacing_divides_gaps_by_speed() {
    use std::time::Duration;
    assert_eq!(due_after(2.0, 2.0), Duration::from_secs(1));
    assert_eq!(due_after(2.0, 0.0), Duration::ZERO);
    assert_eq!(due_after(-1.0, 1.0), Duration::ZERO);
    assert_eq!(due_after(f64::NAN, 1.0), Duration::ZERO);
    assert_eq!(due_after(1.0, 0.5), Duration::from_secs(2));
}
