//! The engine-pod index: the Pod and Deployment stores indexed by namespace
//! and labels ([`ic_controller_core::index::NamespacedIndex`]), so a
//! CacheBackend reconcile reads its own namespace's matching pods and
//! Deployments rather than filtering every object of the cluster.
//!
//! The index follows its reflector store event by event (the watch loop in
//! [`crate::stores`] hands it each event after the store applied it) and
//! holds the store's own `Arc`s: an `Apply` indexes the object the store now
//! holds, a `Delete` drops it, and a re-list (`Init`, `InitApply`…,
//! `InitDone`) leaves both serving the previous list until `InitDone`, when
//! the index is reset to what the store then holds — objects deleted while
//! the watch was down are dropped.

use std::fmt;
use std::sync::Arc;

use ic_controller_core::index::{Indexed, NamespacedIndex};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use parking_lot::RwLock;

/// A shared index of one kind: read by the loops, written by its watch.
pub struct Index<K> {
    inner: Arc<RwLock<NamespacedIndex<K>>>,
}

impl<K> Clone for Index<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<K> Default for Index<K> {
    fn default() -> Self {
        Self {
            inner: Arc::new(RwLock::new(NamespacedIndex::default())),
        }
    }
}

impl<K> fmt::Debug for Index<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Index")
            .field("len", &self.inner.read().len())
            .finish()
    }
}

/// The indexed kinds.
#[derive(Clone, Debug, Default)]
pub struct Indexes {
    /// Every stored Pod.
    pub pods: Index<Pod>,
    /// Every stored Deployment.
    pub deployments: Index<Deployment>,
}

// === impl Index ===

impl<K> Index<K> {
    /// How many objects it holds (as many as its store, once synced).
    pub fn len(&self) -> usize {
        self.inner.read().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.inner.read().is_empty()
    }

    /// Every object of `namespace`, sorted by name.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        self.inner.read().in_namespace(namespace)
    }

    /// The objects of `namespace` that `match_labels` selects, sorted by name.
    pub fn matching(
        &self,
        namespace: &str,
        match_labels: Option<&std::collections::BTreeMap<String, String>>,
    ) -> Vec<Arc<K>> {
        self.inner.read().matching(namespace, match_labels)
    }

    /// The objects of `namespace` that `match_labels` selects or that name
    /// `injected_by` as their injector, sorted by name.
    pub fn matching_or_injected(
        &self,
        namespace: &str,
        match_labels: Option<&std::collections::BTreeMap<String, String>>,
        injected_by: &str,
    ) -> Vec<Arc<K>> {
        self.inner
            .read()
            .matching_or_injected(namespace, match_labels, injected_by)
    }
}

impl<K> Index<K>
where
    K: Indexed + Resource<DynamicType = ()> + Clone + 'static,
{
    /// Follows `store` through `event`, which the store has just applied.
    pub(crate) fn apply_watcher_event(&self, event: &watcher::Event<K>, store: &Store<K>) {
        match event {
            watcher::Event::Apply(object) => {
                let held = store
                    .get(&ObjectRef::from_obj(object))
                    .unwrap_or_else(|| Arc::new(object.clone()));
                self.inner.write().apply(held);
            }
            watcher::Event::Delete(object) => {
                if let (Some(ns), Some(name)) = (object.namespace(), object.name()) {
                    self.inner.write().delete(ns, name);
                }
            }
            // The store keeps serving the previous list until InitDone.
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => self.inner.write().reset(store.state()),
        }
    }
}

/// Anything a watch event can be applied to: a store's writer, or a writer
/// together with its store's index.
pub trait ApplyEvent {
    /// The watched kind.
    type Object;
    /// Applies one watch event.
    fn apply_event(&mut self, event: &watcher::Event<Self::Object>);
}

impl<K> ApplyEvent for Writer<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    type Object = K;
    fn apply_event(&mut self, event: &watcher::Event<K>) {
        self.apply_watcher_event(event);
    }
}

/// A store's writer and the index that follows the store.
pub struct IndexedWriter<K: Resource<DynamicType = ()> + Clone + 'static> {
    writer: Writer<K>,
    store: Store<K>,
    index: Index<K>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> fmt::Debug for IndexedWriter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IndexedWriter").finish_non_exhaustive()
    }
}

impl<K> IndexedWriter<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    /// `writer`, followed by `index`.
    pub fn new(writer: Writer<K>, index: Index<K>) -> Self {
        let store = writer.as_reader();
        Self {
            writer,
            store,
            index,
        }
    }
}

impl<K> ApplyEvent for IndexedWriter<K>
where
    K: Indexed + Resource<DynamicType = ()> + Clone + 'static,
{
    type Object = K;
    fn apply_event(&mut self, event: &watcher::Event<K>) {
        self.writer.apply_watcher_event(event);
        self.index.apply_watcher_event(event, &self.store);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::ResourceExt;
    use kube::runtime::reflector;

    fn pod(ns: &str, name: &str, app: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some([("app".to_owned(), app.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    fn llm() -> std::collections::BTreeMap<String, String> {
        [("app".to_owned(), "llm".to_owned())].into()
    }

    fn names(pods: &[Arc<Pod>]) -> Vec<String> {
        pods.iter().map(|p| p.name_any()).collect()
    }

    fn writer() -> (Store<Pod>, Index<Pod>, IndexedWriter<Pod>) {
        let (store, writer) = reflector::store::<Pod>();
        let index = Index::default();
        (store, index.clone(), IndexedWriter::new(writer, index))
    }

    #[test]
    fn follows_apply_and_delete_sharing_the_stores_objects() {
        let (store, index, mut w) = writer();
        w.apply_event(&watcher::Event::Apply(pod("a", "p", "llm")));
        w.apply_event(&watcher::Event::Apply(pod("a", "q", "llm")));
        let held = index.matching("a", Some(&llm()));
        assert_eq!(names(&held), ["p", "q"]);
        let stored = store.get(&ObjectRef::new("p").within("a"));
        assert!(stored.is_some_and(|s| Arc::ptr_eq(&s, &held[0])));
        w.apply_event(&watcher::Event::Apply(pod("a", "p", "web")));
        assert_eq!(names(&index.matching("a", Some(&llm()))), ["q"]);
        w.apply_event(&watcher::Event::Delete(pod("a", "q", "llm")));
        assert!(index.matching("a", Some(&llm())).is_empty());
        assert_eq!(index.len(), store.state().len());
    }

    #[test]
    fn a_relist_keeps_the_old_view_until_done_then_drops_the_missing() {
        let (store, index, mut w) = writer();
        w.apply_event(&watcher::Event::Apply(pod(
            "a",
            "deleted-while-away",
            "llm",
        )));
        w.apply_event(&watcher::Event::Apply(pod("a", "kept", "llm")));
        w.apply_event(&watcher::Event::Init);
        w.apply_event(&watcher::Event::InitApply(pod("a", "kept", "llm")));
        w.apply_event(&watcher::Event::InitApply(pod("b", "new", "llm")));
        assert_eq!(
            names(&index.matching("a", Some(&llm()))),
            ["deleted-while-away", "kept"],
            "served as the store serves it until InitDone"
        );
        w.apply_event(&watcher::Event::InitDone);
        assert_eq!(names(&index.matching("a", Some(&llm()))), ["kept"]);
        assert_eq!(names(&index.matching("b", Some(&llm()))), ["new"]);
        assert_eq!(index.len(), store.state().len());
    }
}
