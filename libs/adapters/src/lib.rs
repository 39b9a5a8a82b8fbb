//! Runtime adapters (vLLM + LMCache, SGLang + LMCache MP, SGLang HiCache),
//! storage-provider bindings, the injected sidecars, engine-override
//! semantics, the registry-backed admission checks, and managed provider
//! workload rendering: pure functions over k8s-openapi types, shared by the
//! webhook (pod wiring, CacheBackend admission) and the controller (provider
//! workloads).
//!
//! Entry points the services use:
//! * [`admission::admit_pod`] — the whole pod-mutation decision for one pod
//!   and the live backends of its namespace (the webhook diffs the returned
//!   pod against the original to build the JSON patch);
//! * [`admission::fail_open`] — the pod to admit when the webhook could not
//!   even decide (e.g. the backend list failed);
//! * [`admission::validate_backend`] — every validating rule: the structural
//!   rules of `ic_api::validate` plus the registry, reserved-override,
//!   provider-resource and annotation checks that need this crate;
//! * [`providers`] — managed provider workloads for the controller.

pub mod admission;
pub mod binding;
pub mod kv_events;
pub mod merge;
pub mod overrides;
pub mod providers;
pub mod quantity;
pub mod registry;
pub mod resources;
pub mod runtime;
pub mod sidecars;
pub mod validation;
