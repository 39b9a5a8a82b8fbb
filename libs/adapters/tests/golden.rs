//! Golden admitted pods for each runtime × binding × mode, plus the
//! engineOverrides and collision/adoption cases. Fixtures live in
//! `tests/fixtures/<name>.json` and are compared exactly; regenerate with
//! `UPDATE_GOLDEN=1 cargo test -p ic-adapters --test golden` and review the diff.

mod common;

use common::*;
use ic_adapters::admission::{PodAdmission, admit_pod};
use ic_api::CacheBackend;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

/// Admits, checks the golden file, and checks that re-admitting the output
/// changes nothing.
fn golden(name: &str, pod: &Pod, backends: &[CacheBackend]) -> PodAdmission {
    let cfg = config();
    let first = admit_pod(pod, backends, &cfg);
    assert_golden(name, &first);
    let again = admit_pod(&first.pod, backends, &cfg);
    assert_eq!(again.pod, first.pod, "{name}: re-admission is not a no-op");
    assert_eq!(
        again.outcome, first.outcome,
        "{name}: outcome changed on re-admission"
    );
    first
}

fn sglang_pod() -> Pod {
    pod(json!({"containers": [{
        "name": "sglang",
        "image": "registry.example.com/sglang-lmcache:v0.5.4",
        "args": ["--model-path", "Qwen/Qwen3-8B", "--port", "30000", "--kv-events-config", SGLANG_KV_EVENTS],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }]}))
}

fn gpu_vllm_pod() -> Pod {
    engine_pod(json!({"resources": {"limits": {"nvidia.com/gpu": "1"}}}))
}

// === vLLM + LMCache ===

#[test]
fn vllm_host_only() {
    golden(
        "vllm_host_only",
        &engine_pod(json!({})),
        &[backend("cb", json!({}))],
    );
}

#[test]
fn vllm_lm_managed() {
    let b = backend_with(
        "cb",
        json!({"remoteStorage": {"provider": "LMCacheServer", "ownership": "Managed"},
               "integration": {"role": "ReadOnly"}}),
        json!({"status": {"endpoint": "cb-lmcache.team-a.svc:65432"}}),
    );
    golden("vllm_lm_managed", &engine_pod(json!({})), &[b]);
}

#[test]
fn vllm_resp_external() {
    let b = backend(
        "cb",
        json!({"remoteStorage": {"provider": "Redis", "ownership": "External",
                                 "endpoint": " redis.team-a.svc:6379 "},
               "lmCache": {"chunkSizeTokens": 512, "hostMemory": {"capacity": "10Gi"},
                           "remoteSerde": "cachegen"}}),
    );
    golden("vllm_resp_external", &engine_pod(json!({})), &[b]);
}

#[test]
fn vllm_mooncakestore_with_host_network() {
    let b = backend_with(
        "cb",
        json!({"remoteStorage": {"provider": "Mooncake", "ownership": "Managed"},
               "integration": {"engineHostNetwork": true}}),
        json!({"status": {"endpoint": "cb-mooncake.team-a.svc:50051"}}),
    );
    golden("vllm_mooncakestore_hostnet", &gpu_vllm_pod(), &[b]);
}

#[test]
fn vllm_mooncakestore_without_host_network_warns() {
    let b = backend(
        "cb",
        json!({"remoteStorage": {"provider": "Mooncake", "ownership": "External",
                                 "endpoint": "mooncakestore://10.0.0.5:50051"},
               "integration": {"failOpen": false}}),
    );
    let a = golden(
        "vllm_mooncakestore_no_hostnet",
        &engine_pod(json!({})),
        &[b],
    );
    assert_eq!(a.warnings.len(), 2);
}

/// A Guaranteed engine pod (cpu and memory limits, requests defaulted to
/// them) must stay Guaranteed: every sidecar we add gets limits equal to
/// its requests. A Burstable pod's sidecars keep requests only.
#[test]
fn guaranteed_pods_stay_guaranteed() {
    let strict = backend_with(
        "cb",
        json!({}),
        json!({"metadata": {"annotations": {"inferencecache.io/lmcache-kernel-check": "strict"}}}),
    );
    let pod = engine_pod(json!({"resources": {
        "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
        "requests": {"cpu": "8000m"},
    }}));
    let out = golden("vllm_guaranteed", &pod, std::slice::from_ref(&strict));
    let spec = out.pod.spec.as_ref().expect("spec");
    let all: Vec<_> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .collect();
    assert_eq!(all.len(), 3, "engine, subscriber, kernel check");
    for c in &all[1..] {
        let res = c.resources.as_ref().expect("resources");
        assert_eq!(
            res.limits, res.requests,
            "{}: limits must equal requests",
            c.name
        );
    }
    assert!(ic_adapters::sidecars::is_guaranteed(spec));

    // Burstable (no memory limit): requests only, as before.
    let burstable = engine_pod(json!({"resources": {"limits": {"cpu": "8"}}}));
    assert!(!ic_adapters::sidecars::is_guaranteed(
        burstable.spec.as_ref().expect("spec")
    ));
    let out = admit_pod(&burstable, &[strict], &config());
    let spec = out.pod.spec.as_ref().expect("spec");
    assert!(
        spec.containers
            .iter()
            .skip(1)
            .all(|c| c.resources.as_ref().is_some_and(|r| r.limits.is_none()))
    );
}

#[test]
fn vllm_kernel_check_strict_and_off() {
    let strict = backend_with(
        "cb",
        json!({}),
        json!({"metadata": {"annotations": {"inferencecache.io/lmcache-kernel-check": "strict"}}}),
    );
    golden(
        "vllm_kernel_check_strict",
        &engine_pod(json!({})),
        &[strict],
    );
    let off = backend_with(
        "cb",
        json!({}),
        json!({"metadata": {"annotations": {"inferencecache.io/lmcache-kernel-check": "off"}}}),
    );
    let a = admit_pod(&gpu_vllm_pod(), &[off], &config());
    let spec = a.pod.spec.as_ref().expect("spec");
    assert!(spec.init_containers.is_none(), "off never injects");
    assert_eq!(
        annotations(&a.pod)["inferencecache.io/lmcache-kernel-check-mode"],
        "off"
    );
}

#[test]
fn vllm_multi_container_pod_uses_the_vllm_container() {
    let p = pod(json!({"containers": [
        {"name": "proxy", "image": "envoy:v1"},
        {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
    ]}));
    golden("vllm_multi_container", &p, &[backend("cb", json!({}))]);
}

// === SGLang + LMCache (MP mode) ===

#[test]
fn sglang_lmcache_host_only() {
    let b = backend("cb", json!({"runtime": "SGLang"}));
    golden("sglang_lmcache_host_only", &sglang_pod(), &[b]);
}

#[test]
fn sglang_lmcache_redis_l2() {
    let b = backend_with(
        "cb",
        json!({"runtime": "SGLang",
               "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
               "lmCache": {"workerPort": 6000, "workerImage": "registry.example.com/lmcache-mp:0.5.6",
                           "hostMemory": {"capacity": "32Gi"}}}),
        json!({"status": {"endpoint": "cb-redis.team-a.svc:6379"}}),
    );
    golden("sglang_lmcache_redis", &sglang_pod(), &[b]);
}

#[test]
fn sglang_lmcache_reuses_the_engines_shm() {
    let p = patched(
        &sglang_pod(),
        json!({"spec": {
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}],
            "containers": [{
                "name": "sglang",
                "image": "registry.example.com/sglang-lmcache:v0.5.4",
                "args": ["--model-path", "Qwen/Qwen3-8B"],
                "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
            }],
        }}),
    );
    let b = backend("cb", json!({"runtime": "SGLang"}));
    golden("sglang_lmcache_reuse_shm", &p, &[b]);
}

// === SGLang HiCache ===

#[test]
fn hicache_ratio() {
    let b = backend(
        "cb",
        json!({"runtime": "SGLang", "type": "SGLangHiCache",
               "hiCache": {"ratio": "2.0", "writePolicy": "write_through",
                           "ioBackend": "kernel", "memoryLayout": "layer_first"}}),
    );
    golden("hicache_ratio", &sglang_pod(), &[b]);
}

#[test]
fn hicache_size_gb_keeps_matching_user_flags() {
    let p = patched(
        &sglang_pod(),
        json!({"spec": {"containers": [{
            "name": "sglang",
            "image": "registry.example.com/sglang-lmcache:v0.5.4",
            "args": ["--model-path", "Qwen/Qwen3-8B", "--hicache-size=64", "--enable-hierarchical-cache"],
        }]}}),
    );
    let b = backend(
        "cb",
        json!({"runtime": "SGLang", "type": "SGLangHiCache", "hiCache": {"sizeGB": 64}}),
    );
    golden("hicache_size_gb", &p, &[b]);
}

// === events-only ===

#[test]
fn events_only_vllm() {
    let b = backend(
        "cb",
        json!({"integration": {"mode": "EventsOnly"}, "lmCache": {"chunkSizeTokens": 64}}),
    );
    golden("events_only_vllm", &gpu_vllm_pod(), &[b]);
}

#[test]
fn events_only_sglang() {
    let b = backend(
        "cb",
        json!({"runtime": "SGLang", "integration": {"mode": "EventsOnly"}}),
    );
    golden("events_only_sglang", &sglang_pod(), &[b]);
}

// === engineOverrides ===

fn with_overrides(overrides: serde_json::Value) -> CacheBackend {
    backend("cb", json!({"integration": {"engineOverrides": overrides}}))
}

#[test]
fn overrides_replace_and_append() {
    let b = with_overrides(json!({
        "env": [{"name": "LMCACHE_CHUNK_SIZE", "value": "1024"},
                {"name": "LMCACHE_SAVE_UNFULL_CHUNK", "value": "True"}],
        "args": ["--max-model-len 4096", "--enforce-eager"],
    }));
    golden("overrides_replace_append", &engine_pod(json!({})), &[b]);
}

#[test]
fn overrides_user_owned_entries_are_silent_no_ops() {
    let p = engine_pod(json!({
        "args": ["--model", "Qwen/Qwen3-8B", "--max-model-len", "2048"],
        "env": [{"name": "LMCACHE_LOCAL_CPU", "value": "False"}],
    }));
    let b = with_overrides(json!({
        "env": [{"name": "LMCACHE_LOCAL_CPU", "value": "True"}],
        "args": ["--max-model-len=8192"],
        "suppressEnv": ["LMCACHE_LOCAL_CPU"],
    }));
    let a = golden("overrides_user_owned_noop", &p, &[b]);
    let engine = &a.pod.spec.as_ref().expect("spec").containers[0];
    let args = engine.args.as_deref().unwrap_or_default();
    assert!(args.windows(2).any(|w| w == ["--max-model-len", "2048"]));
    assert!(!args.iter().any(|x| x.contains("8192")));
    let local_cpu = engine
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|e| e.name == "LMCACHE_LOCAL_CPU")
        .collect::<Vec<_>>();
    assert_eq!(local_cpu.len(), 1);
    assert_eq!(local_cpu[0].value.as_deref(), Some("False"));
}

#[test]
fn overrides_suppress_adapter_owned_entries() {
    let b = with_overrides(json!({
        "suppressEnv": ["LMCACHE_LOCAL_CPU", "LMCACHE_MAX_LOCAL_CPU_SIZE"],
    }));
    let a = golden("overrides_suppress", &engine_pod(json!({})), &[b]);
    let names: Vec<_> = a.pod.spec.as_ref().expect("spec").containers[0]
        .env
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("LMCACHE_LOCAL_CPU") || n == "LMCACHE_MAX_LOCAL_CPU_SIZE")
    );
}

// === collisions and adoption ===

#[test]
fn squatting_the_mp_worker_name_fails_open() {
    let p = patched(
        &sglang_pod(),
        json!({
            "metadata": {"annotations": {
                "inferencecache.io/injected-by": "team-a/forged",
                "inferencecache.io/injected-by-uid": "forged",
                "inferencecache.io/inject-skipped": "skip-inject-annotation",
                "keep": "me",
            }},
            "spec": {"initContainers": [{"name": "lmcache-mp-worker", "image": "busybox"}]},
        }),
    );
    let b = backend("cb", json!({"runtime": "SGLang"}));
    golden("sglang_squat_worker", &p, &[b]);
}

#[test]
fn squatting_a_reserved_volume_fails_open() {
    let p = patched(
        &sglang_pod(),
        json!({"spec": {"volumes": [{"name": "lmcache-config", "configMap": {"name": "mine"}}]}}),
    );
    let b = backend("cb", json!({"runtime": "SGLang"}));
    golden("sglang_squat_volume", &p, &[b]);
}
