//! `CachePolicy`: per-namespace tuning of how LookupRoute and the endpoint
//! picker answer.
//!
//! The controller resolves the policy of each namespace (the oldest
//! CachePolicy in it wins; later ones are marked Superseded) and pushes it to
//! the index server, which applies it to every lookup whose tenant is that
//! namespace. A namespace without a CachePolicy gets the defaults below.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Routing policy for the namespace the object lives in.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "inferencecache.io",
    version = "v1alpha1",
    kind = "CachePolicy",
    plural = "cachepolicies",
    shortname = "cpol",
    category = "inferencecache",
    namespaced,
    status = "CachePolicyStatus",
    derive = "PartialEq",
    doc = "CachePolicy tunes cache-aware routing (LookupRoute) for the engines of its namespace.",
    printcolumn(
        name = "Timeout",
        type_ = "integer",
        json_path = ".spec.lookupTimeoutMs"
    ),
    printcolumn(
        name = "MinPrefix",
        type_ = "integer",
        json_path = ".spec.minimumPrefixTokens"
    ),
    printcolumn(
        name = "Active",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Active")].status"#
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CachePolicySpec {
    /// Latency budget of one lookup, in milliseconds. A lookup that cannot
    /// finish in time answers NO_HINT (LOOKUP_TIMEOUT) so the gateway routes
    /// by load instead of waiting.
    #[serde(default = "default_lookup_timeout_ms")]
    #[schemars(range(min = 1, max = 10000))]
    pub lookup_timeout_ms: i32,

    /// Matches shorter than this many tokens answer NO_HINT
    /// (BELOW_MINIMUM_PREFIX): a short shared prefix (a chat template header)
    /// is not worth giving up load balancing for.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub minimum_prefix_tokens: i32,

    /// Replicas whose subscriber has reported nothing (events or heartbeats)
    /// for this many seconds are left out of lookups, so a dead pod's cache is
    /// not advertised.
    #[serde(default = "default_replica_stale_after_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub replica_stale_after_seconds: i32,

    /// Whether a prefix held only in the offload tier (T2: evicted from HBM,
    /// kept by LMCache/HiCache) may be returned as a match. Disable when
    /// reloads are slower than recomputing on your hardware.
    #[serde(default = "default_true")]
    pub allow_tier2_matches: bool,

    /// Scoring weights and the load bound for this namespace's lookups and
    /// picks; each field left out keeps the index server's flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scoring: Option<ScoringSpec>,

    /// When the endpoint picker refuses this namespace's requests with 429,
    /// by their InferenceObjective's priority. When set, all three
    /// thresholds come from here (a field left out is 0: never); when
    /// unset, the index server's --epp-shed-*-at-requests flags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shedding: Option<SheddingSpec>,
}

/// How replicas are scored (docs/gateway-integration.md, "How a replica is
/// chosen").
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.loadBound) || double(self.loadBound) == 0.0 || double(self.loadBound) >= 1.0").message("loadBound must be 0 (unbounded) or at least 1"))]
pub struct ScoringSpec {
    /// Weight of the prefix match (the fraction of the prompt a replica
    /// holds); --score-prefix-weight when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub prefix_weight: Option<f64>,

    /// Weight of the replica's request load (normalised to the busiest);
    /// --score-load-weight when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub load_weight: Option<f64>,

    /// Weight of the engine's KV-cache usage (0..1); --score-kv-usage-weight
    /// when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub kv_usage_weight: Option<f64>,

    /// A replica above this multiple of its fair share of the load ranks
    /// after every replica within it: 0 (unbounded) or at least 1;
    /// --load-bound when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1000.0))]
    pub load_bound: Option<f64>,
}

/// Shedding thresholds: requests (picks in flight, or the engine's running
/// and waiting ones) on the least busy endpoint at which a request is
/// refused. Lower priorities must shed first.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!has(self.standardAtRequests) || self.standardAtRequests == 0 || (has(self.sheddableAtRequests) && self.sheddableAtRequests > 0 && self.sheddableAtRequests <= self.standardAtRequests)").message("standardAtRequests needs sheddableAtRequests set, and no larger: lower priorities shed first"))]
#[x_kube(validation = kube::core::Rule::new("!has(self.criticalAtRequests) || self.criticalAtRequests == 0 || (has(self.standardAtRequests) && self.standardAtRequests > 0 && self.standardAtRequests <= self.criticalAtRequests)").message("criticalAtRequests needs standardAtRequests set, and no larger: lower priorities shed first"))]
pub struct SheddingSpec {
    /// Sheddable requests (priority below 0); 0 never sheds them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub sheddable_at_requests: Option<i32>,

    /// Standard requests (priority 0, or no known objective); 0 never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub standard_at_requests: Option<i32>,

    /// Critical requests (priority above 0), refused last; 0 never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000000))]
    pub critical_at_requests: Option<i32>,
}

/// Default lookup budget.
pub const DEFAULT_LOOKUP_TIMEOUT_MS: i32 = 20;
/// Default replica staleness window.
pub const DEFAULT_REPLICA_STALE_AFTER_SECONDS: i32 = 120;

fn default_lookup_timeout_ms() -> i32 {
    DEFAULT_LOOKUP_TIMEOUT_MS
}
fn default_replica_stale_after_seconds() -> i32 {
    DEFAULT_REPLICA_STALE_AFTER_SECONDS
}
fn default_true() -> bool {
    true
}

impl Default for CachePolicySpec {
    fn default() -> Self {
        Self {
            lookup_timeout_ms: DEFAULT_LOOKUP_TIMEOUT_MS,
            minimum_prefix_tokens: 0,
            replica_stale_after_seconds: DEFAULT_REPLICA_STALE_AFTER_SECONDS,
            allow_tier2_matches: true,
            scoring: None,
            shedding: None,
        }
    }
}

/// Observed state of a CachePolicy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CachePolicyStatus {
    /// metadata.generation last pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the index server last accepted this policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pushed_at: Option<Time>,
    /// Active (this policy is the namespace's resolved policy) and Pushed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
