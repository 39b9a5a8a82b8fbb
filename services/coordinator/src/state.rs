//! The coordinator: the handles wired together. Each owns one concern and
//! depends only on those above it (docs/architecture.md, "The coordinator's
//! handles"):
//!
//! ```text
//! settings · clock · metrics · kafka_state      leaves
//! views                registry ── actions
//!   └──── controller::Context (views, registry, actions, loops, intent)
//!           └── controllers (eviction, prefetch, extra)
//! ingest (views, controllers)   persistence (views, controllers)
//! state::Coordinator (all)  ◄── http, kafka, lib
//! ```
//!
//! HTTP handlers and the Kafka consumer call the handles; the two operations
//! that span two of them (deregistration, the liveness sweep) live here.

use std::sync::Arc;

use crate::actions::Actions;
use crate::clock::Clock;
use crate::controller::{Context, Controller};
use crate::controllers::FleetEvictionController;
use crate::ingest::Ingest;
use crate::kafka_state::{KafkaState, KafkaStatus};
use crate::loops::LoopPasses;
use crate::metrics::{ControllerLabel, MetricsSet};
use crate::persistence::Persistence;
use crate::registry::Instances;
use crate::settings::Settings;
use crate::views::ViewStore;

/// Shared handle to the coordinator.
pub type App = Arc<Coordinator>;

/// The coordinator.
#[derive(Debug)]
pub struct Coordinator {
    /// Resolved flags.
    pub settings: Arc<Settings>,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// The derived views (read here; written by ingest and restore).
    pub views: Arc<ViewStore>,
    /// Registered instances.
    pub instances: Arc<Instances>,
    /// Outbound calls to MP servers.
    pub actions: Arc<Actions>,
    /// The write path of cache events.
    pub ingest: Ingest,
    /// Checkpoint and metadata files.
    pub persistence: Arc<Persistence>,
    /// Enabled controllers, in registration order.
    pub controllers: Arc<[Arc<dyn Controller>]>,
    /// The eviction controller by its type, when enabled (its state is read
    /// by tests and tools; controllers never reach each other through this).
    pub eviction: Option<Arc<FleetEvictionController>>,
    /// Metrics.
    pub metrics: Arc<MetricsSet>,
    /// Loop pass bookkeeping.
    pub loops: Arc<LoopPasses>,
    /// Consumer status (Kafka transport only).
    pub kafka: Option<KafkaState>,
}

impl Coordinator {
    /// Builds the coordinator (restore happens separately, before serving).
    pub fn new(
        settings: Settings,
        clock: Arc<dyn Clock>,
        controllers: Vec<Arc<dyn Controller>>,
        eviction: Option<Arc<FleetEvictionController>>,
        metrics: MetricsSet,
    ) -> anyhow::Result<Self> {
        for c in &controllers {
            metrics
                .metrics
                .controller_up
                .get_or_create(&ControllerLabel {
                    controller: c.name(),
                })
                .set(1);
        }
        let settings = Arc::new(settings);
        let metrics = Arc::new(metrics);
        let controllers: Arc<[Arc<dyn Controller>]> = controllers.into();
        let views = Arc::new(ViewStore::default());
        views.write(|v| v.directory.set_max_keys(settings.max_directory_keys));
        let instances = Arc::new(Instances::new(clock.clone()));
        let actions = Arc::new(Actions::new(
            instances.clone(),
            metrics.clone(),
            settings.mp_timeout,
        ));
        let ingest = Ingest::new(
            views.clone(),
            controllers.clone(),
            metrics.clone(),
            settings.max_pending_event_requests,
        )
        .map_err(|e| anyhow::anyhow!("cannot start the event writer thread: {e}"))?;
        let persistence = Arc::new(Persistence::new(
            settings.clone(),
            clock.clone(),
            views.clone(),
            controllers.clone(),
            metrics.clone(),
        ));
        let loops = Arc::new(LoopPasses::new(clock.clone(), metrics.clone()));
        let kafka = settings.kafka.as_ref().map(|_| KafkaState::default());
        Ok(Self {
            settings,
            clock,
            views,
            instances,
            actions,
            ingest,
            persistence,
            controllers,
            eviction,
            metrics,
            loops,
            kafka,
        })
    }

    /// The handles a controller gets.
    pub fn context(&self) -> Context {
        Context {
            settings: self.settings.clone(),
            clock: self.clock.clone(),
            views: self.views.clone(),
            instances: self.instances.clone(),
            actions: self.actions.clone(),
            metrics: self.metrics.clone(),
            loops: self.loops.clone(),
            intent: self.persistence.clone(),
        }
    }

    /// Explicit deregistration: the instance, its stream and its capacity
    /// declaration go. True when it was registered.
    pub async fn deregister(&self, instance_id: &str) -> bool {
        let was = self.instances.deregister(instance_id);
        self.ingest.drop_stream(instance_id, true).await;
        was
    }

    /// One liveness pass: deregisters silent instances and drops their
    /// streams (declarations are kept). Returns the removed ids.
    pub async fn sweep_liveness(&self) -> Vec<String> {
        let expired = self.instances.expire(self.settings.instance_timeout);
        for id in &expired {
            tracing::warn!(instance_id = %id, "instance missed its heartbeats; removing it");
            self.ingest.drop_stream(id, false).await;
            self.metrics.metrics.instances_expired.inc();
        }
        expired
    }

    /// Runs `f` on the Kafka consumer status (a no-op default when the
    /// transport is HTTP).
    pub fn kafka_status<R: Default>(&self, f: impl FnOnce(&mut KafkaStatus) -> R) -> R {
        self.kafka
            .as_ref()
            .map(|k| f(&mut k.status.lock()))
            .unwrap_or_default()
    }
}
