//! `CacheIndex`: the cluster-wide view of the prefix index.
//!
//! Cluster-scoped. Its spec says where the index server is; its status is
//! written by the controller's poller from the server's `/snapshot`: one row
//! per reporting replica and one per tenant.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where the index server is and how often to read it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "inferencecache.io",
    version = "v1alpha1",
    kind = "CacheIndex",
    plural = "cacheindexes",
    shortname = "cidx",
    category = "inferencecache",
    status = "CacheIndexStatus",
    derive = "PartialEq",
    doc = "CacheIndex is the cluster-aggregate view of the prefix index: which replicas report, how much each holds, per tenant.",
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.replicaCount"
    ),
    printcolumn(
        name = "Prefixes",
        type_ = "integer",
        json_path = ".status.prefixCount"
    ),
    printcolumn(
        name = "LastScrape",
        type_ = "date",
        json_path = ".status.lastScrapeAt"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CacheIndexSpec {
    /// HTTP base URL of the index server (serves /snapshot and /probe),
    /// e.g. http://inferencecache-index-server.inferencecache-system:8081.
    #[serde(rename = "serverURL")]
    #[schemars(regex(pattern = r"^https?://[^\s/]+(/[^\s]*)?$"))]
    pub server_url: String,

    /// gRPC address gateways use for LookupRoute, published for discovery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_address: Option<String>,

    /// Seconds between /snapshot scrapes.
    #[serde(default = "default_poll_interval_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub poll_interval_seconds: i32,
}

fn default_poll_interval_seconds() -> i32 {
    15
}

/// Observed cluster-wide index state.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheIndexStatus {
    /// Replicas in the last successful snapshot.
    #[serde(default)]
    pub replica_count: i32,
    /// Prefix entries over all replicas in the last successful snapshot.
    #[serde(default)]
    pub prefix_count: i64,
    /// One row per reporting replica.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<ReplicaIndexStatus>,
    /// One row per tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantIndexStatus>,
    /// Last successful scrape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scrape_at: Option<Time>,
    /// metadata.generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Available (the last scrape succeeded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// One engine replica as the index sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaIndexStatus {
    /// Tenant (engine pod namespace).
    pub tenant: String,
    /// Replica id (engine pod name).
    pub replica_id: String,
    /// Engine serving address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Model the replica serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Fingerprint domain (vllm or sglang).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash_scheme: Option<String>,
    /// Prefix entries held.
    #[serde(default)]
    pub prefix_count: i64,
    /// Latest KV event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event_at: Option<Time>,
    /// Engine KV memory attributed to the replica, bytes (engine total; honest
    /// at replica level, unlike per-tenant sums).
    #[serde(default)]
    pub cache_memory_bytes: i64,
    /// Whether the replica reports hit-rate statistics at all.
    #[serde(default)]
    pub hit_rate_reported: bool,
    /// The subscriber started after the engine's replay buffer had rolled
    /// over: blocks stored before are not in the index (the replica is
    /// credited with less than it holds until its cache turns over).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub history_incomplete: bool,
}

/// One tenant's share of the index.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantIndexStatus {
    /// Tenant (namespace).
    pub tenant: String,
    /// Replicas reporting for the tenant.
    #[serde(default)]
    pub replica_count: i32,
    /// Prefix entries over the tenant's replicas.
    #[serde(default)]
    pub prefix_count: i64,
    /// Deprecated, always 0: summing memory per tenant double-counts shared
    /// engines. Use replicas[].cacheMemoryBytes. Removed at v1beta1.
    #[serde(default)]
    pub memory_used: i64,
    /// Whether any of the tenant's replicas reports hit-rate statistics.
    #[serde(default)]
    pub hit_rate_reported: bool,
}
