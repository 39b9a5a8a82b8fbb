//! A scope's replicas as the index shares them between lookups, for
//! callers that derive something from them (the endpoint picker maps its
//! pool's endpoints to replicas) and keep it until the replicas change.

use crate::Index;
use crate::registry::Members;
use crate::types::{ReplicaKey, Scope};

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
