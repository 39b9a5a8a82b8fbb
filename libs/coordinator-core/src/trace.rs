//! `.lct` trace files as LMCache records them (`lmcache server
//! --trace-level events`), read for replay into a coordinator and written
//! by tests.
//!
//! On disk a trace is a run of frames; each frame is a 4-byte big-endian
//! length followed by that many bytes holding one msgpack value. Every
//! value is a map carrying a `type` discriminator (msgspec's tagged-struct
//! encoding):
//!
//! * the first frame is the header (`type = "header"`): `magic` (bin,
//!   `LMCT`), `format_version` (1), `level` (`"events"` for coordinator
//!   traces), `trace_schema_version` (1 or 2), `level_meta`,
//!   `lmcache_version`, `t_mono_start`, `t_wall_start`, `sm_config_json`,
//!   `sm_config_digest`;
//! * every later frame is a record (`type = "record"`): `t_mono` (seconds
//!   since `t_mono_start`), `t_wall`, `qualname` and an `args` map.
//!
//! The recorder omits fields equal to their default, so any field may be
//! missing and takes its default here; fields this build does not know are
//! ignored. A present `magic` or `format_version` with the wrong value is
//! refused, as is a level other than `events`.
//!
//! Two qualnames matter for replay: `events.batch`, whose `args` are one
//! `CacheEventBatch` in its `POST /events` form, and `events.lifecycle`,
//! whose `args` hold a `phase` (`register`, `heartbeat`, `deregister`) and
//! the instance fields. Anything else is surfaced as a [`Skipped`] item so
//! callers can count it.

use std::io::{Read, Write};

use rmpv::Value as Mp;
use serde_json::{Map, Value};

use crate::events::WireBatch;

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

/// Membership phases replay knows how to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifecyclePhase {
    /// `POST /instances`.
    Register,
    /// `PUT /instances/{id}/heartbeat`.
    Heartbeat,
    /// `DELETE /instances/{id}`.
    Deregister,
}

impl LifecyclePhase {
    /// The `phase` string in a record.
    pub fn as_str(self) -> &'static str {
        match self {
            LifecyclePhase::Register => "register",
            LifecyclePhase::Heartbeat => "heartbeat",
            LifecyclePhase::Deregister => "deregister",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "register" => Some(LifecyclePhase::Register),
            "heartbeat" => Some(LifecyclePhase::Heartbeat),
            "deregister" => Some(LifecyclePhase::Deregister),
            _ => None,
        }
    }
}

/// Registration fields copied from a `register` record into the
/// `POST /instances` body, when present.
pub const REGISTRATION_FIELDS: [&str; 6] = [
    "instance_id",
    "ip",
    "http_port",
    "metadata",
    "p2p_advertised_url",
    "mq_port",
];

/// Why a record was not turned into an event.
#[derive(Clone, Debug, PartialEq)]
pub enum Skipped {
    /// A qualname replay does not handle.
    Qualname(String),
    /// A lifecycle phase replay does not handle.
    Phase(String),
    /// A known qualname whose args do not fit.
    Malformed {
        /// The record's qualname.
        qualname: String,
        /// What was wrong.
        detail: String,
    },
}

/// A record interpreted for replay.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceEvent {
    /// An event batch as an MP server sent it.
    Batch {
        /// Seconds since recording started.
        t_mono: f64,
        /// The batch.
        batch: Box<WireBatch>,
    },
    /// A membership change.
    Lifecycle {
        /// Seconds since recording started.
        t_mono: f64,
        /// What happened.
        phase: LifecyclePhase,
        /// Instance concerned.
        instance_id: String,
        /// `POST /instances` body (`register` only).
        registration: Option<Value>,
    },
    /// A record left out, with the reason.
    Skipped {
        /// Seconds since recording started.
        t_mono: f64,
        /// Frame number (the header is frame 0).
        index: u64,
        /// Why.
        reason: Skipped,
    },
}

impl TraceEvent {
    /// Recording time of the event, seconds since recording started.
    pub fn t_mono(&self) -> f64 {
        match self {
            TraceEvent::Batch { t_mono, .. }
            | TraceEvent::Lifecycle { t_mono, .. }
            | TraceEvent::Skipped { t_mono, .. } => *t_mono,
        }
    }
}

impl Record {
    /// Interprets the record for replay; `index` is its frame number.
    pub fn into_event(self, index: u64) -> TraceEvent {
        let t_mono = self.t_mono;
        let skip = |reason| TraceEvent::Skipped {
            t_mono,
            index,
            reason,
        };
        let malformed = |qualname: &str, detail: String| {
            skip(Skipped::Malformed {
                qualname: qualname.to_owned(),
                detail,
            })
        };
        match self.qualname.as_str() {
            QUALNAME_BATCH => match serde_json::from_value::<WireBatch>(Value::Object(self.args)) {
                Ok(batch) => TraceEvent::Batch {
                    t_mono,
                    batch: Box::new(batch),
                },
                Err(e) => malformed(QUALNAME_BATCH, e.to_string()),
            },
            QUALNAME_LIFECYCLE => {
                let Some(phase) = self.args.get("phase").and_then(Value::as_str) else {
                    return malformed(QUALNAME_LIFECYCLE, "no phase".to_owned());
                };
                let Some(phase_known) = LifecyclePhase::parse(phase) else {
                    return skip(Skipped::Phase(phase.to_owned()));
                };
                let Some(instance_id) = self.args.get("instance_id").and_then(Value::as_str) else {
                    return malformed(QUALNAME_LIFECYCLE, "no instance_id".to_owned());
                };
                let registration = (phase_known == LifecyclePhase::Register).then(|| {
                    let body: Map<String, Value> = REGISTRATION_FIELDS
                        .iter()
                        .filter_map(|k| {
                            self.args
                                .get(*k)
                                .filter(|v| !v.is_null())
                                .map(|v| ((*k).to_owned(), v.clone()))
                        })
                        .collect();
                    Value::Object(body)
                });
                TraceEvent::Lifecycle {
                    t_mono,
                    phase: phase_known,
                    instance_id: instance_id.to_owned(),
                    registration,
                }
            }
            _ => skip(Skipped::Qualname(self.qualname)),
        }
    }
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

/// Reads a trace: the header when opened, then one [`TraceEvent`] per
/// record.
#[derive(Debug)]
pub struct TraceReader<R> {
    inner: R,
    header: Header,
    index: u64,
    done: bool,
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the header: magic, format version, schema version
    /// and the `events` level.
    pub fn open(mut inner: R) -> Result<Self, TraceError> {
        let Some(first) = read_frame(&mut inner, 0)? else {
            return Err(TraceError::Header("empty file".into()));
        };
        let header = parse_header(first)?;
        Ok(Self {
            inner,
            header,
            index: 1,
            done: false,
        })
    }

    /// The header read by [`TraceReader::open`].
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Next raw record, `None` at a clean end of file.
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        if self.done {
            return Ok(None);
        }
        let result = read_frame(&mut self.inner, self.index)
            .and_then(|frame| frame.map(|v| parse_record(v, self.index)).transpose());
        match &result {
            Ok(Some(_)) => self.index += 1,
            // A broken stream cannot be resynchronised: stop after an error.
            Ok(None) | Err(_) => self.done = true,
        }
        result
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<TraceEvent, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        let index = self.index;
        self.next_record()
            .map(|r| r.map(|r| r.into_event(index)))
            .transpose()
    }
}

fn read_frame(inner: &mut impl Read, index: u64) -> Result<Option<Mp>, TraceError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        let n = inner.read(&mut len[got..])?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(TraceError::Truncated(index))
            };
        }
        got += n;
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(TraceError::TooLarge { index, len });
    }
    let mut buf = vec![0u8; len];
    inner.read_exact(&mut buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            TraceError::Truncated(index)
        } else {
            TraceError::Io(e)
        }
    })?;
    rmpv::decode::read_value(&mut buf.as_slice())
        .map(Some)
        .map_err(|source| TraceError::Decode { index, source })
}

/// A frame's map as (string key, value) pairs plus its `type` tag.
fn frame_fields(frame: Mp, index: u64) -> Result<(String, Vec<(String, Mp)>), TraceError> {
    let Mp::Map(pairs) = frame else {
        return Err(TraceError::Frame {
            index,
            detail: "not a map".into(),
        });
    };
    let mut tag = None;
    let mut fields = Vec::with_capacity(pairs.len());
    for (k, v) in pairs {
        let Some(k) = k.as_str().map(str::to_owned) else {
            continue;
        };
        if k == "type" {
            tag = v.as_str().map(str::to_owned);
        } else {
            fields.push((k, v));
        }
    }
    let tag = tag.ok_or_else(|| TraceError::Frame {
        index,
        detail: "no `type` tag".into(),
    })?;
    Ok((tag, fields))
}

fn as_f64(v: &Mp) -> Option<f64> {
    match v {
        Mp::F64(f) => Some(*f),
        Mp::F32(f) => Some(f64::from(*f)),
        Mp::Integer(i) => i.as_f64(),
        _ => None,
    }
}

fn parse_header(frame: Mp) -> Result<Header, TraceError> {
    let (tag, fields) = frame_fields(frame, 0)?;
    if tag != "header" {
        return Err(TraceError::Header(format!(
            "first frame is a `{tag}`, not a header"
        )));
    }
    let bad =
        |field: &str| TraceError::Header(format!("header field `{field}` has the wrong type"));
    let mut h = Header {
        // Fields the recorder leaves out carry their defaults.
        trace_schema_version: 1,
        level: String::new(),
        ..Header::default()
    };
    for (k, v) in fields {
        match k.as_str() {
            "magic" => {
                let bytes: &[u8] = match &v {
                    Mp::Binary(b) => b,
                    Mp::String(s) => s.as_bytes(),
                    _ => return Err(bad("magic")),
                };
                if bytes != TRACE_MAGIC {
                    return Err(TraceError::Header(format!(
                        "bad magic {bytes:02x?}, expected \"LMCT\""
                    )));
                }
            }
            "format_version" => {
                h.format_version = v.as_i64().ok_or_else(|| bad("format_version"))?;
            }
            "level" => h.level = v.as_str().ok_or_else(|| bad("level"))?.to_owned(),
            "trace_schema_version" => {
                h.trace_schema_version = v.as_i64().ok_or_else(|| bad("trace_schema_version"))?;
            }
            "level_meta" => match mp_to_json(v) {
                Value::Object(m) => h.level_meta = m,
                Value::Null => {}
                _ => return Err(bad("level_meta")),
            },
            "lmcache_version" => h.lmcache_version = v.as_str().map(str::to_owned),
            "t_mono_start" => h.t_mono_start = as_f64(&v).ok_or_else(|| bad("t_mono_start"))?,
            "t_wall_start" => h.t_wall_start = as_f64(&v).ok_or_else(|| bad("t_wall_start"))?,
            "sm_config_json" => h.sm_config_json = v.as_str().unwrap_or_default().to_owned(),
            "sm_config_digest" => h.sm_config_digest = v.as_str().unwrap_or_default().to_owned(),
            _ => {}
        }
    }
    if h.format_version != FORMAT_VERSION {
        return Err(TraceError::Header(format!(
            "format_version {} (this build reads {FORMAT_VERSION})",
            h.format_version
        )));
    }
    if !READABLE_SCHEMA_VERSIONS.contains(&h.trace_schema_version) {
        return Err(TraceError::Header(format!(
            "trace_schema_version {} (this build reads {READABLE_SCHEMA_VERSIONS:?})",
            h.trace_schema_version
        )));
    }
    if h.level != EVENTS_LEVEL {
        return Err(TraceError::Header(format!(
            "level `{}`; replay needs a trace recorded with --trace-level {EVENTS_LEVEL}",
            h.level
        )));
    }
    Ok(h)
}

fn parse_record(frame: Mp, index: u64) -> Result<Record, TraceError> {
    let (tag, fields) = frame_fields(frame, index)?;
    let bad = |detail: String| TraceError::Frame { index, detail };
    if tag != "record" {
        return Err(bad(format!("a `{tag}` frame after the header")));
    }
    let mut r = Record {
        t_mono: 0.0,
        t_wall: 0.0,
        qualname: String::new(),
        args: Map::new(),
    };
    for (k, v) in fields {
        match k.as_str() {
            "t_mono" => {
                r.t_mono = as_f64(&v).ok_or_else(|| bad("t_mono is not a number".into()))?
            }
            "t_wall" => {
                r.t_wall = as_f64(&v).ok_or_else(|| bad("t_wall is not a number".into()))?
            }
            "qualname" => {
                r.qualname = v
                    .as_str()
                    .ok_or_else(|| bad("qualname is not a string".into()))?
                    .to_owned();
            }
            "args" => match mp_to_json(v) {
                Value::Object(m) => r.args = m,
                Value::Null => {}
                _ => return Err(bad("args is not a map".into())),
            },
            _ => {}
        }
    }
    Ok(r)
}

/// msgpack to its JSON equivalent: binary becomes an array of byte values,
/// non-finite floats and extension types become null, non-string map keys
/// are written out as text.
fn mp_to_json(v: Mp) -> Value {
    match v {
        Mp::Nil | Mp::Ext(..) => Value::Null,
        Mp::Boolean(b) => Value::Bool(b),
        Mp::Integer(i) => i
            .as_i64()
            .map(Value::from)
            .or_else(|| i.as_u64().map(Value::from))
            .unwrap_or(Value::Null),
        Mp::F32(f) => float_json(f64::from(f)),
        Mp::F64(f) => float_json(f),
        Mp::String(s) => Value::String(lossy(s)),
        Mp::Binary(b) => Value::Array(b.into_iter().map(Value::from).collect()),
        Mp::Array(items) => Value::Array(items.into_iter().map(mp_to_json).collect()),
        Mp::Map(pairs) => Value::Object(
            pairs
                .into_iter()
                .map(|(k, v)| {
                    let key = match k {
                        Mp::String(s) => lossy(s),
                        other => other.to_string(),
                    };
                    (key, mp_to_json(v))
                })
                .collect(),
        ),
    }
}

/// A msgpack string as text; invalid UTF-8 is replaced rather than fatal.
fn lossy(s: rmpv::Utf8String) -> String {
    String::from_utf8_lossy(&s.into_bytes()).into_owned()
}

fn float_json(f: f64) -> Value {
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn json_to_mp(v: &Value) -> Mp {
    match v {
        Value::Null => Mp::Nil,
        Value::Bool(b) => Mp::Boolean(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Mp::from(i)
            } else if let Some(u) = n.as_u64() {
                Mp::from(u)
            } else {
                Mp::F64(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => Mp::from(s.as_str()),
        Value::Array(items) => Mp::Array(items.iter().map(json_to_mp).collect()),
        Value::Object(m) => Mp::Map(
            m.iter()
                .map(|(k, v)| (Mp::from(k.as_str()), json_to_mp(v)))
                .collect(),
        ),
    }
}

/// Writes a trace in the recorder's layout (used by tests and tools that
/// fabricate traces).
#[derive(Debug)]
pub struct TraceWriter<W> {
    out: W,
}

impl<W: Write> TraceWriter<W> {
    /// Writes `header` and returns the writer for records.
    pub fn new(mut out: W, header: &Header) -> Result<Self, TraceError> {
        let mut fields = vec![
            ("type", Mp::from("header")),
            ("magic", Mp::Binary(TRACE_MAGIC.to_vec())),
            ("format_version", Mp::from(header.format_version)),
            ("level", Mp::from(header.level.as_str())),
            (
                "trace_schema_version",
                Mp::from(header.trace_schema_version),
            ),
            (
                "level_meta",
                json_to_mp(&Value::Object(header.level_meta.clone())),
            ),
        ];
        if let Some(v) = &header.lmcache_version {
            fields.push(("lmcache_version", Mp::from(v.as_str())));
        }
        fields.extend([
            ("t_mono_start", Mp::F64(header.t_mono_start)),
            ("t_wall_start", Mp::F64(header.t_wall_start)),
            ("sm_config_json", Mp::from(header.sm_config_json.as_str())),
            (
                "sm_config_digest",
                Mp::from(header.sm_config_digest.as_str()),
            ),
        ]);
        write_raw_frame(&mut out, &map(fields))?;
        Ok(Self { out })
    }

    /// Appends one record.
    pub fn record(&mut self, record: &Record) -> Result<(), TraceError> {
        let frame = map(vec![
            ("type", Mp::from("record")),
            ("t_mono", Mp::F64(record.t_mono)),
            ("t_wall", Mp::F64(record.t_wall)),
            ("qualname", Mp::from(record.qualname.as_str())),
            ("args", json_to_mp(&Value::Object(record.args.clone()))),
        ]);
        write_raw_frame(&mut self.out, &frame)
    }

    /// Appends an `events.batch` record.
    pub fn batch(&mut self, t_mono: f64, t_wall: f64, batch: &WireBatch) -> Result<(), TraceError> {
        let args = match serde_json::to_value(batch) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(TraceError::Encode("batch is not an object".into())),
            Err(e) => return Err(TraceError::Encode(e.to_string())),
        };
        self.record(&Record {
            t_mono,
            t_wall,
            qualname: QUALNAME_BATCH.to_owned(),
            args,
        })
    }

    /// Appends an `events.lifecycle` record: `phase` plus `fields` (which
    /// should hold `instance_id`).
    pub fn lifecycle(
        &mut self,
        t_mono: f64,
        t_wall: f64,
        phase: &str,
        fields: Map<String, Value>,
    ) -> Result<(), TraceError> {
        let mut args = Map::new();
        args.insert("phase".to_owned(), Value::from(phase));
        args.extend(fields);
        self.record(&Record {
            t_mono,
            t_wall,
            qualname: QUALNAME_LIFECYCLE.to_owned(),
            args,
        })
    }

    /// Flushes and returns the sink.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.out.flush()?;
        Ok(self.out)
    }
}

fn map(fields: Vec<(&str, Mp)>) -> Mp {
    Mp::Map(fields.into_iter().map(|(k, v)| (Mp::from(k), v)).collect())
}

/// Appends one frame holding `value` to `out`.
pub fn write_raw_frame(out: &mut impl Write, value: &Mp) -> Result<(), TraceError> {
    let mut body = Vec::new();
    rmpv::encode::write_value(&mut body, value).map_err(|e| TraceError::Encode(e.to_string()))?;
    let len = u32::try_from(body.len())
        .map_err(|_| TraceError::Encode(format!("frame of {} bytes", body.len())))?;
    out.write_all(&len.to_be_bytes())?;
    out.write_all(&body)?;
    Ok(())
}

/// How long after the replay started a record made `offset` seconds after
/// the first one is due, at `speed` (0 or less = no pacing).
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
    use serde_json::json;

    fn sample_batch(seq: i64) -> WireBatch {
        serde_json::from_value(json!({
            "instance_id": "mp-a", "incarnation": 7, "seq": seq, "event_type": "store", "tier": "l2",
            "backend": "fs", "entries": [{"key": {"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": 1},
                                          "size_bytes": 3, "token_ids": [1, 2]}]}))
        .unwrap()
    }

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    fn frame(v: Mp) -> Vec<u8> {
        let mut out = Vec::new();
        write_raw_frame(&mut out, &v).unwrap();
        out
    }

    fn mp(pairs: Vec<(&str, Mp)>) -> Mp {
        map(pairs)
    }

    fn read_all(raw: &[u8]) -> Result<Vec<TraceEvent>, TraceError> {
        TraceReader::open(raw)?.collect()
    }

    #[test]
    fn writer_and_reader_round_trip() {
        let header = Header {
            lmcache_version: Some("0.4.0".into()),
            t_mono_start: 50.0,
            t_wall_start: 1.7e9,
            sm_config_json: "{}".into(),
            sm_config_digest: "d".into(),
            level_meta: obj(json!({"sink": "file"})),
            ..Header::default()
        };
        let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
        w.lifecycle(
            0.0,
            1.7e9,
            "register",
            obj(json!({"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 1, "extra": true})),
        )
        .unwrap();
        w.batch(0.5, 1.7e9 + 0.5, &sample_batch(1)).unwrap();
        w.lifecycle(0.7, 0.0, "heartbeat", obj(json!({"instance_id": "mp-a"})))
            .unwrap();
        let raw = w.finish().unwrap();
        let reader = TraceReader::open(raw.as_slice()).unwrap();
        assert_eq!(reader.header(), &header);
        let events: Vec<TraceEvent> = reader.collect::<Result<_, _>>().unwrap();
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[0],
            TraceEvent::Lifecycle {
                t_mono: 0.0,
                phase: LifecyclePhase::Register,
                instance_id: "mp-a".into(),
                registration: Some(
                    json!({"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 1})
                ),
            }
        );
        let TraceEvent::Batch { batch, t_mono } = &events[1] else {
            panic!("not a batch: {:?}", events[1])
        };
        assert_eq!(*t_mono, 0.5);
        assert_eq!(**batch, sample_batch(1));
        let valid = batch.validate(0).unwrap();
        assert_eq!(valid.event_type, EventType::Store);
        assert_eq!(valid.entries[0].token_ids, vec![1, 2]);
        assert!(matches!(
            events[2],
            TraceEvent::Lifecycle {
                phase: LifecyclePhase::Heartbeat,
                registration: None,
                ..
            }
        ));
    }

    /// Frames built by hand the way msgspec lays them out: the tag first,
    /// defaults left out, extra fields the reader must ignore.
    #[test]
    fn hand_built_frames_decode_field_by_field() {
        let mut raw = frame(mp(vec![
            ("type", Mp::from("header")),
            ("magic", Mp::Binary(b"LMCT".to_vec())),
            ("format_version", Mp::from(1)),
            ("level", Mp::from("events")),
            ("trace_schema_version", Mp::from(1)),
            ("t_mono_start", Mp::F64(12.5)),
            ("t_wall_start", Mp::F64(1000.25)),
            ("sm_config_json", Mp::from("{\"a\":1}")),
            ("sm_config_digest", Mp::from("abc")),
            ("future_field", Mp::Array(vec![Mp::from(1)])),
        ]));
        raw.extend(frame(mp(vec![
            ("type", Mp::from("record")),
            ("t_mono", Mp::F64(0.25)),
            ("t_wall", Mp::F64(1000.5)),
            ("qualname", Mp::from("events.batch")),
            (
                "args",
                mp(vec![
                    ("instance_id", Mp::from("mp-b")),
                    ("incarnation", Mp::from(3u64)),
                    ("seq", Mp::from(9)),
                    ("event_type", Mp::from("delete")),
                    ("tier", Mp::from("l1")),
                    ("backend", Mp::from("cpu")),
                    ("shared", Mp::Boolean(true)),
                    ("ts", Mp::F32(2.5)),
                    ("unknown_extra", Mp::Nil),
                    (
                        "entries",
                        Mp::Array(vec![mp(vec![(
                            "key",
                            mp(vec![
                                ("chunk_hash_hex", Mp::from("0f")),
                                ("model_name", Mp::from("m")),
                                ("kv_rank", Mp::from(5)),
                            ]),
                        )])]),
                    ),
                ]),
            ),
        ])));
        let mut reader = TraceReader::open(raw.as_slice()).unwrap();
        let h = reader.header().clone();
        assert_eq!(h.format_version, 1);
        assert_eq!(h.level, "events");
        assert_eq!(h.trace_schema_version, 1);
        assert!(h.level_meta.is_empty());
        assert_eq!(h.lmcache_version, None);
        assert_eq!((h.t_mono_start, h.t_wall_start), (12.5, 1000.25));
        assert_eq!(h.sm_config_json, "{\"a\":1}");
        assert_eq!(h.sm_config_digest, "abc");
        let rec = reader.next_record().unwrap().unwrap();
        assert_eq!((rec.t_mono, rec.t_wall), (0.25, 1000.5));
        assert_eq!(rec.qualname, "events.batch");
        let TraceEvent::Batch { batch, .. } = rec.into_event(1) else {
            panic!("not a batch")
        };
        assert_eq!(batch.instance_id, "mp-b");
        assert_eq!((batch.incarnation, batch.seq), (3, 9));
        assert_eq!(batch.backend, "cpu");
        assert!(batch.shared);
        assert_eq!(batch.ts, 2.5);
        assert_eq!(batch.entries.len(), 1);
        let valid = batch.validate(0).unwrap();
        assert_eq!(valid.event_type, EventType::Delete);
        assert!(reader.next_record().unwrap().is_none());
    }

    fn header_with(pairs: Vec<(&str, Mp)>) -> Vec<u8> {
        let mut fields = vec![
            ("type", Mp::from("header")),
            ("magic", Mp::Binary(b"LMCT".to_vec())),
            ("format_version", Mp::from(1)),
            ("level", Mp::from("events")),
        ];
        for (k, v) in pairs {
            fields.retain(|(f, _)| *f != k);
            fields.push((k, v));
        }
        frame(mp(fields))
    }

    #[test]
    fn bad_headers_are_refused() {
        let err = |raw: Vec<u8>| read_all(&raw).unwrap_err().to_string();
        assert!(header_with(vec![]).len() > 4 && read_all(&header_with(vec![])).is_ok());
        assert!(err(header_with(vec![("magic", Mp::Binary(b"LMCX".to_vec()))])).contains("magic"));
        assert!(
            err(header_with(vec![("format_version", Mp::from(2))])).contains("format_version 2")
        );
        assert!(
            err(header_with(vec![("trace_schema_version", Mp::from(9))]))
                .contains("trace_schema_version 9")
        );
        assert!(err(header_with(vec![("level", Mp::from("calls"))])).contains("level `calls`"));
        assert!(err(Vec::new()).contains("empty file"));
        let record_first = frame(mp(vec![
            ("type", Mp::from("record")),
            ("qualname", Mp::from("x")),
        ]));
        assert!(err(record_first).contains("not a header"));
        assert!(matches!(
            read_all(&frame(Mp::from(3))),
            Err(TraceError::Frame { index: 0, .. })
        ));
    }

    #[test]
    fn broken_frames_are_errors_not_panics() {
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        w.batch(0.0, 0.0, &sample_batch(1)).unwrap();
        let good = w.finish().unwrap();
        let header_len = TraceWriter::new(Vec::new(), &Header::default())
            .unwrap()
            .finish()
            .unwrap()
            .len();
        // Inside the body, and inside the length prefix.
        for cut in [1, 3, 5, good.len() - header_len - 2] {
            let truncated = &good[..good.len() - cut];
            let results: Vec<_> = TraceReader::open(truncated).unwrap().collect();
            assert!(
                matches!(results.last(), Some(Err(TraceError::Truncated(1)))),
                "cut {cut}: {results:?}"
            );
        }
        let mut huge = header_with(vec![]);
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        let results: Vec<_> = TraceReader::open(huge.as_slice()).unwrap().collect();
        assert!(matches!(
            results.last(),
            Some(Err(TraceError::TooLarge { .. }))
        ));
        let mut garbage = header_with(vec![]);
        garbage.extend_from_slice(&[0, 0, 0, 2, 0xd9, 0x05]);
        garbage.extend_from_slice(&good);
        let results: Vec<_> = TraceReader::open(garbage.as_slice()).unwrap().collect();
        assert_eq!(results.len(), 1, "stops after the error");
        assert!(matches!(
            results[0],
            Err(TraceError::Decode { index: 1, .. })
        ));
        let mut second_header = header_with(vec![]);
        second_header.extend(header_with(vec![]));
        let results: Vec<_> = TraceReader::open(second_header.as_slice())
            .unwrap()
            .collect();
        assert!(matches!(
            results[0],
            Err(TraceError::Frame { index: 1, .. })
        ));
    }

    #[test]
    fn unknown_qualnames_and_phases_are_skipped() {
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        w.record(&Record {
            t_mono: 1.0,
            t_wall: 0.0,
            qualname: "storage.put".into(),
            args: Map::new(),
        })
        .unwrap();
        w.lifecycle(2.0, 0.0, "suspend", obj(json!({"instance_id": "mp-a"})))
            .unwrap();
        w.lifecycle(3.0, 0.0, "register", Map::new()).unwrap();
        w.record(&Record {
            t_mono: 4.0,
            t_wall: 0.0,
            qualname: QUALNAME_BATCH.into(),
            args: obj(json!({"seq": "nope"})),
        })
        .unwrap();
        w.lifecycle(5.0, 0.0, "deregister", obj(json!({"instance_id": "mp-a"})))
            .unwrap();
        let raw = w.finish().unwrap();
        let events = read_all(&raw).unwrap();
        assert_eq!(events.len(), 5);
        assert_eq!(
            events[0],
            TraceEvent::Skipped {
                t_mono: 1.0,
                index: 1,
                reason: Skipped::Qualname("storage.put".into())
            }
        );
        assert_eq!(
            events[1],
            TraceEvent::Skipped {
                t_mono: 2.0,
                index: 2,
                reason: Skipped::Phase("suspend".into())
            }
        );
        assert!(matches!(
            &events[2],
            TraceEvent::Skipped { reason: Skipped::Malformed { qualname, .. }, .. } if qualname == QUALNAME_LIFECYCLE
        ));
        assert!(matches!(
            &events[3],
            TraceEvent::Skipped { index: 4, reason: Skipped::Malformed { qualname, .. }, .. } if qualname == QUALNAME_BATCH
        ));
        assert!(matches!(
            &events[4],
            TraceEvent::Lifecycle { phase: LifecyclePhase::Deregister, instance_id, t_mono, .. }
                if instance_id == "mp-a" && *t_mono == 5.0
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
