//! The endpoint picker's pool: a static list (local runs), or an
//! `InferencePool` (`inference.networking.k8s.io/v1`) watched with the pods
//! of its namespace — the ready pods its selector matches, at each of its
//! target ports, are the endpoints. Both kinds are LISTed once and then
//! watched; endpoints are recomputed on every change of either.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
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

/// The endpoints of `pool` among `pods`: a pool edited into an unusable
/// spec keeps the selector and ports of its last usable one (`last_good`),
/// still following its pods, so that one bad edit does not take every
/// endpoint away; the error is returned beside them to be logged. A pool
/// with no usable spec yet, or a missing one, has none.
pub fn pool_endpoints(
    pool: Option<&Value>,
    pods: &[Pod],
    last_good: &mut Option<Value>,
) -> (Vec<String>, Option<PoolError>) {
    let Some(pool) = pool else {
        *last_good = None;
        return (Vec::new(), None);
    };
    match endpoints_of(pool, pods) {
        Ok(list) => {
            *last_good = Some(pool.clone());
            (list, None)
        }
        Err(error) => {
            let kept = last_good
                .as_ref()
                .and_then(|good| endpoints_of(good, pods).ok())
                .unwrap_or_default();
            (kept, Some(error))
        }
    }
}

/// Keeps `endpoints` equal to what InferencePool `name` in `namespace`
/// selects, until `shutdown`. A missing pool has no endpoints (the picker
/// answers 503); an invalid one keeps its last usable spec
/// ([`pool_endpoints`]); either is logged when it changes.
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
    // Backed off on errors: a missing CRD or RBAC would otherwise be
    // re-listed at once, again and again, when the API server can least
    // afford it.
    let pool_events = kube::runtime::reflector(
        pool_writer,
        watcher(pools, watcher::Config::default()).default_backoff(),
    )
    .map(|_| ());
    let pod_events = kube::runtime::reflector(
        pod_writer,
        watcher(pods, watcher::Config::default()).default_backoff(),
    )
    .map(|_| ());
    let mut events = futures::stream::select(Box::pin(pool_events), Box::pin(pod_events));
    let mut last: Option<Result<usize, PoolError>> = None;
    let mut last_good = None;
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
        let spec = pool.as_ref().map(|p| serde_json::to_value(&p.data));
        let (list, error) = match spec {
            Some(Err(e)) => (Vec::new(), Some(PoolError::Ports(e.to_string()))),
            Some(Ok(v)) => pool_endpoints(Some(&v), &pods, &mut last_good),
            None => pool_endpoints(None, &pods, &mut last_good),
        };
        let summary = match &error {
            Some(error) => Err(error.clone()),
            None => Ok(list.len()),
        };
        if last.as_ref() != Some(&summary) {
            match &error {
                None if pool.is_none() => {
                    tracing::warn!(%namespace, %name, "InferencePool not found; no endpoints");
                }
                None => {
                    tracing::info!(%namespace, %name, endpoints = list.len(), "pool endpoints")
                }
                Some(error) if last_good.is_some() => tracing::warn!(
                    %namespace, %name, %error, endpoints = list.len(),
                    "InferencePool unusable; keeping the selector and ports of its last usable spec"
                ),
                Some(error) => {
                    tracing::warn!(%namespace, %name, %error, "InferencePool unusable; no endpoints")
                }
            }
            last = Some(summary);
        }
        *endpoints.write() = list;
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
    fn an_unusable_edit_keeps_the_last_usable_spec_and_follows_its_pods() {
        let mut last_good = None;
        let a = pod("a", json!({"app": "vllm"}), "10.0.0.1", true);
        let b = pod("b", json!({"app": "vllm"}), "10.0.0.2", true);
        let good = pool(json!([{"number": 8000}]));
        let (list, error) = pool_endpoints(Some(&good), std::slice::from_ref(&a), &mut last_good);
        assert_eq!((list, error), (vec!["10.0.0.1:8000".to_owned()], None));
        // A port of 0: refused, and the endpoints of the last usable spec
        // kept, with the pods of now.
        let bad = pool(json!([{"number": 0}]));
        let (list, error) = pool_endpoints(Some(&bad), &[a.clone(), b], &mut last_good);
        assert_eq!(list, ["10.0.0.1:8000", "10.0.0.2:8000"]);
        assert!(error.is_some());
        // Gone: no endpoints, and nothing kept for a later bad spec.
        assert_eq!(
            pool_endpoints(None, &[], &mut last_good),
            (Vec::new(), None)
        );
        let (list, error) = pool_endpoints(Some(&bad), &[a], &mut last_good);
        assert!(list.is_empty() && error.is_some());
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
