//! The ingest stream protocol, shared by every front end that feeds the
//! index (the IngestEvents gRPC stream today; a Kafka consumer next).
//!
//! A stream carries batches for one or more replica ranks. The first batch
//! for a rank on a stream must open a resync (a subscriber always resyncs
//! after connecting); after it, every batch must carry exactly the next
//! sequence number, from the same subscriber incarnation. Anything else
//! means this side's view may have a hole, so the session asks for a
//! resync rather than guess.

use std::collections::HashMap;

use crate::types::{Change, ReplicaKey, Scope};

/// One decoded, validated batch.
#[derive(Clone, Debug, PartialEq)]
pub struct IngestBatch {
    /// Which replica rank.
    pub key: ReplicaKey,
    /// Its scope.
    pub scope: Scope,
    /// Its serving address.
    pub address: String,
    /// The subscriber process that sent it.
    pub incarnation: u64,
    /// Position in the rank's stream.
    pub seq: u64,
    /// This batch starts a full-state resync.
    pub resync_begin: bool,
    /// This batch ends the resync.
    pub resync_end: bool,
    /// The changes.
    pub changes: Vec<Change>,
    /// Cumulative tier-2 counters `(hits, queries)`, when reported.
    pub tier2: Option<(u64, u64)>,
}

/// What the front end should do with a batch.
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
    /// A resync is needed; end the stream with this detail.
    ResyncRequired(String),
}

#[derive(Debug)]
struct RankStream {
    incarnation: u64,
    last_seq: u64,
    resync: Option<Vec<Change>>,
}

/// The protocol state of one stream.
#[derive(Debug, Default)]
pub struct IngestSession {
    ranks: HashMap<ReplicaKey, RankStream>,
}

impl IngestSession {
    /// Classifies one batch.
    pub fn accept(&mut self, batch: IngestBatch) -> Step {
        let IngestBatch {
            key,
            scope,
            address,
            incarnation,
            seq,
            resync_begin,
            resync_end,
            changes,
            tier2,
        } = batch;
        if resync_begin {
            self.ranks.insert(
                key.clone(),
                RankStream {
                    incarnation,
                    last_seq: seq,
                    resync: Some(Vec::new()),
                },
            );
        }
        let Some(rank) = self.ranks.get_mut(&key) else {
            return Step::ResyncRequired(format!(
                "replica {}/{} rank {}: stream did not start with a resync",
                key.tenant, key.replica_id, key.dp_rank
            ));
        };
        if rank.incarnation != incarnation {
            return Step::ResyncRequired(format!(
                "replica {}/{}: new subscriber incarnation without a resync",
                key.tenant, key.replica_id
            ));
        }
        if !resync_begin {
            let expected = rank.last_seq.wrapping_add(1);
            if seq != expected {
                return Step::ResyncRequired(format!(
                    "replica {}/{} rank {}: expected seq {expected}, got {seq}",
                    key.tenant, key.replica_id, key.dp_rank
                ));
            }
            rank.last_seq = seq;
        }
        match rank.resync.as_mut() {
            Some(buffer) => {
                buffer.extend(changes);
                if !resync_end {
                    return Step::Buffered;
                }
                let changes = rank.resync.take().unwrap_or_default();
                Step::Replace {
                    key,
                    scope,
                    address,
                    changes,
                    tier2,
                }
            }
            None if resync_end => Step::ResyncRequired("resync_end without resync_begin".into()),
            None => Step::Apply {
                key,
                scope,
                address,
                changes,
                tier2,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{HashScheme, Tier};

    fn batch(seq: u64, begin: bool, end: bool, incarnation: u64) -> IngestBatch {
        IngestBatch {
            key: ReplicaKey {
                tenant: "t".into(),
                replica_id: "pod".into(),
                dp_rank: 0,
            },
            scope: Scope {
                tenant: "t".into(),
                model: "m".into(),
                hash_scheme: HashScheme::Vllm,
                adapter: String::new(),
            },
            address: "1.2.3.4:8000".into(),
            incarnation,
            seq,
            resync_begin: begin,
            resync_end: end,
            changes: vec![Change::Stored {
                start_depth: 0,
                fingerprints: vec![seq],
                block_size: 16,
                tier: Tier::T1,
            }],
            tier2: None,
        }
    }

    #[test]
    fn resync_then_deltas_in_sequence_then_a_gap() {
        let mut s = IngestSession::default();
        assert!(matches!(
            s.accept(batch(1, false, false, 7)),
            Step::ResyncRequired(_)
        ));
        assert_eq!(s.accept(batch(10, true, false, 7)), Step::Buffered);
        assert!(
            matches!(s.accept(batch(11, false, true, 7)), Step::Replace { changes, .. } if changes.len() == 2)
        );
        assert!(matches!(
            s.accept(batch(12, false, false, 7)),
            Step::Apply { .. }
        ));
        assert!(
            matches!(s.accept(batch(14, false, false, 7)), Step::ResyncRequired(d) if d.contains("expected seq 13"))
        );
        assert!(matches!(
            s.accept(batch(13, false, false, 8)),
            Step::ResyncRequired(d) if d.contains("incarnation")
        ));
    }
}
