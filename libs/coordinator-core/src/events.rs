//! The cache-event batch schema (`POST /events` and Kafka record values) and
//! its validation into the typed form the gate and views consume.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::StorageLevel;
use crate::key::{ObjectKey, WireKey, WireKeyRef};

mod scan;

pub use scan::plain_len;

/// What a batch reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventType {
    /// Keys were written.
    Store,
    /// Keys were removed.
    Delete,
    /// Keys were read.
    Access,
    /// A capacity declaration (no entries).
    Config,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Store => "store",
            EventType::Delete => "delete",
            EventType::Access => "access",
            EventType::Config => "config",
        }
    }
}

/// Body of `POST /events`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EventsRequest {
    /// Batches, offered to the gate in order.
    #[serde(default)]
    pub batches: Vec<WireBatch>,
}

/// `CacheEventBatch` as sent. Unknown fields are ignored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireBatch {
    /// Emitting instance.
    pub instance_id: String,
    /// Emitter start stamp.
    pub incarnation: i64,
    /// Per (instance, incarnation) sequence, from 1.
    pub seq: i64,
    /// Kind of event.
    pub event_type: EventType,
    /// StorageLevel the entries live in.
    pub tier: StorageLevel,
    /// Backend name.
    pub backend: String,
    /// Affected keys.
    #[serde(default)]
    pub entries: Vec<WireEntry>,
    /// The backend is a pool several instances mount.
    #[serde(default)]
    pub shared: bool,
    /// Emitter wall-clock time.
    #[serde(default)]
    pub ts: f64,
    /// Declared capacity (`config` only).
    #[serde(default)]
    pub capacity_bytes: i64,
    /// Declaration revision (`config` only).
    #[serde(default)]
    pub capacity_revision: i64,
    /// Events the emitter admits it dropped before this batch (newer MP
    /// servers); counted as loss.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_events: Option<i64>,
}

/// One entry of a batch as sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireEntry {
    /// The key.
    pub key: WireKey,
    /// Object size.
    #[serde(default)]
    pub size_bytes: i64,
    /// The chunk's tokens (store only).
    #[serde(default)]
    pub token_ids: Vec<i64>,
    /// Token position of the chunk, -1 if unknown.
    #[serde(default = "minus_one")]
    pub token_offset: i64,
}

fn minus_one() -> i64 {
    -1
}

/// A validated batch.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Emitting instance.
    pub instance_id: String,
    /// Emitter start stamp.
    pub incarnation: u64,
    /// Sequence number.
    pub seq: u64,
    /// Kind of event.
    pub event_type: EventType,
    /// StorageLevel.
    pub tier: StorageLevel,
    /// Backend (may be empty for `access`).
    pub backend: String,
    /// Entries.
    pub entries: Vec<Entry>,
    /// Shared pool.
    pub shared: bool,
    /// Emitter time.
    pub ts: f64,
    /// Declared capacity.
    pub capacity_bytes: u64,
    /// Declaration revision.
    pub capacity_revision: u64,
    /// Admitted loss.
    pub dropped_events: u64,
}

/// A validated entry.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// The key.
    pub key: ObjectKey,
    /// Size.
    pub size_bytes: u64,
    /// Tokens, when every one fits in u32 (out-of-range sequences are dropped,
    /// the placement is still stored).
    pub token_ids: Vec<u32>,
    /// Token offset, -1 if unknown.
    pub token_offset: i64,
}

/// A validation failure, located like FastAPI's `loc`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{msg}")]
pub struct FieldError {
    /// Path of the offending field below the body.
    pub loc: Vec<LocPart>,
    /// What is wrong.
    pub msg: String,
}

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum LocPart {
    /// A field name.
    Field(&'static str),
    /// A list index.
    Index(usize),
}

impl FieldError {
    fn new(loc: Vec<LocPart>, msg: impl Into<String>) -> Self {
        Self {
            loc,
            msg: msg.into(),
        }
    }
}

fn non_negative(
    value: i64,
    loc: impl FnOnce() -> Vec<LocPart>,
    what: &str,
) -> Result<u64, FieldError> {
    u64::try_from(value).map_err(|_| FieldError::new(loc(), format!("{what} must be >= 0")))
}

/// Validates a batch at `$index`, owned ([`WireBatch`]) or borrowed from the
/// body (`BorrowedBatch`): the two have the same field names, so one
/// expansion reads both into the [`Head`] and [`EntryParts`] the rules see.
macro_rules! validate_batch {
    ($index:expr, $b:expr) => {{
        let b = $b;
        let head = Head {
            instance_id: &b.instance_id,
            incarnation: b.incarnation,
            seq: b.seq,
            event_type: b.event_type,
            tier: b.tier,
            backend: &b.backend,
            entries: b.entries.len(),
            shared: b.shared,
            ts: b.ts,
            capacity_bytes: b.capacity_bytes,
            capacity_revision: b.capacity_revision,
            dropped_events: b.dropped_events,
        };
        let entries = b.entries.iter().map(|e| EntryParts {
            chunk_hash_hex: &e.key.chunk_hash_hex,
            model_name: &e.key.model_name,
            kv_rank: e.key.kv_rank,
            object_group_id: e.key.object_group_id,
            cache_salt: &e.key.cache_salt,
            size_bytes: e.size_bytes,
            token_ids: &e.token_ids,
            token_offset: e.token_offset,
        });
        validate_parts($index, &head, entries)
    }};
}

impl WireBatch {
    /// Validates the batch at `index` of the request.
    pub fn validate(&self, index: usize) -> Result<Batch, FieldError> {
        validate_batch!(index, self)
    }
}

/// A batch's scalar fields, borrowed from a [`WireBatch`] or a body.
struct Head<'s> {
    instance_id: &'s str,
    incarnation: i64,
    seq: i64,
    event_type: EventType,
    tier: StorageLevel,
    backend: &'s str,
    entries: usize,
    shared: bool,
    ts: f64,
    capacity_bytes: i64,
    capacity_revision: i64,
    dropped_events: Option<i64>,
}

/// An entry's fields, borrowed.
struct EntryParts<'s> {
    chunk_hash_hex: &'s str,
    model_name: &'s str,
    kv_rank: i64,
    object_group_id: i64,
    cache_salt: &'s str,
    size_bytes: i64,
    token_ids: &'s [i64],
    token_offset: i64,
}

/// The batch rules, one definition for every decoding of a batch.
fn validate_parts<'s>(
    index: usize,
    b: &Head<'s>,
    parts: impl Iterator<Item = EntryParts<'s>>,
) -> Result<Batch, FieldError> {
    use LocPart::{Field, Index};
    let at = |field: &'static str| vec![Field("batches"), Index(index), Field(field)];
    if b.instance_id.is_empty() {
        return Err(FieldError::new(
            at("instance_id"),
            "instance_id must not be empty",
        ));
    }
    let incarnation = non_negative(b.incarnation, || at("incarnation"), "incarnation")?;
    if b.seq < 1 {
        return Err(FieldError::new(at("seq"), "seq must be >= 1"));
    }
    if b.event_type != EventType::Access && b.backend.is_empty() {
        return Err(FieldError::new(at("backend"), "backend must not be empty"));
    }
    if b.event_type == EventType::Config && b.entries > 0 {
        return Err(FieldError::new(
            at("entries"),
            "config batches carry no entries",
        ));
    }
    if b.ts.is_nan() || b.ts < 0.0 {
        return Err(FieldError::new(at("ts"), "ts must be >= 0"));
    }
    let capacity_bytes = non_negative(b.capacity_bytes, || at("capacity_bytes"), "capacity_bytes")?;
    let capacity_revision = non_negative(
        b.capacity_revision,
        || at("capacity_revision"),
        "capacity_revision",
    )?;
    let dropped_events = non_negative(
        b.dropped_events.unwrap_or(0),
        || at("dropped_events"),
        "dropped_events",
    )?;
    let mut entries = Vec::with_capacity(b.entries);
    for (i, e) in parts.enumerate() {
        let eloc = |field: &'static str| {
            vec![
                Field("batches"),
                Index(index),
                Field("entries"),
                Index(i),
                Field(field),
            ]
        };
        let key = ObjectKey::from_parts(
            e.chunk_hash_hex,
            e.model_name,
            e.kv_rank,
            e.object_group_id,
            e.cache_salt,
        )
        .map_err(|err| FieldError::new(eloc("key"), err.to_string()))?;
        let size_bytes = non_negative(e.size_bytes, || eloc("size_bytes"), "size_bytes")?;
        if e.token_offset < -1 {
            return Err(FieldError::new(
                eloc("token_offset"),
                "token_offset must be >= -1",
            ));
        }
        // Most store entries carry no tokens: no collect then.
        let token_ids = if e.token_ids.is_empty() {
            Vec::new()
        } else {
            e.token_ids
                .iter()
                .map(|&t| u32::try_from(t).ok())
                .collect::<Option<Vec<u32>>>()
                .unwrap_or_default()
        };
        entries.push(Entry {
            key,
            size_bytes,
            token_ids,
            token_offset: e.token_offset,
        });
    }
    Ok(Batch {
        instance_id: b.instance_id.to_owned(),
        incarnation,
        seq: b.seq.unsigned_abs(),
        event_type: b.event_type,
        tier: b.tier,
        backend: b.backend.to_owned(),
        entries,
        shared: b.shared,
        ts: b.ts,
        capacity_bytes,
        capacity_revision,
        dropped_events,
    })
}

/// Decodes and validates a `POST /events` body in one pass, its strings
/// borrowed from the body (no owned `String` per key field, and UTF-8
/// checked once for the whole body rather than per string). `None` when
/// the body is not UTF-8, does not fit serde's strict types or breaks a
/// rule: the caller then takes the path that reports the reference's
/// errors. Accepts exactly what `EventsRequest` + `validate` accept, with
/// the same result.
pub fn decode_valid(body: &[u8]) -> Option<Vec<Batch>> {
    let text = std::str::from_utf8(body).ok()?;
    if let Some(batches) = scan::decode(text) {
        return Some(batches);
    }
    decode_serde(text)
}

/// [`decode_valid`] by serde alone (what the scanner must agree with).
fn decode_serde(text: &str) -> Option<Vec<Batch>> {
    let req: BorrowedRequest<'_> = serde_json::from_str(text).ok()?;
    req.batches
        .iter()
        .enumerate()
        .map(|(i, b)| validate_batch!(i, b).ok())
        .collect()
}

// The borrowed mirror of `EventsRequest` / `WireBatch` / `WireEntry` /
// `WireKey`: the same fields, types and defaults (a string with escapes is
// owned, the rest borrowed).

#[derive(Deserialize)]
struct BorrowedRequest<'a> {
    #[serde(default, borrow)]
    batches: Vec<BorrowedBatch<'a>>,
}

#[derive(Deserialize)]
struct BorrowedBatch<'a> {
    #[serde(borrow)]
    instance_id: Cow<'a, str>,
    incarnation: i64,
    seq: i64,
    event_type: EventType,
    tier: StorageLevel,
    #[serde(borrow)]
    backend: Cow<'a, str>,
    #[serde(default, borrow)]
    entries: Vec<BorrowedEntry<'a>>,
    #[serde(default)]
    shared: bool,
    #[serde(default)]
    ts: f64,
    #[serde(default)]
    capacity_bytes: i64,
    #[serde(default)]
    capacity_revision: i64,
    #[serde(default)]
    dropped_events: Option<i64>,
}

#[derive(Deserialize)]
struct BorrowedEntry<'a> {
    #[serde(borrow)]
    key: WireKeyRef<'a>,
    #[serde(default)]
    size_bytes: i64,
    #[serde(default)]
    token_ids: Vec<i64>,
    #[serde(default = "minus_one")]
    token_offset: i64,
}

impl EventsRequest {
    /// Validates every batch; the first failure rejects the whole request.
    pub fn validate(&self) -> Result<Vec<Batch>, FieldError> {
        self.batches
            .iter()
            .enumerate()
            .map(|(i, b)| b.validate(i))
            .collect()
    }
}

/// Outcome counts of one `POST /events`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsResponse {
    /// Admitted batches.
    pub applied: u64,
    /// Dropped as already seen.
    pub duplicates: u64,
    /// Dropped as from an older incarnation.
    pub stale: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<Vec<Batch>, String> {
        let req: EventsRequest = serde_json::from_str(json).map_err(|e| e.to_string())?;
        req.validate().map_err(|e| e.to_string())
    }

    const KEY: &str = r#"{"chunk_hash_hex":"AAbb","model_name":"m","kv_rank":16777472}"#;

    #[test]
    fn parses_store_with_defaults_and_unknown_fields() {
        let json = format!(
            r#"{{"batches":[{{"instance_id":"a","incarnation":5,"seq":1,"event_type":"store","tier":"l2","backend":"fs","future":1,
                "entries":[{{"key":{KEY},"size_bytes":10,"token_ids":[1,2,-3],"x":true}}]}}]}}"#
        );
        let batches = parse(&json).unwrap();
        assert_eq!(batches.len(), 1);
        let b = &batches[0];
        assert_eq!(b.entries[0].key.chunk_hash, vec![0xaa, 0xbb]);
        assert_eq!(b.entries[0].token_offset, -1);
        // Out-of-range tokens drop the token list, not the entry.
        assert!(b.entries[0].token_ids.is_empty());
        assert!(!b.shared);
        assert_eq!(parse("{}").unwrap(), vec![]);
    }

    #[test]
    fn rejects_invalid_batches() {
        // Each case overrides fields of a valid batch (no duplicate JSON keys).
        let base = |patch: serde_json::Value| {
            let mut b = serde_json::json!({"instance_id":"a","incarnation":5,"seq":1,
                "event_type":"store","tier":"l2","backend":"fs"});
            for (k, v) in patch.as_object().unwrap() {
                b[k] = v.clone();
            }
            serde_json::json!({ "batches": [b] }).to_string()
        };
        use serde_json::json;
        assert!(parse(&base(json!({}))).is_ok());
        let key = |hex: &str, model: &str| json!({"chunk_hash_hex": hex, "model_name": model, "kv_rank": 1});
        let bad = [
            json!({"seq": 0}),
            json!({"incarnation": -1}),
            json!({"instance_id": ""}),
            json!({"backend": ""}),
            json!({"tier": "all"}),
            json!({"ts": -1.0}),
            json!({"capacity_bytes": -1}),
            json!({"event_type": "config", "entries": [{"key": key("aa", "m")}]}),
            json!({"entries": [{"key": key("a", "m")}]}),
            json!({"entries": [{"key": key("aa", "m@x")}]}),
            json!({"entries": [{"key": key("aa", "m"), "size_bytes": -4}]}),
            json!({"entries": [{"key": key("aa", "m"), "token_offset": -2}]}),
            json!({"seq": "one"}),
            json!({"event_type": "evict"}),
        ];
        for patch in bad {
            assert!(parse(&base(patch.clone())).is_err(), "{patch} was accepted");
        }
        // Access may carry an empty backend.
        assert!(parse(&base(json!({"event_type": "access", "backend": ""}))).is_ok());
        assert!(
            parse(&base(
                json!({"entries": [{"key": key("aa", "m"), "token_offset": 0}]})
            ))
            .is_ok()
        );
    }

    #[test]
    fn error_locates_field() {
        let req: EventsRequest = serde_json::from_str(
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d"},
                           {"instance_id":"a","incarnation":1,"seq":0,"event_type":"store","tier":"l1","backend":"d"}]}"#,
        )
        .unwrap();
        let err = req.validate().unwrap_err();
        assert_eq!(
            err.loc,
            vec![
                LocPart::Field("batches"),
                LocPart::Index(1),
                LocPart::Field("seq")
            ]
        );
    }

    /// The borrowed one-pass decoding accepts exactly what the owned
    /// decoding and `validate` accept, with the same batches.
    #[test]
    fn borrowed_decoding_agrees_with_the_owned_one() {
        let bodies = [
            format!(
                r#"{{"batches":[{{"instance_id":"mp-1","incarnation":3,"seq":1,"event_type":"store","tier":"l2","backend":"fs","entries":[{{"key":{KEY},"size_bytes":7,"token_ids":[1,2],"token_offset":0}}],"shared":true,"ts":1.5}}]}}"#
            ),
            // Escapes in every string, unknown fields, defaults, two batches.
            r#"{"batches":[{"instance_id":"mp-\u0031","incarnation":0,"seq":2,"event_type":"access","tier":"l1","backend":"","entries":[{"key":{"chunk_hash_hex":"0\u0030ff","model_name":"m\"x","kv_rank":0,"cache_salt":"s\u00e9","object_group_id":2},"extra":1}],"dropped_events":null},{"instance_id":"a","incarnation":1,"seq":1,"event_type":"config","tier":"l1","backend":"dram","capacity_bytes":9,"capacity_revision":2}],"other":true}"#.to_owned(),
            r#"{}"#.to_owned(),
            r#"{"batches":[]}"#.to_owned(),
            // Token ids beyond u32 are dropped, the entry kept.
            format!(
                r#"{{"batches":[{{"instance_id":"x","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"dram","entries":[{{"key":{KEY},"token_ids":[-1]}}]}}]}}"#
            ),
            // Refused: by a rule, by a key, by serde's strict types.
            r#"{"batches":[{"instance_id":"x","incarnation":1,"seq":0,"event_type":"store","tier":"l1","backend":"dram"}]}"#.to_owned(),
            r#"{"batches":[{"instance_id":"x","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d","entries":[{"key":{"chunk_hash_hex":"xyz","model_name":"m","kv_rank":0}}]}]}"#.to_owned(),
            r#"{"batches":[{"instance_id":"x","incarnation":"1","seq":1,"event_type":"store","tier":"l1","backend":"d"}]}"#.to_owned(),
            r#"{"batches":[{"instance_id":"x","incarnation":1,"seq":1,"event_type":"store","tier":"all","backend":"d"}]}"#.to_owned(),
            r#"{"batches":[{"instance_id":"x","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d","entries":[{"key":{"chunk_hash_hex":"00","model_name":"m@x","kv_rank":0}}]}]}"#.to_owned(),
            r#"{"batches":[{"instance_id":"x","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d","entries":[{"key":{"chunk_hash_hex":"00","model_name":"m","kv_rank":0},"size_bytes":-1}]}]}"#.to_owned(),
            r#"{"batches":[{"instance_id":"x","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d","entries":[{"key":{"chunk_hash_hex":"00","model_name":"m","kv_rank":0},"token_offset":-2}]}]}"#.to_owned(),
            "not json".to_owned(),
        ];
        let mut accepted = 0;
        for body in &bodies {
            let owned = parse(body).ok();
            assert_eq!(decode_valid(body.as_bytes()), owned, "{body}");
            accepted += usize::from(owned.is_some());
        }
        assert_eq!(accepted, 5);
        let escaped = decode_valid(bodies[1].as_bytes()).unwrap();
        assert_eq!(escaped[0].instance_id, "mp-1");
        assert_eq!(escaped[0].entries[0].key.model_name, "m\"x");
        assert_eq!(escaped[0].entries[0].key.cache_salt, "s\u{e9}");
        assert_eq!(escaped[0].entries[0].key.chunk_hash, vec![0, 0xff]);
        assert_eq!(decode_valid(b"{\"batches\":[\xff]}"), None);
    }
}
