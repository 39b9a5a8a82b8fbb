//! `IngestEvents`: decoding one subscriber stream's batches into the
//! index's ingest protocol ([`ic_index::ingest`], which decides resyncs and
//! sequence gaps). Only validation and conversion live here; every field
//! that fails is named.

pub use ic_index::ingest::Step;
use ic_index::ingest::{IngestBatch, IngestLimits, IngestSession};
use ic_index::load::EngineLoad;
use ic_index::{Change, Fingerprint, ReplicaKey};
use ic_proto::index_v1 as pb;

use crate::index_core::EngineFacts;

use crate::convert::checked_scope;

/// A batch that is not valid at all (the field is named).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct InvalidBatch(pub String);

/// Per-stream ingest state.
#[derive(Debug, Default)]
pub struct IngestStream {
    session: IngestSession,
    /// Set only for the functional probe's in-process stream.
    allow_probe_tenant: bool,
}

impl IngestStream {
    /// A stream bounded by `limits`.
    pub fn with_limits(limits: IngestLimits) -> Self {
        Self {
            session: IngestSession::with_limits(limits),
            allow_probe_tenant: false,
        }
    }

    /// The functional probe's stream: the same rules, plus its own tenant.
    pub(crate) fn for_probe() -> Self {
        Self {
            session: IngestSession::default(),
            allow_probe_tenant: true,
        }
    }

    /// The protocol state (the Kafka consumer snapshots and restores it,
    /// and forgets a rank that must resync).
    pub fn session_mut(&mut self) -> &mut IngestSession {
        &mut self.session
    }

    /// Validates, decodes and classifies one batch.
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
        Ok(self.session.accept(IngestBatch {
            key,
            scope,
            address: replica.address,
            incarnation: replica.incarnation,
            seq: batch.seq,
            resync_begin: batch.resync_begin,
            resync_end: batch.resync_end,
            changes,
            tier2,
        }))
    }
}

/// The replica rank a batch is about (`None` when it names none; the
/// ingest path refuses such a batch anyway).
pub fn rank_of(batch: &pb::IngestBatch) -> Option<ReplicaKey> {
    let replica = batch.replica.as_ref()?;
    Some(ReplicaKey {
        tenant: replica.scope.as_ref()?.tenant.clone(),
        replica_id: replica.replica_id.clone(),
        dp_rank: replica.dp_rank,
    })
}

/// What `batch` says about its engine beside the blocks (the engine's
/// queue, KV-cache usage and size), its usage clamped to 0..=1; `None` when
/// the batch names no replica scope (such a batch is refused anyway).
pub fn engine_facts(batch: &pb::IngestBatch) -> Option<EngineFacts> {
    Some(EngineFacts {
        key: rank_of(batch)?,
        load: batch.engine_load.map(|l| EngineLoad {
            waiting: l.waiting,
            running: l.running,
            kv_usage: if l.kv_usage.is_finite() {
                l.kv_usage.clamp(0.0, 1.0)
            } else {
                0.0
            },
        }),
        cache: batch.engine_cache,
        history_incomplete: batch.history_incomplete,
    })
}

fn change_from_pb(event: pb::IndexEvent, i: usize) -> Result<Change, InvalidBatch> {
    use pb::index_event::Kind;
    match event.kind {
        Some(Kind::Stored(s)) => Ok(Change::Stored {
            start_depth: s.start_depth,
            fingerprints: Fingerprint::from_raw(s.fingerprints),
            block_size: s.block_size,
            tier: ic_proto::tier::from_pb(s.tier).ok_or_else(|| {
                InvalidBatch(format!("events[{i}].stored.tier: must be T1 or T2"))
            })?,
        }),
        Some(Kind::Evicted(e)) => Ok(Change::Evicted {
            fingerprints: Fingerprint::from_raw(e.fingerprints),
        }),
        // An unknown tier clears nothing rather than the replica's HBM.
        Some(Kind::Cleared(c)) => Ok(Change::Cleared {
            tier: ic_proto::tier::from_pb(c.tier).ok_or_else(|| {
                InvalidBatch(format!("events[{i}].cleared.tier: must be T1 or T2"))
            })?,
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
            engine_load: None,
            engine_cache: None,
            history_incomplete: false,
            sent_at_unix_ms: 0,
            trace_context: std::collections::HashMap::new(),
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
        // A clear of no known tier is refused, not taken as the HBM's.
        for tier in [pb::Tier::Unspecified as i32, 99] {
            let mut b = batch(1, true, true, 7);
            b.events.push(pb::IndexEvent {
                kind: Some(pb::index_event::Kind::Cleared(pb::ReplicaCleared {
                    tier,
                    at_unix_ms: 0,
                })),
            });
            assert_eq!(
                s.accept(b).unwrap_err().0,
                "events[1].cleared.tier: must be T1 or T2"
            );
        }
    }
}
