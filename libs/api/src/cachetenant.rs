//! `CacheTenant`: a namespace's identity on the LMCache fleet coordinator.
//!
//! A tenant is a namespace (the same tenant the index keys on). On the
//! coordinator a tenant is a `cache_salt`: the salt its engines mix into every
//! LMCache key, which is also the unit of the fleet L2 quota and of pins. The
//! controller pushes the quota and pins here to the coordinator. There is
//! deliberately no per-tenant byte budget on shared engines: it could not be
//! enforced there, and memory would be double-counted across tenants.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Tenant settings pushed to the coordinator.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "inferencecache.io",
    version = "v1alpha1",
    kind = "CacheTenant",
    plural = "cachetenants",
    shortname = "ctn",
    category = "inferencecache",
    namespaced,
    status = "CacheTenantStatus",
    derive = "PartialEq",
    doc = "CacheTenant maps the namespace's tenant to its LMCache cache_salt, fleet L2 quota and pinned prefixes on the coordinator.",
    printcolumn(name = "Salt", type_ = "string", json_path = ".spec.cacheSalt"),
    printcolumn(name = "L2Limit", type_ = "string", json_path = ".spec.quota.l2Limit"),
    printcolumn(
        name = "Synced",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Synced")].status"#
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CacheTenantSpec {
    /// The LMCache cache_salt this tenant's engines use. Empty is the shared
    /// default salt.
    #[schemars(length(max = 253))]
    pub cache_salt: String,

    /// Fleet-wide L2 quota for the salt on the coordinator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<TenantQuota>,

    /// Prefixes the coordinator must never evict from L2 for this salt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub pins: Vec<TenantPin>,
}

/// L2 quota for a cache_salt. Above the limit the coordinator's eviction
/// controller deletes the least recently used unpinned keys.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantQuota {
    /// L2 bytes the salt may hold fleet-wide. 0 evicts everything unpinned.
    pub l2_limit: Quantity,
}

/// A pinned prefix: the token ids of a prompt prefix (a system prompt, a
/// shared document) for one model.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantPin {
    /// Model name as the MP servers report it.
    #[schemars(length(min = 1))]
    pub model_name: String,
    /// Tensor-parallel world size of the engines serving the model.
    #[schemars(range(min = 1))]
    pub world_size: i32,
    /// Token ids of the prefix; only whole LMCache chunks are pinned.
    #[schemars(length(min = 1, max = 131072))]
    pub token_ids: Vec<u32>,
}

/// Observed state of a CacheTenant.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheTenantStatus {
    /// metadata.generation last pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Chunks pinned on the coordinator for this tenant's pins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_chunks: Option<i64>,
    /// When the coordinator last accepted the quota and pins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synced_at: Option<Time>,
    /// Synced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
