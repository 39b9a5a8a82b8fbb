//! Helpers shared by the `providers*` integration tests.

#![allow(dead_code)]

use ic_adapters::providers::{ProviderObjects, Workload};
use ic_api::CacheBackend;
use serde_json::{Value, json};

/// UID every test backend carries.
pub const UID: &str = "6f1c2a7e-0d4b-4c8e-9a51-3e2f7b9d8c10";

/// A CacheBackend `llama` in namespace `inference` with the given spec.
pub fn backend(spec: Value) -> CacheBackend {
    named("llama", spec)
}

/// A CacheBackend with the given name in namespace `inference`.
pub fn named(name: &str, spec: Value) -> CacheBackend {
    serde_json::from_value(json!({
        "apiVersion": "inferencecache.io/v1alpha1",
        "kind": "CacheBackend",
        "metadata": {"name": name, "namespace": "inference", "uid": UID},
        "spec": spec,
    }))
    .expect("valid CacheBackend")
}

/// The rendered objects as one JSON document, the shape fixtures store.
pub fn objects_json(o: &ProviderObjects) -> Value {
    let managed = o.managed.as_ref().map(|m| {
        let workload = match &m.workload {
            Workload::Deployment(d) => serde_json::to_value(d),
            Workload::StatefulSet(s) => serde_json::to_value(s),
        }
        .expect("serialisable workload");
        json!({
            "provider": m.provider,
            "workload": workload,
            "service": m.service,
            "hpa": m.hpa,
        })
    });
    json!({"managed": managed, "shed": o.shed})
}
