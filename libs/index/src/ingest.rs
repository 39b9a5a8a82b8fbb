//! The ingest stream protocol, shared by every front end that feeds the
//! index (the IngestEvents gRPC stream today; a Kafka consumer next).
//!
//! A stream carries batches for one or more replica ranks. The first batch
//! for a rank on a stream must open a resync (a subscriber always resyncs
//! after connecting); after it, every batch must carry exactly the next
//! sequence number, from the same subscriber incarnation. Anything else
//! means this side's view may have a hole, so the session asks for a
//! resync rather than guess.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::types::{Change, ReplicaKey, Scope};

/// What one stream may hold (each bound is a server flag).
#[derive(Clone, Debug)]
pub struct IngestLimits {
    /// Replica ranks one stream may carry.
    pub max_ranks: usize,
    /// Bytes one stream may hold in unfinished resyncs (as [`bytes`]
    /// charges them).
    pub max_stream_resync_bytes: u64,
    /// Bytes all streams together may hold in unfinished resyncs.
    pub budget: ResyncBudget,
    /// Longest model, adapter, replica id or address a batch may name, in
    /// bytes: each new scope and replica is kept (a scope for good), so an
    /// unbounded name is memory a stream could take without end.
    pub max_name_bytes: usize,
    /// Data-parallel ranks a replica may have (`dp_rank` below this): each
    /// rank takes a replica slot until it goes silent.
    pub max_dp_ranks: u32,
}

/// Default of [`IngestLimits::max_name_bytes`] (a Kubernetes name is at most
/// 253 bytes; a model or adapter path rarely a few hundred).
pub const DEFAULT_MAX_NAME_BYTES: usize = 1024;
/// Default of [`IngestLimits::max_dp_ranks`].
pub const DEFAULT_MAX_DP_RANKS: u32 = 1024;

/// Default of [`IngestLimits::max_stream_resync_bytes`]: 64 MiB.
pub const DEFAULT_MAX_STREAM_RESYNC_BYTES: u64 = 64 << 20;
/// Default of the shared [`ResyncBudget`]: 256 MiB (the index server's
/// chart limit is 1 GiB; see docs/reliability.md for the arithmetic).
pub const DEFAULT_RESYNC_BUDGET_BYTES: u64 = 256 << 20;

impl Default for IngestLimits {
    fn default() -> Self {
        Self {
            max_ranks: 1024,
            max_stream_resync_bytes: DEFAULT_MAX_STREAM_RESYNC_BYTES,
            budget: ResyncBudget::new(DEFAULT_RESYNC_BUDGET_BYTES),
            max_name_bytes: DEFAULT_MAX_NAME_BYTES,
            max_dp_ranks: DEFAULT_MAX_DP_RANKS,
        }
    }
}

/// Bytes buffered in unfinished resyncs, shared by every stream of a
/// server, so many streams cannot together outgrow one stream's bound.
#[derive(Clone, Debug)]
pub struct ResyncBudget {
    used: Arc<AtomicU64>,
    limit: u64,
}

impl ResyncBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        Self {
            used: Arc::new(AtomicU64::new(0)),
            limit,
        }
    }

    /// The budget, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes currently charged.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    fn try_charge(&self, n: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    fn release(&self, n: u64) {
        // Never below zero, whatever a caller does.
        let _ = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                Some(used.saturating_sub(n))
            });
    }
}

/// Which bound refused a batch (the stream ends; nothing it applied before
/// is lost, and its unfinished resync is dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// [`IngestLimits::max_ranks`].
    Ranks,
    /// [`IngestLimits::max_stream_resync_bytes`].
    StreamResync,
    /// [`IngestLimits::budget`].
    ResyncBudget,
    /// [`IngestLimits::max_name_bytes`].
    NameBytes,
    /// [`IngestLimits::max_dp_ranks`].
    DpRanks,
    /// [`crate::IndexConfig::max_replicas`]: the index knows as many
    /// replicas as it may.
    Replicas,
    /// [`crate::IndexConfig::max_scopes`]: the index knows as many scopes
    /// as it may.
    Scopes,
}

impl Limit {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Ranks => "ranks_per_stream",
            Self::StreamResync => "stream_resync_bytes",
            Self::ResyncBudget => "resync_budget_bytes",
            Self::NameBytes => "name_bytes",
            Self::DpRanks => "dp_ranks",
            Self::Replicas => "replicas",
            Self::Scopes => "scopes",
        }
    }
}

/// Blocks a change holds in a buffer (at least one per change, so empty
/// changes cannot be buffered for free).
fn weight(changes: &[Change]) -> u64 {
    changes
        .iter()
        .map(|c| match c {
            Change::Stored { fingerprints, .. } | Change::Evicted { fingerprints } => {
                fingerprints.len().max(1) as u64
            }
            Change::Cleared { .. } => 1,
        })
        .sum()
}

/// What buffering `changes` costs in memory, in bytes: each change's slot
/// in the buffer (twice its size: a growing `Vec` may hold double) plus its
/// fingerprints' heap allocation with the allocator's overhead (16 bytes,
/// 32 at least). A removal of one block or a clear costs about what a
/// stored block does — they are what a hostile or broken resync sends.
pub fn bytes(changes: &[Change]) -> u64 {
    const SLOT: u64 = 2 * std::mem::size_of::<Change>() as u64;
    let heap = |n: usize| -> u64 {
        if n == 0 {
            0
        } else {
            ((n as u64 * 8 + 16 + 15) & !15).max(32)
        }
    };
    changes
        .iter()
        .map(|c| {
            SLOT + match c {
                Change::Stored { fingerprints, .. } | Change::Evicted { fingerprints } => {
                    heap(fingerprints.len())
                }
                Change::Cleared { .. } => 0,
            }
        })
        .sum()
}

/// One decoded, validated batch.
#[derive(Clone, Debug, PartialEq)]
pub struct IngestBatch {
    /// Which replica rank.
    pub key: ReplicaKey,
    /// Its scope.
    pub scope: Scope,
    /// Its serving address.
    pub address: String,
    /// The subscriber process that sent it.
    pub incarnation: u64,
    /// Position in the rank's stream.
    pub seq: u64,
    /// This batch starts a full-state resync.
    pub resync_begin: bool,
    /// This batch ends the resync.
    pub resync_end: bool,
    /// The changes.
    pub changes: Vec<Change>,
    /// Cumulative tier-2 counters `(hits, queries)`, when reported.
    pub tier2: Option<(u64, u64)>,
}

/// What the front end should do with a batch.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Apply these changes now.
    Apply {
        /// Replica.
        key: ReplicaKey,
        /// Its scope.
        scope: Scope,
        /// Its serving address.
        address: String,
        /// The changes.
        changes: Vec<Change>,
        /// Tier-2 counters, when reported.
        tier2: Option<(u64, u64)>,
    },
    /// A resync completed: replace the replica's state with these changes.
    Replace {
        /// Replica.
        key: ReplicaKey,
        /// Its scope.
        scope: Scope,
        /// Its serving address.
        address: String,
        /// The whole state.
        changes: Vec<Change>,
        /// Tier-2 counters, when reported.
        tier2: Option<(u64, u64)>,
    },
    /// Part of a resync was buffered; nothing to apply yet.
    Buffered,
    /// A resync is needed; end the stream with this detail.
    ResyncRequired(String),
    /// A bound was reached; end the stream with this detail.
    Refused(Limit, String),
}

impl Step {
    /// Blocks the step applies (its cost to the index).
    pub fn weight(&self) -> u64 {
        match self {
            Self::Apply { changes, .. } | Self::Replace { changes, .. } => weight(changes),
            Self::Buffered | Self::ResyncRequired(_) | Self::Refused(..) => 0,
        }
    }
}

#[derive(Debug)]
struct RankStream {
    incarnation: u64,
    last_seq: u64,
    resync: Option<Vec<Change>>,
    /// Bytes `resync` holds (charged to the stream and the budget).
    buffered: u64,
    /// When its last batch came, as the caller told
    /// ([`IngestSession::heard`]); `None` until told.
    heard_ms: Option<i64>,
}

/// The protocol state of one stream.
#[derive(Debug, Default)]
pub struct IngestSession {
    ranks: HashMap<ReplicaKey, RankStream>,
    limits: IngestLimits,
    /// Bytes this stream holds in unfinished resyncs.
    buffered: u64,
}

impl Drop for IngestSession {
    fn drop(&mut self) {
        self.limits.budget.release(self.buffered);
    }
}

/// One rank of an [`IngestSession`], as a snapshot keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankState {
    /// Which rank.
    pub key: ReplicaKey,
    /// The subscriber process its sequence belongs to.
    pub incarnation: u64,
    /// The last sequence number accepted.
    pub last_seq: u64,
    /// An unfinished resync's changes so far.
    pub resync: Option<Vec<Change>>,
}

impl IngestSession {
    /// A session bounded by `limits`.
    pub fn with_limits(limits: IngestLimits) -> Self {
        Self {
            ranks: HashMap::new(),
            limits,
            buffered: 0,
        }
    }

    fn uncharge(&mut self, n: u64) {
        self.buffered = self.buffered.saturating_sub(n);
        self.limits.budget.release(n);
    }

    /// Every rank's state (for a snapshot), sorted by key.
    pub fn export(&self) -> Vec<RankState> {
        let mut out: Vec<RankState> = self
            .ranks
            .iter()
            .map(|(key, r)| RankState {
                key: key.clone(),
                incarnation: r.incarnation,
                last_seq: r.last_seq,
                resync: r.resync.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// Takes up ranks a snapshot kept, charging their unfinished resyncs
    /// to the budget; a rank that does not fit is left out (its batches
    /// wait for its next resync) and returned.
    pub fn import(&mut self, ranks: Vec<RankState>) -> Vec<ReplicaKey> {
        let mut left_out = Vec::new();
        for rank in ranks {
            let n = rank.resync.as_deref().map_or(0, bytes);
            let fits = self.ranks.len() < self.limits.max_ranks
                && self.buffered.saturating_add(n) <= self.limits.max_stream_resync_bytes
                && self.limits.budget.try_charge(n);
            if !fits {
                left_out.push(rank.key);
                continue;
            }
            self.buffered += n;
            let previous = self.ranks.insert(
                rank.key,
                RankStream {
                    incarnation: rank.incarnation,
                    last_seq: rank.last_seq,
                    resync: rank.resync,
                    buffered: n,
                    heard_ms: None,
                },
            );
            if let Some(previous) = previous {
                self.uncharge(previous.buffered);
            }
        }
        left_out
    }

    /// Forgets a rank (its unfinished resync is dropped): its next batches
    /// are refused until it resyncs. Returns whether it was known.
    pub fn forget(&mut self, key: &ReplicaKey) -> bool {
        match self.ranks.remove(key) {
            Some(rank) => {
                self.uncharge(rank.buffered);
                true
            }
            None => false,
        }
    }

    /// Marks `key` as heard from at `now_ms` (its batch just came), for
    /// [`IngestSession::forget_silent`].
    pub fn heard(&mut self, key: &ReplicaKey, now_ms: i64) {
        if let Some(rank) = self.ranks.get_mut(key) {
            rank.heard_ms = Some(now_ms);
        }
    }

    /// Forgets the ranks not heard from for longer than `silent_ms` at
    /// `now_ms` (a rank never marked starts its clock now), giving back
    /// what their unfinished resyncs held, and returns them. A session
    /// that outlives its subscribers (one per Kafka partition) would
    /// otherwise keep every rank it ever saw, and the resync a subscriber
    /// left half-sent when its pod went would hold the shared budget for
    /// good.
    pub fn forget_silent(&mut self, now_ms: i64, silent_ms: i64) -> Vec<ReplicaKey> {
        let mut gone = Vec::new();
        let mut freed = 0;
        self.ranks.retain(|key, rank| {
            let heard = *rank.heard_ms.get_or_insert(now_ms);
            let keep = now_ms.saturating_sub(heard) <= silent_ms;
            if !keep {
                freed += rank.buffered;
                gone.push(key.clone());
            }
            keep
        });
        self.uncharge(freed);
        gone.sort();
        gone
    }

    /// Whether the session knows the rank (it has seen its resync begin).
    pub fn knows(&self, key: &ReplicaKey) -> bool {
        self.ranks.contains_key(key)
    }

    /// The refusal of a batch naming a replica past the name or rank
    /// bounds, the field named (checked before anything is kept).
    fn over_bounds(&self, key: &ReplicaKey, scope: &Scope, address: &str) -> Option<Step> {
        let max = self.limits.max_name_bytes;
        let long = [
            ("replica.scope.model", scope.model.as_str()),
            ("replica.scope.adapter", scope.adapter.as_str()),
            ("replica.replica_id", key.replica_id.as_str()),
            ("replica.address", address),
        ]
        .into_iter()
        .find(|(_, name)| name.len() > max);
        if let Some((field, name)) = long {
            return Some(Step::Refused(
                Limit::NameBytes,
                format!(
                    "{field}: {} bytes, longer than {max} (--max-ingest-name-bytes)",
                    name.len()
                ),
            ));
        }
        (key.dp_rank >= self.limits.max_dp_ranks).then(|| {
            Step::Refused(
                Limit::DpRanks,
                format!(
                    "replica.dp_rank: {} is not below {} (--max-dp-ranks)",
                    key.dp_rank, self.limits.max_dp_ranks
                ),
            )
        })
    }

    /// Classifies one batch.
    pub fn accept(&mut self, batch: IngestBatch) -> Step {
        let IngestBatch {
            key,
            scope,
            address,
            incarnation,
            seq,
            resync_begin,
            resync_end,
            changes,
            tier2,
        } = batch;
        if let Some(refused) = self.over_bounds(&key, &scope, &address) {
            return refused;
        }
        if resync_begin {
            if !self.ranks.contains_key(&key) && self.ranks.len() >= self.limits.max_ranks {
                return Step::Refused(
                    Limit::Ranks,
                    format!(
                        "replica {}/{} rank {}: this stream already carries {} ranks",
                        key.tenant, key.replica_id, key.dp_rank, self.limits.max_ranks
                    ),
                );
            }
            let previous = self.ranks.insert(
                key.clone(),
                RankStream {
                    incarnation,
                    last_seq: seq,
                    resync: Some(Vec::new()),
                    buffered: 0,
                    heard_ms: None,
                },
            );
            if let Some(previous) = previous {
                self.uncharge(previous.buffered);
            }
        }
        let Some(rank) = self.ranks.get_mut(&key) else {
            return Step::ResyncRequired(format!(
                "replica {}/{} rank {}: stream did not start with a resync",
                key.tenant, key.replica_id, key.dp_rank
            ));
        };
        if rank.incarnation != incarnation {
            return Step::ResyncRequired(format!(
                "replica {}/{}: new subscriber incarnation without a resync",
                key.tenant, key.replica_id
            ));
        }
        if !resync_begin {
            let expected = rank.last_seq.wrapping_add(1);
            if seq != expected {
                return Step::ResyncRequired(format!(
                    "replica {}/{} rank {}: expected seq {expected}, got {seq}",
                    key.tenant, key.replica_id, key.dp_rank
                ));
            }
            rank.last_seq = seq;
        }
        match rank.resync.as_mut() {
            Some(buffer) => {
                if !resync_end {
                    let n = bytes(&changes);
                    if self.buffered.saturating_add(n) > self.limits.max_stream_resync_bytes {
                        return Step::Refused(
                            Limit::StreamResync,
                            format!(
                                "replica {}/{} rank {}: resync larger than {} bytes \
                                 (--max-stream-resync-bytes)",
                                key.tenant,
                                key.replica_id,
                                key.dp_rank,
                                self.limits.max_stream_resync_bytes
                            ),
                        );
                    }
                    if !self.limits.budget.try_charge(n) {
                        return Step::Refused(
                            Limit::ResyncBudget,
                            format!(
                                "replica {}/{} rank {}: the server's resync buffer ({} bytes, \
                                 --resync-budget-bytes) is full",
                                key.tenant, key.replica_id, key.dp_rank, self.limits.budget.limit
                            ),
                        );
                    }
                    buffer.extend(changes);
                    rank.buffered += n;
                    self.buffered += n;
                    return Step::Buffered;
                }
                buffer.extend(changes);
                let changes = rank.resync.take().unwrap_or_default();
                let freed = std::mem::take(&mut rank.buffered);
                self.uncharge(freed);
                Step::Replace {
                    key,
                    scope,
                    address,
                    changes,
                    tier2,
                }
            }
            None if resync_end => Step::ResyncRequired("resync_end without resync_begin".into()),
            None => Step::Apply {
                key,
                scope,
                address,
                changes,
                tier2,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Fingerprint, HashScheme, Tier};

    fn batch(seq: u64, begin: bool, end: bool, incarnation: u64) -> IngestBatch {
        IngestBatch {
            key: ReplicaKey {
                tenant: "t".into(),
                replica_id: "pod".into(),
                dp_rank: 0,
            },
            scope: Scope {
                tenant: "t".into(),
                model: "m".into(),
                hash_scheme: HashScheme::Vllm,
                adapter: String::new(),
            },
            address: "1.2.3.4:8000".into(),
            incarnation,
            seq,
            resync_begin: begin,
            resync_end: end,
            changes: vec![Change::Stored {
                start_depth: 0,
                fingerprints: vec![Fingerprint(seq)],
                block_size: 16,
                tier: Tier::T1,
            }],
            tier2: None,
        }
    }

    #[test]
    fn resync_then_deltas_in_sequence_then_a_gap() {
        let mut s = IngestSession::default();
        assert!(matches!(
            s.accept(batch(1, false, false, 7)),
            Step::ResyncRequired(_)
        ));
        assert_eq!(s.accept(batch(10, true, false, 7)), Step::Buffered);
        assert!(
            matches!(s.accept(batch(11, false, true, 7)), Step::Replace { changes, .. } if changes.len() == 2)
        );
        assert!(matches!(
            s.accept(batch(12, false, false, 7)),
            Step::Apply { .. }
        ));
        assert!(
            matches!(s.accept(batch(14, false, false, 7)), Step::ResyncRequired(d) if d.contains("expected seq 13"))
        );
        assert!(matches!(
            s.accept(batch(13, false, false, 8)),
            Step::ResyncRequired(d) if d.contains("incarnation")
        ));
    }

    /// What one test batch (one stored block) is charged.
    fn u() -> u64 {
        bytes(&batch(0, false, false, 0).changes)
    }

    fn limited(max_ranks: usize, stream: u64, budget: &ResyncBudget) -> IngestSession {
        IngestSession::with_limits(IngestLimits {
            max_ranks,
            max_stream_resync_bytes: stream * u(),
            budget: budget.clone(),
            ..IngestLimits::default()
        })
    }

    #[test]
    fn removals_and_clears_cost_what_stored_blocks_do() {
        let one = |c: Change| bytes(&[c]);
        let stored = one(Change::Stored {
            start_depth: 0,
            fingerprints: vec![Fingerprint(1)],
            block_size: 16,
            tier: Tier::T1,
        });
        let removed = one(Change::Evicted {
            fingerprints: vec![Fingerprint(1)],
        });
        let cleared = one(Change::Cleared { tier: Tier::T1 });
        assert_eq!(removed, stored);
        assert!(cleared * 2 > stored, "{cleared} vs {stored}");
        // Many blocks in one change cost their fingerprints.
        let big = one(Change::Evicted {
            fingerprints: vec![Fingerprint(1); 1000],
        });
        assert!((8000..8200).contains(&big), "{big}");
    }

    fn for_rank(mut b: IngestBatch, rank: u32) -> IngestBatch {
        b.key.dp_rank = rank;
        b
    }

    #[test]
    fn an_endless_resync_is_refused_at_the_stream_bound_and_releases_the_budget() {
        let budget = ResyncBudget::new(100 * u());
        let mut s = limited(4, 3, &budget);
        assert_eq!(s.accept(batch(1, true, false, 7)), Step::Buffered);
        assert_eq!(s.accept(batch(2, false, false, 7)), Step::Buffered);
        assert_eq!(s.accept(batch(3, false, false, 7)), Step::Buffered);
        assert_eq!(budget.used(), 3 * u());
        assert!(matches!(
            s.accept(batch(4, false, false, 7)),
            Step::Refused(Limit::StreamResync, d) if d.contains("--max-stream-resync-bytes")
        ));
        drop(s);
        assert_eq!(budget.used(), 0, "a closed stream gives its buffer back");
    }

    #[test]
    fn streams_share_one_resync_budget() {
        let budget = ResyncBudget::new(3 * u());
        let mut a = limited(4, 10, &budget);
        let mut b = limited(4, 10, &budget);
        assert_eq!(a.accept(batch(1, true, false, 7)), Step::Buffered);
        assert_eq!(a.accept(batch(2, false, false, 7)), Step::Buffered);
        assert_eq!(b.accept(batch(1, true, false, 8)), Step::Buffered);
        assert!(matches!(
            b.accept(batch(2, false, false, 8)),
            Step::Refused(Limit::ResyncBudget, _)
        ));
        // A finished resync frees its share: the other stream may go on.
        assert!(matches!(
            a.accept(batch(3, false, true, 7)),
            Step::Replace { .. }
        ));
        assert_eq!(budget.used(), u());
        assert_eq!(b.accept(batch(3, false, false, 8)), Step::Buffered);
        assert_eq!(budget.used(), 2 * u());
        // Restarting a resync releases the old buffer first.
        assert_eq!(b.accept(batch(9, true, false, 8)), Step::Buffered);
        assert_eq!(budget.used(), u());
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn a_stream_carries_a_bounded_number_of_ranks() {
        let budget = ResyncBudget::new(100 * u());
        let mut s = limited(2, 10, &budget);
        assert!(matches!(
            s.accept(for_rank(batch(1, true, true, 7), 0)),
            Step::Replace { .. }
        ));
        assert!(matches!(
            s.accept(for_rank(batch(1, true, true, 7), 1)),
            Step::Replace { .. }
        ));
        assert!(matches!(
            s.accept(for_rank(batch(1, true, true, 7), 2)),
            Step::Refused(Limit::Ranks, _)
        ));
        // A known rank may resync again.
        assert!(matches!(
            s.accept(for_rank(batch(5, true, true, 7), 1)),
            Step::Replace { .. }
        ));
    }

    #[test]
    fn names_and_ranks_past_the_bounds_are_refused_naming_the_field() {
        let mut s = IngestSession::with_limits(IngestLimits {
            // The test batch's address is 12 bytes.
            max_name_bytes: 12,
            max_dp_ranks: 4,
            ..IngestLimits::default()
        });
        assert!(matches!(
            s.accept(batch(1, true, true, 7)),
            Step::Replace { .. }
        ));
        let long = "x".repeat(13);
        let refused = |s: &mut IngestSession, b: IngestBatch| match s.accept(b) {
            Step::Refused(limit, detail) => (limit, detail),
            other => panic!("{other:?}"),
        };
        for (field, edit) in [
            (
                "replica.scope.model",
                &(|b: &mut IngestBatch, l: &str| b.scope.model = l.into())
                    as &dyn Fn(&mut IngestBatch, &str),
            ),
            ("replica.scope.adapter", &|b, l| b.scope.adapter = l.into()),
            ("replica.replica_id", &|b, l| b.key.replica_id = l.into()),
            ("replica.address", &|b, l| b.address = l.into()),
        ] {
            let mut b = batch(2, false, false, 7);
            edit(&mut b, &long);
            let (limit, detail) = refused(&mut s, b);
            assert_eq!(limit, Limit::NameBytes);
            assert!(detail.starts_with(field), "{detail}");
            assert!(detail.contains("--max-ingest-name-bytes"), "{detail}");
        }
        // A name at the bound is taken; the stream's sequence was not moved
        // by the refusals.
        let mut b = batch(2, false, false, 7);
        b.address = "x".repeat(12);
        assert!(matches!(s.accept(b), Step::Apply { .. }));
        let (limit, detail) = refused(&mut s, for_rank(batch(1, true, true, 7), 4));
        assert_eq!(limit, Limit::DpRanks);
        assert!(detail.starts_with("replica.dp_rank: 4"), "{detail}");
        assert!(matches!(
            s.accept(for_rank(batch(1, true, true, 7), 3)),
            Step::Replace { .. }
        ));
    }
    #[test]
    fn ranks_silent_too_long_are_forgotten_with_their_unfinished_resyncs() {
        let budget = ResyncBudget::new(1 << 20);
        let mut s = IngestSession::with_limits(IngestLimits {
            budget: budget.clone(),
            ..IngestLimits::default()
        });
        // A resync begun and never ended (its pod went mid-resync) holds
        // part of the shared budget.
        assert_eq!(s.accept(batch(1, true, false, 7)), Step::Buffered);
        assert_eq!(s.accept(batch(2, false, false, 7)), Step::Buffered);
        s.heard(&batch(2, false, false, 7).key, 1_000);
        assert!(budget.used() > 0);
        // Within the silence allowed: kept.
        assert!(s.forget_silent(60_000, 60_000).is_empty());
        assert!(s.knows(&batch(1, false, false, 7).key));
        // Past it: forgotten, the budget given back, its next delta waits
        // for a resync.
        let gone = s.forget_silent(61_001, 60_000);
        assert_eq!(gone, [batch(1, false, false, 7).key]);
        assert_eq!(budget.used(), 0);
        assert!(matches!(
            s.accept(batch(3, false, false, 7)),
            Step::ResyncRequired(_)
        ));
        // A rank never marked (taken from a snapshot) starts its clock at
        // the first sweep.
        let mut restored = IngestSession::default();
        restored.import(vec![RankState {
            key: batch(1, false, false, 7).key,
            incarnation: 7,
            last_seq: 1,
            resync: None,
        }]);
        assert!(restored.forget_silent(500_000, 60_000).is_empty());
        assert_eq!(restored.forget_silent(560_001, 60_000).len(), 1);
    }
}
