//! validate_backend: one passing and one failing case per rule, asserting
//! the field path and message; plus ordering and backend_warnings.

mod common;

use common::*;
use ic_adapters::admission::{backend_warnings, validate_backend};
use ic_api::CacheBackend;
use ic_api::validate::{ErrorType, FieldError};
use serde_json::{Value, json};

fn errors(spec: Value) -> Vec<FieldError> {
    validate_backend(&backend("cb", spec))
}

/// The single error of `spec`, asserting its field and that the detail
/// contains `needle`.
fn one(spec: Value, field: &str, needle: &str) -> FieldError {
    let errs = errors(spec);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let e = errs.into_iter().next().expect("one error");
    assert_eq!(e.field, field);
    assert!(e.detail.contains(needle), "{:?} lacks {needle:?}", e.detail);
    e
}

fn clean(spec: Value) {
    let errs = errors(spec);
    assert!(errs.is_empty(), "{errs:#?}");
}

// === registry pair ===

#[test]
fn runtime_cache_pair() {
    clean(json!({"runtime": "VLLM", "type": "LMCache"}));
    clean(json!({"runtime": "SGLang", "type": "SGLangHiCache", "hiCache": {"ratio": "2"}}));
    let e = one(
        json!({"runtime": "VLLM", "type": "SGLangHiCache", "hiCache": {"ratio": "2"}}),
        "spec.type",
        "SupportedPairs: VLLM/LMCache, SGLang/LMCache, SGLang/SGLangHiCache",
    );
    assert_eq!(e.kind, ErrorType::NotSupported);
    assert_eq!(e.bad_value.as_deref(), Some("VLLM/SGLangHiCache"));
}

// === binding support ===

#[test]
fn engine_wire_must_accept_the_binding() {
    clean(
        json!({"runtime": "SGLang", "remoteStorage": {"provider": "Redis", "ownership": "Managed"}}),
    );
    clean(
        json!({"runtime": "VLLM", "remoteStorage": {"provider": "Mooncake", "ownership": "Managed"}}),
    );
    let e = one(
        json!({"runtime": "SGLang", "remoteStorage": {"provider": "LMCacheServer", "ownership": "Managed"}}),
        "spec.remoteStorage.provider",
        "the SGLang+LMCache adapter does not accept a lm binding",
    );
    assert!(
        e.detail.contains("it accepts: host-only, resp"),
        "{}",
        e.detail
    );
    one(
        json!({"runtime": "SGLang", "type": "SGLangHiCache", "hiCache": {"sizeGB": 8},
               "remoteStorage": {"provider": "Redis", "ownership": "Managed"}}),
        "spec.remoteStorage.provider",
        "SGLang HiCache adapter does not accept a resp binding",
    );
}

// === endpoint shape ===

#[test]
fn external_endpoint_shape_per_provider() {
    clean(
        json!({"remoteStorage": {"provider": "Redis", "ownership": "External", "endpoint": "redis.team-a.svc:6379"}}),
    );
    clean(
        json!({"remoteStorage": {"provider": "LMCacheServer", "ownership": "External", "endpoint": "lm://10.0.0.1:65432"}}),
    );
    let e = one(
        json!({"remoteStorage": {"provider": "Redis", "ownership": "External", "endpoint": "lm://r:6379"}}),
        "spec.remoteStorage.endpoint",
        "scheme \"lm\" is not accepted for provider Redis",
    );
    assert_eq!(e.bad_value.as_deref(), Some("lm://r:6379"));
    one(
        json!({"remoteStorage": {"provider": "Mooncake", "ownership": "External", "endpoint": "m.example.com"}}),
        "spec.remoteStorage.endpoint",
        "numeric port",
    );
}

// === hiCache ===

#[test]
fn hicache_ratio_must_be_positive() {
    clean(json!({"runtime": "SGLang", "type": "SGLangHiCache", "hiCache": {"ratio": "0.5"}}));
    one(
        json!({"runtime": "SGLang", "type": "SGLangHiCache", "hiCache": {"ratio": "0.0"}}),
        "spec.hiCache.ratio",
        "greater than zero",
    );
    one(
        json!({"runtime": "SGLang", "type": "SGLangHiCache"}),
        "spec.hiCache",
        "exactly one of ratio and sizeGB",
    );
}

// === lmCache.hostMemory ===

#[test]
fn host_memory_capacity_must_be_a_positive_quantity() {
    let with = |capacity: &str| {
        json!({"runtime": "VLLM", "type": "LMCache",
               "lmCache": {"hostMemory": {"capacity": capacity}}})
    };
    clean(with("4Gi"));
    clean(with("512Mi"));
    for (bad, needle) in [
        ("0", "positive"),
        ("-4Gi", "positive"),
        ("lots", "not a quantity"),
    ] {
        let e = one(with(bad), "spec.lmCache.hostMemory.capacity", needle);
        assert_eq!(e.kind, ErrorType::Invalid);
        assert_eq!(e.bad_value.as_deref(), Some(bad));
    }
}

// === reserved engineOverrides ===

fn overrides(runtime: &str, ov: Value) -> Value {
    json!({"runtime": runtime, "integration": {"engineOverrides": ov}})
}

#[test]
fn reserved_override_args_and_env_are_rejected() {
    clean(overrides(
        "VLLM",
        json!({"args": ["--max-model-len 4096"], "suppressArgs": ["--enforce-eager"],
               "env": [{"name": "LMCACHE_CHUNK_SIZE", "value": "512"}],
               "suppressEnv": ["LMCACHE_LOCAL_CPU"]}),
    ));
    let cases = [
        (
            json!({"args": ["--kv-transfer-config={}"]}),
            "spec.integration.engineOverrides.args[0]",
            "flag --kv-transfer-config",
        ),
        (
            json!({"suppressArgs": ["--kv-transfer-config"]}),
            "spec.integration.engineOverrides.suppressArgs[0]",
            "flag --kv-transfer-config",
        ),
        (
            json!({"env": [{"name": "X", "value": "1"}, {"name": "PYTHONHASHSEED", "value": "1"}]}),
            "spec.integration.engineOverrides.env[1].name",
            "env PYTHONHASHSEED",
        ),
    ];
    let remote_cases = [
        (
            "Redis",
            json!({"suppressEnv": ["LMCACHE_REMOTE_URL"]}),
            "spec.integration.engineOverrides.suppressEnv[0]",
            "env LMCACHE_REMOTE_URL",
        ),
        (
            "Mooncake",
            json!({"env": [{"name": "LMCACHE_EXTRA_CONFIG", "value": "{}"}]}),
            "spec.integration.engineOverrides.env[0].name",
            "env LMCACHE_EXTRA_CONFIG",
        ),
        (
            "Mooncake",
            json!({"suppressEnv": ["INFERENCECACHE_POD_IP"]}),
            "spec.integration.engineOverrides.suppressEnv[0]",
            "env INFERENCECACHE_POD_IP",
        ),
    ];
    let with_remote = |provider: &str, ov: Value| {
        json!({"runtime": "VLLM", "integration": {"engineOverrides": ov},
               "remoteStorage": {"provider": provider, "ownership": "Managed"}})
    };
    // What only a binding injects is reserved only under that binding, and
    // VLLM_USE_V1 (read by no supported vLLM) is not reserved at all.
    clean(overrides(
        "VLLM",
        json!({"env": [{"name": "LMCACHE_EXTRA_CONFIG", "value": "{}"}, {"name": "VLLM_USE_V1", "value": "1"}],
               "suppressEnv": ["LMCACHE_REMOTE_URL"]}),
    ));
    clean(with_remote(
        "Redis",
        json!({"env": [{"name": "LMCACHE_EXTRA_CONFIG", "value": "{}"}]}),
    ));
    let all = cases
        .into_iter()
        .map(|(ov, field, needle)| (overrides("VLLM", ov), field, needle))
        .chain(
            remote_cases
                .into_iter()
                .map(|(provider, ov, field, needle)| (with_remote(provider, ov), field, needle)),
        );
    for (spec, field, needle) in all {
        let e = one(spec, field, needle);
        assert_eq!(e.kind, ErrorType::Forbidden);
        assert!(
            e.detail
                .contains("reserved by the vLLM+LMCache adapter (vllm-lmcache)"),
            "{}",
            e.detail
        );
    }
    // SGLang reserves its own set; vLLM's names are free there.
    clean(overrides(
        "SGLang",
        json!({"env": [{"name": "PYTHONHASHSEED", "value": "1"}]}),
    ));
    let e = one(
        overrides("SGLang", json!({"suppressArgs": ["--lmcache-config-file"]})),
        "spec.integration.engineOverrides.suppressArgs[0]",
        "reserved by the SGLang+LMCache adapter (sglang-lmcache)",
    );
    assert_eq!(e.bad_value.as_deref(), Some("--lmcache-config-file"));
    one(
        overrides(
            "SGLang",
            json!({"env": [{"name": "INFERENCECACHE_FAIL_OPEN", "value": "true"}]}),
        ),
        "spec.integration.engineOverrides.env[0].name",
        "env INFERENCECACHE_FAIL_OPEN",
    );
    // LMCACHE_USE_EXPERIMENTAL was read only by LMCache 0.3.x: not injected,
    // not reserved.
    clean(overrides(
        "SGLang",
        json!({"env": [{"name": "LMCACHE_USE_EXPERIMENTAL", "value": "False"}]}),
    ));
}

// === provider resources ===

fn redis(resources: Value) -> Value {
    json!({"remoteStorage": {"provider": "Redis", "ownership": "Managed", "redis": {"resources": resources}}})
}

const R: &str = "spec.remoteStorage.redis.resources";

#[test]
fn limits_must_cover_requests_for_overcommittable() {
    clean(redis(
        json!({"requests": {"memory": "4Gi", "cpu": "250m"}, "limits": {"memory": "8Gi", "cpu": "1"}}),
    ));
    clean(redis(
        json!({"requests": {"memory": "1Gi"}, "limits": {"memory": "1024Mi"}}),
    ));
    let e = one(
        redis(json!({"requests": {"memory": "8Gi"}, "limits": {"memory": "4Gi"}})),
        &format!("{R}.limits[memory]"),
        "must be greater than or equal to requests[memory] (8Gi)",
    );
    assert_eq!(e.bad_value.as_deref(), Some("4Gi"));
}

#[test]
fn non_overcommittable_limits_must_equal_requests() {
    clean(redis(
        json!({"requests": {"nvidia.com/gpu": "1", "hugepages-2Mi": "4Mi"},
                       "limits": {"nvidia.com/gpu": "1", "hugepages-2Mi": "4Mi"}}),
    ));
    one(
        redis(json!({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "2"}})),
        &format!("{R}.limits[nvidia.com/gpu]"),
        "must equal requests[nvidia.com/gpu] (1)",
    );
    one(
        redis(json!({"requests": {"hugepages-2Mi": "2Mi"}, "limits": {"hugepages-2Mi": "4Mi"}})),
        &format!("{R}.limits[hugepages-2Mi]"),
        "cannot be overcommitted",
    );
}

#[test]
fn requests_only_is_rejected_for_non_overcommittable() {
    clean(redis(json!({"requests": {"memory": "1Gi", "cpu": "1"}})));
    clean(redis(json!({"limits": {"nvidia.com/gpu": "1"}})));
    one(
        redis(json!({"requests": {"example.com/fpga": "1"}})),
        &format!("{R}.requests[example.com/fpga]"),
        "must be declared in limits too",
    );
}

#[test]
fn claims_are_rejected() {
    clean(redis(json!({"claims": []})));
    let e = one(
        redis(json!({"claims": [{"name": "gpu"}]})),
        &format!("{R}.claims"),
        "Dynamic Resource Allocation",
    );
    assert_eq!(e.kind, ErrorType::Forbidden);
}

#[test]
fn fractional_extended_resources_are_rejected() {
    clean(redis(
        json!({"limits": {"cpu": "250m", "nvidia.com/gpu": "2"}}),
    ));
    one(
        redis(json!({"limits": {"nvidia.com/gpu": "500m"}})),
        &format!("{R}.limits[nvidia.com/gpu]"),
        "must be an integer",
    );
}

#[test]
fn hugepages_must_align_to_page_size() {
    clean(redis(
        json!({"limits": {"hugepages-1Gi": "2Gi", "hugepages-2Mi": "0"}}),
    ));
    one(
        redis(json!({"limits": {"hugepages-2Mi": "3Mi"}})),
        &format!("{R}.limits[hugepages-2Mi]"),
        "whole multiple of the 2Mi page size",
    );
}

#[test]
fn quantities_must_be_non_negative_and_parse() {
    clean(redis(json!({"requests": {"memory": "0", "cpu": "0"}})));
    let e = one(
        redis(json!({"requests": {"memory": "-1Gi"}})),
        &format!("{R}.requests[memory]"),
        "must be non-negative",
    );
    assert_eq!(e.bad_value.as_deref(), Some("-1Gi"));
    one(
        redis(json!({"limits": {"memory": "lots"}})),
        &format!("{R}.limits[memory]"),
        "is not a Kubernetes quantity",
    );
}

#[test]
fn resource_names_must_be_valid() {
    clean(redis(
        json!({"limits": {"ephemeral-storage": "1Gi", "hugepages-1Gi": "1Gi", "vendor.example/widget": "1"}}),
    ));
    for (name, needle) in [
        ("foo", "vendor-prefixed"),
        ("hugepages-", "positive page size"),
        ("hugepages-nope", "positive page size"),
        ("kubernetes.io/thing", "reserved for native resources"),
        (
            "requests.kubernetes.io/thing",
            "reserved for native resources",
        ),
    ] {
        let e = one(
            redis(json!({"limits": {name: "1"}})),
            &format!("{R}.limits[{name}]"),
            needle,
        );
        assert_eq!(e.bad_value.as_deref(), Some(name));
    }
    // Several bad keys surface together.
    assert_eq!(
        errors(redis(json!({"limits": {"a": "1", "b": "1"}}))).len(),
        2
    );
}

#[test]
fn resources_are_checked_at_the_selected_provider_path() {
    let spec = json!({"remoteStorage": {"provider": "Mooncake", "ownership": "Managed",
        "mooncake": {"resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}}},
        "integration": {"engineHostNetwork": true}});
    one(
        spec,
        "spec.remoteStorage.mooncake.resources.limits[memory]",
        "greater than or equal",
    );
}

// === kernel-check annotation ===

fn annotated(value: &str) -> CacheBackend {
    backend_with(
        "cb",
        json!({}),
        json!({"metadata": {"annotations": {"inferencecache.io/lmcache-kernel-check": value}}}),
    )
}

#[test]
fn kernel_check_annotation_values() {
    for ok in ["", "auto", "report-only", "strict", "off"] {
        assert!(validate_backend(&annotated(ok)).is_empty(), "{ok}");
    }
    let errs = validate_backend(&annotated("strcit"));
    assert_eq!(errs.len(), 1);
    assert_eq!(
        errs[0].field,
        "metadata.annotations[inferencecache.io/lmcache-kernel-check]"
    );
    assert_eq!(errs[0].kind, ErrorType::NotSupported);
    assert!(errs[0].detail.contains("auto, report-only, strict, off"));
    assert!(
        !validate_backend(&annotated("Strict")).is_empty(),
        "case-sensitive"
    );
}

// === aggregation order ===

#[test]
fn structural_rules_come_first_then_adapter_rules() {
    let errs = errors(json!({
        "runtime": "VLLM", "type": "SGLangHiCache", "hiCache": {"ratio": "2"},
        "lmCache": {},
        "integration": {"engineOverrides": {"env": [{"name": "VLLM_USE_V1", "value": "0"}]}},
        "remoteStorage": {"provider": "Redis", "ownership": "Managed",
                          "redis": {"resources": {"limits": {"foo": "1"}}}},
    }));
    let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "spec.lmCache",
            "spec.type",
            "spec.remoteStorage.redis.resources.limits[foo]"
        ],
        "{errs:#?}"
    );
    // Stable: same input, same output.
    assert_eq!(
        errs,
        errors(json!({
            "runtime": "VLLM", "type": "SGLangHiCache", "hiCache": {"ratio": "2"},
            "lmCache": {},
            "integration": {"engineOverrides": {"env": [{"name": "VLLM_USE_V1", "value": "0"}]}},
            "remoteStorage": {"provider": "Redis", "ownership": "Managed",
                              "redis": {"resources": {"limits": {"foo": "1"}}}},
        }))
    );
}

// === warnings ===

#[test]
fn backend_warnings_name_the_risky_settings() {
    assert!(backend_warnings(&backend("cb", json!({}))).is_empty());
    let w = backend_warnings(&backend("cb", json!({"integration": {"failOpen": false}})));
    assert_eq!(w.len(), 1);
    assert!(w[0].contains("failOpen=false"));
    let w = backend_warnings(&backend(
        "cb",
        json!({"remoteStorage": {"provider": "Mooncake", "ownership": "Managed"}}),
    ));
    assert_eq!(w.len(), 1);
    assert!(w[0].contains("engineHostNetwork"));
    let w = backend_warnings(&backend(
        "cb",
        json!({"remoteStorage": {"provider": "Mooncake", "ownership": "Managed"},
               "integration": {"engineHostNetwork": true}}),
    ));
    assert!(w.is_empty());
    let w = backend_warnings(&backend(
        "cb",
        json!({"observation": null, "engineSelector": null}),
    ));
    assert_eq!(w.len(), 2, "{w:?}");
}
