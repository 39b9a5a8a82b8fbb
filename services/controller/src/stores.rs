//! The controller's view of the cluster: one watch-fed reflector store per
//! kind, started once per leadership term and read by every loop — the
//! CacheBackend reconciler, the engine-pod handler, the CacheIndex poller
//! and the CachePolicy / CacheTenant pushers. Each kind is LISTed once when
//! its watch starts; after that only WATCH requests reach the API server
//! (kube's watcher re-lists only when a watch cannot resume, e.g. on 410
//! Gone after a long disconnect).
//!
//! Pods are watched cluster-wide, because an engine selector is arbitrary
//! labels, but stored trimmed to what the decisions read
//! ([`ic_controller_core::k8s::trim_pod`]). Provider StatefulSets, Services
//! and HPAs are watched only with the managed-by label; Deployments are
//! watched unfiltered since engine Deployments set the expected replica
//! count.
//!
//! The Pod and Deployment stores are also indexed by namespace and labels
//! ([`crate::index`], [`Stores::index`]), the index following each event
//! after the store applied it, so a reconcile reads its own namespace's
//! matching objects instead of filtering the whole store.
//!
//! InferenceObjectives (the Gateway API Inference Extension's kind) are
//! watched too, for the priorities the policy pusher sends with the
//! policies; that watch does not hold up [`Stores::synced`], since a
//! cluster without the extension's CRDs has none to list (its watch
//! retries with backoff and the set pushed is empty until it lists).
//!
//! The two kube-runtime controllers (CacheBackend and engine pods) are fed
//! from the same watches through [`Feeds`]; the pushers wake on
//! [`Stores::changes`]. One watch per kind per process, whoever reads it.

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use ic_api::cachebackend::CacheBackend;
use ic_api::cacheindex::CacheIndex;
use ic_api::cachepolicy::CachePolicy;
use ic_api::cachetenant::CacheTenant;
use ic_api::inferenceobjective::InferenceObjective;
use ic_controller_core::k8s;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::Api;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::index::{ApplyEvent, IndexedWriter, Indexes};
use crate::metrics::Metrics;

/// Objects a feed buffers for a slow controller before its watch waits.
const FEED_BUFFER: usize = 1024;

/// One store per watched kind.
#[derive(Clone)]
pub struct Stores {
    /// Every CacheBackend.
    pub backends: Store<CacheBackend>,
    /// Every Pod, trimmed.
    pub pods: Store<Pod>,
    /// Every Deployment (provider workloads and engine Deployments).
    pub deployments: Store<Deployment>,
    /// Managed provider StatefulSets.
    pub statefulsets: Store<StatefulSet>,
    /// Managed provider Services.
    pub services: Store<Service>,
    /// Managed provider HPAs.
    pub hpas: Store<HorizontalPodAutoscaler>,
    /// Every CachePolicy.
    pub policies: Store<CachePolicy>,
    /// Every CacheTenant.
    pub tenants: Store<CacheTenant>,
    /// Every CacheIndex.
    pub indexes: Store<CacheIndex>,
    /// Every InferenceObjective (empty without the extension's CRDs).
    pub objectives: Store<InferenceObjective>,
    /// The Pod and Deployment stores by namespace and labels.
    pub index: Indexes,
    /// Bumped on every CachePolicy and CacheTenant change.
    pub changes: Changes,
    /// How many kinds have completed their first LIST.
    synced: watch::Receiver<usize>,
}

/// The number of watched kinds.
const KINDS: usize = 9;

impl Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores")
            .field("backends", &self.backends.len())
            .field("pods", &self.pods.len())
            .field("deployments", &self.deployments.len())
            .finish_non_exhaustive()
    }
}

/// Change counters the pushers wait on (a `watch` channel keeps only the
/// latest value, so a burst of edits wakes a pusher once).
#[derive(Clone, Debug)]
pub struct Changes {
    /// CachePolicy and InferenceObjective events.
    pub policies: watch::Receiver<u64>,
    /// CacheTenant events.
    pub tenants: watch::Receiver<u64>,
}

/// A stream of changed objects for a kube-runtime controller.
pub type Feed<K> = futures::stream::BoxStream<'static, Result<K, watcher::Error>>;

/// The event streams the kube-runtime controllers consume, fanned out from
/// the same watches that fill the stores (kube's own shared-stream handle
/// stalls for good when an object it was told about is deleted before it
/// is read, so the fan-out is ours). A feed that is dropped stops
/// receiving; one that is kept must be read, or its watch waits.
pub struct Feeds {
    /// Applied CacheBackends (the reconciler's main stream).
    pub backends: Feed<CacheBackend>,
    /// Applied and deleted Pods, for the CacheBackend reconciler.
    pub backend_pods: Feed<Pod>,
    /// Applied Pods (the engine-pod handler's main stream).
    pub pods: Feed<Pod>,
    /// Applied and deleted Deployments.
    pub deployments: Feed<Deployment>,
    /// Applied and deleted managed StatefulSets.
    pub statefulsets: Feed<StatefulSet>,
    /// Applied and deleted managed Services.
    pub services: Feed<Service>,
    /// Applied and deleted managed HPAs.
    pub hpas: Feed<HorizontalPodAutoscaler>,
}

impl Debug for Feeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feeds").finish_non_exhaustive()
    }
}

/// Which changes a feed carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Carries {
    /// Created or modified objects.
    Applied,
    /// Deleted ones too (owned and watched kinds wake their owner).
    Touched,
}

/// Why the stores could not start.
#[derive(Debug, thiserror::Error)]
pub enum StoresError {
    /// The watches stopped before every first LIST completed (shutdown).
    #[error("the watches stopped before every store synced")]
    Stopped,
}

/// Drops managed fields and the last-applied copy of any stored kind.
fn trim_meta<K: Resource>(object: &mut K) {
    k8s::trim_metadata(object.meta_mut());
}

fn managed() -> watcher::Config {
    watcher::Config::default().labels(&format!(
        "{}={}",
        ic_api::consts::labels::MANAGED_BY,
        ic_api::consts::labels::MANAGED_BY_VALUE
    ))
}

/// Starts one watch per kind on `set`, each ending with `stop`.
pub fn start(
    client: &kube::Client,
    metrics: &Metrics,
    set: &mut JoinSet<()>,
    stop: &CancellationToken,
) -> (Stores, Feeds) {
    let (synced_tx, synced) = watch::channel(0usize);
    let mut w = Watches {
        set,
        stop,
        metrics,
        synced: Arc::new(synced_tx),
        optional: false,
    };
    let c = || client.clone();
    let all = watcher::Config::default;
    let index = Indexes::default();
    let (pod_index, deployment_index) = (index.pods.clone(), index.deployments.clone());
    let (backends, mut backend_feeds, _) = w.watch(
        "CacheBackend",
        Api::all(c()),
        all(),
        trim_meta::<CacheBackend>,
        &[Carries::Applied],
        unindexed,
    );
    let (pods, mut pod_feeds, _) = w.watch(
        "Pod",
        Api::all(c()),
        all(),
        k8s::trim_pod,
        &[Carries::Touched, Carries::Applied],
        move |event, store| pod_index.apply_watcher_event(event, store),
    );
    let (deployments, mut deployment_feeds, _) = w.watch(
        "Deployment",
        Api::all(c()),
        all(),
        trim_meta::<Deployment>,
        &[Carries::Touched],
        move |event, store| deployment_index.apply_watcher_event(event, store),
    );
    let (statefulsets, mut statefulset_feeds, _) = w.watch(
        "StatefulSet",
        Api::all(c()),
        managed(),
        trim_meta::<StatefulSet>,
        &[Carries::Touched],
        unindexed,
    );
    let (services, mut service_feeds, _) = w.watch(
        "Service",
        Api::all(c()),
        managed(),
        trim_meta::<Service>,
        &[Carries::Touched],
        unindexed,
    );
    let (hpas, mut hpa_feeds, _) = w.watch(
        "HorizontalPodAutoscaler",
        Api::all(c()),
        managed(),
        trim_meta::<HorizontalPodAutoscaler>,
        &[Carries::Touched],
        unindexed,
    );
    let (policies, _, policy_changes) = w.watch(
        "CachePolicy",
        Api::all(c()),
        all(),
        trim_meta::<CachePolicy>,
        &[],
        unindexed,
    );
    let (tenants, _, tenant_changes) = w.watch(
        "CacheTenant",
        Api::all(c()),
        all(),
        trim_meta::<CacheTenant>,
        &[],
        unindexed,
    );
    let (indexes, _, _) = w.watch(
        "CacheIndex",
        Api::all(c()),
        all(),
        trim_meta::<CacheIndex>,
        &[],
        unindexed,
    );
    w.optional = true;
    let (objectives, _, objective_changes) = w.watch(
        "InferenceObjective",
        Api::all(c()),
        all(),
        trim_meta::<InferenceObjective>,
        &[],
        unindexed,
    );
    w.optional = false;
    let policy_changes = merged(policy_changes, objective_changes, w.set, stop);
    let stores = Stores {
        backends,
        pods,
        deployments,
        statefulsets,
        services,
        hpas,
        policies,
        tenants,
        indexes,
        objectives,
        index,
        changes: Changes {
            policies: policy_changes,
            tenants: tenant_changes,
        },
        synced,
    };
    let feeds = Feeds {
        backends: backend_feeds.remove(0),
        backend_pods: pod_feeds.remove(0),
        pods: pod_feeds.remove(0),
        deployments: deployment_feeds.remove(0),
        statefulsets: statefulset_feeds.remove(0),
        services: service_feeds.remove(0),
        hpas: hpa_feeds.remove(0),
    };
    (stores, feeds)
}

struct Watches<'a> {
    set: &'a mut JoinSet<()>,
    stop: &'a CancellationToken,
    metrics: &'a Metrics,
    synced: Arc<watch::Sender<usize>>,
    /// The next watch does not count towards [`Stores::synced`].
    optional: bool,
}

/// One change counter bumped by either of two.
fn merged(
    mut a: watch::Receiver<u64>,
    mut b: watch::Receiver<u64>,
    set: &mut JoinSet<()>,
    stop: &CancellationToken,
) -> watch::Receiver<u64> {
    let (tx, rx) = watch::channel(0u64);
    let stop = stop.clone();
    set.spawn(async move {
        loop {
            let changed = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                r = a.changed() => r,
                r = b.changed() => r,
            };
            if changed.is_err() {
                return;
            }
            tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    });
    rx
}

/// The `on_event` of a kind nothing indexes.
fn unindexed<K: Resource<DynamicType = ()> + Clone + 'static>(_: &watcher::Event<K>, _: &Store<K>) {
}

impl Watches<'_> {
    /// One reflector for `K`: its store, one feed per entry of `feeds`, and
    /// a change counter. `on_event` sees every event once the store has
    /// applied it, before anyone is told (a first `InitDone` marks the
    /// kind synced).
    fn watch<K>(
        &mut self,
        kind: &'static str,
        api: Api<K>,
        config: watcher::Config,
        trim: impl FnMut(&mut K) + Send + 'static,
        feeds: &[Carries],
        mut on_event: impl FnMut(&watcher::Event<K>, &Store<K>) + Send + 'static,
    ) -> (Store<K>, Vec<Feed<K>>, watch::Receiver<u64>)
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let (reader, writer) = reflector::store::<K>();
        let (changed_tx, changed_rx) = watch::channel(0u64);
        let mut senders = Vec::new();
        let mut streams = Vec::new();
        for carries in feeds {
            let (tx, rx) = mpsc::channel::<K>(FEED_BUFFER);
            senders.push((tx, *carries));
            streams.push(feed_stream(rx));
        }
        let objects = self
            .metrics
            .watched_objects
            .get_or_create(&crate::metrics::KindLabel { kind })
            .clone();
        let store = reader.clone();
        let stream = watcher(api, config)
            .modify(trim)
            .default_backoff()
            .reflect(writer);
        let stop = self.stop.clone();
        let synced = self.synced.clone();
        let mut counted = self.optional;
        self.set.spawn(async move {
            let mut stream = std::pin::pin!(stream);
            loop {
                let next = tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    next = stream.next() => next,
                };
                let event = match next {
                    Some(Ok(event)) => event,
                    Some(Err(e)) => {
                        tracing::warn!(kind, error = %e, "watch failed; retrying with backoff");
                        continue;
                    }
                    None => return,
                };
                on_event(&event, &store);
                objects.set(i64::try_from(store.len()).unwrap_or(i64::MAX));
                changed_tx.send_modify(|n| *n = n.wrapping_add(1));
                let (object, deleted) = match &event {
                    watcher::Event::Apply(o) | watcher::Event::InitApply(o) => (o, false),
                    watcher::Event::Delete(o) => (o, true),
                    watcher::Event::InitDone => {
                        if !counted {
                            counted = true;
                            synced.send_modify(|n| *n += 1);
                        }
                        continue;
                    }
                    watcher::Event::Init => continue,
                };
                for (tx, carries) in &senders {
                    if deleted && *carries == Carries::Applied {
                        continue;
                    }
                    // A dropped feed is not an error: nobody reads it.
                    let _ = tx.send(object.clone()).await;
                }
            }
        });
        (reader, streams, changed_rx)
    }
}

fn feed_stream<K: Send + 'static>(rx: mpsc::Receiver<K>) -> Feed<K> {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|object| (Ok(object), rx))
    })
    .boxed()
}

impl Stores {
    /// Waits until every store has completed its first LIST. (Not kube's
    /// `Store::wait_until_ready`: it wakes only the last of several
    /// concurrent waiters.)
    pub async fn synced(&self) -> Result<(), StoresError> {
        let mut synced = self.synced.clone();
        synced
            .wait_for(|n| *n >= KINDS)
            .await
            .map(|_| ())
            .map_err(|_| StoresError::Stopped)
    }

    /// Every stored object of `store`, sorted by namespace and name.
    pub fn all<K>(store: &Store<K>) -> Vec<Arc<K>>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let mut out = store.state();
        out.sort_by_key(|o| (o.namespace().unwrap_or_default(), o.name_any()));
        out
    }
}

/// Owned copies of `objects` (the pure readers take slices of objects).
pub fn owned<K: Clone>(objects: &[Arc<K>]) -> Vec<K> {
    objects.iter().map(|o| K::clone(o)).collect()
}

/// Writers of stores that no watch feeds: tests and tools fill them with
/// [`replace_all`] and hand the [`Stores`] to the loops, so a single pass
/// can be driven (and its API calls counted) without watches.
pub struct StoreWriters {
    /// CacheBackends.
    pub backends: Writer<CacheBackend>,
    /// Pods (and their index).
    pub pods: IndexedWriter<Pod>,
    /// Deployments (and their index).
    pub deployments: IndexedWriter<Deployment>,
    /// StatefulSets.
    pub statefulsets: Writer<StatefulSet>,
    /// Services.
    pub services: Writer<Service>,
    /// HPAs.
    pub hpas: Writer<HorizontalPodAutoscaler>,
    /// CachePolicies.
    pub policies: Writer<CachePolicy>,
    /// CacheTenants.
    pub tenants: Writer<CacheTenant>,
    /// CacheIndexes.
    pub indexes: Writer<CacheIndex>,
    /// InferenceObjectives.
    pub objectives: Writer<InferenceObjective>,
    /// Senders of [`Stores::changes`].
    pub policy_changes: watch::Sender<u64>,
    /// Senders of [`Stores::changes`].
    pub tenant_changes: watch::Sender<u64>,
    _synced: watch::Sender<usize>,
}

impl Debug for StoreWriters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWriters").finish_non_exhaustive()
    }
}

/// Empty, synced stores fed by hand.
pub fn detached() -> (Stores, StoreWriters) {
    fn one<K>() -> (Store<K>, Writer<K>)
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let (reader, mut writer) = reflector::store();
        replace_all(&mut writer, Vec::new());
        (reader, writer)
    }
    let (backends, backends_w) = one();
    let (pods, pods_w) = one();
    let (deployments, deployments_w) = one();
    let index = Indexes::default();
    let pods_w = IndexedWriter::new(pods_w, index.pods.clone());
    let deployments_w = IndexedWriter::new(deployments_w, index.deployments.clone());
    let (statefulsets, statefulsets_w) = one();
    let (services, services_w) = one();
    let (hpas, hpas_w) = one();
    let (policies, policies_w) = one();
    let (tenants, tenants_w) = one();
    let (indexes, indexes_w) = one();
    let (objectives, objectives_w) = one();
    let (policy_changes, policies_rx) = watch::channel(0);
    let (tenant_changes, tenants_rx) = watch::channel(0);
    let (synced_tx, synced) = watch::channel(KINDS);
    let stores = Stores {
        backends,
        pods,
        deployments,
        statefulsets,
        services,
        hpas,
        policies,
        tenants,
        indexes,
        objectives,
        index,
        changes: Changes {
            policies: policies_rx,
            tenants: tenants_rx,
        },
        synced,
    };
    let writers = StoreWriters {
        backends: backends_w,
        pods: pods_w,
        deployments: deployments_w,
        statefulsets: statefulsets_w,
        services: services_w,
        hpas: hpas_w,
        policies: policies_w,
        tenants: tenants_w,
        indexes: indexes_w,
        objectives: objectives_w,
        policy_changes,
        tenant_changes,
        _synced: synced_tx,
    };
    (stores, writers)
}

/// Makes `writer`'s store (and index) hold exactly `objects` (as a watch's
/// re-list does).
pub fn replace_all<W: ApplyEvent>(writer: &mut W, objects: Vec<W::Object>) {
    writer.apply_event(&watcher::Event::Init);
    for object in objects {
        writer.apply_event(&watcher::Event::InitApply(object));
    }
    writer.apply_event(&watcher::Event::InitDone);
}
