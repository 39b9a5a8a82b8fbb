//! Which index replicas and scope a picker's request is scored under: the
//! pool's endpoints mapped to the replicas that report their addresses,
//! and the scope of the request's model (a LoRA adapter under its base
//! model's scope). A child module of `epp`.
//!
//! The mapping is kept per pool and scope between requests ([`PoolCache`])
//! and rebuilt only when the pool's endpoints or the scope's replicas
//! (who, or where they serve) change: before, every pick copied every
//! replica of the scope and searched it once per endpoint.

use std::sync::Arc;

use ic_index::route::ScopeMembers;
use ic_index::{ReplicaKey, Scope};
use parking_lot::Mutex;

use super::{EndpointPicker, NoEndpoint};

/// The pool as scored: each endpoint under its index replica's key (or its
/// address, when the index has not heard from it), in the pool's order.
pub(crate) type ScoredPool = Arc<[(ReplicaKey, String)]>;

/// What a pool's picks reuse: its endpoints as last read, and per replica
/// scope the endpoints mapped to its replicas. Holds one entry per scope
/// the index knows in the pool's namespace at most (a scope the index has
/// no replicas of is mapped afresh, cheaply, and not kept).
#[derive(Debug, Default)]
pub struct PoolCache {
    endpoints: Mutex<Option<Arc<[String]>>>,
    mapped: Mutex<Vec<Mapped>>,
}

#[derive(Debug)]
struct Mapped {
    scope: Scope,
    members: ScopeMembers,
    endpoints: Arc<[String]>,
    pool: ScoredPool,
}

impl PoolCache {
    /// The endpoints `current` holds, shared: the same list while they do
    /// not change.
    fn endpoints(&self, current: &[String]) -> Arc<[String]> {
        let mut last = self.endpoints.lock();
        match last.as_ref() {
            Some(list) if **list == *current => list.clone(),
            _ => last.insert(Arc::from(current)).clone(),
        }
    }
}

/// `eligible` keyed by the replicas of `members` serving at each address.
fn map(scope: &Scope, eligible: &[String], members: Option<&ScopeMembers>) -> ScoredPool {
    eligible
        .iter()
        .map(|address| {
            let key = members
                .and_then(|m| m.iter().find(|(_, a)| a == address))
                .map(|(k, _)| k.clone())
                .unwrap_or_else(|| ReplicaKey {
                    tenant: scope.tenant.clone(),
                    replica_id: address.clone(),
                    dp_rank: 0,
                });
            (key, address.clone())
        })
        .collect()
}

impl EndpointPicker {
    /// The endpoints this request may go to: the pool, narrowed by the
    /// gateway's subset when it sent one.
    pub(super) fn eligible(&self, subset: Option<&[String]>) -> Result<Arc<[String]>, NoEndpoint> {
        let endpoints = self.pool.endpoints.read();
        let eligible: Arc<[String]> = match subset {
            None => self.pool.cache.endpoints(&endpoints),
            Some(subset) => {
                // The subset narrows the pool: the gateway knows which
                // endpoints are healthy for it right now.
                subset
                    .iter()
                    .filter(|e| endpoints.contains(e))
                    .cloned()
                    .collect()
            }
        };
        drop(endpoints);
        if eligible.is_empty() {
            return Err(NoEndpoint::Empty(match subset {
                Some(_) => "no endpoint of the gateway's subset is in the pool".to_owned(),
                None => "the pool has no ready endpoint".to_owned(),
            }));
        }
        Ok(eligible)
    }

    /// The pool as scored in `scope`, from the pool's cache while neither
    /// `eligible` nor the scope's replicas changed.
    pub(super) fn scored_pool(&self, scope: &Scope, eligible: &Arc<[String]>) -> ScoredPool {
        let base = if scope.adapter.is_empty() {
            std::borrow::Cow::Borrowed(scope)
        } else {
            std::borrow::Cow::Owned(Scope {
                adapter: String::new(),
                ..scope.clone()
            })
        };
        let Some(members) = ScopeMembers::of(self.core.index(), &base) else {
            return map(scope, eligible, None);
        };
        let mut cache = self.pool.cache.mapped.lock();
        let entry = cache.iter_mut().find(|m| m.scope == *base);
        if let Some(m) = &entry
            && m.members == members
            && (Arc::ptr_eq(&m.endpoints, eligible) || *m.endpoints == **eligible)
        {
            return m.pool.clone();
        }
        let pool = map(scope, eligible, Some(&members));
        let fresh = Mapped {
            scope: base.into_owned(),
            members,
            endpoints: eligible.clone(),
            pool: pool.clone(),
        };
        match entry {
            Some(m) => *m = fresh,
            None => cache.push(fresh),
        }
        pool
    }

    /// The index scope of a request for `model`. vLLM serves each LoRA
    /// adapter under its own model name: a name the index has no replicas
    /// for, while the pool's endpoints report a base model, is an adapter
    /// of that base model. A request naming no model (headers only, an
    /// unread body) is scored in the scope the pool's endpoints report, so
    /// their engine-reported load and the picks made for them by prefix
    /// count in its ranking (found once per request, as for an adapter).
    pub(super) fn scope_of(&self, model: String, eligible: &[String]) -> Scope {
        let scope = Scope {
            tenant: self.pool.tenant.clone(),
            model,
            hash_scheme: self.pool.hash_scheme,
            adapter: String::new(),
        };
        let index = self.core.index();
        if !scope.model.is_empty() && index.block_size(&scope).is_some() {
            return scope;
        }
        let base = eligible
            .iter()
            .find_map(|address| index.scope_at(&scope.tenant, scope.hash_scheme, address));
        match base {
            Some(base) if scope.model.is_empty() => base,
            Some(base) if base.model != scope.model => Scope {
                adapter: scope.model,
                ..base
            },
            _ => scope,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ic_index::{HashScheme, Index, IndexConfig, ReplicaKey, Scope};
    use ic_telemetry::MetricsRegistry;

    use super::super::{EndpointPicker, PoolConfig};
    use crate::epp_config::{Objectives, Shedding};
    use crate::index_core::IndexCore;
    use crate::metrics::Metrics;

    const A: &str = "10.0.0.1:8000";
    const B: &str = "10.0.0.2:8000";
    const BODY: &[u8] = br#"{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}"#;

    fn scope() -> Scope {
        Scope {
            tenant: "t".into(),
            model: "m".into(),
            hash_scheme: HashScheme::Vllm,
            adapter: String::new(),
        }
    }

    fn serves(index: &Index, replica_id: &str, address: &str) {
        let key = ReplicaKey {
            tenant: "t".into(),
            replica_id: replica_id.into(),
            dp_rank: 0,
        };
        index.touch(&key, &scope(), address, 1);
    }

    fn picker(endpoints: &[&str]) -> EndpointPicker {
        let registry = MetricsRegistry::new("inferencecache", "test");
        let index = Arc::new(Index::new(IndexConfig::default()));
        let core = IndexCore::new(index, 16, Metrics::register(&registry));
        EndpointPicker::new(
            Arc::new(core),
            PoolConfig {
                tenant: "t".into(),
                name: None,
                watched: false,
                hash_scheme: HashScheme::Vllm,
                endpoints: Arc::new(parking_lot::RwLock::new(
                    endpoints.iter().map(|e| (*e).to_owned()).collect(),
                )),
                shedding: Shedding::default(),
                objectives: Objectives::default(),
                max_body_bytes: 1 << 20,
                fallbacks: 1,
                cache: Arc::default(),
            },
        )
    }

    /// The replica each endpoint of a pick (the pick, then its fallback)
    /// is counted under.
    fn pick(p: &EndpointPicker, subset: Option<&[String]>) -> Vec<String> {
        let pick = p
            .decide("/v1/completions", Some(BODY), subset, 0)
            .expect("a pick");
        assert_eq!(pick.endpoints.len(), pick.replica_ids.len());
        pick.endpoints
            .into_iter()
            .zip(pick.replica_ids)
            .map(|(e, r)| format!("{e}={r}"))
            .collect()
    }

    #[test]
    fn the_pool_s_mapping_follows_its_endpoints_and_the_scope_s_replicas() {
        let p = picker(&[A]);
        let index = p.core.index().clone();
        serves(&index, "engine-a", A);
        serves(&index, "engine-b", B);
        assert_eq!(pick(&p, None), [format!("{A}=engine-a")]);
        // Asked again, the mapping is the one kept.
        let kept = p.pool.cache.mapped.lock()[0].pool.clone();
        assert_eq!(pick(&p, None), [format!("{A}=engine-a")]);
        assert!(Arc::ptr_eq(&kept, &p.pool.cache.mapped.lock()[0].pool));

        // The pool changes: its new endpoint is mapped to its replica.
        *p.pool.endpoints.write() = vec![B.to_owned()];
        assert_eq!(pick(&p, None), [format!("{B}=engine-b")]);
        *p.pool.endpoints.write() = vec![A.to_owned(), B.to_owned()];
        let both = pick(&p, None);
        assert_eq!(both.len(), 2, "the pick and one fallback: {both:?}");
        assert!(both.contains(&format!("{A}=engine-a")), "{both:?}");
        assert!(both.contains(&format!("{B}=engine-b")), "{both:?}");

        // The replicas change: engine-a moves away and engine-n serves at A.
        serves(&index, "engine-a", "10.0.0.9:8000");
        serves(&index, "engine-n", A);
        let subset = [A.to_owned()];
        assert_eq!(pick(&p, Some(&subset)), [format!("{A}=engine-n")]);
        // An endpoint no replica reports is counted under its address.
        serves(&index, "engine-n", "10.0.0.8:8000");
        assert_eq!(pick(&p, Some(&subset)), [format!("{A}={A}")]);
        // One scope, one entry.
        assert_eq!(p.pool.cache.mapped.lock().len(), 1);
    }
}
