//! `.lct` trace files: a recorded fleet event stream to replay into a
//! coordinator.
//!
//! Layout (ours; LMCache's recorder is not specified in the contract, see
//! docs/coordinator.md): a sequence of frames, each a u32 big-endian byte
//! length followed by one msgpack map. The map's `kind` names the frame:
//!
//! * `header`: `{kind, version, created_at?, source?}`, first in the file;
//! * `events.batch`: `{kind, ts, batch}` where `batch` is a
//!   `CacheEventBatch` with the JSON field names;
//! * `events.lifecycle`: `{kind, ts, action, instance_id, instance?}` where
//!   `action` is `register`, `heartbeat` or `deregister` and `instance` is
//!   the `POST /instances` body of a registration.
//!
//! `ts` is the recorder's wall clock in seconds; replay keeps the gaps
//! between frames, divided by a speed factor.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

use crate::events::WireBatch;

/// Format version this build writes and reads.
pub const TRACE_VERSION: u32 = 1;
/// Largest frame accepted; a corrupt length must not allocate gigabytes.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

/// One frame.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum Frame {
    /// File header.
    #[serde(rename = "header")]
    Header {
        /// Format version.
        version: u32,
        /// When recording started.
        #[serde(default)]
        created_at: f64,
        /// Free-form origin (host, fleet name).
        #[serde(default)]
        source: String,
    },
    /// One event batch as an MP server sent it.
    #[serde(rename = "events.batch")]
    Batch {
        /// Recorder time.
        ts: f64,
        /// The batch.
        batch: WireBatch,
    },
    /// A membership change.
    #[serde(rename = "events.lifecycle")]
    Lifecycle {
        /// Recorder time.
        ts: f64,
        /// What happened.
        action: LifecycleAction,
        /// Instance concerned.
        instance_id: String,
        /// Registration body (`register` only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instance: Option<serde_json::Value>,
    },
}

impl Frame {
    /// Recorder time of the frame (`None` for the header).
    pub fn ts(&self) -> Option<f64> {
        match self {
            Frame::Header { .. } => None,
            Frame::Batch { ts, .. } | Frame::Lifecycle { ts, .. } => Some(*ts),
        }
    }
}

/// Membership actions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LifecycleAction {
    /// `POST /instances`.
    Register,
    /// `PUT /instances/{id}/heartbeat`.
    Heartbeat,
    /// `DELETE /instances/{id}`.
    Deregister,
}

/// Why a trace could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// I/O failed.
    #[error("trace I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The file ends inside a frame.
    #[error("trace truncated inside frame {0}")]
    Truncated(u64),
    /// A frame length beyond [`MAX_FRAME_BYTES`].
    #[error("frame {index} claims {len} bytes (limit {MAX_FRAME_BYTES})")]
    TooLarge {
        /// Frame number.
        index: u64,
        /// Claimed length.
        len: usize,
    },
    /// A frame that does not decode.
    #[error("frame {index} does not decode: {source}")]
    Decode {
        /// Frame number.
        index: u64,
        /// Cause.
        #[source]
        source: rmp_serde::decode::Error,
    },
    /// The first frame is not a header of a known version.
    #[error("not a trace of version {TRACE_VERSION}: {0}")]
    Header(String),
    /// A frame could not be encoded.
    #[error("frame does not encode: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
}

/// Reads frames one by one, checking the header first.
#[derive(Debug)]
pub struct TraceReader<R> {
    inner: R,
    index: u64,
    header_checked: bool,
    done: bool,
}

impl<R: Read> TraceReader<R> {
    /// Wraps a byte source.
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            index: 0,
            header_checked: false,
            done: false,
        }
    }

    fn read_frame(&mut self) -> Result<Option<Frame>, TraceError> {
        let mut len = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            let n = self.inner.read(&mut len[got..])?;
            if n == 0 {
                return if got == 0 {
                    Ok(None)
                } else {
                    Err(TraceError::Truncated(self.index))
                };
            }
            got += n;
        }
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(TraceError::TooLarge {
                index: self.index,
                len,
            });
        }
        let mut buf = vec![0u8; len];
        self.inner.read_exact(&mut buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                TraceError::Truncated(self.index)
            } else {
                TraceError::Io(e)
            }
        })?;
        let frame = rmp_serde::from_slice(&buf).map_err(|source| TraceError::Decode {
            index: self.index,
            source,
        })?;
        self.index += 1;
        Ok(Some(frame))
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Frame, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let result = self.read_frame();
        let result = match result {
            Ok(Some(frame)) if !self.header_checked => {
                self.header_checked = true;
                match &frame {
                    Frame::Header { version, .. } if *version == TRACE_VERSION => Ok(Some(frame)),
                    Frame::Header { version, .. } => {
                        Err(TraceError::Header(format!("version {version}")))
                    }
                    _ => Err(TraceError::Header("first frame is not a header".into())),
                }
            }
            Ok(None) if !self.header_checked => Err(TraceError::Header("empty file".into())),
            other => other,
        };
        match result {
            Ok(Some(frame)) => Some(Ok(frame)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                // A broken stream cannot be resynchronised: stop after the error.
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Appends one frame to `out`.
pub fn write_frame(out: &mut impl Write, frame: &Frame) -> Result<(), TraceError> {
    let body = rmp_serde::to_vec_named(frame)?;
    let len = u32::try_from(body.len()).map_err(|_| TraceError::TooLarge {
        index: 0,
        len: body.len(),
    })?;
    out.write_all(&len.to_be_bytes())?;
    out.write_all(&body)?;
    Ok(())
}

/// How long after the replay started a frame recorded `offset` seconds
/// after the first one is due, at `speed` (0 or less = no pacing).
pub fn due_after(offset: f64, speed: f64) -> std::time::Duration {
    if speed <= 0.0 || offset <= 0.0 || !offset.is_finite() {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::try_from_secs_f64(offset / speed).unwrap_or(std::time::Duration::ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventType;

    fn sample_batch(seq: i64) -> WireBatch {
        serde_json::from_value(serde_json::json!({
            "instance_id": "mp-a", "incarnation": 7, "seq": seq, "event_type": "store", "tier": "l2",
            "backend": "fs", "entries": [{"key": {"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": 1},
                                          "size_bytes": 3, "token_ids": [1, 2]}]}))
        .unwrap()
    }

    fn file(frames: &[Frame]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            write_frame(&mut out, f).unwrap();
        }
        out
    }

    fn header() -> Frame {
        Frame::Header {
            version: TRACE_VERSION,
            created_at: 1.0,
            source: "test".into(),
        }
    }

    #[test]
    fn frames_round_trip() {
        let frames = vec![
            header(),
            Frame::Lifecycle {
                ts: 10.0,
                action: LifecycleAction::Register,
                instance_id: "mp-a".into(),
                instance: Some(
                    serde_json::json!({"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 1}),
                ),
            },
            Frame::Batch {
                ts: 10.5,
                batch: sample_batch(1),
            },
        ];
        let raw = file(&frames);
        let back: Vec<Frame> = TraceReader::new(raw.as_slice())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(back[0], frames[0]);
        assert_eq!(back[1], frames[1]);
        let Frame::Batch { batch, ts } = &back[2] else {
            panic!("not a batch: {:?}", back[2])
        };
        assert_eq!(*ts, 10.5);
        let valid = batch.validate(0).unwrap();
        assert_eq!(valid.event_type, EventType::Store);
        assert_eq!(valid.entries[0].token_ids, vec![1, 2]);
    }

    #[test]
    fn bad_files_are_errors() {
        let no_header = file(&[Frame::Batch {
            ts: 0.0,
            batch: sample_batch(1),
        }]);
        assert!(matches!(
            TraceReader::new(no_header.as_slice()).next(),
            Some(Err(TraceError::Header(_)))
        ));
        assert!(matches!(
            TraceReader::new(&b""[..]).next(),
            Some(Err(TraceError::Header(_)))
        ));
        let mut truncated = file(&[
            header(),
            Frame::Batch {
                ts: 0.0,
                batch: sample_batch(1),
            },
        ]);
        truncated.truncate(truncated.len() - 3);
        let results: Vec<_> = TraceReader::new(truncated.as_slice()).collect();
        assert!(
            matches!(results.last(), Some(Err(TraceError::Truncated(1)))),
            "{results:?}"
        );
        let mut huge = file(&[header()]);
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        let results: Vec<_> = TraceReader::new(huge.as_slice()).collect();
        assert!(matches!(
            results.last(),
            Some(Err(TraceError::TooLarge { .. }))
        ));
        let mut garbage = file(&[header()]);
        garbage.extend_from_slice(&[0, 0, 0, 2, 0xc1, 0xc1]);
        let results: Vec<_> = TraceReader::new(garbage.as_slice()).collect();
        assert_eq!(results.len(), 2, "stops after the error");
        assert!(matches!(
            results[1],
            Err(TraceError::Decode { index: 1, .. })
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
}
