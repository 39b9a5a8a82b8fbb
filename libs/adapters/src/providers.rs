//! Managed provider workloads (Redis, LMCache server, Mooncake master) and
//! their Services and HPAs, rendered from a CacheBackend for the controller.
//!
//! Everything here is a pure function of the CacheBackend object: the
//! controller calls [`render`] on every reconcile, server-side-applies what
//! [`ProviderObjects::managed`] holds (one field manager), and deletes every
//! [`ProviderObjects::shed`] entry that exists and carries this backend's
//! controller owner reference. Because names are deterministic per provider
//! and kind, the shed list is simply "every object this backend could own in
//! any mode, minus what the current mode wants", which covers every flip:
//! Deployment ↔ StatefulSet, autoscaling removed, a provider switch, and
//! Offload → EventsOnly / host-only / External (which shed everything).
//!
//! A provider workload is rendered only for `integration.mode: Offload`,
//! `type: LMCache` and `remoteStorage.ownership: Managed`. Per managed
//! backend the controller owns, in the backend's namespace and named
//! `<backend>-<component>` (see [`object_name`]):
//!
//! | provider | component | workload | Service | HPA |
//! |---|---|---|---|---|
//! | Redis | `redis` | Deployment or StatefulSet | ClusterIP `:6379` | when `spec.autoscaling` |
//! | LMCacheServer | `lmcache-server` | Deployment or StatefulSet | ClusterIP `:65432` | when `spec.autoscaling` |
//! | Mooncake | `mooncake-master` | hostNetwork singleton (Recreate) | headless `:50051`, `:8080` | never |
//!
//! [`service_endpoint`] turns the (live or rendered) Service into the bare
//! `host:port` the controller publishes as `status.endpoint`.

mod common;
pub mod images;
mod lmcache_server;
mod mooncake;
mod names;
mod redis;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Container, PodSpec, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde::Serialize;
use thiserror::Error;

use ic_api::CacheBackend;
use ic_api::cachebackend::{
    CacheBackendSpec, CacheType, IntegrationMode, Ownership, StorageProvider,
};

pub use redis::redis_maxmemory_bytes;

use crate::quantity::QuantityError;
use common::{Owner, WorkloadParams};

// === defaults ===

/// Redis image when `remoteStorage.redis.image` is unset (pinned patch release).
pub const REDIS_DEFAULT_IMAGE: &str = "docker.io/library/redis:7.4.2-alpine";
/// LMCache server image when unset; version-aligned with the lmcache 0.4.7
/// client, fully qualified (CRI-O refuses short names under enforcement).
pub const LMCACHE_SERVER_DEFAULT_IMAGE: &str = "docker.io/lmcache/standalone:v0.4.7";
/// Mooncake master image when unset (fully qualified for CRI-O short-name policy).
pub const MOONCAKE_DEFAULT_IMAGE: &str = "docker.io/kvcacheai/mooncake:0.3.11.post1";
/// Redis RESP port.
pub const REDIS_PORT: i32 = 6379;
/// LMCache server `lm://` port.
pub const LMCACHE_SERVER_PORT: i32 = 65432;
/// Mooncake master RPC port (the published endpoint).
pub const MOONCAKE_RPC_PORT: i32 = 50051;
/// Mooncake embedded HTTP metadata server port.
pub const MOONCAKE_HTTP_METADATA_PORT: i32 = 8080;
/// Mooncake Prometheus metrics port.
pub const MOONCAKE_METRICS_PORT: i32 = 9003;
/// Memory request when the provider's resources block is omitted.
pub const DEFAULT_MEMORY_REQUEST: &str = "4Gi";
/// Memory limit when the provider's resources block is omitted.
pub const DEFAULT_MEMORY_LIMIT: &str = "8Gi";
/// CPU request filled in for autoscaled workloads without a positive one.
pub const HPA_CPU_REQUEST_FALLBACK: &str = "250m";
/// HPA target when `targetCPUUtilizationPercent` is unset.
pub const DEFAULT_TARGET_CPU_UTILIZATION: i32 = 80;

// === public types ===

/// Why a backend could not be rendered. Every variant is a property of the
/// CacheBackend object, so retrying without a change will not help.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum RenderError {
    /// `metadata.name` is unset.
    #[error("CacheBackend has no metadata.name")]
    MissingName,
    /// `metadata.namespace` is unset (CacheBackend is namespaced).
    #[error("CacheBackend {0} has no metadata.namespace")]
    MissingNamespace(String),
    /// `metadata.uid` is unset, so no owner reference can be built (the
    /// object did not come from the API server).
    #[error("CacheBackend {0} has no metadata.uid; owner references need it")]
    MissingUid(String),
    /// A resource quantity the renderer must compute with is unreadable.
    #[error("{field}: {source}")]
    InvalidQuantity {
        /// Field path, e.g. `spec.remoteStorage.redis.resources.limits.memory`.
        field: String,
        /// What was wrong with it.
        source: QuantityError,
    },
}

/// Kinds a CacheBackend may own through this module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum OwnedKind {
    /// `apps/v1` Deployment.
    Deployment,
    /// `apps/v1` StatefulSet.
    StatefulSet,
    /// `v1` Service.
    Service,
    /// `autoscaling/v2` HorizontalPodAutoscaler.
    HorizontalPodAutoscaler,
}

impl OwnedKind {
    /// Every kind, in shed-list order.
    pub const ALL: [OwnedKind; 4] = [
        Self::Deployment,
        Self::StatefulSet,
        Self::Service,
        Self::HorizontalPodAutoscaler,
    ];

    /// `apiVersion` of the kind.
    pub fn api_version(self) -> &'static str {
        match self {
            Self::Deployment | Self::StatefulSet => "apps/v1",
            Self::Service => "v1",
            Self::HorizontalPodAutoscaler => "autoscaling/v2",
        }
    }

    /// `kind` string.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Deployment => "Deployment",
            Self::StatefulSet => "StatefulSet",
            Self::Service => "Service",
            Self::HorizontalPodAutoscaler => "HorizontalPodAutoscaler",
        }
    }
}

/// An object in the backend's own namespace, by kind and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ObjectRef {
    /// Kind of the object.
    pub kind: OwnedKind,
    /// `metadata.name` (the namespace is the backend's).
    pub name: String,
}

/// The managed workload, whose kind follows `spec.deploymentKind`.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// `deploymentKind: Deployment`.
    Deployment(Deployment),
    /// `deploymentKind: StatefulSet`.
    StatefulSet(StatefulSet),
}

impl Workload {
    /// Kind of the workload.
    pub fn kind(&self) -> OwnedKind {
        match self {
            Self::Deployment(_) => OwnedKind::Deployment,
            Self::StatefulSet(_) => OwnedKind::StatefulSet,
        }
    }

    /// `metadata.name` of the workload.
    pub fn name(&self) -> &str {
        let meta = match self {
            Self::Deployment(d) => &d.metadata,
            Self::StatefulSet(s) => &s.metadata,
        };
        meta.name.as_deref().unwrap_or_default()
    }
}

/// Everything the controller applies for one managed provider.
#[derive(Clone, Debug, PartialEq)]
pub struct ManagedProvider {
    /// Which provider was rendered.
    pub provider: StorageProvider,
    /// The provider workload.
    pub workload: Workload,
    /// Its Service (headless for Mooncake); `status.endpoint` comes from it.
    pub service: Service,
    /// Present when `spec.autoscaling` is set (never for Mooncake). The
    /// workload then carries no `spec.replicas`, so SSA leaves it to the HPA.
    pub hpa: Option<HorizontalPodAutoscaler>,
}

impl ManagedProvider {
    /// The endpoint the rendered Service will publish (see
    /// [`service_endpoint`]); prefer the live Service once it exists.
    pub fn endpoint(&self) -> Option<String> {
        service_endpoint(&self.service)
    }

    /// Kind and name of every object in this set.
    pub fn refs(&self) -> Vec<ObjectRef> {
        let name = self.workload.name().to_owned();
        let mut refs = vec![
            ObjectRef {
                kind: self.workload.kind(),
                name: name.clone(),
            },
            ObjectRef {
                kind: OwnedKind::Service,
                name: name.clone(),
            },
        ];
        if self.hpa.is_some() {
            refs.push(ObjectRef {
                kind: OwnedKind::HorizontalPodAutoscaler,
                name,
            });
        }
        refs
    }
}

/// The result of [`render`]: what to apply and what to delete.
#[derive(Clone, Debug, PartialEq)]
pub struct ProviderObjects {
    /// The objects to server-side-apply; `None` when the backend's mode
    /// provisions nothing (host-only, External, EventsOnly, SGLangHiCache).
    pub managed: Option<ManagedProvider>,
    /// Objects this backend may have created in an earlier mode and must
    /// not keep now. Delete each one that exists and is controller-owned by
    /// this backend (a 404 is success). Sorted, never overlapping `managed`.
    pub shed: Vec<ObjectRef>,
}

/// Provider-specific parts handed to the common builders.
#[derive(Debug)]
struct Shape {
    container: Container,
    service_ports: Vec<ServicePort>,
    host_network: bool,
}

// === entry points ===

/// Renders everything the controller must own for `backend`.
///
/// Returns the workload (Deployment or StatefulSet per
/// `spec.deploymentKind`), its Service, an `autoscaling/v2` HPA when
/// `spec.autoscaling` is set, and the shed list. Objects carry the common
/// labels, the backend's namespace and a controller owner reference.
///
/// Errors: [`RenderError::MissingName`] always; `MissingNamespace`,
/// `MissingUid` and `InvalidQuantity` only when a workload is to be rendered
/// (a backend that provisions nothing still gets its shed list).
pub fn render(backend: &CacheBackend) -> Result<ProviderObjects, RenderError> {
    let name = backend
        .metadata
        .name
        .as_deref()
        .ok_or(RenderError::MissingName)?;
    let managed = match managed_provider(&backend.spec) {
        Some(provider) => Some(render_managed(backend, name, provider)?),
        None => None,
    };
    let desired = managed
        .as_ref()
        .map(ManagedProvider::refs)
        .unwrap_or_default();
    let shed = candidate_refs(name)
        .into_iter()
        .filter(|r| !desired.contains(r))
        .collect();
    Ok(ProviderObjects { managed, shed })
}

/// The provider this backend provisions, if any: only Offload mode, the
/// LMCache engine cache and Managed ownership provision a workload.
pub fn managed_provider(spec: &CacheBackendSpec) -> Option<StorageProvider> {
    if spec.integration_mode() != IntegrationMode::Offload || spec.r#type != CacheType::LMCache {
        return None;
    }
    spec.remote_storage
        .as_ref()
        .filter(|rs| rs.ownership == Ownership::Managed)
        .map(|rs| rs.provider)
}

/// Every object a backend with this name could own here, in any mode
/// (sorted) — the universe [`render`]'s shed list is drawn from.
pub fn owned_object_refs(backend: &CacheBackend) -> Result<Vec<ObjectRef>, RenderError> {
    let name = backend
        .metadata
        .name
        .as_deref()
        .ok_or(RenderError::MissingName)?;
    Ok(candidate_refs(name))
}

/// Deterministic object name for a backend's provider objects:
/// `<backend>-redis`, `<backend>-lmcache-server` or
/// `<backend>-mooncake-master`, shortened with a stable hash only when that
/// would not be a valid Service name (over 63 characters, dots, leading digit).
pub fn object_name(backend: &str, provider: StorageProvider) -> String {
    names::object_name(backend, component(provider))
}

/// Value of the `inferencecache.io/component` label for a provider.
pub fn component(provider: StorageProvider) -> &'static str {
    match provider {
        StorageProvider::Redis => "redis",
        StorageProvider::LMCacheServer => "lmcache-server",
        StorageProvider::Mooncake => "mooncake-master",
    }
}

/// The pod selector of a backend's provider workload (stable across
/// updates: `inferencecache.io/cachebackend` and `inferencecache.io/component`).
pub fn selector_labels(
    backend: &str,
    provider: StorageProvider,
) -> std::collections::BTreeMap<String, String> {
    common::selector_labels(backend, component(provider))
}

/// `status.endpoint` for a managed backend from its Service: the bare
/// `<service>.<namespace>.svc:<first port>` (RPC first for Mooncake). The
/// engine adapters add the scheme (`lm://`, `redis://`, `mooncakestore://`)
/// from the binding protocol. `None` when the Service lacks a name,
/// namespace or port.
pub fn service_endpoint(service: &Service) -> Option<String> {
    let name = service.metadata.name.as_deref()?;
    let namespace = service.metadata.namespace.as_deref()?;
    let port = service.spec.as_ref()?.ports.as_ref()?.first()?.port;
    Some(format!("{name}.{namespace}.svc:{port}"))
}

// === rendering ===

fn candidate_refs(backend: &str) -> Vec<ObjectRef> {
    let mut refs: Vec<ObjectRef> = [
        StorageProvider::Redis,
        StorageProvider::LMCacheServer,
        StorageProvider::Mooncake,
    ]
    .into_iter()
    .flat_map(|p| {
        let name = object_name(backend, p);
        OwnedKind::ALL.into_iter().map(move |kind| ObjectRef {
            kind,
            name: name.clone(),
        })
    })
    .collect();
    refs.sort();
    refs.dedup();
    refs
}

fn owner(backend: &CacheBackend, name: &str) -> Result<Owner, RenderError> {
    let namespace = backend
        .metadata
        .namespace
        .clone()
        .ok_or_else(|| RenderError::MissingNamespace(name.to_owned()))?;
    let uid = backend
        .metadata
        .uid
        .clone()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| RenderError::MissingUid(format!("{namespace}/{name}")))?;
    Ok(Owner {
        name: name.to_owned(),
        namespace,
        owner_ref: OwnerReference {
            api_version: format!("{}/{}", ic_api::consts::GROUP, ic_api::consts::VERSION),
            kind: "CacheBackend".to_owned(),
            name: name.to_owned(),
            uid,
            controller: Some(true),
            block_owner_deletion: Some(true),
        },
    })
}

fn render_managed(
    backend: &CacheBackend,
    name: &str,
    provider: StorageProvider,
) -> Result<ManagedProvider, RenderError> {
    let owner = owner(backend, name)?;
    let spec = &backend.spec;
    let rs = spec.remote_storage.as_ref();
    // Mooncake is a singleton: admission rejects autoscaling and replicas
    // above 1; the renderer enforces the same so a CR stored before those
    // rules can never start a second master.
    let singleton = provider == StorageProvider::Mooncake;
    let autoscaling = spec.autoscaling.as_ref().filter(|_| !singleton);
    let replicas = if singleton {
        spec.replicas.clamp(0, 1)
    } else {
        spec.replicas.max(0)
    };

    let shape = match provider {
        StorageProvider::Redis => {
            let typed = rs.and_then(|r| r.redis.as_ref());
            let field = "spec.remoteStorage.redis.resources";
            let res = common::effective_resources(
                typed.and_then(|r| r.resources.as_ref()),
                autoscaling.is_some(),
                field,
            )?;
            redis::shape(typed, res, field)?
        }
        StorageProvider::LMCacheServer => {
            let typed = rs.and_then(|r| r.lm_cache_server.as_ref());
            let res = common::effective_resources(
                typed.and_then(|r| r.resources.as_ref()),
                autoscaling.is_some(),
                "spec.remoteStorage.lmCacheServer.resources",
            )?;
            lmcache_server::shape(typed, res)
        }
        StorageProvider::Mooncake => {
            let typed = rs.and_then(|r| r.mooncake.as_ref());
            let res = common::effective_resources(
                typed.and_then(|r| r.resources.as_ref()),
                false,
                "spec.remoteStorage.mooncake.resources",
            )?;
            mooncake::shape(typed, res)
        }
    };

    let component = component(provider);
    let object = names::object_name(&owner.name, component);
    let labels = common::common_labels(&owner.name, component, &object);
    let mut pod = PodSpec::default();
    common::apply_overrides(&mut pod, spec.template.as_ref());
    if shape.host_network {
        pod.host_network = Some(true);
        pod.dns_policy = Some("ClusterFirstWithHostNet".to_owned());
    }
    let workload = common::workload(
        &owner,
        WorkloadParams {
            kind: spec.deployment_kind,
            name: &object,
            labels: &labels,
            selector: common::selector_labels(&owner.name, component),
            replicas: autoscaling.is_none().then_some(replicas),
            recreate: shape.host_network,
            service_name: &object,
        },
        shape.container,
        pod,
    );
    let service = common::service(
        &owner,
        &object,
        &labels,
        common::selector_labels(&owner.name, component),
        shape.service_ports,
        shape.host_network,
    );
    let hpa = autoscaling.map(|a| common::hpa(&owner, &object, &labels, &workload, a, replicas));
    Ok(ManagedProvider {
        provider,
        workload,
        service,
        hpa,
    })
}
