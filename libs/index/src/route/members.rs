//! A scope's replicas as the index shares them between lookups, for
//! callers that derive something from them (the endpoint picker maps its
//! pool's endpoints to replicas) and keep it until the replicas change.

use crate::Index;
use crate::registry::Members;
use crate::types::{ReplicaKey, Scope, ScopeHandle};

/// The replicas of one scope, as one list the index shares: it stays the
/// same list (`==`) until a replica joins or leaves the scope or changes
/// its address, and a new one replaces it then. Holding one keeps it
/// alive, so an old list is never mistaken for its replacement.
#[derive(Clone, Debug)]
pub struct ScopeMembers(Members);

impl PartialEq for ScopeMembers {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ScopeMembers {}

impl ScopeMembers {
    /// The replicas of replica scope `scope` (no adapter: an adapter's
    /// replicas are its base scope's), `None` when the index has none.
    pub fn of(index: &Index, scope: &Scope) -> Option<Self> {
        index.members(scope).map(Self)
    }

    /// Each replica and its serving address, in registry order (stale ones
    /// included).
    pub fn iter(&self) -> impl Iterator<Item = (&ReplicaKey, &str)> {
        self.0.iter().map(|m| (&m.key, m.address.as_str()))
    }
}

/// A query's replica scope as one read of the index's registry finds it:
/// its handle for the walk, its block size and its members. A lookup hashes
/// and compares the scope's names once, not once for each of the three.
#[derive(Debug)]
pub(super) struct InScope {
    /// The scope's handle ([`Index::lookup_resolved_until`]).
    pub(super) handle: ScopeHandle,
    /// The block size learned from its events, 0 when none yet.
    pub(super) block_size: u32,
    /// Its visible replicas (`None`: none).
    pub(super) members: Option<Members>,
}

impl InScope {
    /// `scope` in `index`; `None` when nothing was ever reported for it.
    pub(super) fn resolve(index: &Index, scope: &Scope) -> Option<Self> {
        let reg = index.registry.read();
        let &id = reg.scopes.get(scope)?;
        Some(Self {
            handle: ScopeHandle(id),
            block_size: reg.block_size(id),
            members: reg.members.get(&id).cloned(),
        })
    }

    /// The block size, `default` when the scope reported none.
    pub(super) fn block_size_or(scope: Option<&Self>, default: u32) -> u32 {
        scope
            .map(|s| s.block_size)
            .filter(|&b| b > 0)
            .unwrap_or(default)
    }
}
