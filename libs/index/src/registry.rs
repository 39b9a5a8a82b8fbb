//! The index's registry of scopes and replicas: which scope id and replica
//! slot each name has, the read-mostly facts about every replica, and each
//! scope's shared member list. Lookups read it under the index's registry
//! lock; ingest changes it only when a replica joins, leaves or moves.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use crate::types::{ReplicaKey, Scope};

/// Registry maps are read on every lookup: a fast hasher, seeded per
/// process so crafted keys cannot aim at collisions.
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

pub(crate) type ScopeId = u32;
pub(crate) type ReplicaIdx = u32;

/// Read-mostly facts about a replica.
#[derive(Debug)]
pub(crate) struct ReplicaMeta {
    pub(crate) key: ReplicaKey,
    pub(crate) scope: ScopeId,
    pub(crate) address: String,
    pub(crate) last_seen_ms: AtomicI64,
    /// [`crate::pick::id_hash`] of the replica id: hashed once here, not by
    /// every ranking the replica holds part of.
    pub(crate) id_hash: u64,
}

impl ReplicaMeta {
    pub(crate) fn new(key: ReplicaKey, scope: ScopeId, address: String, last_seen_ms: i64) -> Self {
        Self {
            id_hash: crate::pick::id_hash(&key.replica_id),
            key,
            scope,
            address,
            last_seen_ms: AtomicI64::new(last_seen_ms),
        }
    }

    /// Whether a lookup limited to `candidates` (when given), answering
    /// only replicas seen since `fresh_since_ms` (when given), may answer
    /// this replica.
    pub(crate) fn answers(
        &self,
        candidates: Option<&std::collections::HashSet<String>>,
        fresh_since_ms: Option<i64>,
    ) -> bool {
        candidates.is_none_or(|c| c.contains(&self.key.replica_id))
            && fresh_since_ms.is_none_or(|t| self.last_seen_ms.load(Ordering::Relaxed) >= t)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Registry {
    pub(crate) scopes: FastMap<Scope, ScopeId>,
    pub(crate) scope_list: Vec<Scope>,
    /// Block size learned per scope from stored events, by scope id (0:
    /// none yet): read on every lookup, so an index rather than a hash.
    pub(crate) block_sizes: Vec<u32>,
    /// Visible replicas by slot; a slot being built (resync) or purged is `None`.
    pub(crate) replicas: Vec<Option<Arc<ReplicaMeta>>>,
    pub(crate) by_key: FastMap<ReplicaKey, ReplicaIdx>,
    /// Each scope's visible replicas in slot order, rebuilt when one joins,
    /// leaves or moves: a lookup ranks every replica of its scope, and one
    /// shared list is cheaper than copying hundreds of names per lookup.
    pub(crate) members: FastMap<ScopeId, Members>,
}

/// A scope's visible replicas, shared by the lookups that rank them.
pub(crate) type Members = Arc<[Arc<ReplicaMeta>]>;

/// Heap bytes of a hash map with room for `capacity` entries of type `T`
/// (hashbrown: a power-of-two bucket count at 7/8 load, one control byte
/// per bucket plus a group's worth).
fn map_bytes<T>(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8).div_ceil(7).next_power_of_two();
    buckets * (size_of::<T>() + 1) + 16
}

fn scope_bytes(scope: &Scope) -> usize {
    scope.tenant.capacity() + scope.model.capacity() + scope.adapter.capacity()
}

fn replica_key_bytes(key: &ReplicaKey) -> usize {
    key.tenant.capacity() + key.replica_id.capacity()
}

impl Registry {
    /// The block size learned for `scope`, 0 when none yet.
    pub(crate) fn block_size(&self, scope: ScopeId) -> u32 {
        self.block_sizes.get(scope as usize).copied().unwrap_or(0)
    }

    pub(crate) fn set_block_size(&mut self, scope: ScopeId, block_size: u32) {
        let at = scope as usize;
        if self.block_sizes.len() <= at {
            self.block_sizes.resize(at + 1, 0);
        }
        self.block_sizes[at] = block_size;
    }

    /// Puts `meta` in slot `idx` (`None` empties it) and rebuilds the member
    /// lists of the scopes it left and joined.
    pub(crate) fn set_replica(&mut self, idx: ReplicaIdx, meta: Option<Arc<ReplicaMeta>>) {
        let joined = meta.as_ref().map(|m| m.scope);
        let left = std::mem::replace(&mut self.replicas[idx as usize], meta).map(|m| m.scope);
        for scope in [left, joined].into_iter().flatten() {
            self.rebuild_members(scope);
        }
    }

    fn rebuild_members(&mut self, scope: ScopeId) {
        let members: Members = self
            .replicas
            .iter()
            .flatten()
            .filter(|m| m.scope == scope)
            .cloned()
            .collect();
        if members.is_empty() {
            self.members.remove(&scope);
        } else {
            self.members.insert(scope, members);
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        // Each scope is kept twice: as a map key and in the list.
        let scopes: usize = self.scope_list.iter().map(|s| 2 * scope_bytes(s)).sum();
        let replicas: usize = self
            .replicas
            .iter()
            .flatten()
            .map(|m| {
                // The Arc's counts, the meta, and the key again in `by_key`.
                2 * size_of::<usize>()
                    + size_of::<ReplicaMeta>()
                    + m.address.capacity()
                    + 2 * replica_key_bytes(&m.key)
            })
            .sum();
        map_bytes::<(Scope, ScopeId)>(self.scopes.capacity())
            + self.scope_list.capacity() * size_of::<Scope>()
            + scopes
            + self.block_sizes.capacity() * size_of::<u32>()
            + self.replicas.capacity() * size_of::<Option<Arc<ReplicaMeta>>>()
            + map_bytes::<(ReplicaKey, ReplicaIdx)>(self.by_key.capacity())
            + map_bytes::<(ScopeId, Members)>(self.members.capacity())
            + self
                .members
                .values()
                .map(|m| 2 * size_of::<usize>() + m.len() * size_of::<Arc<ReplicaMeta>>())
                .sum::<usize>()
            + replicas
    }
}

/// A scope's member list of replicas `ids` (tenant "t", dp rank 0, scope 0,
/// never seen): the one fixture the load board's and the shortlist's tests
/// build scopes from.
#[cfg(test)]
pub(crate) fn members_named(ids: &[&str]) -> Members {
    ids.iter()
        .map(|id| {
            Arc::new(ReplicaMeta::new(
                ReplicaKey {
                    tenant: "t".into(),
                    replica_id: (*id).into(),
                    dp_rank: 0,
                },
                0,
                format!("{id}:8000"),
                0,
            ))
        })
        .collect()
}
