//! Metrics under the reference's `lmcache_coordinator` names.
//!
//! Labels come only from fixed sets, plus `instance_id` for per-instance
//! gauges (rebuilt on every scrape, so a departed instance disappears) and
//! `cache_salt` for tenants with a quota. No cache key or hash is a label.
//! Counts that describe the views are read on scrape from counters the views
//! keep up to date, never by walking an index.

use std::sync::atomic::AtomicU64;

use ic_telemetry::MetricsRegistry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// `tier` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabel {
    /// `l1` or `l2`.
    pub tier: &'static str,
}

/// `outcome` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// Fixed per metric (`applied`, `duplicate`, `stale`; `ok`, `failed`, ...).
    pub outcome: &'static str,
}

/// `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why a key was skipped.
    pub reason: &'static str,
}

/// Which request bound refused a request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// `body_bytes`, `tokens_per_request` or `keys_per_request`.
    pub limit: &'static str,
}

/// `consumer` label (a view or a controller name).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumerLabel {
    /// Component name.
    pub consumer: &'static str,
}

/// `controller` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabel {
    /// Controller name.
    pub controller: &'static str,
}

/// `loop` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LoopLabel {
    /// `health`, `checkpoint`, `eviction`.
    pub r#loop: &'static str,
}

/// `instance_id` label (per-instance gauges only).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InstanceLabel {
    /// Registered instance.
    pub instance_id: String,
}

/// `cache_salt` label (tenants with a quota only).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SaltLabel {
    /// Tenant.
    pub cache_salt: String,
}

/// `result` label of Kafka records.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `applied`, `duplicate`, `stale`, `malformed`, `already_consumed`.
    pub result: &'static str,
}

/// `kind` label of Kafka failures.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `metadata`, `assign`, `watermarks`, `consume`.
    pub kind: &'static str,
}

/// `partition` label: partitions of the one configured topic, a small
/// fixed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PartitionLabel {
    /// Partition id.
    pub partition: i32,
}

/// MP-server call labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MpCallLabels {
    /// `delete`, `evict`, `prefetch_submit`, `prefetch_status`.
    pub op: &'static str,
    /// `ok`, `timeout` (`--mp-timeout-seconds`) or `failed`.
    pub outcome: &'static str,
}

/// Served-request labels; `route` is the matched route template, so the
/// set is fixed by the router.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// HTTP method (`other` for unusual ones).
    pub method: &'static str,
    /// Route template, e.g. `/instances/{instance_id}/heartbeat`
    /// (borrowed for the busy routes: no allocation per request).
    pub route: std::borrow::Cow<'static, str>,
    /// Status class: `2xx`, `4xx`, `5xx`, ...
    pub status: &'static str,
}

/// Route label of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    /// Route template.
    pub route: std::borrow::Cow<'static, str>,
}

type FGauge = Gauge<f64, AtomicU64>;
type Hist = Family<RouteLabel, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 0.1 ms .. ~3.3 s.
    Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
}

/// Every coordinator metric.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// HTTP connections closed after `--timeout-keep-alive` without
    /// traffic (house extension).
    pub idle_connections_closed: prometheus_client::metrics::counter::Counter,
    /// HTTP connections cut because a request's headers took longer than
    /// `--header-read-timeout-seconds` (house extension).
    pub header_read_timeouts: prometheus_client::metrics::counter::Counter,
    /// Operator requests refused by access control (house extension).
    pub access_refusals: Family<ReasonLabel, prometheus_client::metrics::counter::Counter>,
    /// Operator requests answered 503 because `--token-reviews-per-second`
    /// was spent (house extension).
    pub token_reviews_throttled: prometheus_client::metrics::counter::Counter,
    /// Directory placements per tier.
    pub placements: Family<TierLabel, Gauge>,
    /// Directory bytes per tier.
    pub placement_bytes: Family<TierLabel, Gauge>,
    /// Keys in the directory.
    pub directory_keys: Gauge,
    /// Keys dropped to stay within `--max-directory-keys`, since start.
    pub directory_keys_dropped: Gauge,
    /// The configured `--max-directory-keys` (0: unbounded).
    pub directory_max_keys: Gauge,
    /// Event batches by gate outcome.
    pub event_batches: Family<OutcomeLabel, Counter>,
    /// Sequence gaps seen.
    pub event_gaps: Counter,
    /// Restarts fenced.
    pub event_fences: Counter,
    /// Events emitters reported dropping.
    pub event_dropped: Counter,
    /// `POST /events` requests rejected as invalid.
    pub event_requests_rejected: Counter,
    /// `POST /events` requests that found the writer's queue full
    /// (`--max-pending-event-requests`) and waited for room.
    pub event_queue_full: Counter,
    /// Consumers that failed to apply a batch (views disagree).
    pub consumer_failures: Family<ConsumerLabel, Counter>,
    /// Registered instances.
    pub instances: Gauge,
    /// Instances removed by the liveness sweep.
    pub instances_expired: Counter,
    /// Seconds since each instance's last heartbeat.
    pub heartbeat_age: Family<InstanceLabel, FGauge>,
    /// L1 keys per instance.
    pub instance_l1_keys: Family<InstanceLabel, Gauge>,
    /// 1 while a controller is enabled and started.
    pub controller_up: Family<ControllerLabel, Gauge>,
    /// Wall time a loop last finished a pass.
    pub loop_last_pass: Family<LoopLabel, FGauge>,
    /// Eviction sweeps.
    pub eviction_sweeps: Counter,
    /// Keys selected for eviction.
    pub eviction_selected: Counter,
    /// Keys passed over, by reason.
    pub eviction_skipped: Family<ReasonLabel, Counter>,
    /// L2 bytes per tenant with a quota.
    pub quota_used_bytes: Family<SaltLabel, Gauge>,
    /// Limit per tenant with a quota.
    pub quota_limit_bytes: Family<SaltLabel, Gauge>,
    /// Pinned keys.
    pub pinned_keys: Gauge,
    /// Prefetch requests, by outcome.
    pub prefetch_requests: Family<OutcomeLabel, Counter>,
    /// Keys found by completed prefetches.
    pub prefetch_found_keys: Counter,
    /// Keys requested by completed prefetches.
    pub prefetch_total_keys: Counter,
    /// Calls to MP servers.
    pub mp_calls: Family<MpCallLabels, Counter>,
    /// Checkpoint writes by outcome.
    pub checkpoint_writes: Family<OutcomeLabel, Counter>,
    /// Wall time of the last successful checkpoint.
    pub checkpoint_last_success: FGauge,
    /// Metadata writes by outcome.
    pub metadata_writes: Family<OutcomeLabel, Counter>,
    /// Kafka records consumed, by result.
    pub kafka_records: Family<ResultLabel, Counter>,
    /// Records between the consumed position and the high watermark.
    pub kafka_lag: Family<PartitionLabel, Gauge>,
    /// Last consumed offset per partition.
    pub kafka_last_offset: Family<PartitionLabel, Gauge>,
    /// Failed broker calls, by kind.
    pub kafka_errors: Family<KindLabel, Counter>,
    /// 1 while the last broker call succeeded.
    pub kafka_connected: Gauge,
    /// 1 once the consumer caught up within `--max-ready-lag`.
    pub kafka_caught_up: Gauge,
    legacy_placements: Family<TierLabel, Gauge>,
    legacy_bytes: Family<TierLabel, Gauge>,
    /// Event entries refused for what they claim, by reason.
    pub event_entries_refused: Family<ReasonLabel, Counter>,
    /// Requests refused by a size bound, by which.
    pub requests_refused: Family<LimitLabel, Counter>,
    /// Event batches received and waiting to be applied (the reference's
    /// event-bus queue; here requests wait for the views lock).
    pub event_queue_depth: Gauge,
    /// Seconds the oldest waiting batch has waited; 0 when none waits.
    pub event_drain_lag: FGauge,
    /// Worker threads of the async runtime serving HTTP
    /// (`--worker-threads`, or one per core).
    pub runtime_workers: Gauge,
    /// mimalloc's purge delay in effect, ms (-1: freed pages are kept;
    /// `--allocator-purge-delay-ms`).
    pub allocator_purge_delay_ms: Gauge,
}

/// The registries `/metrics` renders: ours (`lmcache_coordinator_`), the
/// legacy `lmcache_mp_` names, and the house build-info registry.
#[derive(Debug)]
pub struct MetricsSet {
    /// The metric handles.
    pub metrics: Metrics,
    /// Served requests by method, route and status class.
    pub http_requests: Family<HttpLabels, Counter>,
    /// Time to answer, by route.
    pub http_duration: Hist,
    house: MetricsRegistry,
    ours: Registry,
    legacy: Registry,
    root: Registry,
}

impl MetricsSet {
    /// Records one served request: its time, and its count by method, route
    /// and status class; a 413 (a body past `--max-body-bytes`) is also a
    /// request refused by a bound.
    pub fn served(
        &self,
        method: &'static str,
        route: std::borrow::Cow<'static, str>,
        status: u16,
        elapsed: std::time::Duration,
    ) {
        if status == 413 {
            self.metrics
                .requests_refused
                .get_or_create(&LimitLabel {
                    limit: "body_bytes",
                })
                .inc();
        }
        let class = match status {
            100..=199 => "1xx",
            200..=299 => "2xx",
            300..=399 => "3xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.http_duration
            .get_or_create(&RouteLabel {
                route: route.clone(),
            })
            .observe(elapsed.as_secs_f64());
        self.http_requests
            .get_or_create(&HttpLabels {
                method,
                route,
                status: class,
            })
            .inc();
    }

    /// A token request `resolve` refused, as the 400 it answers; a request
    /// bound passed is counted in `requests_refused_total`.
    pub fn request_refused(&self, e: &ic_coordinator_core::KeyError) -> crate::error::ApiError {
        if let Some(limit) = e.limit() {
            self.metrics
                .requests_refused
                .get_or_create(&LimitLabel { limit })
                .inc();
        }
        crate::error::ApiError::BadRequest(e.to_string())
    }

    /// Registers everything.
    pub fn new(house: MetricsRegistry) -> Self {
        let m = Metrics::default();
        let mut r = Registry::with_prefix("lmcache_coordinator");
        r.register(
            "idle_connections_closed",
            "HTTP connections closed after --timeout-keep-alive seconds without traffic",
            m.idle_connections_closed.clone(),
        );
        r.register(
            "header_read_timeouts",
            "HTTP connections closed because a request's headers took longer than --header-read-timeout-seconds",
            m.header_read_timeouts.clone(),
        );
        r.register(
            "access_refusals",
            "Operator requests (quotas, pins, delete, prefetch) refused by --api-audience or --api-static-token",
            m.access_refusals.clone(),
        );
        r.register(
            "token_reviews_throttled",
            "Operator requests answered 503 because --token-reviews-per-second was spent on tokens neither cache knew",
            m.token_reviews_throttled.clone(),
        );
        r.register(
            "key_directory_placements",
            // The reference's help, word for word (the crate adds the period).
            "Placements recorded in the key directory, by tier. A placement is one place a key is stored: L1 on one server, or one L2 backend",
            m.placements.clone(),
        );
        r.register(
            "key_directory_placement_bytes",
            "Reported logical bytes of the placements recorded in the key directory, by tier",
            m.placement_bytes.clone(),
        );
        r.register(
            "key_directory_keys",
            "Keys in the key directory",
            m.directory_keys.clone(),
        );
        r.register(
            "key_directory_keys_dropped",
            "Keys dropped since start to stay within --max-directory-keys",
            m.directory_keys_dropped.clone(),
        );
        r.register(
            "key_directory_max_keys",
            "The configured --max-directory-keys (0: unbounded)",
            m.directory_max_keys.clone(),
        );
        r.register(
            "events_batches",
            "Event batches offered to the gate, by outcome",
            m.event_batches.clone(),
        );
        r.register(
            "events_gaps",
            "Sequence gaps detected by the gate",
            m.event_gaps.clone(),
        );
        r.register(
            "events_fences",
            "Instance restarts fenced by the gate",
            m.event_fences.clone(),
        );
        r.register(
            "events_dropped_events",
            "Events emitters reported dropping",
            m.event_dropped.clone(),
        );
        r.register(
            "events_rejected_requests",
            "POST /events requests rejected by validation",
            m.event_requests_rejected.clone(),
        );
        r.register(
            "events_queue_full",
            "POST /events requests that found the event writer's queue full (--max-pending-event-requests) and waited",
            m.event_queue_full.clone(),
        );
        r.register(
            "consumer_apply_failures",
            "Batches a view or controller failed to apply",
            m.consumer_failures.clone(),
        );
        r.register(
            "registry_instances",
            "Registered instances",
            m.instances.clone(),
        );
        r.register(
            "registry_expired_instances",
            "Instances removed by the liveness sweep",
            m.instances_expired.clone(),
        );
        r.register(
            "registry_heartbeat_age_seconds",
            "Seconds since the instance's last heartbeat",
            m.heartbeat_age.clone(),
        );
        r.register(
            "key_directory_instance_l1_keys",
            "L1 keys reported by the instance",
            m.instance_l1_keys.clone(),
        );
        r.register(
            "controller_up",
            "1 while the controller is enabled and running",
            m.controller_up.clone(),
        );
        r.register(
            "loop_last_pass_timestamp_seconds",
            "Wall time the loop last finished a pass",
            m.loop_last_pass.clone(),
        );
        r.register(
            "eviction_sweeps",
            "Eviction sweeps run",
            m.eviction_sweeps.clone(),
        );
        r.register(
            "eviction_keys_selected",
            "Keys selected for eviction",
            m.eviction_selected.clone(),
        );
        r.register(
            "eviction_keys_skipped",
            "Keys eviction passed over, by reason",
            m.eviction_skipped.clone(),
        );
        r.register(
            "quota_used_bytes",
            "L2 bytes of a tenant with a quota",
            m.quota_used_bytes.clone(),
        );
        r.register(
            "quota_limit_bytes",
            "L2 quota of a tenant",
            m.quota_limit_bytes.clone(),
        );
        r.register("pins_keys", "Pinned keys", m.pinned_keys.clone());
        r.register(
            "prefetch_requests",
            "Prefetch submissions, by outcome",
            m.prefetch_requests.clone(),
        );
        r.register(
            "prefetch_found_keys",
            "Keys found by completed prefetches",
            m.prefetch_found_keys.clone(),
        );
        r.register(
            "prefetch_total_keys",
            "Keys requested by completed prefetches",
            m.prefetch_total_keys.clone(),
        );
        r.register(
            "mp_requests",
            "Calls to MP servers, by operation and outcome",
            m.mp_calls.clone(),
        );
        r.register(
            "checkpoint_writes",
            "Checkpoint writes, by outcome",
            m.checkpoint_writes.clone(),
        );
        r.register(
            "checkpoint_last_success_timestamp_seconds",
            "Wall time of the last successful checkpoint",
            m.checkpoint_last_success.clone(),
        );
        r.register(
            "metadata_writes",
            "Metadata file writes, by outcome",
            m.metadata_writes.clone(),
        );
        r.register(
            "kafka_records",
            "Kafka records consumed, by result",
            m.kafka_records.clone(),
        );
        r.register(
            "kafka_consumer_lag_records",
            "Records between the consumed position and the high watermark, per partition",
            m.kafka_lag.clone(),
        );
        r.register(
            "kafka_last_offset",
            "Last consumed Kafka offset, per partition",
            m.kafka_last_offset.clone(),
        );
        r.register(
            "kafka_errors",
            "Failed Kafka broker calls, by kind",
            m.kafka_errors.clone(),
        );
        r.register(
            "kafka_connected",
            "1 while the last Kafka broker call succeeded",
            m.kafka_connected.clone(),
        );
        r.register(
            "kafka_caught_up",
            "1 once the Kafka consumer caught up within --max-ready-lag",
            m.kafka_caught_up.clone(),
        );
        r.register(
            "requests_refused",
            "Requests refused by a size bound, by which: body_bytes (--max-body-bytes, 413), tokens_per_request, keys_per_request (400)",
            m.requests_refused.clone(),
        );
        r.register(
            "event_entries_refused",
            "Event entries refused for claiming more than --max-event-entry-bytes or the declared capacity, by reason",
            m.event_entries_refused.clone(),
        );
        r.register(
            "runtime_workers",
            "Worker threads of the async runtime serving HTTP (--worker-threads, or one per core)",
            m.runtime_workers.clone(),
        );
        r.register(
            "allocator_purge_delay_ms",
            "Milliseconds a page the allocator freed stays mapped before it goes back to the OS; -1: kept, resident memory stays at its peak (--allocator-purge-delay-ms)",
            m.allocator_purge_delay_ms.clone(),
        );
        let http_requests = Family::<HttpLabels, Counter>::default();
        let http_duration: Hist = Family::new_with_constructor(latency_histogram);
        r.register(
            "http_requests",
            "Requests served, by method, route and status class",
            http_requests.clone(),
        );
        r.register(
            "http_request_duration_seconds",
            "Time to answer a request, by route",
            http_duration.clone(),
        );
        let mut legacy = Registry::with_prefix("lmcache_mp");
        legacy.register(
            "key_directory_placement_count",
            "Deprecated: use lmcache_coordinator.key_directory.placements",
            m.legacy_placements.clone(),
        );
        legacy.register(
            "key_directory_placement_size_bytes",
            "Deprecated: use lmcache_coordinator.key_directory.placement_bytes",
            m.legacy_bytes.clone(),
        );
        legacy.register(
            "event_bus_queue_depth",
            "Event batches received and not yet applied (waiting for the views)",
            m.event_queue_depth.clone(),
        );
        legacy.register(
            "event_bus_drain_lag_seconds",
            "Seconds the oldest batch not yet applied has waited; 0 when none waits",
            m.event_drain_lag.clone(),
        );
        let mut root = Registry::default();
        root.register(
            "target",
            "Target metadata",
            prometheus_client::metrics::info::Info::new(target_labels()),
        );
        Self {
            metrics: m,
            http_requests,
            http_duration,
            house,
            ours: r,
            legacy,
            root,
        }
    }

    /// Sets the directory gauges of one tier (both names).
    pub fn set_tier(&self, tier: &'static str, count: u64, bytes: u64) {
        let count = i64::try_from(count).unwrap_or(i64::MAX);
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        let label = TierLabel { tier };
        self.metrics.placements.get_or_create(&label).set(count);
        self.metrics
            .placement_bytes
            .get_or_create(&label)
            .set(bytes);
        self.metrics
            .legacy_placements
            .get_or_create(&label)
            .set(count);
        self.metrics.legacy_bytes.get_or_create(&label).set(bytes);
    }

    /// Renders every registry as one OpenMetrics document.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for part in [
            self.house.encode(),
            encode_one(&self.root),
            encode_one(&self.ours),
            encode_one(&self.legacy),
        ] {
            out.push_str(part.trim_end().trim_end_matches("# EOF").trim_end());
            out.push('\n');
        }
        out.push_str("# EOF\n");
        out
    }
}

/// `target_info`'s labels, as OpenTelemetry's Prometheus exporter writes
/// the resource (the reference's `service_name` is `lmcache-mp-coordinator`).
fn target_labels() -> Vec<(String, String)> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    vec![
        ("service_instance_id".to_owned(), host),
        ("service_name".to_owned(), crate::BINARY.to_owned()),
        (
            "service_version".to_owned(),
            env!("CARGO_PKG_VERSION").to_owned(),
        ),
        ("telemetry_sdk_language".to_owned(), "rust".to_owned()),
        (
            "telemetry_sdk_name".to_owned(),
            "prometheus-client".to_owned(),
        ),
    ]
}

/// Rewrites an OpenMetrics exposition into the Prometheus text format the
/// reference serves (`text/plain`): counter families take their `_total`
/// name in `# HELP`/`# TYPE`, info families become gauges named `_info`,
/// `# UNIT` and `# EOF` go. Without this a text-format parser sees every
/// counter's samples as untyped and without help.
pub fn prometheus_text(openmetrics: &str) -> String {
    let mut types = std::collections::HashMap::new();
    for line in openmetrics.lines() {
        if let Some((name, kind)) = line.strip_prefix("# TYPE ").and_then(|r| r.split_once(' ')) {
            types.insert(name, kind);
        }
    }
    let renamed = |name: &str| -> (String, &'static str) {
        match types.get(name).copied() {
            Some("counter") if name.ends_with("_total") => (name.to_owned(), "counter"),
            Some("counter") => (format!("{name}_total"), "counter"),
            Some("info") => (format!("{name}_info"), "gauge"),
            Some("gauge") => (name.to_owned(), "gauge"),
            Some("histogram" | "gaugehistogram") => (name.to_owned(), "histogram"),
            Some("summary") => (name.to_owned(), "summary"),
            Some("stateset") => (name.to_owned(), "gauge"),
            _ => (name.to_owned(), "untyped"),
        }
    };
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            out.push_str(&format!("# HELP {} {help}\n", renamed(name).0));
        } else if let Some((name, _)) = line.strip_prefix("# TYPE ").and_then(|r| r.split_once(' '))
        {
            let (name, kind) = renamed(name);
            out.push_str(&format!("# TYPE {name} {kind}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn encode_one(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, registry);
    out
}

/// Shorthand for a counter increment on an outcome family.
pub fn inc(family: &Family<OutcomeLabel, Counter>, outcome: &'static str) {
    family.get_or_create(&OutcomeLabel { outcome }).inc();
}
