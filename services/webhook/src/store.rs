//! Where pod admission reads a namespace's CacheBackends in steady state:
//! a watch-fed store of every CacheBackend in the cluster, so an admission
//! costs no API call.
//!
//! Freshness: the store lags the API server by one watch event (well under
//! a second on a healthy cluster). A pod created within that window of its
//! backend's creation is admitted as if the backend did not exist yet —
//! the same outcome as a pod created just before it — and the controller
//! reports it in the backend's status (matched but not injected). Before
//! the first LIST completes (start-up, or an API server unreachable at
//! start) every admission lists the namespace live, as the webhook did
//! before it had a store, with the same timeout and fail-open path.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use ic_api::CacheBackend;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, SourceLabel};
use crate::pod::{BackendSource, KubeBackends, ListFuture};

/// Reads from the store once synced, live before.
#[derive(Clone, Debug)]
pub struct StoreBackends {
    store: Store<CacheBackend>,
    /// Set at the first complete LIST (kube's `wait_until_ready` wakes only
    /// one of several waiters; a flag is all admission needs).
    synced: Arc<AtomicBool>,
    live: Arc<KubeBackends>,
    metrics: Metrics,
}

impl StoreBackends {
    /// Starts the CacheBackend watch (until `stop`) and returns the source.
    pub fn start(
        client: kube::Client,
        live: KubeBackends,
        metrics: Metrics,
        stop: CancellationToken,
    ) -> Self {
        let (store, writer) = reflector::store();
        let stream = watcher(Api::<CacheBackend>::all(client), watcher::Config::default())
            .modify(|b: &mut CacheBackend| {
                b.meta_mut().managed_fields = None;
            })
            .default_backoff()
            .reflect(writer);
        let gauge = metrics.backend_store_synced.clone();
        let synced = Arc::new(AtomicBool::new(false));
        let flag = synced.clone();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                let next = tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    next = stream.next() => next,
                };
                match next {
                    Some(Ok(watcher::Event::InitDone)) => {
                        flag.store(true, Ordering::Release);
                        gauge.set(1);
                    }
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "CacheBackend watch failed; retrying with backoff");
                    }
                    None => return,
                }
            }
        });
        Self {
            store,
            synced,
            live: Arc::new(live),
            metrics,
        }
    }

    /// Whether the store has completed its first LIST.
    pub fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    fn count(&self, source: &'static str) {
        self.metrics
            .backend_lookups
            .get_or_create(&SourceLabel { source })
            .inc();
    }
}

impl BackendSource for StoreBackends {
    fn list<'a>(&'a self, namespace: &'a str) -> ListFuture<'a> {
        if !self.synced() {
            self.count("live");
            return self.live.list(namespace);
        }
        self.count("store");
        let mut backends: Vec<CacheBackend> = self
            .store
            .state_filter(|b| b.metadata.namespace.as_deref() == Some(namespace))
            .iter()
            .map(|b| CacheBackend::clone(b))
            .collect();
        // The API server lists by name; keep that order.
        backends.sort_by_key(ResourceExt::name_any);
        Box::pin(std::future::ready(Ok(backends)))
    }
}
