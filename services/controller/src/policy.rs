//! The CachePolicy pusher: resolves one policy per namespace (the oldest
//! CachePolicy wins, ties broken by name; the rest are Superseded), pushes
//! the complete set to every index server with `SetPolicies`, and reports
//! the outcome on every CachePolicy's status (`Active`, `Pushed`).
//!
//! Index-server replicas are all active and each holds its own policies, so
//! the pusher pushes to each of them ([`crate::discovery`]: a static list, or
//! every address of a headless Service) and tracks each push on its own. The
//! push is the whole set, so an index server that restarted (and lost its
//! policies) converges on the next full pass. A full pass runs shortly after
//! any CachePolicy watch event and on the resync timer; between them, every
//! `--index-server-resolve-seconds`, a catch-up resolves the index servers
//! again and pushes only to those that do not hold the current set yet (one
//! that just appeared, or whose last push failed). Policies are read from
//! the watch-fed store. `Pushed` is True only when every index server holds
//! the set.
//!
//! The push also carries every InferenceObjective's priority (the Gateway
//! API Inference Extension's kind), which the index servers' endpoint
//! pickers shed by; an objective change wakes the pusher as a policy
//! change does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument as _;

use ic_api::cachepolicy::{CachePolicy, CachePolicySpec, CachePolicyStatus};
use ic_api::consts::{conditions as types, reasons};
use ic_api::inferenceobjective::InferenceObjective;
use ic_controller_core::clock::{self, Clock, ClockExt};
use ic_controller_core::conditions::Builder;
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use crate::discovery::{Destination, Discovery, DiscoveryMode, FLAG};
use crate::kubeutil::{self, POLICY_MANAGER};
use crate::metrics::{Metrics, StateLabel};
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
    /// An index server could not be reached or refused the push.
    #[error("SetPolicies on {destination}: {message}")]
    Push {
        /// The index server (URL, and the address dialled with dns
        /// discovery).
        destination: String,
        /// What went wrong.
        message: String,
    },
    /// Some of several index servers do not hold the current policies.
    #[error("{behind} of {total} index servers do not hold the current policies; {first}")]
    Incomplete {
        /// Index servers whose push failed.
        behind: usize,
        /// Index servers known.
        total: usize,
        /// The first failure.
        first: Box<PolicyError>,
    },
    /// Discovery found no index server to push to.
    #[error("no index server to push to: {0}")]
    NoIndexServer(String),
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

/// The wire form of `spec` for `namespace`. Scoring fields left out stay
/// unset (the index server's flags); a `shedding` block sends all three
/// thresholds, a field left out as 0 (never).
pub fn wire(namespace: &str, spec: &CachePolicySpec) -> pb::NamespacePolicy {
    let scoring = spec.scoring.clone().unwrap_or_default();
    let shed = spec.shedding.as_ref().map(|s| {
        [
            s.sheddable_at_requests,
            s.standard_at_requests,
            s.critical_at_requests,
        ]
        .map(|n| to_u32(n.unwrap_or(0)))
    });
    pb::NamespacePolicy {
        namespace: namespace.to_owned(),
        lookup_timeout_ms: to_u32(spec.lookup_timeout_ms).max(1),
        minimum_prefix_tokens: to_u32(spec.minimum_prefix_tokens),
        replica_stale_after_seconds: to_u32(spec.replica_stale_after_seconds),
        allow_tier2_matches: spec.allow_tier2_matches,
        score_prefix_weight: scoring.prefix_weight,
        score_load_weight: scoring.load_weight,
        score_kv_usage_weight: scoring.kv_usage_weight,
        load_bound: scoring.load_bound,
        shed_sheddable_at_requests: shed.map(|s| s[0]),
        shed_standard_at_requests: shed.map(|s| s[1]),
        shed_critical_at_requests: shed.map(|s| s[2]),
    }
}

/// Every InferenceObjective's priority, by namespace, pool and name (an
/// objective referring to anything but an InferencePool is left out).
pub fn objective_priorities(objectives: &[InferenceObjective]) -> Vec<pb::ObjectivePriority> {
    objectives
        .iter()
        .filter(|o| {
            let r = &o.spec.pool_ref;
            r.kind
                .as_deref()
                .is_none_or(|k| k.is_empty() || k == "InferencePool")
                && !r.name.is_empty()
        })
        .filter_map(|o| {
            Some(pb::ObjectivePriority {
                namespace: o.metadata.namespace.clone()?,
                pool: o.spec.pool_ref.name.clone(),
                name: o.metadata.name.clone()?,
                priority: o.spec.priority(),
            })
        })
        .collect()
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

/// What the pusher knows of one index server.
#[derive(Debug, Default)]
struct Held {
    /// The set it last accepted; `None` until a push succeeds and after one
    /// fails (a failure may be a restart that lost everything).
    accepted: Option<pb::SetPoliciesRequest>,
    /// Why the last push failed.
    error: Option<String>,
}

/// Pushes CachePolicies to every index server.
#[derive(Clone)]
pub struct PolicyPusher {
    client: kube::Client,
    discovery: Discovery,
    resolve_every: Duration,
    token_path: Option<PathBuf>,
    ca_path: Option<PathBuf>,
    metrics: Metrics,
    clock: Arc<dyn Clock>,
    stores: Stores,
    /// Per index server; the lock also keeps passes from overlapping.
    held: Arc<tokio::sync::Mutex<BTreeMap<Destination, Held>>>,
}

impl std::fmt::Debug for PolicyPusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyPusher")
            .field("discovery", &self.discovery)
            .finish_non_exhaustive()
    }
}

/// Token and CA bundle, read once per pass (both may rotate on disk).
struct Credentials {
    ca: Option<Vec<u8>>,
    token: Option<tonic::metadata::AsciiMetadataValue>,
}

impl PolicyPusher {
    /// A pusher to the index servers at `urls` (the parsed
    /// `--index-server-grpc`), each one index server (static discovery)
    /// until [`Self::with_discovery`] says otherwise.
    pub fn new(
        client: kube::Client,
        urls: Vec<String>,
        metrics: Metrics,
        clock: Arc<dyn Clock>,
        stores: Stores,
    ) -> Self {
        Self {
            client,
            discovery: Discovery {
                urls,
                mode: DiscoveryMode::Static,
            },
            resolve_every: Duration::from_secs(5),
            token_path: None,
            ca_path: None,
            metrics,
            clock,
            stores,
            held: Arc::default(),
        }
    }

    /// How the URLs become index servers, and how often they are resolved
    /// again (and lagging index servers caught up).
    #[must_use]
    pub fn with_discovery(mut self, mode: DiscoveryMode, resolve_every: Duration) -> Self {
        self.discovery.mode = mode;
        self.resolve_every = resolve_every.max(Duration::from_millis(50));
        self
    }

    /// Bearer token file presented to SetPolicies; unset or absent (local
    /// runs) sends none.
    #[must_use]
    pub fn with_token_path(mut self, path: Option<PathBuf>) -> Self {
        self.token_path = path;
        self
    }

    /// CA bundle (PEM file) an `https://` index server must chain to; read
    /// on every pass, so a rotated bundle needs no restart.
    #[must_use]
    pub fn with_ca_path(mut self, path: Option<PathBuf>) -> Self {
        self.ca_path = path;
        self
    }

    /// Every index server the last pass knew, with why it does not hold
    /// the policies of that pass (`Err`) or `Ok`.
    pub async fn index_servers(&self) -> Vec<(Destination, Result<(), String>)> {
        self.held
            .lock()
            .await
            .iter()
            .map(|(d, h)| {
                let state = match (&h.accepted, &h.error) {
                    (Some(_), _) => Ok(()),
                    (None, Some(e)) => Err(e.clone()),
                    (None, None) => Err("not pushed yet".to_owned()),
                };
                (d.clone(), state)
            })
            .collect()
    }

    fn credentials(&self) -> Result<Credentials, String> {
        let ca = match &self.ca_path {
            Some(path) => Some(
                std::fs::read(path)
                    .map_err(|e| format!("--index-server-ca-file {}: {e}", path.display()))?,
            ),
            None => None,
        };
        let token = match self.token_path.as_ref().filter(|p| p.exists()) {
            Some(path) => {
                let token = crate::backend::read_token(path)?;
                Some(
                    ic_proto::bearer::metadata(&token)
                        .ok_or_else(|| format!("{}: not a token", path.display()))?,
                )
            }
            None => None,
        };
        Ok(Credentials { ca, token })
    }

    /// Pushes `request` to each of `due`, all at once (a slow or dead index
    /// server delays the pass by its timeout, not the others by theirs).
    async fn push_all(
        &self,
        due: &[Destination],
        request: &pb::SetPoliciesRequest,
    ) -> Vec<Result<u32, String>> {
        match self.credentials() {
            Ok(credentials) => {
                let credentials = &credentials;
                futures::future::join_all(
                    due.iter()
                        .map(|d| push_one(d, credentials, request.clone())),
                )
                .await
            }
            Err(message) => due.iter().map(|_| Err(message.clone())).collect(),
        }
    }

    /// One full pass: resolve, push to every index server, write statuses.
    /// A failed push still writes statuses (Pushed=False) and is returned
    /// as the error.
    pub async fn sync_once(&self) -> Result<usize, PolicyError> {
        let started = Instant::now();
        let span = tracing::debug_span!("push_policies", controller = CONTROLLER);
        let result = self.sync_inner(true).instrument(span).await;
        // Some: a full pass always does its work.
        let result = result.unwrap_or(Ok(0));
        self.count(started, &result);
        result
    }

    /// One catch-up: resolve, push only to the index servers that do not
    /// hold the current policies (new, or failed last time), and write
    /// statuses if that or the set of index servers changed anything.
    /// `None` when there was nothing to do.
    pub async fn catch_up(&self) -> Option<Result<usize, PolicyError>> {
        let started = Instant::now();
        let span = tracing::debug_span!("push_policies", controller = CONTROLLER);
        let result = self.sync_inner(false).instrument(span).await?;
        self.count(started, &result);
        Some(result)
    }

    fn count(&self, started: Instant, result: &Result<usize, PolicyError>) {
        self.metrics
            .observe(CONTROLLER, result.is_ok(), started.elapsed().as_secs_f64());
        // Push failures are counted per index server as they happen.
        if let Err(PolicyError::Kube(k)) = result {
            self.metrics.error(CONTROLLER, kubeutil::reason(k));
        }
    }

    async fn sync_inner(&self, all: bool) -> Option<Result<usize, PolicyError>> {
        let mut held = self.held.lock().await;
        let known: BTreeSet<Destination> = held.keys().cloned().collect();
        let found = self.discovery.destinations(&known).await;
        for failure in &found.failures {
            self.metrics.error(CONTROLLER, "discovery");
            tracing::warn!(error = %failure, "cannot resolve the index servers");
        }
        held.retain(|d, _| {
            let keep = found.destinations.contains(d);
            if !keep {
                tracing::info!(index_server = %d, "index server gone");
            }
            keep
        });
        for d in &found.destinations {
            held.entry(d.clone()).or_insert_with(|| {
                tracing::info!(index_server = %d, "index server found");
                Held::default()
            });
        }

        let policies = owned(&Stores::all(&self.stores.policies));
        let resolved = resolve(&policies);
        let objectives = owned(&Stores::all(&self.stores.objectives));
        let request = pb::SetPoliciesRequest {
            policies: resolved.values().map(|r| r.policy.clone()).collect(),
            objectives: objective_priorities(&objectives),
        };
        let due: Vec<Destination> = held
            .iter()
            .filter(|(_, h)| all || h.accepted.as_ref() != Some(&request))
            .map(|(d, _)| d.clone())
            .collect();
        if !all && due.is_empty() && known == found.destinations {
            return None;
        }

        let results = self.push_all(&due, &request).await;
        for (d, result) in due.iter().zip(results) {
            let Some(h) = held.get_mut(d) else { continue };
            match result {
                Ok(applied) => {
                    tracing::debug!(index_server = %d, applied, "policies pushed");
                    h.accepted = Some(request.clone());
                    h.error = None;
                }
                Err(message) => {
                    self.metrics.error(CONTROLLER, "remote");
                    // Warn once per new failure, not on every retry.
                    if h.error.as_ref() != Some(&message) {
                        tracing::warn!(index_server = %d, error = %message, "policy push failed");
                    }
                    h.accepted = None;
                    h.error = Some(message);
                }
            }
        }

        let behind: Vec<(&Destination, &Held)> = held
            .iter()
            .filter(|(_, h)| h.accepted.as_ref() != Some(&request))
            .collect();
        let total = held.len();
        self.set_gauges(total - behind.len(), behind.len());
        let pushed = match behind.first() {
            _ if total == 0 => Err(PolicyError::NoIndexServer(if found.failures.is_empty() {
                "no address resolved".to_owned()
            } else {
                found.failures.join("; ")
            })),
            None => Ok(()),
            Some((d, h)) => {
                let first = PolicyError::Push {
                    destination: d.to_string(),
                    message: h.error.clone().unwrap_or_else(|| "not pushed yet".into()),
                };
                Err(if total == 1 {
                    first
                } else {
                    PolicyError::Incomplete {
                        behind: behind.len(),
                        total,
                        first: Box::new(first),
                    }
                })
            }
        };
        // Statuses are written under the lock too: passes never interleave.
        let written = self.write_statuses(&policies, &resolved, &pushed).await;
        Some(match (written, pushed) {
            (Err(e), _) => Err(e.into()),
            (Ok(()), pushed) => pushed.map(|()| resolved.len()),
        })
    }

    fn set_gauges(&self, current: usize, behind: usize) {
        for (state, n) in [("current", current), ("behind", behind)] {
            self.metrics
                .policy_index_servers
                .get_or_create(&StateLabel { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// `Active` and `Pushed` on every CachePolicy, written only when
    /// changed.
    async fn write_statuses(
        &self,
        policies: &[CachePolicy],
        resolved: &BTreeMap<String, Resolved>,
        pushed: &Result<(), PolicyError>,
    ) -> Result<(), kube::Error> {
        let now = self.clock.now();
        for policy in policies {
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
                match pushed {
                    Ok(()) => {
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
                            "accepted by every index server",
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
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Full passes after every CachePolicy change and every `every`, and
    /// catch-ups every resolve period in between, until `shutdown`.
    pub async fn run(
        self,
        every: Duration,
        changes: tokio::sync::watch::Receiver<u64>,
        shutdown: CancellationToken,
    ) {
        let this = &self;
        let passes =
            kubeutil::run_on_change(every, changes, shutdown.clone(), "CachePolicy sync", || {
                this.sync_once()
            });
        let catch_ups = async {
            let period = this.resolve_every;
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if let Some(Err(e)) = this.catch_up().await {
                    // Each failing index server was warned of as it failed.
                    tracing::debug!(error = %e, "policy catch-up incomplete");
                }
            }
        };
        tokio::join!(passes, catch_ups);
    }
}

/// One `SetPolicies` to one index server: the number of policies applied,
/// or why not. Dialled by address with dns discovery, TLS verifying the
/// URL's host name.
async fn push_one(
    destination: &Destination,
    credentials: &Credentials,
    request: pb::SetPoliciesRequest,
) -> Result<u32, String> {
    let endpoint = ic_proto::channel::endpoint_at(
        &destination.url,
        destination.addr,
        credentials.ca.as_deref(),
        FLAG,
    )?
    .timeout(Duration::from_secs(10));
    let channel = endpoint.connect().await.map_err(|e| {
        std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| format!("{e}: {s}"))
    })?;
    let mut client = IndexServiceClient::new(channel);
    let mut request = tonic::Request::new(request);
    if let Some(token) = &credentials.token {
        request
            .metadata_mut()
            .insert("authorization", token.clone());
    }
    ic_telemetry::otel::inject_metadata(&tracing::Span::current(), request.metadata_mut());
    client
        .set_policies(request)
        .await
        .map(|r| r.into_inner().applied)
        .map_err(|s| format!("{}: {}", s.code(), s.message()))
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
        assert_eq!(w.score_prefix_weight, None);
        assert_eq!(w.shed_standard_at_requests, None);
    }

    #[test]
    fn objectives_carry_namespace_pool_name_and_priority() {
        let o = |ns: &str, name: &str, kind: Option<&str>, priority| {
            let mut o = InferenceObjective::new(
                name,
                ic_api::inferenceobjective::InferenceObjectiveSpec {
                    priority,
                    pool_ref: ic_api::inferenceobjective::PoolReference {
                        kind: kind.map(Into::into),
                        name: "chat".into(),
                        ..Default::default()
                    },
                },
            );
            o.metadata.namespace = Some(ns.into());
            o
        };
        let out = objective_priorities(&[
            o("a", "batch", None, Some(-1)),
            o("a", "plain", Some("InferencePool"), None),
            o("a", "other", Some("Service"), Some(3)),
        ]);
        assert_eq!(
            out,
            vec![
                pb::ObjectivePriority {
                    namespace: "a".into(),
                    pool: "chat".into(),
                    name: "batch".into(),
                    priority: -1,
                },
                pb::ObjectivePriority {
                    namespace: "a".into(),
                    pool: "chat".into(),
                    name: "plain".into(),
                    priority: 0,
                },
            ]
        );
    }

    #[test]
    fn wire_form_carries_scoring_and_the_whole_shedding_block() {
        let spec = CachePolicySpec {
            scoring: Some(ic_api::cachepolicy::ScoringSpec {
                load_weight: Some(3.0),
                load_bound: Some(0.0),
                ..Default::default()
            }),
            shedding: Some(ic_api::cachepolicy::SheddingSpec {
                sheddable_at_requests: Some(4),
                standard_at_requests: Some(8),
                critical_at_requests: None,
            }),
            ..CachePolicySpec::default()
        };
        let w = wire("ns", &spec);
        assert_eq!(w.score_prefix_weight, None);
        assert_eq!(w.score_load_weight, Some(3.0));
        assert_eq!(w.load_bound, Some(0.0));
        assert_eq!(
            (
                w.shed_sheddable_at_requests,
                w.shed_standard_at_requests,
                w.shed_critical_at_requests
            ),
            (Some(4), Some(8), Some(0))
        );
    }
}
