//! The webhook's serving certificate in managed mode: [`authority`] decides
//! and issues (pure), [`managed`] keeps the Secret, the served pair and the
//! webhook configurations' `caBundle` in step with it.

pub mod authority;
pub mod managed;

pub use authority::Settings;
pub use managed::{ManagedCertificates, ManagedConfig, ManagedError, SyncReport};
