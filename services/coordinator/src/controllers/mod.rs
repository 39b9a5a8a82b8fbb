//! Built-in controllers.

pub mod eviction;
pub mod prefetch;

use std::sync::Arc;

use crate::controller::Controller;
use crate::state::Settings;

pub use eviction::FleetEvictionController;
pub use prefetch::PrefetchManager;

/// Every built-in controller, enabled by default.
pub fn builtins(settings: &Settings) -> Vec<Arc<dyn Controller>> {
    vec![
        Arc::new(FleetEvictionController::new(
            settings.eviction,
            settings.eviction_check_interval,
        )),
        Arc::new(PrefetchManager),
    ]
}
