//! Wire ↔ index vocabulary.

use ic_index::{HashScheme, Scope, Tier};
use ic_proto::index_v1 as pb;

/// A request scope, validated; the error names the offending field under `path`.
pub fn scope_from_pb(scope: Option<&pb::IndexScope>, path: &str) -> Result<Scope, String> {
    let scope = scope.ok_or_else(|| format!("{path}: required"))?;
    if scope.tenant.is_empty() {
        return Err(format!("{path}.tenant: required"));
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

/// A wire tier, `None` when unspecified or unknown.
pub fn tier_from_pb(tier: i32) -> Option<Tier> {
    match pb::Tier::try_from(tier) {
        Ok(pb::Tier::T1) => Some(Tier::T1),
        Ok(pb::Tier::T2) => Some(Tier::T2),
        _ => None,
    }
}

/// An index tier on the wire.
pub fn tier_to_pb(tier: Tier) -> i32 {
    match tier {
        Tier::T1 => pb::Tier::T1 as i32,
        Tier::T2 => pb::Tier::T2 as i32,
    }
}
