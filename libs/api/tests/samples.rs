//! Every sample under `config/samples/` is valid against the generated CRD
//! schema, passes its CEL rules and deserializes into the Rust types; every
//! fixture under `tests/fixtures/invalid/` is rejected with an error that
//! names the offending field.
//!
//! The schema is checked the way the API server checks it with strict field
//! validation (kubectl's default): closed enums, bounds, patterns, required
//! fields, unknown fields rejected, then the `x-kubernetes-validations` CEL
//! rules.

use std::path::{Path, PathBuf};

use ic_api::{CacheBackend, CacheIndex, CachePolicy, CacheTenant};
use serde_json::{Map, Value};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The openAPIV3Schema of the CRD serving `kind`.
fn crd_schema(kind: &str) -> Value {
    let (_, crd) = ic_api::crds()
        .into_iter()
        .find(|(_, crd)| crd.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no CRD for kind {kind}"));
    let version = &crd.spec.versions[0];
    serde_json::to_value(
        version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .expect("schema"),
    )
    .expect("schema serializes")
}

/// Rewrites a structural CRD schema into plain JSON Schema with the API
/// server's strict semantics: objects with declared properties reject unknown
/// ones, `nullable` admits null, int-or-string admits both.
fn strict_json_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, value) in map {
                if key.starts_with("x-kubernetes-") || key == "nullable" {
                    continue;
                }
                out.insert(key.clone(), strict_json_schema(value));
            }
            if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) {
                out.remove("type");
                out.insert(
                    "anyOf".into(),
                    serde_json::json!([{"type": "integer"}, {"type": "string"}]),
                );
            }
            if map.get("nullable") == Some(&Value::Bool(true))
                && let Some(Value::String(ty)) = map.get("type")
            {
                out.insert("type".into(), serde_json::json!([ty, "null"]));
            }
            let preserves =
                map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            if map.contains_key("properties")
                && !map.contains_key("additionalProperties")
                && !preserves
            {
                out.insert("additionalProperties".into(), Value::Bool(false));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(strict_json_schema).collect()),
        other => other.clone(),
    }
}

/// All problems the API server would report for `object`, as
/// `path: message` strings (empty when valid).
fn schema_errors(object: &Value) -> Vec<String> {
    let kind = object["kind"].as_str().expect("kind");
    let schema = crd_schema(kind);
    let mut strict = strict_json_schema(&schema);
    // The API server supplies these for every kind; the CRD schema leaves them out.
    let root = strict["properties"]
        .as_object_mut()
        .expect("root properties");
    root.insert("apiVersion".into(), serde_json::json!({"type": "string"}));
    root.insert("kind".into(), serde_json::json!({"type": "string"}));
    root.insert("metadata".into(), serde_json::json!({"type": "object"}));
    let validator = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft4)
        .build(&strict)
        .expect("the generated schema is valid JSON Schema");
    let mut errors: Vec<String> = validator
        .iter_errors(object)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    // CEL rules only run on structurally valid objects, as in the API server.
    if errors.is_empty()
        && let Err(cel) = kube::core::cel::Validator::new().validate(&schema, object, None)
    {
        errors.extend(cel.iter().map(ToString::to_string));
    }
    errors
}

fn load_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn deserialize_as_kind(object: &Value) -> Result<(), serde_json::Error> {
    let v = object.clone();
    match object["kind"].as_str().expect("kind") {
        "CacheBackend" => serde_json::from_value::<CacheBackend>(v).map(drop),
        "CachePolicy" => serde_json::from_value::<CachePolicy>(v).map(drop),
        "CacheTenant" => serde_json::from_value::<CacheTenant>(v).map(drop),
        "CacheIndex" => serde_json::from_value::<CacheIndex>(v).map(drop),
        other => panic!("unexpected kind {other}"),
    }
}

#[test]
fn every_sample_is_valid_and_deserializes() {
    let files = yaml_files(&repo_root().join("config/samples"));
    let mut kinds = std::collections::BTreeSet::new();
    for file in &files {
        let object = load_yaml(file);
        let errors = schema_errors(&object);
        assert!(
            errors.is_empty(),
            "{} is invalid:\n  {}",
            file.display(),
            errors.join("\n  ")
        );
        deserialize_as_kind(&object).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        kinds.insert(object["kind"].as_str().unwrap().to_owned());
    }
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        ["CacheBackend", "CacheIndex", "CachePolicy", "CacheTenant"],
        "every kind has a sample"
    );
    for required in ["cachebackend-external.yaml", "cachebackend-mooncake.yaml"] {
        assert!(
            files.iter().any(|f| f.ends_with(required)),
            "the spec names config/samples/{required}"
        );
    }
}

#[test]
fn every_invalid_fixture_is_rejected_naming_the_field() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid");
    let files = yaml_files(&dir);
    assert!(files.len() >= 20, "fixtures missing");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let expect = text
            .lines()
            .find_map(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} has no `# expect:` line", file.display()));
        let errors = schema_errors(&load_yaml(&file));
        assert!(
            errors.iter().any(|e| e.contains(expect)),
            "{}: expected an error mentioning {expect:?}, got {errors:#?}",
            file.display()
        );
    }
}

#[test]
fn schema_defaults_are_applied_by_the_types() {
    let object = serde_json::json!({
        "apiVersion": "inferencecache.io/v1alpha1",
        "kind": "CacheBackend",
        "metadata": {"name": "x", "namespace": "ns"},
        "spec": {"runtime": "VLLM", "integration": {}, "observation": {"modelID": "m"}}
    });
    let cb: CacheBackend = serde_json::from_value(object).unwrap();
    assert_eq!(cb.spec.r#type, ic_api::cachebackend::CacheType::LMCache);
    assert_eq!(cb.spec.replicas, 1);
    assert_eq!(
        cb.spec.deployment_kind,
        ic_api::cachebackend::DeploymentKind::Deployment
    );
    let integration = cb.spec.integration.as_ref().unwrap();
    assert_eq!(
        integration.mode,
        ic_api::cachebackend::IntegrationMode::Offload
    );
    assert_eq!(
        integration.role,
        ic_api::cachebackend::IntegrationRole::ReadWrite
    );
    assert!(integration.fail_open);
    assert_eq!(cb.spec.observation.unwrap().first_event_timeout, "5m");
}

#[test]
fn schema_carries_the_same_defaults() {
    let schema = crd_schema("CacheBackend");
    let spec = &schema["properties"]["spec"]["properties"];
    assert_eq!(spec["type"]["default"], "LMCache");
    assert_eq!(spec["replicas"]["default"], 1);
    assert_eq!(spec["replicas"]["minimum"].as_f64(), Some(0.0));
    assert_eq!(spec["deploymentKind"]["default"], "Deployment");
    let integration = &spec["integration"]["properties"];
    assert_eq!(integration["mode"]["default"], "Offload");
    assert_eq!(integration["role"]["default"], "ReadWrite");
    assert_eq!(integration["failOpen"]["default"], true);
    assert_eq!(
        spec["observation"]["properties"]["firstEventTimeout"]["default"],
        "5m"
    );
    assert_eq!(
        spec["runtime"]["enum"],
        serde_json::json!(["VLLM", "SGLang"])
    );
    assert_eq!(
        spec["type"]["enum"],
        serde_json::json!(["LMCache", "SGLangHiCache"])
    );
}

#[test]
fn status_index_participation_prefix_count_is_always_serialized() {
    let participation = ic_api::cachebackend::IndexParticipation::default();
    let json = serde_json::to_value(participation).unwrap();
    assert_eq!(json, serde_json::json!({"prefixCount": 0}));
}

#[test]
fn printer_columns_match_the_spec() {
    assert_eq!(
        <CacheBackend as kube::CustomResourceExt>::crd_name(),
        "cachebackends.inferencecache.io"
    );
    let (_, cb) = ic_api::crds().into_iter().next().unwrap();
    assert_eq!(cb.spec.names.short_names, Some(vec!["cb".to_owned()]));
    assert_eq!(cb.spec.scope, "Namespaced");
    let version = &cb.spec.versions[0];
    assert!(version.subresources.as_ref().unwrap().status.is_some());
    let columns: Vec<(String, String)> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| (c.name.clone(), c.json_path.clone()))
        .collect();
    let expected = [
        ("Ready", r#".status.conditions[?(@.type=="Ready")].status"#),
        ("Endpoint", ".status.endpoint"),
        ("Matched", ".status.matchedEnginePods"),
        ("Prefixes", ".status.indexParticipation.prefixCount"),
        ("LastEvent", ".status.indexParticipation.lastEventAt"),
    ];
    for (name, path) in expected {
        assert!(
            columns.contains(&(name.to_owned(), path.to_owned())),
            "missing printer column {name} {path}: {columns:?}"
        );
    }
}

/// The scoring and shedding blocks of a CachePolicy pass the schema and
/// CEL rules when in range and in order (the invalid fixtures cover the
/// rest), and deserialize into the types.
#[test]
fn a_cache_policy_with_scoring_and_shedding_is_valid() {
    for spec in [
        serde_json::json!({
            "scoring": {"prefixWeight": 3, "loadWeight": 0.5, "kvUsageWeight": 0, "loadBound": 0},
            "shedding": {"sheddableAtRequests": 4, "standardAtRequests": 8, "criticalAtRequests": 8}
        }),
        serde_json::json!({"scoring": {"loadBound": 1.5}, "shedding": {"sheddableAtRequests": 2}}),
        serde_json::json!({"shedding": {"sheddableAtRequests": 0, "standardAtRequests": 0}}),
    ] {
        let object = serde_json::json!({
            "apiVersion": "inferencecache.io/v1alpha1",
            "kind": "CachePolicy",
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": spec,
        });
        let errors = schema_errors(&object);
        assert!(errors.is_empty(), "{spec}: {errors:#?}");
        deserialize_as_kind(&object).unwrap();
    }
}
