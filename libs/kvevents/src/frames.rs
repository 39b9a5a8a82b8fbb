//! ZMQ message framing of the KV-event stream and its replay replies.

/// Replay end marker sequence (eight 0xFF bytes).
pub const REPLAY_END_SEQ: [u8; 8] = [0xff; 8];

/// Why a multipart message is not a KV-event message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Live messages have exactly three frames.
    #[error("expected 3 frames (topic, seq, payload), got {0}")]
    WrongFrameCount(usize),
    /// The sequence frame must be 8 bytes.
    #[error("sequence frame is {0} bytes, expected 8")]
    BadSeqFrame(usize),
    /// Replay replies are 3 or 4 frames, starting with an empty delimiter.
    #[error("malformed replay reply ({0} frames)")]
    BadReplayReply(usize),
}

impl FrameError {
    /// A fixed name for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::WrongFrameCount(_) => "wrong_frame_count",
            Self::BadSeqFrame(_) => "bad_seq_frame",
            Self::BadReplayReply(_) => "bad_replay_reply",
        }
    }
}

/// One live message: `topic | seq (u64 big-endian) | payload`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventMessage<'a> {
    /// Topic frame.
    pub topic: &'a [u8],
    /// Batch sequence number.
    pub seq: u64,
    /// msgpack payload.
    pub payload: &'a [u8],
}

fn seq_of(frame: &[u8]) -> Result<u64, FrameError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| FrameError::BadSeqFrame(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Splits a live multipart message.
pub fn parse_event_message<'a, F: AsRef<[u8]>>(
    frames: &'a [F],
) -> Result<EventMessage<'a>, FrameError> {
    match frames {
        [topic, seq, payload] => Ok(EventMessage {
            topic: topic.as_ref(),
            seq: seq_of(seq.as_ref())?,
            payload: payload.as_ref(),
        }),
        _ => Err(FrameError::WrongFrameCount(frames.len())),
    }
}

/// One message from the engine's replay socket, as seen by a DEALER.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayReply<'a> {
    /// A buffered batch.
    Batch {
        /// Its sequence number.
        seq: u64,
        /// Its payload.
        payload: &'a [u8],
    },
    /// Nothing more is buffered.
    End,
}

/// Parses a replay reply in either framing: `["", seq, payload]` (vLLM ≤ 0.25,
/// SGLang ≤ 0.5.21) or `["", topic, seq, payload]` (newer).
pub fn parse_replay_reply<'a, F: AsRef<[u8]>>(
    frames: &'a [F],
) -> Result<ReplayReply<'a>, FrameError> {
    let (seq, payload) = match frames {
        [delim, seq, payload] if delim.as_ref().is_empty() => (seq.as_ref(), payload.as_ref()),
        [delim, _topic, seq, payload] if delim.as_ref().is_empty() => {
            (seq.as_ref(), payload.as_ref())
        }
        _ => return Err(FrameError::BadReplayReply(frames.len())),
    };
    if seq == REPLAY_END_SEQ {
        return Ok(ReplayReply::End);
    }
    Ok(ReplayReply::Batch {
        seq: seq_of(seq)?,
        payload,
    })
}

/// The request a DEALER sends to replay from `start_seq`.
pub fn replay_request(start_seq: u64) -> [Vec<u8>; 2] {
    [Vec::new(), start_seq.to_be_bytes().to_vec()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_messages() {
        let frames: [&[u8]; 3] = [b"kv-events", &7u64.to_be_bytes(), b"\x90"];
        let msg = parse_event_message(&frames).unwrap();
        assert_eq!(
            (msg.topic, msg.seq, msg.payload),
            (&b"kv-events"[..], 7, &b"\x90"[..])
        );
        assert_eq!(
            parse_event_message(&frames[..2]),
            Err(FrameError::WrongFrameCount(2))
        );
        let short: [&[u8]; 3] = [b"", &[0, 1], b""];
        assert_eq!(parse_event_message(&short), Err(FrameError::BadSeqFrame(2)));
    }

    #[test]
    fn both_replay_framings_and_end_markers() {
        let old: [&[u8]; 3] = [b"", &3u64.to_be_bytes(), b"p"];
        let new: [&[u8]; 4] = [b"", b"topic", &3u64.to_be_bytes(), b"p"];
        let want = ReplayReply::Batch {
            seq: 3,
            payload: b"p",
        };
        assert_eq!(parse_replay_reply(&old).unwrap(), want);
        assert_eq!(parse_replay_reply(&new).unwrap(), want);
        let old_end: [&[u8]; 3] = [b"", &REPLAY_END_SEQ, b""];
        let new_end: [&[u8]; 4] = [b"", b"", &REPLAY_END_SEQ, b""];
        assert_eq!(parse_replay_reply(&old_end).unwrap(), ReplayReply::End);
        assert_eq!(parse_replay_reply(&new_end).unwrap(), ReplayReply::End);
        let no_delim: [&[u8]; 3] = [b"x", &3u64.to_be_bytes(), b"p"];
        assert!(parse_replay_reply(&no_delim).is_err());
        assert_eq!(replay_request(5)[1], 5u64.to_be_bytes());
    }
}
