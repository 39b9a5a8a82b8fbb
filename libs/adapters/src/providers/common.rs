//! The parts every provider shares: labels, the owner reference, resource
//! defaults and the HPA CPU fallback, template overrides, and the workload /
//! Service / HPA object builders.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::autoscaling::v2::{
    CrossVersionObjectReference, HorizontalPodAutoscaler, HorizontalPodAutoscalerSpec, MetricSpec,
    MetricTarget, ResourceMetricSource,
};
use k8s_openapi::api::core::v1::{
    Container, PodSpec, PodTemplateSpec, Probe, ResourceRequirements, Service, ServicePort,
    ServiceSpec, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use ic_api::cachebackend::{AutoscalingSpec, DeploymentKind, PodTemplateOverrides};
use ic_api::consts::labels;

use super::{
    DEFAULT_MEMORY_LIMIT, DEFAULT_MEMORY_REQUEST, DEFAULT_TARGET_CPU_UTILIZATION,
    HPA_CPU_REQUEST_FALLBACK, RenderError, Workload,
};
use crate::quantity::parse_exact;

/// Identity of the backend being rendered, resolved once.
#[derive(Clone, Debug)]
pub(crate) struct Owner {
    pub name: String,
    pub namespace: String,
    pub owner_ref: OwnerReference,
}

/// Every label on a rendered object (and on the pod template).
pub(crate) fn common_labels(
    backend: &str,
    component: &str,
    object_name: &str,
) -> BTreeMap<String, String> {
    let mut l = selector_labels(backend, component);
    l.insert(
        labels::MANAGED_BY.to_owned(),
        labels::MANAGED_BY_VALUE.to_owned(),
    );
    l.insert(labels::NAME.to_owned(), component.to_owned());
    l.insert(labels::INSTANCE.to_owned(), object_name.to_owned());
    l
}

/// The immutable selector subset: backend and component only, so nothing a
/// later release adds to the common labels can break `spec.selector`.
pub(crate) fn selector_labels(backend: &str, component: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::CACHE_BACKEND.to_owned(),
            super::names::label_value(backend),
        ),
        (labels::COMPONENT.to_owned(), component.to_owned()),
    ])
}

pub(crate) fn meta(owner: &Owner, name: &str, labels: &BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(owner.namespace.clone()),
        labels: Some(labels.clone()),
        owner_references: Some(vec![owner.owner_ref.clone()]),
        ..ObjectMeta::default()
    }
}

/// The provider container's resources: a deep copy of the typed block, the
/// 4Gi/8Gi memory default when the block is omitted (an explicit `{}` keeps
/// no defaults), and — with autoscaling — `cpu: 250m` whenever the request
/// is absent or not positive.
pub(crate) fn effective_resources(
    block: Option<&ResourceRequirements>,
    autoscaled: bool,
    field: &str,
) -> Result<ResourceRequirements, RenderError> {
    let mut res = match block {
        Some(r) => r.clone(),
        None => ResourceRequirements {
            requests: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity(DEFAULT_MEMORY_REQUEST.to_owned()),
            )])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity(DEFAULT_MEMORY_LIMIT.to_owned()),
            )])),
            ..ResourceRequirements::default()
        },
    };
    if autoscaled {
        let requests = res.requests.get_or_insert_with(BTreeMap::new);
        let positive = match requests.get("cpu") {
            None => false,
            Some(q) => parse_exact(&q.0)
                .map_err(|source| RenderError::InvalidQuantity {
                    field: format!("{field}.requests.cpu"),
                    source,
                })?
                .is_positive(),
        };
        if !positive {
            requests.insert(
                "cpu".to_owned(),
                Quantity(HPA_CPU_REQUEST_FALLBACK.to_owned()),
            );
        }
    }
    Ok(res)
}

/// Copies the operator's pod-level overrides onto the provider pod spec.
pub(crate) fn apply_overrides(pod: &mut PodSpec, t: Option<&PodTemplateOverrides>) {
    let Some(t) = t else { return };
    pod.node_selector.clone_from(&t.node_selector);
    pod.affinity.clone_from(&t.affinity);
    pod.tolerations.clone_from(&t.tolerations);
    pod.topology_spread_constraints
        .clone_from(&t.topology_spread_constraints);
    pod.image_pull_secrets.clone_from(&t.image_pull_secrets);
    pod.service_account_name.clone_from(&t.service_account_name);
    pod.security_context.clone_from(&t.security_context);
    pod.priority_class_name.clone_from(&t.priority_class_name);
    pod.scheduler_name.clone_from(&t.scheduler_name);
    pod.runtime_class_name.clone_from(&t.runtime_class_name);
    pod.termination_grace_period_seconds = t.termination_grace_period_seconds;
}

/// A TCP probe on a named container port.
pub(crate) fn tcp_probe(port: &str, initial_delay: i32, period: i32, failures: i32) -> Probe {
    Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::String(port.to_owned()),
            host: None,
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        timeout_seconds: Some(1),
        failure_threshold: Some(failures),
        ..Probe::default()
    }
}

/// Everything the workload builder needs besides the pod spec.
#[derive(Debug)]
pub(crate) struct WorkloadParams<'a> {
    pub kind: DeploymentKind,
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub selector: BTreeMap<String, String>,
    /// `None` when an HPA owns the replica count.
    pub replicas: Option<i32>,
    /// Deployment `Recreate` strategy (host-port singletons).
    pub recreate: bool,
    pub service_name: &'a str,
}

pub(crate) fn workload(
    owner: &Owner,
    p: WorkloadParams<'_>,
    container: Container,
    pod: PodSpec,
) -> Workload {
    let template = PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(p.labels.clone()),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![container],
            ..pod
        }),
    };
    let selector = LabelSelector {
        match_labels: Some(p.selector),
        match_expressions: None,
    };
    let metadata = meta(owner, p.name, p.labels);
    match p.kind {
        DeploymentKind::Deployment => Workload::Deployment(Deployment {
            metadata,
            spec: Some(DeploymentSpec {
                replicas: p.replicas,
                selector,
                template,
                strategy: p.recreate.then(|| DeploymentStrategy {
                    type_: Some("Recreate".to_owned()),
                    rolling_update: None,
                }),
                ..DeploymentSpec::default()
            }),
            status: None,
        }),
        DeploymentKind::StatefulSet => Workload::StatefulSet(StatefulSet {
            metadata,
            spec: Some(StatefulSetSpec {
                replicas: p.replicas,
                selector,
                template,
                service_name: Some(p.service_name.to_owned()),
                ..StatefulSetSpec::default()
            }),
            status: None,
        }),
    }
}

pub(crate) fn service(
    owner: &Owner,
    name: &str,
    labels: &BTreeMap<String, String>,
    selector: BTreeMap<String, String>,
    ports: Vec<ServicePort>,
    headless: bool,
) -> Service {
    Service {
        metadata: meta(owner, name, labels),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".to_owned()),
            cluster_ip: headless.then(|| "None".to_owned()),
            selector: Some(selector),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

pub(crate) fn service_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        port,
        target_port: Some(IntOrString::String(name.to_owned())),
        protocol: Some("TCP".to_owned()),
        ..ServicePort::default()
    }
}

/// The HPA bounds: the operator's floor, or `max(replicas, 1)` capped at the
/// ceiling when the defaulter never stamped one.
pub(crate) fn hpa(
    owner: &Owner,
    name: &str,
    labels: &BTreeMap<String, String>,
    target: &Workload,
    a: &AutoscalingSpec,
    replicas: i32,
) -> HorizontalPodAutoscaler {
    let max = a.max_replicas.max(1);
    let min = a.min_replicas.unwrap_or(replicas.max(1)).clamp(1, max);
    HorizontalPodAutoscaler {
        metadata: meta(owner, name, labels),
        spec: Some(HorizontalPodAutoscalerSpec {
            scale_target_ref: CrossVersionObjectReference {
                api_version: Some("apps/v1".to_owned()),
                kind: target.kind().kind().to_owned(),
                name: target.name().to_owned(),
            },
            min_replicas: Some(min),
            max_replicas: max,
            metrics: Some(vec![MetricSpec {
                type_: "Resource".to_owned(),
                resource: Some(ResourceMetricSource {
                    name: "cpu".to_owned(),
                    target: MetricTarget {
                        type_: "Utilization".to_owned(),
                        average_utilization: Some(
                            a.target_cpu_utilization_percent
                                .unwrap_or(DEFAULT_TARGET_CPU_UTILIZATION),
                        ),
                        ..MetricTarget::default()
                    },
                }),
                ..MetricSpec::default()
            }]),
            behavior: None,
        }),
        status: None,
    }
}
