//! The cluster suite (`./dev.sh cluster-test`; never part of `./dev.sh
//! test`): installs the charts into the cluster `KUBECONFIG` names with
//! `helm upgrade --install --wait`, runs `helm test`, creates a namespace with
//! an events-only CacheBackend and a stand-in engine Deployment
//! (`ic-sim-engine`), and checks that the engine pod is wired (the
//! kvevent-subscriber injected), that the backend turns Ready, and that
//! LookupRoute answers PREFIX_MATCH for the engine's prompt with that pod.
//!
//! Needs: `KUBECONFIG`; the images pushed where the cluster pulls them
//! (`IC_CLUSTER_IMAGE_REGISTRY`, e.g. `registry.example.com/inferencecache`,
//! holding the five images and `ic-sim-engine`, tag = the chart's
//! appVersion unless `IC_CLUSTER_IMAGE_TAG`); helm and kubectl.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ic_e2e::chart::{chart_dir, helm_run};
use serde_json::Value;

const RELEASE: &str = "inferencecache";
const SYSTEM: &str = "inferencecache-system";

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("the cluster suite needs {name}"))
}

fn kubectl(args: &[&str]) -> (bool, String) {
    let out = Command::new("kubectl")
        .args(args)
        .output()
        .expect("kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn kubectl_json(args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let (ok, out) = kubectl(&all);
    ok.then(|| serde_json::from_str(&out).ok()).flatten()
}

fn apply(manifest: &str) {
    let mut child = Command::new("kubectl")
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(manifest.as_bytes())
        .unwrap();
    assert!(
        child.wait().unwrap().success(),
        "kubectl apply failed for:\n{manifest}"
    );
}

fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

#[test]
fn install_wire_an_engine_and_route_to_it() {
    env("KUBECONFIG");
    let registry = env("IC_CLUSTER_IMAGE_REGISTRY");
    let tag = std::env::var("IC_CLUSTER_IMAGE_TAG").unwrap_or_default();
    let registry_arg = format!("image.registry={registry}");
    let chart = chart_dir("inference-cache");
    let mut args = vec![
        "upgrade",
        "--install",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        SYSTEM,
        "--create-namespace",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        &registry_arg,
    ];
    let tag_arg = format!("image.tag={tag}");
    if !tag.is_empty() {
        args.extend(["--set", &tag_arg]);
    }
    let (ok, out, err) = helm_run(&args);
    assert!(ok, "helm install failed:\n{out}\n{err}");
    let (ok, out, err) = helm_run(&["test", RELEASE, "--namespace", SYSTEM, "--logs"]);
    assert!(ok, "helm test failed:\n{out}\n{err}");

    let ns = format!("ic-e2e-{}", std::process::id());
    let engine_image = format!(
        "{registry}/ic-sim-engine:{}",
        if tag.is_empty() {
            env!("CARGO_PKG_VERSION")
        } else {
            &tag
        }
    );
    apply(&format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {ns}}}
---
apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata: {{name: routing, namespace: {ns}}}
spec:
  runtime: VLLM
  integration: {{mode: EventsOnly}}
  observation: {{modelID: sim, firstEventTimeout: 5m}}
  engineSelector: {{matchLabels: {{app: sim-engine}}}}
"#
    ));
    apply(&format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata: {{name: sim-engine, namespace: {ns}}}
spec:
  replicas: 1
  selector: {{matchLabels: {{app: sim-engine}}}}
  template:
    metadata: {{labels: {{app: sim-engine}}}}
    spec:
      containers:
        - name: vllm
          image: {engine_image}
          args: ["--kv-events-config", '{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv-events"}}']
          ports: [{{name: http, containerPort: 8000}}]
"#
    ));
    let pod: Value = wait_for(
        "a running, wired engine pod",
        Duration::from_secs(300),
        || {
            let pods = kubectl_json(&["get", "pods", "-n", &ns, "-l", "app=sim-engine"])?;
            let pod = pods["items"].as_array()?.first()?.clone();
            let wired = pod["spec"]["containers"]
                .as_array()?
                .iter()
                .any(|c| c["name"] == "kvevent-subscriber");
            (wired && pod["status"]["phase"] == "Running").then_some(pod)
        },
    );
    let pod_name = pod["metadata"]["name"].as_str().unwrap().to_owned();
    wait_for(
        "the CacheBackend to be Ready",
        Duration::from_secs(300),
        || {
            let b = kubectl_json(&["get", "cachebackend", "routing", "-n", &ns])?;
            b["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        },
    );
    // LookupRoute through a port-forward to the index server.
    let port = ic_e2e::free_port().to_string();
    let mut forward = Command::new("kubectl")
        .args([
            "port-forward",
            "-n",
            SYSTEM,
            "svc/inferencecache-index-server",
            &format!("{port}:9090"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let tokens: Vec<String> = (0..64).map(|t: u32| t.to_string()).collect();
    let answer: Value = wait_for(
        "a PREFIX_MATCH for the engine's prompt",
        Duration::from_secs(120),
        || {
            let out = Command::new(ic_e2e::workspace_binary("icctl"))
                .args([
                    "--index-grpc",
                    &format!("127.0.0.1:{port}"),
                    "-o",
                    "json",
                    "lookup",
                ])
                .args([
                    "--tenant",
                    &ns,
                    "--model",
                    "sim",
                    "--tokens",
                    &tokens.join(","),
                ])
                .output()
                .ok()?;
            let v: Value = serde_json::from_slice(&out.stdout).ok()?;
            (v["outcome"] == "PREFIX_MATCH").then_some(v)
        },
    );
    let _ = forward.kill();
    let _ = forward.wait();
    assert_eq!(answer["best"]["replicaId"], pod_name.as_str(), "{answer}");
    let (ok, out) = kubectl(&["delete", "namespace", &ns, "--wait=false"]);
    assert!(ok, "{out}");
}
