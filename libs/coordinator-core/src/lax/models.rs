//! The reference's request models (LMCache 0.5.6 `mp_coordinator/schemas.py`,
//! `api.py`, and the handlers' query parameters): field order, types,
//! bounds, defaults that matter to validation, and the validators' messages.

use serde_json::{Map, Value};

use super::{Field, INT, Model, STR, Ty, fromhex_error, py_float};

const TIER: &[&str] = &["l1", "l2", "all"];
const EVENT_TYPE: &[&str] = &["store", "delete", "access", "config"];
const INTS: Ty = Ty::List(&INT);
const WORLD_SIZE: Ty = Ty::Int {
    ge: Some(1),
    le: None,
};

const fn f(name: &'static str, ty: Ty, required: bool) -> Field {
    Field {
        name,
        ty,
        required,
        check: None,
    }
}

fn int_of(m: &Map<String, Value>, k: &str, default: i64) -> i64 {
    m.get(k).and_then(Value::as_i64).unwrap_or(default)
}

fn str_of<'a>(m: &'a Map<String, Value>, k: &str) -> &'a str {
    m.get(k).and_then(Value::as_str).unwrap_or("")
}

fn non_empty_list(m: &Map<String, Value>, k: &str) -> bool {
    m.get(k)
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
}

/// `EncodedObjectKey`.
pub static KEY: Model = Model {
    name: "EncodedObjectKey",
    fields: &[
        f("chunk_hash_hex", STR, true),
        f("model_name", STR, true),
        f("kv_rank", INT, true),
        f("object_group_id", INT, false),
        f("cache_salt", STR, false),
    ],
    check: None,
};

/// `EncodedObjectKey.to_object_key()`: the checks `ObjectKey` makes.
fn key_converts(key: &Value) -> Result<(), String> {
    let Some(m) = key.as_object() else {
        return Ok(());
    };
    if let Some(e) = fromhex_error(str_of(m, "chunk_hash_hex")) {
        return Err(e);
    }
    crate::key::validate_model(str_of(m, "model_name")).map_err(|e| e.to_string())?;
    let group = int_of(m, "object_group_id", 0);
    if group < 0 {
        return Err(format!("object_group_id must be >= 0 (got {group})"));
    }
    crate::key::validate_salt(str_of(m, "cache_salt")).map_err(|e| e.to_string())
}

fn keys_convert(keys: &Value) -> Result<(), String> {
    keys.as_array()
        .into_iter()
        .flatten()
        .try_for_each(key_converts)
}

/// `CacheEventEntry`.
pub static ENTRY: Model = Model {
    name: "CacheEventEntry",
    fields: &[
        f("key", Ty::Model(&KEY), true),
        f("size_bytes", INT, false),
        f("token_ids", INTS, false),
        f("token_offset", INT, false),
    ],
    check: Some(|m| {
        let size = int_of(m, "size_bytes", 0);
        if size < 0 {
            return Err(format!("size_bytes must be >= 0 (got {size})"));
        }
        let off = int_of(m, "token_offset", -1);
        if off < -1 {
            return Err(format!(
                "token_offset must be >= 0 or UNKNOWN_TOKEN_OFFSET (-1), got {off}"
            ));
        }
        Ok(())
    }),
};

/// `CacheEventBatch`.
pub static BATCH: Model = Model {
    name: "CacheEventBatch",
    fields: &[
        f("instance_id", STR, true),
        f("incarnation", INT, true),
        f("seq", INT, true),
        f("event_type", Ty::Enum(EVENT_TYPE), true),
        f("tier", Ty::Enum(TIER), true),
        f("backend", STR, true),
        f("entries", Ty::List(&Ty::Model(&ENTRY)), false),
        f("shared", Ty::Bool, false),
        f("ts", Ty::Float { ge: None }, false),
        f("capacity_bytes", INT, false),
        f("capacity_revision", INT, false),
    ],
    check: Some(|m| {
        let event_type = str_of(m, "event_type");
        if str_of(m, "instance_id").is_empty() {
            return Err("instance_id must be non-empty".to_owned());
        }
        if str_of(m, "backend").is_empty() && event_type != "access" {
            return Err(format!(
                "backend must be non-empty for {event_type} batches"
            ));
        }
        if event_type == "config" && non_empty_list(m, "entries") {
            return Err("config batches declare capacity and carry no entries".to_owned());
        }
        for k in ["capacity_bytes", "capacity_revision", "incarnation"] {
            let v = int_of(m, k, 0);
            if v < 0 {
                return Err(format!("{k} must be >= 0 (got {v})"));
            }
        }
        let seq = int_of(m, "seq", 1);
        if seq < 1 {
            return Err(format!("seq must be >= 1 (got {seq})"));
        }
        let tier = str_of(m, "tier");
        if tier == "all" {
            return Err(format!(
                "cache events must target a concrete tier (got '{tier}')"
            ));
        }
        let ts = m.get("ts").and_then(Value::as_f64).unwrap_or(0.0);
        if ts < 0.0 {
            return Err(format!("ts must be >= 0 (got {})", py_float(ts)));
        }
        Ok(())
    }),
};

/// `CacheEventsRequest` (`POST /events`).
pub static EVENTS: Model = Model {
    name: "CacheEventsRequest",
    fields: &[Field {
        name: "batches",
        ty: Ty::List(&Ty::Model(&BATCH)),
        required: false,
        check: Some(|batches| {
            batches
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b.get("entries").and_then(Value::as_array))
                .flatten()
                .filter_map(|e| e.get("key"))
                .try_for_each(key_converts)
        }),
    }],
    check: None,
};

/// `RegisterRequest` (`POST /instances`).
pub static REGISTER: Model = Model {
    name: "RegisterRequest",
    fields: &[
        f(
            "instance_id",
            Ty::Str {
                strip: true,
                min_len: 0,
            },
            false,
        ),
        f(
            "ip",
            Ty::Str {
                strip: true,
                min_len: 1,
            },
            true,
        ),
        f(
            "http_port",
            Ty::Int {
                ge: Some(1),
                le: Some(65535),
            },
            true,
        ),
        f("metadata", Ty::DictStrStr, false),
        f(
            "p2p_advertised_url",
            Ty::Str {
                strip: true,
                min_len: 0,
            },
            false,
        ),
        f(
            "mq_port",
            Ty::Int {
                ge: Some(0),
                le: Some(65535),
            },
            false,
        ),
    ],
    check: None,
};

/// `DirectoryLookupRequest` (`POST /directory/lookup`).
pub static LOOKUP: Model = Model {
    name: "DirectoryLookupRequest",
    fields: &[
        Field {
            name: "keys",
            ty: Ty::List(&Ty::Model(&KEY)),
            required: false,
            check: Some(keys_convert),
        },
        f("token_ids", INTS, false),
        f("model_name", STR, false),
        f("world_size", WORLD_SIZE, false),
        f("cache_salt", STR, false),
    ],
    check: Some(|m| {
        let keys = non_empty_list(m, "keys");
        let tokens = non_empty_list(m, "token_ids");
        if keys == tokens {
            return Err("supply exactly one of 'keys' or 'token_ids'".to_owned());
        }
        if tokens && str_of(m, "model_name").is_empty() {
            return Err("'model_name' is required with 'token_ids'".to_owned());
        }
        Ok(())
    }),
};

/// Python 3.11's `base64.b64decode(s, validate=True)` (binascii's strict
/// mode) of `s`: the length of what it decodes, or its first failure in
/// scan order, in its words.
pub fn b64_strict_len(s: &str) -> Result<usize, String> {
    if !s.is_ascii() {
        return Err("string argument should contain only ASCII characters".to_owned());
    }
    let b = s.as_bytes();
    if b.first() == Some(&b'=') {
        return Err("Leading padding not allowed".to_owned());
    }
    // Position in the current quad, pads seen after its second character,
    // whether padding began, bytes out.
    let (mut quad, mut pads, mut padding, mut len) = (0_usize, 0_usize, false, 0_usize);
    for (i, &c) in b.iter().enumerate() {
        if c == b'=' {
            padding = true;
            if quad >= 2 {
                pads += 1;
                if quad + pads >= 4 {
                    if i + 1 < b.len() {
                        return Err("Excess data after padding".to_owned());
                    }
                    return Ok(len);
                }
            }
            continue;
        }
        if !(c.is_ascii_alphanumeric() || c == b'+' || c == b'/') {
            return Err("Only base64 data is allowed".to_owned());
        }
        if padding {
            return Err("Discontinuous padding not allowed".to_owned());
        }
        pads = 0;
        if quad > 0 {
            len += 1;
        }
        quad = (quad + 1) % 4;
    }
    match quad {
        0 => Ok(len),
        1 => Err(format!(
            "Invalid base64-encoded string: number of data characters ({}) cannot be 1 more than a multiple of 4",
            len / 3 * 4 + 1
        )),
        _ => Err("Incorrect padding".to_owned()),
    }
}

/// `b64decode` failures, then the `uint32` length check of `decode_tokens`.
fn tokens_b64(v: &Value) -> Result<(), String> {
    let bytes = b64_strict_len(v.as_str().unwrap_or(""))
        .map_err(|e| format!("tokens_b64 is not valid base64: {e}"))?;
    if !bytes.is_multiple_of(4) {
        return Err(format!(
            "tokens_b64 byte length {bytes} is not a multiple of 4 (malformed uint32 token buffer)"
        ));
    }
    Ok(())
}

/// `BlendLookupRequest` (`POST /directory/blend-lookup`).
pub static BLEND: Model = Model {
    name: "BlendLookupRequest",
    fields: &[
        Field {
            name: "tokens_b64",
            ty: STR,
            required: false,
            check: Some(tokens_b64),
        },
        f("model_name", STR, false),
        f("world_size", WORLD_SIZE, false),
        f("cache_salt", STR, false),
    ],
    check: Some(|m| {
        if !str_of(m, "tokens_b64").is_empty() && str_of(m, "model_name").is_empty() {
            return Err("'model_name' is required with 'tokens_b64'".to_owned());
        }
        Ok(())
    }),
};

/// `PrefetchRequest` (`POST /cache/prefetches`).
pub static PREFETCH: Model = Model {
    name: "PrefetchRequest",
    fields: &[
        f("instance_id", STR, true),
        f("model_name", STR, true),
        f("world_size", WORLD_SIZE, true),
        f("token_ids", INTS, false),
        f("cache_salt", STR, false),
    ],
    check: None,
};

/// `PinRequest` (`POST`/`DELETE /cache/pins`).
pub static PIN: Model = Model {
    name: "PinRequest",
    fields: &[
        f("model_name", STR, true),
        f("world_size", WORLD_SIZE, true),
        f("token_ids", INTS, false),
        f("cache_salt", STR, false),
    ],
    check: None,
};

/// `DeleteRequest` (`POST /cache/delete`).
pub static DELETE: Model = Model {
    name: "DeleteRequest",
    fields: &[
        f("instance_id", STR, true),
        f("model_name", STR, true),
        f("world_size", WORLD_SIZE, true),
        f("token_ids", INTS, false),
        f("cache_salt", STR, false),
        f("tier", Ty::Enum(TIER), false),
        f("force", Ty::Bool, false),
    ],
    check: None,
};

/// `SetQuotaRequest` (`PUT /quota/{cache_salt}`).
pub static SET_QUOTA: Model = Model {
    name: "SetQuotaRequest",
    fields: &[
        f("limit_gb", Ty::Float { ge: Some(0.0) }, true),
        f("tier", Ty::Enum(TIER), false),
    ],
    check: None,
};

/// `QuotaConfigRequest` (`PUT /quota/config`).
pub static QUOTA_CONFIG: Model = Model {
    name: "QuotaConfigRequest",
    fields: &[
        f("default_limit_gb", Ty::OptFloat { ge: Some(0.0) }, false),
        f("tier", Ty::Enum(TIER), false),
    ],
    check: None,
};

const OFFSET: Ty = Ty::Int {
    ge: Some(0),
    le: None,
};
const LIMIT: Ty = Ty::Int {
    ge: Some(1),
    le: Some(10_000),
};

/// Query of `GET /directory/keys`.
pub static KEYS_QUERY: Model = Model {
    name: "query",
    fields: &[
        f("tier", Ty::Enum(TIER), false),
        f("instance_id", STR, false),
        f("backend", STR, false),
        f("offset", OFFSET, false),
        f("limit", LIMIT, false),
    ],
    check: None,
};

/// Query of `GET /cache/pins`.
pub static PINS_QUERY: Model = Model {
    name: "query",
    fields: &[
        f("cache_salt", STR, false),
        f("model_name", STR, false),
        f("offset", OFFSET, false),
        f("limit", LIMIT, false),
    ],
    check: None,
};

/// The `tier` query of the quota endpoints.
pub static TIER_QUERY: Model = Model {
    name: "query",
    fields: &[f("tier", Ty::Enum(TIER), false)],
    check: None,
};

/// A query-less endpoint (every parameter ignored).
pub static NO_QUERY: Model = Model {
    name: "query",
    fields: &[],
    check: None,
};
