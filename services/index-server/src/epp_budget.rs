//! The bytes of request bodies the endpoint picker holds at once, across
//! all its streams: each stream holds a body to read it (up to
//! `--epp-max-body-bytes`), so many large bodies at once could take all of
//! the server's memory. A stream whose next chunk would take the picker
//! past `--epp-max-held-body-bytes` has its request routed by load, its
//! held chunks given back to the gateway at once (counted in
//! `epp_unread_total{reason="held_body_budget"}`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use prometheus_client::metrics::gauge::Gauge;

/// The picker-wide bound and what is held against it.
#[derive(Debug)]
pub struct BodyBudget {
    limit: usize,
    held: AtomicUsize,
    /// `epp_held_body_bytes`.
    gauge: Gauge,
}

impl BodyBudget {
    /// A budget of `limit` bytes, exported through `gauge`.
    pub fn new(limit: usize, gauge: Gauge) -> Self {
        Self {
            limit,
            held: AtomicUsize::new(0),
            gauge,
        }
    }

    /// Bytes held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    fn take(&self, bytes: usize) -> bool {
        let taken = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok();
        if taken {
            self.gauge.inc_by(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
        taken
    }

    fn give_back(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
        self.gauge.dec_by(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
}

/// One stream's share of the budget, given back when released or dropped
/// (a stream the gateway resets gives its share back with it).
#[derive(Debug, Default)]
pub(crate) struct HeldBytes {
    budget: Option<Arc<BodyBudget>>,
    bytes: usize,
}

impl HeldBytes {
    /// A share of `budget`, empty.
    pub(crate) fn of(budget: Arc<BodyBudget>) -> Self {
        Self {
            budget: Some(budget),
            bytes: 0,
        }
    }

    /// Holds `bytes` more; false (nothing taken) when the budget has no
    /// room for them. Without a budget, always true.
    pub(crate) fn grow(&mut self, bytes: usize) -> bool {
        match &self.budget {
            Some(budget) if !budget.take(bytes) => false,
            _ => {
                self.bytes += bytes;
                true
            }
        }
    }

    /// Gives everything held back.
    pub(crate) fn release(&mut self) {
        if let Some(budget) = &self.budget
            && self.bytes > 0
        {
            budget.give_back(self.bytes);
        }
        self.bytes = 0;
    }
}

impl Drop for HeldBytes {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_take_room_until_the_limit_and_give_it_back() {
        let gauge = Gauge::default();
        let budget = Arc::new(BodyBudget::new(100, gauge.clone()));
        let mut a = HeldBytes::of(budget.clone());
        let mut b = HeldBytes::of(budget.clone());
        assert!(a.grow(60));
        assert!(!b.grow(41), "past the limit");
        assert!(b.grow(40));
        assert_eq!((budget.held(), gauge.get()), (100, 100));
        a.release();
        assert_eq!(budget.held(), 40);
        assert!(a.grow(60));
        drop(b);
        assert_eq!((budget.held(), gauge.get()), (60, 60));
        drop(a);
        assert_eq!((budget.held(), gauge.get()), (0, 0));
        // Without a budget: no bound.
        assert!(HeldBytes::default().grow(usize::MAX));
    }
}
