//! The index server's Prometheus metrics (prefixed `inferencecache_index_`).

use std::sync::Arc;
use std::time::Duration;

use ic_index::Index;
use ic_proto::index_v1 as pb;
use ic_telemetry::MetricsRegistry;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

const PREFIX_MATCH: LookupLabels = LookupLabels {
    outcome: "prefix_match",
    reason: "none",
};

/// Lookup outcome labels (fixed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LookupLabels {
    /// `prefix_match` or `no_hint`.
    pub outcome: &'static str,
    /// NO_HINT reason, or `none`.
    pub reason: &'static str,
}

/// Ingest result labels (fixed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `applied`, `invalid`, `resync_required`.
    pub result: &'static str,
}

/// Probe stage labels (fixed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// `ingest`, `routing`, `t2`.
    pub stage: &'static str,
    /// `ok`, `failed`, `skipped`.
    pub outcome: &'static str,
}

/// Which lookup bound refused a lookup (fixed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// `prompt_blocks`, `prompt_tokens` or `candidates`.
    pub limit: &'static str,
}

/// Probe refusal labels (fixed set).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: &'static str,
}

/// Access refusal labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AccessLabels {
    /// `ingest`, `lookup`, `pod_scores`, `set_policies`, `snapshot`.
    pub path: &'static str,
    /// `unauthenticated`, `permission_denied`, `unavailable`.
    pub reason: &'static str,
}

/// Every metric of the index server.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// TLS and idle-connection counters of the gRPC, endpoint-picker and
    /// HTTP ports.
    pub serving: ic_telemetry::serving::ServingMetrics,
    /// Lookups answered, by outcome and reason.
    pub lookups: Family<LookupLabels, Counter>,
    /// The `prefix_match` series of `lookups`, resolved once: most lookups
    /// count there, and the family's lookup costs a lock and a hash.
    prefix_matches: Counter,
    /// Lookups refused as invalid or unsupported.
    pub lookup_errors: Counter,
    /// Lookups refused by a size bound, by which.
    pub lookups_refused: Family<LimitLabel, Counter>,
    /// Requests and ingest batches over `--grpc-max-message-bytes`,
    /// refused by gRPC before any handler read them.
    pub grpc_messages_refused: Counter,
    /// Time to answer a lookup, seconds.
    pub lookup_duration: Histogram,
    /// Ingest batches, by result.
    pub ingest_batches: Family<ResultLabel, Counter>,
    /// Open ingest streams.
    pub ingest_streams: Gauge,
    /// Calls refused by access control, by path and reason.
    pub access_refusals: Family<AccessLabels, Counter>,
    /// Ingest streams ended or refused by a bound, by which (`streams`,
    /// `streams_per_client`, `idle`, `ranks_per_stream`,
    /// `stream_resync_bytes`, `resync_budget_bytes`).
    pub ingest_refused: Family<ReasonLabel, Counter>,
    /// Completed resyncs.
    pub resyncs: Counter,
    /// Resyncs readiness stopped waiting for (`--ready-resync-wait-seconds`).
    pub ready_resyncs_not_waited_for: Counter,
    /// Changes that contradicted the index (skipped).
    pub content_errors: Counter,
    /// Resident (replica, block) entries.
    pub entries: Gauge,
    /// The configured bound on resident entries (`--capacity-entries`), so
    /// "near capacity" is one ratio of two series.
    pub capacity_entries: Gauge,
    /// Functional-probe stages run, by stage and outcome.
    pub probe_stages: Family<StageLabels, Counter>,
    /// Probe requests refused (authentication or bad request), by reason.
    pub probe_refusals: Family<ReasonLabel, Counter>,
    /// Bearer tokens refused from the refusal cache, without a TokenReview.
    pub token_refusals_cached: Counter,
    /// Calls refused because the TokenReview rate was spent.
    pub token_reviews_throttled: Counter,
    /// Replicas forgotten because they fell silent.
    pub stale_replicas_removed: Counter,
    /// Speculative (block, replica) entries held.
    pub speculative_entries: Gauge,
    /// Speculative entries dropped to stay within --speculative-max-entries.
    pub speculative_dropped: Counter,
    /// Large scopes' shortlists of least loaded replicas rebuilt
    /// (--shortlist-refresh-ms / --shortlist-refresh-changes).
    pub shortlist_rebuilds: Counter,
    /// Endpoint-picker decisions, by what decided them (prefix, load).
    pub epp_picks: Family<HowLabel, Counter>,
    /// Endpoint-picker requests refused, by reason: `no_endpoint` (503),
    /// `saturated` (429, --epp-shed-at-requests).
    pub epp_refusals: Family<ReasonLabel, Counter>,
    /// Requests the picker could not read, by what failed (body,
    /// tokenize, too_large); they are still routed, by load.
    pub epp_unread: Family<ReasonLabel, Counter>,
    /// Bytes of request bodies the picker holds now (`--epp-max-held-body-bytes`).
    pub epp_held_body_bytes: Gauge,
    /// Time to decide a pick, tokenizing included.
    pub epp_decision_duration: Histogram,
    /// The same decision less its rendering and tokenizing.
    pub epp_decision_untokenized: Histogram,
    /// The same decision less reading the body too: from the request read
    /// to the pick, as `lookup_duration` runs from a LookupRoute decoded to
    /// its answer; what compares with a LookupRoute of the same tokens.
    pub epp_decision_from_read: Histogram,
    /// Time a pick handed to a blocking thread waited for one (left out
    /// of the decision's timers and its lookup's budget).
    pub epp_handoff_wait: Histogram,
    /// Picks with a text or chat prompt to render and tokenize, by the
    /// thread deciding them: `runtime` (the one that received the body,
    /// up to --epp-inline-tokenize-bytes) or `blocking` (handed over).
    pub epp_tokenizing: Family<ThreadLabel, Counter>,
    /// Responses whose usage and time to first byte recalibrated their
    /// endpoint's prefill rate (the TTFT estimate's).
    pub epp_prefill_rate_observations: Counter,
    /// llm-d GetPodScores calls, by outcome (scored, no_match, timeout,
    /// invalid, no_tokenizer).
    pub llmd_pod_scores: Family<OutcomeLabel, Counter>,
    /// Time to answer a GetPodScores call, tokenizing included.
    pub llmd_pod_scores_duration: Histogram,
}

/// How a call ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// A fixed word per call site.
    pub outcome: &'static str,
}

/// The kind of thread work ran on.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThreadLabel {
    /// `runtime` or `blocking`.
    pub thread: &'static str,
}

/// What decided a pick.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HowLabel {
    /// `prefix` (a replica held part of the prompt) or `load`.
    pub by: &'static str,
}

impl Metrics {
    /// Registers every metric.
    pub fn register(registry: &MetricsRegistry) -> Self {
        let m = Self {
            serving: ic_telemetry::serving::ServingMetrics::default(),
            lookups: Family::default(),
            prefix_matches: Counter::default(),
            lookup_errors: Counter::default(),
            lookups_refused: Family::default(),
            grpc_messages_refused: Counter::default(),
            // 1 µs .. ~16 s
            lookup_duration: Histogram::new(exponential_buckets(1e-6, 2.0, 24)),
            ingest_batches: Family::default(),
            ingest_streams: Gauge::default(),
            ingest_refused: Family::default(),
            access_refusals: Family::default(),
            resyncs: Counter::default(),
            ready_resyncs_not_waited_for: Counter::default(),
            content_errors: Counter::default(),
            entries: Gauge::default(),
            capacity_entries: Gauge::default(),
            probe_stages: Family::default(),
            probe_refusals: Family::default(),
            token_refusals_cached: Counter::default(),
            token_reviews_throttled: Counter::default(),
            stale_replicas_removed: Counter::default(),
            speculative_entries: Gauge::default(),
            speculative_dropped: Counter::default(),
            shortlist_rebuilds: Counter::default(),
            epp_picks: Family::default(),
            epp_refusals: Family::default(),
            epp_unread: Family::default(),
            epp_held_body_bytes: Gauge::default(),
            epp_decision_duration: Histogram::new(exponential_buckets(1e-6, 2.0, 24)),
            epp_decision_untokenized: Histogram::new(exponential_buckets(1e-6, 2.0, 24)),
            epp_decision_from_read: Histogram::new(exponential_buckets(1e-6, 2.0, 24)),
            epp_handoff_wait: Histogram::new(exponential_buckets(1e-6, 2.0, 24)),
            epp_tokenizing: Family::default(),
            epp_prefill_rate_observations: Counter::default(),
            llmd_pod_scores: Family::default(),
            llmd_pod_scores_duration: Histogram::new(exponential_buckets(1e-6, 2.0, 24)),
        };
        let serving = registry.register_with(|r| {
            ic_telemetry::serving::ServingMetrics::register(r.sub_registry_with_prefix("index"))
        });
        let prefix_matches = m.lookups.get_or_create(&PREFIX_MATCH).clone();
        let m = Self {
            serving,
            prefix_matches,
            ..m
        };
        registry.register_with(|r| {
            let r = r.sub_registry_with_prefix("index");
            r.register(
                "lookups",
                "Lookups answered, by outcome and reason",
                m.lookups.clone(),
            );
            r.register(
                "lookup_errors",
                "Lookups refused as invalid or unsupported",
                m.lookup_errors.clone(),
            );
            r.register(
                "lookups_refused",
                "Lookups refused by a size bound (--max-prompt-blocks, --max-prompt-tokens, --max-candidates, --max-prompt-text-bytes, --max-extra-entries, --max-extra-key-bytes), by which; also in lookup_errors",
                m.lookups_refused.clone(),
            );
            r.register(
                "grpc_messages_refused",
                "gRPC requests and ingest batches larger than --grpc-max-message-bytes, refused (OUT_OF_RANGE) before any handler read them",
                m.grpc_messages_refused.clone(),
            );
            r.register(
                "lookup_duration_seconds",
                "Time to answer a lookup",
                m.lookup_duration.clone(),
            );
            r.register(
                "ingest_batches",
                "Ingest batches, by result",
                m.ingest_batches.clone(),
            );
            r.register(
                "ingest_streams",
                "Open ingest streams",
                m.ingest_streams.clone(),
            );
            r.register(
                "access_refusals",
                "Calls refused by access control, by path and reason",
                m.access_refusals.clone(),
            );
            r.register(
                "ingest_refused",
                "Ingest streams ended or refused by a bound, by which",
                m.ingest_refused.clone(),
            );
            r.register("resyncs", "Completed replica resyncs", m.resyncs.clone());
            r.register(
                "ready_resyncs_not_waited_for",
                "Resyncs still under way after --ready-resync-wait-seconds, which readiness stopped waiting for",
                m.ready_resyncs_not_waited_for.clone(),
            );
            r.register(
                "content_errors",
                "Changes that contradicted the index",
                m.content_errors.clone(),
            );
            r.register(
                "entries",
                "Resident (replica, block) entries",
                m.entries.clone(),
            );
            r.register(
                "capacity_entries",
                "Most resident entries the index keeps (--capacity-entries)",
                m.capacity_entries.clone(),
            );
            r.register(
                "probe_stages",
                "Functional-probe stages run, by stage and outcome",
                m.probe_stages.clone(),
            );
            r.register(
                "probe_refusals",
                "Probe requests refused, by reason",
                m.probe_refusals.clone(),
            );
            r.register(
                "token_refusals_cached",
                "Bearer tokens refused again within --token-refusal-cache-seconds without asking the API server",
                m.token_refusals_cached.clone(),
            );
            r.register(
                "token_reviews_throttled",
                "Calls answered UNAVAILABLE because --token-reviews-per-second was spent on tokens neither cache knew",
                m.token_reviews_throttled.clone(),
            );
            r.register(
                "stale_replicas_removed",
                "Replicas forgotten after falling silent for longer than --replica-gc-after",
                m.stale_replicas_removed.clone(),
            );
            r.register(
                "speculative_entries",
                "Speculative (block, replica) holders: recent picks not yet confirmed by KV events",
                m.speculative_entries.clone(),
            );
            r.register(
                "speculative_dropped",
                "Speculative entries dropped to stay within --speculative-max-entries",
                m.speculative_dropped.clone(),
            );
            r.register(
                "shortlist_rebuilds",
                "Large scopes' shortlists of least loaded replicas rebuilt (--shortlist-refresh-ms, --shortlist-refresh-changes)",
                m.shortlist_rebuilds.clone(),
            );
            let e = r.sub_registry_with_prefix("epp");
            e.register(
                "picks",
                "Endpoint-picker decisions, by what decided them",
                m.epp_picks.clone(),
            );
            e.register(
                "refusals",
                "Requests refused by the gateway, by reason: no_endpoint (503), saturated (429)",
                m.epp_refusals.clone(),
            );
            e.register(
                "unread",
                "Requests routed by load because the picker could not read them, by reason",
                m.epp_unread.clone(),
            );
            e.register(
                "held_body_bytes",
                "Bytes of request bodies the picker holds now, across its streams (bounded by --epp-max-held-body-bytes)",
                m.epp_held_body_bytes.clone(),
            );
            e.register(
                "decision_duration_seconds",
                "Time to pick an endpoint, tokenizing included",
                m.epp_decision_duration.clone(),
            );
            e.register(
                "decision_without_tokenizing_seconds",
                "Time to pick an endpoint less rendering and tokenizing the prompt",
                m.epp_decision_untokenized.clone(),
            );
            e.register(
                "decision_without_reading_or_tokenizing_seconds",
                "Time to pick an endpoint less reading the request body, rendering and tokenizing the prompt",
                m.epp_decision_from_read.clone(),
            );
            e.register(
                "handoff_wait_seconds",
                "Time a pick handed to a blocking thread (to render and tokenize the prompt, or read a large body) waited for one; not in the decision's timers",
                m.epp_handoff_wait.clone(),
            );
            e.register(
                "tokenizing",
                "Picks with a text or chat prompt to render and tokenize, by the thread deciding them: runtime (the one that received the body, up to --epp-inline-tokenize-bytes) or blocking (handed over)",
                m.epp_tokenizing.clone(),
            );
            e.register(
                "prefill_rate_observations",
                "Responses whose usage and time to first byte recalibrated their endpoint's prefill rate",
                m.epp_prefill_rate_observations.clone(),
            );
            let l = r.sub_registry_with_prefix("llmd");
            l.register(
                "pod_scores",
                "llm-d GetPodScores calls, by outcome",
                m.llmd_pod_scores.clone(),
            );
            l.register(
                "pod_scores_duration_seconds",
                "Time to answer a GetPodScores call, tokenizing included",
                m.llmd_pod_scores_duration.clone(),
            );
        });
        m
    }

    /// Counts one answered lookup.
    pub fn record_lookup(&self, response: &pb::LookupRouteResponse, took: Duration) {
        if response.outcome == pb::LookupOutcome::PrefixMatch as i32 {
            self.prefix_matches.inc();
        } else {
            let reason = match pb::NoHintReason::try_from(response.no_hint_reason) {
                Ok(pb::NoHintReason::NoEntry) => "no_entry",
                Ok(pb::NoHintReason::BelowMinimumPrefix) => "below_minimum_prefix",
                Ok(pb::NoHintReason::LookupTimeout) => "lookup_timeout",
                Ok(pb::NoHintReason::UnknownModel) => "unknown_model",
                Ok(pb::NoHintReason::PromptTooShort) => "prompt_too_short",
                Ok(pb::NoHintReason::LoadBound) => "load_bound",
                _ => "unspecified",
            };
            self.lookups
                .get_or_create(&LookupLabels {
                    outcome: "no_hint",
                    reason,
                })
                .inc();
        }
        self.lookup_duration.observe(took.as_secs_f64());
    }

    /// Counts one endpoint-picker decision that took `took`, of which
    /// `tokenizing` rendering and tokenizing the prompt and `reading`
    /// reading the request body.
    pub fn epp_decided(
        &self,
        by: &'static str,
        took: Duration,
        tokenizing: Duration,
        reading: Duration,
    ) {
        self.epp_picks.get_or_create(&HowLabel { by }).inc();
        self.epp_decision_duration.observe(took.as_secs_f64());
        let untokenized = took.saturating_sub(tokenizing);
        self.epp_decision_untokenized
            .observe(untokenized.as_secs_f64());
        self.epp_decision_from_read
            .observe(untokenized.saturating_sub(reading).as_secs_f64());
    }

    /// Counts the wait of a pick handed to a blocking thread.
    pub fn epp_handoff_waited(&self, wait: Duration) {
        self.epp_handoff_wait.observe(wait.as_secs_f64());
    }

    /// Counts a pick with a prompt to render and tokenize, decided on
    /// `thread` (`runtime` or `blocking`).
    pub fn epp_tokenizing_on(&self, thread: &'static str) {
        self.epp_tokenizing
            .get_or_create(&ThreadLabel { thread })
            .inc();
    }

    /// Counts a request the picker could not read.
    pub fn epp_unread(&self, reason: &'static str) {
        self.epp_unread.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// Counts one GetPodScores call.
    pub fn llmd_scored(&self, outcome: &'static str, took: Duration) {
        self.llmd_pod_scores
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
        self.llmd_pod_scores_duration.observe(took.as_secs_f64());
    }

    /// Counts a refusal (503 `no_endpoint`, 429 `saturated`).
    pub fn epp_refused(&self, reason: &'static str) {
        self.epp_refusals
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    /// Counts a call access control refused.
    pub fn access_refused(&self, path: &'static str, denied: &crate::access::Denied) {
        self.access_refusals
            .get_or_create(&AccessLabels {
                path,
                reason: denied.reason(),
            })
            .inc();
        tracing::info!(path, reason = denied.reason(), %denied, "call refused");
    }

    /// Counts a lookup a size bound refused.
    pub fn lookup_refused(&self, limit: &'static str) {
        self.lookups_refused
            .get_or_create(&LimitLabel { limit })
            .inc();
    }

    /// Counts a stream a bound refused or ended.
    pub fn ingest_refused(&self, limit: &'static str) {
        self.ingest_refused
            .get_or_create(&ReasonLabel { reason: limit })
            .inc();
    }

    /// Counts an ingest batch by result.
    pub fn ingest_batch(&self, result: &'static str) {
        self.ingest_batches
            .get_or_create(&ResultLabel { result })
            .inc();
    }

    /// Refreshes the size gauges.
    pub fn set_index_size(&self, index: &Index) {
        self.entries
            .set(i64::try_from(index.len()).unwrap_or(i64::MAX));
    }
}

/// Reports, when `/metrics` is scraped, the index's heap bytes by part
/// (`inferencecache_index_memory_bytes{part=…}`; counting walks every record
/// page, so it runs per scrape rather than per ingest batch) and the
/// index's own monotonic totals as counters (`…_capacity_evictions_total`,
/// `…_clock_evictions_total`,
/// `…_records_relocated_total`, `…_first_filter_rebuilds_total`), read where they are kept rather than
/// copied into gauges.
#[derive(Debug)]
pub struct IndexMemoryCollector(pub Arc<Index>);

impl IndexMemoryCollector {
    /// Registers a collector for `index`.
    pub fn register(registry: &MetricsRegistry, index: Arc<Index>) {
        registry.register_with(|r| {
            r.sub_registry_with_prefix("index")
                .register_collector(Box::new(Self(index)));
        });
    }
}

impl Collector for IndexMemoryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let memory = self.0.memory();
        let gauge = |bytes: u64| ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
        let mut family = encoder.encode_descriptor(
            "memory_bytes",
            "Heap bytes held by the index: record pages, key tables and replica bookkeeping",
            None,
            MetricType::Gauge,
        )?;
        for (part, bytes) in [
            ("records", memory.records),
            ("key_tables", memory.key_tables),
            ("replicas", memory.replicas),
        ] {
            gauge(bytes).encode(family.encode_family(&[("part", part)])?)?;
        }
        let overflow = encoder.encode_descriptor(
            "key_table_overflow_keys",
            "Keys that found no room in their key-table buckets (read from per-table overflow slots; more than a few means the tables are too small)",
            None,
            MetricType::Gauge,
        )?;
        gauge(self.0.key_table_overflow_keys()).encode(overflow)?;
        let filter = encoder.encode_descriptor(
            "first_filter_bytes",
            "Heap bytes of the first-block filter, derived from --capacity-entries at start (half a bit per record, 512 B to 1 MiB); also counted in memory_bytes{part=\"key_tables\"}",
            None,
            MetricType::Gauge,
        )?;
        gauge(self.0.first_filter_bytes()).encode(filter)?;
        let (replicas, scopes) = self.0.known();
        let (max_replicas, max_scopes) = self.0.bounds();
        for (name, help, value) in [
            (
                "replicas_known",
                "Replicas (tenant, replica id, data-parallel rank) the index knows now; a batch of one past --max-replicas is refused",
                replicas,
            ),
            (
                "max_replicas",
                "The bound on replicas known at once (--max-replicas)",
                u64::from(max_replicas),
            ),
            (
                "scopes_known",
                "Scopes (tenant, model, hash scheme, adapter) the index keeps, for good; a batch naming one past --max-scopes is refused",
                scopes,
            ),
            (
                "max_scopes",
                "The bound on scopes kept (--max-scopes)",
                u64::from(max_scopes),
            ),
        ] {
            let descriptor = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            gauge(value).encode(descriptor)?;
        }
        for (name, help, total) in [
            (
                "capacity_evictions",
                "Entries evicted by the capacity bound",
                self.0.capacity_evictions(),
            ),
            (
                "clock_evictions",
                "Entries retired by the store clock: not stored again within 64 capacities of stores, however empty the index",
                self.0.clock_evictions(),
            ),
            (
                "records_relocated",
                "Records moved by compaction of sparse pages",
                self.0.records_relocated(),
            ),
            (
                "first_filter_rebuilds",
                "Rebuilds of the first-block filter completed (each a pass over the record pages, a few pages per ingest batch)",
                self.0.first_filter_rebuilds(),
            ),
            (
                "chains_out_of_space",
                "Chains not stored, from the run that failed onward, because the record space was exhausted",
                self.0.chains_out_of_space(),
            ),
        ] {
            let counter = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(total).encode(counter)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ic_index::IndexConfig;

    #[test]
    fn index_totals_are_exported_as_counters() {
        let registry = MetricsRegistry::new("inferencecache", "test");
        IndexMemoryCollector::register(&registry, Arc::new(Index::new(IndexConfig::default())));
        let text = registry.encode();
        for line in [
            "# TYPE inferencecache_index_capacity_evictions counter",
            "inferencecache_index_capacity_evictions_total 0",
            "# TYPE inferencecache_index_clock_evictions counter",
            "inferencecache_index_clock_evictions_total 0",
            "# TYPE inferencecache_index_records_relocated counter",
            "inferencecache_index_records_relocated_total 0",
            "# TYPE inferencecache_index_chains_out_of_space counter",
            "inferencecache_index_chains_out_of_space_total 0",
            "# TYPE inferencecache_index_key_table_overflow_keys gauge",
            "inferencecache_index_key_table_overflow_keys 0",
            "# TYPE inferencecache_index_first_filter_rebuilds counter",
            "inferencecache_index_first_filter_rebuilds_total 0",
            "# TYPE inferencecache_index_first_filter_bytes gauge",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }
}
