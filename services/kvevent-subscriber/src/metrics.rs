//! The subscriber's Prometheus metrics (all prefixed `inferencecache_subscriber_`).

use ic_kvevents::ApplyStats;

use crate::tier2::Tier2Counters;
use ic_telemetry::MetricsRegistry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// A `reason` label from a fixed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: &'static str,
}

/// An event `kind` label from a fixed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// stored, removed, cleared, unknown.
    pub kind: &'static str,
}

/// An `adapter` label: a LoRA adapter's name (bounded by --max-adapters).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdapterLabel {
    /// The adapter.
    pub adapter: String,
}

/// A DP `rank` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RankLabel {
    /// The rank.
    pub rank: u32,
}

/// How an engine restart was noticed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabel {
    /// `sequence` (it went backwards), `reconnect` (the engine's
    /// connection dropped and the engine answering is a new incarnation)
    /// or `jump` (a far forward jump confirmed by the next frame).
    pub signal: &'static str,
}

/// Every metric the subscriber exports.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Messages received from the engine (valid or not).
    pub batches_received: Counter,
    /// Batches decoded.
    pub batches_decoded: Counter,
    /// Messages or batches that could not be used, by reason.
    pub batches_failed: Family<ReasonLabel, Counter>,
    /// Events decoded, by kind.
    pub events: Family<KindLabel, Counter>,
    /// Events rejected inside otherwise good batches, by reason.
    pub events_rejected: Family<ReasonLabel, Counter>,
    /// Sequence gaps detected.
    pub seq_gaps: Counter,
    /// Duplicate batches ignored.
    pub duplicate_batches: Counter,
    /// Batches recovered from the engine's replay buffer.
    pub replayed_batches: Counter,
    /// Replay requests that failed or timed out.
    pub replay_failures: Counter,
    /// Batches lost for good (gap not covered by replay).
    pub lost_batches: Counter,
    /// Engine restarts detected, by any signal.
    pub engine_resets: Counter,
    /// Engine restarts by the signal that revealed them.
    pub engine_restarts: Family<SignalLabel, Counter>,
    /// Batches at the start of an engine's stream that no replay could
    /// deliver any more (before this subscriber's view began).
    pub unreplayable_batches: Counter,
    /// 1 while a rank's view misses such batches (blocks stored in them are
    /// absent from the index until the engine's cache turns over).
    pub history_incomplete: Family<RankLabel, Gauge>,
    /// Incomplete histories completed by the engine's cache turning over.
    pub history_turnovers: Counter,
    /// Index changes waiting to be forwarded.
    pub queue_depth: Gauge,
    /// Index changes dropped because the queue was full (recovered by resync).
    pub queue_dropped: Counter,
    /// Destinations that fell so far behind that the queue dropped their
    /// backlog: each resyncs instead, alone.
    pub forward_overflow_resyncs: Counter,
    /// Index-server replicas (or topics) the changes currently go to.
    pub forward_destinations: Gauge,
    /// Failed look-ups of the index servers' addresses (the last set is
    /// kept).
    pub discovery_failures: Counter,
    /// Connections (re)established to the index server.
    pub forward_connects: Counter,
    /// Failed connection attempts or broken streams.
    pub forward_errors: Counter,
    /// Full resyncs sent.
    pub resyncs: Counter,
    /// Batches sent to the index server.
    pub forwarded_batches: Counter,
    /// Unix time of the last engine event.
    pub last_event_timestamp_seconds: Gauge,
    /// Blocks currently tracked.
    pub tracked_blocks: Gauge,
    /// Stored blocks skipped because their parent was unknown.
    pub unresolved_parent_blocks: Counter,
    /// Stores without tokens whose hash was unknown.
    pub contentless_unknown_blocks: Counter,
    /// Removes of blocks never seen.
    pub unknown_removals: Counter,
    /// Duplicate stores and removes absorbed by refcounting.
    pub duplicate_blocks: Counter,
    /// Events of non-main-attention KV cache groups.
    pub non_main_attention_events: Counter,
    /// Stores whose token count did not match blocks × block size.
    pub token_count_mismatches: Counter,
    /// T2 blocks dropped to respect the per-replica block bound.
    pub capacity_evictions: Counter,
    /// Engine metrics scrapes that failed.
    pub tier2_scrape_failures: Counter,
    /// LoRA-adapter blocks not indexed: more adapters than --max-adapters.
    pub adapter_blocks_skipped: Counter,
    /// Blocks held per LoRA adapter.
    pub adapter_blocks: Family<AdapterLabel, Gauge>,
    /// Stores whose extra keys did not have one entry per block.
    pub extra_keys_mismatches: Counter,
    /// Blocks withdrawn from the index because a block before them left.
    pub unrooted_blocks: Counter,
    /// The engine's tier-2 (external prefix cache) queries, mirrored from
    /// its own counter so a per-pod alert can see a tier that stopped hitting.
    pub tier2_queries: Counter,
    /// The engine's tier-2 hits, mirrored likewise.
    pub tier2_hits: Counter,
}

impl Metrics {
    /// `rank`'s incomplete history completed after a cache turnover.
    pub fn history_completed(&self, rank: u32) {
        // The gauge first: whoever sees the count sees the flag cleared.
        self.history_incomplete
            .get_or_create(&RankLabel { rank })
            .set(0);
        self.history_turnovers.inc();
        tracing::info!(
            rank,
            "the engine's cache turned over; history complete again"
        );
    }

    /// Registers every metric.
    pub fn register(registry: &MetricsRegistry) -> Self {
        let m = Self::default();
        registry.register_with(|r| m.register_into(r));
        m
    }

    fn register_into(&self, r: &mut Registry) {
        let r = r.sub_registry_with_prefix("subscriber");
        r.register(
            "batches_received",
            "Messages received from the engine",
            self.batches_received.clone(),
        );
        r.register(
            "batches_decoded",
            "Batches decoded",
            self.batches_decoded.clone(),
        );
        r.register(
            "batches_failed",
            "Messages or batches rejected, by reason",
            self.batches_failed.clone(),
        );
        r.register("events", "Events decoded, by kind", self.events.clone());
        r.register(
            "events_rejected",
            "Events rejected, by reason",
            self.events_rejected.clone(),
        );
        r.register("seq_gaps", "Sequence gaps detected", self.seq_gaps.clone());
        r.register(
            "duplicate_batches",
            "Duplicate batches ignored",
            self.duplicate_batches.clone(),
        );
        r.register(
            "replayed_batches",
            "Batches recovered by replay",
            self.replayed_batches.clone(),
        );
        r.register(
            "replay_failures",
            "Replay requests that failed",
            self.replay_failures.clone(),
        );
        r.register(
            "lost_batches",
            "Batches lost for good",
            self.lost_batches.clone(),
        );
        r.register(
            "engine_resets",
            "Engine restarts detected",
            self.engine_resets.clone(),
        );
        r.register(
            "engine_restarts",
            "Engine restarts detected, by signal (sequence went backwards, or the engine reconnected as a new incarnation)",
            self.engine_restarts.clone(),
        );
        r.register(
            "unreplayable_batches",
            "Batches at the start of the engine's stream that no replay could deliver (before this subscriber's view began)",
            self.unreplayable_batches.clone(),
        );
        r.register(
            "history_incomplete",
            "1 while a rank's view misses batches nobody can deliver any more",
            self.history_incomplete.clone(),
        );
        r.register(
            "history_turnovers",
            "Incomplete histories counted complete again after the engine's cache turned over",
            self.history_turnovers.clone(),
        );
        r.register(
            "queue_depth",
            "Index changes waiting to be forwarded",
            self.queue_depth.clone(),
        );
        r.register(
            "queue_dropped",
            "Index changes dropped on a full queue",
            self.queue_dropped.clone(),
        );
        r.register(
            "forward_overflow_resyncs",
            "Destinations whose backlog overflowed the queue and resynced instead",
            self.forward_overflow_resyncs.clone(),
        );
        r.register(
            "forward_destinations",
            "Index-server replicas or topics the changes go to",
            self.forward_destinations.clone(),
        );
        r.register(
            "discovery_failures",
            "Failed look-ups of the index servers' addresses",
            self.discovery_failures.clone(),
        );
        r.register(
            "forward_connects",
            "Connections to the index server",
            self.forward_connects.clone(),
        );
        r.register(
            "forward_errors",
            "Connection failures and broken streams",
            self.forward_errors.clone(),
        );
        r.register("resyncs", "Full resyncs sent", self.resyncs.clone());
        r.register(
            "forwarded_batches",
            "Batches sent to the index server",
            self.forwarded_batches.clone(),
        );
        r.register(
            "last_event_timestamp_seconds",
            "Unix time of the last engine event",
            self.last_event_timestamp_seconds.clone(),
        );
        r.register(
            "tracked_blocks",
            "Blocks currently tracked",
            self.tracked_blocks.clone(),
        );
        r.register(
            "unresolved_parent_blocks",
            "Stored blocks skipped for an unknown parent",
            self.unresolved_parent_blocks.clone(),
        );
        r.register(
            "contentless_unknown_blocks",
            "Stores without tokens of unknown hashes",
            self.contentless_unknown_blocks.clone(),
        );
        r.register(
            "unknown_removals",
            "Removes of unknown blocks",
            self.unknown_removals.clone(),
        );
        r.register(
            "duplicate_blocks",
            "Duplicate stores and removes",
            self.duplicate_blocks.clone(),
        );
        r.register(
            "non_main_attention_events",
            "Events of non-main-attention groups",
            self.non_main_attention_events.clone(),
        );
        r.register(
            "token_count_mismatches",
            "Stores with a wrong token count",
            self.token_count_mismatches.clone(),
        );
        r.register(
            "capacity_evictions",
            "T2 blocks dropped by the block bound",
            self.capacity_evictions.clone(),
        );
        r.register(
            "tier2_scrape_failures",
            "Engine metrics scrapes that failed",
            self.tier2_scrape_failures.clone(),
        );
        r.register(
            "adapter_blocks_skipped",
            "LoRA-adapter blocks not indexed because --max-adapters other adapters hold blocks",
            self.adapter_blocks_skipped.clone(),
        );
        r.register(
            "adapter_blocks",
            "Blocks held per LoRA adapter (indexed in the adapter's fingerprint domain)",
            self.adapter_blocks.clone(),
        );
        r.register(
            "extra_keys_mismatches",
            "Stores whose extra_keys do not have one entry per block",
            self.extra_keys_mismatches.clone(),
        );
        r.register(
            "unrooted_blocks",
            "Blocks withdrawn from the index because a block before them left (a prefix the engine cannot reuse)",
            self.unrooted_blocks.clone(),
        );
        r.register(
            "tier2_queries",
            "Tier-2 (external prefix cache) queries the engine reported",
            self.tier2_queries.clone(),
        );
        r.register(
            "tier2_hits",
            "Tier-2 (external prefix cache) hits the engine reported",
            self.tier2_hits.clone(),
        );
    }

    /// Mirrors one scrape of the engine's tier-2 counters: adds what they
    /// grew by since `previous`, or their whole value when they went
    /// backwards (the engine restarted and its counters started over).
    pub fn record_tier2(&self, previous: Option<Tier2Counters>, now: Tier2Counters) {
        let grown = |before: Option<u64>, after: u64| match before {
            Some(b) if after >= b => after - b,
            _ => after,
        };
        self.tier2_queries
            .inc_by(grown(previous.map(|p| p.queries), now.queries));
        self.tier2_hits
            .inc_by(grown(previous.map(|p| p.hits), now.hits));
    }

    /// Adds what applying a batch did.
    pub fn record_apply(&self, s: &ApplyStats) {
        self.unresolved_parent_blocks
            .inc_by(s.unresolved_parent_blocks);
        self.contentless_unknown_blocks
            .inc_by(s.contentless_unknown_blocks);
        self.unknown_removals.inc_by(s.unknown_removals);
        self.duplicate_blocks
            .inc_by(s.duplicate_stores + s.duplicate_removes);
        self.non_main_attention_events
            .inc_by(s.non_main_attention_events);
        self.token_count_mismatches.inc_by(s.token_count_mismatches);
        self.capacity_evictions.inc_by(s.capacity_evictions);
        self.adapter_blocks_skipped.inc_by(s.adapter_blocks_skipped);
        self.extra_keys_mismatches.inc_by(s.extra_keys_mismatches);
        self.unrooted_blocks.inc_by(s.unrooted_blocks);
    }

    /// Sets the per-adapter gauges to `held`, dropping adapters gone since.
    pub fn record_adapters(&self, held: &std::collections::BTreeMap<String, u64>) {
        self.adapter_blocks.clear();
        for (adapter, n) in held {
            self.adapter_blocks
                .get_or_create(&AdapterLabel {
                    adapter: adapter.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Counts a failure by reason.
    pub fn failed(&self, reason: &'static str) {
        self.batches_failed
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(hits: u64, queries: u64) -> Tier2Counters {
        Tier2Counters { hits, queries }
    }

    #[test]
    fn tier2_mirror_follows_growth_and_engine_restarts() {
        let m = Metrics::default();
        m.record_tier2(None, counters(3, 10));
        m.record_tier2(Some(counters(3, 10)), counters(5, 14));
        assert_eq!((m.tier2_hits.get(), m.tier2_queries.get()), (5, 14));
        // The engine restarted: its counters start over from zero.
        m.record_tier2(Some(counters(5, 14)), counters(1, 2));
        assert_eq!((m.tier2_hits.get(), m.tier2_queries.get()), (6, 16));
    }
}
