//! Built-in controllers.

pub mod eviction;
pub mod prefetch;

use std::sync::Arc;

use crate::controller::Controller;
use crate::settings::Settings;

pub use eviction::FleetEvictionController;
pub use prefetch::PrefetchManager;

/// The built-in controllers, enabled by default: as trait objects for the
/// coordinator, and the eviction controller by its type as well (for the
/// callers that need its state: tests, tools).
#[derive(Debug)]
pub struct Builtins {
    /// The eviction controller.
    pub eviction: Arc<FleetEvictionController>,
    /// Every built-in, in registration order.
    pub all: Vec<Arc<dyn Controller>>,
}

/// Every built-in controller.
pub fn builtins(settings: &Settings) -> Builtins {
    let eviction = Arc::new(FleetEvictionController::new(
        settings.eviction,
        settings.eviction_check_interval,
    ));
    Builtins {
        all: vec![eviction.clone(), Arc::new(PrefetchManager)],
        eviction,
    }
}
