//! Kafka transport conventions, as pure functions: how a record decodes into
//! a batch and where a partition resumes after a restart. The consumer
//! itself (network I/O) is not built yet; the service refuses
//! `--event-transport kafka` at boot.

use crate::events::{EventsRequest, WireBatch};

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
}
