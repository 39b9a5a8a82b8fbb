//! Typed decoding that names the field: an object the API server stored
//! (or is about to) but our types refuse — an unknown enum value, a missing
//! required field, a wrong type — becomes a [`FieldError`] at the field's
//! path, the way the API server's own schema errors read.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::validate::{ErrorType, FieldError};

/// Decodes `value` as a `T`, or the field error that stopped it.
pub fn decode<T: DeserializeOwned>(value: &Value) -> Result<T, FieldError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        field_error(if path == "." { "" } else { &path }, &e.inner().to_string())
    })
}

/// The backquoted words of a serde message, in order.
fn quoted(message: &str) -> Vec<&str> {
    message.split('`').skip(1).step_by(2).collect()
}

fn join(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

fn field_error(path: &str, message: &str) -> FieldError {
    let words = quoted(message);
    if message.starts_with("missing field") {
        let name = words.first().copied().unwrap_or_default();
        return FieldError {
            kind: ErrorType::Required,
            field: join(path, name),
            bad_value: None,
            detail: "Required value".into(),
        };
    }
    if message.starts_with("unknown variant") {
        let (bad, allowed) = words.split_first().map_or(("", &[][..]), |(b, a)| (*b, a));
        return FieldError {
            kind: ErrorType::NotSupported,
            field: path.to_owned(),
            bad_value: Some(bad.to_owned()),
            detail: format!(
                "supported values: {}",
                allowed
                    .iter()
                    .map(|a| format!("{a:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
    }
    if message.starts_with("unknown field") {
        return FieldError {
            kind: ErrorType::Invalid,
            field: join(path, words.first().copied().unwrap_or_default()),
            bad_value: None,
            detail: "unknown field".into(),
        };
    }
    FieldError {
        kind: ErrorType::Invalid,
        field: if path.is_empty() {
            "<root>".into()
        } else {
            path.to_owned()
        },
        bad_value: None,
        detail: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CacheBackend;
    use serde_json::json;

    fn backend(spec: Value) -> Value {
        json!({
            "apiVersion": "inferencecache.io/v1alpha1",
            "kind": "CacheBackend",
            "metadata": {"name": "cb", "namespace": "ns"},
            "spec": spec,
        })
    }

    #[test]
    fn an_unknown_enum_value_names_the_field_and_the_accepted_values() {
        let e = decode::<CacheBackend>(&backend(json!({"runtime": "vllm", "type": "LMCache"})))
            .unwrap_err();
        assert_eq!(e.field, "spec.runtime");
        assert_eq!(e.kind, ErrorType::NotSupported);
        assert_eq!(e.bad_value.as_deref(), Some("vllm"));
        assert!(e.detail.contains("\"VLLM\""), "{e:?}");
    }

    #[test]
    fn a_missing_field_is_required_at_its_path() {
        let e = decode::<CacheBackend>(&backend(json!({"type": "LMCache"}))).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.kind),
            ("spec.runtime", ErrorType::Required)
        );
        let e =
            decode::<CacheBackend>(&json!({"kind": "CacheBackend", "metadata": {}})).unwrap_err();
        assert_eq!(e.field, "spec");
    }

    #[test]
    fn a_wrong_type_is_invalid_at_its_path() {
        let e = decode::<CacheBackend>(&backend(json!({
            "runtime": "VLLM", "type": "LMCache", "lmCache": {"chunkSizeTokens": "many"}
        })))
        .unwrap_err();
        assert_eq!(e.field, "spec.lmCache.chunkSizeTokens");
        assert_eq!(e.kind, ErrorType::Invalid);
        assert!(e.detail.contains("invalid type"), "{e:?}");
    }
}
