//! Focused rendering checks written by hand (independent of the golden
//! fixtures): labels, owner reference, the Redis defaults, the Mooncake
//! network shape, endpoints, names and the error cases.

mod providers_support;

use ic_adapters::providers::{
    ManagedProvider, RenderError, Workload, component, object_name, redis_maxmemory_bytes, render,
    selector_labels, service_endpoint,
};
use ic_api::cachebackend::StorageProvider;
use k8s_openapi::api::core::v1::PodSpec;
use serde_json::{Value, json};

use providers_support::{UID, backend, named};

fn managed(spec: Value) -> ManagedProvider {
    render(&backend(spec))
        .expect("renders")
        .managed
        .expect("managed")
}

fn pod(m: &ManagedProvider) -> PodSpec {
    match &m.workload {
        Workload::Deployment(d) => d.spec.as_ref().and_then(|s| s.template.spec.clone()),
        Workload::StatefulSet(s) => s.spec.as_ref().and_then(|s| s.template.spec.clone()),
    }
    .expect("pod spec")
}

#[test]
fn redis_defaults_deployment_by_hand() {
    let m = managed(json!({
        "runtime": "VLLM",
        "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
    }));
    let Workload::Deployment(d) = &m.workload else {
        panic!("Deployment expected")
    };
    let labels = json!({
        "app.kubernetes.io/instance": "llama-redis",
        "app.kubernetes.io/managed-by": "inferencecache",
        "app.kubernetes.io/name": "redis",
        "inferencecache.io/cachebackend": "llama",
        "inferencecache.io/component": "redis",
    });
    let selector = json!({
        "inferencecache.io/cachebackend": "llama",
        "inferencecache.io/component": "redis",
    });
    let owner = json!([{
        "apiVersion": "inferencecache.io/v1alpha1",
        "kind": "CacheBackend",
        "name": "llama",
        "uid": UID,
        "controller": true,
        "blockOwnerDeletion": true,
    }]);
    let probe = |delay: i32, period: i32, failures: i32| {
        json!({
            "tcpSocket": {"port": "redis"},
            "initialDelaySeconds": delay,
            "periodSeconds": period,
            "timeoutSeconds": 1,
            "failureThreshold": failures,
        })
    };
    let want = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "llama-redis",
            "namespace": "inference",
            "labels": labels,
            "ownerReferences": owner,
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{
                    "name": "redis",
                    "image": "docker.io/library/redis:7.4.2-alpine",
                    "args": [
                        "redis-server", "--port", "6379", "--protected-mode", "no",
                        "--save", "", "--appendonly", "no",
                        "--maxmemory", "6871947673",
                        "--maxmemory-policy", "allkeys-lru",
                    ],
                    "ports": [{"name": "redis", "containerPort": 6379, "protocol": "TCP"}],
                    "readinessProbe": probe(2, 5, 3),
                    "livenessProbe": probe(15, 10, 6),
                    "resources": {
                        "requests": {"memory": "4Gi"},
                        "limits": {"memory": "8Gi"},
                    },
                }]},
            },
        },
    });
    assert_eq!(serde_json::to_value(d).unwrap(), want);
    let svc = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "llama-redis",
            "namespace": "inference",
            "labels": labels,
            "ownerReferences": owner,
        },
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "redis", "port": 6379, "targetPort": "redis", "protocol": "TCP"}],
        },
    });
    assert_eq!(serde_json::to_value(&m.service).unwrap(), svc);
    assert!(m.hpa.is_none());
}

#[test]
fn mooncake_is_a_host_network_singleton_behind_a_headless_service() {
    let m = managed(json!({
        "runtime": "VLLM",
        "replicas": 5,
        "remoteStorage": {"provider": "Mooncake", "ownership": "Managed"},
    }));
    let Workload::Deployment(d) = &m.workload else {
        panic!("Deployment expected")
    };
    let spec = d.spec.as_ref().unwrap();
    assert_eq!(spec.replicas, Some(1));
    assert_eq!(
        spec.strategy.as_ref().and_then(|s| s.type_.as_deref()),
        Some("Recreate")
    );
    let p = pod(&m);
    assert_eq!(p.host_network, Some(true));
    assert_eq!(p.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    let ports: Vec<(i32, Option<i32>)> = p.containers[0]
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.container_port, p.host_port))
        .collect();
    assert_eq!(
        ports,
        [(50051, Some(50051)), (8080, Some(8080)), (9003, Some(9003))]
    );
    let svc = m.service.spec.as_ref().unwrap();
    assert_eq!(svc.cluster_ip.as_deref(), Some("None"));
    let svc_ports: Vec<i32> = svc.ports.as_ref().unwrap().iter().map(|p| p.port).collect();
    assert_eq!(svc_ports, [50051, 8080]);
}

#[test]
fn endpoints_are_bare_host_port_from_the_first_service_port() {
    let cases = [
        ("Redis", "llama-redis.inference.svc:6379"),
        ("LMCacheServer", "llama-lmcache-server.inference.svc:65432"),
        ("Mooncake", "llama-mooncake-master.inference.svc:50051"),
    ];
    for (provider, want) in cases {
        let m = managed(json!({
            "runtime": "VLLM",
            "remoteStorage": {"provider": provider, "ownership": "Managed"},
        }));
        assert_eq!(service_endpoint(&m.service).as_deref(), Some(want));
        assert_eq!(m.endpoint().as_deref(), Some(want));
    }
    let mut bare = k8s_openapi::api::core::v1::Service::default();
    assert_eq!(service_endpoint(&bare), None);
    bare.metadata.name = Some("x".into());
    bare.metadata.namespace = Some("y".into());
    assert_eq!(service_endpoint(&bare), None, "no ports, no endpoint");
}

#[test]
fn template_overrides_never_touch_the_container_or_host_network() {
    let m = managed(json!({
        "runtime": "VLLM",
        "remoteStorage": {"provider": "LMCacheServer", "ownership": "Managed"},
        "template": {"serviceAccountName": "sa", "terminationGracePeriodSeconds": 0},
    }));
    let p = pod(&m);
    assert_eq!(p.service_account_name.as_deref(), Some("sa"));
    assert_eq!(p.termination_grace_period_seconds, Some(0));
    assert_eq!(p.host_network, None);
    assert_eq!(p.containers.len(), 1);
    assert_eq!(p.containers[0].name, "lmcache-server");
}

#[test]
fn positive_cpu_request_survives_autoscaling() {
    let m = managed(json!({
        "runtime": "VLLM",
        "autoscaling": {"minReplicas": 1, "maxReplicas": 3},
        "remoteStorage": {"provider": "Redis", "ownership": "Managed",
            "redis": {"resources": {"requests": {"cpu": "1"}}}},
    }));
    let res = pod(&m).containers[0].resources.clone().unwrap();
    let cpu = res.requests.unwrap().get("cpu").cloned().unwrap();
    assert_eq!(cpu.0, "1");
    assert!(
        res.limits.is_none(),
        "an explicit block gets no memory defaults"
    );
}

#[test]
fn negative_cpu_request_is_replaced_under_autoscaling() {
    let m = managed(json!({
        "runtime": "VLLM",
        "autoscaling": {"minReplicas": 1, "maxReplicas": 3},
        "remoteStorage": {"provider": "LMCacheServer", "ownership": "Managed",
            "lmCacheServer": {"resources": {"requests": {"cpu": "-1m", "memory": "2Gi"}}}},
    }));
    let res = pod(&m).containers[0].resources.clone().unwrap();
    let req = res.requests.unwrap();
    assert_eq!(req.get("cpu").map(|q| q.0.as_str()), Some("250m"));
    assert_eq!(req.get("memory").map(|q| q.0.as_str()), Some("2Gi"));
}

#[test]
fn hpa_floor_falls_back_to_replicas_capped_at_the_ceiling() {
    let m = managed(json!({
        "runtime": "VLLM",
        "replicas": 9,
        "autoscaling": {"maxReplicas": 4},
        "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
    }));
    let spec = m.hpa.unwrap().spec.unwrap();
    assert_eq!((spec.min_replicas, spec.max_replicas), (Some(4), 4));
    let m = managed(json!({
        "runtime": "VLLM",
        "replicas": 0,
        "autoscaling": {"maxReplicas": 4},
        "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
    }));
    assert_eq!(m.hpa.unwrap().spec.unwrap().min_replicas, Some(1));
}

#[test]
fn missing_uid_is_an_error() {
    let spec = json!({
        "runtime": "VLLM",
        "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
    });
    let mut b = backend(spec.clone());
    b.metadata.uid = None;
    assert_eq!(
        render(&b),
        Err(RenderError::MissingUid("inference/llama".into()))
    );
    b.metadata.uid = Some(String::new());
    assert_eq!(
        render(&b),
        Err(RenderError::MissingUid("inference/llama".into()))
    );
}

#[test]
fn missing_name_or_namespace_is_an_error() {
    let spec = json!({
        "runtime": "VLLM",
        "remoteStorage": {"provider": "Mooncake", "ownership": "Managed"},
    });
    let mut b = backend(spec.clone());
    b.metadata.namespace = None;
    assert_eq!(
        render(&b),
        Err(RenderError::MissingNamespace("llama".into()))
    );
    let mut b = backend(spec);
    b.metadata.name = None;
    assert_eq!(render(&b), Err(RenderError::MissingName));
}

#[test]
fn unreadable_quantities_name_the_field() {
    let err = render(&backend(json!({
        "runtime": "VLLM",
        "remoteStorage": {"provider": "Redis", "ownership": "Managed",
            "redis": {"resources": {"limits": {"memory": "lots"}}}},
    })))
    .unwrap_err();
    assert!(
        matches!(&err, RenderError::InvalidQuantity { field, .. }
            if field == "spec.remoteStorage.redis.resources.limits.memory"),
        "{err}"
    );
    let err = render(&backend(json!({
        "runtime": "VLLM",
        "autoscaling": {"minReplicas": 1, "maxReplicas": 2},
        "remoteStorage": {"provider": "LMCacheServer", "ownership": "Managed",
            "lmCacheServer": {"resources": {"requests": {"cpu": "one"}}}},
    })))
    .unwrap_err();
    assert!(
        matches!(&err, RenderError::InvalidQuantity { field, .. }
            if field == "spec.remoteStorage.lmCacheServer.resources.requests.cpu"),
        "{err}"
    );
}

#[test]
fn long_backend_names_stay_valid_everywhere() {
    let long = format!("{}.team", "a".repeat(70));
    let out = render(&named(
        &long,
        json!({
            "runtime": "VLLM",
            "remoteStorage": {"provider": "LMCacheServer", "ownership": "Managed"},
        }),
    ))
    .unwrap();
    let m = out.managed.unwrap();
    let name = m.workload.name().to_owned();
    assert!(
        name.len() <= 63 && name.ends_with("-lmcache-server"),
        "{name}"
    );
    assert_eq!(name, object_name(&long, StorageProvider::LMCacheServer));
    let labels = m.service.metadata.labels.unwrap();
    for v in labels.values() {
        assert!(v.len() <= 63, "{v}");
    }
    assert_eq!(
        m.service.spec.unwrap().selector.unwrap(),
        selector_labels(&long, StorageProvider::LMCacheServer)
    );
    // The owner reference keeps the real name.
    assert_eq!(m.service.metadata.owner_references.unwrap()[0].name, long);
    assert!(out.shed.iter().all(|r| r.name.len() <= 63));
}

#[test]
fn components_and_maxmemory_rule() {
    assert_eq!(component(StorageProvider::Redis), "redis");
    assert_eq!(component(StorageProvider::LMCacheServer), "lmcache-server");
    assert_eq!(component(StorageProvider::Mooncake), "mooncake-master");
    assert_eq!(redis_maxmemory_bytes("8Gi"), Ok(6_871_947_673));
    assert_eq!(redis_maxmemory_bytes("10G"), Ok(8_000_000_000));
    assert_eq!(redis_maxmemory_bytes("1"), Ok(1), "never 0 (= unlimited)");
    assert_eq!(redis_maxmemory_bytes("0"), Ok(0));
    assert!(redis_maxmemory_bytes("-1Gi").is_err());
}
