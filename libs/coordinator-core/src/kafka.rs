//! Kafka transport conventions, as pure functions and plain data: how a
//! record decodes into a batch, where a partition resumes after a restart,
//! the consumed position the checkpoint carries, how far behind the consumer
//! is, and how long to wait after a broker failure. The consumer itself
//! (network I/O) lives in the service crate.

use std::collections::BTreeMap;

use crate::checkpoint::KafkaPositionSection;
use crate::events::{Batch, EventsRequest, FieldError, WireBatch};

/// Default topic MP servers produce to.
pub const DEFAULT_TOPIC: &str = "lmcache-cache-events";
/// Default consumer group.
pub const DEFAULT_GROUP_ID: &str = "lmcache-coordinator";

/// Why a record was skipped (it still counts as consumed).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The value is not a `POST /events` body.
    #[error("record value is not an events body: {0}")]
    Json(#[from] serde_json::Error),
    /// The body does not hold exactly one batch.
    #[error("record holds {0} batches; producers send exactly one")]
    BatchCount(usize),
    /// The record key is not the batch's instance id.
    #[error("record key {key:?} does not match instance_id {instance_id:?}")]
    KeyMismatch {
        /// Key as sent (lossy UTF-8).
        key: String,
        /// Batch's instance.
        instance_id: String,
    },
    /// The batch decodes but breaks a `POST /events` rule (an HTTP client
    /// would get a 422 for it).
    #[error("record batch is invalid: {0}")]
    Invalid(#[from] FieldError),
}

impl RecordError {
    /// Fixed label for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Json(_) => "json",
            Self::BatchCount(_) => "batch_count",
            Self::KeyMismatch { .. } => "key_mismatch",
            Self::Invalid(_) => "invalid",
        }
    }
}

/// Decodes one record: value = `{"batches": [<one batch>]}`, key = the
/// instance id as UTF-8 (absent keys are tolerated).
pub fn decode_record(key: Option<&[u8]>, value: &[u8]) -> Result<WireBatch, RecordError> {
    let body: EventsRequest = serde_json::from_slice(value)?;
    let count = body.batches.len();
    let Some(batch) = body.batches.into_iter().next().filter(|_| count == 1) else {
        return Err(RecordError::BatchCount(count));
    };
    if let Some(key) = key
        && key != batch.instance_id.as_bytes()
    {
        return Err(RecordError::KeyMismatch {
            key: String::from_utf8_lossy(key).into_owned(),
            instance_id: batch.instance_id,
        });
    }
    Ok(batch)
}

/// Decodes and validates one record with the same rules `POST /events`
/// applies, so both transports admit exactly the same batches.
pub fn decode_and_validate(key: Option<&[u8]>, value: &[u8]) -> Result<Batch, RecordError> {
    Ok(decode_record(key, value)?.validate(0)?)
}

/// Where a partition starts reading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    /// The partition is unknown to the checkpoint.
    Earliest,
    /// One past the last offset the checkpoint's views include.
    Offset(i64),
}

/// Resume position of `(topic, partition)` given the checkpoint's
/// `[topic, partition, last_offset]` rows.
pub fn resume_at(offsets: &[(String, i32, i64)], topic: &str, partition: i32) -> StartAt {
    offsets
        .iter()
        .find(|(t, p, _)| t == topic && *p == partition)
        .map_or(StartAt::Earliest, |(_, _, last)| StartAt::Offset(last + 1))
}

/// Last offset consumed per `(topic, partition)`: the only read cursor.
///
/// It lives next to the views and changes under the same lock as they do,
/// so a checkpoint captures a position and the views built from exactly the
/// records up to it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Position {
    last: BTreeMap<(String, i32), i64>,
}

impl Position {
    /// Restores from the checkpoint section.
    pub fn from_section(section: &KafkaPositionSection) -> Self {
        let last = section
            .offsets
            .iter()
            .map(|(t, p, o)| ((t.clone(), *p), *o))
            .collect();
        Self { last }
    }

    /// The checkpoint section.
    pub fn to_section(&self) -> KafkaPositionSection {
        KafkaPositionSection {
            offsets: self
                .last
                .iter()
                .map(|((t, p), o)| (t.clone(), *p, *o))
                .collect(),
        }
    }

    /// Whether `offset` is past what has been consumed on the partition; an
    /// offset at or below it was already seen by the gate and must not be
    /// offered again.
    pub fn is_new(&self, topic: &str, partition: i32, offset: i64) -> bool {
        self.last_offset(topic, partition)
            .is_none_or(|l| offset > l)
    }

    /// Records that the gate has seen `offset` (or that it was skipped as
    /// malformed, which also counts as consumed). Never moves backwards.
    pub fn advance(&mut self, topic: &str, partition: i32, offset: i64) {
        let slot = self
            .last
            .entry((topic.to_owned(), partition))
            .or_insert(offset);
        *slot = (*slot).max(offset);
    }

    /// Last consumed offset of a partition.
    pub fn last_offset(&self, topic: &str, partition: i32) -> Option<i64> {
        self.last.get(&(topic.to_owned(), partition)).copied()
    }

    /// Where a partition resumes (see [`resume_at`]).
    pub fn resume_at(&self, topic: &str, partition: i32) -> StartAt {
        self.last_offset(topic, partition)
            .map_or(StartAt::Earliest, |l| StartAt::Offset(l + 1))
    }

    /// `(partition, last_offset)` rows of one topic.
    pub fn partitions<'a>(&'a self, topic: &'a str) -> impl Iterator<Item = (i32, i64)> + 'a {
        self.last
            .iter()
            .filter(move |((t, _), _)| t == topic)
            .map(|((_, p), o)| (*p, *o))
    }
}

/// Records still to read on a partition whose log spans `[low, high)`,
/// given the last consumed offset (`None` = nothing consumed yet, so reading
/// starts at `low`).
pub fn lag(last_offset: Option<i64>, low: i64, high: i64) -> u64 {
    let next = last_offset.map_or(low, |l| (l + 1).max(low));
    u64::try_from(high - next).unwrap_or(0)
}

/// Readiness rule of `--max-ready-lag`: every partition's lag is known and
/// within `max_lag`. No partitions known means the broker has not answered
/// yet, which is not caught up.
pub fn caught_up(max_lag: u64, lags: &[u64]) -> bool {
    !lags.is_empty() && lags.iter().all(|l| *l <= max_lag)
}

/// Backoff between attempts to reach the broker: the workspace's one.
pub use ic_clock::Backoff;

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: &str = r#"{"batches":[{"instance_id":"mp-a","incarnation":1,"seq":1,"event_type":"store","tier":"l2","backend":"fs"}]}"#;

    #[test]
    fn decodes_one_batch_records() {
        let b = decode_record(Some(b"mp-a"), ONE.as_bytes()).unwrap();
        assert_eq!(b.instance_id, "mp-a");
        assert!(decode_record(None, ONE.as_bytes()).is_ok());
        assert!(matches!(
            decode_record(Some(b"mp-b"), ONE.as_bytes()),
            Err(RecordError::KeyMismatch { .. })
        ));
        assert!(matches!(
            decode_record(None, b"{\"batches\":[]}"),
            Err(RecordError::BatchCount(0))
        ));
        assert!(matches!(
            decode_record(None, b"\xff"),
            Err(RecordError::Json(_))
        ));
    }

    #[test]
    fn resumes_one_past_the_checkpoint() {
        let rows = vec![("t".to_owned(), 0, 41), ("t".to_owned(), 2, 7)];
        assert_eq!(resume_at(&rows, "t", 0), StartAt::Offset(42));
        assert_eq!(resume_at(&rows, "t", 1), StartAt::Earliest);
        assert_eq!(resume_at(&rows, "other", 0), StartAt::Earliest);
    }

    #[test]
    fn invalid_batches_are_record_errors() {
        let bad = r#"{"batches":[{"instance_id":"mp-a","incarnation":1,"seq":0,"event_type":"store","tier":"l2","backend":"fs"}]}"#;
        let err = decode_and_validate(Some(b"mp-a"), bad.as_bytes()).unwrap_err();
        assert_eq!(err.kind(), "invalid");
        let ok = decode_and_validate(Some(b"mp-a"), ONE.as_bytes()).unwrap();
        assert_eq!(ok.seq, 1);
    }

    #[test]
    fn position_only_moves_forward_and_round_trips() {
        let mut p = Position::default();
        assert!(p.is_new("t", 0, 0));
        assert_eq!(p.resume_at("t", 0), StartAt::Earliest);
        p.advance("t", 0, 5);
        p.advance("t", 0, 3);
        assert_eq!(p.last_offset("t", 0), Some(5));
        assert!(!p.is_new("t", 0, 5));
        assert!(p.is_new("t", 0, 6));
        assert_eq!(p.resume_at("t", 0), StartAt::Offset(6));
        p.advance("t", 1, 0);
        p.advance("u", 0, 9);
        let back = Position::from_section(&p.to_section());
        assert_eq!(back, p);
        assert_eq!(p.partitions("t").collect::<Vec<_>>(), vec![(0, 5), (1, 0)]);
    }

    #[test]
    fn lag_counts_records_left() {
        assert_eq!(lag(None, 0, 10), 10);
        assert_eq!(lag(None, 4, 10), 6);
        assert_eq!(lag(Some(9), 0, 10), 0);
        assert_eq!(lag(Some(4), 0, 10), 5);
        // Retention removed what we last read: count from the log start.
        assert_eq!(lag(Some(1), 5, 10), 5);
        // A watermark older than our position never goes negative.
        assert_eq!(lag(Some(20), 0, 10), 0);
    }

    #[test]
    fn caught_up_needs_every_partition_known_and_close() {
        assert!(!caught_up(5, &[]));
        assert!(caught_up(5, &[0, 5]));
        assert!(!caught_up(5, &[0, 6]));
    }
}
