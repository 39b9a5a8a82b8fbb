//! Frames on disk (a 4-byte big-endian length, then one msgpack value) and
//! the conversion between msgpack values and their JSON equivalents.

use std::io::{Read, Write};

use rmpv::Value as Mp;
use serde_json::Value;

use super::format::{MAX_FRAME_BYTES, TraceError};

pub(super) fn read_frame(inner: &mut impl Read, index: u64) -> Result<Option<Mp>, TraceError> {
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
pub(super) fn frame_fields(
    frame: Mp,
    index: u64,
) -> Result<(String, Vec<(String, Mp)>), TraceError> {
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

pub(super) fn as_f64(v: &Mp) -> Option<f64> {
    match v {
        Mp::F64(f) => Some(*f),
        Mp::F32(f) => Some(f64::from(*f)),
        Mp::Integer(i) => i.as_f64(),
        _ => None,
    }
}

/// msgpack to its JSON equivalent: binary becomes an array of byte values,
/// non-finite floats and extension types become null, non-string map keys
/// are written out as text.
pub(super) fn mp_to_json(v: Mp) -> Value {
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

pub(super) fn json_to_mp(v: &Value) -> Mp {
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

pub(super) fn map(fields: Vec<(&str, Mp)>) -> Mp {
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
