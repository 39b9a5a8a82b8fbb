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
use ic_fake_apiserver::{FakeApi, RecordedRequest, write_kubeconfig};
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
        if start.elapsed() > Duration::from_secs(60) {
            let logs = controller.logs().join("\n");
            panic!(
                "the controller did not finish its work: {:?}\n{logs}",
                permissions(&fake.requests())
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Steady state: the loops keep running, on watch events and timers, and
    // make no LIST (each kind was listed once, when its watch started).
    let lists = |requests: &[RecordedRequest]| -> Vec<String> {
        requests
            .iter()
            .filter(|r| {
                permissions(std::slice::from_ref(*r))
                    .iter()
                    .any(|p| p.verb == "list")
            })
            .map(|r| r.path.clone())
            .collect()
    };
    let initial = lists(&fake.requests());
    assert!(
        initial.len() <= 10,
        "one LIST per watched kind at start: {initial:#?}"
    );
    let admin = controller.admin_addr();
    let passes = |name: &str| -> f64 {
        let (_, body) = ic_e2e::http_get(admin, "/metrics");
        body.lines()
            .filter(|l| {
                l.starts_with("inferencecache_controller_reconciles_total{")
                    && l.contains(&format!("controller=\"{name}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let loops = ["cachebackend", "cacheindex", "cachepolicy", "cachetenant"];
    let before: Vec<f64> = loops.iter().map(|l| passes(l)).collect();
    let mut all = fake.requests();
    fake.clear_requests();
    // Edits every loop reacts to: an engine pod relabelled (reconciles its
    // backend), a policy and a tenant changed.
    let mut pod: Value = fake.get("v1", "pods", NS, "engine-0").unwrap();
    pod["metadata"]["labels"]["touched"] = json!("1");
    fake.insert(&pod);
    let mut policy: Value = fake
        .get("inferencecache.io/v1alpha1", "cachepolicies", NS, "default")
        .unwrap();
    policy["spec"]["minimumPrefixTokens"] = json!(128);
    fake.insert(&policy);
    let mut tenant: Value = fake
        .get("inferencecache.io/v1alpha1", "cachetenants", NS, "tenant")
        .unwrap();
    tenant["spec"]["quota"]["l2Limit"] = json!("2Gi");
    fake.insert(&tenant);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after: Vec<f64> = loops.iter().map(|l| passes(l)).collect();
    for ((name, b), a) in loops.iter().zip(&before).zip(&after) {
        assert!(a > b, "{name} ran no pass in steady state ({b} -> {a})");
    }
    let steady = fake.requests();
    assert_eq!(
        lists(&steady),
        Vec::<String>::new(),
        "LISTs in steady state"
    );
    let policy: Value = fake
        .get("inferencecache.io/v1alpha1", "cachepolicies", NS, "default")
        .unwrap();
    assert_eq!(
        policy["status"]["observedGeneration"],
        policy["metadata"]["generation"]
    );

    assert!(controller.stop().success());
    all.extend(fake.requests());
    let recorded = permissions(&all);

    ic_fake_apiserver::rbac::check_contract(
        &rbac_file(),
        "ic-controller",
        "services/controller/tests/rbac.rs",
        &recorded,
    )
    .unwrap_or_else(|e| panic!("{e}"));
}
