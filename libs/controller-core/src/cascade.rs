//! Cascade restarts: when the managed cache server is replaced (or one of
//! its own containers restarts in place), engines holding connections to the
//! old instance are rolled, because LMCache's remote connector does not
//! recover from the server going away (LMCache/LMCache#3565).
//!
//! `status.observedServerInstance` is the baseline: `<pod-uid>:<restart-sum>`
//! per Ready cache-server pod, sorted by pod name, comma-joined. Rules:
//! * no Ready pod: keep the old baseline (stale-while-unavailable);
//! * no baseline yet: set it, never cascade;
//! * a baseline pod gone, or its restart sum advanced: cascade, re-baseline;
//! * a strict superset (pods added, none changed): re-baseline only when the
//!   Deployment is converged (a scale-up), otherwise hold (a rolling-update
//!   midpoint, which a rollback would otherwise turn into a false cascade).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ic_api::consts::annotations;

use crate::clock::{self, Timestamp};

/// How often one backend may cascade.
pub const CASCADE_RATE_LIMIT: Duration = Duration::from_secs(30);

/// A cache-server pod as listed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerPod {
    /// Pod name (the sort key).
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// The pod's Ready condition is True.
    pub ready: bool,
    /// `(container name, restartCount)` from `status.containerStatuses`.
    pub container_restarts: Vec<(String, i32)>,
}

/// The server Deployment's rollout state, for the convergence check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerRollout {
    /// `spec.replicas`.
    pub spec_replicas: i32,
    /// `status.readyReplicas`.
    pub ready_replicas: i32,
    /// `status.updatedReplicas`.
    pub updated_replicas: i32,
    /// `status.observedGeneration`.
    pub observed_generation: i64,
    /// `metadata.generation`.
    pub generation: i64,
}

impl ServerRollout {
    /// Converged: spec == ready == updated == the Ready pods actually listed,
    /// and the status reflects the current generation.
    pub fn converged(&self, live_ready_pods: usize) -> bool {
        let live = i32::try_from(live_ready_pods).unwrap_or(i32::MAX);
        self.spec_replicas == self.ready_replicas
            && self.ready_replicas == self.updated_replicas
            && self.updated_replicas == live
            && self.observed_generation >= self.generation
    }
}

/// The identifier of the Ready pod set. `own_containers` are the container
/// names of the Deployment's pod template; other containers (mesh sidecars
/// and the like) never count.
pub fn server_instance(pods: &[ServerPod], own_containers: &[String]) -> String {
    let mut ready: Vec<&ServerPod> = pods.iter().filter(|p| p.ready).collect();
    ready.sort_by(|a, b| a.name.cmp(&b.name));
    ready
        .iter()
        .map(|p| {
            let sum: i64 = p
                .container_restarts
                .iter()
                .filter(|(name, _)| own_containers.iter().any(|c| c == name))
                .map(|(_, n)| i64::from(*n))
                .sum();
            format!("{}:{sum}", p.uid)
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn parse(instance: &str) -> BTreeMap<&str, i64> {
    instance
        .split(',')
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            let (uid, n) = e.rsplit_once(':')?;
            Some((uid, n.parse().unwrap_or(0)))
        })
        .collect()
}

/// What to do with the baseline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaselineVerdict {
    /// The baseline to persist.
    pub baseline: Option<String>,
    /// The server instance was replaced: engines must roll.
    pub replaced: bool,
}

/// Compares the current instance with the baseline (see the module doc).
pub fn evaluate(previous: Option<&str>, current: &str, converged: bool) -> BaselineVerdict {
    let prev = previous.filter(|p| !p.is_empty());
    let keep = |replaced| BaselineVerdict {
        baseline: prev.map(str::to_owned),
        replaced,
    };
    if current.is_empty() {
        return keep(false);
    }
    let Some(prev) = prev else {
        return BaselineVerdict {
            baseline: Some(current.to_owned()),
            replaced: false,
        };
    };
    if prev == current {
        return keep(false);
    }
    let old = parse(prev);
    let new = parse(current);
    let gone = old.keys().any(|uid| !new.contains_key(uid));
    let restarted = old
        .iter()
        .any(|(uid, n)| new.get(uid).is_some_and(|m| m > n));
    if gone || restarted {
        return BaselineVerdict {
            baseline: Some(current.to_owned()),
            replaced: true,
        };
    }
    let superset = new.len() > old.len();
    if superset && !converged {
        return keep(false);
    }
    // A converged scale-up, or a count that went backwards (not a
    // replacement): adopt without rolling engines.
    BaselineVerdict {
        baseline: Some(current.to_owned()),
        replaced: false,
    }
}

/// The engine Deployments to roll: those owning pods this backend injected
/// (`injected-by` + matching `injected-by-uid`), sorted, deduplicated.
pub fn engine_deployments(pods: &[crate::observe::EnginePod]) -> Vec<String> {
    let mut out: Vec<String> = pods
        .iter()
        .filter(|p| p.injected_by_this)
        .filter_map(|p| p.owner_deployment.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// A restart to apply: patch [`annotations::CACHE_SERVER_RESTART_TRIGGER`]
/// = `trigger` onto each Deployment's pod template
/// (`spec.template.metadata.annotations`), like `kubectl rollout restart`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CascadePlan {
    /// Engine Deployment names in the backend's namespace.
    pub deployments: Vec<String>,
    /// The annotation key.
    pub annotation: &'static str,
    /// The annotation value: the new server instance and when it was seen.
    pub trigger: String,
}

/// Builds the plan for a replacement observed at `now`.
pub fn plan(deployments: Vec<String>, new_instance: &str, now: Timestamp) -> CascadePlan {
    let at = clock::truncate(now);
    CascadePlan {
        deployments,
        annotation: annotations::CACHE_SERVER_RESTART_TRIGGER,
        trigger: format!("{at} {new_instance}"),
    }
}

/// Per-backend cascade rate limit (in-process; time from the caller).
#[derive(Debug, Clone)]
pub struct CascadeRateLimiter {
    window: Duration,
    last: HashMap<String, Timestamp>,
}

impl Default for CascadeRateLimiter {
    fn default() -> Self {
        Self::new(CASCADE_RATE_LIMIT)
    }
}

impl CascadeRateLimiter {
    /// One cascade per `window` per key.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            last: HashMap::new(),
        }
    }

    /// When `key` may next cascade (`None`: now). Feed this to
    /// `Observed::cascade_not_before`.
    pub fn not_before(&self, key: &str) -> Option<Timestamp> {
        self.last.get(key).map(|at| clock::add(*at, self.window))
    }

    /// Records a cascade applied at `now`.
    pub fn record(&mut self, key: &str, now: Timestamp) {
        self.last.insert(key.to_owned(), now);
    }

    /// Forgets `key` (left the managed-provider path, or deleted).
    pub fn forget(&mut self, key: &str) {
        self.last.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, restarts: &[(&str, i32)]) -> ServerPod {
        ServerPod {
            name: name.into(),
            uid: uid.into(),
            ready: true,
            container_restarts: restarts.iter().map(|(c, n)| ((*c).into(), *n)).collect(),
        }
    }

    #[test]
    fn identifier_sorts_by_name_and_ignores_foreign_containers() {
        let own = vec!["server".to_owned()];
        let mut b = pod("b", "uid-b", &[("server", 1), ("istio-proxy", 7)]);
        let a = pod("a", "uid-a", &[("server", 2)]);
        let mut c = pod("c", "uid-c", &[]);
        c.ready = false;
        assert_eq!(
            server_instance(&[b.clone(), a.clone(), c], &own),
            "uid-a:2,uid-b:1"
        );
        b.container_restarts[1].1 = 99;
        assert_eq!(server_instance(&[a, b], &own), "uid-a:2,uid-b:1");
    }

    #[test]
    fn baseline_rules() {
        let r = |p: Option<&str>, c: &str, conv| evaluate(p, c, conv);
        assert_eq!(
            r(None, "a:0", false),
            BaselineVerdict {
                baseline: Some("a:0".into()),
                replaced: false
            }
        );
        assert_eq!(
            r(Some("a:0"), "", false),
            BaselineVerdict {
                baseline: Some("a:0".into()),
                replaced: false
            }
        );
        assert_eq!(
            r(Some("a:0"), "a:0,b:0", false).baseline.as_deref(),
            Some("a:0")
        );
        assert_eq!(
            r(Some("a:0"), "a:0,b:0", true),
            BaselineVerdict {
                baseline: Some("a:0,b:0".into()),
                replaced: false
            }
        );
        assert!(r(Some("a:0"), "b:0", false).replaced);
        assert!(r(Some("a:0"), "a:1", false).replaced);
        assert!(r(Some("a:0,b:0"), "a:0", true).replaced);
    }
}
