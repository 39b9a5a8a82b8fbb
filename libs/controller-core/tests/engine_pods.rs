//! Engine-pod reduction from real Pod objects, and the engine-pod Events.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use ic_api::consts::{annotations, events};
use ic_controller_core::observe::{self, BackendRef, KernelCheck};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_owned(), "vllm".to_owned())])
}

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

#[test]
fn summarize_reads_annotations_kernel_check_crash_loop_and_owner() {
    let p = pod(json!({
        "metadata": {
            "name": "engine-7d9f8-abcde",
            "labels": {"app": "vllm", "pod-template-hash": "7d9f8"},
            "annotations": {
                annotations::INJECTED_BY: "ns/cb",
                annotations::INJECTED_BY_UID: "uid-1",
                annotations::LMCACHE_KERNEL_CHECK_MODE: "strict",
            },
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "engine-7d9f8", "uid": "rs", "controller": true}],
        },
        "spec": {"containers": [{"name": "vllm"}, {"name": "kvevent-subscriber"}]},
        "status": {
            "initContainerStatuses": [{
                "name": "lmcache-kernel-check", "image": "i", "imageID": "", "ready": false, "restartCount": 2,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "message": "LMCACHE_KERNELS=failed\nlibcudart.so.13: cannot open shared object file"}},
            }],
            "containerStatuses": [
                {"name": "vllm", "image": "i", "imageID": "", "ready": false, "restartCount": 5, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
                {"name": "kvevent-subscriber", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}},
            ],
        },
    }));
    let l = labels();
    let backend = BackendRef {
        namespace: "ns",
        name: "cb",
        uid: "uid-1",
        match_labels: Some(&l),
    };
    let s = observe::summarize_pod(&p, backend);
    assert!(s.matches_selector);
    assert!(s.injected_by_this);
    assert!(s.engine_crash_looping);
    assert_eq!(s.owner_deployment.as_deref(), Some("engine"));
    assert_eq!(s.admitted_kernel_mode.as_deref(), Some("strict"));
    assert_eq!(
        s.kernel_check,
        Some(KernelCheck::Failed(
            "libcudart.so.13: cannot open shared object file".into()
        ))
    );

    // A one-container engine of any name plus the injected subscriber.
    let mut renamed = p.clone();
    renamed.spec.as_mut().unwrap().containers[0].name = "server".into();
    renamed
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap()[0]
        .name = "server".into();
    assert_eq!(observe::engine_container_name(&renamed), Some("server"));
    assert!(observe::summarize_pod(&renamed, backend).engine_crash_looping);

    // Another CR's UID under the same name: not ours.
    let other = BackendRef {
        uid: "uid-2",
        ..backend
    };
    assert!(!observe::summarize_pod(&p, other).injected_by_this);
}

#[test]
fn kernel_check_states() {
    let status = |v: serde_json::Value| -> k8s_openapi::api::core::v1::ContainerStatus {
        let mut base = json!({"name": "lmcache-kernel-check", "image": "i", "imageID": "", "ready": false, "restartCount": 0});
        base.as_object_mut()
            .unwrap()
            .extend(v.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    };
    let ok = status(
        json!({"state": {"terminated": {"exitCode": 0, "message": "LMCACHE_KERNELS=ok\n"}}}),
    );
    assert_eq!(observe::kernel_check_from_status(&ok), KernelCheck::Healthy);
    let report_only = status(
        json!({"state": {"terminated": {"exitCode": 0, "message": "LMCACHE_KERNELS=failed\nno lmcache.c_ops"}}}),
    );
    assert_eq!(
        observe::kernel_check_from_status(&report_only),
        KernelCheck::Failed("no lmcache.c_ops".into())
    );
    let running = status(json!({"state": {"running": {}}}));
    assert_eq!(
        observe::kernel_check_from_status(&running),
        KernelCheck::Pending
    );
    let garbage =
        status(json!({"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}));
    assert!(
        matches!(observe::kernel_check_from_status(&garbage), KernelCheck::Error(m) if m.contains("137"))
    );
}

fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn injected_event_requires_the_live_uid() {
    let a = ann(&[
        (annotations::INJECTED_BY, "ns/cb"),
        (annotations::INJECTED_BY_UID, "uid-1"),
    ]);
    assert_eq!(
        observe::injected_by(Some(&a)),
        Some(("ns".into(), "cb".into()))
    );
    let e = observe::engine_pod_event(Some(&a), Some("uid-1")).unwrap();
    assert_eq!(e.reason, events::INJECTED_BY_CACHE_BACKEND);
    assert_eq!(e.type_.as_str(), "Normal");
    assert_eq!(
        observe::engine_pod_event(Some(&a), Some("uid-2")),
        None,
        "recreated CR / forgery"
    );
    assert_eq!(
        observe::engine_pod_event(Some(&a), None),
        None,
        "CR not found"
    );
    let no_uid = ann(&[(annotations::INJECTED_BY, "ns/cb")]);
    assert_eq!(
        observe::engine_pod_event(Some(&no_uid), Some("uid-1")),
        None
    );
    assert_eq!(observe::engine_pod_event(None, Some("uid-1")), None);
}

#[test]
fn skipped_event_requires_both_opt_out_and_marker() {
    let both = ann(&[
        (annotations::SKIP_INJECT, "true"),
        (
            annotations::INJECT_SKIPPED,
            annotations::INJECT_SKIPPED_BY_ANNOTATION,
        ),
    ]);
    assert_eq!(
        observe::engine_pod_event(Some(&both), None).unwrap().reason,
        events::SKIPPED_BY_OPERATOR
    );
    let only_skip = ann(&[(annotations::SKIP_INJECT, "true")]);
    assert_eq!(observe::engine_pod_event(Some(&only_skip), None), None);
    let only_marker = ann(&[(
        annotations::INJECT_SKIPPED,
        annotations::INJECT_SKIPPED_BY_ANNOTATION,
    )]);
    assert_eq!(observe::engine_pod_event(Some(&only_marker), None), None);
    let falsy = ann(&[
        (annotations::SKIP_INJECT, "yes"),
        (
            annotations::INJECT_SKIPPED,
            annotations::INJECT_SKIPPED_BY_ANNOTATION,
        ),
    ]);
    assert_eq!(
        observe::engine_pod_event(Some(&falsy), None),
        None,
        "yes is not truthy"
    );
}
