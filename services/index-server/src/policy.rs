//! Resolved per-namespace routing policy (pushed by the controller from
//! CachePolicy objects), with defaults for namespaces that have none.

use std::collections::HashMap;
use std::time::Duration;

use ic_proto::index_v1 as pb;

/// Routing policy of one namespace: the routing core's own type.
pub use ic_index::route::RoutePolicy as Policy;

/// Why a pushed policy was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    /// The namespace name is empty.
    #[error("policies[{0}].namespace: must not be empty")]
    EmptyNamespace(usize),
    /// Two policies for one namespace.
    #[error("policies[{0}].namespace: {1:?} appears more than once")]
    Duplicate(usize, String),
    /// A zero timeout would answer every lookup with NO_HINT.
    #[error("policies[{0}].lookup_timeout_ms: must be at least 1")]
    ZeroTimeout(usize),
}

/// All namespaces' policies.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    by_namespace: HashMap<String, Policy>,
}

impl Policies {
    /// The policy of `namespace`.
    pub fn get(&self, namespace: &str) -> Policy {
        self.by_namespace
            .get(namespace)
            .copied()
            .unwrap_or_default()
    }

    /// Builds the complete set from a push; the whole push is refused on the
    /// first invalid entry (naming it), so a bad push changes nothing.
    pub fn from_push(push: &[pb::NamespacePolicy]) -> Result<Self, PolicyError> {
        let mut by_namespace = HashMap::new();
        for (i, p) in push.iter().enumerate() {
            if p.namespace.is_empty() {
                return Err(PolicyError::EmptyNamespace(i));
            }
            if p.lookup_timeout_ms == 0 {
                return Err(PolicyError::ZeroTimeout(i));
            }
            let defaults = Policy::default();
            let policy = Policy {
                lookup_timeout: Duration::from_millis(u64::from(p.lookup_timeout_ms)),
                minimum_prefix_tokens: u64::from(p.minimum_prefix_tokens),
                replica_stale_after: if p.replica_stale_after_seconds == 0 {
                    defaults.replica_stale_after
                } else {
                    Duration::from_secs(u64::from(p.replica_stale_after_seconds))
                },
                allow_tier2_matches: p.allow_tier2_matches,
                ..defaults
            };
            if by_namespace.insert(p.namespace.clone(), policy).is_some() {
                return Err(PolicyError::Duplicate(i, p.namespace.clone()));
            }
        }
        Ok(Self { by_namespace })
    }

    /// Number of namespaces with an explicit policy.
    pub fn len(&self) -> usize {
        self.by_namespace.len()
    }

    /// Whether no namespace has an explicit policy.
    pub fn is_empty(&self) -> bool {
        self.by_namespace.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(ns: &str, timeout: u32) -> pb::NamespacePolicy {
        pb::NamespacePolicy {
            namespace: ns.into(),
            lookup_timeout_ms: timeout,
            minimum_prefix_tokens: 64,
            replica_stale_after_seconds: 0,
            allow_tier2_matches: false,
            ..Default::default()
        }
    }

    #[test]
    fn resolves_pushed_and_default_policies() {
        let p = Policies::from_push(&[push("a", 5)]).unwrap();
        let a = p.get("a");
        assert_eq!(a.lookup_timeout, Duration::from_millis(5));
        assert_eq!(a.minimum_prefix_tokens, 64);
        assert_eq!(a.replica_stale_after, Policy::default().replica_stale_after);
        assert!(!a.allow_tier2_matches);
        assert_eq!(p.get("other"), Policy::default());
    }

    #[test]
    fn bad_pushes_name_the_entry() {
        assert_eq!(
            Policies::from_push(&[push("", 5)]).unwrap_err(),
            PolicyError::EmptyNamespace(0)
        );
        assert_eq!(
            Policies::from_push(&[push("a", 5), push("a", 6)]).unwrap_err(),
            PolicyError::Duplicate(1, "a".into())
        );
        assert_eq!(
            Policies::from_push(&[push("a", 0)]).unwrap_err(),
            PolicyError::ZeroTimeout(0)
        );
    }
}
