//! CacheBackend validation as pure functions: the structural rules of the
//! validating admission webhook, as an ordered list the webhook runs in
//! turn, and the UPDATE filter that only reports violations an update
//! introduces.
//!
//! Not here (they need the adapter registry, `libs/adapters`): the
//! runtime/cache-pair registry check with its SupportedPairs message, the
//! engineOverrides reserved-args/env check, and the provider resource-block
//! checks.

use std::net::IpAddr;

use crate::cachebackend::{
    CacheBackendSpec, CacheType, IntegrationMode, IntegrationRole, Ownership, Runtime,
    StorageProvider,
};

/// Kind of a violation (the Kubernetes field-error types used here).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorType {
    /// A required field is missing.
    Required,
    /// A field that must not be set is set.
    Forbidden,
    /// A value is not valid.
    Invalid,
    /// A value is not one of the supported ones.
    NotSupported,
}

/// One violation, scoped to a field path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldError {
    /// Kind.
    pub kind: ErrorType,
    /// Field path, e.g. `spec.remoteStorage.endpoint`.
    pub field: String,
    /// The offending value, when there is one.
    pub bad_value: Option<String>,
    /// What is wrong and how to fix it.
    pub detail: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.bad_value {
            Some(v) => write!(f, "{}: Invalid value: {v:?}: {}", self.field, self.detail),
            None => write!(f, "{}: {}", self.field, self.detail),
        }
    }
}

fn error(
    kind: ErrorType,
    field: &str,
    bad_value: Option<String>,
    detail: impl Into<String>,
) -> FieldError {
    FieldError {
        kind,
        field: field.to_owned(),
        bad_value,
        detail: detail.into(),
    }
}

/// What a rule sees.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    /// The CacheBackend's namespace.
    pub namespace: &'a str,
    /// Its spec.
    pub spec: &'a CacheBackendSpec,
}

/// A structural rule: every violation it finds.
pub type Rule = fn(&Subject<'_>) -> Vec<FieldError>;

/// The structural rules, in the order they run (and report).
pub const RULES: &[(&str, Rule)] = &[
    ("cache-hierarchy", cache_hierarchy),
    ("endpoint-ownership", endpoint_ownership),
    ("cross-namespace-endpoint", cross_namespace_endpoint),
    ("zero-replicas-autoscaling", zero_replicas_autoscaling),
    ("events-only", events_only),
    ("sglang-role", sglang_role),
    ("engine-host-network", engine_host_network),
    ("mooncake-singleton", mooncake_singleton),
];

/// Every structural violation of `subject`, rule by rule.
pub fn validate(subject: &Subject<'_>) -> Vec<FieldError> {
    RULES.iter().flat_map(|(_, rule)| rule(subject)).collect()
}

/// The violations of an update that the previous object did not already
/// have (compared by type, field, bad value and detail), so an unrelated
/// edit of an object admitted under laxer rules still goes through.
pub fn introduced(old: &[FieldError], new: Vec<FieldError>) -> Vec<FieldError> {
    new.into_iter().filter(|e| !old.contains(e)).collect()
}

/// A trimmed endpoint, `None` when absent or whitespace only.
pub fn trimmed_endpoint(spec: &CacheBackendSpec) -> Option<&str> {
    spec.remote_storage
        .as_ref()?
        .endpoint
        .as_deref()
        .map(str::trim)
        .filter(|e| !e.is_empty())
}

fn cache_hierarchy(s: &Subject<'_>) -> Vec<FieldError> {
    let spec = s.spec;
    let mut out = Vec::new();
    if spec.lm_cache.is_some() && spec.r#type != CacheType::LMCache {
        out.push(error(
            ErrorType::Forbidden,
            "spec.lmCache",
            None,
            "lmCache configures the LMCache engine cache; spec.type is SGLangHiCache",
        ));
    }
    if spec.hi_cache.is_some() && spec.r#type != CacheType::SGLangHiCache {
        out.push(error(
            ErrorType::Forbidden,
            "spec.hiCache",
            None,
            "hiCache configures SGLang's native hierarchical cache; spec.type is LMCache",
        ));
    }
    match &spec.remote_storage {
        Some(rs) => {
            let typed = [
                ("redis", StorageProvider::Redis, rs.redis.is_some()),
                (
                    "lmCacheServer",
                    StorageProvider::LMCacheServer,
                    rs.lm_cache_server.is_some(),
                ),
                ("mooncake", StorageProvider::Mooncake, rs.mooncake.is_some()),
            ];
            for (name, provider, set) in typed {
                if !set {
                    continue;
                }
                let field = format!("spec.remoteStorage.{name}");
                if provider != rs.provider {
                    out.push(error(
                        ErrorType::Forbidden,
                        &field,
                        None,
                        format!("does not match remoteStorage.provider {:?}", rs.provider),
                    ));
                } else if rs.ownership == Ownership::External {
                    out.push(error(
                        ErrorType::Forbidden,
                        &field,
                        None,
                        "workload settings apply to Managed providers only; an External provider is run by its operator",
                    ));
                }
            }
            if rs.ownership == Ownership::External && spec.autoscaling.is_some() {
                out.push(error(
                    ErrorType::Forbidden,
                    "spec.autoscaling",
                    None,
                    "an External provider has no workload to autoscale",
                ));
            }
        }
        None => {
            if spec.autoscaling.is_some() && spec.integration_mode() == IntegrationMode::Offload {
                out.push(error(
                    ErrorType::Forbidden,
                    "spec.autoscaling",
                    None,
                    "host-only configuration (no remoteStorage) has no workload to autoscale",
                ));
            }
        }
    }
    out
}

fn endpoint_ownership(s: &Subject<'_>) -> Vec<FieldError> {
    let Some(rs) = &s.spec.remote_storage else {
        return Vec::new();
    };
    let raw = rs.endpoint.as_deref().unwrap_or_default();
    let endpoint = trimmed_endpoint(s.spec);
    match (rs.ownership, endpoint) {
        (Ownership::External, None) => vec![error(
            ErrorType::Required,
            "spec.remoteStorage.endpoint",
            None,
            "required when ownership is External",
        )],
        (Ownership::Managed, Some(e)) => vec![error(
            ErrorType::Forbidden,
            "spec.remoteStorage.endpoint",
            Some(e.to_owned()),
            "must be empty when ownership is Managed: the endpoint comes from the Service the controller provisions",
        )],
        (Ownership::External, Some(e)) if e.chars().any(char::is_whitespace) => vec![error(
            ErrorType::Invalid,
            "spec.remoteStorage.endpoint",
            Some(raw.to_owned()),
            "must not contain whitespace",
        )],
        _ => Vec::new(),
    }
}

/// The namespace a Service host names, if any: `<svc>.<ns>`,
/// `<svc>.<ns>.svc[.<domain>]`, `<pod>.<svc>.<ns>.svc[.<domain>]`.
pub fn host_namespace(endpoint: &str) -> Option<&str> {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    let host = rest.split(['/', '?']).next().unwrap_or(rest);
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.parse::<IpAddr>().is_ok() {
        return None;
    }
    let labels: Vec<&str> = host.split('.').collect();
    match labels.as_slice() {
        [_, ns] => Some(ns),
        [_, ns, "svc", ..] => Some(ns),
        [_, _, ns, "svc", ..] => Some(ns),
        _ => None,
    }
}

fn cross_namespace_endpoint(s: &Subject<'_>) -> Vec<FieldError> {
    let Some(endpoint) = trimmed_endpoint(s.spec) else {
        return Vec::new();
    };
    match host_namespace(endpoint) {
        Some(ns) if ns != s.namespace && s.spec.allow_cross_namespace != Some(true) => {
            vec![error(
                ErrorType::Forbidden,
                "spec.remoteStorage.endpoint",
                Some(endpoint.to_owned()),
                format!(
                    "names a Service in namespace {ns:?}, not {:?}: set spec.allowCrossNamespace: true to cross the tenancy boundary",
                    s.namespace
                ),
            )]
        }
        _ => Vec::new(),
    }
}

fn zero_replicas_autoscaling(s: &Subject<'_>) -> Vec<FieldError> {
    match &s.spec.autoscaling {
        Some(a) if s.spec.replicas == 0 && a.min_replicas.is_none() => vec![error(
            ErrorType::Required,
            "spec.autoscaling.minReplicas",
            None,
            "spec.replicas is 0: set autoscaling.minReplicas explicitly, or remove spec.autoscaling to scale to zero",
        )],
        _ => Vec::new(),
    }
}

fn events_only(s: &Subject<'_>) -> Vec<FieldError> {
    let spec = s.spec;
    if spec.integration_mode() != IntegrationMode::EventsOnly {
        return Vec::new();
    }
    let mut out = Vec::new();
    if spec.r#type != CacheType::LMCache {
        out.push(error(
            ErrorType::Invalid,
            "spec.type",
            Some(format!("{:?}", spec.r#type)),
            "integration.mode EventsOnly requires type LMCache (events-only wires no KV connector)",
        ));
    }
    if spec.remote_storage.is_some() {
        out.push(error(
            ErrorType::Forbidden,
            "spec.remoteStorage",
            None,
            "integration.mode EventsOnly provisions and wires no offload provider",
        ));
    }
    if spec.autoscaling.is_some() {
        out.push(error(
            ErrorType::Forbidden,
            "spec.autoscaling",
            None,
            "integration.mode EventsOnly has no server workload to autoscale",
        ));
    }
    out
}

fn sglang_role(s: &Subject<'_>) -> Vec<FieldError> {
    let role = s
        .spec
        .integration
        .as_ref()
        .map_or(IntegrationRole::ReadWrite, |i| i.role);
    if s.spec.runtime == Runtime::SGLang && role != IntegrationRole::ReadWrite {
        vec![error(
            ErrorType::NotSupported,
            "spec.integration.role",
            Some(format!("{role:?}")),
            "SGLang's cache integrations always store and retrieve: only ReadWrite is supported",
        )]
    } else {
        Vec::new()
    }
}

fn engine_host_network(s: &Subject<'_>) -> Vec<FieldError> {
    let wanted = s
        .spec
        .integration
        .as_ref()
        .and_then(|i| i.engine_host_network)
        == Some(true);
    let mooncake = s
        .spec
        .remote_storage
        .as_ref()
        .is_some_and(|r| r.provider == StorageProvider::Mooncake);
    if wanted && !mooncake {
        vec![error(
            ErrorType::Forbidden,
            "spec.integration.engineHostNetwork",
            Some("true".into()),
            "only Mooncake's transfer mesh needs engine pods on the host network",
        )]
    } else {
        Vec::new()
    }
}

fn mooncake_singleton(s: &Subject<'_>) -> Vec<FieldError> {
    let managed_mooncake = s.spec.remote_storage.as_ref().is_some_and(|r| {
        r.provider == StorageProvider::Mooncake && r.ownership == Ownership::Managed
    });
    if !managed_mooncake {
        return Vec::new();
    }
    let mut out = Vec::new();
    if s.spec.replicas > 1 {
        out.push(error(
            ErrorType::Invalid,
            "spec.replicas",
            Some(s.spec.replicas.to_string()),
            "a managed Mooncake master is a singleton: at most 1 replica",
        ));
    }
    if s.spec.autoscaling.is_some() {
        out.push(error(
            ErrorType::Forbidden,
            "spec.autoscaling",
            None,
            "a managed Mooncake master is a singleton and cannot autoscale",
        ));
    }
    out
}

#[cfg(test)]
mod tests;
