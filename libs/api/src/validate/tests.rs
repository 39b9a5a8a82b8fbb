use super::*;

fn spec(yaml: &str) -> CacheBackendSpec {
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("bad test spec: {e}\n{yaml}"))
}

fn check(namespace: &str, yaml: &str) -> Vec<FieldError> {
    validate(&Subject {
        namespace,
        spec: &spec(yaml),
    })
}

/// The field path of each violation, in order.
fn fields(errors: &[FieldError]) -> Vec<&str> {
    errors.iter().map(|e| e.field.as_str()).collect()
}

const VLLM: &str = "runtime: VLLM\n";

#[test]
fn every_sample_passes() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../config/samples");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        if doc["kind"] != "CacheBackend" {
            continue;
        }
        let namespace = doc["metadata"]["namespace"].as_str().unwrap_or("default");
        let spec: CacheBackendSpec = serde_yaml::from_value(doc["spec"].clone()).unwrap();
        let errors = validate(&Subject {
            namespace,
            spec: &spec,
        });
        assert!(errors.is_empty(), "{}: {errors:?}", path.display());
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} samples");
}

#[test]
fn cache_hierarchy() {
    let ok = format!("{VLLM}remoteStorage: {{provider: Redis, ownership: Managed, redis: {{}}}}\n");
    assert!(check("a", &ok).is_empty());

    let mismatched =
        format!("{VLLM}remoteStorage: {{provider: Redis, ownership: Managed, mooncake: {{}}}}\n");
    let errors = check("a", &mismatched);
    assert_eq!(fields(&errors), ["spec.remoteStorage.mooncake"]);
    assert!(errors[0].detail.contains("provider Redis"), "{}", errors[0]);

    let external_typed = format!(
        "{VLLM}remoteStorage: {{provider: Redis, ownership: External, endpoint: 'r:6379', redis: {{}}}}\n"
    );
    let errors = check("a", &external_typed);
    assert_eq!(fields(&errors), ["spec.remoteStorage.redis"]);
    assert!(errors[0].detail.contains("Managed providers only"));

    let lmcache_on_hicache =
        "runtime: SGLang\ntype: SGLangHiCache\nhiCache: {ratio: '2'}\nlmCache: {}\n";
    assert_eq!(fields(&check("a", lmcache_on_hicache)), ["spec.lmCache"]);
    let hicache_on_lmcache = format!("{VLLM}hiCache: {{ratio: '2'}}\n");
    assert_eq!(fields(&check("a", &hicache_on_lmcache)), ["spec.hiCache"]);

    let host_only_autoscaling = format!("{VLLM}autoscaling: {{minReplicas: 1, maxReplicas: 3}}\n");
    let errors = check("a", &host_only_autoscaling);
    assert_eq!(fields(&errors), ["spec.autoscaling"]);
    assert!(errors[0].detail.contains("host-only"));
    let external_autoscaling = format!(
        "{VLLM}remoteStorage: {{provider: Redis, ownership: External, endpoint: 'r:6379'}}\nautoscaling: {{minReplicas: 1, maxReplicas: 3}}\n"
    );
    assert_eq!(
        fields(&check("a", &external_autoscaling)),
        ["spec.autoscaling"]
    );
}

#[test]
fn endpoint_ownership() {
    let missing =
        format!("{VLLM}remoteStorage: {{provider: Redis, ownership: External, endpoint: '   '}}\n");
    let errors = check("a", &missing);
    assert_eq!(errors[0].kind, ErrorType::Required);
    assert_eq!(fields(&errors), ["spec.remoteStorage.endpoint"]);

    let managed_with = format!(
        "{VLLM}remoteStorage: {{provider: Redis, ownership: Managed, endpoint: 'r:6379'}}\n"
    );
    let errors = check("a", &managed_with);
    assert_eq!(errors[0].kind, ErrorType::Forbidden);
    assert_eq!(errors[0].bad_value.as_deref(), Some("r:6379"));

    let padded = format!(
        "{VLLM}remoteStorage: {{provider: Redis, ownership: External, endpoint: '  r:6379 '}}\n"
    );
    assert!(
        check("a", &padded).is_empty(),
        "outer whitespace is trimmed"
    );
    let embedded = format!(
        "{VLLM}remoteStorage: {{provider: Redis, ownership: External, endpoint: 'r :6379'}}\n"
    );
    let errors = check("a", &embedded);
    assert_eq!(errors[0].kind, ErrorType::Invalid);
    assert!(errors[0].detail.contains("whitespace"));
}

#[test]
fn host_namespaces() {
    for (endpoint, ns) in [
        ("redis.team-b:6379", Some("team-b")),
        ("lm://cache.team-b.svc:65432", Some("team-b")),
        ("cache.team-b.svc.cluster.local:1", Some("team-b")),
        (
            "redis-0.redis.team-b.svc.cluster.local:6379",
            Some("team-b"),
        ),
        ("redis:6379", None),
        ("10.0.0.7:6379", None),
        ("[fd00::1]:6379", None),
        ("cache.example.com:6379", None),
    ] {
        assert_eq!(host_namespace(endpoint), ns, "{endpoint}");
    }
}

#[test]
fn cross_namespace_endpoint_needs_opt_in() {
    let other = format!(
        "{VLLM}remoteStorage: {{provider: Redis, ownership: External, endpoint: 'redis.team-b.svc:6379'}}\n"
    );
    let errors = check("team-a", &other);
    assert_eq!(fields(&errors), ["spec.remoteStorage.endpoint"]);
    assert!(
        errors[0].detail.contains("allowCrossNamespace"),
        "{}",
        errors[0]
    );
    assert!(check("team-b", &other).is_empty(), "its own namespace");
    let opted_in = format!("{other}allowCrossNamespace: true\n");
    assert!(check("team-a", &opted_in).is_empty());
}

#[test]
fn zero_replicas_with_autoscaling_needs_min_replicas() {
    let base =
        format!("{VLLM}remoteStorage: {{provider: Redis, ownership: Managed}}\nreplicas: 0\n");
    let bad = format!("{base}autoscaling: {{maxReplicas: 3}}\n");
    let errors = check("a", &bad);
    assert_eq!(fields(&errors), ["spec.autoscaling.minReplicas"]);
    assert!(errors[0].detail.contains("remove spec.autoscaling"));
    let good = format!("{base}autoscaling: {{minReplicas: 1, maxReplicas: 3}}\n");
    assert!(check("a", &good).is_empty());
}

#[test]
fn events_only_rules() {
    let ok = format!("{VLLM}integration: {{mode: EventsOnly}}\n");
    assert!(check("a", &ok).is_empty());
    let bad = "runtime: SGLang\ntype: SGLangHiCache\nhiCache: {ratio: '2'}\nintegration: {mode: EventsOnly}\n\
               remoteStorage: {provider: Redis, ownership: Managed}\nautoscaling: {minReplicas: 1, maxReplicas: 2}\n";
    let errors = check("a", bad);
    assert_eq!(
        fields(&errors),
        // cache-hierarchy leaves a managed provider's autoscaling alone;
        // events-only rejects all three.
        ["spec.type", "spec.remoteStorage", "spec.autoscaling"]
    );
}

#[test]
fn sglang_supports_read_write_only() {
    let ok = "runtime: SGLang\nintegration: {role: ReadWrite}\n";
    assert!(check("a", ok).is_empty());
    let errors = check("a", "runtime: SGLang\nintegration: {role: ReadOnly}\n");
    assert_eq!(errors[0].kind, ErrorType::NotSupported);
    assert_eq!(errors[0].bad_value.as_deref(), Some("ReadOnly"));
    assert!(check("a", &format!("{VLLM}integration: {{role: ReadOnly}}\n")).is_empty());
}

#[test]
fn host_network_is_for_mooncake_and_mooncake_is_a_singleton() {
    let mooncake = format!(
        "{VLLM}remoteStorage: {{provider: Mooncake, ownership: Managed}}\nintegration: {{engineHostNetwork: true}}\n"
    );
    assert!(check("a", &mooncake).is_empty());
    let redis = format!(
        "{VLLM}remoteStorage: {{provider: Redis, ownership: Managed}}\nintegration: {{engineHostNetwork: true}}\n"
    );
    assert_eq!(
        fields(&check("a", &redis)),
        ["spec.integration.engineHostNetwork"]
    );
    let off = format!("{VLLM}integration: {{engineHostNetwork: false}}\n");
    assert!(check("a", &off).is_empty());

    let two = format!("{mooncake}replicas: 2\n");
    assert_eq!(fields(&check("a", &two)), ["spec.replicas"]);
    let scaled = format!("{mooncake}autoscaling: {{minReplicas: 1, maxReplicas: 2}}\n");
    assert_eq!(fields(&check("a", &scaled)), ["spec.autoscaling"]);
}

#[test]
fn updates_report_only_new_violations() {
    let old = check(
        "team-a",
        &format!(
            "{VLLM}remoteStorage: {{provider: Redis, ownership: External, endpoint: 'redis.team-b:6379'}}\n"
        ),
    );
    assert_eq!(old.len(), 1);
    // An unrelated edit keeps the old violation: nothing new to report.
    let same = check(
        "team-a",
        &format!(
            "{VLLM}replicas: 2\nremoteStorage: {{provider: Redis, ownership: External, endpoint: 'redis.team-b:6379'}}\n"
        ),
    );
    assert!(introduced(&old, same).is_empty());
    // Editing the bad field to another bad value is a fresh violation.
    let other = check(
        "team-a",
        &format!(
            "{VLLM}remoteStorage: {{provider: Redis, ownership: External, endpoint: 'redis.team-c:6379'}}\n"
        ),
    );
    let new = introduced(&old, other);
    assert_eq!(new.len(), 1);
    assert_eq!(new[0].bad_value.as_deref(), Some("redis.team-c:6379"));
}

#[test]
fn messages_name_field_and_value() {
    let e = error(
        ErrorType::Invalid,
        "spec.replicas",
        Some("2".into()),
        "too many",
    );
    assert_eq!(
        e.to_string(),
        "spec.replicas: Invalid value: \"2\": too many"
    );
}
