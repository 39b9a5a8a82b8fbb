//! The views handle: every derived view behind one reader-writer lock. Only
//! the ingest and persistence handles write; everyone else reads through a
//! closure, so no caller holds the lock across an await or a second lock of
//! its own.
//!
//! Two locks, so that a lookup never queues behind a writer for longer than
//! one step of its apply, and never behind a checkpoint's capture:
//!
//! * `change` (a mutex) is held by whoever changes the views, for the whole
//!   of one change — a `POST /events` request, a restore — and by a
//!   checkpoint's capture. A capture therefore sees whole requests, and a
//!   writer that must wait for a capture waits here.
//! * `views` (a reader-writer lock) is taken for writing only for one step
//!   of a change (one batch), by the holder of `change`. Readers take it
//!   shared. At most one thread (the holder of `change`) can ever wait to
//!   write it, so while a capture reads, nobody waits to write and every
//!   reader gets in at once (parking_lot queues new readers behind a waiting
//!   writer, which is why the capture must not leave one waiting here).
//!
//! Lock order, where two are held: `change`, then `views`, then a
//! controller's own state.

use ic_coordinator_core::capacity::CapacityRegistry;
use ic_coordinator_core::directory::KeyDirectory;
use ic_coordinator_core::gate::Gate;
use ic_coordinator_core::kafka::Position;
use ic_coordinator_core::usage::UsageView;
use parking_lot::{Mutex, RwLock};

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

/// Shared handle to the views; changes are serialized, so batches apply in
/// order.
#[derive(Debug, Default)]
pub struct ViewStore {
    change: Mutex<()>,
    views: RwLock<Views>,
}

/// One change in progress (see [`ViewStore::change`]): no other change and
/// no capture runs until it ends; readers get in between its steps.
#[derive(Debug)]
pub struct Change<'a> {
    views: &'a RwLock<Views>,
}

impl Change<'_> {
    /// One step of the change, the views locked for writing while it runs.
    pub fn step<R>(&mut self, f: impl FnOnce(&mut Views) -> R) -> R {
        f(&mut self.views.write())
    }

    /// Reads the views between steps (nothing changes them meanwhile).
    pub fn read<R>(&self, f: impl FnOnce(&Views) -> R) -> R {
        f(&self.views.read())
    }
}

impl ViewStore {
    /// Runs `f` on the views, shared with other readers. Waits for at most
    /// one step of a change; never for a checkpoint's capture.
    pub fn read<R>(&self, f: impl FnOnce(&Views) -> R) -> R {
        f(&self.views.read())
    }

    /// Runs `f` on the views, mutably, as one change of one step.
    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut Views) -> R) -> R {
        self.change(|c| c.step(f))
    }

    /// Runs a change made of several steps ([`Change::step`]): readers see
    /// the views between steps, a capture sees them only before or after
    /// the whole change.
    pub(crate) fn change<R>(&self, f: impl FnOnce(&mut Change<'_>) -> R) -> R {
        let _change = self.change.lock();
        f(&mut Change { views: &self.views })
    }

    /// Runs `f` on the views with no change in progress or beginning until
    /// it returns (a checkpoint's capture), while readers still get in.
    pub(crate) fn read_between_changes<R>(&self, f: impl FnOnce(&Views) -> R) -> R {
        let _change = self.change.lock();
        f(&self.views.read())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::Barrier;

    /// A reader gets in while a capture holds the views and a writer waits
    /// for it (with one lock, or a writer left waiting on the views lock,
    /// the reader would queue behind both).
    #[test]
    fn a_reader_gets_in_during_a_capture_with_a_writer_waiting() {
        let store = Arc::new(ViewStore::default());
        let capturing = Arc::new(Barrier::new(2));
        let release = Arc::new(Barrier::new(2));
        let capture = {
            let (store, capturing, release) = (store.clone(), capturing.clone(), release.clone());
            std::thread::spawn(move || {
                store.read_between_changes(|_| {
                    capturing.wait();
                    release.wait();
                })
            })
        };
        capturing.wait();
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || store.write(|v| v.directory.set_max_keys(Some(7))))
        };
        // The writer is blocked on `change`; the reader answers anyway.
        let bound = store.read(|v| v.directory.max_keys());
        assert_eq!(
            bound, None,
            "the writer must not have run during the capture"
        );
        release.wait();
        capture.join().unwrap();
        writer.join().unwrap();
        assert_eq!(store.read(|v| v.directory.max_keys()), Some(7));
    }

    /// A reader gets in between two steps of one change.
    #[test]
    fn a_reader_gets_in_between_steps() {
        let store = Arc::new(ViewStore::default());
        let stepped = Arc::new(Barrier::new(2));
        let release = Arc::new(Barrier::new(2));
        let writer = {
            let (store, stepped, release) = (store.clone(), stepped.clone(), release.clone());
            std::thread::spawn(move || {
                store.change(|c| {
                    c.step(|v| v.directory.set_max_keys(Some(1)));
                    stepped.wait();
                    release.wait();
                    c.step(|v| v.directory.set_max_keys(Some(2)));
                })
            })
        };
        stepped.wait();
        assert_eq!(store.read(|v| v.directory.max_keys()), Some(1));
        release.wait();
        writer.join().unwrap();
        assert_eq!(store.read(|v| v.directory.max_keys()), Some(2));
    }
}
