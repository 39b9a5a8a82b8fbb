//! The Events the decisions ask for: those `status` decides on a
//! CacheBackend (worded by `narrate`) and those `observe` decides on engine
//! pods. Kept below all three so none imports another just for the type.

/// Kubernetes Event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

impl EventType {
    /// `Normal` / `Warning`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// An Event to record on the CacheBackend (or, for the engine-pod Events
/// `observe` decides on, on a pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventToRecord {
    /// Normal or Warning.
    pub type_: EventType,
    /// One of `ic_api::consts::events`.
    pub reason: String,
    /// Human-readable note.
    pub message: String,
}
