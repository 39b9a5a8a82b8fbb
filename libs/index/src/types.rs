//! The index's vocabulary.

/// A block's content fingerprint (see docs/fingerprints.md).
pub use ic_kvevents::Fingerprint;

/// Fingerprint domain of an engine family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HashScheme {
    /// vLLM.
    Vllm,
    /// SGLang.
    Sglang,
}

impl HashScheme {
    /// The lower-case name used in snapshots.
    pub fn as_str(self) -> &'static str {
        match self {
            HashScheme::Vllm => "vllm",
            HashScheme::Sglang => "sglang",
        }
    }
}

/// Cache tier of a held block: the subscriber's vocabulary, one type end to
/// end. `T1` sorts before `T2` (hotter first).
pub use ic_kvevents::Tier;

/// The partition a replica and its entries belong to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    /// Tenant (engine pod namespace).
    pub tenant: String,
    /// Model id.
    pub model: String,
    /// Fingerprint domain.
    pub hash_scheme: HashScheme,
    /// LoRA adapter, empty for the base model.
    pub adapter: String,
}

/// A [`Scope`] resolved by [`crate::Index::resolve_scope`]: its id in that
/// index, so a lookup through it does not hash the scope's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScopeHandle(pub(crate) u32);

/// Identity of one replica stream: a pod's DP rank.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaKey {
    /// Tenant (engine pod namespace).
    pub tenant: String,
    /// Pod name.
    pub replica_id: String,
    /// Data-parallel rank.
    pub dp_rank: u32,
}

/// One change to a replica's holdings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Consecutive blocks now held at `tier` (new, or a tier change).
    Stored {
        /// Blocks before the first one.
        start_depth: u32,
        /// The blocks in prompt order.
        fingerprints: Vec<Fingerprint>,
        /// Tokens per block.
        block_size: u32,
        /// Tier now.
        tier: Tier,
    },
    /// Blocks no longer held.
    Evicted {
        /// The blocks.
        fingerprints: Vec<Fingerprint>,
    },
    /// Every block at `tier` is gone.
    Cleared {
        /// The tier.
        tier: Tier,
    },
}

/// One replica's match against a prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Which replica.
    pub replica: ReplicaKey,
    /// Its serving address.
    pub address: String,
    /// Consecutive blocks matched from the start of the prompt.
    pub matched_blocks: u32,
    /// Tokens per block of the match.
    pub block_size: u32,
    /// The coldest tier among the matched blocks.
    pub tier: Tier,
}

impl Candidate {
    /// Matched tokens.
    pub fn matched_tokens(&self) -> u64 {
        u64::from(self.matched_blocks) * u64::from(self.block_size)
    }

    /// Borrowed, as the index lends a match ([`crate::pick::PickInput`]
    /// reads matches so).
    pub fn as_match(&self) -> Match<'_> {
        Match {
            replica: &self.replica,
            address: &self.address,
            matched_blocks: self.matched_blocks,
            block_size: self.block_size,
            tier: self.tier,
        }
    }
}

/// One replica's match, borrowed from the index while a
/// [`crate::Index::lookup_with`] callback runs (no copies of names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match<'a> {
    /// Which replica.
    pub replica: &'a ReplicaKey,
    /// Its serving address.
    pub address: &'a str,
    /// Consecutive blocks matched from the start of the prompt.
    pub matched_blocks: u32,
    /// Tokens per block of the match.
    pub block_size: u32,
    /// The coldest tier among the matched blocks.
    pub tier: Tier,
}

impl Match<'_> {
    /// Matched tokens.
    pub fn matched_tokens(&self) -> u64 {
        u64::from(self.matched_blocks) * u64::from(self.block_size)
    }

    /// An owned copy.
    pub fn to_candidate(&self) -> Candidate {
        Candidate {
            replica: self.replica.clone(),
            address: self.address.to_owned(),
            matched_blocks: self.matched_blocks,
            block_size: self.block_size,
            tier: self.tier,
        }
    }
}

/// What a lookup found, borrowed from the index while a
/// [`crate::Index::lookup_with`] callback runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LookupView<'a> {
    /// Replicas holding a prefix, best first (as in [`LookupOutcome`]).
    Matches(&'a [Match<'a>]),
    /// No replica in scope holds the first block.
    NoEntry,
    /// Nothing was ever reported for this scope.
    UnknownScope,
    /// The deadline passed before the lookup finished.
    TimedOut,
}

impl LookupView<'_> {
    /// An owned copy.
    pub fn to_outcome(self) -> LookupOutcome {
        match self {
            LookupView::Matches(m) => {
                LookupOutcome::Matches(m.iter().map(Match::to_candidate).collect())
            }
            LookupView::NoEntry => LookupOutcome::NoEntry,
            LookupView::UnknownScope => LookupOutcome::UnknownScope,
            LookupView::TimedOut => LookupOutcome::TimedOut,
        }
    }
}

/// What a lookup found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LookupOutcome {
    /// Replicas holding a prefix, best first (longest; T1 before T2 at equal
    /// length; then most recently active).
    Matches(Vec<Candidate>),
    /// No replica in scope holds the first block.
    NoEntry,
    /// Nothing was ever reported for this scope.
    UnknownScope,
    /// The deadline passed before the lookup finished.
    TimedOut,
}

/// When a lookup must give up. The index reads no clock itself: the caller
/// decides what "expired" means (a monotonic instant in the server, a
/// manual clock in tests).
pub trait Deadline {
    /// Whether the budget is spent.
    fn expired(&self) -> bool;
}

/// A lookup that may take as long as it needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoDeadline;

impl Deadline for NoDeadline {
    fn expired(&self) -> bool {
        false
    }
}

/// A content-level inconsistency in a change (never panics; reported).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContentError {
    /// A fingerprint was reported at a depth that disagrees with what the
    /// index already holds for it (a hash collision or a broken producer).
    DepthMismatch {
        /// The fingerprint.
        fingerprint: Fingerprint,
        /// Depth already recorded.
        known: u32,
        /// Depth just reported.
        reported: u32,
    },
    /// The batch named a replica beyond [`crate::IndexConfig::max_replicas`];
    /// nothing of it was applied (the whole batch fails).
    TooManyReplicas,
    /// The batch named a scope beyond [`crate::IndexConfig::max_scopes`];
    /// nothing of it was applied (the whole batch fails).
    TooManyScopes,
    /// The record space (the page directory, sized at four times the
    /// capacity's pages) is exhausted; the chain from the run that failed
    /// onward was not stored (what came before it was). Not expected: a resync of
    /// every replica at full capacity peaks at about half that room; counted
    /// by [`crate::Index::chains_out_of_space`].
    OutOfSpace,
}

/// One replica as `/snapshot` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSnapshot {
    /// Which replica.
    pub key: ReplicaKey,
    /// Its scope.
    pub scope: Scope,
    /// Serving address.
    pub address: String,
    /// Entries held (all tiers).
    pub prefix_count: u64,
    /// Entries held at T1.
    pub t1_count: u64,
    /// Last time anything arrived from the replica (Unix ms).
    pub last_seen_ms: i64,
    /// Last time a change arrived (Unix ms); `None` before the first.
    pub last_event_ms: Option<i64>,
    /// Block size last reported.
    pub block_size: u32,
    /// Cumulative tier-2 counters `(hits, queries)` when the engine exports them.
    pub tier2: Option<(u64, u64)>,
}

/// Heap bytes the index holds, by part (see [`crate::Index::memory`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexMemory {
    /// Record pages, with their holder lists and the page directory.
    pub records: u64,
    /// Key tables (block key → record).
    pub key_tables: u64,
    /// Scopes, replicas and their per-replica counts.
    pub replicas: u64,
}

impl IndexMemory {
    /// All parts.
    pub fn total(&self) -> u64 {
        self.records + self.key_tables + self.replicas
    }
}
