//! Events laid out in batches a server takes: at most [`super::CHUNK`]
//! events and [`MAX_BATCH_FINGERPRINTS`] fingerprints each. One change can
//! hold far more (a cleared HBM is one removal of every block it held), and
//! a batch past the index server's message limit (4 MiB) or Kafka's ended
//! the stream and cost a whole resync.

use ic_proto::index_v1 as pb;

/// Most fingerprints in one batch (8 bytes each: half a MiB).
pub const MAX_BATCH_FINGERPRINTS: usize = 1 << 16;

/// The fingerprints an event carries.
fn fingerprints(event: &pb::IndexEvent) -> usize {
    use pb::index_event::Kind;
    match &event.kind {
        Some(Kind::Stored(s)) => s.fingerprints.len(),
        Some(Kind::Evicted(e)) => e.fingerprints.len(),
        Some(Kind::Cleared(_)) | None => 0,
    }
}

/// `event` as events of at most `max` fingerprints each: a removal's
/// blocks in pieces, a stored chain in consecutive links (each piece's
/// parent the last block of the piece before it, its depth where the piece
/// starts), so the index applies the pieces as it would the whole.
fn pieces(event: pb::IndexEvent, max: usize) -> Vec<pb::IndexEvent> {
    use pb::index_event::Kind;
    let max = max.max(1);
    match event.kind {
        Some(Kind::Stored(s)) if s.fingerprints.len() > max => {
            let mut parent = s.parent_fingerprint;
            let mut depth = s.start_depth;
            s.fingerprints
                .chunks(max)
                .map(|piece| {
                    let stored = pb::BlocksStored {
                        parent_fingerprint: parent,
                        start_depth: depth,
                        fingerprints: piece.to_vec(),
                        ..s.clone()
                    };
                    parent = piece.last().copied().unwrap_or(parent);
                    depth = depth.saturating_add(u32::try_from(piece.len()).unwrap_or(u32::MAX));
                    pb::IndexEvent {
                        kind: Some(Kind::Stored(stored)),
                    }
                })
                .collect()
        }
        Some(Kind::Evicted(e)) if e.fingerprints.len() > max => e
            .fingerprints
            .chunks(max)
            .map(|piece| pb::IndexEvent {
                kind: Some(Kind::Evicted(pb::BlocksEvicted {
                    fingerprints: piece.to_vec(),
                    at_unix_ms: e.at_unix_ms,
                })),
            })
            .collect(),
        kind => vec![pb::IndexEvent { kind }],
    }
}

/// `events` in order, as batches of at most `max_events` events and
/// `max_fingerprints` fingerprints (at least one batch, maybe empty).
pub fn batched(
    events: Vec<pb::IndexEvent>,
    max_events: usize,
    max_fingerprints: usize,
) -> Vec<Vec<pb::IndexEvent>> {
    let mut out = vec![Vec::new()];
    let mut held = 0;
    for event in events.into_iter().flat_map(|e| pieces(e, max_fingerprints)) {
        let n = fingerprints(&event);
        let last = out.last().map_or(0, Vec::len);
        if last > 0 && (last >= max_events || held + n > max_fingerprints) {
            out.push(Vec::new());
            held = 0;
        }
        held += n;
        if let Some(batch) = out.last_mut() {
            batch.push(event);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::index_event::Kind;

    fn stored(parent: u64, depth: u32, fps: std::ops::Range<u64>) -> pb::IndexEvent {
        pb::IndexEvent {
            kind: Some(Kind::Stored(pb::BlocksStored {
                parent_fingerprint: parent,
                start_depth: depth,
                fingerprints: fps.collect(),
                block_size: 16,
                tier: pb::Tier::T1 as i32,
                at_unix_ms: 7,
            })),
        }
    }

    fn evicted(fps: std::ops::Range<u64>) -> pb::IndexEvent {
        pb::IndexEvent {
            kind: Some(Kind::Evicted(pb::BlocksEvicted {
                fingerprints: fps.collect(),
                at_unix_ms: 7,
            })),
        }
    }

    #[test]
    fn a_long_chain_is_stored_in_linked_pieces() {
        let batches = batched(vec![stored(99, 3, 1..11)], 100, 4);
        let pieces: Vec<(u64, u32, Vec<u64>)> = batches
            .iter()
            .flatten()
            .map(|e| match &e.kind {
                Some(Kind::Stored(s)) => {
                    (s.parent_fingerprint, s.start_depth, s.fingerprints.clone())
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            pieces,
            [
                (99, 3, vec![1, 2, 3, 4]),
                (4, 7, vec![5, 6, 7, 8]),
                (8, 11, vec![9, 10]),
            ]
        );
        assert_eq!(batches.len(), 3, "one piece a batch at 4 fingerprints");
    }

    #[test]
    fn batches_hold_at_most_their_events_and_fingerprints_in_order() {
        let events = vec![
            evicted(0..3),
            pb::IndexEvent {
                kind: Some(Kind::Cleared(pb::ReplicaCleared::default())),
            },
            evicted(3..8),
            stored(0, 0, 8..9),
            stored(8, 1, 9..10),
        ];
        let batches = batched(events, 2, 4);
        let sizes: Vec<(usize, usize)> = batches
            .iter()
            .map(|b| (b.len(), b.iter().map(fingerprints).sum()))
            .collect();
        assert_eq!(sizes, [(2, 3), (1, 4), (2, 2), (1, 1)]);
        let all: Vec<u64> = batches
            .iter()
            .flatten()
            .flat_map(|e| match &e.kind {
                Some(Kind::Stored(s)) => s.fingerprints.clone(),
                Some(Kind::Evicted(e)) => e.fingerprints.clone(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert_eq!(batched(Vec::new(), 2, 4), [Vec::<pb::IndexEvent>::new()]);
    }
}
