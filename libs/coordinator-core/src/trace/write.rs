//! Writing a trace in the recorder's layout.

use std::io::Write;

use rmpv::Value as Mp;
use serde_json::{Map, Value};

use super::format::{Header, QUALNAME_BATCH, QUALNAME_LIFECYCLE, Record, TRACE_MAGIC, TraceError};
use super::frame::{json_to_mp, map, write_raw_frame};
use crate::events::WireBatch;

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
