//! What a CacheBackend reconcile reads from the watch-fed stores, at 10,000
//! pods in 100 namespaces: the provider objects it may shed, its
//! cache-server pods, and its engine pods and engine Deployments.
//!
//! `raw_store_scan` is the path before the index: every read filters the
//! whole cluster-wide store down to the namespace (then by selector), a
//! copy of the reconciler's reads as they were. `index_lookup` is the
//! reconciler's reads now: pods and Deployments from the namespace- and
//! label-keyed index, shed candidates by name. Both must select the same.
//!
//! Run: `cargo bench -p ic-controller --bench reconcile_selection`
//! (`IC_BENCH_PODS` / `IC_BENCH_NAMESPACES` change the fleet, default 10000
//! / 100; `IC_BENCH_ONCE=old|new` builds the stores, runs one selection and
//! exits, for `valgrind --tool=callgrind --toggle-collect=...`).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::Criterion;
use ic_adapters::providers::{self, OwnedKind};
use ic_api::cachebackend::CacheBackend;
use ic_controller::backend;
use ic_controller::stores::{self, Stores};
use ic_controller_core::k8s;
use ic_controller_core::observe::{self, BackendRef};
use ic_controller_core::status::EngineObservation;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use serde_json::json;

/// Engine Deployments per namespace (each with `PODS_PER_DEPLOYMENT` pods).
const DEPLOYMENTS: usize = 5;
const PODS_PER_DEPLOYMENT: usize = 4;
/// Cache-server pods of the namespace's managed backend.
const SERVER_PODS: usize = 2;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn backend(ns: &str) -> CacheBackend {
    serde_json::from_value(json!({
        "apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
        "metadata": {"name": "cache", "namespace": ns, "uid": format!("uid-{ns}")},
        "spec": {"runtime": "VLLM", "type": "LMCache",
                 "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
                 "integration": {"mode": "Offload", "role": "ReadWrite", "failOpen": true},
                 "observation": {"modelID": "m", "firstEventTimeout": "5m"},
                 "engineSelector": {"matchLabels": {"app": "llm"}}}
    }))
    .expect("a valid CacheBackend")
}

/// A trimmed pod as the store holds it: labels, injected-by annotations on
/// engine pods, a ReplicaSet owner, two containers and their statuses.
fn pod(ns: &str, name: &str, labels: serde_json::Value, injected: bool, rs: &str) -> Pod {
    let annotations = if injected {
        json!({"inferencecache.io/injected-by": format!("{ns}/cache"),
               "inferencecache.io/injected-by-uid": format!("uid-{ns}")})
    } else {
        json!({})
    };
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}"),
            "labels": labels, "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs,
                                 "uid": format!("uid-{rs}"), "controller": true}]},
        "spec": {"containers": [{"name": "vllm", "image": "vllm"},
                                {"name": "kvevent-subscriber", "image": "s"}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [
                {"name": "vllm", "image": "vllm", "imageID": "", "ready": true, "restartCount": 0},
                {"name": "kvevent-subscriber", "image": "s", "imageID": "", "ready": true, "restartCount": 0}]}
    }))
    .expect("a valid Pod");
    k8s::trim_pod(&mut pod);
    pod
}

fn deployment(ns: &str, name: &str, app: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": PODS_PER_DEPLOYMENT, "selector": {"matchLabels": {"app": app}},
                 "template": {"metadata": {"labels": {"app": app, "deploy": name}},
                              "spec": {"containers": [{"name": "vllm"}]}}}
    }))
    .expect("a valid Deployment")
}

/// A provider Deployment the backend owns but no longer wants (left over
/// from a provider switch): the one object a reconcile sheds.
fn leftover(ns: &str) -> Deployment {
    let name = providers::object_name(
        "cache",
        ic_api::cachebackend::StorageProvider::LMCacheServer,
    );
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns,
            "labels": {ic_api::consts::labels::MANAGED_BY: ic_api::consts::labels::MANAGED_BY_VALUE},
            "ownerReferences": [{"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
                                 "name": "cache", "uid": format!("uid-{ns}"), "controller": true}]},
        "spec": {"replicas": 1, "selector": {}, "template": {"spec": {"containers": [{"name": "server"}]}}}
    }))
    .expect("a valid Deployment")
}

/// Per namespace: the managed backend's server pods, `DEPLOYMENTS` engine
/// Deployments whose pods the backend selects and injected, a leftover
/// provider Deployment to shed, and as many unrelated Deployments and pods
/// as fill the namespace's share.
fn fleet(pods: usize, namespaces: usize) -> (Vec<Pod>, Vec<Deployment>, Vec<CacheBackend>) {
    let per_ns = pods / namespaces;
    let (mut ps, mut ds, mut bs) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0..namespaces {
        let ns = format!("team-{n:03}");
        let b = backend(&ns);
        let server =
            providers::selector_labels("cache", ic_api::cachebackend::StorageProvider::Redis);
        let mut made = 0;
        ds.push(leftover(&ns));
        for i in 0..SERVER_PODS.min(per_ns) {
            let labels = serde_json::to_value(&server).expect("labels");
            ps.push(pod(
                &ns,
                &format!("cache-redis-{i}"),
                labels,
                false,
                "cache-redis-5c",
            ));
            made += 1;
        }
        for d in 0..DEPLOYMENTS {
            let name = format!("llm-{d}");
            ds.push(deployment(&ns, &name, "llm"));
            for i in 0..PODS_PER_DEPLOYMENT {
                if made == per_ns {
                    break;
                }
                let labels = json!({"app": "llm", "deploy": name, "pod-template-hash": "7d9"});
                ps.push(pod(
                    &ns,
                    &format!("{name}-7d9-{i}"),
                    labels,
                    true,
                    &format!("{name}-7d9"),
                ));
                made += 1;
            }
        }
        let mut other = 0;
        while made < per_ns {
            let app = format!("web-{}", other / 8);
            if other % 8 == 0 {
                ds.push(deployment(&ns, &app, &app));
            }
            let labels = json!({"app": app, "pod-template-hash": "6f4"});
            ps.push(pod(
                &ns,
                &format!("{app}-6f4-{other}"),
                labels,
                false,
                &format!("{app}-6f4"),
            ));
            other += 1;
            made += 1;
        }
        bs.push(b);
    }
    (ps, ds, bs)
}

/// What one reconcile selected (kept so the work is not optimised away).
#[derive(Debug, PartialEq)]
struct Selection {
    shed: Vec<String>,
    server_pods: Vec<String>,
    engines: EngineObservation,
}

// === the raw-store scan (the path before the index) ===

fn in_namespace<K>(store: &Store<K>, ns: &str) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut out = store.state_filter(|o| o.meta().namespace.as_deref() == Some(ns));
    out.sort_by_key(|o| o.name_any());
    out
}

fn shed_scan<K>(store: &Store<K>, ns: &str, names: &[&str], owner_uid: &str) -> Vec<String>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut out = Vec::new();
    for object in in_namespace(store, ns) {
        let meta = object.meta();
        let name = meta.name.clone().unwrap_or_default();
        let managed = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(ic_api::consts::labels::MANAGED_BY))
            .is_some_and(|v| v == ic_api::consts::labels::MANAGED_BY_VALUE);
        let owned = meta
            .owner_references
            .as_ref()
            .is_some_and(|o| o.iter().any(|r| r.uid == owner_uid));
        if managed && owned && names.contains(&name.as_str()) {
            out.push(name);
        }
    }
    out
}

#[inline(never)]
fn old_select(stores: &Stores, backend: &CacheBackend, shed: &[providers::ObjectRef]) -> Selection {
    let ns = backend.namespace().unwrap_or_default();
    let name = backend.name_any();
    let uid = backend.metadata.uid.clone().unwrap_or_default();
    let mut shed_names = Vec::new();
    for kind in OwnedKind::ALL {
        let names: Vec<&str> = shed
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| r.name.as_str())
            .collect();
        if names.is_empty() {
            continue;
        }
        shed_names.extend(match kind {
            OwnedKind::Deployment => shed_scan(&stores.deployments, &ns, &names, &uid),
            OwnedKind::StatefulSet => shed_scan(&stores.statefulsets, &ns, &names, &uid),
            OwnedKind::Service => shed_scan(&stores.services, &ns, &names, &uid),
            OwnedKind::HorizontalPodAutoscaler => shed_scan(&stores.hpas, &ns, &names, &uid),
        });
    }
    let selector = providers::selector_labels(&name, ic_api::cachebackend::StorageProvider::Redis);
    let server_pods = in_namespace(&stores.pods, &ns)
        .into_iter()
        .filter(|p| observe::selector_matches(Some(&selector), p.metadata.labels.as_ref()))
        .map(|p| p.name_any())
        .collect();
    let labels: Option<&BTreeMap<String, String>> = backend
        .spec
        .engine_selector
        .as_ref()
        .map(|s| &s.match_labels);
    let r = BackendRef {
        namespace: &ns,
        name: &name,
        uid: &uid,
        match_labels: labels,
    };
    let pods = in_namespace(&stores.pods, &ns)
        .iter()
        .map(|p| observe::summarize_pod(p, r))
        .filter(|p| p.matches_selector || p.injected_by_this)
        .collect();
    let deployments = in_namespace(&stores.deployments, &ns);
    Selection {
        shed: shed_names,
        server_pods,
        engines: EngineObservation {
            pods,
            expected_replicas: k8s::expected_engine_replicas(labels, &deployments),
        },
    }
}

// === the index (the reconciler's reads) ===

#[inline(never)]
fn new_select(stores: &Stores, b: &CacheBackend, shed: &[providers::ObjectRef]) -> Selection {
    let ns = b.namespace().unwrap_or_default();
    let name = b.name_any();
    let uid = b.metadata.uid.clone().unwrap_or_default();
    let mut shed_names = Vec::new();
    for kind in OwnedKind::ALL {
        let names: Vec<&str> = shed
            .iter()
            .filter(|r| r.kind == kind)
            .map(|r| r.name.as_str())
            .collect();
        if names.is_empty() {
            continue;
        }
        shed_names.extend(match kind {
            OwnedKind::Deployment => {
                backend::shed_candidates(&stores.deployments, &ns, &names, &uid)
            }
            OwnedKind::StatefulSet => {
                backend::shed_candidates(&stores.statefulsets, &ns, &names, &uid)
            }
            OwnedKind::Service => backend::shed_candidates(&stores.services, &ns, &names, &uid),
            OwnedKind::HorizontalPodAutoscaler => {
                backend::shed_candidates(&stores.hpas, &ns, &names, &uid)
            }
        });
    }
    let selector = providers::selector_labels(&name, ic_api::cachebackend::StorageProvider::Redis);
    let server_pods = stores
        .index
        .pods
        .matching(&ns, Some(&selector))
        .iter()
        .map(|p| p.name_any())
        .collect();
    Selection {
        shed: shed_names,
        server_pods,
        engines: backend::engines(stores, b, &ns),
    }
}

fn main() {
    let pods = env("IC_BENCH_PODS", 10_000);
    let namespaces = env("IC_BENCH_NAMESPACES", 100).max(1);
    let (ps, ds, bs) = fleet(pods, namespaces);
    let (stores, mut writers) = stores::detached();
    eprintln!(
        "fleet: {} pods, {} deployments, {} namespaces",
        ps.len(),
        ds.len(),
        bs.len()
    );
    stores::replace_all(&mut writers.pods, ps);
    stores::replace_all(&mut writers.deployments, ds);
    stores::replace_all(&mut writers.backends, bs.clone());
    // The backend a reconcile runs for: one in the middle of the fleet.
    let backend = bs[bs.len() / 2].clone();
    let shed = providers::render(&backend).expect("renders").shed;
    if let Ok(which) = std::env::var("IC_BENCH_ONCE") {
        let s = match which.as_str() {
            "old" => old_select(&stores, &backend, &shed),
            "new" => new_select(&stores, &backend, &shed),
            other => panic!("IC_BENCH_ONCE={other}: old or new"),
        };
        black_box(s);
        return;
    }
    let old = old_select(&stores, &backend, &shed);
    assert_eq!(
        old,
        new_select(&stores, &backend, &shed),
        "both paths select the same"
    );
    eprintln!(
        "one selection: {} engine pods, expected replicas {:?}, {} server pods, {} shed",
        old.engines.pods.len(),
        old.engines.expected_replicas,
        old.server_pods.len(),
        old.shed.len()
    );
    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    let mut group = c.benchmark_group(format!("reconcile_selection/{pods}_pods"));
    group.bench_function("raw_store_scan", |b| {
        b.iter(|| old_select(black_box(&stores), black_box(&backend), &shed))
    });
    group.bench_function("index_lookup", |b| {
        b.iter(|| new_select(black_box(&stores), black_box(&backend), &shed))
    });
    group.finish();
    c.final_summary();
}
