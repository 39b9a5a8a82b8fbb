//! When each background loop last finished a pass (for `/status` and the
//! `loop_last_pass` gauge).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::clock::Clock;
use crate::metrics::{LoopLabel, MetricsSet};

/// Wall time of each loop's last finished pass.
#[derive(Debug)]
pub struct LoopPasses {
    passes: Mutex<BTreeMap<&'static str, f64>>,
    clock: Arc<dyn Clock>,
    metrics: Arc<MetricsSet>,
}

impl LoopPasses {
    /// No pass recorded yet.
    pub fn new(clock: Arc<dyn Clock>, metrics: Arc<MetricsSet>) -> Self {
        Self {
            passes: Mutex::new(BTreeMap::new()),
            clock,
            metrics,
        }
    }

    /// Marks a finished pass of `name`.
    pub fn pass(&self, name: &'static str) {
        let now = self.clock.unix_seconds();
        self.passes.lock().insert(name, now);
        self.metrics
            .metrics
            .loop_last_pass
            .get_or_create(&LoopLabel { r#loop: name })
            .set(now);
    }

    /// Every loop's last pass.
    pub fn snapshot(&self) -> BTreeMap<&'static str, f64> {
        self.passes.lock().clone()
    }
}
