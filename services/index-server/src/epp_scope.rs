//! Which index replicas and scope a picker's request is scored under: the
//! pool's endpoints mapped to the replicas that report their addresses,
//! and the scope of the request's model (a LoRA adapter under its base
//! model's scope). A child module of `epp`.

use ic_index::{ReplicaKey, Scope};

use super::EndpointPicker;

impl EndpointPicker {
    /// The pool as scored: each endpoint under its index replica's key, or
    /// under its address when the index has not heard from it.
    pub(super) fn scored_pool(
        &self,
        scope: &Scope,
        eligible: &[String],
    ) -> Vec<(ReplicaKey, String)> {
        let base = Scope {
            adapter: String::new(),
            ..scope.clone()
        };
        let known = self.core.index().replicas_in(&base, None, None);
        eligible
            .iter()
            .map(|address| {
                let key = known
                    .iter()
                    .find(|(_, a)| a == address)
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
