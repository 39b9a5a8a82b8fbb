//! A namespace- and label-keyed index of watched objects (engine Pods and
//! Deployments), kept in step with the watch instead of being rebuilt by a
//! scan of the whole cluster-wide store on every reconcile — linkerd2's
//! `k8s/index` pattern (kubert's `IndexNamespacedResource`: apply, delete,
//! reset). Per namespace it holds the objects by name, the names carrying
//! each label pair, and the names each CacheBackend says it injected, so a
//! reconcile reads only its namespace's matching objects, sorted by name as
//! a sorted store scan returned them.
//!
//! The index holds the caller's `Arc`s (the service shares them with its
//! reflector store, so an object is kept once) and knows nothing of kube or
//! locks: the service wraps it in one and feeds it watch events.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use ic_api::consts::annotations;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;

/// What the index reads of an object.
pub trait Indexed {
    /// `metadata.namespace`; objects without one are not indexed.
    fn namespace(&self) -> Option<&str>;
    /// `metadata.name`; objects without one are not indexed.
    fn name(&self) -> Option<&str>;
    /// The labels an engine selector is matched against.
    fn selector_labels(&self) -> Option<&BTreeMap<String, String>>;
    /// The `<namespace>/<name>` of the CacheBackend that says it injected
    /// this object.
    fn injected_by(&self) -> Option<&str> {
        None
    }
}

/// A Pod is selected by its own labels and names its injector in the
/// `injected-by` annotation.
impl Indexed for Pod {
    fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }
    fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }
    fn selector_labels(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.labels.as_ref()
    }
    fn injected_by(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(annotations::INJECTED_BY)
            .map(String::as_str)
    }
}

/// A Deployment is selected by its pod template's labels (what
/// `k8s::expected_engine_replicas` matches).
impl Indexed for Deployment {
    fn namespace(&self) -> Option<&str> {
        self.metadata.namespace.as_deref()
    }
    fn name(&self) -> Option<&str> {
        self.metadata.name.as_deref()
    }
    fn selector_labels(&self) -> Option<&BTreeMap<String, String>> {
        self.spec
            .as_ref()?
            .template
            .metadata
            .as_ref()?
            .labels
            .as_ref()
    }
}

/// Every indexed object, by namespace.
#[derive(Debug)]
pub struct NamespacedIndex<K> {
    namespaces: HashMap<String, Namespace<K>>,
    len: usize,
}

/// One namespace's objects and their postings.
#[derive(Debug)]
struct Namespace<K> {
    objects: BTreeMap<String, Arc<K>>,
    /// Label key → value → names of the objects carrying that pair.
    labels: HashMap<String, HashMap<String, BTreeSet<String>>>,
    /// `injected-by` value → names.
    injected: HashMap<String, BTreeSet<String>>,
}

impl<K> Default for NamespacedIndex<K> {
    fn default() -> Self {
        Self {
            namespaces: HashMap::new(),
            len: 0,
        }
    }
}

impl<K> Default for Namespace<K> {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            labels: HashMap::new(),
            injected: HashMap::new(),
        }
    }
}

// === impl NamespacedIndex ===

impl<K: Indexed> NamespacedIndex<K> {
    /// An index of `objects` (as [`Self::reset`] leaves it).
    pub fn from_objects(objects: impl IntoIterator<Item = Arc<K>>) -> Self {
        let mut index = Self::default();
        for object in objects {
            index.apply(object);
        }
        index
    }

    /// Adds `object`, or replaces the object of the same namespace and name
    /// (its old labels and injector no longer find it).
    pub fn apply(&mut self, object: Arc<K>) {
        let (Some(ns), Some(name)) = (object.namespace(), object.name()) else {
            return;
        };
        let (ns, name) = (ns.to_owned(), name.to_owned());
        let namespace = self.namespaces.entry(ns).or_default();
        if let Some(old) = namespace.objects.remove(&name) {
            namespace.unpost(&name, &old);
            self.len -= 1;
        }
        namespace.post(&name, &object);
        namespace.objects.insert(name, object);
        self.len += 1;
    }

    /// Removes the object `namespace/name`, if held.
    pub fn delete(&mut self, namespace: &str, name: &str) {
        let Some(ns) = self.namespaces.get_mut(namespace) else {
            return;
        };
        if let Some(old) = ns.objects.remove(name) {
            ns.unpost(name, &old);
            self.len -= 1;
        }
        if ns.objects.is_empty() {
            self.namespaces.remove(namespace);
        }
    }

    /// Makes the index hold exactly `objects` (a watch's re-list): objects
    /// not among them are dropped, changed ones re-indexed.
    pub fn reset(&mut self, objects: impl IntoIterator<Item = Arc<K>>) {
        *self = Self::from_objects(objects);
    }
}

impl<K> NamespacedIndex<K> {
    /// How many objects the index holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every object of `namespace`, sorted by name.
    pub fn in_namespace(&self, namespace: &str) -> Vec<Arc<K>> {
        self.namespaces
            .get(namespace)
            .map(|ns| ns.objects.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The objects of `namespace` whose selector labels satisfy
    /// `match_labels` (non-empty and a subset, as
    /// `observe::selector_matches` has it: no selector selects nothing),
    /// sorted by name.
    pub fn matching(
        &self,
        namespace: &str,
        match_labels: Option<&BTreeMap<String, String>>,
    ) -> Vec<Arc<K>> {
        let Some(ns) = self.namespaces.get(namespace) else {
            return Vec::new();
        };
        ns.resolve(ns.matching(match_labels).into_iter().flatten())
    }

    /// The objects of `namespace` that [`Self::matching`] selects or that
    /// name `injected_by` as their injector, sorted by name.
    pub fn matching_or_injected(
        &self,
        namespace: &str,
        match_labels: Option<&BTreeMap<String, String>>,
        injected_by: &str,
    ) -> Vec<Arc<K>> {
        let Some(ns) = self.namespaces.get(namespace) else {
            return Vec::new();
        };
        let mut names: BTreeSet<&str> = ns.matching(match_labels).into_iter().flatten().collect();
        if let Some(injected) = ns.injected.get(injected_by) {
            names.extend(injected.iter().map(String::as_str));
        }
        ns.resolve(names)
    }
}

// === impl Namespace ===

impl<K> Namespace<K> {
    /// The names matching `match_labels`, sorted; `None` when nothing can.
    fn matching<'a>(
        &'a self,
        match_labels: Option<&BTreeMap<String, String>>,
    ) -> Option<impl Iterator<Item = &'a str> + 'a> {
        let want = match_labels.filter(|m| !m.is_empty())?;
        let mut postings = want
            .iter()
            .map(|(k, v)| self.labels.get(k)?.get(v))
            .collect::<Option<Vec<&BTreeSet<String>>>>()?;
        // Walk the rarest pair, probe the others.
        postings.sort_by_key(|p| p.len());
        let first = postings.remove(0);
        let rest = postings;
        Some(
            first
                .iter()
                .filter(move |name| rest.iter().all(|p| p.contains(*name)))
                .map(String::as_str),
        )
    }

    fn resolve<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Vec<Arc<K>> {
        names
            .into_iter()
            .filter_map(|n| self.objects.get(n).cloned())
            .collect()
    }
}

impl<K: Indexed> Namespace<K> {
    fn post(&mut self, name: &str, object: &K) {
        for (k, v) in object.selector_labels().into_iter().flatten() {
            self.labels
                .entry(k.clone())
                .or_default()
                .entry(v.clone())
                .or_default()
                .insert(name.to_owned());
        }
        if let Some(by) = object.injected_by() {
            self.injected
                .entry(by.to_owned())
                .or_default()
                .insert(name.to_owned());
        }
    }

    fn unpost(&mut self, name: &str, object: &K) {
        for (k, v) in object.selector_labels().into_iter().flatten() {
            let Some(values) = self.labels.get_mut(k) else {
                continue;
            };
            if let Some(names) = values.get_mut(v) {
                names.remove(name);
                if names.is_empty() {
                    values.remove(v);
                }
            }
            if values.is_empty() {
                self.labels.remove(k);
            }
        }
        if let Some(by) = object.injected_by()
            && let Some(names) = self.injected.get_mut(by)
        {
            names.remove(name);
            if names.is_empty() {
                self.injected.remove(by);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)], injected_by: Option<&str>) -> Arc<Pod> {
        let map = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        Arc::new(Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some(map(labels)),
                annotations: injected_by.map(|b| map(&[(annotations::INJECTED_BY, b)])),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        })
    }

    fn sel(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn names<K: Indexed>(objects: &[Arc<K>]) -> Vec<&str> {
        objects.iter().filter_map(|o| o.name()).collect()
    }

    #[test]
    fn applies_and_selects_by_labels_sorted_by_name() {
        let mut index = NamespacedIndex::default();
        index.apply(pod("a", "llm-2", &[("app", "llm"), ("v", "2")], None));
        index.apply(pod("a", "llm-1", &[("app", "llm"), ("v", "1")], None));
        index.apply(pod("a", "web", &[("app", "web")], None));
        assert_eq!(index.len(), 3);
        let llm = sel(&[("app", "llm")]);
        assert_eq!(names(&index.matching("a", Some(&llm))), ["llm-1", "llm-2"]);
        let v2 = sel(&[("app", "llm"), ("v", "2")]);
        assert_eq!(names(&index.matching("a", Some(&v2))), ["llm-2"]);
        let none = sel(&[("app", "llm"), ("v", "3")]);
        assert!(index.matching("a", Some(&none)).is_empty());
        assert_eq!(names(&index.in_namespace("a")), ["llm-1", "llm-2", "web"]);
    }

    #[test]
    fn no_selector_selects_nothing() {
        let index = NamespacedIndex::from_objects([pod("a", "p", &[("app", "llm")], None)]);
        assert!(index.matching("a", None).is_empty());
        assert!(index.matching("a", Some(&BTreeMap::new())).is_empty());
    }

    #[test]
    fn reapply_with_changed_labels_moves_the_object() {
        let mut index = NamespacedIndex::default();
        index.apply(pod("a", "p", &[("app", "llm")], Some("a/cache")));
        index.apply(pod("a", "p", &[("app", "web")], None));
        assert_eq!(index.len(), 1);
        assert!(
            index
                .matching("a", Some(&sel(&[("app", "llm")])))
                .is_empty()
        );
        assert!(
            index.matching_or_injected("a", None, "a/cache").is_empty(),
            "the old injector no longer finds it"
        );
        assert_eq!(
            names(&index.matching("a", Some(&sel(&[("app", "web")])))),
            ["p"]
        );
    }

    #[test]
    fn delete_removes_the_object_and_its_postings() {
        let mut index = NamespacedIndex::default();
        index.apply(pod("a", "p", &[("app", "llm")], Some("a/cache")));
        index.apply(pod("a", "q", &[("app", "llm")], None));
        index.delete("a", "p");
        index.delete("a", "missing");
        index.delete("nowhere", "p");
        assert_eq!(index.len(), 1);
        let llm = sel(&[("app", "llm")]);
        assert_eq!(
            names(&index.matching_or_injected("a", Some(&llm), "a/cache")),
            ["q"]
        );
        index.delete("a", "q");
        assert!(index.is_empty());
        assert!(index.in_namespace("a").is_empty());
    }

    #[test]
    fn reset_drops_objects_the_relist_no_longer_has() {
        let mut index = NamespacedIndex::default();
        index.apply(pod("a", "gone", &[("app", "llm")], None));
        index.apply(pod("a", "kept", &[("app", "llm")], None));
        index.apply(pod("b", "gone-too", &[("app", "llm")], None));
        index.reset([
            pod("a", "kept", &[("app", "web")], None),
            pod("a", "new", &[("app", "llm")], None),
        ]);
        assert_eq!(index.len(), 2);
        let llm = sel(&[("app", "llm")]);
        assert_eq!(names(&index.matching("a", Some(&llm))), ["new"]);
        assert!(index.in_namespace("b").is_empty());
    }

    #[test]
    fn namespaces_are_kept_apart() {
        let index = NamespacedIndex::from_objects([
            pod("a", "p", &[("app", "llm")], Some("a/cache")),
            pod("b", "p", &[("app", "llm")], Some("a/cache")),
            pod("b", "q", &[("app", "llm")], None),
        ]);
        let llm = sel(&[("app", "llm")]);
        assert_eq!(names(&index.matching("a", Some(&llm))), ["p"]);
        assert_eq!(names(&index.matching("b", Some(&llm))), ["p", "q"]);
        // A pod in b naming a/cache is b's object: a's reads never see it.
        assert_eq!(index.matching_or_injected("a", None, "a/cache").len(), 1);
        assert!(index.in_namespace("c").is_empty());
    }

    #[test]
    fn union_of_selected_and_injected_has_each_pod_once() {
        let index = NamespacedIndex::from_objects([
            pod("a", "both", &[("app", "llm")], Some("a/cache")),
            pod("a", "injected", &[("app", "other")], Some("a/cache")),
            pod("a", "selected", &[("app", "llm")], None),
            pod("a", "neither", &[("app", "other")], Some("a/other")),
        ]);
        let llm = sel(&[("app", "llm")]);
        assert_eq!(
            names(&index.matching_or_injected("a", Some(&llm), "a/cache")),
            ["both", "injected", "selected"]
        );
    }

    #[test]
    fn deployments_are_selected_by_template_labels() {
        let d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "llm", "namespace": "a", "labels": {"app": "chart"}},
            "spec": {"selector": {}, "template": {"metadata": {"labels": {"app": "llm"}}}},
        }))
        .unwrap_or_default();
        let index = NamespacedIndex::from_objects([Arc::new(d)]);
        assert_eq!(
            names(&index.matching("a", Some(&sel(&[("app", "llm")])))),
            ["llm"]
        );
        assert!(
            index
                .matching("a", Some(&sel(&[("app", "chart")])))
                .is_empty()
        );
    }

    #[test]
    fn unnamed_objects_are_not_indexed() {
        let mut index = NamespacedIndex::default();
        index.apply(Arc::new(Pod::default()));
        assert!(index.is_empty());
    }
}
