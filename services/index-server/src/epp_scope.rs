//! Which index replicas and scope a picker's request is scored under: the
//! pool's endpoints mapped to the replicas that report their addresses,
//! and the scope of the request's model (a LoRA adapter under its base
//! model's scope). A child module of `epp`.
//!
//! The mapping is kept per pool and scope between requests ([`PoolCache`])
//! and rebuilt only when the scope's replicas (who, or where they serve)
//! change; the pool as scored is kept for the full pool and for the last
//! gateway subset, so requests alternating the two reuse both. A subset is
//! narrowed through a set of the pool's endpoints, kept while they do not
//! change.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ic_index::route::ScopeMembers;
use ic_index::{ReplicaKey, Scope};
use parking_lot::Mutex;

use super::{EndpointPicker, NoEndpoint};

/// The pool as scored: each endpoint under its index replica's key (or its
/// address, when the index has not heard from it), in the pool's order.
pub(crate) type ScoredPool = Arc<[(ReplicaKey, String)]>;

/// What a pool's picks reuse: its endpoints as last read (with the last
/// gateway subset narrowed to them), and per replica scope the addresses
/// mapped to its replicas. Holds one entry per scope the index knows in the
/// pool's namespace at most (a scope the index has no replicas of is mapped
/// afresh, cheaply, and not kept).
#[derive(Debug, Default)]
pub struct PoolCache {
    endpoints: Mutex<Option<Listed>>,
    mapped: Mutex<Vec<Mapped>>,
    /// Times a scope's replicas were mapped to addresses (tests read it).
    mappings_built: AtomicU64,
}

/// The pool's endpoints as last read.
#[derive(Debug)]
struct Listed {
    list: Arc<[String]>,
    set: HashSet<String>,
    /// The last subset the gateway sent, and it narrowed to the pool.
    subset: Option<(Vec<String>, Arc<[String]>)>,
}

#[derive(Debug)]
struct Mapped {
    scope: Scope,
    members: ScopeMembers,
    /// Each address to the first replica serving there.
    keys: HashMap<String, ReplicaKey>,
    /// The last two eligible lists scored (the full pool and a subset),
    /// most recent first.
    scored: [Option<(Arc<[String]>, ScoredPool)>; 2],
}

impl PoolCache {
    /// The endpoints `current` holds narrowed by `subset`, shared: the same
    /// list while neither changes.
    fn eligible(&self, current: &[String], subset: Option<&[String]>) -> Arc<[String]> {
        let mut last = self.endpoints.lock();
        let listed = match last.take() {
            Some(l) if *l.list == *current => l,
            _ => Listed {
                list: Arc::from(current),
                set: current.iter().cloned().collect(),
                subset: None,
            },
        };
        let listed = last.insert(listed);
        let Some(subset) = subset else {
            return listed.list.clone();
        };
        if let Some((sent, narrowed)) = &listed.subset
            && **sent == *subset
        {
            return narrowed.clone();
        }
        // The subset narrows the pool: the gateway knows which endpoints
        // are healthy for it right now.
        let narrowed: Arc<[String]> = subset
            .iter()
            .filter(|e| listed.set.contains(e.as_str()))
            .cloned()
            .collect();
        listed.subset = Some((subset.to_vec(), narrowed.clone()));
        narrowed
    }

    /// Times a scope's replicas were mapped to addresses.
    #[cfg(test)]
    fn mappings_built(&self) -> u64 {
        self.mappings_built.load(Ordering::Relaxed)
    }
}

/// Each address of `members` to the first replica serving there.
fn keys(members: &ScopeMembers) -> HashMap<String, ReplicaKey> {
    let mut keys = HashMap::new();
    for (key, address) in members.iter() {
        keys.entry(address.to_owned())
            .or_insert_with(|| key.clone());
    }
    keys
}

/// `eligible` keyed by the replicas serving at each address (`keys`).
fn map(
    scope: &Scope,
    eligible: &[String],
    keys: Option<&HashMap<String, ReplicaKey>>,
) -> ScoredPool {
    eligible
        .iter()
        .map(|address| {
            let key = keys
                .and_then(|k| k.get(address))
                .cloned()
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
        let eligible = self.pool.cache.eligible(&endpoints, subset);
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
        let at = match cache.iter().position(|m| m.scope == *base) {
            Some(at) if cache[at].members == members => at,
            found => {
                self.pool
                    .cache
                    .mappings_built
                    .fetch_add(1, Ordering::Relaxed);
                let fresh = Mapped {
                    scope: base.into_owned(),
                    keys: keys(&members),
                    members,
                    scored: [None, None],
                };
                match found {
                    Some(at) => {
                        cache[at] = fresh;
                        at
                    }
                    None => {
                        cache.push(fresh);
                        cache.len() - 1
                    }
                }
            }
        };
        let entry = &mut cache[at];
        let hit = entry.scored.iter().position(|s| {
            s.as_ref()
                .is_some_and(|(e, _)| Arc::ptr_eq(e, eligible) || **e == **eligible)
        });
        if let Some(i) = hit {
            entry.scored[..=i].rotate_right(1);
            if let Some((_, pool)) = &entry.scored[0] {
                return pool.clone();
            }
        }
        let pool = map(scope, eligible, Some(&entry.keys));
        entry.scored.rotate_right(1);
        entry.scored[0] = Some((eligible.clone(), pool.clone()));
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
pub(super) mod tests {
    use std::sync::Arc;

    use ic_index::{HashScheme, Index, IndexConfig, ReplicaKey, Scope};
    use ic_telemetry::MetricsRegistry;

    use super::super::{EndpointPicker, PoolConfig};
    use crate::epp_config::{DEFAULT_INLINE_TOKENIZE_BYTES, Objectives, Shedding};
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

    /// A picker over `endpoints` with an empty index and no tokenizer.
    pub(in crate::epp) fn picker(endpoints: &[&str]) -> EndpointPicker {
        counted_picker(endpoints).0
    }

    /// [`picker`] and the registry its metrics are counted in.
    pub(in crate::epp) fn counted_picker(endpoints: &[&str]) -> (EndpointPicker, MetricsRegistry) {
        let registry = MetricsRegistry::new("inferencecache", "test");
        let index = Arc::new(Index::new(IndexConfig::default()));
        let core = IndexCore::new(index, 16, Metrics::register(&registry));
        let picker = EndpointPicker::new(
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
                max_held_body_bytes: 1 << 24,
                fallbacks: 1,
                inline_tokenize_bytes: DEFAULT_INLINE_TOKENIZE_BYTES,
                cache: Arc::default(),
            },
        );
        (picker, registry)
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
        let scored = |p: &EndpointPicker| p.pool.cache.mapped.lock()[0].scored[0].clone();
        let kept = scored(&p).expect("scored").1;
        assert_eq!(pick(&p, None), [format!("{A}=engine-a")]);
        assert!(Arc::ptr_eq(&kept, &scored(&p).expect("scored").1));
        assert_eq!(p.pool.cache.mappings_built(), 1);

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

    /// The gateway's subset narrows the pool (an endpoint outside it is
    /// dropped), and requests alternating the subset and the full pool
    /// reuse the mapping and both scored lists instead of rebuilding them.
    #[test]
    fn a_subset_narrows_the_pool_and_alternating_requests_reuse_the_mapping() {
        const C: &str = "10.0.0.3:8000";
        let p = picker(&[A, B, C]);
        let index = p.core.index().clone();
        serves(&index, "engine-a", A);
        serves(&index, "engine-b", B);
        serves(&index, "engine-c", C);
        let subset = [B.to_owned(), "10.0.0.99:8000".to_owned()];
        let other = [C.to_owned()];
        for _ in 0..5 {
            assert_eq!(pick(&p, Some(&subset)), [format!("{B}=engine-b")]);
            let full = pick(&p, None);
            assert_eq!(full.len(), 2, "the pick and one fallback: {full:?}");
        }
        assert_eq!(p.pool.cache.mappings_built(), 1);
        // The narrowed subset is one list, kept while the gateway sends it.
        let narrowed = p.eligible(Some(&subset)).expect("eligible");
        assert_eq!(*narrowed, [B.to_owned()]);
        assert!(Arc::ptr_eq(
            &narrowed,
            &p.eligible(Some(&subset)).expect("eligible")
        ));
        // Another subset is scored from the same mapping.
        assert_eq!(pick(&p, Some(&other)), [format!("{C}=engine-c")]);
        assert_eq!(p.pool.cache.mappings_built(), 1);
        // A replica moving maps the scope again, once.
        serves(&index, "engine-n", B);
        serves(&index, "engine-b", "10.0.0.9:8000");
        assert_eq!(pick(&p, Some(&subset)), [format!("{B}=engine-n")]);
        pick(&p, None);
        assert_eq!(p.pool.cache.mappings_built(), 2);
        // No endpoint of the subset in the pool: refused, naming why.
        let outside = ["10.0.0.99:8000".to_owned()];
        assert!(p.eligible(Some(&outside)).is_err());
    }
}
