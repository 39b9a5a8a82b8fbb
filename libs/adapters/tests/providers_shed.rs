//! Shed-list tests: for every mode flip, what the previous mode applied and
//! the new mode no longer wants is in the new shed list, and the shed list
//! never names an object the new mode applies.

mod providers_support;

use std::collections::BTreeSet;

use ic_adapters::providers::{ObjectRef, OwnedKind, owned_object_refs, render};
use serde_json::{Value, json};

use providers_support::backend;

fn r(kind: OwnedKind, name: &str) -> ObjectRef {
    ObjectRef {
        kind,
        name: name.to_owned(),
    }
}

fn desired(spec: &Value) -> BTreeSet<ObjectRef> {
    render(&backend(spec.clone()))
        .expect("renders")
        .managed
        .map(|m| m.refs().into_iter().collect())
        .unwrap_or_default()
}

fn shed(spec: &Value) -> BTreeSet<ObjectRef> {
    render(&backend(spec.clone()))
        .expect("renders")
        .shed
        .into_iter()
        .collect()
}

/// Flipping `before` → `after` sheds exactly `before`'s objects that `after`
/// does not apply (among everything else `after` does not apply).
fn assert_flip(before: &Value, after: &Value, gone: &[ObjectRef]) {
    let was = desired(before);
    let now = desired(after);
    let shed_now = shed(after);
    assert!(
        shed_now.is_disjoint(&now),
        "shed overlaps desired: {shed_now:?} / {now:?}"
    );
    let dropped: BTreeSet<ObjectRef> = was.difference(&now).cloned().collect();
    let expected: BTreeSet<ObjectRef> = gone.iter().cloned().collect();
    assert_eq!(dropped, expected, "objects the flip drops");
    assert!(
        dropped.is_subset(&shed_now),
        "every dropped object is shed: {dropped:?} ⊄ {shed_now:?}"
    );
    let all: BTreeSet<ObjectRef> = owned_object_refs(&backend(after.clone()))
        .expect("refs")
        .into_iter()
        .collect();
    let union: BTreeSet<ObjectRef> = shed_now.union(&now).cloned().collect();
    assert_eq!(union, all, "shed ∪ desired is the whole candidate set");
}

fn redis(extra: Value) -> Value {
    let mut spec = json!({
        "runtime": "VLLM",
        "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
    });
    merge(&mut spec, extra);
    spec
}

fn merge(into: &mut Value, extra: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), extra) {
        a.extend(b);
    }
}

#[test]
fn deployment_to_statefulset_sheds_the_deployment() {
    assert_flip(
        &redis(json!({})),
        &redis(json!({"deploymentKind": "StatefulSet"})),
        &[r(OwnedKind::Deployment, "llama-redis")],
    );
}

#[test]
fn statefulset_to_deployment_sheds_the_statefulset() {
    assert_flip(
        &redis(json!({"deploymentKind": "StatefulSet"})),
        &redis(json!({})),
        &[r(OwnedKind::StatefulSet, "llama-redis")],
    );
}

#[test]
fn removing_autoscaling_sheds_the_hpa() {
    assert_flip(
        &redis(json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 3}})),
        &redis(json!({})),
        &[r(OwnedKind::HorizontalPodAutoscaler, "llama-redis")],
    );
}

#[test]
fn adding_autoscaling_sheds_nothing_that_was_applied() {
    assert_flip(
        &redis(json!({})),
        &redis(json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 3}})),
        &[],
    );
}

#[test]
fn kind_flip_with_autoscaling_keeps_the_hpa_and_retargets_it() {
    let after = redis(json!({
        "deploymentKind": "StatefulSet",
        "autoscaling": {"minReplicas": 1, "maxReplicas": 3},
    }));
    assert_flip(
        &redis(json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 3}})),
        &after,
        &[r(OwnedKind::Deployment, "llama-redis")],
    );
    let hpa = render(&backend(after))
        .unwrap()
        .managed
        .unwrap()
        .hpa
        .unwrap();
    let target = hpa.spec.unwrap().scale_target_ref;
    assert_eq!(
        (target.kind.as_str(), target.name.as_str()),
        ("StatefulSet", "llama-redis")
    );
}

#[test]
fn provider_switch_sheds_the_old_provider() {
    let lm = json!({
        "runtime": "VLLM",
        "remoteStorage": {"provider": "LMCacheServer", "ownership": "Managed"},
        "autoscaling": {"minReplicas": 1, "maxReplicas": 2},
    });
    assert_flip(
        &lm,
        &redis(json!({})),
        &[
            r(OwnedKind::Deployment, "llama-lmcache-server"),
            r(OwnedKind::Service, "llama-lmcache-server"),
            r(OwnedKind::HorizontalPodAutoscaler, "llama-lmcache-server"),
        ],
    );
    let mooncake = json!({
        "runtime": "VLLM",
        "remoteStorage": {"provider": "Mooncake", "ownership": "Managed"},
    });
    assert_flip(
        &redis(json!({"deploymentKind": "StatefulSet"})),
        &mooncake,
        &[
            r(OwnedKind::StatefulSet, "llama-redis"),
            r(OwnedKind::Service, "llama-redis"),
        ],
    );
}

#[test]
fn mooncake_never_keeps_an_hpa() {
    // A CR stored before the singleton admission rule: autoscaling is ignored
    // and any HPA a previous provider left is shed.
    let spec = json!({
        "runtime": "VLLM",
        "replicas": 3,
        "autoscaling": {"minReplicas": 1, "maxReplicas": 4},
        "remoteStorage": {"provider": "Mooncake", "ownership": "Managed"},
    });
    assert!(shed(&spec).contains(&r(
        OwnedKind::HorizontalPodAutoscaler,
        "llama-mooncake-master"
    )));
    assert_eq!(
        desired(&spec),
        BTreeSet::from([
            r(OwnedKind::Deployment, "llama-mooncake-master"),
            r(OwnedKind::Service, "llama-mooncake-master"),
        ])
    );
}

#[test]
fn modes_that_provision_nothing_shed_everything() {
    let managed = redis(json!({"autoscaling": {"minReplicas": 1, "maxReplicas": 3}}));
    let all_redis = [
        r(OwnedKind::Deployment, "llama-redis"),
        r(OwnedKind::Service, "llama-redis"),
        r(OwnedKind::HorizontalPodAutoscaler, "llama-redis"),
    ];
    let nothing = [
        // Offload → EventsOnly.
        json!({"runtime": "VLLM", "integration": {"mode": "EventsOnly"}}),
        // Managed → External.
        json!({"runtime": "VLLM", "remoteStorage": {
            "provider": "Redis", "ownership": "External", "endpoint": "redis.cache.svc:6379"}}),
        // remoteStorage removed: host-only.
        json!({"runtime": "VLLM", "lmCache": {"hostMemory": {"capacity": "8Gi"}}}),
        // Engine-local HiCache.
        json!({"runtime": "SGLang", "type": "SGLangHiCache", "hiCache": {"sizeGB": 64}}),
        // EventsOnly even with a (rejected) managed remoteStorage stored.
        json!({"runtime": "VLLM", "integration": {"mode": "EventsOnly"},
               "remoteStorage": {"provider": "Redis", "ownership": "Managed"}}),
    ];
    for after in &nothing {
        assert_flip(&managed, after, &all_redis);
        let out = render(&backend(after.clone())).unwrap();
        assert!(out.managed.is_none(), "{after}");
        assert_eq!(out.shed.len(), 12, "{after}");
    }
}

#[test]
fn full_shed_list_is_sorted_and_exact() {
    let out = render(&backend(json!({"runtime": "VLLM"}))).unwrap();
    let names = [
        "llama-lmcache-server",
        "llama-mooncake-master",
        "llama-redis",
    ];
    let mut want = Vec::new();
    for kind in OwnedKind::ALL {
        for n in names {
            want.push(r(kind, n));
        }
    }
    assert_eq!(out.shed, want);
}

#[test]
fn host_only_needs_no_uid_or_namespace() {
    let mut b = backend(json!({"runtime": "VLLM"}));
    b.metadata.uid = None;
    b.metadata.namespace = None;
    let out = render(&b).expect("nothing to own, nothing to fail");
    assert!(out.managed.is_none());
    assert_eq!(out.shed.len(), 12);
}
