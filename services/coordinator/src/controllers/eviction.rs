//! `FleetEvictionController`: per-tenant L2 quotas enforced by LRU eviction,
//! refcounted pins, and targeted deletes that respect them. It owns
//! `/quota*`, `/cache/pins` and `/cache/delete`; disabling it removes them.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post, put};
use ic_coordinator_core::checkpoint::Sections;
use ic_coordinator_core::events::Batch;
use ic_coordinator_core::eviction::{EvictionPlan, EvictionSettings, Quotas, plan};
use ic_coordinator_core::key::ObjectKey;
use ic_coordinator_core::metadata::Metadata;
use ic_coordinator_core::pins::Pins;
use parking_lot::Mutex;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::controller::{ConsumeError, Context, Controller, Task};
use crate::http::compat::no_allow;
use crate::metrics::{ReasonLabel, SaltLabel};
use crate::views::Views;

mod routes;

/// Most keys in one `DELETE /cache/objects` (the node's own cap).
pub const MAX_KEYS_PER_DELETE: usize = 10_000;

/// Policy state private to the controller.
#[derive(Debug, Default)]
pub struct EvictionState {
    /// L2 keys in the LRU order the key directory keeps, as of the last
    /// batch (for `/status`).
    pub tracked_keys: usize,
    /// Quotas.
    pub quotas: Quotas,
    /// Pins.
    pub pins: Pins,
}

/// The controller.
#[derive(Debug)]
pub struct FleetEvictionController {
    /// Its state; lock order is views, then this.
    pub state: Mutex<EvictionState>,
    settings: EvictionSettings,
    interval: Option<Duration>,
}

/// What one sweep did (for tests and logs).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Keys selected.
    pub selected: usize,
    /// Instance the deletes went to.
    pub target: Option<String>,
    /// Delete requests that failed.
    pub failed_requests: usize,
}

impl FleetEvictionController {
    /// A controller with the given sweep settings.
    pub fn new(settings: EvictionSettings, interval: Option<Duration>) -> Self {
        Self {
            state: Mutex::new(EvictionState::default()),
            settings,
            interval,
        }
    }

    /// One sweep: plan victims, then send them to one random registered
    /// instance. Fire-and-forget: an unanswered eviction is re-planned next
    /// sweep because the LRU clears only on the node's delete events.
    pub async fn sweep(&self, ctx: &Context) -> SweepReport {
        let m = &ctx.metrics.metrics;
        let plan: EvictionPlan = ctx.views.read(|views| {
            let state = self.state.lock();
            self.refresh_quota_gauges(ctx, views, &state);
            plan(
                &views.directory,
                &views.usage,
                &state.quotas,
                &state.pins,
                self.settings,
            )
        });
        m.eviction_sweeps.inc();
        m.eviction_skipped
            .get_or_create(&ReasonLabel { reason: "pinned" })
            .inc_by(plan.skipped_pinned);
        let mut report = SweepReport {
            selected: plan.victims.len(),
            ..SweepReport::default()
        };
        if plan.victims.is_empty() {
            return report;
        }
        m.eviction_selected.inc_by(plan.victims.len() as u64);
        let Some((id, base)) = ctx.instances.pick_random() else {
            m.eviction_skipped
                .get_or_create(&ReasonLabel {
                    reason: "no_instance",
                })
                .inc_by(plan.victims.len() as u64);
            tracing::warn!(
                keys = plan.victims.len(),
                "eviction selected keys but no instance is registered"
            );
            return report;
        };
        for chunk in plan.victims.chunks(MAX_KEYS_PER_DELETE) {
            let keys: Vec<_> = chunk.iter().map(ObjectKey::to_wire).collect();
            if let Err(error) = ctx
                .actions
                .delete_objects("evict", &base, &json!({ "keys": keys }))
                .await
            {
                tracing::warn!(instance_id = %id, %error, keys = chunk.len(), "eviction delete failed");
                report.failed_requests += 1;
            }
        }
        tracing::info!(instance_id = %id, keys = plan.victims.len(), "eviction sweep dispatched deletes");
        report.target = Some(id);
        report
    }

    fn refresh_quota_gauges(&self, ctx: &Context, views: &Views, state: &EvictionState) {
        let m = &ctx.metrics.metrics;
        m.quota_used_bytes.clear();
        m.quota_limit_bytes.clear();
        for (salt, limit) in &state.quotas.limits {
            let label = SaltLabel {
                cache_salt: salt.clone(),
            };
            let used = views
                .usage
                .salt_bytes(ic_coordinator_core::StorageLevel::L2, salt);
            m.quota_used_bytes
                .get_or_create(&label)
                .set(i64::try_from(used).unwrap_or(i64::MAX));
            m.quota_limit_bytes
                .get_or_create(&label)
                .set(i64::try_from(*limit).unwrap_or(i64::MAX));
        }
        m.pinned_keys
            .set(i64::try_from(state.pins.len()).unwrap_or(i64::MAX));
    }
}

impl Controller for FleetEvictionController {
    fn name(&self) -> &'static str {
        "FleetEvictionController"
    }

    fn consumes_events(&self) -> bool {
        true
    }

    fn consume(&self, _batch: &Batch, views: &Views) -> Result<(), ConsumeError> {
        // The directory keeps the LRU (and drops the keys it lets go).
        self.state.lock().tracked_keys = views.directory.lru_len();
        Ok(())
    }

    fn routes(self: Arc<Self>, ctx: Context) -> Option<Router> {
        let state = (ctx, self);
        Some(
            Router::new()
                .route("/quota", no_allow(get(routes::list_quotas)))
                .route(
                    "/quota/config",
                    no_allow(
                        put(routes::put_default)
                            .get(routes::get_default)
                            .delete(routes::delete_config_salt),
                    ),
                )
                .route(
                    "/quota/{cache_salt}",
                    no_allow(
                        put(routes::put_quota)
                            .get(routes::get_quota)
                            .delete(routes::delete_quota),
                    ),
                )
                .route(
                    "/cache/pins",
                    no_allow(
                        post(routes::pin)
                            .delete(routes::unpin)
                            .get(routes::list_pins),
                    ),
                )
                .route("/cache/delete", no_allow(post(routes::delete)))
                .with_state(state),
        )
    }

    fn restore_checkpoint(&self, _sections: &Sections, views: &Views) {
        // The LRU order is the directory's, restored with it.
        self.state.lock().tracked_keys = views.directory.lru_len();
    }

    fn save_metadata(&self, meta: &mut Metadata) {
        let state = self.state.lock();
        meta.pins = state.pins.clone();
        meta.quotas = state.quotas.clone();
    }

    fn restore_metadata(&self, meta: &Metadata) {
        let mut state = self.state.lock();
        state.pins = meta.pins.clone();
        state.quotas = meta.quotas.clone();
    }

    fn run(self: Arc<Self>, ctx: Context, shutdown: CancellationToken) -> Option<Task> {
        let interval = self.interval?;
        Some(Box::pin(async move {
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(interval) => {}
                }
                self.sweep(&ctx).await;
                ctx.loops.pass("eviction");
            }
        }))
    }

    fn refresh_metrics(&self, ctx: &Context) {
        ctx.views.read(|views| {
            let state = self.state.lock();
            self.refresh_quota_gauges(ctx, views, &state);
        });
    }

    fn status(&self) -> serde_json::Value {
        let state = self.state.lock();
        json!({
            "tracked_keys": state.tracked_keys,
            "pinned_keys": state.pins.len(),
            "quotas": state.quotas.limits.len(),
            "default_limit_bytes": state.quotas.default_limit,
            "trigger_watermark": self.settings.trigger_watermark,
            "eviction_ratio": self.settings.eviction_ratio,
            "interval_seconds": self.interval.map(|d| d.as_secs_f64()),
        })
    }
}
