//! Provider resource-block rules (`spec.remoteStorage.<provider>.resources`),
//! mirroring what the apiserver would later reject on the rendered pod so
//! the operator sees a field-scoped error at apply time instead:
//! claims, resource names, non-negative and parseable quantities, whole
//! extended resources, page-aligned hugepages, and the two request/limit
//! regimes (overcommittable: limit ≥ request; hugepages and extended:
//! limit = request, and never requests-only).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use ic_api::validate::{ErrorType, FieldError};

use crate::quantity::{self, ParsedQuantity};

/// How the apiserver treats a resource name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceKind {
    /// cpu, memory, ephemeral-storage: requests may be below limits.
    Overcommittable,
    /// `hugepages-<size>` with its page size.
    HugePages(ParsedQuantity),
    /// A vendor-prefixed extended resource (`nvidia.com/gpu`).
    Extended,
}

fn dns_label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

fn qualified_name_part(n: &str) -> bool {
    let edge = |b: u8| b.is_ascii_alphanumeric();
    !n.is_empty()
        && n.len() <= 63
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && n.bytes().next().is_some_and(edge)
        && n.bytes().last().is_some_and(edge)
}

/// Classifies a container resource name, or says why it is invalid.
pub fn classify(name: &str) -> Result<ResourceKind, String> {
    match name {
        "cpu" | "memory" | "ephemeral-storage" => return Ok(ResourceKind::Overcommittable),
        _ => {}
    }
    if let Some(size) = name.strip_prefix("hugepages-") {
        return match quantity::parse(size) {
            Ok(q) if q.is_positive() => Ok(ResourceKind::HugePages(q)),
            _ => Err(format!(
                "hugepages resources need a positive page size suffix, e.g. hugepages-2Mi (got {size:?})"
            )),
        };
    }
    let Some((prefix, rest)) = name.split_once('/') else {
        return Err(
            "must be cpu, memory, ephemeral-storage, hugepages-<size>, or a vendor-prefixed extended resource such as nvidia.com/gpu"
                .into(),
        );
    };
    let prefix_ok = !prefix.is_empty() && prefix.len() <= 253 && prefix.split('.').all(dns_label);
    if !prefix_ok || !qualified_name_part(rest) {
        return Err("is not a valid qualified name (<dns-subdomain>/<name>)".into());
    }
    if prefix == "kubernetes.io" || prefix.ends_with(".kubernetes.io") {
        return Err("the kubernetes.io/ prefixes are reserved for native resources".into());
    }
    if name.starts_with("requests.") {
        return Err("extended resource names may not start with \"requests.\"".into());
    }
    Ok(ResourceKind::Extended)
}

fn err(kind: ErrorType, field: String, bad: Option<String>, detail: String) -> FieldError {
    FieldError {
        kind,
        field,
        bad_value: bad,
        detail,
    }
}

/// Every violation of one provider resource block at `path`
/// (e.g. `spec.remoteStorage.redis.resources`), in a stable order: claims,
/// then each requests entry, then each limits entry (name, quantity,
/// sign, integrality, alignment), then the request/limit relationships.
pub fn check(path: &str, res: &ResourceRequirements) -> Vec<FieldError> {
    let mut out = Vec::new();
    if res.claims.as_ref().is_some_and(|c| !c.is_empty()) {
        out.push(err(
            ErrorType::Forbidden,
            format!("{path}.claims"),
            None,
            "Dynamic Resource Allocation claims are not supported: the provider workload gets no pod-level spec.resourceClaims to resolve them".into(),
        ));
    }
    let empty = BTreeMap::new();
    let requests = res.requests.as_ref().unwrap_or(&empty);
    let limits = res.limits.as_ref().unwrap_or(&empty);
    let requests_ok = entries(path, "requests", requests, &mut out);
    let limits_ok = entries(path, "limits", limits, &mut out);

    for (name, (kind, limit)) in &limits_ok {
        let Some((_, request)) = requests_ok.get(name) else {
            continue;
        };
        let field = format!("{path}.limits[{name}]");
        let bad = Some(limits[name].0.clone());
        match kind {
            ResourceKind::Overcommittable if limit < request => out.push(err(
                ErrorType::Invalid,
                field,
                bad,
                format!(
                    "must be greater than or equal to requests[{name}] ({})",
                    requests[name].0
                ),
            )),
            ResourceKind::HugePages(_) | ResourceKind::Extended if limit != request => {
                out.push(err(
                    ErrorType::Invalid,
                    field,
                    bad,
                    format!(
                        "must equal requests[{name}] ({}): hugepages and extended resources cannot be overcommitted",
                        requests[name].0
                    ),
                ))
            }
            _ => {}
        }
    }
    for (name, (kind, _)) in &requests_ok {
        if *kind != ResourceKind::Overcommittable && !limits.contains_key(name) {
            out.push(err(
                ErrorType::Invalid,
                format!("{path}.requests[{name}]"),
                Some(requests[name].0.clone()),
                format!(
                    "hugepages and extended resources must be declared in limits too: add limits[{name}] equal to this request"
                ),
            ));
        }
    }
    out
}

/// Per-entry checks; returns the entries that passed, for the relationship
/// rules.
fn entries(
    path: &str,
    list: &str,
    map: &BTreeMap<String, Quantity>,
    out: &mut Vec<FieldError>,
) -> BTreeMap<String, (ResourceKind, ParsedQuantity)> {
    let mut ok = BTreeMap::new();
    for (name, q) in map {
        let field = format!("{path}.{list}[{name}]");
        let kind = match classify(name) {
            Ok(k) => k,
            Err(why) => {
                out.push(err(
                    ErrorType::Invalid,
                    field,
                    Some(name.clone()),
                    format!("invalid resource name {name:?}: {why}"),
                ));
                continue;
            }
        };
        let bad = Some(q.0.clone());
        let value = match quantity::parse(&q.0) {
            Ok(v) => v,
            Err(e) => {
                out.push(err(ErrorType::Invalid, field, bad, e.to_string()));
                continue;
            }
        };
        if value.is_negative() {
            out.push(err(
                ErrorType::Invalid,
                field,
                bad,
                "must be non-negative".into(),
            ));
            continue;
        }
        match kind {
            ResourceKind::Extended if !value.is_integer() => {
                out.push(err(
                    ErrorType::Invalid,
                    field,
                    bad,
                    format!(
                        "extended resource {name} is allocated in whole units: must be an integer"
                    ),
                ));
                continue;
            }
            ResourceKind::HugePages(page) if value.is_positive() && !value.is_multiple_of(page) => {
                let size = name.trim_start_matches("hugepages-");
                out.push(err(
                    ErrorType::Invalid,
                    field,
                    bad,
                    format!("must be a whole multiple of the {size} page size"),
                ));
                continue;
            }
            _ => {}
        }
        ok.insert(name.clone(), (kind, value));
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_names() {
        assert_eq!(classify("cpu"), Ok(ResourceKind::Overcommittable));
        assert!(matches!(
            classify("hugepages-2Mi"),
            Ok(ResourceKind::HugePages(_))
        ));
        assert_eq!(classify("nvidia.com/gpu"), Ok(ResourceKind::Extended));
        for bad in [
            "",
            "foo",
            "hugepages-",
            "hugepages-nope",
            "hugepages-0",
            "kubernetes.io/foo",
            "requests.kubernetes.io/foo",
            "Example.com/gpu",
            "example.com/",
            "/gpu",
            "example.com/-gpu",
        ] {
            assert!(classify(bad).is_err(), "{bad:?}");
        }
    }
}
