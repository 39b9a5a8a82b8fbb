//! Memory one watched Pod costs in the controller's store, full and
//! trimmed (`ic_controller_core::k8s::trim_pod`), measured as the resident
//! set growth of filling a store with `COUNT` realistic engine pods (an
//! injected vLLM pod from the adapters' fixtures, with the status, managed
//! fields and last-applied annotation a real API server returns).
//!
//! `cargo run --release -p ic-controller --example store_memory -- full|trimmed [count]`
//! (one mode per process: freed memory is not reliably returned to the OS).

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector;
use kube::runtime::watcher;
use serde_json::{Value, json};

const FIXTURE: &str = include_str!("../../../libs/adapters/tests/fixtures/vllm_lm_managed.json");

fn rss_bytes() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("no VmRSS in /proc/self/status")?;
    Ok(kb * 1024)
}

fn realistic(template: &Value, i: usize) -> anyhow::Result<Pod> {
    let mut pod = template.clone();
    let names: Vec<String> = pod["spec"]["containers"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    pod["metadata"]["name"] = json!(format!("llm-7d9f8c6b5-{i:05}"));
    pod["metadata"]["namespace"] = json!("team-a");
    pod["metadata"]["uid"] = json!(format!("6f1c2a3e-0000-4000-8000-{i:012}"));
    pod["metadata"]["resourceVersion"] = json!(format!("{}", 100_000 + i));
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] =
        json!(serde_json::to_string(template)?);
    pod["metadata"]["managedFields"] = json!([
        {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
         "time": "2026-12-01T00:00:00Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}},
                      "f:ownerReferences": {".": {}, "k:{\"uid\":\"rs\"}": {}}},
                      "f:spec": {"f:containers": {"k:{\"name\":\"server\"}": {".": {}, "f:args": {}, "f:image": {},
                                 "f:imagePullPolicy": {}, "f:name": {}, "f:resources": {}, "f:terminationMessagePath": {}}}}}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "subresource": "status",
         "time": "2026-12-01T00:00:05Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {},
                                   "f:podIP": {}, "f:podIPs": {}, "f:startTime": {}}}}
    ]);
    let conditions: Vec<Value> = [
        "PodReadyToStartContainers",
        "Initialized",
        "ContainersReady",
        "PodScheduled",
        "Ready",
    ]
    .iter()
    .map(|t| json!({"type": t, "status": "True", "lastTransitionTime": "2026-12-01T00:00:04Z"}))
    .collect();
    let statuses: Vec<Value> = names
        .iter()
        .map(|n| {
            json!({
                "name": n, "image": "vllm/vllm-openai:v0.11.2",
                "imageID": "docker.io/vllm/vllm-openai@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "containerID": "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-12-01T00:00:03Z"}}})
        })
        .collect();
    pod["status"] = json!({
        "phase": "Running", "hostIP": "10.1.0.7", "podIP": "10.2.3.4", "podIPs": [{"ip": "10.2.3.4"}],
        "qosClass": "Burstable", "startTime": "2026-12-01T00:00:01Z",
        "conditions": conditions,
        "containerStatuses": statuses,
    });
    Ok(serde_json::from_value(pod)?)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "trimmed".into());
    let count: usize = args.next().map_or(Ok(20_000), |c| c.parse())?;
    let template = serde_json::from_str::<Value>(FIXTURE)?["pod"].clone();
    let mut sample = realistic(&template, 0)?;
    if mode == "trimmed" {
        ic_controller_core::k8s::trim_pod(&mut sample);
    }
    let wire = serde_json::to_vec(&sample)?.len();
    let (store, mut writer) = reflector::store::<Pod>();
    let before = rss_bytes()?;
    writer.apply_watcher_event(&watcher::Event::Init);
    // One object at a time, as a watch delivers them: only what the store
    // keeps stays resident.
    for i in 0..count {
        let mut pod = realistic(&template, i)?;
        if mode == "trimmed" {
            ic_controller_core::k8s::trim_pod(&mut pod);
        }
        writer.apply_watcher_event(&watcher::Event::InitApply(pod));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let after = rss_bytes()?;
    let per = after.saturating_sub(before) as f64 / count as f64;
    println!(
        "{mode}: {count} pods in the store, {:.0} bytes each resident (JSON {wire} bytes), store holds {}",
        per,
        store.len()
    );
    Ok(())
}
