//! Resolved per-namespace routing policy (pushed by the controller from
//! CachePolicy objects), with defaults for namespaces that have none, and
//! the InferenceObjectives' priorities pushed with them.

use std::collections::HashMap;
use std::time::Duration;

use ic_index::route::ScoringOverrides;
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
    /// A weight or bound out of range.
    #[error("policies[{0}].{1}: {2}")]
    Scoring(usize, &'static str, String),
    /// Shedding thresholds that would refuse a higher priority first.
    #[error("policies[{0}].shed_*_at_requests: {1}")]
    Shedding(usize, String),
    /// An objective without a namespace or name, or named twice.
    #[error("objectives[{0}].{1}")]
    Objective(usize, String),
}

/// A namespace's shedding thresholds as pushed (`None`: the flag's).
pub type ShedOverrides = [Option<u32>; 3];

/// An InferenceObjective: the pool it applies to and its priority.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Objective {
    pool: String,
    priority: i32,
}

/// All namespaces' policies.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    by_namespace: HashMap<String, Policy>,
    shedding: HashMap<String, ShedOverrides>,
    /// By (namespace, name): objective names are unique in a namespace.
    objectives: HashMap<(String, String), Objective>,
}

/// A finite weight, at least 0.
fn weight(i: usize, field: &'static str, v: Option<f64>) -> Result<Option<f64>, PolicyError> {
    match v {
        Some(w) if !(w.is_finite() && w >= 0.0) => Err(PolicyError::Scoring(
            i,
            field,
            format!("must be a non-negative number (got {w})"),
        )),
        other => Ok(other),
    }
}

impl Policies {
    /// The policy of `namespace`.
    pub fn get(&self, namespace: &str) -> Policy {
        self.by_namespace
            .get(namespace)
            .copied()
            .unwrap_or_default()
    }

    /// The shedding thresholds `namespace`'s CachePolicy sets (each `None`
    /// keeps the server's flag).
    pub fn shedding(&self, namespace: &str) -> ShedOverrides {
        self.shedding.get(namespace).copied().unwrap_or_default()
    }

    /// The priority of InferenceObjective `name` in `namespace` for a
    /// request to `pool` (`None`: any pool of the namespace, a picker over
    /// static endpoints); `None` when the API has no such objective.
    pub fn objective_priority(
        &self,
        namespace: &str,
        pool: Option<&str>,
        name: &str,
    ) -> Option<i32> {
        let o = self
            .objectives
            .get(&(namespace.to_owned(), name.to_owned()))?;
        pool.is_none_or(|p| p == o.pool).then_some(o.priority)
    }

    /// Builds the complete set from a push; the whole push is refused on the
    /// first invalid entry (naming it), so a bad push changes nothing.
    pub fn from_push(push: &[pb::NamespacePolicy]) -> Result<Self, PolicyError> {
        Self::from_request(push, &[])
    }

    /// [`Self::from_push`] with the InferenceObjectives of the push.
    pub fn from_request(
        push: &[pb::NamespacePolicy],
        objectives: &[pb::ObjectivePriority],
    ) -> Result<Self, PolicyError> {
        let mut by_namespace = HashMap::new();
        let mut shedding = HashMap::new();
        for (i, p) in push.iter().enumerate() {
            if p.namespace.is_empty() {
                return Err(PolicyError::EmptyNamespace(i));
            }
            if p.lookup_timeout_ms == 0 {
                return Err(PolicyError::ZeroTimeout(i));
            }
            let load_bound = match p.load_bound {
                None => None,
                Some(0.0) => Some(None),
                Some(b) if b.is_finite() && b >= 1.0 => Some(Some(b)),
                Some(b) => {
                    return Err(PolicyError::Scoring(
                        i,
                        "load_bound",
                        format!("must be 0 (unbounded) or at least 1 (got {b})"),
                    ));
                }
            };
            let scoring = ScoringOverrides {
                prefix: weight(i, "score_prefix_weight", p.score_prefix_weight)?,
                load: weight(i, "score_load_weight", p.score_load_weight)?,
                kv_usage: weight(i, "score_kv_usage_weight", p.score_kv_usage_weight)?,
                load_bound,
            };
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
                scoring,
            };
            if by_namespace.insert(p.namespace.clone(), policy).is_some() {
                return Err(PolicyError::Duplicate(i, p.namespace.clone()));
            }
            let shed = [
                p.shed_sheddable_at_requests,
                p.shed_standard_at_requests,
                p.shed_critical_at_requests,
            ];
            if shed.iter().any(Option::is_some) {
                // The controller sends all three; the ones sent must be in
                // order on their own (unset ones fall back to the flags).
                let [a, b, c] = shed.map(|n| n.unwrap_or(0));
                if shed.iter().all(Option::is_some) {
                    crate::epp_config::Shedding::from_counts(a, b, c)
                        .map_err(|e| PolicyError::Shedding(i, e))?;
                }
                shedding.insert(p.namespace.clone(), shed);
            }
        }
        let mut by_name = HashMap::new();
        for (i, o) in objectives.iter().enumerate() {
            for (field, value) in [("namespace", &o.namespace), ("name", &o.name)] {
                if value.is_empty() {
                    return Err(PolicyError::Objective(
                        i,
                        format!("{field}: must not be empty"),
                    ));
                }
            }
            let key = (o.namespace.clone(), o.name.clone());
            let objective = Objective {
                pool: o.pool.clone(),
                priority: o.priority,
            };
            if by_name.insert(key, objective).is_some() {
                return Err(PolicyError::Objective(
                    i,
                    format!("name: {}/{} appears more than once", o.namespace, o.name),
                ));
            }
        }
        Ok(Self {
            by_namespace,
            shedding,
            objectives: by_name,
        })
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
        assert_eq!(a.scoring, ScoringOverrides::default());
        assert_eq!(p.get("other"), Policy::default());
        assert_eq!(p.shedding("a"), [None; 3]);
    }

    #[test]
    fn scoring_and_shedding_overrides() {
        let p = Policies::from_push(&[pb::NamespacePolicy {
            score_load_weight: Some(4.0),
            load_bound: Some(0.0),
            shed_sheddable_at_requests: Some(2),
            shed_standard_at_requests: Some(3),
            shed_critical_at_requests: Some(0),
            ..push("a", 5)
        }])
        .unwrap();
        let s = p.get("a").scoring;
        assert_eq!(s.load, Some(4.0));
        assert_eq!(s.prefix, None);
        assert_eq!(s.load_bound, Some(None));
        assert_eq!(p.shedding("a"), [Some(2), Some(3), Some(0)]);
        for (bad, field) in [
            (
                pb::NamespacePolicy {
                    score_prefix_weight: Some(-1.0),
                    ..push("a", 5)
                },
                "policies[0].score_prefix_weight",
            ),
            (
                pb::NamespacePolicy {
                    load_bound: Some(0.5),
                    ..push("a", 5)
                },
                "policies[0].load_bound",
            ),
            (
                pb::NamespacePolicy {
                    shed_sheddable_at_requests: Some(9),
                    shed_standard_at_requests: Some(3),
                    shed_critical_at_requests: Some(0),
                    ..push("a", 5)
                },
                "policies[0].shed_",
            ),
        ] {
            let e = Policies::from_push(&[bad]).unwrap_err().to_string();
            assert!(e.starts_with(field), "{e}");
        }
    }

    #[test]
    fn objectives_by_namespace_name_and_pool() {
        let o = |ns: &str, pool: &str, name: &str, priority| pb::ObjectivePriority {
            namespace: ns.into(),
            pool: pool.into(),
            name: name.into(),
            priority,
        };
        let p =
            Policies::from_request(&[], &[o("a", "chat", "batch", -1), o("b", "x", "batch", 5)])
                .unwrap();
        assert_eq!(p.objective_priority("a", Some("chat"), "batch"), Some(-1));
        assert_eq!(p.objective_priority("a", None, "batch"), Some(-1));
        assert_eq!(p.objective_priority("a", Some("other"), "batch"), None);
        assert_eq!(p.objective_priority("b", Some("x"), "batch"), Some(5));
        assert_eq!(p.objective_priority("c", None, "batch"), None);
        let dup = Policies::from_request(&[], &[o("a", "x", "n", 1), o("a", "y", "n", 2)])
            .unwrap_err()
            .to_string();
        assert!(dup.starts_with("objectives[1].name"), "{dup}");
        let empty = Policies::from_request(&[], &[o("a", "x", "", 1)])
            .unwrap_err()
            .to_string();
        assert!(empty.starts_with("objectives[0].name"), "{empty}");
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
