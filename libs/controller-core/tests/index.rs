//! The namespace- and label-keyed index answers every read exactly as a
//! scan of the same objects does, after any sequence of applies, deletes
//! and re-lists.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use ic_api::consts::annotations;
use ic_controller_core::index::{Indexed, NamespacedIndex};
use ic_controller_core::observe::selector_matches;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;

const NAMESPACES: [&str; 3] = ["a", "b", "c"];
const NAMES: [&str; 5] = ["p0", "p1", "p2", "p3", "p4"];
const APPS: [&str; 3] = ["llm", "web", "db"];

#[derive(Debug, Clone)]
enum Op {
    Apply(Box<Pod>),
    Delete(usize, usize),
    Reset(Vec<Pod>),
}

fn pod(ns: usize, name: usize, app: usize, tier: Option<usize>, injector: Option<usize>) -> Pod {
    let mut labels = BTreeMap::from([("app".to_owned(), APPS[app].to_owned())]);
    if let Some(t) = tier {
        labels.insert("tier".to_owned(), format!("t{t}"));
    }
    Pod {
        metadata: ObjectMeta {
            namespace: Some(NAMESPACES[ns].into()),
            name: Some(NAMES[name].into()),
            labels: Some(labels),
            annotations: injector.map(|i| {
                BTreeMap::from([(
                    annotations::INJECTED_BY.to_owned(),
                    format!("{}/cache", NAMESPACES[i]),
                )])
            }),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

fn any_pod() -> impl Strategy<Value = Pod> {
    (
        0..NAMESPACES.len(),
        0..NAMES.len(),
        0..APPS.len(),
        proptest::option::of(0..2usize),
        proptest::option::of(0..NAMESPACES.len()),
    )
        .prop_map(|(ns, name, app, tier, injector)| pod(ns, name, app, tier, injector))
}

fn any_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any_pod().prop_map(|p| Op::Apply(Box::new(p))),
        2 => (0..NAMESPACES.len(), 0..NAMES.len()).prop_map(|(n, p)| Op::Delete(n, p)),
        1 => proptest::collection::vec(any_pod(), 0..12).prop_map(Op::Reset),
    ]
}

/// The scan the index replaces: every object, filtered and sorted by name.
fn scan<'a>(
    all: &'a HashMap<(String, String), Pod>,
    ns: &str,
    keep: impl Fn(&Pod) -> bool + 'a,
) -> Vec<String> {
    let mut out: Vec<String> = all
        .iter()
        .filter(|((n, _), p)| n == ns && keep(p))
        .map(|((_, name), _)| name.clone())
        .collect();
    out.sort();
    out
}

fn names(pods: &[Arc<Pod>]) -> Vec<String> {
    pods.iter()
        .filter_map(|p| p.name().map(str::to_owned))
        .collect()
}

proptest! {
    #[test]
    fn reads_equal_a_scan(ops in proptest::collection::vec(any_op(), 0..40)) {
        let mut index = NamespacedIndex::default();
        let mut all: HashMap<(String, String), Pod> = HashMap::new();
        let key = |p: &Pod| {
            (
                p.metadata.namespace.clone().unwrap_or_default(),
                p.metadata.name.clone().unwrap_or_default(),
            )
        };
        for op in ops {
            match op {
                Op::Apply(p) => {
                    all.insert(key(&p), (*p).clone());
                    index.apply(Arc::new(*p));
                }
                Op::Delete(n, p) => {
                    all.remove(&(NAMESPACES[n].to_owned(), NAMES[p].to_owned()));
                    index.delete(NAMESPACES[n], NAMES[p]);
                }
                Op::Reset(pods) => {
                    all = pods.iter().map(|p| (key(p), p.clone())).collect();
                    // A re-list holds each object once: the last copy wins.
                    index.reset(all.values().cloned().map(Arc::new));
                }
            }
            prop_assert_eq!(index.len(), all.len());
        }
        let selectors: Vec<Option<BTreeMap<String, String>>> = vec![
            None,
            Some(BTreeMap::new()),
            Some(BTreeMap::from([("app".to_owned(), "llm".to_owned())])),
            Some(BTreeMap::from([
                ("app".to_owned(), "llm".to_owned()),
                ("tier".to_owned(), "t1".to_owned()),
            ])),
            Some(BTreeMap::from([("tier".to_owned(), "t0".to_owned())])),
        ];
        for ns in NAMESPACES {
            prop_assert_eq!(names(&index.in_namespace(ns)), scan(&all, ns, |_| true));
            for sel in &selectors {
                let want = |p: &Pod| selector_matches(sel.as_ref(), p.metadata.labels.as_ref());
                prop_assert_eq!(names(&index.matching(ns, sel.as_ref())), scan(&all, ns, want));
                let by = format!("{ns}/cache");
                let either = |p: &Pod| {
                    want(p) || p.injected_by() == Some(by.as_str())
                };
                prop_assert_eq!(
                    names(&index.matching_or_injected(ns, sel.as_ref(), &by)),
                    scan(&all, ns, either)
                );
            }
        }
    }
}
