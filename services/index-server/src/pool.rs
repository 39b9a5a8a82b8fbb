//! The endpoint picker's pool: a static list (local runs), or an
//! `InferencePool` (`inference.networking.k8s.io/v1`) watched with the pods
//! of its namespace — the ready pods its selector matches, at each of its
//! target ports, are the endpoints. Both kinds are LISTed once and then
//! watched; endpoints are recomputed on every change of either.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher;
use parking_lot::RwLock;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// The pool's endpoints as the picker reads them (shared, swapped whole).
pub type Endpoints = Arc<RwLock<Vec<String>>>;

/// An InferencePool that cannot be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum PoolError {
    /// `spec.selector.matchLabels` is missing or empty.
    #[error("spec.selector.matchLabels: required (a pool selects its pods by label)")]
    NoSelector,
    /// `spec.targetPorts` is missing or empty, or a port is not a number.
    #[error("spec.targetPorts: {0}")]
    Ports(String),
}

/// Whether a pod is ready to serve: running, not terminating, Ready.
fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().is_some_and(|s| {
            s.pod_ip.as_deref().is_some_and(|ip| !ip.is_empty())
                && s.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// The endpoints of `pool` (its JSON object) among `pods`: `podIP:port` for
/// every ready pod whose labels match the selector, for every target port,
/// sorted.
pub fn endpoints_of(pool: &Value, pods: &[Pod]) -> Result<Vec<String>, PoolError> {
    let labels = pool["spec"]["selector"]["matchLabels"]
        .as_object()
        .filter(|m| !m.is_empty())
        .ok_or(PoolError::NoSelector)?;
    let ports: Vec<u64> = match pool["spec"]["targetPorts"].as_array() {
        Some(list) if !list.is_empty() => list
            .iter()
            .enumerate()
            .map(|(i, p)| {
                p["number"]
                    .as_u64()
                    .filter(|n| (1..=65535).contains(n))
                    .ok_or_else(|| PoolError::Ports(format!("[{i}].number: expected 1..65535")))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(PoolError::Ports("required, at least one port".into())),
    };
    let mut out: Vec<String> = pods
        .iter()
        .filter(|pod| {
            let have = pod.metadata.labels.as_ref();
            labels
                .iter()
                .all(|(k, v)| have.and_then(|l| l.get(k)).map(String::as_str) == v.as_str())
        })
        .filter(|pod| ready(pod))
        .filter_map(|pod| pod.status.as_ref()?.pod_ip.clone())
        .flat_map(|ip| {
            ports.iter().map(move |port| {
                if ip.contains(':') {
                    format!("[{ip}]:{port}")
                } else {
                    format!("{ip}:{port}")
                }
            })
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

fn inference_pool_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("inference.networking.k8s.io", "v1", "InferencePool"),
        "inferencepools",
    )
}

/// Keeps `endpoints` equal to what InferencePool `name` in `namespace`
/// selects, until `shutdown`. A pool that is missing or invalid has no
/// endpoints (the picker answers 503), logged when that changes.
pub async fn watch_pool(
    client: kube::Client,
    namespace: String,
    name: String,
    endpoints: Endpoints,
    shutdown: CancellationToken,
) {
    let resource = inference_pool_resource();
    let pools: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &resource);
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let pool_writer = kube::runtime::reflector::store::Writer::<DynamicObject>::new(resource);
    let pool_reader = pool_writer.as_reader();
    let (pod_reader, pod_writer) = kube::runtime::reflector::store::<Pod>();
    let pool_events =
        kube::runtime::reflector(pool_writer, watcher(pools, watcher::Config::default()))
            .map(|_| ());
    let pod_events =
        kube::runtime::reflector(pod_writer, watcher(pods, watcher::Config::default())).map(|_| ());
    let mut events = futures::stream::select(Box::pin(pool_events), Box::pin(pod_events));
    let mut last: Option<Result<usize, PoolError>> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            event = events.next() => if event.is_none() { return },
        }
        let pool = pool_reader
            .state()
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()));
        let pods: Vec<Pod> = pod_reader.state().iter().map(|p| (**p).clone()).collect();
        let computed = match &pool {
            Some(pool) => serde_json::to_value(&pool.data)
                .map_err(|e| PoolError::Ports(e.to_string()))
                .and_then(|v| endpoints_of(&v, &pods)),
            None => Ok(Vec::new()),
        };
        let summary = computed.as_ref().map(Vec::len).map_err(Clone::clone);
        if last.as_ref() != Some(&summary) {
            match &computed {
                Ok(list) if pool.is_none() => {
                    tracing::warn!(%namespace, %name, "InferencePool not found; no endpoints");
                    debug_assert!(list.is_empty());
                }
                Ok(list) => {
                    tracing::info!(%namespace, %name, endpoints = list.len(), "pool endpoints")
                }
                Err(error) => {
                    tracing::warn!(%namespace, %name, %error, "InferencePool unusable; no endpoints")
                }
            }
            last = Some(summary);
        }
        *endpoints.write() = computed.unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, labels: Value, ip: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"podIP": ip, "conditions": [
                {"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    fn pool(ports: Value) -> Value {
        json!({"spec": {"selector": {"matchLabels": {"app": "vllm"}}, "targetPorts": ports}})
    }

    #[test]
    fn ready_selected_pods_at_every_target_port() {
        let pods = [
            pod("a", json!({"app": "vllm"}), "10.0.0.1", true),
            pod("b", json!({"app": "vllm", "x": "y"}), "10.0.0.2", true),
            pod("not-ready", json!({"app": "vllm"}), "10.0.0.3", false),
            pod("other", json!({"app": "sglang"}), "10.0.0.4", true),
            pod("v6", json!({"app": "vllm"}), "fd00::5", true),
        ];
        let got = endpoints_of(&pool(json!([{"number": 8000}, {"number": 8001}])), &pods).unwrap();
        assert_eq!(
            got,
            [
                "10.0.0.1:8000",
                "10.0.0.1:8001",
                "10.0.0.2:8000",
                "10.0.0.2:8001",
                "[fd00::5]:8000",
                "[fd00::5]:8001"
            ]
        );
    }

    #[test]
    fn a_terminating_pod_is_not_an_endpoint() {
        let mut p = pod("a", json!({"app": "vllm"}), "10.0.0.1", true);
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert!(
            endpoints_of(&pool(json!([{"number": 8000}])), &[p])
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn an_unusable_pool_names_the_field() {
        assert_eq!(
            endpoints_of(&json!({"spec": {"targetPorts": [{"number": 1}]}}), &[]),
            Err(PoolError::NoSelector)
        );
        let err = endpoints_of(&pool(json!([{"number": 0}])), &[]).unwrap_err();
        assert!(
            err.to_string().starts_with("spec.targetPorts: [0].number"),
            "{err}"
        );
        assert!(endpoints_of(&pool(json!([])), &[]).is_err());
    }
}
