//! `CacheBackend`: how a set of engine pods is wired to an engine-side cache,
//! an optional remote tier, and the KV-event observation that feeds routing.
//!
//! The schema here is the first line of admission: enums are closed and
//! case-sensitive, bounds and defaults are in the CRD, and the few cross-field
//! rules that belong to the schema are CEL. Everything that needs context
//! (the adapter registry, the namespace, the previous object) lives in the
//! validating webhook.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, EnvVar, LocalObjectReference, PodSecurityContext, ResourceRequirements, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Desired state of a CacheBackend.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "inferencecache.io",
    version = "v1alpha1",
    kind = "CacheBackend",
    plural = "cachebackends",
    shortname = "cb",
    category = "inferencecache",
    namespaced,
    status = "CacheBackendStatus",
    derive = "PartialEq",
    doc = "CacheBackend wires matching engine pods to an engine-side KV cache (LMCache or SGLang HiCache), an optional remote storage tier, and KV-event observation for cache-aware routing.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(name = "Endpoint", type_ = "string", json_path = ".status.endpoint"),
    printcolumn(
        name = "Matched",
        type_ = "integer",
        json_path = ".status.matchedEnginePods"
    ),
    printcolumn(
        name = "Prefixes",
        type_ = "integer",
        json_path = ".status.indexParticipation.prefixCount"
    ),
    printcolumn(
        name = "LastEvent",
        type_ = "date",
        json_path = ".status.indexParticipation.lastEventAt"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CacheBackendSpec {
    /// Inference runtime of the engine pods this backend wires. Case-sensitive.
    pub runtime: Runtime,

    /// Engine-side cache implementation. Remote technology and ownership are
    /// chosen under remoteStorage, never here.
    #[serde(default = "default_cache_type")]
    pub r#type: CacheType,

    /// Typed LMCache engine configuration (chunk size, host-memory budget,
    /// MP-worker image and port, remote serializer). Only valid with type LMCache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lm_cache: Option<LmCacheSpec>,

    /// Typed SGLang native HiCache configuration. Required for type SGLangHiCache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hi_cache: Option<HiCacheSpec>,

    /// Optional remote storage tier. Omitted means host-only: no provider
    /// workload is provisioned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_storage: Option<RemoteStorageSpec>,

    /// KV-event observation: the model identity the subscriber reports and the
    /// first-event readiness window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<ObservationSpec>,

    /// Kind of the managed provider workload.
    #[serde(default = "default_deployment_kind")]
    pub deployment_kind: DeploymentKind,

    /// Desired replicas of the managed provider workload. Ignored for External
    /// ownership; when autoscaling is set the HPA owns the live count.
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 0))]
    pub replicas: i32,

    /// Horizontal autoscaling of the managed provider workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,

    /// How engine pods participate. Materialised by the defaulting webhook so
    /// its nested defaults are visible on the stored object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integration: Option<IntegrationSpec>,

    /// Engine pods this backend wires: every label here must be on the pod
    /// template. An empty selector matches nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_selector: Option<EngineSelector>,

    /// Pod-level scheduling overrides for managed provider pods. Containers
    /// always come from the provider adapter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplateOverrides>,

    /// Allow remoteStorage.endpoint to name a Service in another namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_cross_namespace: Option<bool>,
}

fn default_cache_type() -> CacheType {
    CacheType::LMCache
}
fn default_deployment_kind() -> DeploymentKind {
    DeploymentKind::Deployment
}
fn default_replicas() -> i32 {
    1
}

/// Inference runtime.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Runtime {
    /// vLLM.
    #[serde(rename = "VLLM")]
    Vllm,
    /// SGLang.
    #[serde(rename = "SGLang")]
    SGLang,
}

/// Engine-side cache implementation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum CacheType {
    /// LMCache connector (vLLM) or LMCache MP worker (SGLang).
    LMCache,
    /// SGLang's native hierarchical cache.
    SGLangHiCache,
}

/// Kind of managed provider workload.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum DeploymentKind {
    /// An apps/v1 Deployment.
    Deployment,
    /// An apps/v1 StatefulSet.
    StatefulSet,
}

// === lmCache ===

/// Typed LMCache engine configuration. Unset fields take the adapter's
/// defaults (chunk 256 tokens, 4Gi host memory, worker port 5555).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LmCacheSpec {
    /// Tokens per LMCache chunk (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub chunk_size_tokens: Option<i32>,

    /// Host-memory (L1) budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_memory: Option<HostMemorySpec>,

    /// Loopback ZMQ port between the SGLang engine and its MP worker (default 5555).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub worker_port: Option<i32>,

    /// MP-worker image; defaults to the engine container's image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_image: Option<String>,

    /// Serializer for KV sent to the remote tier (default naive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_serde: Option<RemoteSerde>,
}

/// LMCache host-memory tier.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostMemorySpec {
    /// Host-memory budget, a positive quantity (default 4Gi); rendered as whole GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
}

/// LMCache remote serializer.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RemoteSerde {
    /// Raw tensors.
    Naive,
    /// CacheGen compression.
    Cachegen,
}

// === hiCache ===

/// SGLang native HiCache. Exactly one of ratio and sizeGB.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.ratio) != has(self.sizeGB)").message("exactly one of ratio and sizeGB must be set"))]
pub struct HiCacheSpec {
    /// Host cache size as a multiple of the device cache: a finite number
    /// greater than zero, written as a string (e.g. "2.0").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"))]
    pub ratio: Option<String>,

    /// Host cache size in GB, a positive integer.
    #[serde(default, rename = "sizeGB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub size_gb: Option<i64>,

    /// `--hicache-write-policy`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_policy: Option<HiCacheWritePolicy>,

    /// `--hicache-io-backend`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub io_backend: Option<HiCacheIoBackend>,

    /// `--hicache-mem-layout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_layout: Option<HiCacheMemoryLayout>,
}

/// HiCache write policy (SGLang CLI values).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HiCacheWritePolicy {
    /// `write_back`.
    WriteBack,
    /// `write_through`.
    WriteThrough,
    /// `write_through_selective`.
    WriteThroughSelective,
}

/// HiCache I/O backend (SGLang CLI values).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HiCacheIoBackend {
    /// `direct`.
    Direct,
    /// `kernel`.
    Kernel,
    /// `kernel_ascend`.
    KernelAscend,
}

/// HiCache memory layout (SGLang CLI values).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HiCacheMemoryLayout {
    /// `layer_first`.
    LayerFirst,
    /// `page_first`.
    PageFirst,
    /// `page_first_direct`.
    PageFirstDirect,
    /// `page_first_kv_split`.
    PageFirstKvSplit,
    /// `page_head`.
    PageHead,
}

// === remoteStorage ===

/// Optional remote tier: which technology, who owns its lifecycle, and the
/// provider's workload settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoteStorageSpec {
    /// Remote storage technology.
    pub provider: StorageProvider,

    /// Managed: the controller provisions the provider. External: the
    /// operator runs it and supplies endpoint.
    pub ownership: Ownership,

    /// Endpoint of an External provider (required there, rejected for
    /// Managed). host:port always works; LMCacheServer also takes
    /// lm://host:port and Mooncake mooncakestore://host:port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// Managed Redis workload settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisSpec>,

    /// Managed standalone LMCache server workload settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lm_cache_server: Option<LmCacheServerSpec>,

    /// Managed Mooncake master workload settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mooncake: Option<MooncakeSpec>,
}

/// Remote storage technology.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum StorageProvider {
    /// Redis (RESP).
    Redis,
    /// Standalone LMCache server (lm://).
    LMCacheServer,
    /// Mooncake store (mooncakestore://).
    Mooncake,
}

/// Who runs the provider.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum Ownership {
    /// The controller provisions and owns the provider workload.
    Managed,
    /// The operator runs the provider; the CR names its endpoint.
    External,
}

/// Managed Redis settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisSpec {
    /// Redis image (default a pinned redis release, never :latest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Container resources; the memory limit also sizes --maxmemory (~80%).
    /// Omitted: 4Gi request / 8Gi limit. `{}`: no defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Managed standalone LMCache server settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LmCacheServerSpec {
    /// Server image (default lmcache/standalone pinned to a tested release).
    /// Keep it wire-compatible with the engine's LMCache client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Server command and arguments (default: the image's LMCache server on port 65432).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Container resources. Omitted: 4Gi request / 8Gi limit. `{}`: no defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Managed Mooncake master settings. The master runs on the host network.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MooncakeSpec {
    /// Master image (default a pinned, fully qualified mooncake release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Master command and arguments. Do not move the RPC (50051) or HTTP
    /// metadata (8080) ports: the Service, probes and status use them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Container resources. Omitted: 4Gi request / 8Gi limit. `{}`: no defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

// === observation ===

/// KV-event observation settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservationSpec {
    /// Model identity the kvevent-subscriber reports (its --model-id).
    /// Without it no subscriber is injected.
    #[serde(default, rename = "modelID", skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub model_id: Option<String>,

    /// How long after the backend is up to wait for the first KV event before
    /// reporting Degraded/NoKVEventsObserved (a Go duration, e.g. 5m).
    #[serde(default = "default_first_event_timeout")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$"))]
    pub first_event_timeout: String,
}

/// The first-event window when none is given.
pub const DEFAULT_FIRST_EVENT_TIMEOUT: &str = "5m";

fn default_first_event_timeout() -> String {
    DEFAULT_FIRST_EVENT_TIMEOUT.to_owned()
}

// === autoscaling ===

/// HPA bounds for the managed provider workload.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.minReplicas) || self.minReplicas <= self.maxReplicas").message("minReplicas must be less than or equal to maxReplicas"))]
pub struct AutoscalingSpec {
    /// Lower bound. Defaulted to spec.replicas on first apply only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_replicas: Option<i32>,

    /// Upper bound.
    #[schemars(range(min = 1))]
    pub max_replicas: i32,

    /// Target average CPU utilisation per pod, percent (80 when unset).
    #[serde(
        default,
        rename = "targetCPUUtilizationPercent",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1, max = 100))]
    pub target_cpu_utilization_percent: Option<i32>,
}

// === integration ===

/// How engine pods participate in the cache plane.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IntegrationSpec {
    /// Offload: routing plus the KV-offload connector. EventsOnly: routing only.
    #[serde(default = "default_mode")]
    pub mode: IntegrationMode,

    /// Engine participation (vLLM kv_role). SGLang supports ReadWrite only.
    #[serde(default = "default_role")]
    pub role: IntegrationRole,

    /// Fall back to local prefill when the cache is unreachable. false makes
    /// the cache a serving dependency (advanced; announced with a Warning Event).
    #[serde(default = "default_true")]
    pub fail_open: bool,

    /// Amendments to the args/env the webhook injects into the engine
    /// container. Known-fragile: values are passed to the engine unchecked
    /// beyond the reserved set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_overrides: Option<EngineOverrides>,

    /// Move engine pods onto the host network (Mooncake only; required for
    /// its transfer mesh). Applies to pods admitted after it is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_host_network: Option<bool>,
}

fn default_mode() -> IntegrationMode {
    IntegrationMode::Offload
}
fn default_role() -> IntegrationRole {
    IntegrationRole::ReadWrite
}
fn default_true() -> bool {
    true
}

impl Default for IntegrationSpec {
    fn default() -> Self {
        Self {
            mode: default_mode(),
            role: default_role(),
            fail_open: true,
            engine_overrides: None,
            engine_host_network: None,
        }
    }
}

/// Which tiers the engine is wired for.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum IntegrationMode {
    /// Cache-aware routing (T1) plus KV offload (T2).
    Offload,
    /// Cache-aware routing only: no connector, no provider.
    EventsOnly,
}

/// Engine participation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum IntegrationRole {
    /// Retrieve only (kv_consumer).
    ReadOnly,
    /// Store only (kv_producer).
    WriteOnly,
    /// Store and retrieve (kv_both).
    ReadWrite,
}

/// Engine-injection overrides, scoped to what the adapter owns.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineOverrides {
    /// Args for the engine container. An entry whose leading flag matches an
    /// adapter-injected arg replaces it; a new flag is appended; a flag the
    /// user's template owns is left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Leading flags the adapter must not inject.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suppress_args: Vec<String>,
    /// Env upserted by name over adapter-injected entries; user-owned env is protected.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Env names the adapter must not inject.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub suppress_env: Vec<String>,
}

// === engineSelector / template ===

/// Equality-based selector over engine pod template labels.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineSelector {
    /// Labels that must all be present on the pod. Empty matches nothing.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
}

/// Pod-level overrides merged into managed provider pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodTemplateOverrides {
    /// Node labels the provider pods must be scheduled on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Scheduling affinity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Taints the provider pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Spread constraints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_spread_constraints: Option<Vec<TopologySpreadConstraint>>,
    /// Pull secrets for the provider image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,
    /// Service account of the provider pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_name: Option<String>,
    /// Pod security context.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
    /// Priority class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Scheduler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// Runtime class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// Grace period on termination, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub termination_grace_period_seconds: Option<i64>,
}

// === status ===

/// Observed state of a CacheBackend.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheBackendStatus {
    /// Endpoint clients use: the External endpoint mirrored, or the managed
    /// Service's address. Empty for host-only and events-only backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,

    /// Pods in the namespace matching engineSelector at the last reconcile.
    /// Unset when not computed or when no non-empty selector is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_engine_pods: Option<i32>,

    /// Why no engine pod matches, when pods are expected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_selector_message: Option<String>,

    /// Echo of the effective spec.integration.failOpen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_open: Option<bool>,

    /// This backend's slice of the cluster index (written by the CacheIndex poller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_participation: Option<IndexParticipation>,

    /// Write-once: when a KV event was first observed for this backend.
    #[serde(
        default,
        rename = "firstKVEventObservedAt",
        skip_serializing_if = "Option::is_none"
    )]
    pub first_kv_event_observed_at: Option<Time>,

    /// Anchor of the firstEventTimeout window (first Available, or first
    /// reconcile for events-only); re-anchored on a mode change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_available_at: Option<Time>,

    /// Cascade baseline: `<pod-uid>:<restart-sum>` per Ready cache-server pod,
    /// comma-joined, sorted by pod name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_server_instance: Option<String>,

    /// metadata.generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// The mode the controller last reconciled this backend in (Managed,
    /// External, HostOnly, EventsOnly, HiCache, Unsupported). A restarted
    /// controller compares it with the spec, so a mode change made while it
    /// was down still re-anchors the KV-event gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_mode: Option<String>,

    /// Ready, Degraded, Progressing and the advisory conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Per-backend projection of the index server's /snapshot.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IndexParticipation {
    /// Distinct prefix entries attributed to this backend's replicas; 0 is a
    /// real observation and is always serialized.
    #[serde(default)]
    pub prefix_count: i64,
    /// Latest KV-event time of any of this backend's replicas. Unset means
    /// not observed (never epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event_at: Option<Time>,
    /// Reserved: backend-level hit rate is not aggregated yet, so always unset.
    /// Unset never means 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_rate: Option<String>,
    /// Query-weighted tier-2 reload hit rate in [0,1]. Unset: tier 2 never
    /// queried. "0": queried, never hit (a silently broken offload tier).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t2_hit_rate: Option<String>,
    /// Replicas whose subscriber could not recover the engine's early
    /// history (CacheIndex `replicas[].historyIncomplete`): they are
    /// credited with fewer blocks than they hold until their cache turns
    /// over. Absent means 0 (the spec's drained shape stays
    /// `{prefixCount: 0}`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_incomplete_replicas: i64,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if signature
fn is_zero(n: &i64) -> bool {
    *n == 0
}

impl CacheBackendSpec {
    /// The effective integration settings (schema defaults when the object
    /// bypassed the defaulting webhook).
    pub fn integration_or_default(&self) -> IntegrationSpec {
        self.integration.clone().unwrap_or_default()
    }

    /// Effective fail-open: unset reads as true.
    pub fn fail_open(&self) -> bool {
        self.integration.as_ref().is_none_or(|i| i.fail_open)
    }

    /// Effective integration mode: unset reads as Offload.
    pub fn integration_mode(&self) -> IntegrationMode {
        self.integration
            .as_ref()
            .map_or(IntegrationMode::Offload, |i| i.mode)
    }
}
