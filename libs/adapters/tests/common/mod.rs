//! Shared builders for the adapters' integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

use ic_adapters::admission::{InjectionConfig, PodAdmission, PodOutcome};
use ic_api::CacheBackend;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// A CacheBackend `ns/name` (uid `uid-<name>`) selecting `app: engine`,
/// with `spec` merged over `{runtime: VLLM}`.
pub fn backend(name: &str, spec: Value) -> CacheBackend {
    backend_with(name, spec, json!({}))
}

/// Like [`backend`], with extra metadata (e.g. annotations) and status.
pub fn backend_with(name: &str, spec: Value, extra: Value) -> CacheBackend {
    let mut s = json!({
        "runtime": "VLLM",
        "engineSelector": {"matchLabels": {"app": "engine"}},
        "observation": {"modelID": "Qwen/Qwen3-8B"},
    });
    merge(&mut s, spec);
    let mut obj = json!({
        "apiVersion": "inferencecache.io/v1alpha1",
        "kind": "CacheBackend",
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}")},
        "spec": s,
    });
    merge(&mut obj, extra);
    serde_json::from_value(obj).expect("backend json")
}

/// Deep-merges `patch` into `base`; `null` deletes a key.
pub fn merge(base: &mut Value, patch: Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(&k);
                } else {
                    merge(b.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (b, p) => *b = p,
    }
}

/// The KV-event publisher the test engines run with (the replay socket and
/// topic included, so the golden files show the subscriber following them).
pub const VLLM_KV_EVENTS: &str = r#"{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv-events"}"#;
/// The same for SGLang, which has no master switch.
pub const SGLANG_KV_EVENTS: &str = r#"{"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv-events"}"#;

/// A one-container engine pod labelled `app: engine` in `team-a`.
pub fn engine_pod(container: Value) -> Pod {
    let mut c = json!({
        "name": "server",
        "image": "vllm/vllm-openai:v0.11.0",
        "args": ["--model", "Qwen/Qwen3-8B", "--kv-events-config", VLLM_KV_EVENTS],
        "ports": [{"containerPort": 8000, "name": "http"}],
    });
    merge(&mut c, container);
    pod(json!({"containers": [c]}))
}

/// A pod `engine-0` in `team-a` labelled `app: engine` with `spec`.
pub fn pod(spec: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "engine-0", "namespace": "team-a", "labels": {"app": "engine"}},
        "spec": spec,
    }))
    .expect("pod json")
}

/// A pod with a JSON patch applied (deep merge).
pub fn patched(pod: &Pod, patch: Value) -> Pod {
    let mut v = serde_json::to_value(pod).expect("pod to json");
    merge(&mut v, patch);
    serde_json::from_value(v).expect("pod json")
}

/// The webhook config with a subscriber image, as the chart renders it
/// (the subscriber presents a token bound to the index server's audience).
pub fn config() -> InjectionConfig {
    InjectionConfig {
        subscriber_image: Some("ghcr.io/inferencecache/kvevent-subscriber:0.1.0".into()),
        index_server: "http://ic-index-server.inferencecache-system:9090".into(),
        index_server_audience: Some("inferencecache".into()),
        index_server_ca_pem: None,
        subscriber_otlp_endpoint: None,
        index_server_discovery: Default::default(),
        image_pull_secrets: Vec::new(),
        subscriber_kafka: None,
    }
}

/// The pod's annotations as JSON (null when absent).
pub fn annotations(pod: &Pod) -> Value {
    serde_json::to_value(&pod.metadata.annotations).expect("annotations")
}

fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("{name}.json"))
}

/// The admission as the JSON the golden files hold.
pub fn render(a: &PodAdmission) -> Value {
    let outcome = match &a.outcome {
        PodOutcome::Injected { backend } => json!({"injected": backend}),
        PodOutcome::EventsOnly { backend } => json!({"eventsOnly": backend}),
        PodOutcome::Skipped => json!("skipped"),
        PodOutcome::FailOpen(r) => json!({"failOpen": r.label()}),
    };
    json!({"outcome": outcome, "warnings": a.warnings, "pod": a.pod})
}

/// Exact comparison with `tests/fixtures/<name>.json`; `UPDATE_GOLDEN=1`
/// rewrites the file instead.
pub fn assert_golden(name: &str, a: &PodAdmission) {
    let got = render(a);
    let path = fixture_path(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        let text = serde_json::to_string_pretty(&got).expect("render") + "\n";
        std::fs::write(&path, text).expect("write fixture");
        return;
    }
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with UPDATE_GOLDEN=1)", path.display()));
    let want: Value = serde_json::from_str(&text).expect("fixture json");
    assert_eq!(
        got,
        want,
        "golden {name} differs:\n{}",
        serde_json::to_string_pretty(&got).unwrap_or_default()
    );
}
