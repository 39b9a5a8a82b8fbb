//! Reading the decision inputs out of Kubernetes objects the service has
//! already fetched (no I/O here): the provider workload's rollout state,
//! cache-server pods for the cascade baseline, and the engine replica count
//! a selector expects. The controller service calls these and nothing else
//! to read those objects.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    Container, ContainerStatus, Pod, PodSpec, PodStatus, PodTemplateSpec,
};

use crate::cascade::ServerPod;
use crate::observe::selector_matches;
use crate::status::{ServerPods, WorkloadState};

/// The rollout state of the provider Deployment.
pub fn workload_from_deployment(d: &Deployment) -> WorkloadState {
    let status = d.status.as_ref();
    let available = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Available"))
        .is_some_and(|c| c.status == "True");
    WorkloadState {
        // The API server defaults spec.replicas to 1 when unset.
        spec_replicas: d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1),
        ready_replicas: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        updated_replicas: status.and_then(|s| s.updated_replicas).unwrap_or(0),
        available_replicas: status.and_then(|s| s.available_replicas).unwrap_or(0),
        observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
        generation: d.metadata.generation.unwrap_or(0),
        available,
    }
}

/// The rollout state of the provider StatefulSet. It has no Available
/// condition: available means every desired replica is available (and a
/// StatefulSet scaled to zero is not).
pub fn workload_from_statefulset(s: &StatefulSet) -> WorkloadState {
    let status = s.status.as_ref();
    let spec_replicas = s.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let available_replicas = status.and_then(|s| s.available_replicas).unwrap_or(0);
    WorkloadState {
        spec_replicas,
        ready_replicas: status.and_then(|s| s.ready_replicas).unwrap_or(0),
        updated_replicas: status.and_then(|s| s.updated_replicas).unwrap_or(0),
        available_replicas,
        observed_generation: status.and_then(|s| s.observed_generation).unwrap_or(0),
        generation: s.metadata.generation.unwrap_or(0),
        available: spec_replicas > 0 && available_replicas >= spec_replicas,
    }
}

/// Names of the containers on a workload's pod template: the cache
/// server's own containers (injected sidecars are not among them).
pub fn template_containers(template: Option<&PodTemplateSpec>) -> Vec<String> {
    template
        .and_then(|t| t.spec.as_ref())
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

/// A cache-server pod: Ready condition and per-container restart counts.
pub fn server_pod(p: &Pod) -> ServerPod {
    let status = p.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let container_restarts = status
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| (c.name.clone(), c.restart_count))
                .collect()
        })
        .unwrap_or_default();
    ServerPod {
        name: p.metadata.name.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
        ready,
        container_restarts,
    }
}

/// The cascade input from the provider workload's template containers and
/// its pods. Pods being deleted are skipped: they are on their way out, and
/// counting one would keep a replaced server's restart counts in the
/// baseline after its successor is up.
pub fn server_pods(own_containers: Vec<String>, pods: &[impl Borrow<Pod>]) -> ServerPods {
    ServerPods {
        pods: pods
            .iter()
            .map(Borrow::borrow)
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(server_pod)
            .collect(),
        own_containers,
    }
}

/// The desired replica sum of Deployments whose pod-template labels satisfy
/// the selector (saturating: replicas are i32 and a sum could overflow);
/// `None` when none does (engine pods are then expected).
pub fn expected_engine_replicas(
    match_labels: Option<&BTreeMap<String, String>>,
    deployments: &[impl Borrow<Deployment>],
) -> Option<i32> {
    let matching: Vec<i32> = deployments
        .iter()
        .map(Borrow::borrow)
        .filter_map(|d| {
            let spec = d.spec.as_ref()?;
            let labels = spec
                .template
                .metadata
                .as_ref()
                .and_then(|m| m.labels.as_ref());
            selector_matches(match_labels, labels).then(|| spec.replicas.unwrap_or(1))
        })
        .collect();
    (!matching.is_empty()).then(|| matching.iter().fold(0i32, |a, n| a.saturating_add(*n)))
}

/// Reduces a watched Pod to the fields the controller reads (labels,
/// annotations, owners, deletion, container names with only the injected
/// marker env, readiness, container and init-container statuses, pod IP),
/// so a cluster-wide Pod store costs a fraction of the full objects:
/// managed fields, volumes, probes, commands and resources are dropped.
pub fn trim_pod(pod: &mut Pod) {
    trim_metadata(&mut pod.metadata);
    if let Some(spec) = pod.spec.as_mut() {
        let containers = std::mem::take(&mut spec.containers);
        *spec = PodSpec {
            containers: containers.into_iter().map(trim_container).collect(),
            ..PodSpec::default()
        };
    }
    if let Some(status) = pod.status.as_mut() {
        *status = PodStatus {
            conditions: status.conditions.take(),
            container_statuses: status.container_statuses.take().map(trim_statuses),
            init_container_statuses: status.init_container_statuses.take().map(trim_statuses),
            phase: status.phase.take(),
            pod_ip: status.pod_ip.take(),
            ..PodStatus::default()
        };
    }
}

fn trim_container(c: Container) -> Container {
    Container {
        name: c.name,
        env: c.env.map(|env| {
            env.into_iter()
                .filter(|e| e.name == ic_adapters::runtime::SIDECAR_MARKER_ENV)
                .collect()
        }),
        ..Container::default()
    }
}

fn trim_statuses(statuses: Vec<ContainerStatus>) -> Vec<ContainerStatus> {
    statuses
        .into_iter()
        .map(|c| ContainerStatus {
            name: c.name,
            ready: c.ready,
            restart_count: c.restart_count,
            state: c.state,
            last_state: c.last_state,
            ..ContainerStatus::default()
        })
        .collect()
}

/// Drops what no reader of a watched object needs from any kind the
/// controller stores: managed fields, and kubectl's last-applied copy of the
/// whole object (usually the largest annotation).
pub fn trim_metadata(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    meta.managed_fields = None;
    if let Some(ann) = meta.annotations.as_mut() {
        ann.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(v: serde_json::Value) -> Deployment {
        serde_json::from_value(v).unwrap_or_default()
    }

    #[test]
    fn reads_rollout_state() {
        let d = deployment(serde_json::json!({
            "metadata": {"generation": 3},
            "spec": {"replicas": 2, "selector": {}, "template": {"spec": {"containers": [{"name": "server"}]}}},
            "status": {"observedGeneration": 3, "readyReplicas": 2, "updatedReplicas": 2, "availableReplicas": 1,
                       "conditions": [{"type": "Available", "status": "True"}]},
        }));
        let w = workload_from_deployment(&d);
        assert_eq!(
            (w.spec_replicas, w.ready_replicas, w.available_replicas),
            (2, 2, 1)
        );
        assert!(w.available);
        assert_eq!(w.generation, 3);
        assert_eq!(
            template_containers(d.spec.as_ref().map(|s| &s.template)),
            vec!["server".to_owned()]
        );
    }

    #[test]
    fn reads_statefulset_rollout_state() {
        let s: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"generation": 2},
            "spec": {"replicas": 2, "selector": {}, "serviceName": "s", "template": {}},
            "status": {"replicas": 2, "observedGeneration": 2, "readyReplicas": 2, "availableReplicas": 2},
        }))
        .unwrap_or_default();
        let w = workload_from_statefulset(&s);
        assert!(w.available);
        assert_eq!(
            (w.spec_replicas, w.available_replicas, w.generation),
            (2, 2, 2)
        );
        let mut zero = s.clone();
        if let Some(spec) = zero.spec.as_mut() {
            spec.replicas = Some(0);
        }
        assert!(
            !workload_from_statefulset(&zero).available,
            "scaled to zero is not available"
        );
    }

    #[test]
    fn terminating_server_pods_leave_the_baseline() {
        let pod = |name: &str, terminating: bool| -> Pod {
            let mut v = serde_json::json!({
                "metadata": {"name": name, "uid": format!("uid-{name}")},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                           "containerStatuses": [{"name": "redis", "image": "r", "imageID": "", "ready": true, "restartCount": 3}]},
            });
            if terminating {
                v["metadata"]["deletionTimestamp"] = serde_json::json!("2026-01-01T00:00:00Z");
            }
            serde_json::from_value(v).unwrap_or_default()
        };
        let got = server_pods(
            vec!["redis".to_owned()],
            &[pod("old", true), pod("new", false)],
        );
        let names: Vec<&str> = got.pods.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["new"]);
        assert_eq!(got.pods[0].container_restarts, [("redis".to_owned(), 3)]);
        assert_eq!(got.own_containers, ["redis"]);
    }

    #[test]
    fn trimmed_pods_read_the_same() {
        use crate::observe::{BackendRef, summarize_pod};
        let full: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "llm-7d9-abc", "namespace": "ns", "uid": "u1",
                "labels": {"app": "llm", "pod-template-hash": "7d9"},
                "annotations": {"inferencecache.io/injected-by": "ns/cache",
                                "inferencecache.io/injected-by-uid": "b1",
                                "kubectl.kubernetes.io/last-applied-configuration": "{\"huge\": true}"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llm-7d9", "uid": "rs", "controller": true}],
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"volumes": [{"name": "v", "emptyDir": {}}],
                "initContainers": [{"name": "lmcache-kernel-check", "image": "i", "command": ["sh", "-c", "long script"]}],
                "containers": [
                    {"name": "vllm", "image": "vllm", "args": ["serve", "m"], "env": [{"name": "A", "value": "1"}],
                     "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "kvevent-subscriber", "image": "s",
                     "env": [{"name": ic_adapters::runtime::SIDECAR_MARKER_ENV, "value": "kvevent-subscriber"}, {"name": "B", "value": "2"}]}]},
            "status": {"phase": "Running", "podIP": "10.0.0.9", "hostIP": "10.1.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
                "initContainerStatuses": [{"name": "lmcache-kernel-check", "image": "i", "imageID": "x", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "message": "LMCACHE_KERNEL_CHECK=ok"}}}],
                "containerStatuses": [{"name": "vllm", "image": "vllm", "imageID": "x", "ready": false, "restartCount": 4,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        }))
        .unwrap_or_default();
        let mut trimmed = full.clone();
        trim_pod(&mut trimmed);
        let labels = std::collections::BTreeMap::from([("app".to_owned(), "llm".to_owned())]);
        let r = BackendRef {
            namespace: "ns",
            name: "cache",
            uid: "b1",
            match_labels: Some(&labels),
        };
        assert_eq!(summarize_pod(&trimmed, r), summarize_pod(&full, r));
        assert_eq!(server_pod(&trimmed), server_pod(&full));
        assert!(trimmed.metadata.managed_fields.is_none());
        let spec = trimmed
            .spec
            .as_ref()
            .map(|s| (s.volumes.is_none(), s.containers.len()));
        assert_eq!(spec, Some((true, 2)));
        let sidecar_env = trimmed
            .spec
            .as_ref()
            .and_then(|s| s.containers[1].env.as_ref())
            .map(Vec::len);
        assert_eq!(sidecar_env, Some(1), "only the marker env is kept");
        assert_eq!(
            trimmed.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
            Some("10.0.0.9")
        );
        let (before, after) = (
            serde_json::to_vec(&full).map(|v| v.len()).unwrap_or(0),
            serde_json::to_vec(&trimmed).map(|v| v.len()).unwrap_or(0),
        );
        assert!(after < before, "{after} < {before}");
    }

    #[test]
    fn expected_replicas_saturate() {
        let dep = |replicas: i32| {
            deployment(serde_json::json!({
                "spec": {"replicas": replicas, "selector": {},
                         "template": {"metadata": {"labels": {"app": "vllm"}}, "spec": {"containers": []}}},
            }))
        };
        let sel = BTreeMap::from([("app".to_owned(), "vllm".to_owned())]);
        assert_eq!(
            expected_engine_replicas(Some(&sel), &[dep(i32::MAX), dep(5)]),
            Some(i32::MAX)
        );
    }

    #[test]
    fn expected_replicas_sum_matching_templates() {
        let dep = |labels: serde_json::Value, replicas: i32| {
            deployment(serde_json::json!({
                "spec": {"replicas": replicas, "selector": {},
                         "template": {"metadata": {"labels": labels}, "spec": {"containers": []}}},
            }))
        };
        let sel = BTreeMap::from([("app".to_owned(), "vllm".to_owned())]);
        let ds = vec![
            dep(serde_json::json!({"app": "vllm", "v": "1"}), 2),
            dep(serde_json::json!({"app": "vllm"}), 1),
            dep(serde_json::json!({"app": "other"}), 5),
        ];
        assert_eq!(expected_engine_replicas(Some(&sel), &ds), Some(3));
        assert_eq!(expected_engine_replicas(Some(&sel), &ds[2..]), None);
        assert_eq!(expected_engine_replicas(None, &ds), None);
    }
}
