//! The CachePolicy pusher: resolves one policy per namespace (the oldest
//! CachePolicy wins, ties broken by name; the rest are Superseded), pushes
//! the complete set to the index server with `SetPolicies`, and reports the
//! outcome on every CachePolicy's status (`Active`, `Pushed`).
//!
//! The push is the whole set every pass, so an index server that restarted
//! (and lost its policies) converges on the next pass. A pass runs shortly
//! after any CachePolicy watch event and on the resync timer; policies are
//! read from the watch-fed store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument as _;

use ic_api::cachepolicy::{CachePolicy, CachePolicySpec, CachePolicyStatus};
use ic_api::consts::{conditions as types, reasons};
use ic_controller_core::clock::{self, Clock, ClockExt};
use ic_controller_core::conditions::Builder;
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use crate::kubeutil::{self, POLICY_MANAGER};
use crate::metrics::Metrics;
use crate::stores::{Stores, owned};

const CONTROLLER: &str = "cachepolicy";
/// Condition type: the index server accepted the namespace's resolved policy.
pub const PUSHED: &str = "Pushed";

/// Why a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The API server refused a read or write.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The index server could not be reached or refused the push.
    #[error("SetPolicies on {url}: {message}")]
    Push {
        /// gRPC URL.
        url: String,
        /// What went wrong.
        message: String,
    },
}

/// A namespace's resolved policy: the winner and who it supersedes.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// Name of the winning CachePolicy.
    pub winner: String,
    /// What is pushed.
    pub policy: pb::NamespacePolicy,
}

fn to_u32(v: i32) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

/// The wire form of `spec` for `namespace`.
pub fn wire(namespace: &str, spec: &CachePolicySpec) -> pb::NamespacePolicy {
    pb::NamespacePolicy {
        namespace: namespace.to_owned(),
        lookup_timeout_ms: to_u32(spec.lookup_timeout_ms).max(1),
        minimum_prefix_tokens: to_u32(spec.minimum_prefix_tokens),
        replica_stale_after_seconds: to_u32(spec.replica_stale_after_seconds),
        allow_tier2_matches: spec.allow_tier2_matches,
    }
}

/// One policy per namespace: the oldest by creationTimestamp, then by name.
pub fn resolve(policies: &[CachePolicy]) -> BTreeMap<String, Resolved> {
    let mut sorted: Vec<&CachePolicy> = policies.iter().collect();
    sorted.sort_by(|a, b| {
        (
            a.metadata.creation_timestamp.as_ref().map(|t| t.0),
            &a.metadata.name,
        )
            .cmp(&(
                b.metadata.creation_timestamp.as_ref().map(|t| t.0),
                &b.metadata.name,
            ))
    });
    let mut out = BTreeMap::new();
    for p in sorted {
        let (Some(ns), Some(name)) = (&p.metadata.namespace, &p.metadata.name) else {
            continue;
        };
        out.entry(ns.clone()).or_insert_with(|| Resolved {
            winner: name.clone(),
            policy: wire(ns, &p.spec),
        });
    }
    out
}

/// Pushes CachePolicies to the index server.
#[derive(Clone)]
pub struct PolicyPusher {
    /// API client.
    pub client: kube::Client,
    /// Index server gRPC URL, e.g. `http://index:9090`.
    pub index_grpc: String,
    /// Bearer token file presented to SetPolicies; unset or absent (local
    /// runs) sends none.
    pub token_path: Option<std::path::PathBuf>,
    /// CA bundle (PEM file) an `https://` index server must chain to; read
    /// on every push, so a rotated bundle needs no restart.
    pub ca_path: Option<std::path::PathBuf>,
    /// Metrics.
    pub metrics: Metrics,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// The watch-fed view of the cluster.
    pub stores: Stores,
}

impl std::fmt::Debug for PolicyPusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyPusher").finish_non_exhaustive()
    }
}

impl PolicyPusher {
    async fn push(&self, request: pb::SetPoliciesRequest) -> Result<u32, PolicyError> {
        let fail = |message: String| PolicyError::Push {
            url: self.index_grpc.clone(),
            message,
        };
        let ca = match &self.ca_path {
            Some(path) => Some(
                std::fs::read(path)
                    .map_err(|e| fail(format!("--index-server-ca-file {}: {e}", path.display())))?,
            ),
            None => None,
        };
        let endpoint =
            ic_proto::channel::endpoint(&self.index_grpc, ca.as_deref(), "--index-server-grpc")
                .map_err(fail)?
                .timeout(Duration::from_secs(10));
        let channel = endpoint.connect().await.map_err(|e| {
            fail(
                std::error::Error::source(&e)
                    .map_or_else(|| e.to_string(), |s| format!("{e}: {s}")),
            )
        })?;
        let mut client = IndexServiceClient::new(channel);
        let mut request = tonic::Request::new(request);
        if let Some(path) = self.token_path.as_ref().filter(|p| p.exists()) {
            let token = crate::backend::read_token(path).map_err(fail)?;
            let value = ic_proto::bearer::metadata(&token)
                .ok_or_else(|| fail(format!("{}: not a token", path.display())))?;
            request.metadata_mut().insert("authorization", value);
        }
        ic_telemetry::otel::inject_metadata(&tracing::Span::current(), request.metadata_mut());
        client
            .set_policies(request)
            .await
            .map(|r| r.into_inner().applied)
            .map_err(|s| fail(format!("{}: {}", s.code(), s.message())))
    }

    /// One pass: resolve, push, write statuses. A failed push still writes
    /// statuses (Pushed=False) and is returned as the error.
    pub async fn sync_once(&self) -> Result<usize, PolicyError> {
        let started = Instant::now();
        let span = tracing::debug_span!("push_policies", controller = CONTROLLER);
        let result = self.sync_inner().instrument(span).await;
        self.metrics
            .pass(CONTROLLER, started, &result, |e| match e {
                PolicyError::Kube(k) => kubeutil::reason(k),
                PolicyError::Push { .. } => "remote",
            });
        result
    }

    async fn sync_inner(&self) -> Result<usize, PolicyError> {
        let policies = owned(&Stores::all(&self.stores.policies));
        let resolved = resolve(&policies);
        let request = pb::SetPoliciesRequest {
            policies: resolved.values().map(|r| r.policy.clone()).collect(),
        };
        let pushed = self.push(request).await;
        match &pushed {
            Ok(applied) => tracing::debug!(applied, "policies pushed"),
            Err(e) => tracing::warn!(error = %e, "policy push failed"),
        }
        let now = self.clock.now();
        for policy in &policies {
            let (Some(ns), Some(name)) = (&policy.metadata.namespace, &policy.metadata.name) else {
                continue;
            };
            let previous = policy.status.clone().unwrap_or_default();
            let generation = policy.metadata.generation;
            let mut conditions = Builder::new(&previous.conditions, now, generation);
            let winner = resolved.get(ns).map(|r| r.winner.as_str());
            let mut next = CachePolicyStatus {
                observed_generation: generation,
                pushed_at: previous.pushed_at.clone(),
                conditions: Vec::new(),
            };
            if winner == Some(name.as_str()) {
                conditions.set(
                    types::ACTIVE,
                    "True",
                    reasons::POLICY_ACTIVE,
                    format!("resolved policy of namespace {ns}"),
                );
                match &pushed {
                    Ok(_) => {
                        let was_pushed = previous
                            .conditions
                            .iter()
                            .any(|c| c.type_ == PUSHED && c.status == "True");
                        if !was_pushed || previous.observed_generation != generation {
                            next.pushed_at = Some(clock::to_time(now));
                        }
                        conditions.set(
                            PUSHED,
                            "True",
                            reasons::PUSHED,
                            "accepted by the index server",
                        );
                    }
                    Err(e) => conditions.set(PUSHED, "False", reasons::REMOTE_ERROR, e.to_string()),
                }
            } else {
                conditions.set(
                    types::ACTIVE,
                    "False",
                    reasons::SUPERSEDED,
                    format!(
                        "CachePolicy {} is older and governs namespace {ns}",
                        winner.unwrap_or("?")
                    ),
                );
            }
            next.conditions = conditions.finish();
            if next != previous {
                let api = Api::<CachePolicy>::namespaced(self.client.clone(), ns);
                match kubeutil::apply_status(&api, name, POLICY_MANAGER, &next).await {
                    Ok(_) => {}
                    Err(e) if kubeutil::is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        pushed.map(|_| resolved.len())
    }

    /// Syncs after every CachePolicy change and every `every`, until
    /// `shutdown`.
    pub async fn run(
        self,
        every: Duration,
        changes: tokio::sync::watch::Receiver<u64>,
        shutdown: CancellationToken,
    ) {
        let this = &self;
        kubeutil::run_on_change(every, changes, shutdown, "CachePolicy sync", || {
            this.sync_once()
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn policy(ns: &str, name: &str, created: i64, min_prefix: i32) -> CachePolicy {
        let mut p = CachePolicy::new(
            name,
            CachePolicySpec {
                minimum_prefix_tokens: min_prefix,
                ..CachePolicySpec::default()
            },
        );
        p.metadata.namespace = Some(ns.into());
        p.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created).unwrap(),
        ));
        p
    }

    #[test]
    fn oldest_policy_wins_per_namespace_then_name() {
        let r = resolve(&[
            policy("a", "new", 20, 1),
            policy("a", "old", 10, 2),
            policy("b", "y", 5, 3),
            policy("b", "x", 5, 4),
        ]);
        assert_eq!(r["a"].winner, "old");
        assert_eq!(r["a"].policy.minimum_prefix_tokens, 2);
        assert_eq!(r["b"].winner, "x");
        assert_eq!(r["b"].policy.namespace, "b");
    }

    #[test]
    fn wire_form_never_sends_a_zero_timeout_or_negatives() {
        let spec = CachePolicySpec {
            lookup_timeout_ms: 0,
            minimum_prefix_tokens: -5,
            ..CachePolicySpec::default()
        };
        let w = wire("ns", &spec);
        assert_eq!(w.lookup_timeout_ms, 1);
        assert_eq!(w.minimum_prefix_tokens, 0);
        assert_eq!(w.replica_stale_after_seconds, 120);
        assert!(w.allow_tier2_matches);
    }
}
