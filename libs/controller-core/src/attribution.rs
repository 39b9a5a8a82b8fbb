//! Attributing the index server's `/snapshot` replicas to CacheBackends, and
//! projecting the snapshot into `CacheBackend.status.indexParticipation` and
//! `CacheIndex.status`.
//!
//! Every snapshot row comes from a kvevent-subscriber inside an engine pod:
//! `replicaId` is the pod name, `tenant` its namespace. A row belongs to at
//! most one backend, found through the pod:
//! 1. the webhook's `inferencecache.io/injected-by: <ns>/<name>` annotation,
//!    when it names a backend that exists (the authoritative wiring signal);
//! 2. otherwise the first backend of the pod's namespace, in name order,
//!    whose non-empty `engineSelector.matchLabels` is a subset of the pod's
//!    labels (the webhook's first-match rule). Empty selectors claim nothing.
//!
//! Rows whose pod is gone are skipped for backends (they still count in the
//! cluster-wide CacheIndex). Several rows of one pod (data-parallel ranks,
//! several models) add up.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use ic_api::cachebackend::{CacheBackend, IndexParticipation};
use ic_api::cacheindex::{CacheIndexStatus, ReplicaIndexStatus, TenantIndexStatus};
use ic_api::consts::annotations;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

// === the /snapshot wire ===

pub use ic_index_http::{Snapshot, SnapshotReplica};

fn last_event(row: &SnapshotReplica) -> Option<Timestamp> {
    row.last_event_at.as_deref().and_then(|s| s.parse().ok())
}

// === attribution ===

/// A CacheBackend by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BackendRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl BackendRef {
    /// The reference of `backend`.
    pub fn of(backend: &CacheBackend) -> Self {
        Self {
            namespace: backend.metadata.namespace.clone().unwrap_or_default(),
            name: backend.metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl std::fmt::Display for BackendRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One backend's share of a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct BackendShare {
    /// The status projection.
    pub participation: IndexParticipation,
    /// Query-weighted tier-2 hit rate, when tier 2 was queried at all.
    pub t2_hit_rate: Option<f64>,
    /// Distinct engine pods attributed.
    pub replicas: usize,
}

/// A snapshot split by owning backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Attribution {
    /// Backends that own at least one row.
    pub by_backend: BTreeMap<BackendRef, BackendShare>,
    /// Rows whose pod was not found.
    pub pod_missing: usize,
    /// Rows whose pod exists but no backend claims.
    pub unclaimed: usize,
}

/// The backend owning `pod`, among `backends` (any namespace).
pub fn owner_of(pod: &Pod, backends: &[impl Borrow<CacheBackend>]) -> Option<BackendRef> {
    let pod_ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let exists = |ns: &str, name: &str| {
        backends.iter().map(Borrow::borrow).any(|b: &CacheBackend| {
            b.metadata.namespace.as_deref() == Some(ns) && b.metadata.name.as_deref() == Some(name)
        })
    };
    if let Some((ns, name)) = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::INJECTED_BY))
        .and_then(|v| v.split_once('/'))
        && exists(ns, name)
    {
        return Some(BackendRef {
            namespace: ns.to_owned(),
            name: name.to_owned(),
        });
    }
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let mut candidates: Vec<&CacheBackend> = backends
        .iter()
        .map(Borrow::borrow)
        .filter(|b| b.metadata.namespace.as_deref() == Some(pod_ns))
        .collect();
    candidates.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    candidates
        .into_iter()
        .find(|b| {
            b.spec.engine_selector.as_ref().is_some_and(|s| {
                !s.match_labels.is_empty()
                    && s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            })
        })
        .map(BackendRef::of)
}

#[derive(Default)]
struct Accumulator {
    prefix_count: u64,
    last_event: Option<Timestamp>,
    t2_hits: u64,
    t2_queries: u64,
    pods: BTreeSet<String>,
    incomplete: BTreeSet<String>,
}

/// Splits `snapshot` by owning backend. `pods` are the engine pods of the
/// snapshot's tenants (any superset works); `backends` every CacheBackend.
pub fn attribute(
    snapshot: &Snapshot,
    pods: &[impl Borrow<Pod>],
    backends: &[impl Borrow<CacheBackend>],
) -> Attribution {
    let by_key: HashMap<(&str, &str), &Pod> = pods
        .iter()
        .map(Borrow::borrow)
        .filter_map(|p| {
            Some((
                (
                    p.metadata.namespace.as_deref()?,
                    p.metadata.name.as_deref()?,
                ),
                p,
            ))
        })
        .collect();
    let mut owners: HashMap<(&str, &str), Option<BackendRef>> = HashMap::new();
    let mut acc: BTreeMap<BackendRef, Accumulator> = BTreeMap::new();
    let mut out = Attribution::default();
    for row in &snapshot.replicas {
        let key = (row.tenant.as_str(), row.replica_id.as_str());
        let Some(pod) = by_key.get(&key) else {
            out.pod_missing += 1;
            continue;
        };
        let owner = owners
            .entry(key)
            .or_insert_with(|| owner_of(pod, backends))
            .clone();
        let Some(owner) = owner else {
            out.unclaimed += 1;
            continue;
        };
        let a = acc.entry(owner).or_default();
        a.prefix_count = a.prefix_count.saturating_add(row.prefix_count);
        a.last_event = a.last_event.max(last_event(row));
        if let (Some(hits), Some(queries)) = (row.tier2_hits, row.tier2_queries) {
            a.t2_hits = a.t2_hits.saturating_add(hits);
            a.t2_queries = a.t2_queries.saturating_add(queries);
        }
        a.pods.insert(row.replica_id.clone());
        if row.history_incomplete {
            a.incomplete.insert(row.replica_id.clone());
        }
    }
    for (backend, a) in acc {
        let t2_hit_rate = rate(a.t2_hits, a.t2_queries);
        out.by_backend.insert(
            backend,
            BackendShare {
                participation: IndexParticipation {
                    prefix_count: i64::try_from(a.prefix_count).unwrap_or(i64::MAX),
                    last_event_at: a.last_event.map(whole_seconds),
                    hit_rate: None,
                    t2_hit_rate: t2_hit_rate.map(format_rate),
                    history_incomplete_replicas: i64::try_from(a.incomplete.len())
                        .unwrap_or(i64::MAX),
                },
                t2_hit_rate,
                replicas: a.pods.len(),
            },
        );
    }
    out
}

/// What `status.indexParticipation` must become after a successful scrape,
/// given its current value and the backend's share (`None` when no row was
/// attributed). `None` means leave it unset: a backend never named by a
/// scrape has no participation object yet. A backend that had one and now
/// owns no row is reset to a zero count with no event time, so stale
/// positive values do not survive a drain.
pub fn next_participation(
    current: Option<&IndexParticipation>,
    share: Option<&BackendShare>,
) -> Option<IndexParticipation> {
    match (share, current) {
        (Some(s), _) => Some(s.participation.clone()),
        (None, Some(_)) => Some(IndexParticipation::default()),
        (None, None) => None,
    }
}

/// `hits / queries`, or `None` when tier 2 was never queried.
pub fn rate(hits: u64, queries: u64) -> Option<f64> {
    if queries == 0 {
        return None;
    }
    #[allow(clippy::cast_precision_loss)]
    let r = hits as f64 / queries as f64;
    Some(r.clamp(0.0, 1.0))
}

/// A rate as the status decimal: at most four places, no trailing zeros
/// (`0`, `0.25`, `1`).
pub fn format_rate(r: f64) -> String {
    let s = format!("{:.4}", r.clamp(0.0, 1.0));
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() { "0".into() } else { s.into() }
}

fn whole_seconds(at: Timestamp) -> Time {
    Time(Timestamp::from_second(at.as_second()).unwrap_or(at))
}

// === CacheIndex ===

/// The cluster-wide CacheIndex status fields of a successful scrape at `now`
/// (conditions and observedGeneration are the caller's). Rows of one pod are
/// merged; per-tenant memory is deliberately always 0 (see
/// `replicas[].cacheMemoryBytes` for the honest per-replica figure).
pub fn cache_index_status(snapshot: &Snapshot, now: Timestamp) -> CacheIndexStatus {
    let mut replicas: BTreeMap<(String, String), ReplicaIndexStatus> = BTreeMap::new();
    for row in &snapshot.replicas {
        let r = replicas
            .entry((row.tenant.clone(), row.replica_id.clone()))
            .or_insert_with(|| ReplicaIndexStatus {
                tenant: row.tenant.clone(),
                replica_id: row.replica_id.clone(),
                ..ReplicaIndexStatus::default()
            });
        // The lowest rank's identity wins; rows arrive in no promised order.
        if r.address.is_none() || row.dp_rank == 0 {
            r.address = non_empty(&row.address).or(r.address.take());
            r.model = non_empty(&row.model).or(r.model.take());
            r.hash_scheme = non_empty(&row.hash_scheme).or(r.hash_scheme.take());
        }
        r.prefix_count = r
            .prefix_count
            .saturating_add(i64::try_from(row.prefix_count).unwrap_or(i64::MAX));
        let last = last_event(row).map(whole_seconds);
        if last > r.last_event_at {
            r.last_event_at = last;
        }
        r.cache_memory_bytes = r.cache_memory_bytes.saturating_add(
            row.cache_memory_bytes
                .map_or(0, |b| i64::try_from(b).unwrap_or(i64::MAX)),
        );
        r.hit_rate_reported |= row.hit_rate_reported;
        r.history_incomplete |= row.history_incomplete;
    }
    let mut tenants: BTreeMap<String, TenantIndexStatus> = BTreeMap::new();
    for r in replicas.values() {
        let t = tenants
            .entry(r.tenant.clone())
            .or_insert_with(|| TenantIndexStatus {
                tenant: r.tenant.clone(),
                ..TenantIndexStatus::default()
            });
        t.replica_count += 1;
        t.prefix_count = t.prefix_count.saturating_add(r.prefix_count);
        t.memory_used = 0;
        t.hit_rate_reported |= r.hit_rate_reported;
    }
    let replicas: Vec<ReplicaIndexStatus> = replicas.into_values().collect();
    CacheIndexStatus {
        replica_count: i32::try_from(replicas.len()).unwrap_or(i32::MAX),
        prefix_count: replicas
            .iter()
            .fold(0i64, |sum, r| sum.saturating_add(r.prefix_count)),
        replicas,
        tenants: tenants.into_values().collect(),
        last_scrape_at: Some(whole_seconds(now)),
        observed_generation: None,
        conditions: Vec::new(),
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use ic_api::cachebackend::{CacheBackendSpec, EngineSelector, Runtime};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn backend(ns: &str, name: &str, selector: &[(&str, &str)]) -> CacheBackend {
        let mut spec: CacheBackendSpec = serde_json::from_value(serde_json::json!({
            "runtime": "VLLM"
        }))
        .unwrap();
        assert_eq!(spec.runtime, Runtime::Vllm);
        if !selector.is_empty() {
            spec.engine_selector = Some(EngineSelector {
                match_labels: selector
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            });
        }
        let mut b = CacheBackend::new(name, spec);
        b.metadata.namespace = Some(ns.into());
        b
    }

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)], injected_by: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).into(), (*v).into()))
                        .collect(),
                ),
                annotations: injected_by
                    .map(|v| [(annotations::INJECTED_BY.to_owned(), v.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn row(ns: &str, id: &str, prefixes: u64, last: Option<&str>) -> SnapshotReplica {
        SnapshotReplica {
            tenant: ns.into(),
            replica_id: id.into(),
            prefix_count: prefixes,
            last_event_at: last.map(Into::into),
            ..SnapshotReplica::default()
        }
    }

    fn r(ns: &str, name: &str) -> BackendRef {
        BackendRef {
            namespace: ns.into(),
            name: name.into(),
        }
    }

    #[test]
    fn parses_the_server_schema() {
        let body = r#"{"generatedAt": "2026-11-30T05:00:00Z", "entries": 3,
          "replicas": [{"tenant": "ns", "replicaId": "pod-0", "dpRank": 0,
            "address": "10.0.0.7:8000", "model": "m", "hashScheme": "vllm",
            "adapter": "", "prefixCount": 3, "t1Count": 2, "blockSize": 16,
            "lastEventAt": null, "lastSeenAt": "2026-11-30T05:00:00Z",
            "cacheMemoryBytes": null, "hitRateReported": false,
            "tier2Hits": 3, "tier2Queries": 10, "futureField": 1}]}"#;
        let s: Snapshot = serde_json::from_str(body).unwrap();
        assert_eq!(s.entries, 3);
        assert_eq!(s.replicas[0].replica_id, "pod-0");
        assert_eq!(s.replicas[0].tier2_queries, Some(10));
        assert_eq!(s.replicas[0].last_event_at, None);
    }

    #[test]
    fn annotation_wins_over_selector_and_selector_falls_back_by_name() {
        let backends = [
            backend("a", "zeta", &[("app", "llm")]),
            backend("a", "alpha", &[("app", "llm")]),
            backend("a", "empty", &[]),
            backend("a", "annotated", &[("app", "other")]),
        ];
        // Annotation names an existing backend: it wins even if the selector disagrees.
        let p = pod("a", "p0", &[("app", "llm")], Some("a/annotated"));
        assert_eq!(owner_of(&p, &backends), Some(r("a", "annotated")));
        // Annotation naming nothing: selector fallback, first by name.
        let p = pod("a", "p1", &[("app", "llm")], Some("a/gone"));
        assert_eq!(owner_of(&p, &backends), Some(r("a", "alpha")));
        // Empty selectors never claim by vacuous truth.
        let p = pod("a", "p2", &[("x", "y")], None);
        assert_eq!(owner_of(&p, &backends), None);
        // The annotation still attributes to a backend with an empty selector.
        let p = pod("a", "p3", &[], Some("a/empty"));
        assert_eq!(owner_of(&p, &backends), Some(r("a", "empty")));
        // Selectors never cross namespaces.
        let p = pod("b", "p4", &[("app", "llm")], None);
        assert_eq!(owner_of(&p, &backends), None);
    }

    #[test]
    fn shares_sum_rows_and_take_the_latest_event() {
        let backends = [backend("a", "cache", &[("app", "llm")])];
        let pods = [
            pod("a", "p0", &[("app", "llm")], None),
            pod("a", "p1", &[("app", "llm")], None),
            pod("a", "stray", &[("app", "other")], None),
        ];
        let mut rows = vec![
            row("a", "p0", 10, Some("2026-11-30T05:00:01Z")),
            row("a", "p1", 5, Some("2026-11-30T05:00:09Z")),
            row("a", "p1", 1, None),
            row("a", "stray", 7, None),
            row("a", "drained", 3, None),
        ];
        rows[2].dp_rank = 1;
        // One rank of p1 lacks early history: the pod counts once.
        rows[2].history_incomplete = true;
        rows[0].tier2_hits = Some(1);
        rows[0].tier2_queries = Some(4);
        let a = attribute(
            &Snapshot {
                replicas: rows,
                ..Snapshot::default()
            },
            &pods,
            &backends,
        );
        assert_eq!(a.pod_missing, 1);
        assert_eq!(a.unclaimed, 1);
        let share = &a.by_backend[&r("a", "cache")];
        assert_eq!(share.replicas, 2);
        assert_eq!(share.participation.prefix_count, 16);
        assert_eq!(
            share.participation.last_event_at.as_ref().unwrap().0,
            "2026-11-30T05:00:09Z".parse::<Timestamp>().unwrap()
        );
        assert_eq!(share.participation.hit_rate, None);
        assert_eq!(share.participation.t2_hit_rate.as_deref(), Some("0.25"));
        assert_eq!(share.t2_hit_rate, Some(0.25));
        assert_eq!(share.participation.history_incomplete_replicas, 1);
    }

    #[test]
    fn t2_rate_absent_until_queried_and_zero_when_never_hit() {
        assert_eq!(rate(0, 0), None);
        assert_eq!(rate(0, 5).map(format_rate).as_deref(), Some("0"));
        assert_eq!(rate(5, 5).map(format_rate).as_deref(), Some("1"));
        assert_eq!(format_rate(1.0 / 3.0), "0.3333");
        // Rows without counters do not dilute the rate.
        let backends = [backend("a", "cache", &[("app", "llm")])];
        let pods = [pod("a", "p0", &[("app", "llm")], None)];
        let a = attribute(
            &Snapshot {
                replicas: vec![row("a", "p0", 1, None)],
                ..Snapshot::default()
            },
            &pods,
            &backends,
        );
        assert_eq!(
            a.by_backend[&r("a", "cache")].participation.t2_hit_rate,
            None
        );
        // Serialized shape: prefixCount always present, the rest absent.
        let v = serde_json::to_value(&a.by_backend[&r("a", "cache")].participation).unwrap();
        assert_eq!(v, serde_json::json!({"prefixCount": 1}));
    }

    #[test]
    fn drained_backends_reset_to_zero_and_unnamed_stay_unset() {
        let share = BackendShare {
            participation: IndexParticipation {
                prefix_count: 4,
                ..IndexParticipation::default()
            },
            t2_hit_rate: None,
            replicas: 1,
        };
        let had = IndexParticipation {
            prefix_count: 9,
            last_event_at: Some(whole_seconds(Timestamp::UNIX_EPOCH)),
            hit_rate: None,
            t2_hit_rate: Some("0.5".into()),
            history_incomplete_replicas: 1,
        };
        assert_eq!(
            next_participation(Some(&had), Some(&share))
                .unwrap()
                .prefix_count,
            4
        );
        assert_eq!(
            next_participation(Some(&had), None),
            Some(IndexParticipation::default())
        );
        assert_eq!(next_participation(None, None), None);
    }

    #[test]
    fn cache_index_merges_ranks_and_zeroes_tenant_memory() {
        let mut rows = vec![
            row("a", "p0", 10, Some("2026-11-30T05:00:01Z")),
            row("a", "p0", 2, Some("2026-11-30T05:00:05Z")),
            row("b", "q0", 1, None),
        ];
        rows[0].address = "10.0.0.1:8000".into();
        rows[0].model = "m".into();
        rows[0].cache_memory_bytes = Some(100);
        rows[1].history_incomplete = true;
        rows[1].dp_rank = 1;
        rows[1].cache_memory_bytes = Some(50);
        rows[2].hit_rate_reported = true;
        let now = "2026-11-30T06:00:00.700Z".parse::<Timestamp>().unwrap();
        let s = cache_index_status(
            &Snapshot {
                replicas: rows,
                entries: 13,
                generated_at: String::new(),
            },
            now,
        );
        assert_eq!(s.replica_count, 2);
        assert_eq!(s.prefix_count, 13);
        assert_eq!(s.replicas[0].replica_id, "p0");
        assert_eq!(s.replicas[0].cache_memory_bytes, 150);
        assert!(
            s.replicas[0].history_incomplete,
            "any rank's gap marks the pod"
        );
        assert_eq!(s.replicas[0].prefix_count, 12);
        assert_eq!(s.replicas[0].address.as_deref(), Some("10.0.0.1:8000"));
        assert_eq!(
            s.replicas[0].last_event_at.as_ref().unwrap().0.as_second(),
            "2026-11-30T05:00:05Z"
                .parse::<Timestamp>()
                .unwrap()
                .as_second()
        );
        assert_eq!(s.tenants.len(), 2);
        assert!(s.tenants.iter().all(|t| t.memory_used == 0));
        assert!(s.tenants[1].hit_rate_reported);
        assert_eq!(s.last_scrape_at.unwrap().0.subsec_nanosecond(), 0);
        // An empty scrape is a real observation: zeros, not stale rows.
        let empty = cache_index_status(&Snapshot::default(), now);
        assert_eq!((empty.replica_count, empty.prefix_count), (0, 0));
        assert!(empty.replicas.is_empty());
    }
}
