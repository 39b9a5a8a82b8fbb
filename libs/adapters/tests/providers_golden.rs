//! Golden tests: every fixture under `tests/fixtures/providers/` holds a
//! CacheBackend (`backend`) and the exact objects `render` must produce for
//! it (`expected`: workload, Service, HPA and shed list). Comparisons are on
//! the whole serialised objects.
//!
//! After an intended rendering change, regenerate with
//! `UPDATE_GOLDEN=1 cargo test -p ic-adapters --test providers_golden` and
//! review the fixture diff like code.

mod providers_support;

use std::path::PathBuf;

use ic_adapters::providers::render;
use ic_api::CacheBackend;
use serde_json::Value;

use providers_support::objects_json;

fn fixture_path(case: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/providers")
        .join(format!("{case}.json"))
}

fn check(case: &str) {
    let path = fixture_path(case);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut fixture: Value = serde_json::from_str(&text).expect("fixture is JSON");
    let backend: CacheBackend =
        serde_json::from_value(fixture["backend"].clone()).expect("fixture backend");
    let got = objects_json(&render(&backend).expect("renders"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        fixture["expected"] = got.clone();
        let body = serde_json::to_string_pretty(&fixture).expect("pretty") + "\n";
        std::fs::write(&path, body).expect("write fixture");
    }
    let want = &fixture["expected"];
    assert_eq!(
        &got,
        want,
        "{case}: rendered objects differ from the fixture:\n{}",
        serde_json::to_string_pretty(&got).unwrap_or_default()
    );
}

macro_rules! golden {
    ($($test:ident => $case:literal,)*) => {
        $(
            #[test]
            fn $test() {
                check($case);
            }
        )*
    };
}

golden! {
    redis_deployment_defaults => "redis-deployment-defaults",
    redis_statefulset_explicit_hpa_template => "redis-statefulset-explicit-hpa-template",
    redis_deployment_suppressed_hpa => "redis-deployment-suppressed-hpa",
    redis_deployment_zero_cpu_hpa => "redis-deployment-zero-cpu-hpa",
    redis_statefulset_requests_only => "redis-statefulset-requests-only",
    lmcache_deployment_defaults_hpa => "lmcache-deployment-defaults-hpa",
    lmcache_statefulset_explicit_template => "lmcache-statefulset-explicit-template",
    lmcache_deployment_suppressed => "lmcache-deployment-suppressed",
    lmcache_statefulset_defaults_hpa => "lmcache-statefulset-defaults-hpa",
    mooncake_deployment_defaults => "mooncake-deployment-defaults",
    mooncake_statefulset_explicit_template => "mooncake-statefulset-explicit-template",
    mooncake_deployment_clamped => "mooncake-deployment-clamped",
    mooncake_deployment_zero => "mooncake-deployment-zero",
    host_only => "host-only",
    external_redis => "external-redis",
    events_only => "events-only",
    sglang_hicache => "sglang-hicache",
}
