//! Building a condition list from verdicts with Kubernetes semantics:
//! lastTransitionTime moves only when the status value changes; reason and
//! message follow the verdict. Conditions are kept in one canonical order so
//! equal statuses compare equal.

use ic_api::consts::conditions as types;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::clock::{self, Timestamp};

/// Publication order of the CacheBackend condition types.
pub const ORDER: [&str; 7] = [
    types::READY,
    types::DEGRADED,
    types::PROGRESSING,
    types::FUNCTIONAL_PROBE_OK,
    types::ENGINE_KERNELS_HEALTHY,
    types::T2_DEGRADED,
    types::ENGINE_COMPATIBILITY,
];

/// The condition of `type_` in `list`.
pub fn find<'a>(list: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    list.iter().find(|c| c.type_ == type_)
}

/// Accumulates this reconcile's conditions against the previous list.
#[derive(Debug)]
pub struct Builder<'a> {
    previous: &'a [Condition],
    now: Timestamp,
    generation: Option<i64>,
    out: Vec<Condition>,
}

impl<'a> Builder<'a> {
    /// A builder over the previous conditions.
    pub fn new(previous: &'a [Condition], now: Timestamp, generation: Option<i64>) -> Self {
        Self {
            previous,
            now,
            generation,
            out: Vec::new(),
        }
    }

    /// Publishes `type_` with `(status, reason, message)`.
    pub fn set(&mut self, type_: &str, status: &str, reason: &str, message: impl Into<String>) {
        let prev = find(self.previous, type_);
        let last_transition_time = match prev {
            Some(p) if p.status == status => p.last_transition_time.clone(),
            _ => clock::to_time(self.now),
        };
        self.out.retain(|c| c.type_ != type_);
        self.out.push(Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message: message.into(),
            observed_generation: self.generation,
            last_transition_time,
        });
    }

    /// Keeps the previous condition of `type_` unchanged, if any.
    pub fn keep(&mut self, type_: &str) {
        if let Some(prev) = find(self.previous, type_) {
            self.out.retain(|c| c.type_ != type_);
            self.out.push(prev.clone());
        }
    }

    /// The list in canonical order: CacheBackend types in [`ORDER`], any
    /// other type (other kinds reuse this builder) after them in insertion
    /// order. Only what was `set` or `kept` is in the list: the controller
    /// owns the whole list, so a type not re-published is removed.
    pub fn finish(mut self) -> Vec<Condition> {
        self.out.sort_by_key(|c| {
            ORDER
                .iter()
                .position(|t| *t == c.type_)
                .unwrap_or(ORDER.len())
        });
        self.out
    }
}

/// Whether two condition lists say the same thing (order-insensitive).
pub fn same(a: &[Condition], b: &[Condition]) -> bool {
    a.len() == b.len() && a.iter().all(|c| find(b, &c.type_) == Some(c))
}
