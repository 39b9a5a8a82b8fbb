//! The controller's decisions as pure functions over observed state and an
//! injectable clock: what the CacheBackend status and conditions must say,
//! the KV-event and functional-probe gates, cascade-restart baselines,
//! engine observations, attributing index-server replicas to backends, and
//! the namespace- and label-keyed index of watched engine pods and
//! Deployments a reconcile reads. `services/controller` gathers the inputs
//! from the API server and applies the outputs; nothing here does I/O.

pub mod attribution;
pub mod cascade;
pub mod clock;
pub mod conditions;
pub mod endpoint;
pub mod event;
pub mod gates;
pub mod index;
pub mod k8s;
pub mod narrate;
pub mod observe;
pub mod status;
