//! Protobuf contract ↔ index vocabulary.

use ic_index::route::NoHintReason;
use ic_index::{HashScheme, Scope};
use ic_kvevents::{ExtraKey, MediaSpan, PromptExtras};
use ic_proto::index_v1 as pb;

/// Tenant of the functional probe's synthetic replicas: not a namespace
/// name, so no request can name it.
pub const PROBE_TENANT: &str = "~probe";

/// A request scope, validated; the error names the offending field under `path`.
pub fn scope_from_pb(scope: Option<&pb::IndexScope>, path: &str) -> Result<Scope, String> {
    checked_scope(scope, path, false)
}

/// Like [`scope_from_pb`], also admitting [`PROBE_TENANT`] (in-process use).
pub(crate) fn checked_scope(
    scope: Option<&pb::IndexScope>,
    path: &str,
    allow_probe_tenant: bool,
) -> Result<Scope, String> {
    let scope = scope.ok_or_else(|| format!("{path}: required"))?;
    let hash_scheme = checked_fields(scope, path, allow_probe_tenant)?;
    Ok(Scope {
        tenant: scope.tenant.clone(),
        model: scope.model.clone(),
        hash_scheme,
        adapter: scope.adapter.clone(),
    })
}

/// [`scope_from_pb`] of a scope the caller gives up: its names move into
/// the [`Scope`] instead of being copied (a LookupRoute's request).
pub fn scope_from_pb_owned(scope: Option<pb::IndexScope>, path: &str) -> Result<Scope, String> {
    let scope = scope.ok_or_else(|| format!("{path}: required"))?;
    let hash_scheme = checked_fields(&scope, path, false)?;
    Ok(Scope {
        tenant: scope.tenant,
        model: scope.model,
        hash_scheme,
        adapter: scope.adapter,
    })
}

/// Checks a scope's fields; its hash scheme when they are valid.
fn checked_fields(
    scope: &pb::IndexScope,
    path: &str,
    allow_probe_tenant: bool,
) -> Result<HashScheme, String> {
    if scope.tenant.is_empty() {
        return Err(format!("{path}.tenant: required"));
    }
    let probe = allow_probe_tenant && scope.tenant == PROBE_TENANT;
    if !probe && !is_namespace_name(&scope.tenant) {
        return Err(format!(
            "{path}.tenant: {:?} is not a Kubernetes namespace name (lowercase letters, \
             digits and '-', at most 63 characters)",
            scope.tenant
        ));
    }
    if scope.model.is_empty() {
        return Err(format!("{path}.model: required"));
    }
    match pb::HashScheme::try_from(scope.hash_scheme) {
        Ok(pb::HashScheme::Vllm) => Ok(HashScheme::Vllm),
        Ok(pb::HashScheme::Sglang) => Ok(HashScheme::Sglang),
        _ => Err(format!(
            "{path}.hash_scheme: must be HASH_SCHEME_VLLM or HASH_SCHEME_SGLANG"
        )),
    }
}

/// Why a lookup's extra keys were refused: `limit` names the bound (the
/// `lookups_refused_total` label) when one was passed.
#[derive(Debug, PartialEq, Eq)]
pub struct ExtrasRefused {
    /// The bound passed, if that is why.
    pub limit: Option<&'static str>,
    /// What is wrong, naming the field (and the flag).
    pub detail: String,
}

impl From<String> for ExtrasRefused {
    fn from(detail: String) -> Self {
        Self {
            limit: None,
            detail,
        }
    }
}

/// A lookup's extra keys, validated against `limits`; `None` when it has
/// none. They only apply to token keys: fingerprints sent by the gateway
/// already have them.
pub fn extras_from_pb(
    req: &pb::LookupRouteRequest,
    limits: &crate::grpc::LookupLimits,
) -> Result<Option<PromptExtras>, ExtrasRefused> {
    use pb::lookup_route_request::Key;
    let any =
        !req.cache_salt.is_empty() || !req.media.is_empty() || !req.block_extra_keys.is_empty();
    if !any {
        return Ok(None);
    }
    if matches!(req.key, Some(Key::PrefixHash(_) | Key::BlockHashes(_))) {
        let field = if !req.cache_salt.is_empty() {
            "cache_salt"
        } else if !req.media.is_empty() {
            "media"
        } else {
            "block_extra_keys"
        };
        return Err(format!(
            "{field}: only with token_ids or prompt_text (prefix_hash and block_hashes are \
             fingerprints, computed with the extra keys already; see docs/fingerprints.md)"
        )
        .into());
    }
    let max_bytes = limits.max_extra_key_bytes;
    let max_entries = limits.max_extra_entries;
    let too_long = |field: &str| ExtrasRefused {
        limit: Some("extra_key_bytes"),
        detail: format!("{field}: longer than {max_bytes} bytes (--max-extra-key-bytes)"),
    };
    let too_many = |field: &str, what: &str| ExtrasRefused {
        limit: Some("extra_entries"),
        detail: format!("{field}: at most {max_entries} {what} (--max-extra-entries)"),
    };
    let bounded = |field: String, s: &str| {
        if s.len() > max_bytes {
            Err(too_long(&field))
        } else {
            Ok(())
        }
    };
    bounded("cache_salt".into(), &req.cache_salt)?;
    if req.media.len() > max_entries {
        return Err(too_many("media", "items"));
    }
    let mut media = Vec::with_capacity(req.media.len());
    for (i, m) in req.media.iter().enumerate() {
        if m.identifier.is_empty() {
            return Err(format!("media[{i}].identifier: required").into());
        }
        bounded(format!("media[{i}].identifier"), &m.identifier)?;
        if m.length == 0 {
            return Err(format!("media[{i}].length: must be at least 1").into());
        }
        media.push(MediaSpan {
            identifier: m.identifier.clone(),
            offset: u64::from(m.offset),
            length: u64::from(m.length),
        });
    }
    if req.block_extra_keys.len() > max_entries {
        return Err(too_many("block_extra_keys", "blocks"));
    }
    // The keys of all blocks together, too: one block could carry them all.
    let keys_in_all: usize = req.block_extra_keys.iter().map(|b| b.keys.len()).sum();
    if keys_in_all > max_entries {
        return Err(too_many("block_extra_keys[].keys", "keys in all"));
    }
    let mut per_block = Vec::with_capacity(req.block_extra_keys.len());
    for (i, block) in req.block_extra_keys.iter().enumerate() {
        let mut keys = Vec::with_capacity(block.keys.len());
        for (j, key) in block.keys.iter().enumerate() {
            use pb::extra_key_value::Kind;
            let field = format!("block_extra_keys[{i}].keys[{j}]");
            keys.push(match &key.kind {
                Some(Kind::Key(s)) => {
                    bounded(field, s)?;
                    ExtraKey::Key(s.clone())
                }
                Some(Kind::Digest(b)) => {
                    if b.len() > max_bytes {
                        return Err(too_long(&format!("{field}.digest")));
                    }
                    ExtraKey::Digest(b.clone())
                }
                None => return Err(format!("{field}: one of key, digest is required").into()),
            });
        }
        per_block.push(keys);
    }
    Ok(Some(PromptExtras {
        adapter: String::new(),
        media,
        cache_salt: req.cache_salt.clone(),
        per_block,
    }))
}

/// Whether `s` is a valid namespace name (an RFC 1123 label). Tenants are
/// namespaces; enforcing it also keeps the functional probe's own tenant
/// unreachable from any request.
pub fn is_namespace_name(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len())
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-')
}

/// A NO_HINT reason in the protobuf contract.
pub(crate) fn reason_to_pb(reason: NoHintReason) -> pb::NoHintReason {
    match reason {
        NoHintReason::UnknownModel => pb::NoHintReason::UnknownModel,
        NoHintReason::PromptTooShort => pb::NoHintReason::PromptTooShort,
        NoHintReason::NoEntry => pb::NoHintReason::NoEntry,
        NoHintReason::BelowMinimumPrefix => pb::NoHintReason::BelowMinimumPrefix,
        NoHintReason::LookupTimeout => pb::NoHintReason::LookupTimeout,
        NoHintReason::LoadBound => pb::NoHintReason::LoadBound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names() {
        for ok in ["a", "team-a", "0", "a1-b2", &"x".repeat(63)] {
            assert!(is_namespace_name(ok), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "~probe",
            &"x".repeat(64),
            "é",
        ] {
            assert!(!is_namespace_name(bad), "{bad}");
        }
    }
}
