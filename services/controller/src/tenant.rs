//! The CacheTenant pusher: mirrors each tenant's fleet L2 quota and pinned
//! prefixes onto the LMCache coordinator over its REST API
//! (`PUT|DELETE /quota/{cache_salt}`, `POST|DELETE /cache/pins`), and
//! reports `Synced` and the coordinator's pinned-key count on the status.
//!
//! Pins are reference-counted on the coordinator, so the pusher must pin
//! each prefix once, not once per pass: it remembers, per CacheTenant uid,
//! the salt and pins it applied and sends only the difference. After a
//! controller restart that memory is empty; when the coordinator already
//! holds pins for the salt the pusher adopts the current spec as applied
//! rather than pinning twice (a pin removed from the spec while the
//! controller was down stays pinned until the tenant is edited again — a
//! documented limitation).
//!
//! Every tenant carries the `inferencecache.io/coordinator-release`
//! finalizer while the pusher runs: a deleted tenant keeps existing (with a
//! deletionTimestamp) until its pins are unpinned and its quota removed,
//! even if the controller was down when it was deleted. Tenants are read
//! from the watch-fed store; a pass runs after every CacheTenant change and
//! on the resync timer.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ic_api::cachetenant::{CacheTenant, CacheTenantStatus, TenantPin};
use ic_api::consts::finalizers::TENANT_RELEASE;
use ic_api::consts::{conditions as types, reasons};
use ic_controller_core::clock::{self, Clock, ClockExt};
use ic_controller_core::conditions::Builder;
use kube::api::{Api, Patch, PatchParams};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::kubeutil::{self, TENANT_MANAGER};
use crate::metrics::Metrics;
use crate::stores::{Stores, owned};

const CONTROLLER: &str = "cachetenant";

/// Why a push failed.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    /// The API server refused a read or write.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The coordinator could not be reached or refused a request.
    #[error("coordinator {method} {path}: {message}")]
    Coordinator {
        /// HTTP method.
        method: &'static str,
        /// Path.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The quota is not a valid quantity.
    #[error("spec.quota.l2Limit: {0}")]
    Quantity(String),
}

/// Bytes in a Kubernetes quantity (`10Gi`, `500M`, `1e9`, `0`).
pub fn quantity_bytes(q: &str) -> Result<f64, TenantError> {
    let q = q.trim();
    let split = q
        .find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E')
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let factor: f64 = match suffix {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        other => {
            return Err(TenantError::Quantity(format!(
                "unknown suffix {other:?} in {q:?}"
            )));
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| TenantError::Quantity(format!("{q:?} is not a quantity")))?;
    if !value.is_finite() || value < 0.0 {
        return Err(TenantError::Quantity(format!(
            "{q:?} must be a non-negative quantity"
        )));
    }
    Ok((value * factor).floor())
}

/// `/quota/{salt}` path segment: `_default` for the empty salt, otherwise
/// percent-encoded.
pub fn salt_segment(salt: &str) -> String {
    if salt.is_empty() {
        return "_default".into();
    }
    salt.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[derive(Clone, Debug, PartialEq)]
struct Applied {
    salt: String,
    pins: Vec<TenantPin>,
    had_quota: bool,
}

/// Pushes CacheTenants to the coordinator.
#[derive(Clone)]
pub struct TenantPusher {
    /// API client.
    pub client: kube::Client,
    /// HTTP client.
    pub http: reqwest::Client,
    /// Coordinator base URL, e.g. `http://coordinator:9300`.
    pub coordinator_url: String,
    /// Metrics.
    pub metrics: Metrics,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// The watch-fed view of the cluster.
    pub stores: Stores,
    /// Bearer token file presented to a coordinator started with
    /// `--api-audience` (a projected token: read on every call, so the
    /// kubelet's rotation needs no restart).
    pub token_path: Option<std::path::PathBuf>,
    applied: Arc<Mutex<HashMap<String, Applied>>>,
}

impl std::fmt::Debug for TenantPusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantPusher").finish_non_exhaustive()
    }
}

impl TenantPusher {
    /// A pusher to `coordinator_url`.
    pub fn new(
        client: kube::Client,
        http: reqwest::Client,
        coordinator_url: String,
        metrics: Metrics,
        clock: Arc<dyn Clock>,
        stores: Stores,
    ) -> Self {
        Self {
            client,
            http,
            coordinator_url: coordinator_url.trim_end_matches('/').to_owned(),
            metrics,
            clock,
            stores,
            token_path: None,
            applied: Arc::default(),
        }
    }

    /// Presents the token in `path` on every call.
    pub fn with_token_path(mut self, path: Option<std::path::PathBuf>) -> Self {
        self.token_path = path;
        self
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, TenantError> {
        let name: &'static str = match method {
            reqwest::Method::PUT => "PUT",
            reqwest::Method::POST => "POST",
            reqwest::Method::DELETE => "DELETE",
            _ => "GET",
        };
        let fail = |message: String| TenantError::Coordinator {
            method: name,
            path: path.to_owned(),
            message,
        };
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.coordinator_url))
            .timeout(Duration::from_secs(10));
        if let Some(b) = body {
            request = request.json(&b);
        }
        if let Some(token_path) = &self.token_path {
            let token = std::fs::read_to_string(token_path).map_err(|e| {
                fail(format!(
                    "--coordinator-token-path {}: {e}",
                    token_path.display()
                ))
            })?;
            request = request.bearer_auth(token.trim());
        }
        let response = request.send().await.map_err(|e| fail(e.to_string()))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| fail(e.to_string()))?;
        if !status.is_success() {
            return Err(fail(format!("HTTP {status}: {text}")));
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn pin_body(salt: &str, pin: &TenantPin) -> Value {
        json!({"model_name": pin.model_name, "world_size": pin.world_size,
               "token_ids": pin.token_ids, "cache_salt": salt})
    }

    async fn pinned_keys(&self, salt: &str) -> Result<i64, TenantError> {
        let path = format!(
            "/cache/pins?cache_salt={}&limit=1",
            salt_segment_query(salt)
        );
        let v = self.call(reqwest::Method::GET, &path, None).await?;
        Ok(v["total"].as_i64().unwrap_or(0))
    }

    /// Makes the coordinator hold `tenant`'s quota and pins; returns the
    /// number of keys pinned for its salt.
    async fn push(&self, uid: &str, tenant: &CacheTenant) -> Result<i64, TenantError> {
        let salt = tenant.spec.cache_salt.clone();
        let segment = salt_segment(&salt);
        let previous = self.applied.lock().get(uid).cloned();
        // A salt change releases everything held under the old salt.
        if let Some(prev) = previous.as_ref().filter(|p| p.salt != salt) {
            self.release(prev).await?;
            self.applied.lock().remove(uid);
        }
        let previous = self.applied.lock().get(uid).cloned();
        match &tenant.spec.quota {
            Some(q) => {
                let gib = quantity_bytes(&q.l2_limit.0)? / 1024f64.powi(3);
                self.call(
                    reqwest::Method::PUT,
                    &format!("/quota/{segment}"),
                    Some(json!({"limit_gb": gib, "tier": "l2"})),
                )
                .await?;
            }
            None => {
                if previous.as_ref().is_none_or(|p| p.had_quota) {
                    self.call(
                        reqwest::Method::DELETE,
                        &format!("/quota/{segment}?tier=l2"),
                        None,
                    )
                    .await?;
                }
            }
        }
        let applied_pins = match previous {
            Some(p) => p.pins,
            // Restart: pins already held for the salt are taken to be ours.
            None if self.pinned_keys(&salt).await? > 0 => tenant.spec.pins.clone(),
            None => Vec::new(),
        };
        for pin in applied_pins
            .iter()
            .filter(|p| !tenant.spec.pins.contains(p))
        {
            self.call(
                reqwest::Method::DELETE,
                "/cache/pins",
                Some(Self::pin_body(&salt, pin)),
            )
            .await?;
        }
        let mut now_applied: Vec<TenantPin> = applied_pins
            .iter()
            .filter(|p| tenant.spec.pins.contains(p))
            .cloned()
            .collect();
        for pin in tenant
            .spec
            .pins
            .iter()
            .filter(|p| !applied_pins.contains(p))
        {
            let result = self
                .call(
                    reqwest::Method::POST,
                    "/cache/pins",
                    Some(Self::pin_body(&salt, pin)),
                )
                .await;
            if let Err(e) = result {
                self.remember(uid, &salt, now_applied, tenant.spec.quota.is_some());
                return Err(e);
            }
            now_applied.push(pin.clone());
        }
        self.remember(uid, &salt, now_applied, tenant.spec.quota.is_some());
        self.pinned_keys(&salt).await
    }

    fn remember(&self, uid: &str, salt: &str, pins: Vec<TenantPin>, had_quota: bool) {
        self.applied.lock().insert(
            uid.to_owned(),
            Applied {
                salt: salt.to_owned(),
                pins,
                had_quota,
            },
        );
    }

    async fn release(&self, applied: &Applied) -> Result<(), TenantError> {
        for pin in &applied.pins {
            self.call(
                reqwest::Method::DELETE,
                "/cache/pins",
                Some(Self::pin_body(&applied.salt, pin)),
            )
            .await?;
        }
        if applied.had_quota {
            self.call(
                reqwest::Method::DELETE,
                &format!("/quota/{}?tier=l2", salt_segment(&applied.salt)),
                None,
            )
            .await?;
        }
        Ok(())
    }

    /// One pass over every CacheTenant. Per-tenant coordinator failures are
    /// reported on that tenant (Synced=False) and make the pass an error.
    pub async fn sync_once(&self) -> Result<usize, TenantError> {
        let started = Instant::now();
        let result = self.sync_inner().await;
        self.metrics
            .pass(CONTROLLER, started, &result, |e| match e {
                TenantError::Kube(k) => kubeutil::reason(k),
                TenantError::Coordinator { .. } => "remote",
                TenantError::Quantity(_) => "invalid_spec",
            });
        result
    }

    /// Sets this pusher's finalizer on `tenant` (`present`) or removes it,
    /// leaving any other finalizer alone. The resourceVersion makes the
    /// write fail with a conflict (retried next pass) if someone changed the
    /// list in between.
    async fn set_finalizer(&self, tenant: &CacheTenant, present: bool) -> Result<(), TenantError> {
        let (Some(ns), Some(name)) = (&tenant.metadata.namespace, &tenant.metadata.name) else {
            return Ok(());
        };
        let mut list: Vec<String> = tenant
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .into_iter()
            .filter(|f| f != TENANT_RELEASE)
            .collect();
        if present {
            list.push(TENANT_RELEASE.to_owned());
        }
        let patch = json!({"metadata": {
            "finalizers": list,
            "resourceVersion": tenant.metadata.resource_version,
        }});
        let api = Api::<CacheTenant>::namespaced(self.client.clone(), ns);
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if kubeutil::is_not_found(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Releases a tenant that is being deleted, then lets it go. What was
    /// applied is this process's memory, or (after a restart) the spec.
    async fn finalize(&self, uid: &str, tenant: &CacheTenant) -> Result<(), TenantError> {
        let applied = self.applied.lock().get(uid).cloned();
        let applied = applied.unwrap_or_else(|| Applied {
            salt: tenant.spec.cache_salt.clone(),
            pins: tenant.spec.pins.clone(),
            had_quota: tenant.spec.quota.is_some(),
        });
        self.release(&applied).await?;
        self.applied.lock().remove(uid);
        self.set_finalizer(tenant, false).await?;
        tracing::info!(salt = %applied.salt, "released a deleted CacheTenant's quota and pins");
        Ok(())
    }

    async fn sync_inner(&self) -> Result<usize, TenantError> {
        let tenants = owned(&Stores::all(&self.stores.tenants));
        let live: BTreeMap<String, ()> = tenants
            .iter()
            .filter_map(|t| t.metadata.uid.clone().map(|u| (u, ())))
            .collect();
        let gone: Vec<(String, Applied)> = self
            .applied
            .lock()
            .iter()
            .filter(|(uid, _)| !live.contains_key(*uid))
            .map(|(u, a)| (u.clone(), a.clone()))
            .collect();
        for (uid, applied) in gone {
            self.release(&applied).await?;
            self.applied.lock().remove(&uid);
            tracing::info!(salt = %applied.salt, "released a CacheTenant deleted without its finalizer");
        }
        let mut first_error = None;
        let mut synced = 0;
        for tenant in &tenants {
            let (Some(ns), Some(name), Some(uid)) = (
                &tenant.metadata.namespace,
                &tenant.metadata.name,
                &tenant.metadata.uid,
            ) else {
                continue;
            };
            let ours = tenant
                .metadata
                .finalizers
                .as_ref()
                .is_some_and(|f| f.iter().any(|f| f == TENANT_RELEASE));
            if tenant.metadata.deletion_timestamp.is_some() {
                if ours && let Err(e) = self.finalize(uid, tenant).await {
                    tracing::warn!(error = %e, ns = %ns, name = %name, "releasing a deleted CacheTenant failed; its finalizer stays");
                    first_error.get_or_insert(e);
                }
                continue;
            }
            if !ours && let Err(e) = self.set_finalizer(tenant, true).await {
                // Not pushed before the finalizer is on: a deletion in
                // between would leave the quota behind.
                first_error.get_or_insert(e);
                continue;
            }
            let outcome = self.push(uid, tenant).await;
            let now = self.clock.now();
            let previous = tenant.status.clone().unwrap_or_default();
            let generation = tenant.metadata.generation;
            let mut conditions = Builder::new(&previous.conditions, now, generation);
            let mut next = CacheTenantStatus {
                observed_generation: generation,
                pinned_chunks: previous.pinned_chunks,
                synced_at: previous.synced_at.clone(),
                conditions: Vec::new(),
            };
            match &outcome {
                Ok(keys) => {
                    synced += 1;
                    let was = previous
                        .conditions
                        .iter()
                        .any(|c| c.type_ == types::SYNCED && c.status == "True");
                    if !was || previous.observed_generation != generation {
                        next.synced_at = Some(clock::to_time(now));
                    }
                    next.pinned_chunks = Some(*keys);
                    conditions.set(
                        types::SYNCED,
                        "True",
                        reasons::PUSHED,
                        "the coordinator holds the quota and pins",
                    );
                }
                Err(e) => {
                    tracing::warn!(error = %e, ns = %ns, name = %name, "CacheTenant push failed");
                    conditions.set(types::SYNCED, "False", reasons::REMOTE_ERROR, e.to_string());
                }
            }
            next.conditions = conditions.finish();
            if next != previous {
                let api = Api::<CacheTenant>::namespaced(self.client.clone(), ns);
                match kubeutil::apply_status(&api, name, TENANT_MANAGER, &next).await {
                    Ok(_) => {}
                    Err(e) if kubeutil::is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if let Err(e) = outcome {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(synced),
        }
    }

    /// Syncs after every CacheTenant change and every `every`, until
    /// `shutdown`.
    pub async fn run(
        self,
        every: Duration,
        changes: tokio::sync::watch::Receiver<u64>,
        shutdown: CancellationToken,
    ) {
        let this = &self;
        kubeutil::run_on_change(every, changes, shutdown, "CacheTenant sync", || {
            this.sync_once()
        })
        .await;
    }
}

/// The salt as a query-string value (empty stays empty).
fn salt_segment_query(salt: &str) -> String {
    if salt.is_empty() {
        String::new()
    } else {
        salt_segment(salt)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(quantity_bytes("1Gi").unwrap(), 1_073_741_824.0);
        assert_eq!(quantity_bytes("500M").unwrap(), 500_000_000.0);
        assert_eq!(quantity_bytes("1e3").unwrap(), 1000.0);
        assert_eq!(quantity_bytes("0").unwrap(), 0.0);
        assert_eq!(quantity_bytes("1.5Ki").unwrap(), 1536.0);
        assert!(quantity_bytes("-1Gi").is_err());
        assert!(quantity_bytes("1Qi").is_err());
        assert!(quantity_bytes("lots").is_err());
    }

    #[test]
    fn salt_segments() {
        assert_eq!(salt_segment(""), "_default");
        assert_eq!(salt_segment("team-a"), "team-a");
        assert_eq!(salt_segment("a b/c"), "a%20b%2Fc");
    }
}
