//! Reading a trace: the header checked when opened, then its records.

use std::io::Read;

use rmpv::Value as Mp;
use serde_json::{Map, Value};

use super::format::{
    EVENTS_LEVEL, FORMAT_VERSION, Header, READABLE_SCHEMA_VERSIONS, Record, TRACE_MAGIC, TraceError,
};
use super::frame::{as_f64, frame_fields, mp_to_json, read_frame};
use super::replay::TraceEvent;

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
