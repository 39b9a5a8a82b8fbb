//! The `.lct` schema: the constants a trace is checked against, the header
//! and record frames as plain data, and the error of every trace operation.

use serde_json::{Map, Value};

/// The four bytes a header's `magic` must hold.
pub const TRACE_MAGIC: &[u8; 4] = b"LMCT";
/// Framing version this build reads and writes.
pub const FORMAT_VERSION: i64 = 1;
/// Record schema versions this build understands.
pub const READABLE_SCHEMA_VERSIONS: [i64; 2] = [1, 2];
/// Schema version the writer stamps.
pub const WRITTEN_SCHEMA_VERSION: i64 = 2;
/// The trace level coordinator event traces are recorded at.
pub const EVENTS_LEVEL: &str = "events";
/// Qualname of an event batch record.
pub const QUALNAME_BATCH: &str = "events.batch";
/// Qualname of a membership record.
pub const QUALNAME_LIFECYCLE: &str = "events.lifecycle";
/// Largest frame accepted; a corrupt length must not allocate gigabytes.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

/// The first frame of a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// Framing version ([`FORMAT_VERSION`]).
    pub format_version: i64,
    /// Recording level (`events` for coordinator traces).
    pub level: String,
    /// Record schema version.
    pub trace_schema_version: i64,
    /// Level-specific metadata.
    pub level_meta: Map<String, Value>,
    /// Version of the recorder, when it said.
    pub lmcache_version: Option<String>,
    /// Monotonic clock at the start of recording.
    pub t_mono_start: f64,
    /// Wall clock at the start of recording.
    pub t_wall_start: f64,
    /// Recorder configuration as JSON text.
    pub sm_config_json: String,
    /// Digest of that configuration.
    pub sm_config_digest: String,
}

impl Default for Header {
    fn default() -> Self {
        Self {
            format_version: FORMAT_VERSION,
            level: EVENTS_LEVEL.to_owned(),
            trace_schema_version: WRITTEN_SCHEMA_VERSION,
            level_meta: Map::new(),
            lmcache_version: None,
            t_mono_start: 0.0,
            t_wall_start: 0.0,
            sm_config_json: String::new(),
            sm_config_digest: String::new(),
        }
    }
}

/// One record frame, before interpretation.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Seconds since the header's `t_mono_start`.
    pub t_mono: f64,
    /// Wall clock when recorded.
    pub t_wall: f64,
    /// What was recorded.
    pub qualname: String,
    /// Payload, converted to its JSON equivalent.
    pub args: Map<String, Value>,
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
    /// A frame that is not msgpack.
    #[error("frame {index} is not msgpack: {source}")]
    Decode {
        /// Frame number.
        index: u64,
        /// Cause.
        #[source]
        source: rmpv::decode::Error,
    },
    /// A frame that is msgpack but not a header or record.
    #[error("frame {index} is not a trace frame: {detail}")]
    Frame {
        /// Frame number.
        index: u64,
        /// What was wrong.
        detail: String,
    },
    /// The header is missing or describes a trace this build cannot replay.
    #[error("not a replayable LMCache event trace: {0}")]
    Header(String),
    /// Writing a frame failed.
    #[error("frame does not encode: {0}")]
    Encode(String),
}
