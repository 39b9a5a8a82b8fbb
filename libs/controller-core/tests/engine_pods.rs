//! Engine-pod reduction from real Pod objects, and the engine-pod Events.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use ic_adapters::runtime::find_engine_container;
use ic_api::cachebackend::Runtime;
use ic_api::consts::{annotations, events, injected};
use ic_controller_core::observe::{self, BackendRef, KernelCheck};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_owned(), "vllm".to_owned())])
}

/// The kvevent-subscriber as the webhook injects it: marked with
/// `INFERENCECACHE_INJECTED=<container name>`.
fn subscriber() -> serde_json::Value {
    json!({
        "name": injected::SUBSCRIBER_CONTAINER,
        "image": "ghcr.io/inferencecache/kvevent-subscriber:dev",
        "env": [{"name": injected::MARKER_ENV, "value": injected::SUBSCRIBER_CONTAINER}],
    })
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
        "spec": {"containers": [{"name": "vllm"}, subscriber()]},
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
    let oom = status(json!({"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}));
    assert!(
        matches!(observe::kernel_check_from_status(&oom), KernelCheck::Error(m) if m.contains("OOM-killed") && m.contains("137")),
        "{:?}",
        observe::kernel_check_from_status(&oom)
    );
    let garbage = status(json!({"state": {"terminated": {"exitCode": 2, "reason": "Error"}}}));
    assert!(
        matches!(observe::kernel_check_from_status(&garbage), KernelCheck::Error(m) if m.contains("exited 2") && m.contains("Error"))
    );
    let inconclusive = status(json!({"state": {"terminated": {"exitCode": 0,
        "message": "LMCACHE_KERNELS=inconclusive\nthe check timed out after 240s loading torch and the lmcache extension\n"}}}));
    assert_eq!(
        observe::kernel_check_from_status(&inconclusive),
        KernelCheck::Error(
            "kernel check inconclusive: the check timed out after 240s loading torch and the lmcache extension"
                .into()
        )
    );
}

#[test]
fn remote_client_verdict_from_the_check_and_its_condition() {
    let status = |message: &str| -> k8s_openapi::api::core::v1::ContainerStatus {
        serde_json::from_value(
            json!({"name": "lmcache-kernel-check", "image": "i", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "message": message}}}),
        )
        .unwrap()
    };
    let both = status(
        "LMCACHE_KERNELS=ok\nlmcache 0.5.6: loaded cuda_ops\nLMCACHE_REMOTE=failed\nno module named mooncake\n",
    );
    assert_eq!(
        observe::kernel_check_from_status(&both),
        KernelCheck::Healthy
    );
    assert_eq!(
        observe::remote_client_from_status(&both),
        Some(Err("no module named mooncake".into()))
    );
    let kernels_only = status("LMCACHE_KERNELS=failed\nundefined symbol\n");
    assert_eq!(observe::remote_client_from_status(&kernels_only), None);
    assert_eq!(
        observe::kernel_check_from_status(&kernels_only),
        KernelCheck::Failed("undefined symbol".into())
    );
    let fine = status("LMCACHE_KERNELS=ok\nx\nLMCACHE_REMOTE=ok\nmooncake.store imports\n");
    assert_eq!(observe::remote_client_from_status(&fine), Some(Ok(())));

    let pod = |name: &str, remote: Option<Result<(), String>>, looping: bool| observe::EnginePod {
        name: name.into(),
        injected_by_this: true,
        remote_client: remote,
        engine_crash_looping: looping,
        ..observe::EnginePod::default()
    };
    assert_eq!(
        observe::engine_compatibility(&[pod("a", Some(Ok(())), false)]),
        None
    );
    let (st, reason, msg) = observe::engine_compatibility(&[
        pod("a", Some(Ok(())), false),
        pod("b", Some(Err("no module named mooncake".into())), false),
    ])
    .expect("a verdict");
    assert_eq!((st, reason), ("False", "RemoteClientMissing"));
    assert!(msg.contains("b: no module named mooncake"), "{msg}");
    // A crash loop is the louder problem and wins.
    let (_, reason, _) = observe::engine_compatibility(&[
        pod("b", Some(Err("x".into())), false),
        pod("c", None, true),
    ])
    .expect("a verdict");
    assert_eq!(reason, "InjectedEngineCrashLooping");
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

#[test]
fn wired_pod_engine_is_found_past_the_injected_containers() {
    // An SGLang pod after wiring: the engine (not named after the runtime),
    // the marked kvevent-subscriber, and the marked MP worker as a native
    // sidecar init container.
    let wired = pod(json!({
        "metadata": {"name": "engine-0"},
        "spec": {
            "initContainers": [{
                "name": injected::MP_WORKER_CONTAINER,
                "restartPolicy": "Always",
                "env": [{"name": injected::MARKER_ENV, "value": injected::MP_WORKER_CONTAINER}],
            }],
            "containers": [
                {"name": "server", "env": [{"name": "HF_HOME", "value": "/models"}]},
                subscriber(),
            ],
        },
        "status": {"containerStatuses": [
            {"name": "server", "image": "i", "imageID": "", "ready": false, "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}}},
            {"name": "kvevent-subscriber", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}},
        ]},
    }));
    assert_eq!(observe::engine_container_name(&wired), Some("server"));
    let backend = BackendRef {
        namespace: "ns",
        name: "cb",
        uid: "uid-1",
        match_labels: None,
    };
    assert!(observe::summarize_pod(&wired, backend).engine_crash_looping);

    // The subscriber crash-looping is not the engine crash-looping.
    let mut quiet = wired.clone();
    let statuses = quiet
        .status
        .as_mut()
        .unwrap()
        .container_statuses
        .as_mut()
        .unwrap();
    statuses.swap(0, 1);
    statuses[0].name = "server".into();
    statuses[0].state = serde_json::from_value(json!({"running": {}})).unwrap();
    statuses[1].name = "kvevent-subscriber".into();
    statuses[1].state =
        serde_json::from_value(json!({"waiting": {"reason": "CrashLoopBackOff"}})).unwrap();
    assert!(!observe::summarize_pod(&quiet, backend).engine_crash_looping);
}

#[test]
fn engine_choice_agrees_with_the_webhook() {
    let cases = [
        // Wired single-engine pod: the unmarked container, whatever its name.
        json!([{"name": "server"}, subscriber()]),
        // Wired multi-container pod: the one named after the runtime.
        json!([{"name": "proxy"}, {"name": "vllm"}, subscriber()]),
        json!([{"name": "sglang"}, {"name": "proxy"}, subscriber()]),
        // A user container that merely shares the subscriber's name is not
        // injected (no marker), so it counts as a candidate.
        json!([{"name": "server"}, {"name": injected::SUBSCRIBER_CONTAINER}]),
        json!([{"name": "vllm"}, {"name": injected::SUBSCRIBER_CONTAINER}]),
        // Unwired.
        json!([{"name": "engine"}]),
        // No engine at all.
        json!([{"name": "a"}, {"name": "b"}, subscriber()]),
        json!([subscriber()]),
    ];
    for containers in cases {
        let p = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": containers}}));
        let spec = p.spec.as_ref().unwrap();
        let chosen = observe::engine_container_name(&p);
        let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        // Whichever runtime wired the pod, the webhook's choice (when it
        // found one) is the controller's.
        let by_webhook: Vec<Option<&str>> = [Runtime::Vllm, Runtime::SGLang]
            .into_iter()
            .map(|r| {
                find_engine_container(spec, r)
                    .ok()
                    .map(|i| spec.containers[i].name.as_str())
            })
            .collect();
        match chosen {
            Some(name) => assert!(
                by_webhook.contains(&Some(name)),
                "{names:?}: controller chose {name:?}, webhook {by_webhook:?}"
            ),
            None => assert_eq!(by_webhook, [None, None], "{names:?}"),
        }
        for found in by_webhook.into_iter().flatten() {
            assert_eq!(chosen, Some(found), "{names:?}");
        }
    }
}
