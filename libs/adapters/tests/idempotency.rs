//! Property: admitting the admitted pod again changes nothing (the webhook
//! would send an empty patch), across generated pods, backends and webhook
//! configs — including fail-open, skip and collision outcomes.

mod common;

use common::*;
use ic_adapters::admission::{InjectionConfig, admit_pod};
use ic_api::CacheBackend;
use k8s_openapi::api::core::v1::Pod;
use proptest::prelude::*;
use serde_json::{Value, json};

const ARG_POOL: &[&[&str]] = &[
    &["--max-model-len", "2048"],
    &["--port", "8080"],
    &["--enforce-eager"],
    &["--kv-transfer-config", "{\"kv_connector\":\"X\"}"],
    &["positional"],
];

/// Flags that make one adapter or another refuse the pod.
const CONFLICT_POOL: &[&[&str]] = &[
    &["--enable-lmcache"],
    &["--lmcache-config-file", "/tmp/x.yaml"],
    &["--enable-hierarchical-cache"],
    &["--hicache-ratio", "2"],
    &["--hicache-ratio=3"],
    &["--hicache-size", "8"],
    &["--hicache-write-policy", "write_back"],
];

const ENV_POOL: &[(&str, &str)] = &[
    ("PYTHONHASHSEED", "7"),
    ("LMCACHE_CHUNK_SIZE", "128"),
    ("LMCACHE_LOCAL_CPU", "False"),
    ("INFERENCECACHE_FAIL_OPEN", "maybe"),
    ("HF_HOME", "/models"),
    ("VLLM_USE_V1", "1"),
    ("LMCACHE_USE_EXPERIMENTAL", "True"),
    ("LMCACHE_EXTRA_CONFIG", "{\"nixl_backend\":\"UCX\"}"),
];

const OVERRIDE_ARGS: &[&str] = &[
    "--max-model-len 4096",
    "--enforce-eager",
    "--gpu-memory-utilization=0.8",
    "--kv-transfer-config {}",
    "--hicache-ratio 9",
];

const OVERRIDE_ENV: &[&str] = &[
    "LMCACHE_CHUNK_SIZE",
    "LMCACHE_LOCAL_CPU",
    "LMCACHE_SAVE_UNFULL_CHUNK",
    "HF_HOME",
    "PYTHONHASHSEED",
    "VLLM_USE_V1",
    "LMCACHE_USE_EXPERIMENTAL",
    "LMCACHE_EXTRA_CONFIG",
];

fn subset<T: Clone + std::fmt::Debug>(pool: &'static [T]) -> impl Strategy<Value = Vec<T>> {
    proptest::sample::subsequence(pool.to_vec(), 0..=pool.len()).prop_shuffle()
}

prop_compose! {
    fn arb_pod()(
        name in prop::sample::select(vec!["server", "vllm", "sglang"]),
        extra in prop::option::weighted(0.25, prop::sample::select(vec!["proxy", "kvevent-subscriber"])),
        args in subset(ARG_POOL),
        conflict in prop::option::weighted(0.2, prop::sample::select(CONFLICT_POOL.to_vec())),
        env in subset(ENV_POOL),
        gpu in any::<bool>(),
        shm in prop::sample::select(vec![0u8, 0, 0, 1, 1, 2, 3]),
        squat in prop::option::weighted(0.1, prop::sample::select(vec!["lmcache-mp-worker", "lmcache-kernel-check"])),
        image in prop::option::weighted(0.85, Just("engine:1")),
        stamps in subset(&["injected-by", "injected-by-uid", "inject-skipped", "lmcache-kernel-check-mode"]),
        skip in prop::option::weighted(0.15, prop::sample::select(vec!["true", "no"])),
    ) -> Pod {
        let args: Vec<&str> = args.into_iter().chain(conflict).flatten().copied().collect();
        let env: Vec<Value> = env.into_iter().map(|(n, v)| json!({"name": n, "value": v})).collect();
        let mut engine = json!({"name": name, "args": args, "env": env});
        if let Some(i) = image { engine["image"] = json!(i); }
        if gpu { engine["resources"] = json!({"limits": {"nvidia.com/gpu": "1"}}); }
        let mut volumes = vec![];
        match shm {
            1 => {
                engine["volumeMounts"] = json!([{"name": "dshm", "mountPath": "/dev/shm"}]);
                volumes.push(json!({"name": "dshm", "emptyDir": {"medium": "Memory"}}));
            }
            2 => {
                engine["volumeMounts"] = json!([{"name": "dshm", "mountPath": "/dev/shm", "readOnly": true}]);
                volumes.push(json!({"name": "dshm", "emptyDir": {}}));
            }
            3 => volumes.push(json!({"name": "lmcache-config", "secret": {"secretName": "s"}})),
            _ => {}
        }
        let mut containers = vec![engine];
        if let Some(e) = extra { containers.push(json!({"name": e, "image": "x:1"})); }
        let mut spec = json!({"containers": containers});
        if !volumes.is_empty() { spec["volumes"] = json!(volumes); }
        if let Some(s) = squat { spec["initContainers"] = json!([{"name": s, "image": "x:1"}]); }
        let mut ann = serde_json::Map::new();
        for s in stamps { ann.insert(format!("inferencecache.io/{s}"), json!("stale")); }
        if let Some(v) = skip { ann.insert("inferencecache.io/skip-inject".into(), json!(v)); }
        let mut p = pod(spec);
        if !ann.is_empty() {
            p = patched(&p, json!({"metadata": {"annotations": Value::Object(ann)}}));
        }
        p
    }
}

prop_compose! {
    fn arb_backend()(
        runtime in prop::sample::select(vec!["VLLM", "SGLang"]),
        hicache in prop::bool::weighted(0.3),
        events_only in prop::bool::weighted(0.2),
        remote in prop::sample::select(vec![0u8, 1, 2, 3, 4, 5]),
        hostnet in any::<bool>(),
        fail_open in any::<bool>(),
        model in any::<bool>(),
        kernel in prop::sample::select(vec!["", "auto", "strict", "off", "report-only", "bogus"]),
        ov_args in subset(OVERRIDE_ARGS),
        ov_env in subset(OVERRIDE_ENV),
        sup_args in subset(&["--enforce-eager", "--max-model-len", "--kv-transfer-config"]),
        sup_env in subset(OVERRIDE_ENV),
        hi in prop::sample::select(vec![json!({"ratio": "2.0"}), json!({"sizeGB": 8, "writePolicy": "write_back"})]),
    ) -> CacheBackend {
        let mut spec = json!({"runtime": runtime, "integration": {
            "failOpen": fail_open,
            "engineOverrides": {
                "args": ov_args,
                "env": ov_env.iter().map(|n| json!({"name": n, "value": "ov"})).collect::<Vec<_>>(),
                "suppressArgs": sup_args,
                "suppressEnv": sup_env,
            },
        }});
        if hicache {
            spec["type"] = json!("SGLangHiCache");
            spec["hiCache"] = hi;
        }
        if events_only { spec["integration"]["mode"] = json!("EventsOnly"); }
        if hostnet { spec["integration"]["engineHostNetwork"] = json!(true); }
        if !model { spec["observation"] = Value::Null; }
        let mut status = json!({});
        match remote {
            1 => {
                spec["remoteStorage"] = json!({"provider": "Redis", "ownership": "Managed"});
                status = json!({"endpoint": "redis.team-a.svc:6379"});
            }
            2 => spec["remoteStorage"] = json!({"provider": "LMCacheServer", "ownership": "External", "endpoint": "lm://lm:65432"}),
            3 => {
                spec["remoteStorage"] = json!({"provider": "Mooncake", "ownership": "Managed"});
                status = json!({"endpoint": "mc:50051"});
            }
            4 => spec["remoteStorage"] = json!({"provider": "Redis", "ownership": "Managed"}),
            _ => {}
        }
        backend_with("cb", spec, json!({
            "status": status,
            "metadata": {"annotations": {"inferencecache.io/lmcache-kernel-check": kernel}},
        }))
    }
}

fn arb_config() -> impl Strategy<Value = InjectionConfig> {
    any::<bool>().prop_map(|with| {
        if with {
            config()
        } else {
            InjectionConfig::default()
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn readmission_is_a_no_op(pod in arb_pod(), backend in arb_backend(), cfg in arb_config()) {
        let backends = [backend];
        let first = admit_pod(&pod, &backends, &cfg);
        let second = admit_pod(&first.pod, &backends, &cfg);
        prop_assert_eq!(&second.pod, &first.pod, "outcome {:?}", first.outcome);
        prop_assert_eq!(second.outcome, first.outcome);
    }
}
