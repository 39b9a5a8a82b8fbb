//! The actions handle: the coordinator's outbound calls to MP servers
//! (deletes, prefetch submit and status), each counted once here. Instances
//! are named by id and resolved through the registry handle.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::metrics::{MetricsSet, MpCallLabels};
use crate::mp::{MpClient, MpError, Relayed};
use crate::registry::Instances;

/// Why an action did not reach its instance.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// No MP server is registered under that id.
    #[error("no MP server registered with instance_id='{0}'")]
    UnknownInstance(String),
    /// The call failed.
    #[error(transparent)]
    Mp(#[from] MpError),
}

/// Outbound calls to registered MP servers.
#[derive(Debug)]
pub struct Actions {
    mp: MpClient,
    instances: Arc<Instances>,
    metrics: Arc<MetricsSet>,
}

impl Actions {
    /// Calls go to instances of `instances`, give up after `timeout`, and
    /// are counted in `metrics`.
    pub fn new(instances: Arc<Instances>, metrics: Arc<MetricsSet>, timeout: Duration) -> Self {
        Self {
            mp: MpClient::new(timeout),
            instances,
            metrics,
        }
    }

    /// The base URL of a registered instance.
    pub fn base_url(&self, instance_id: &str) -> Result<String, ActionError> {
        self.instances
            .base_url(instance_id)
            .ok_or_else(|| ActionError::UnknownInstance(instance_id.to_owned()))
    }

    /// `DELETE /cache/objects` on the instance at `base`, counted under `op`.
    pub async fn delete_objects(
        &self,
        op: &'static str,
        base: &str,
        body: &Value,
    ) -> Result<Value, MpError> {
        let result = self.mp.delete_objects(base, body).await;
        self.count(op, result.as_ref().err());
        result
    }

    /// `POST /cache/prefetches` on a registered instance.
    pub async fn submit_prefetch(
        &self,
        instance_id: &str,
        body: &Value,
    ) -> Result<Value, ActionError> {
        let base = self.base_url(instance_id)?;
        let result = self.mp.submit_prefetch(&base, body).await;
        self.count("prefetch_submit", result.as_ref().err());
        Ok(result?)
    }

    /// `GET /cache/prefetches/{request_id}` on a registered instance.
    pub async fn prefetch_status(
        &self,
        instance_id: &str,
        request_id: &str,
    ) -> Result<Relayed, ActionError> {
        let base = self.base_url(instance_id)?;
        let result = self.mp.prefetch_status(&base, request_id).await;
        self.count("prefetch_status", result.as_ref().err());
        Ok(result?)
    }

    fn count(&self, op: &'static str, failure: Option<&MpError>) {
        let outcome = match failure {
            None => "ok",
            Some(MpError::Timeout(..)) => "timeout",
            Some(_) => "failed",
        };
        self.metrics
            .metrics
            .mp_calls
            .get_or_create(&MpCallLabels { op, outcome })
            .inc();
    }
}
