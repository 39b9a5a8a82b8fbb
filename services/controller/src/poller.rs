//! The CacheIndex poller: scrapes the index server's `/snapshot`, writes
//! each CacheBackend's `status.indexParticipation` (its own field manager)
//! and every CacheIndex's status, and exports the per-backend tier-2 hit
//! rate. A failed scrape changes nothing but the CacheIndex `Available`
//! condition: participation is soft state and survives a server blip.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ic_api::cachebackend::CacheBackend;
use ic_api::cacheindex::CacheIndex;
use ic_api::consts::{conditions as types, reasons};
use ic_controller_core::attribution::{self, BackendRef, Snapshot};
use ic_controller_core::clock::Clock;
use ic_controller_core::conditions::Builder;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::kubeutil::{self, POLLER_MANAGER};
use crate::metrics::{BackendLabel, Metrics, ResultLabels};

const CONTROLLER: &str = "cacheindex";

/// Why a poll failed.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// `/snapshot` could not be fetched or decoded.
    #[error("scraping {url}: {message}")]
    Scrape {
        /// The snapshot URL.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// The API server refused a read or write.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

/// Everything the poller needs.
#[derive(Clone)]
pub struct Poller {
    /// API client.
    pub client: kube::Client,
    /// HTTP client for /snapshot.
    pub http: reqwest::Client,
    /// `GET` target.
    pub snapshot_url: String,
    /// Metrics.
    pub metrics: Metrics,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// Backends with an exported gauge series (prometheus-client cannot
    /// enumerate a family's label sets).
    exported: Arc<parking_lot::Mutex<BTreeSet<String>>>,
}

/// What one poll did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PollReport {
    /// Backends whose participation was written.
    pub backends_written: Vec<String>,
    /// CacheIndex objects whose status was written.
    pub indexes_written: usize,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller").finish_non_exhaustive()
    }
}

impl Poller {
    /// A poller of `snapshot_url`.
    pub fn new(
        client: kube::Client,
        http: reqwest::Client,
        snapshot_url: String,
        metrics: Metrics,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            client,
            http,
            snapshot_url,
            metrics,
            clock,
            exported: Arc::default(),
        }
    }

    /// Fetches and decodes the snapshot.
    pub async fn scrape(&self) -> Result<Snapshot, PollError> {
        let fail = |message: String| PollError::Scrape {
            url: self.snapshot_url.clone(),
            message,
        };
        let response = self
            .http
            .get(&self.snapshot_url)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .map_err(|e| fail(e.to_string()))?;
        let status = response.status();
        if !status.is_success() {
            return Err(fail(format!("HTTP {status}")));
        }
        let body = response.bytes().await.map_err(|e| fail(e.to_string()))?;
        serde_json::from_slice(&body).map_err(|e| fail(format!("decoding the body: {e}")))
    }

    /// One scrape and the writes it implies.
    pub async fn poll_once(&self) -> Result<PollReport, PollError> {
        let started = Instant::now();
        let result = self.poll_inner().await;
        let ok = result.is_ok();
        self.metrics
            .observe(CONTROLLER, ok, started.elapsed().as_secs_f64());
        if let Err(e) = &result {
            self.metrics.error(
                CONTROLLER,
                match e {
                    PollError::Scrape { .. } => "remote",
                    PollError::Kube(k) => kubeutil::reason(k),
                },
            );
        }
        result
    }

    async fn poll_inner(&self) -> Result<PollReport, PollError> {
        let snapshot = match self.scrape().await {
            Ok(s) => {
                self.count_scrape(true);
                s
            }
            Err(e) => {
                self.count_scrape(false);
                tracing::warn!(error = %e, "snapshot scrape failed; keeping the last observed state");
                self.write_indexes(None, &e.to_string()).await?;
                return Err(e);
            }
        };
        let backends_written = self.write_backends(&snapshot).await?;
        let indexes_written = self.write_indexes(Some(&snapshot), "").await?;
        Ok(PollReport {
            backends_written,
            indexes_written,
        })
    }

    fn count_scrape(&self, ok: bool) {
        self.metrics
            .snapshot_scrapes
            .get_or_create(&ResultLabels {
                controller: CONTROLLER,
                result: if ok { "success" } else { "error" },
            })
            .inc();
    }

    async fn write_backends(&self, snapshot: &Snapshot) -> Result<Vec<String>, PollError> {
        let backends: Vec<CacheBackend> = Api::<CacheBackend>::all(self.client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let tenants: BTreeSet<&str> = snapshot
            .replicas
            .iter()
            .map(|r| r.tenant.as_str())
            .collect();
        let mut pods: Vec<Pod> = Vec::new();
        for ns in tenants {
            // A namespace that cannot be read aborts the backend writes: a
            // missing pod must mean "drained", never "could not look".
            pods.extend(
                Api::<Pod>::namespaced(self.client.clone(), ns)
                    .list(&ListParams::default())
                    .await?
                    .items,
            );
        }
        let split = attribution::attribute(snapshot, &pods, &backends);
        let mut written = Vec::new();
        let mut live = BTreeSet::new();
        for backend in &backends {
            let reference = BackendRef::of(backend);
            let share = split.by_backend.get(&reference);
            let label = BackendLabel {
                backend: reference.to_string(),
            };
            live.insert(label.backend.clone());
            match share.and_then(|s| s.t2_hit_rate) {
                Some(rate) => {
                    self.metrics
                        .backend_t2_hit_rate
                        .get_or_create(&label)
                        .set(rate);
                }
                None => {
                    self.metrics.backend_t2_hit_rate.remove(&label);
                }
            }
            let current = backend
                .status
                .as_ref()
                .and_then(|s| s.index_participation.as_ref());
            let Some(next) = attribution::next_participation(current, share) else {
                continue;
            };
            if current == Some(&next) {
                continue;
            }
            let api = Api::<CacheBackend>::namespaced(self.client.clone(), &reference.namespace);
            match kubeutil::apply_status(
                &api,
                &reference.name,
                POLLER_MANAGER,
                &json!({ "indexParticipation": next }),
            )
            .await
            {
                Ok(_) => written.push(reference.to_string()),
                // Deleted since the list: nothing to write.
                Err(e) if kubeutil::is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.forget_gone_backends(&live);
        tracing::debug!(
            replicas = snapshot.replicas.len(),
            attributed = split.by_backend.len(),
            pod_missing = split.pod_missing,
            unclaimed = split.unclaimed,
            written = written.len(),
            "snapshot attributed"
        );
        Ok(written)
    }

    /// Drops gauge series of backends that no longer exist.
    fn forget_gone_backends(&self, live: &BTreeSet<String>) {
        let mut exported = self.exported.lock();
        for gone in exported.difference(live) {
            self.metrics.backend_t2_hit_rate.remove(&BackendLabel {
                backend: gone.clone(),
            });
        }
        exported.clone_from(live);
    }

    async fn write_indexes(
        &self,
        snapshot: Option<&Snapshot>,
        error: &str,
    ) -> Result<usize, PollError> {
        let api = Api::<CacheIndex>::all(self.client.clone());
        let indexes = api.list(&ListParams::default()).await?.items;
        let now = self.clock.now();
        let mut written = 0;
        for index in indexes {
            let Some(name) = index.metadata.name.clone() else {
                continue;
            };
            let previous = index.status.clone().unwrap_or_default();
            let mut next = match snapshot {
                Some(s) => attribution::cache_index_status(s, now),
                None => previous.clone(),
            };
            next.observed_generation = index.metadata.generation;
            let mut conditions = Builder::new(&previous.conditions, now, index.metadata.generation);
            match snapshot {
                Some(s) => conditions.set(
                    types::AVAILABLE,
                    "True",
                    reasons::PUSHED,
                    format!(
                        "scraped {} replica rows from {}",
                        s.replicas.len(),
                        self.snapshot_url
                    ),
                ),
                None => conditions.set(types::AVAILABLE, "False", reasons::REMOTE_ERROR, error),
            }
            next.conditions = conditions.finish();
            if next == previous {
                continue;
            }
            kubeutil::apply_status(&api, &name, POLLER_MANAGER, &next).await?;
            written += 1;
        }
        Ok(written)
    }

    /// Polls every `every` until `shutdown`.
    pub async fn run(self, every: Duration, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = self.poll_once().await {
                tracing::warn!(error = %e, "CacheIndex poll failed");
            }
        }
    }
}

/// Per-backend participation currently exported, for tests and debugging.
pub fn exported_rates(metrics: &Metrics, backends: &[String]) -> BTreeMap<String, f64> {
    backends
        .iter()
        .filter_map(|b| {
            let label = BackendLabel { backend: b.clone() };
            // get_or_create would add a series; only read existing ones.
            metrics
                .backend_t2_hit_rate
                .get(&label)
                .map(|g| (b.clone(), g.get()))
        })
        .collect()
}
