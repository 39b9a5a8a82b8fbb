//! Wire ↔ index vocabulary.

use ic_index::{HashScheme, Scope};
use ic_proto::index_v1 as pb;

/// Tenant of the functional probe's synthetic replicas: not a namespace
/// name, so no request from the wire can name it.
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
    let hash_scheme = match pb::HashScheme::try_from(scope.hash_scheme) {
        Ok(pb::HashScheme::Vllm) => HashScheme::Vllm,
        Ok(pb::HashScheme::Sglang) => HashScheme::Sglang,
        _ => {
            return Err(format!(
                "{path}.hash_scheme: must be HASH_SCHEME_VLLM or HASH_SCHEME_SGLANG"
            ));
        }
    };
    Ok(Scope {
        tenant: scope.tenant.clone(),
        model: scope.model.clone(),
        hash_scheme,
        adapter: scope.adapter.clone(),
    })
}

/// Whether `s` is a valid namespace name (an RFC 1123 label). Tenants are
/// namespaces; enforcing it also keeps the functional probe's own tenant
/// unreachable from the wire.
pub fn is_namespace_name(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len())
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-')
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
