//! Controllers: pluggable policies over the shared views.
//!
//! A controller is a trait object with optional roles: it may consume the
//! admitted event stream, keep durable state (checkpoint or metadata
//! sections), serve HTTP routes and run a background loop. Built-ins are
//! registered by name; `--extra-config` disables them by name, and a name
//! that matches nothing stops the coordinator at boot.
//!
//! Controllers see the coordinator through a [`Context`] of handles (views,
//! registry, actions, metrics, loops, and a sink for operator intent), never
//! through the coordinator itself: the coordinator depends on controllers,
//! not the other way round.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use ic_coordinator_core::checkpoint::Sections;
use ic_coordinator_core::events::Batch;
use ic_coordinator_core::metadata::Metadata;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::actions::Actions;
use crate::clock::Clock;
use crate::loops::LoopPasses;
use crate::metrics::MetricsSet;
use crate::registry::Instances;
use crate::settings::Settings;
use crate::views::{ViewStore, Views};

/// A boxed background task.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Told when a controller's operator intent (quotas, pins) changed, so the
/// metadata file is rewritten. Blocking (it fsyncs): call it off the async
/// workers.
pub trait IntentSink: Send + Sync + Debug {
    /// Persists every controller's intent now.
    fn intent_changed(&self);
}

/// What a controller may use of the coordinator.
#[derive(Clone, Debug)]
pub struct Context {
    /// Resolved flags.
    pub settings: Arc<Settings>,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// The views (read-only to controllers).
    pub views: Arc<ViewStore>,
    /// Registered instances.
    pub instances: Arc<Instances>,
    /// Outbound calls to MP servers.
    pub actions: Arc<Actions>,
    /// Metrics.
    pub metrics: Arc<MetricsSet>,
    /// Loop pass bookkeeping.
    pub loops: Arc<LoopPasses>,
    /// Where intent changes are reported.
    pub intent: Arc<dyn IntentSink>,
}

impl Context {
    /// Persists operator intent off the async workers.
    pub async fn persist_intent(&self) {
        let intent = self.intent.clone();
        if let Err(error) = tokio::task::spawn_blocking(move || intent.intent_changed()).await {
            tracing::error!(%error, "metadata write task failed");
        }
    }
}

/// A controller failed to apply a batch.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConsumeError(pub String);

/// A policy plugged into the coordinator. Every method but `name` is an
/// optional role with a do-nothing default.
pub trait Controller: Send + Sync + Debug {
    /// Stable name, used by `disabled_controllers`.
    fn name(&self) -> &'static str;

    /// Whether [`Controller::consume`] should receive admitted batches.
    fn consumes_events(&self) -> bool {
        false
    }

    /// Applies one admitted batch, after the views applied it.
    fn consume(&self, _batch: &Batch, _views: &Views) -> Result<(), ConsumeError> {
        Ok(())
    }

    /// The instance restarted or left: drop its L1 state.
    fn fence(&self, _instance_id: &str) {}

    /// Forgets keys the directory dropped for its bound
    /// (`--max-directory-keys`), so no view outgrows it.
    fn forget(&self, _keys: &[ic_coordinator_core::key::SharedKey]) {}

    /// HTTP routes this controller owns (they disappear when it is disabled).
    fn routes(self: Arc<Self>, _ctx: Context) -> Option<Router> {
        None
    }

    /// Adds its derived state to a checkpoint.
    fn save_checkpoint(&self, _sections: &mut Sections) {}

    /// Restores its derived state from a checkpoint; `views` are already
    /// restored, so it can share their copies of the keys.
    fn restore_checkpoint(&self, _sections: &Sections, _views: &Views) {}

    /// Adds its operator intent to the metadata document.
    fn save_metadata(&self, _meta: &mut Metadata) {}

    /// Restores its operator intent.
    fn restore_metadata(&self, _meta: &Metadata) {}

    /// Background work, started after boot and stopped by `shutdown`.
    fn run(self: Arc<Self>, _ctx: Context, _shutdown: CancellationToken) -> Option<Task> {
        None
    }

    /// Brings its scrape-time gauges up to date (called on every
    /// `/metrics` scrape, without the views lock held).
    fn refresh_metrics(&self, _ctx: &Context) {}

    /// A JSON snapshot for `/status`.
    fn status(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}

/// The parts of `--extra-config` the coordinator itself reads. Other keys
/// are controller settings and are ignored here.
#[derive(Debug, Default, Deserialize)]
pub struct ExtraConfig {
    /// Packages to load controllers from (Python in the reference).
    #[serde(default)]
    pub controller_packages: Vec<String>,
    /// Built-in controllers to switch off.
    #[serde(default)]
    pub disabled_controllers: Vec<String>,
}

/// A bad `--extra-config`.
#[derive(Debug, thiserror::Error)]
pub enum ExtraConfigError {
    /// Not a JSON object of the expected shape.
    #[error("--extra-config is not valid: {0}")]
    Json(#[from] serde_json::Error),
    /// Controller packages cannot be loaded into this binary.
    #[error(
        "--extra-config controller_packages {0:?}: this coordinator cannot load controller packages; controllers are compiled in (built-ins: {1})"
    )]
    Packages(Vec<String>, String),
    /// A disabled name matches no controller.
    #[error("--extra-config disabled_controllers names unknown controller {0:?} (known: {1})")]
    UnknownController(String, String),
}

impl ExtraConfig {
    /// Parses the flag value (absent = defaults).
    pub fn parse(raw: Option<&str>) -> Result<Self, ExtraConfigError> {
        match raw.map(str::trim) {
            None | Some("") => Ok(Self::default()),
            Some(text) => Ok(serde_json::from_str(text)?),
        }
    }

    /// Keeps the enabled controllers, failing on names that match nothing.
    pub fn select(
        &self,
        all: Vec<Arc<dyn Controller>>,
    ) -> Result<Vec<Arc<dyn Controller>>, ExtraConfigError> {
        let known: Vec<&'static str> = all.iter().map(|c| c.name()).collect();
        let known_list = known.join(", ");
        if !self.controller_packages.is_empty() {
            return Err(ExtraConfigError::Packages(
                self.controller_packages.clone(),
                known_list,
            ));
        }
        if let Some(unknown) = self
            .disabled_controllers
            .iter()
            .find(|d| !known.contains(&d.as_str()))
        {
            return Err(ExtraConfigError::UnknownController(
                unknown.clone(),
                known_list,
            ));
        }
        Ok(all
            .into_iter()
            .filter(|c| !self.disabled_controllers.iter().any(|d| d == c.name()))
            .collect())
    }
}
