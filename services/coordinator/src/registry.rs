//! The registry handle: which MP servers are registered and when each last
//! spoke. Independent of the views: no method holds both locks, and every
//! answer is owned data.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ic_coordinator_core::registry::{InstanceRecord, Registry};
use parking_lot::Mutex;

use crate::clock::Clock;

/// Registered instances, timed by the monotonic clock.
#[derive(Debug)]
pub struct Instances {
    registry: Mutex<Registry>,
    clock: Arc<dyn Clock>,
}

impl Instances {
    /// An empty registry.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            registry: Mutex::new(Registry::new()),
            clock,
        }
    }

    /// Registers (or re-registers) an instance; true when it was known.
    pub fn register(&self, record: InstanceRecord) -> bool {
        let now = self.clock.monotonic();
        self.registry.lock().register(record, now)
    }

    /// Records a heartbeat; false for an unknown instance.
    pub fn heartbeat(&self, id: &str) -> bool {
        let now = self.clock.monotonic();
        self.registry.lock().heartbeat(id, now)
    }

    /// Removes an instance; true when it was registered.
    pub fn deregister(&self, id: &str) -> bool {
        self.registry.lock().deregister(id)
    }

    /// Removes instances silent for longer than `timeout`; their ids.
    pub fn expire(&self, timeout: Duration) -> Vec<String> {
        let now = self.clock.monotonic();
        self.registry.lock().expire(now, timeout)
    }

    /// Whether `id` is registered.
    pub fn contains(&self, id: &str) -> bool {
        self.registry.lock().contains(id)
    }

    /// How many are registered.
    pub fn len(&self) -> usize {
        self.registry.lock().len()
    }

    /// Whether none is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ids currently registered.
    pub fn ids(&self) -> BTreeSet<String> {
        self.registry
            .lock()
            .records()
            .map(|r| r.instance_id.clone())
            .collect()
    }

    /// Every record, in registry order.
    pub fn records(&self) -> Vec<InstanceRecord> {
        self.registry.lock().records().cloned().collect()
    }

    /// The HTTP base URL of a registered instance.
    pub fn base_url(&self, id: &str) -> Option<String> {
        self.registry.lock().get(id).map(InstanceRecord::base_url)
    }

    /// One registered instance at random: its id and base URL.
    pub fn pick_random(&self) -> Option<(String, String)> {
        let registry = self.registry.lock();
        let records: Vec<&InstanceRecord> = registry.records().collect();
        if records.is_empty() {
            return None;
        }
        let pick = records[fastrand::usize(..records.len())];
        Some((pick.instance_id.clone(), pick.base_url()))
    }

    /// Seconds since each instance's last heartbeat.
    pub fn heartbeat_ages(&self) -> Vec<(String, f64)> {
        let now = self.clock.monotonic();
        self.registry
            .lock()
            .heartbeat_ages(now)
            .map(|(id, age)| (id.to_owned(), age.as_secs_f64()))
            .collect()
    }
}
