//! The metadata file: operator intent (quotas and pins), pretty JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::eviction::Quotas;
use crate::key::{ObjectKey, WireKey};
use crate::pins::Pins;

/// Format version written and accepted.
pub const VERSION: u64 = 1;

/// Why a metadata document was ignored.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// Not JSON, or not the expected shape.
    #[error("metadata is not a valid document: {0}")]
    Malformed(#[from] serde_json::Error),
    /// Another version.
    #[error("unsupported metadata version {0}")]
    Version(u64),
}

#[derive(Serialize, Deserialize)]
struct Document {
    version: u64,
    saved_at: f64,
    components: Components,
}

#[derive(Serialize, Deserialize, Default)]
struct Components {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pins: Option<PinsSection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quotas: Option<QuotasSection>,
}

#[derive(Serialize, Deserialize)]
struct PinsSection {
    entries: Vec<PinEntry>,
}

#[derive(Serialize, Deserialize)]
struct PinEntry {
    key: WireKey,
    count: i64,
}

#[derive(Serialize, Deserialize)]
struct QuotasSection {
    #[serde(default)]
    limits: BTreeMap<String, u64>,
    #[serde(default)]
    default_limit_bytes: Option<u64>,
}

/// What the file holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    /// Pins (absent section = none).
    pub pins: Pins,
    /// Quotas.
    pub quotas: Quotas,
}

/// Renders the document, stamped `saved_at` (epoch seconds).
pub fn encode(meta: &Metadata, saved_at: f64) -> Vec<u8> {
    let doc = Document {
        version: VERSION,
        saved_at,
        components: Components {
            pins: Some(PinsSection {
                entries: meta
                    .pins
                    .iter()
                    .map(|(k, c)| PinEntry {
                        key: k.to_wire(),
                        count: i64::try_from(c).unwrap_or(i64::MAX),
                    })
                    .collect(),
            }),
            quotas: Some(QuotasSection {
                limits: meta.quotas.limits.clone(),
                default_limit_bytes: meta.quotas.default_limit,
            }),
        },
    };
    // Serializing plain structs with string keys cannot fail.
    serde_json::to_vec_pretty(&doc).unwrap_or_default()
}

/// Parses a document. Pin entries with a count ≤ 0 or an invalid key are dropped.
pub fn decode(raw: &[u8]) -> Result<Metadata, MetadataError> {
    let doc: Document = serde_json::from_slice(raw)?;
    if doc.version != VERSION {
        return Err(MetadataError::Version(doc.version));
    }
    let mut meta = Metadata::default();
    if let Some(pins) = doc.components.pins {
        for e in pins.entries {
            if let (Ok(key), Ok(count)) = (ObjectKey::from_wire(&e.key), u64::try_from(e.count)) {
                meta.pins.restore(key, count);
            }
        }
    }
    if let Some(q) = doc.components.quotas {
        meta.quotas = Quotas {
            limits: q.limits,
            default_limit: q.default_limit_bytes,
        };
    }
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::key;

    #[test]
    fn round_trips() {
        let mut meta = Metadata::default();
        meta.pins.pin([&key(1, "t"), &key(1, "t"), &key(2, "")]);
        meta.quotas.limits.insert("t".into(), 1 << 30);
        meta.quotas.default_limit = Some(2_684_354_560);
        let raw = encode(&meta, 1_796_011_424.62);
        let text = String::from_utf8(raw.clone()).unwrap();
        assert!(text.contains("\n  \"version\": 1"), "{text}");
        assert_eq!(decode(&raw).unwrap(), meta);
    }

    #[test]
    fn rejects_bad_documents_and_drops_bad_pins() {
        assert!(decode(b"not json").is_err());
        assert!(decode(br#"{"version":2,"saved_at":1,"components":{}}"#).is_err());
        assert!(
            decode(br#"{"version":1,"components":{}}"#).is_err(),
            "saved_at required"
        );
        assert!(decode(br#"{"version":1,"saved_at":"x","components":{}}"#).is_err());
        assert!(
            decode(br#"{"version":1,"saved_at":1}"#).is_err(),
            "components required"
        );
        let m = decode(
            br#"{"version":1,"saved_at":1,"components":{"pins":{"entries":[
                {"key":{"chunk_hash_hex":"aa","model_name":"m","kv_rank":1},"count":0},
                {"key":{"chunk_hash_hex":"bb","model_name":"m","kv_rank":1},"count":-2},
                {"key":{"chunk_hash_hex":"cc","model_name":"m","kv_rank":1},"count":3}]}}}"#,
        )
        .unwrap();
        assert_eq!(m.pins.len(), 1);
        assert_eq!(m.quotas, Quotas::default());
    }
}
