//! What `ic-controller` calls, recorded from the real binary against the fake
//! API server over HTTP, checked against `charts/inference-cache/rbac/ic-controller.txt`
//! (the chart's test checks that its rendered RBAC grants exactly that file).
//!
//! The seeded cluster makes every loop do its work: two managed backends
//! (a StatefulSet with an HPA, and a Deployment), a stale provider object to
//! shed, an injected engine pod, a CachePolicy, a CacheTenant and a
//! CacheIndex, with a real index server and coordinator behind them and
//! leader election on. `UPDATE_RBAC=1` rewrites the file from the recording
//! (keeping the documented lines the run cannot reach).

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ic_fake_apiserver::rbac::{Permission, permissions};
use ic_fake_apiserver::{FakeApi, write_kubeconfig};
use serde_json::{Value, json};

const NS: &str = "team-a";
const SYSTEM: &str = "ic-system";

fn rbac_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts/inference-cache/rbac/ic-controller.txt")
}

fn seed(fake: &FakeApi, index_http: &str) {
    let backend = |name: &str, spec: Value| {
        json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
               "metadata": {"name": name, "namespace": NS}, "spec": spec})
    };
    let common = |provider: &str| {
        json!({
        "runtime": "VLLM", "type": "LMCache",
        "remoteStorage": {"provider": provider, "ownership": "Managed"},
        "integration": {"mode": "Offload", "role": "ReadWrite", "failOpen": true},
        "observation": {"modelID": "m", "firstEventTimeout": "5m"},
        "engineSelector": {"matchLabels": {"app": "llm"}}})
    };
    let mut redis = common("Redis");
    redis["deploymentKind"] = json!("StatefulSet");
    redis["autoscaling"] = json!({"minReplicas": 1, "maxReplicas": 3});
    let stored = fake.insert(&backend("redis", redis));
    let uid = stored["metadata"]["uid"].as_str().unwrap().to_owned();
    let lmcache = fake.insert(&backend("lmcache", common("LMCacheServer")));
    let lmcache_uid = lmcache["metadata"]["uid"].as_str().unwrap().to_owned();
    // Objects the backends rendered in an earlier shape, all shed: the Redis
    // backend's Deployment (it moved to a StatefulSet), and the LMCache
    // backend's StatefulSet, HPA and a Redis Service (it switched provider).
    let stale = |api: &str, kind: &str, name: &str, backend: &str, uid: &str, spec: Value| {
        json!({"apiVersion": api, "kind": kind,
            "metadata": {"name": name, "namespace": NS,
                "labels": {"app.kubernetes.io/managed-by": "inferencecache", "inferencecache.io/cachebackend": backend},
                "ownerReferences": [{"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
                    "name": backend, "uid": uid, "controller": true, "blockOwnerDeletion": true}]},
            "spec": spec})
    };
    let workload = json!({"selector": {"matchLabels": {"x": "y"}}, "template": {"metadata": {"labels": {"x": "y"}}}});
    fake.insert(&stale(
        "apps/v1",
        "Deployment",
        "redis-redis",
        "redis",
        &uid,
        workload.clone(),
    ));
    fake.insert(&stale(
        "apps/v1",
        "StatefulSet",
        "lmcache-lmcache-server",
        "lmcache",
        &lmcache_uid,
        workload,
    ));
    fake.insert(&stale("autoscaling/v2", "HorizontalPodAutoscaler", "lmcache-lmcache-server", "lmcache", &lmcache_uid,
        json!({"maxReplicas": 2, "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "lmcache-lmcache-server"}})));
    fake.insert(&stale(
        "v1",
        "Service",
        "lmcache-redis",
        "lmcache",
        &lmcache_uid,
        json!({"ports": [{"port": 6379}]}),
    ));
    // An engine Deployment and its wired pod (an Event), whose kernel check failed.
    fake.insert(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "engine", "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llm"}},
                 "template": {"metadata": {"labels": {"app": "llm"}}}}}));
    fake.insert(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "engine-0", "namespace": NS, "uid": "pod-uid-1", "labels": {"app": "llm"},
            "annotations": {"inferencecache.io/injected-by": format!("{NS}/redis"),
                            "inferencecache.io/injected-by-uid": uid,
                            "inferencecache.io/lmcache-kernel-check-mode": "report-only"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm"}]},
        "status": {"phase": "Running",
            "initContainerStatuses": [{"name": "lmcache-kernel-check", "image": "vllm", "imageID": "", "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                    "message": "LMCACHE_KERNELS=failed\nImportError: undefined symbol"}}}],
            "containerStatuses": [{"name": "vllm", "image": "vllm", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {}}}]}}));
    fake.insert(
        &json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CachePolicy",
        "metadata": {"name": "default", "namespace": NS},
        "spec": {"lookupTimeoutMs": 10, "minimumPrefixTokens": 256}}),
    );
    fake.insert(
        &json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheTenant",
        "metadata": {"name": "tenant", "namespace": NS},
        "spec": {"cacheSalt": "team-a", "quota": {"l2Limit": "1Gi"}}}),
    );
    fake.insert(
        &json!({"apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheIndex",
        "metadata": {"name": "default"},
        "spec": {"serverURL": format!("http://{index_http}"), "pollIntervalSeconds": 1}}),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_calls_exactly_what_its_rbac_file_grants() {
    let index = common::IndexServer::start();
    let coordinator = common::Coordinator::start();
    let fake = FakeApi::new();
    seed(&fake, &index.http.to_string());
    let served = fake.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = write_kubeconfig(dir.path(), served.addr, "controller-sa", SYSTEM).unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, common::PROBE_TOKEN).unwrap();
    let mut controller = ic_e2e::ServiceProcess::start_with_env(
        &ic_e2e::workspace_binary("ic-controller"),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--server-probe-url",
            &index.probe_url(),
            "--snapshot-url",
            &index.snapshot_url(),
            "--index-server-grpc",
            &index.grpc_url(),
            "--coordinator-url",
            &coordinator.url(),
            "--kvevent-subscriber-image",
            "subscriber:test",
            "--probe-token-path",
            token.to_str().unwrap(),
            "--snapshot-interval-seconds",
            "1",
            "--resync-interval-seconds",
            "1",
            "--leader-election-namespace",
            SYSTEM,
            "--lease-retry-seconds",
            "1",
        ],
        &[
            ("KUBECONFIG", kubeconfig.to_str().unwrap()),
            ("POD_NAME", "controller-0"),
        ],
    );
    // Run until every loop has written (statuses of each kind, the shed
    // Deployment gone, an Event), then a little longer for resyncs.
    let start = Instant::now();
    loop {
        let done = {
            let got = permissions(&fake.requests());
            [
                "cachebackends/status",
                "cachepolicies/status",
                "cachetenants/status",
                "cacheindexes/status",
            ]
            .iter()
            .all(|r| got.contains(&Permission::new("inferencecache.io", r, "patch")))
                && got.contains(&Permission::new("apps", "deployments", "delete"))
                && got.contains(&Permission::new("apps", "statefulsets", "delete"))
                && got.contains(&Permission::new(
                    "autoscaling",
                    "horizontalpodautoscalers",
                    "delete",
                ))
                && got.contains(&Permission::new("", "services", "delete"))
                && got.contains(&Permission::new("events.k8s.io", "events", "create"))
        };
        if done {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the controller did not finish its work: {:?}",
            permissions(&fake.requests())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(controller.stop().success());
    let recorded = permissions(&fake.requests());

    ic_fake_apiserver::rbac::check_contract(
        &rbac_file(),
        "ic-controller",
        "services/controller/tests/rbac.rs",
        &recorded,
    )
    .unwrap_or_else(|e| panic!("{e}"));
}
