//! The views handle: every derived view behind one lock. Only the ingest and
//! persistence handles write; everyone else reads through a closure, so no
//! caller holds the lock across an await or a second lock of its own.
//!
//! Lock order, where two are held: views, then a controller's own state.

use ic_coordinator_core::capacity::CapacityRegistry;
use ic_coordinator_core::directory::KeyDirectory;
use ic_coordinator_core::gate::Gate;
use ic_coordinator_core::kafka::Position;
use ic_coordinator_core::usage::UsageView;
use parking_lot::Mutex;

/// The views every controller reads.
#[derive(Debug, Default)]
pub struct Views {
    /// Admission cursors.
    pub gate: Gate,
    /// Where keys live.
    pub directory: KeyDirectory,
    /// Bytes per tenant and module.
    pub usage: UsageView,
    /// Declared capacity.
    pub capacity: CapacityRegistry,
    /// Kafka records the views include (Kafka transport only). Guarded by
    /// the same lock as the views so the two always agree.
    pub kafka: Position,
}

/// Shared handle to the views; the lock serializes every mutation, so
/// batches apply in order.
#[derive(Debug, Default)]
pub struct ViewStore {
    views: Mutex<Views>,
}

impl ViewStore {
    /// Runs `f` on the views.
    pub fn read<R>(&self, f: impl FnOnce(&Views) -> R) -> R {
        f(&self.views.lock())
    }

    /// Runs `f` on the views, mutably (ingest and restore only).
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut Views) -> R) -> R {
        f(&mut self.views.lock())
    }
}
