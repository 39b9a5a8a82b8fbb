//! Hostile and broken payloads: a clear error, never a panic, and a bad event
//! never takes the good ones in its batch down with it.

// Test and benchmark helpers panic on bad fixtures by design.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use ic_kvevents::{KvEvent, WireError, decode_batch};
use proptest::prelude::*;

/// msgpack of `[ts, [events...], 0]` with raw event bytes spliced in.
fn batch_with(events: &[&[u8]]) -> Vec<u8> {
    let mut out = vec![0x93, 0xcb];
    out.extend_from_slice(&1.5f64.to_be_bytes());
    out.push(0x90 | u8::try_from(events.len()).unwrap());
    for e in events {
        out.extend_from_slice(e);
    }
    out.push(0x00);
    out
}

const CLEARED: &[u8] = &[
    0x91, 0xb0, b'A', b'l', b'l', b'B', b'l', b'o', b'c', b'k', b's', b'C', b'l', b'e', b'a', b'r',
    b'e', b'd',
];

#[test]
fn garbage_is_an_error() {
    for bytes in [&b""[..], b"\xc1", b"hello world", b"\x93\xcb\x00", b"\x05"] {
        assert!(decode_batch(bytes).is_err(), "{bytes:x?}");
    }
}

#[test]
fn huge_declared_arrays_fail_fast() {
    // events: array32 claiming 2^32-1 elements, with nothing after it.
    let mut bytes = vec![0x92, 0x00, 0xdd, 0xff, 0xff, 0xff, 0xff];
    bytes.extend_from_slice(&[0x90; 4]);
    assert!(matches!(
        decode_batch(&bytes),
        Err(WireError::Truncated { .. })
    ));
}

#[test]
fn a_wrongly_typed_event_is_rejected_alone() {
    // ["BlockStored", "not-a-list", nil, [], 16]
    let mut bad = vec![0x95, 0xab];
    bad.extend_from_slice(b"BlockStored");
    bad.extend_from_slice(&[0xa3, b'x', b'y', b'z', 0xc0, 0x90, 0x10]);
    let payload = batch_with(&[CLEARED, &bad, CLEARED]);
    let batch = decode_batch(&payload).unwrap();
    assert_eq!(
        batch.events,
        vec![KvEvent::AllBlocksCleared, KvEvent::AllBlocksCleared]
    );
    assert_eq!(batch.rejected.len(), 1);
    assert_eq!(batch.rejected[0].0, 1);
    assert_eq!(batch.rejected[0].1.reason(), "wrong_type");
}

#[test]
fn unknown_event_classes_are_kept_as_unknown() {
    let mut ev = vec![0x92, 0xa9];
    ev.extend_from_slice(b"Something");
    ev.push(0x01);
    let batch = decode_batch(&batch_with(&[&ev])).unwrap();
    assert_eq!(batch.events, vec![KvEvent::Unknown("Something".into())]);
}

#[test]
fn token_ids_out_of_u32_range_are_rejected() {
    // ["BlockStored", [1], nil, [2^40], 1]
    let mut ev = vec![0x95, 0xab];
    ev.extend_from_slice(b"BlockStored");
    ev.extend_from_slice(&[0x91, 0x01, 0xc0, 0x91, 0xcf, 0, 0, 1, 0, 0, 0, 0, 0, 0x01]);
    let batch = decode_batch(&batch_with(&[&ev])).unwrap();
    assert_eq!(batch.rejected[0].1, WireError::OutOfRange("token_ids"));
}

#[test]
fn trailing_bytes_are_reported_and_the_events_kept() {
    let mut payload = batch_with(&[CLEARED]);
    payload.push(0x00);
    let batch = decode_batch(&payload).unwrap();
    assert_eq!(batch.events, vec![KvEvent::AllBlocksCleared]);
    assert!(matches!(
        batch.damaged,
        Some(WireError::TrailingBytes { .. })
    ));
}

#[test]
fn a_bad_field_beside_the_events_keeps_them() {
    // [1.5, [cleared, cleared], -1]: a negative rank.
    let mut payload = batch_with(&[CLEARED, CLEARED]);
    *payload.last_mut().unwrap() = 0xff;
    let batch = decode_batch(&payload).unwrap();
    assert_eq!(batch.events.len(), 2);
    assert_eq!(batch.data_parallel_rank, None);
    assert_eq!(
        batch.damaged.as_ref().map(WireError::reason),
        Some("wrong_type")
    );
    // A bad timestamp is skipped whole: the events after it still read.
    let mut payload = batch_with(&[CLEARED]);
    payload[1..10].copy_from_slice(&[0xa8, b'n', b'o', b't', b'-', b't', b'i', b'm', b'e']);
    let batch = decode_batch(&payload).unwrap();
    assert_eq!(batch.events, vec![KvEvent::AllBlocksCleared]);
    assert_eq!(batch.ts, 0.0);
    assert_eq!(
        batch.damaged.as_ref().map(WireError::reason),
        Some("wrong_type")
    );
}

#[test]
fn a_frame_that_breaks_off_keeps_the_events_before_the_break() {
    let payload = batch_with(&[CLEARED, CLEARED, CLEARED]);
    // Cut inside the third event (and before the rank).
    let cut = payload.len() - 1 - CLEARED.len() / 2;
    let batch = decode_batch(&payload[..cut]).unwrap();
    assert_eq!(
        batch.events,
        vec![KvEvent::AllBlocksCleared, KvEvent::AllBlocksCleared]
    );
    assert_eq!(
        batch.damaged.as_ref().map(WireError::reason),
        Some("truncated")
    );
    // Cut inside the first: nothing to keep, an error as before.
    assert!(decode_batch(&payload[..14]).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_batch(&bytes);
    }

    #[test]
    fn truncations_of_a_valid_batch_never_panic(cut in 0usize..200) {
        let payload = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/wire/vllm_v0_23_array_full.msgpack")).unwrap();
        let cut = cut.min(payload.len());
        let _ = decode_batch(&payload[..cut]);
        // Cut short, a frame is an error or says it was damaged.
        if cut < payload.len() {
            prop_assert!(decode_batch(&payload[..cut]).map_or(true, |b| b.damaged.is_some()));
        }
    }

    #[test]
    fn bit_flips_never_panic(pos in 0usize..300, bit in 0u8..8) {
        let mut payload = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/wire/vllm_v0_24_map_events.msgpack")).unwrap();
        let pos = pos % payload.len();
        payload[pos] ^= 1 << bit;
        let _ = decode_batch(&payload);
    }
}
