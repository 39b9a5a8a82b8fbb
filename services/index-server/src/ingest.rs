//! `IngestEvents`: applying one subscriber stream to the index.
//!
//! Each stream carries batches for one or more replica ranks. The first
//! batch for a rank on a stream must open a resync (the subscriber always
//! resyncs after connecting); after it, every batch must carry exactly the
//! next sequence number. Anything else means the server's view may have a
//! hole, so it ends the stream asking for a resync rather than guess.

use std::collections::HashMap;

use ic_index::{Change, ReplicaKey, Scope, Tier};
use ic_proto::index_v1 as pb;

use crate::convert::{checked_scope, tier_from_pb};

/// What the stream handler should do with a batch.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Apply these changes now.
    Apply {
        /// Replica.
        key: ReplicaKey,
        /// Its scope.
        scope: Scope,
        /// Its serving address.
        address: String,
        /// The changes.
        changes: Vec<Change>,
        /// Tier-2 counters, when reported.
        tier2: Option<(u64, u64)>,
    },
    /// A resync completed: replace the replica's state with these changes.
    Replace {
        /// Replica.
        key: ReplicaKey,
        /// Its scope.
        scope: Scope,
        /// Its serving address.
        address: String,
        /// The whole state.
        changes: Vec<Change>,
        /// Tier-2 counters, when reported.
        tier2: Option<(u64, u64)>,
    },
    /// Part of a resync was buffered; nothing to apply yet.
    Buffered,
    /// The server needs a resync; end the stream with this detail.
    ResyncRequired(String),
}

/// A batch that is not valid at all (the field is named).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct InvalidBatch(pub String);

#[derive(Debug)]
struct RankStream {
    incarnation: u64,
    last_seq: u64,
    resync: Option<Vec<Change>>,
}

/// Per-stream ingest state.
#[derive(Debug, Default)]
pub struct IngestStream {
    ranks: HashMap<ReplicaKey, RankStream>,
    /// Set only for the functional probe's in-process stream.
    allow_probe_tenant: bool,
}

impl IngestStream {
    /// The functional probe's stream: the same rules, plus its own tenant.
    pub(crate) fn for_probe() -> Self {
        Self {
            ranks: HashMap::new(),
            allow_probe_tenant: true,
        }
    }

    /// Classifies one batch.
    pub fn accept(&mut self, batch: pb::IngestBatch) -> Result<Step, InvalidBatch> {
        let replica = batch
            .replica
            .ok_or_else(|| InvalidBatch("replica: required".into()))?;
        let scope = checked_scope(
            replica.scope.as_ref(),
            "replica.scope",
            self.allow_probe_tenant,
        )
        .map_err(InvalidBatch)?;
        if replica.replica_id.is_empty() {
            return Err(InvalidBatch("replica.replica_id: required".into()));
        }
        let key = ReplicaKey {
            tenant: scope.tenant.clone(),
            replica_id: replica.replica_id,
            dp_rank: replica.dp_rank,
        };
        let changes = batch
            .events
            .into_iter()
            .enumerate()
            .map(|(i, e)| change_from_pb(e, i))
            .collect::<Result<Vec<_>, _>>()?;
        let tier2 = batch
            .tier2_stats
            .filter(|t| t.has_counters)
            .map(|t| (t.hits, t.queries));

        if batch.resync_begin {
            self.ranks.insert(
                key.clone(),
                RankStream {
                    incarnation: replica.incarnation,
                    last_seq: batch.seq,
                    resync: Some(Vec::new()),
                },
            );
        }
        let Some(rank) = self.ranks.get_mut(&key) else {
            return Ok(Step::ResyncRequired(format!(
                "replica {}/{} rank {}: stream did not start with a resync",
                key.tenant, key.replica_id, key.dp_rank
            )));
        };
        if rank.incarnation != replica.incarnation {
            return Ok(Step::ResyncRequired(format!(
                "replica {}/{}: new subscriber incarnation without a resync",
                key.tenant, key.replica_id
            )));
        }
        if !batch.resync_begin {
            if batch.seq != rank.last_seq.wrapping_add(1) {
                return Ok(Step::ResyncRequired(format!(
                    "replica {}/{} rank {}: expected seq {}, got {}",
                    key.tenant,
                    key.replica_id,
                    key.dp_rank,
                    rank.last_seq.wrapping_add(1),
                    batch.seq
                )));
            }
            rank.last_seq = batch.seq;
        }
        match rank.resync.as_mut() {
            Some(buffer) => {
                buffer.extend(changes);
                if batch.resync_end {
                    let changes = rank.resync.take().unwrap_or_default();
                    Ok(Step::Replace {
                        key,
                        scope,
                        address: replica.address,
                        changes,
                        tier2,
                    })
                } else {
                    Ok(Step::Buffered)
                }
            }
            None if batch.resync_end => Ok(Step::ResyncRequired(
                "resync_end without resync_begin".into(),
            )),
            None => Ok(Step::Apply {
                key,
                scope,
                address: replica.address,
                changes,
                tier2,
            }),
        }
    }
}

fn change_from_pb(event: pb::IndexEvent, i: usize) -> Result<Change, InvalidBatch> {
    use pb::index_event::Kind;
    match event.kind {
        Some(Kind::Stored(s)) => Ok(Change::Stored {
            start_depth: s.start_depth,
            fingerprints: s.fingerprints,
            block_size: s.block_size,
            tier: tier_from_pb(s.tier).ok_or_else(|| {
                InvalidBatch(format!("events[{i}].stored.tier: must be T1 or T2"))
            })?,
        }),
        Some(Kind::Evicted(e)) => Ok(Change::Evicted {
            fingerprints: e.fingerprints,
        }),
        Some(Kind::Cleared(c)) => Ok(Change::Cleared {
            tier: tier_from_pb(c.tier).unwrap_or(Tier::T1),
        }),
        None => Err(InvalidBatch(format!("events[{i}]: empty event"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(seq: u64, begin: bool, end: bool, incarnation: u64) -> pb::IngestBatch {
        pb::IngestBatch {
            replica: Some(pb::ReplicaIdentity {
                scope: Some(pb::IndexScope {
                    tenant: "t".into(),
                    model: "m".into(),
                    hash_scheme: pb::HashScheme::Vllm as i32,
                    adapter: String::new(),
                }),
                replica_id: "pod".into(),
                address: "1.2.3.4:8000".into(),
                dp_rank: 0,
                incarnation,
            }),
            seq,
            resync_begin: begin,
            resync_end: end,
            events: vec![pb::IndexEvent {
                kind: Some(pb::index_event::Kind::Stored(pb::BlocksStored {
                    parent_fingerprint: 0,
                    start_depth: 0,
                    fingerprints: vec![seq],
                    block_size: 16,
                    tier: pb::Tier::T1 as i32,
                    at_unix_ms: 0,
                })),
            }],
            tier2_stats: None,
            sent_at_unix_ms: 0,
        }
    }

    #[test]
    fn a_stream_must_open_with_a_resync() {
        let mut s = IngestStream::default();
        assert!(matches!(
            s.accept(batch(1, false, false, 7)),
            Ok(Step::ResyncRequired(_))
        ));
    }

    #[test]
    fn multi_batch_resync_then_deltas_in_sequence() {
        let mut s = IngestStream::default();
        assert_eq!(s.accept(batch(10, true, false, 7)), Ok(Step::Buffered));
        match s.accept(batch(11, false, true, 7)).unwrap() {
            Step::Replace { changes, .. } => assert_eq!(changes.len(), 2),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            s.accept(batch(12, false, false, 7)),
            Ok(Step::Apply { .. })
        ));
        // A gap asks for a resync.
        assert!(
            matches!(s.accept(batch(14, false, false, 7)), Ok(Step::ResyncRequired(d)) if d.contains("expected seq 13"))
        );
    }

    #[test]
    fn a_new_incarnation_without_resync_is_refused() {
        let mut s = IngestStream::default();
        s.accept(batch(1, true, true, 7)).unwrap();
        assert!(matches!(
            s.accept(batch(2, false, false, 8)),
            Ok(Step::ResyncRequired(_))
        ));
    }

    #[test]
    fn invalid_batches_name_the_field() {
        let mut s = IngestStream::default();
        let mut b = batch(1, true, true, 7);
        b.replica.as_mut().unwrap().replica_id.clear();
        assert_eq!(s.accept(b).unwrap_err().0, "replica.replica_id: required");
        let mut b = batch(1, true, true, 7);
        b.replica
            .as_mut()
            .unwrap()
            .scope
            .as_mut()
            .unwrap()
            .model
            .clear();
        assert_eq!(s.accept(b).unwrap_err().0, "replica.scope.model: required");
        let mut b = batch(1, true, true, 7);
        b.events[0].kind = None;
        assert_eq!(s.accept(b).unwrap_err().0, "events[0]: empty event");
    }
}
