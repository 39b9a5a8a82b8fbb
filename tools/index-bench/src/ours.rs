//! ic-index through its public API.

use std::cell::OnceCell;

use ic_index::{
    Change, Fingerprint, Index, IndexConfig, LookupView, NoDeadline, ReplicaKey, Scope,
    ScopeHandle, Tier,
};

use crate::stream::{Item, Stream};

/// Tokens per block in the Mooncake trace.
const BLOCK_SIZE: u32 = 512;

/// The index with the fleet's names.
#[derive(Debug)]
pub struct Ours {
    index: Index,
    scope: Scope,
    /// The scope resolved once, as a caller asking about one scope
    /// repeatedly would keep it (set at the first lookup after it exists).
    handle: OnceCell<ScopeHandle>,
    keys: Vec<ReplicaKey>,
    addresses: Vec<String>,
}

/// One engine event as ic-index takes it.
pub type Event = (u32, Vec<Change>);

impl Ours {
    /// An empty index sized for the fleet's capacity (what an operator
    /// would configure).
    pub fn new(workers: u32, capacity_entries: u64) -> Self {
        let scope = Scope {
            tenant: "bench".into(),
            model: "mooncake".into(),
            hash_scheme: ic_index::HashScheme::Vllm,
            adapter: String::new(),
        };
        let keys = (0..workers)
            .map(|w| ReplicaKey {
                tenant: "bench".into(),
                replica_id: "worker".into(),
                dp_rank: w,
            })
            .collect();
        let addresses = (0..workers)
            .map(|w| format!("10.0.{}.{}:8000", w / 256, w % 256))
            .collect();
        Self {
            index: Index::new(IndexConfig {
                capacity_entries,
                ..IndexConfig::default()
            }),
            scope,
            handle: OnceCell::new(),
            keys,
            addresses,
        }
    }

    /// The stream's events in ic-index's form (None for queries).
    pub fn events(stream: &Stream) -> Vec<Option<Event>> {
        stream.items.iter().map(Self::event).collect()
    }

    /// One item in ic-index's form (None for a query).
    pub fn event(item: &Item) -> Option<Event> {
        match item {
            Item::Stored {
                worker,
                start_depth,
                blocks,
                ..
            } => Some((
                *worker,
                vec![Change::Stored {
                    start_depth: *start_depth,
                    fingerprints: blocks.iter().map(|b| Fingerprint(b.chained)).collect(),
                    block_size: BLOCK_SIZE,
                    tier: Tier::T1,
                }],
            )),
            Item::Removed { worker, chained } => Some((
                *worker,
                vec![Change::Evicted {
                    fingerprints: chained.iter().map(|&c| Fingerprint(c)).collect(),
                }],
            )),
            Item::Query { .. } => None,
        }
    }

    /// The prompts as ic-index takes them.
    pub fn prompts(stream: &Stream) -> Vec<Vec<Fingerprint>> {
        stream
            .prompts
            .iter()
            .map(|p| p.iter().map(|b| Fingerprint(b.chained)).collect())
            .collect()
    }

    /// Applies one event; returns the number of rejected changes.
    pub fn apply(&self, event: &Event, now_ms: i64) -> usize {
        let w = event.0 as usize;
        self.index
            .apply(
                &self.keys[w],
                &self.scope,
                &self.addresses[w],
                &event.1,
                now_ms,
            )
            .len()
    }

    /// (worker, overlap) of every replica matching a prefix, unsorted.
    pub fn query(&self, prompt: &[Fingerprint]) -> Vec<(u32, u32)> {
        let handle = match self.handle.get() {
            Some(&h) => h,
            None => match self.index.resolve_scope(&self.scope) {
                Some(h) => *self.handle.get_or_init(|| h),
                None => return Vec::new(),
            },
        };
        self.index
            .lookup_resolved_until(handle, prompt, None, None, &NoDeadline, |view| match view {
                LookupView::Matches(m) => m
                    .iter()
                    .map(|m| (m.replica.dp_rank, m.matched_blocks))
                    .collect(),
                _ => Vec::new(),
            })
    }

    /// Resident entries.
    pub fn len(&self) -> u64 {
        self.index.len()
    }

    /// The index's heap bytes by part, as it counts them.
    pub fn memory(&self) -> ic_index::IndexMemory {
        self.index.memory()
    }

    /// Records the index's compaction moved so far.
    pub fn records_relocated(&self) -> u64 {
        self.index.records_relocated()
    }

    /// Rebuilds of the index's first-block filter so far.
    pub fn first_filter_rebuilds(&self) -> u64 {
        self.index.first_filter_rebuilds()
    }
}
