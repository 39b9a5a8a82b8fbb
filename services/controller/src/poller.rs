//! The CacheIndex poller: scrapes the index server's `/snapshot`
//! (`--snapshot-url`), writes each CacheBackend's `status.indexParticipation`
//! (its own field manager) and the status of every CacheIndex that names
//! that server, and exports the per-backend tier-2 hit rate. A CacheIndex
//! whose `serverURL` names another server is scraped on its own, at most
//! once per its `pollIntervalSeconds`, for its own status only. A failed
//! scrape changes nothing but the CacheIndex `Available` condition:
//! participation is soft state and survives a server blip. Backends, pods
//! and CacheIndexes are read from the watch-fed stores.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ic_api::cachebackend::CacheBackend;
use ic_api::cacheindex::CacheIndex;
use ic_api::consts::{conditions as types, reasons};
use ic_controller_core::attribution::{self, BackendRef, Snapshot};
use ic_controller_core::clock::{self, Clock, ClockExt, Timestamp};
use ic_controller_core::conditions::Builder;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::kubeutil::{self, POLLER_MANAGER};
use crate::metrics::{BackendLabel, Metrics, ResultLabels};
use crate::stores::Stores;

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
    /// Bearer token file for `/snapshot` (the index server's access
    /// control); unset or absent (local runs) sends no token.
    pub token_path: Option<std::path::PathBuf>,
    /// Metrics.
    pub metrics: Metrics,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// The watch-fed view of the cluster.
    pub stores: Stores,
    /// Backends with an exported gauge series (prometheus-client cannot
    /// enumerate a family's label sets).
    exported: Arc<parking_lot::Mutex<BTreeSet<String>>>,
    /// When each CacheIndex that names another server was last scraped
    /// (its own `pollIntervalSeconds` paces it).
    last_own_scrape: Arc<parking_lot::Mutex<BTreeMap<String, Timestamp>>>,
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
        stores: Stores,
    ) -> Self {
        Self {
            client,
            http,
            snapshot_url,
            token_path: None,
            metrics,
            clock,
            stores,
            exported: Arc::default(),
            last_own_scrape: Arc::default(),
        }
    }

    /// Fetches and decodes the snapshot of `--snapshot-url`.
    pub async fn scrape(&self) -> Result<Snapshot, PollError> {
        self.scrape_url(&self.snapshot_url).await
    }

    /// Fetches and decodes the snapshot at `url`.
    async fn scrape_url(&self, url: &str) -> Result<Snapshot, PollError> {
        let fail = |message: String| PollError::Scrape {
            url: url.to_owned(),
            message,
        };
        let mut request = self.http.get(url).timeout(Duration::from_secs(10));
        if let Some(path) = self.token_path.as_ref().filter(|p| p.exists()) {
            request = request.bearer_auth(crate::backend::read_token(path).map_err(fail)?);
        }
        let response = request.send().await.map_err(|e| fail(e.to_string()))?;
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
        self.metrics
            .pass(CONTROLLER, started, &result, |e| match e {
                PollError::Scrape { .. } => "remote",
                PollError::Kube(k) => kubeutil::reason(k),
            });
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
                self.write_indexes(Err(&e.to_string())).await?;
                return Err(e);
            }
        };
        let backends_written = self.write_backends(&snapshot).await?;
        let indexes_written = self.write_indexes(Ok(&snapshot)).await?;
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
        let backends = Stores::all(&self.stores.backends);
        let tenants: BTreeSet<&str> = snapshot
            .replicas
            .iter()
            .map(|r| r.tenant.as_str())
            .collect();
        let pods: Vec<Arc<Pod>> = tenants
            .iter()
            .flat_map(|ns| self.stores.index.pods.in_namespace(ns))
            .collect();
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
        self.metrics.retain_degraded_backends(live);
    }

    /// Writes every CacheIndex's status. An index whose `serverURL` is the
    /// server behind `--snapshot-url` reports `main` (the scrape this poll
    /// made, or its error); an index naming another server is scraped on
    /// its own, at most once per its `pollIntervalSeconds`.
    async fn write_indexes(&self, main: Result<&Snapshot, &str>) -> Result<usize, PollError> {
        let api = Api::<CacheIndex>::all(self.client.clone());
        let indexes = Stores::all(&self.stores.indexes);
        let now = self.clock.now();
        let mut written = 0;
        let mut seen = BTreeSet::new();
        for index in indexes {
            let index = CacheIndex::clone(&index);
            let Some(name) = index.metadata.name.clone() else {
                continue;
            };
            seen.insert(name.clone());
            let url = snapshot_url_of(&index.spec.server_url);
            let own;
            let observed: Result<&Snapshot, String> = if url == self.snapshot_url {
                main.map_err(str::to_owned)
            } else {
                if !self.own_scrape_due(&name, index.spec.poll_interval_seconds, now) {
                    continue;
                }
                own = self.scrape_url(&url).await;
                self.count_scrape(own.is_ok());
                own.as_ref().map_err(ToString::to_string)
            };
            let previous = index.status.clone().unwrap_or_default();
            let mut next = match observed {
                Ok(s) => attribution::cache_index_status(s, now),
                Err(_) => previous.clone(),
            };
            next.observed_generation = index.metadata.generation;
            let mut conditions = Builder::new(&previous.conditions, now, index.metadata.generation);
            match observed {
                Ok(s) => conditions.set(
                    types::AVAILABLE,
                    "True",
                    reasons::PUSHED,
                    format!("scraped {} replica rows from {url}", s.replicas.len()),
                ),
                Err(error) => {
                    conditions.set(types::AVAILABLE, "False", reasons::REMOTE_ERROR, error);
                }
            }
            next.conditions = conditions.finish();
            if next == previous {
                continue;
            }
            kubeutil::apply_status(&api, &name, POLLER_MANAGER, &next).await?;
            written += 1;
        }
        self.last_own_scrape.lock().retain(|k, _| seen.contains(k));
        Ok(written)
    }

    /// Whether the index `name`, which names its own server, is due for a
    /// scrape (and if so, records it as scraped now).
    fn own_scrape_due(&self, name: &str, interval_seconds: i32, now: Timestamp) -> bool {
        let every = Duration::from_secs(u64::try_from(interval_seconds.max(1)).unwrap_or(1));
        let mut last = self.last_own_scrape.lock();
        if let Some(&at) = last.get(name)
            && clock::since(now, at) < every
        {
            return false;
        }
        last.insert(name.to_owned(), now);
        true
    }

    /// Polls every `every` until `shutdown`.
    pub async fn run(self, every: Duration, shutdown: CancellationToken) {
        let this = &self;
        // Paced by the timer alone: a scrape is remote state, not a watch.
        let (_, timer_only) = tokio::sync::watch::channel(0);
        kubeutil::run_on_change(every, timer_only, shutdown, "CacheIndex poll", || {
            this.poll_once()
        })
        .await;
    }
}

/// The `/snapshot` URL of an index server given by its base URL.
pub fn snapshot_url_of(server_url: &str) -> String {
    format!("{}/snapshot", server_url.trim().trim_end_matches('/'))
}
