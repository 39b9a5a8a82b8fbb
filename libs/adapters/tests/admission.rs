//! Pod admission: selection, opt-out, every fail-open path (asserting the
//! reason and the stripped decision annotations), subscriber and kernel
//! check gates, and convergence of our own earlier injection.

mod common;

use common::*;
use ic_adapters::admission::{FailOpenReason, InjectionConfig, PodOutcome, admit_pod, fail_open};
use ic_api::CacheBackend;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

#[path = "admission/subscriber.rs"]
mod subscriber;

const FORGED: &str = "team-a/forged";

/// `pod` with every decision annotation pre-stamped plus one unrelated.
fn stamped(pod: &Pod) -> Pod {
    patched(
        pod,
        json!({"metadata": {"annotations": {
            "inferencecache.io/injected-by": FORGED,
            "inferencecache.io/injected-by-uid": "forged-uid",
            "inferencecache.io/inject-skipped": "skip-inject-annotation",
            "inferencecache.io/lmcache-kernel-check-mode": "strict",
            "unrelated": "kept",
        }}}),
    )
}

/// Fails open with `label`, stripping exactly the decision annotations and
/// leaving everything else untouched.
fn assert_fail_open(pod: &Pod, backends: &[CacheBackend], cfg: &InjectionConfig, label: &str) {
    let input = stamped(pod);
    let a = admit_pod(&input, backends, cfg);
    match &a.outcome {
        PodOutcome::FailOpen(r) => assert_eq!(r.label(), label, "{:?}", r),
        other => panic!("expected fail-open {label}, got {other:?}"),
    }
    assert_eq!(annotations(&a.pod), json!({"unrelated": "kept"}));
    let mut expected = input.clone();
    expected.metadata.annotations = a.pod.metadata.annotations.clone();
    assert_eq!(a.pod, expected, "fail-open must not wire anything");
}

fn sglang_pod(args: Value) -> Pod {
    pod(json!({"containers": [{
        "name": "sglang", "image": "registry.example.com/sglang-lmcache:v0.5.4", "args": args,
    }]}))
}

fn hicache(hi: Value) -> CacheBackend {
    backend(
        "cb",
        json!({"runtime": "SGLang", "type": "SGLangHiCache", "hiCache": hi}),
    )
}

// === selection ===

#[test]
fn first_matching_backend_wins_and_empty_selectors_never_match() {
    let empty = backend(
        "empty",
        json!({"engineSelector": {"matchLabels": {"app": null}}}),
    );
    let absent = backend("absent", json!({"engineSelector": null}));
    let other = backend(
        "other",
        json!({"engineSelector": {"matchLabels": {"app": "other"}}}),
    );
    let partial = backend(
        "partial",
        json!({"engineSelector": {"matchLabels": {"app": "engine", "tier": "gold"}}}),
    );
    let first = backend("first", json!({}));
    let second = backend("second", json!({}));
    let a = admit_pod(
        &engine_pod(json!({})),
        &[empty, absent, other, partial, first, second],
        &config(),
    );
    assert_eq!(
        a.outcome,
        PodOutcome::Injected {
            backend: "team-a/first".into()
        }
    );
    assert_eq!(
        annotations(&a.pod)["inferencecache.io/injected-by-uid"],
        "uid-first"
    );
}

#[test]
fn no_match_fails_open() {
    let b = backend(
        "cb",
        json!({"engineSelector": {"matchLabels": {"app": "other"}}}),
    );
    assert_fail_open(&engine_pod(json!({})), &[b], &config(), "no_match");
    assert_fail_open(&engine_pod(json!({})), &[], &config(), "no_match");
}

// === skip-inject ===

#[test]
fn truthy_skip_inject_skips_and_stamps_the_marker() {
    for value in ["1", "t", "T", "true", "TRUE", "True"] {
        let p = patched(
            &stamped(&engine_pod(json!({}))),
            json!({"metadata": {"annotations": {"inferencecache.io/skip-inject": value}}}),
        );
        let a = admit_pod(&p, &[backend("cb", json!({}))], &config());
        assert_eq!(a.outcome, PodOutcome::Skipped);
        assert_eq!(
            annotations(&a.pod),
            json!({
                "inferencecache.io/skip-inject": value,
                "inferencecache.io/inject-skipped": "skip-inject-annotation",
                "unrelated": "kept",
            })
        );
        assert_eq!(a.pod.spec, p.spec, "no wiring on skip");
        // Idempotent.
        assert_eq!(
            admit_pod(&a.pod, &[backend("cb", json!({}))], &config()).pod,
            a.pod
        );
    }
}

#[test]
fn non_truthy_skip_inject_still_injects_and_clears_the_marker() {
    let p = patched(
        &stamped(&engine_pod(json!({}))),
        json!({"metadata": {"annotations": {"inferencecache.io/skip-inject": "yes"}}}),
    );
    let a = admit_pod(&p, &[backend("cb", json!({}))], &config());
    assert_eq!(
        a.outcome,
        PodOutcome::Injected {
            backend: "team-a/cb".into()
        }
    );
    let ann = annotations(&a.pod);
    assert_eq!(ann["inferencecache.io/injected-by"], "team-a/cb");
    assert_eq!(ann["inferencecache.io/injected-by-uid"], "uid-cb");
    assert_eq!(ann["inferencecache.io/lmcache-kernel-check-mode"], "off");
    assert!(ann.get("inferencecache.io/inject-skipped").is_none());
}

// === fail-open paths ===

#[test]
fn decode_and_list_failures_strip_decision_annotations() {
    for reason in [
        FailOpenReason::Decode,
        FailOpenReason::ListFailed,
        FailOpenReason::Encode,
    ] {
        let a = fail_open(&stamped(&engine_pod(json!({}))), reason.clone());
        assert_eq!(a.outcome, PodOutcome::FailOpen(reason));
        assert_eq!(annotations(&a.pod), json!({"unrelated": "kept"}));
    }
    // A pod without annotations stays without.
    let a = fail_open(&engine_pod(json!({})), FailOpenReason::ListFailed);
    assert!(a.pod.metadata.annotations.is_none());
}

#[test]
fn managed_without_status_endpoint_fails_open() {
    let b = backend(
        "cb",
        json!({"remoteStorage": {"provider": "LMCacheServer", "ownership": "Managed"}}),
    );
    assert_fail_open(&engine_pod(json!({})), &[b], &config(), "missing_endpoint");
}

#[test]
fn managed_ignores_spec_endpoint_and_external_ignores_status() {
    // External never falls back to status, even when status looks valid.
    let b = backend_with(
        "cb",
        json!({"remoteStorage": {"provider": "Redis", "ownership": "External", "endpoint": "  "}}),
        json!({"status": {"endpoint": "stale:6379"}}),
    );
    assert_fail_open(&engine_pod(json!({})), &[b], &config(), "missing_endpoint");
    let invalid = backend(
        "cb",
        json!({"remoteStorage": {"provider": "Redis", "ownership": "External", "endpoint": "lm://r:6379"}}),
    );
    assert_fail_open(
        &engine_pod(json!({})),
        &[invalid],
        &config(),
        "missing_endpoint",
    );
}

#[test]
fn mooncake_without_endpoint_gets_no_host_network() {
    let b = backend(
        "cb",
        json!({"remoteStorage": {"provider": "Mooncake", "ownership": "Managed"},
               "integration": {"engineHostNetwork": true}}),
    );
    assert_fail_open(&engine_pod(json!({})), &[b], &config(), "missing_endpoint");
}

#[test]
fn mooncake_merges_a_json_extra_config_and_refuses_one_it_cannot_merge() {
    let b = backend_with(
        "cb",
        json!({"remoteStorage": {"provider": "Mooncake", "ownership": "External", "endpoint": "m:50051"}}),
        json!({}),
    );
    let theirs = engine_pod(json!({"env": [
        {"name": "LMCACHE_EXTRA_CONFIG", "value": "{\"nixl_backend\":\"UCX\",\"mooncake_protocol\":\"rdma\"}"}
    ]}));
    let admitted = admit_pod(&theirs, std::slice::from_ref(&b), &config());
    let env = admitted.pod.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    let extra = env
        .iter()
        .find(|e| e.name == "LMCACHE_EXTRA_CONFIG")
        .unwrap();
    let extra: Value = serde_json::from_str(extra.value.as_deref().unwrap()).unwrap();
    assert_eq!(extra["nixl_backend"], "UCX", "their own keys are kept");
    assert_eq!(
        extra["mooncake_protocol"], "tcp",
        "the binding's settings win"
    );
    assert_eq!(extra["mooncake_master_server_addr"], "m:50051");
    assert_eq!(
        extra["mooncake_metadata_server"], "P2PHANDSHAKE",
        "External: no metadata server"
    );
    let ip = env
        .iter()
        .position(|e| e.name == "INFERENCECACHE_POD_IP")
        .unwrap();
    let cfg = env
        .iter()
        .position(|e| e.name == "LMCACHE_EXTRA_CONFIG")
        .unwrap();
    assert!(
        ip < cfg,
        "$(INFERENCECACHE_POD_IP) must be defined before it is used"
    );

    for bad in [
        json!({"name": "LMCACHE_EXTRA_CONFIG", "value": "nixl_backend=UCX"}),
        json!({"name": "LMCACHE_EXTRA_CONFIG", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}),
    ] {
        let pod = engine_pod(json!({"env": [bad]}));
        assert_fail_open(
            &pod,
            std::slice::from_ref(&b),
            &config(),
            "adapter_rejected",
        );
    }
}

#[test]
fn unregistered_pair_fails_open() {
    let b = backend(
        "cb",
        json!({"type": "SGLangHiCache", "hiCache": {"ratio": "2"}}),
    );
    assert_fail_open(&engine_pod(json!({})), &[b], &config(), "no_adapter");
}

#[test]
fn unsupported_binding_fails_open() {
    let b = backend_with(
        "cb",
        json!({"runtime": "SGLang", "remoteStorage": {"provider": "Mooncake", "ownership": "Managed"}}),
        json!({"status": {"endpoint": "m:50051"}}),
    );
    assert_fail_open(&sglang_pod(json!([])), &[b], &config(), "adapter_rejected");
}

#[test]
fn multi_container_pod_without_engine_name_fails_open() {
    let p = pod(json!({"containers": [
        {"name": "a", "image": "x"},
        {"name": "b", "image": "y"},
    ]}));
    assert_fail_open(
        &p,
        &[backend("cb", json!({}))],
        &config(),
        "adapter_rejected",
    );
}

#[test]
fn squatting_the_subscriber_name_fails_open() {
    let p = pod(json!({"containers": [
        {"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"},
        {"name": "kvevent-subscriber", "image": "mine:1"},
    ]}));
    assert_fail_open(
        &p,
        &[backend("cb", json!({}))],
        &config(),
        "adapter_rejected",
    );
    // Without a subscriber to inject the operator's own container is left alone.
    let a = admit_pod(&p, &[backend("cb", json!({}))], &InjectionConfig::default());
    assert!(matches!(a.outcome, PodOutcome::Injected { .. }));
    assert_eq!(a.pod.spec.as_ref().map(|s| s.containers.len()), Some(2));
}

#[test]
fn squatting_the_kernel_check_name_fails_open() {
    let p = engine_pod(json!({"resources": {"limits": {"nvidia.com/gpu": "1"}}}));
    let p = patched(
        &p,
        json!({"spec": {"initContainers": [{"name": "lmcache-kernel-check", "image": "x"}]}}),
    );
    assert_fail_open(
        &p,
        &[backend("cb", json!({}))],
        &config(),
        "adapter_rejected",
    );
}

#[test]
fn sglang_mp_reserved_names_and_shm_rules_fail_open() {
    let b = backend("cb", json!({"runtime": "SGLang"}));
    let base = |extra: Value| {
        let mut spec = json!({"containers": [{
            "name": "sglang", "image": "registry.example.com/sglang-lmcache:v0.5.4",
        }]});
        merge(&mut spec, extra);
        pod(spec)
    };
    let cases = [
        json!({"containers": [{"name": "sglang", "image": "registry.example.com/sglang-lmcache:v0.5.4",
               "volumeMounts": [{"name": "cfg", "mountPath": "/etc/lmcache"}]}],
               "volumes": [{"name": "cfg", "emptyDir": {}}]}),
        json!({"volumes": [{"name": "lmcache-dshm", "emptyDir": {}}]}),
        json!({"containers": [{"name": "sglang", "image": "registry.example.com/sglang-lmcache:v0.5.4",
               "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm", "readOnly": true}]}],
               "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}),
        json!({"containers": [{"name": "sglang", "image": "registry.example.com/sglang-lmcache:v0.5.4",
               "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
               "volumes": [{"name": "shm", "configMap": {"name": "x"}}]}),
        json!({"containers": [{"name": "sglang", "image": "registry.example.com/sglang-lmcache:v0.5.4",
               "args": ["--enable-hierarchical-cache"]}]}),
        json!({"containers": [{"name": "sglang"}]}),
    ];
    for extra in cases {
        let mut spec = json!({"containers": [{"name": "sglang", "image": "registry.example.com/sglang-lmcache:v0.5.4"}]});
        merge(&mut spec, extra.clone());
        let p = if extra.get("containers").is_some() {
            pod(spec)
        } else {
            base(extra)
        };
        assert_fail_open(&p, std::slice::from_ref(&b), &config(), "adapter_rejected");
    }
}

#[test]
fn hicache_conflicts_fail_open_without_partial_wiring() {
    let ratio = hicache(json!({"ratio": "2", "writePolicy": "write_back"}));
    let rejected_args = [
        json!(["--hicache-ratio", "3"]),   // different value
        json!(["--hicache-size", "64"]),   // opposite capacity mode
        json!(["--hicache-ratio"]),        // malformed: no value
        json!(["--hicache-ratio", "two"]), // malformed value
        json!(["--hicache-ratio", "2", "--hicache-ratio=2"]), // duplicate
        json!(["--enable-hierarchical-cache", "--enable-hierarchical-cache"]),
        json!(["--enable-hierarchical-cache=true"]),
        json!(["--enable-lmcache"]), // SGLang LMCache flags
        json!(["--hicache-write-policy", "write_through"]),
    ];
    for args in rejected_args {
        assert_fail_open(
            &sglang_pod(args),
            std::slice::from_ref(&ratio),
            &config(),
            "adapter_rejected",
        );
    }
    let both = hicache(json!({"ratio": "2", "sizeGB": 3}));
    assert_fail_open(
        &sglang_pod(json!([])),
        &[both],
        &config(),
        "adapter_rejected",
    );
    let zero = hicache(json!({"ratio": "0"}));
    assert_fail_open(
        &sglang_pod(json!([])),
        &[zero],
        &config(),
        "adapter_rejected",
    );
}

#[test]
fn hicache_matching_values_are_kept_byte_for_byte() {
    let b = hicache(json!({"ratio": "2.0"}));
    let a = admit_pod(&sglang_pod(json!(["--hicache-ratio=2"])), &[b], &config());
    assert!(matches!(a.outcome, PodOutcome::Injected { .. }));
    assert_eq!(
        a.pod
            .spec
            .as_ref()
            .and_then(|s| s.containers[0].args.clone()),
        Some(vec![
            "--hicache-ratio=2".to_owned(),
            "--enable-hierarchical-cache".to_owned(),
            "--enable-metrics".to_owned()
        ])
    );
}

#[test]
fn events_only_without_subscriber_gate_fails_open() {
    let b = backend("cb", json!({"integration": {"mode": "EventsOnly"}}));
    assert_fail_open(
        &engine_pod(json!({})),
        std::slice::from_ref(&b),
        &InjectionConfig::default(),
        "events_only_unwired",
    );
    let no_model = backend(
        "cb",
        json!({"integration": {"mode": "EventsOnly"}, "observation": null}),
    );
    assert_fail_open(
        &engine_pod(json!({})),
        &[no_model],
        &config(),
        "events_only_unwired",
    );
}

// === gates ===

#[test]
fn offload_without_subscriber_image_wires_without_subscriber() {
    let a = admit_pod(
        &engine_pod(json!({})),
        &[backend("cb", json!({}))],
        &InjectionConfig::default(),
    );
    assert!(matches!(a.outcome, PodOutcome::Injected { .. }));
    assert_eq!(a.pod.spec.as_ref().map(|s| s.containers.len()), Some(1));
    // An earlier render of ours is converged away when the gate is now unmet.
    let with = admit_pod(
        &engine_pod(json!({})),
        &[backend("cb", json!({}))],
        &config(),
    );
    assert_eq!(with.pod.spec.as_ref().map(|s| s.containers.len()), Some(2));
    let again = admit_pod(
        &with.pod,
        &[backend("cb", json!({}))],
        &InjectionConfig::default(),
    );
    assert_eq!(again.pod, a.pod);
}

#[test]
fn kernel_check_auto_depends_on_gpu_request() {
    let b = backend("cb", json!({}));
    let cpu = admit_pod(&engine_pod(json!({})), std::slice::from_ref(&b), &config());
    assert!(
        cpu.pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .is_none()
    );
    assert_eq!(
        annotations(&cpu.pod)["inferencecache.io/lmcache-kernel-check-mode"],
        "off"
    );
    let gpu = engine_pod(
        json!({"resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}}),
    );
    let a = admit_pod(&gpu, std::slice::from_ref(&b), &config());
    let init = a
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.clone())
        .unwrap_or_default();
    assert_eq!(init.len(), 1);
    assert_eq!(init[0].name, "lmcache-kernel-check");
    assert_eq!(init[0].image.as_deref(), Some("vllm/vllm-openai:v0.11.0"));
    assert_eq!(
        annotations(&a.pod)["inferencecache.io/lmcache-kernel-check-mode"],
        "report-only"
    );
    // SGLang never gets the check, whatever the annotation.
    let strict = backend_with(
        "cb",
        json!({"runtime": "SGLang"}),
        json!({"metadata": {"annotations": {"inferencecache.io/lmcache-kernel-check": "strict"}}}),
    );
    let s = admit_pod(&sglang_pod(json!([])), &[strict], &config());
    let names: Vec<_> = s
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["lmcache-mp-worker"]);
    assert!(
        annotations(&s.pod)
            .get("inferencecache.io/lmcache-kernel-check-mode")
            .is_none()
    );
}

// === convergence ===

#[test]
fn partially_injected_pods_converge_on_the_full_render() {
    let b = backend_with(
        "cb",
        json!({"runtime": "SGLang", "remoteStorage": {"provider": "Redis", "ownership": "Managed"}}),
        json!({"status": {"endpoint": "redis:6379"}}),
    );
    let original = sglang_pod(json!(["--model-path", "m"]));
    let full = admit_pod(&original, std::slice::from_ref(&b), &config());
    // Drop the worker and the config mount, keep only a stale flag value.
    let mut partial = full.pod.clone();
    if let Some(spec) = partial.spec.as_mut() {
        spec.init_containers = None;
        let engine = &mut spec.containers[0];
        engine.volume_mounts = None;
        engine.args = Some(vec![
            "--model-path".into(),
            "m".into(),
            "--enable-lmcache".into(),
            "--lmcache-config-file".into(),
            "/tmp/other.yaml".into(),
        ]);
    }
    let converged = admit_pod(&partial, std::slice::from_ref(&b), &config());
    assert_eq!(converged.pod, full.pod);
}

#[test]
fn existing_canonical_args_converge_instead_of_duplicating() {
    let p = engine_pod(json!({
        "args": ["--kv-transfer-config", "{\"kv_connector\":\"Other\"}", "--model", "m"],
        "env": [{"name": "PYTHONHASHSEED", "value": "42"}, {"name": "LMCACHE_CHUNK_SIZE", "value": "128"}],
    }));
    let a = admit_pod(&p, &[backend("cb", json!({}))], &config());
    let engine = &a.pod.spec.as_ref().expect("spec").containers[0];
    assert_eq!(
        engine.args.clone().unwrap_or_default(),
        [
            "--kv-transfer-config",
            r#"{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}"#,
            "--model",
            "m"
        ]
    );
    let env: Vec<_> = engine
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect();
    assert!(
        env.contains(&("PYTHONHASHSEED".into(), "0".into())),
        "reserved env converges"
    );
    assert!(
        env.contains(&("LMCACHE_CHUNK_SIZE".into(), "128".into())),
        "tunables stay the user's"
    );
}

#[test]
fn success_warns_on_fail_closed() {
    let b = backend("cb", json!({"integration": {"failOpen": false}}));
    let a = admit_pod(&engine_pod(json!({})), &[b], &config());
    assert_eq!(a.warnings.len(), 1);
    assert!(a.warnings[0].contains("failOpen=false"));
    let env = a.pod.spec.as_ref().expect("spec").containers[0]
        .env
        .clone()
        .unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e.name == "INFERENCECACHE_FAIL_OPEN" && e.value.as_deref() == Some("false"))
    );
}

// === the engine's KV-event publisher, security contexts, the wired label ===
