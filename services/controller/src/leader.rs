//! Leader election over a `coordination.k8s.io/v1` Lease.
//!
//! Every write is a replace guarded by the Lease's `resourceVersion`, so two
//! instances racing for the same Lease cannot both win: the loser's replace
//! gets 409 Conflict and it stays a follower. A holder renews every
//! `renew_every`; anyone may take the Lease over once
//! `renewTime + leaseDurationSeconds` has passed on the injectable clock
//! (so tests move a manual clock instead of sleeping). A holder that cannot
//! renew steps down at once rather than risk running beside a new leader.
//! On shutdown the holder releases the Lease (empty holder) so a successor
//! does not wait out the duration.

use std::sync::Arc;
use std::time::Duration;

use ic_controller_core::clock::{self, Clock, ClockExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::kubeutil;
use crate::metrics::Metrics;

/// Contends for one Lease.
#[derive(Clone, Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    lease_duration: Duration,
    clock: Arc<dyn Clock>,
    metrics: Option<Metrics>,
}

impl LeaderElector {
    /// An elector for Lease `namespace/name` as `identity`.
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: &str,
        identity: &str,
        lease_duration: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            lease_duration,
            clock,
            metrics: None,
        }
    }

    /// Exports leadership on `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// This elector's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    /// One attempt: acquires a free or expired Lease, or renews our own.
    /// `Ok(true)` means this instance leads until at least
    /// `now + lease_duration`.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = self.clock.now();
        let micro = MicroTime(now);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(self.duration_seconds()),
                    acquire_time: Some(micro.clone()),
                    renew_time: Some(micro),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let mine = holder.as_deref() == Some(self.identity.as_str());
        if !mine {
            let duration = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
            );
            let expired = match (&holder, &spec.renew_time) {
                (None, _) | (Some(_), None) => true,
                (Some(_), Some(renewed)) => clock::add(renewed.0, duration) < now,
            };
            if !expired {
                return Ok(false);
            }
        }
        let mut next = spec;
        if !mine {
            next.holder_identity = Some(self.identity.clone());
            next.acquire_time = Some(micro.clone());
            next.lease_transitions = Some(next.lease_transitions.unwrap_or(0) + 1);
        }
        next.renew_time = Some(micro);
        next.lease_duration_seconds = Some(self.duration_seconds());
        lease.spec = Some(next);
        // `lease.metadata.resourceVersion` is what we read: a concurrent
        // writer makes this replace fail with 409.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if we hold it.
    pub async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(self.clock.now()));
        spec.lease_duration_seconds = Some(1);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if kubeutil::reason(&e) == "conflict" || kubeutil::is_not_found(&e) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Contends every `retry_every` until `shutdown`, publishing leadership
    /// on `leading`. A failed renewal publishes `false` at once. Releases the
    /// Lease on the way out if held.
    pub async fn run(
        self,
        retry_every: Duration,
        leading: watch::Sender<bool>,
        shutdown: CancellationToken,
    ) {
        loop {
            let is_leader = match self.try_acquire_or_renew().await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, lease = %self.name, "leader election round failed");
                    false
                }
            };
            if *leading.borrow() != is_leader {
                tracing::info!(
                    identity = %self.identity,
                    lease = %self.name,
                    leader = is_leader,
                    "leadership changed"
                );
            }
            leading.send_replace(is_leader);
            if let Some(m) = &self.metrics {
                m.leader.set(i64::from(is_leader));
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(retry_every) => {}
            }
        }
        leading.send_replace(false);
        if let Some(m) = &self.metrics {
            m.leader.set(0);
        }
        if let Err(e) = self.release().await {
            tracing::warn!(error = %e, lease = %self.name, "releasing the lease failed");
        }
    }
}
