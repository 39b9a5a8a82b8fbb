//! What admission catches that the real packages accept but that would fail
//! only when the engine starts (issue 41 item 8): an SGLang + LMCache worker
//! image without LMCache's MP server, a chunk size SGLang's pages do not
//! divide, SGLang's `bind` field, an LMCache CPU tier switched off with no
//! remote tier; and the pull secrets of a private registry.

mod common;

use common::*;
use ic_adapters::admission::{PodOutcome, admit_pod, validate_backend};
use ic_adapters::runtime::sglang_lmcache::known_bad_worker_image;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

fn sglang(image: &str, args: Value) -> Pod {
    pod(json!({"containers": [{"name": "sglang", "image": image, "args": args}]}))
}

fn rejected(outcome: &PodOutcome) -> &str {
    match outcome {
        PodOutcome::FailOpen(ic_adapters::admission::FailOpenReason::AdapterRejected(d)) => d,
        other => panic!("expected adapter_rejected, got {other:?}"),
    }
}

#[test]
fn known_bad_worker_images_by_name() {
    for bad in [
        "lmsysorg/sglang:v0.5.4",
        "docker.io/lmsysorg/sglang:latest",
        "lmcache/vllm-openai:v0.3.9",
        "docker.io/lmcache/standalone:v0.4.7",
        "lmcache/vllm-openai:0.4.2-cu128",
    ] {
        assert!(known_bad_worker_image(bad).is_some(), "{bad}");
    }
    for fine in [
        "lmcache/vllm-openai:v0.5.6",
        "lmcache/vllm-openai:latest",
        "registry.example.com/sglang-lmcache:v0.5.4",
        "localhost:5000/lmcache/standalone:v0.10.1",
        "lmcache/standalone@sha256:0123",
    ] {
        assert_eq!(known_bad_worker_image(fine), None, "{fine}");
    }
}

#[test]
fn an_sglang_worker_without_lmcache_is_not_wired() {
    // The default worker image is the engine's: SGLang's own has no LMCache.
    let b = backend("cb", json!({"runtime": "SGLang"}));
    let a = admit_pod(
        &sglang("lmsysorg/sglang:v0.5.4", json!([])),
        &[b],
        &config(),
    );
    let why = rejected(&a.outcome);
    assert!(why.contains("does not ship LMCache"), "{why}");
    assert!(
        a.warnings[0].contains("lmCache.workerImage"),
        "{:?}",
        a.warnings
    );
    // An LMCache 0.3 worker image is refused on the CacheBackend itself.
    let old = backend(
        "cb",
        json!({"runtime": "SGLang", "lmCache": {"workerImage": "lmcache/vllm-openai:v0.3.9"}}),
    );
    let errors = validate_backend(&old);
    let e = errors
        .iter()
        .find(|e| e.field == "spec.lmCache.workerImage")
        .unwrap_or_else(|| panic!("{errors:?}"));
    assert!(e.detail.contains("no multiprocess server"), "{e:?}");
    let a = admit_pod(
        &sglang("registry.example.com/sglang-lmcache:v0.5.4", json!([])),
        &[old],
        &config(),
    );
    assert!(rejected(&a.outcome).contains("0.3.9"));
    // vLLM backends name no worker image: nothing to say.
    let vllm = backend(
        "cb",
        json!({"lmCache": {"workerImage": "lmcache/vllm-openai:v0.3.9"}}),
    );
    assert!(
        validate_backend(&vllm)
            .iter()
            .all(|e| e.field != "spec.lmCache.workerImage")
    );
}

#[test]
fn the_worker_checks_its_image_before_it_starts() {
    let b = backend("cb", json!({"runtime": "SGLang"}));
    let a = admit_pod(
        &sglang("registry.example.com/sglang-lmcache:v0.5.4", json!([])),
        &[b],
        &config(),
    );
    assert!(
        matches!(a.outcome, PodOutcome::Injected { .. }),
        "{:?}",
        a.outcome
    );
    let worker = a
        .pod
        .spec
        .as_ref()
        .unwrap()
        .init_containers
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.name == "lmcache-mp-worker")
        .unwrap();
    let script = &worker.command.as_ref().unwrap()[2];
    let check = script.lines().nth(1).unwrap();
    assert!(
        check.contains("lmcache.v1.multiprocess.server") && check.contains("exit 1"),
        "{script}"
    );
    assert_eq!(
        worker.termination_message_policy.as_deref(),
        Some("FallbackToLogsOnError")
    );
}

#[test]
fn a_chunk_sglang_pages_do_not_divide_is_not_wired() {
    let image = "registry.example.com/sglang-lmcache:v0.5.4";
    let b = |chunk: i32| {
        backend(
            "cb",
            json!({"runtime": "SGLang", "lmCache": {"chunkSizeTokens": chunk}}),
        )
    };
    let a = admit_pod(
        &sglang(image, json!(["--page-size", "64"])),
        &[b(100)],
        &config(),
    );
    let why = rejected(&a.outcome);
    assert!(
        why.contains("chunkSizeTokens 100") && why.contains("--page-size 64"),
        "{why}"
    );
    for (args, chunk) in [
        (json!(["--page-size", "64"]), 256),
        (json!([]), 100),
        (json!(["--page-size=16"]), 256),
    ] {
        let a = admit_pod(&sglang(image, args.clone()), &[b(chunk)], &config());
        assert!(
            matches!(a.outcome, PodOutcome::Injected { .. }),
            "{args} {chunk}: {:?}",
            a.outcome
        );
    }
}

#[test]
fn sglang_bind_is_read() {
    let events = |config: Value| json!(["--kv-events-config", config.to_string()]);
    let b = backend(
        "cb",
        json!({"runtime": "SGLang", "integration": {"mode": "EventsOnly"}}),
    );
    let warn = |kv: Value| -> Vec<String> {
        let a = admit_pod(
            &sglang("lmsysorg/sglang:v0.5.4", events(kv)),
            std::slice::from_ref(&b),
            &config(),
        );
        a.warnings
    };
    // `"bind": false` with a wildcard: SGLang connects to "*" and fails.
    let w = warn(json!({"publisher": "zmq", "endpoint": "tcp://*:5557", "bind": false}));
    assert!(w.iter().any(|w| w.contains("\"bind\": false")), "{w:?}");
    // `"bind": true` with a host binds it: loopback is fine, another host is warned.
    let w = warn(json!({"publisher": "zmq", "endpoint": "tcp://127.0.0.1:5557", "bind": true}));
    assert!(w.is_empty(), "{w:?}");
    let w = warn(json!({"publisher": "zmq", "endpoint": "tcp://10.1.2.3:5557", "bind": true}));
    assert!(w.iter().any(|w| w.contains("binds only 10.1.2.3")), "{w:?}");
    // Without `bind` a named host still means SGLang connects.
    let w = warn(json!({"publisher": "zmq", "endpoint": "tcp://10.1.2.3:5557"}));
    assert!(
        w.iter().any(|w| w.contains("connects its publisher")),
        "{w:?}"
    );
}

#[test]
fn lmcache_cpu_off_without_a_remote_tier_is_warned() {
    let off = engine_pod(json!({"env": [{"name": "LMCACHE_LOCAL_CPU", "value": "False"}]}));
    let a = admit_pod(&off, &[backend("cb", json!({}))], &config());
    assert!(
        a.warnings.iter().any(|w| w.contains("LMCACHE_LOCAL_CPU")),
        "{:?}",
        a.warnings
    );
    // With a remote tier LMCache still stores there: no warning.
    let redis = backend_with(
        "cb",
        json!({"remoteStorage": {"provider": "Redis", "ownership": "Managed"}}),
        json!({"status": {"endpoint": "cb-redis.team-a.svc:6379"}}),
    );
    let a = admit_pod(&off, &[redis], &config());
    assert!(
        a.warnings.iter().all(|w| !w.contains("LMCACHE_LOCAL_CPU")),
        "{:?}",
        a.warnings
    );
    let on = engine_pod(json!({}));
    let a = admit_pod(&on, &[backend("cb", json!({}))], &config());
    assert!(
        a.warnings.iter().all(|w| !w.contains("LMCACHE_LOCAL_CPU")),
        "{:?}",
        a.warnings
    );
}

#[test]
fn wired_pods_get_the_pull_secrets_once() {
    let mut cfg = config();
    cfg.image_pull_secrets = vec!["regcred".into(), "own".into(), " ".into()];
    let p = patched(
        &engine_pod(json!({})),
        json!({"spec": {"imagePullSecrets": [{"name": "own"}]}}),
    );
    let a = admit_pod(&p, &[backend("cb", json!({}))], &cfg);
    let names: Vec<&str> = a
        .pod
        .spec
        .as_ref()
        .unwrap()
        .image_pull_secrets
        .as_ref()
        .unwrap()
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(names, ["own", "regcred"]);
    let again = admit_pod(&a.pod, &[backend("cb", json!({}))], &cfg);
    assert_eq!(again.pod, a.pod);
    // Unwired pods get none.
    let other = admit_pod(&engine_pod(json!({})), &[], &cfg);
    assert!(
        other
            .pod
            .spec
            .as_ref()
            .unwrap()
            .image_pull_secrets
            .is_none()
    );
}
