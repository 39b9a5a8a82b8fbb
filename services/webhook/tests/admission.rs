//! The real `ic-webhook` binary over HTTPS on loopback, answering
//! AdmissionReview v1 requests shaped exactly as the API server sends them,
//! with CacheBackends listed from a fake Kubernetes API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::{FakeApi, INDEX_SERVER, INDEX_SERVER_AUDIENCE, SUBSCRIBER_IMAGE, Webhook, fixture};
use ic_adapters::admission::{InjectionConfig, PodOutcome, admit_pod};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ic-webhook"))
}

fn decoded_patch(response: &Value) -> Option<json_patch::Patch> {
    use base64::Engine as _;
    let b64 = response["patch"].as_str()?;
    assert_eq!(response["patchType"], "JSONPatch");
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    Some(serde_json::from_slice(&raw).unwrap())
}

fn assert_review_envelope(answer: &Value, uid: &Value) {
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1", "{answer}");
    assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
    assert_eq!(&answer["response"]["uid"], uid, "{answer}");
}

// === CacheBackend ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cachebackend_defaulting_and_validation() {
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &[]);
    let mut client = webhook.client().await;

    // Defaulting: the missing blocks and minReplicas, as a patch that applies.
    let review = fixture("cachebackend-create.json");
    let (status, answer) = client.review("/mutate-cachebackend", &review).await;
    assert_eq!(status, 200, "{answer}");
    assert_review_envelope(&answer, &review["request"]["uid"]);
    let response = &answer["response"];
    assert_eq!(response["allowed"], true);
    let patch = decoded_patch(response).expect("a defaulting patch");
    let mut object = review["request"]["object"].clone();
    json_patch::patch(&mut object, &patch).unwrap();
    assert_eq!(object["spec"]["autoscaling"]["minReplicas"], 3);
    assert_eq!(
        object["spec"]["integration"],
        json!({"mode": "Offload", "role": "ReadWrite", "failOpen": true})
    );
    assert_eq!(
        object["spec"]["observation"],
        json!({"firstEventTimeout": "5m"})
    );
    // Nothing the operator set was touched.
    let mut untouched = object.clone();
    for path in ["integration", "observation"] {
        untouched["spec"].as_object_mut().unwrap().remove(path);
    }
    untouched["spec"]["autoscaling"]
        .as_object_mut()
        .unwrap()
        .remove("minReplicas");
    assert_eq!(untouched, review["request"]["object"]);

    // The defaulted object needs no further patch (no patch field at all).
    let mut again = review.clone();
    again["request"]["object"] = object;
    let (_, answer) = client.review("/mutate-cachebackend", &again).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none(), "{answer}");

    // Validation: every violation aggregated into one Invalid (dry run too).
    let review = fixture("cachebackend-create-invalid.json");
    let (status, answer) = client.review("/validate-cachebackend", &review).await;
    assert_eq!(status, 200);
    assert_review_envelope(&answer, &review["request"]["uid"]);
    let response = &answer["response"];
    assert_eq!(response["allowed"], false, "{answer}");
    let st = &response["status"];
    assert_eq!(st["code"], 422);
    assert_eq!(st["reason"], "Invalid");
    assert_eq!(st["status"], "Failure");
    let message = st["message"].as_str().unwrap();
    assert!(
        message.starts_with("CacheBackend.inferencecache.io \"broken\" is invalid: ["),
        "{message}"
    );
    assert_eq!(st["details"]["name"], "broken");
    assert_eq!(st["details"]["group"], "inferencecache.io");
    assert_eq!(st["details"]["kind"], "CacheBackend");
    let causes: Vec<(String, String)> = st["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert!(c["message"].as_str().is_some_and(|m| !m.is_empty()), "{c}");
            (
                c["field"].as_str().unwrap().to_owned(),
                c["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for expected in [
        ("spec.remoteStorage.redis", "FieldValueForbidden"),
        ("spec.autoscaling", "FieldValueForbidden"),
        ("spec.remoteStorage.endpoint", "FieldValueRequired"),
        ("spec.autoscaling.minReplicas", "FieldValueRequired"),
    ] {
        assert!(
            causes.contains(&(expected.0.to_owned(), expected.1.to_owned())),
            "{expected:?} missing from {causes:?}"
        );
        assert!(message.contains(expected.0), "{message}");
    }

    // UPDATE: an unrelated edit of an object with a pre-existing violation
    // goes through; a violation the update introduces does not.
    let review = fixture("cachebackend-update-preexisting.json");
    let (_, answer) = client.review("/validate-cachebackend", &review).await;
    assert_review_envelope(&answer, &review["request"]["uid"]);
    assert_eq!(answer["response"]["allowed"], true, "{answer}");

    let review = fixture("cachebackend-update-new-violation.json");
    let (_, answer) = client.review("/validate-cachebackend", &review).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let causes = &answer["response"]["status"]["details"]["causes"];
    assert_eq!(
        causes[0]["field"], "spec.remoteStorage.endpoint",
        "{answer}"
    );
    assert_eq!(causes[0]["reason"], "FieldValueRequired");

    // The same object judged fresh (CREATE) is denied for the old violation.
    let mut create = fixture("cachebackend-update-preexisting.json");
    create["request"]["operation"] = json!("CREATE");
    create["request"]["oldObject"] = Value::Null;
    let (_, answer) = client.review("/validate-cachebackend", &create).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");

    // DELETE is never judged.
    let mut delete = fixture("cachebackend-update-new-violation.json");
    delete["request"]["operation"] = json!("DELETE");
    delete["request"]["object"] = Value::Null;
    let (_, answer) = client.review("/validate-cachebackend", &delete).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");

    let metrics = webhook.metrics();
    for line in [
        r#"inferencecache_webhook_admissions_total{kind="cachebackend_default",result="patched",reason="defaulted"} 1"#,
        r#"inferencecache_webhook_admissions_total{kind="cachebackend_default",result="allowed",reason="unchanged"} 1"#,
        r#"inferencecache_webhook_admissions_total{kind="cachebackend_validate",result="denied",reason="invalid"} 3"#,
        r#"inferencecache_webhook_admission_duration_seconds_count{kind="cachebackend_validate"} 5"#,
        r#"inferencecache_webhook_admission_duration_seconds_bucket{le="0.0005",kind="cachebackend_default"}"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    // CacheBackend admission never reads the API.
    assert_eq!(api.lists(), 0);
    assert!(webhook.process.stop().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_our_types_refuse_is_denied_naming_the_field() {
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &[]);
    let mut client = webhook.client().await;
    let cases = [
        // An enum value in the wrong case.
        (
            "runtime",
            json!("vllm"),
            "spec.runtime",
            "FieldValueNotSupported",
        ),
        // A number where a string belongs.
        ("type", json!(7), "spec.type", "FieldValueInvalid"),
    ];
    for (key, value, field, reason) in cases {
        let mut review = fixture("cachebackend-create.json");
        review["request"]["object"]["spec"][key] = value.clone();
        // Defaulting passes it unchanged, so the schema can name the field.
        let (status, answer) = client.review("/mutate-cachebackend", &review).await;
        assert_eq!(status, 200, "{answer}");
        assert_review_envelope(&answer, &review["request"]["uid"]);
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        assert!(answer["response"].get("patch").is_none(), "{answer}");
        assert!(
            answer["response"]["warnings"][0]
                .as_str()
                .is_some_and(|w| w.contains(field)),
            "{answer}"
        );
        // Validation denies it as Invalid, at the field.
        let (status, answer) = client.review("/validate-cachebackend", &review).await;
        assert_eq!(status, 200, "{answer}");
        let st = &answer["response"]["status"];
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(st["code"], 422, "{answer}");
        assert_eq!(st["reason"], "Invalid");
        assert_eq!(st["details"]["causes"][0]["field"], field, "{answer}");
        assert_eq!(st["details"]["causes"][0]["reason"], reason, "{answer}");
        assert!(st["message"].as_str().unwrap().contains(field), "{answer}");
    }
    // A missing required field, named with its path.
    let mut review = fixture("cachebackend-create.json");
    review["request"]["object"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("runtime");
    let (_, answer) = client.review("/validate-cachebackend", &review).await;
    let cause = &answer["response"]["status"]["details"]["causes"][0];
    assert_eq!(cause["field"], "spec.runtime", "{answer}");
    assert_eq!(cause["reason"], "FieldValueRequired", "{answer}");

    // A zero or negative host-memory budget is no longer silently replaced.
    for capacity in ["0", "-4Gi"] {
        let mut review = fixture("cachebackend-create.json");
        review["request"]["object"]["spec"]["lmCache"] =
            json!({"hostMemory": {"capacity": capacity}});
        let (_, answer) = client.review("/validate-cachebackend", &review).await;
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        let causes = answer["response"]["status"]["details"]["causes"]
            .as_array()
            .unwrap();
        assert!(
            causes
                .iter()
                .any(|c| c["field"] == "spec.lmCache.hostMemory.capacity"),
            "{answer}"
        );
    }
    let metrics = webhook.metrics();
    for line in [
        r#"inferencecache_webhook_admissions_total{kind="cachebackend_default",result="allowed",reason="undecodable"} 2"#,
        r#"inferencecache_webhook_admissions_total{kind="cachebackend_validate",result="denied",reason="undecodable"} 3"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert!(webhook.process.stop().success());
}

// === Pod ===

fn pod_review() -> Value {
    fixture("pod-create-vllm.json")
}

fn backends() -> Vec<Value> {
    serde_json::from_value(fixture("cachebackends-inference.json")).unwrap()
}

/// What the adapters decide for the fixture pod, computed in-process: the
/// served patch must reproduce exactly this pod.
fn expected_admission(review: &Value) -> ic_adapters::admission::PodAdmission {
    let pod: Pod = serde_json::from_value(review["request"]["object"].clone()).unwrap();
    let backends: Vec<ic_api::CacheBackend> = backends()
        .into_iter()
        .map(|b| serde_json::from_value(b).unwrap())
        .collect();
    admit_pod(
        &pod,
        &backends,
        &InjectionConfig {
            subscriber_image: Some(SUBSCRIBER_IMAGE.to_owned()),
            index_server: INDEX_SERVER.to_owned(),
            index_server_audience: Some(INDEX_SERVER_AUDIENCE.to_owned()),
            index_server_ca_pem: None,
            subscriber_otlp_endpoint: None,
            index_server_discovery: Default::default(),
            image_pull_secrets: Vec::new(),
            subscriber_kafka: None,
        },
    )
}

/// The served patch reproduces the adapters' decision exactly, whatever it
/// is: this holds with the adapters stubbed as well as implemented.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_patch_matches_the_adapters_decision() {
    let api = FakeApi::default();
    api.set("inference", backends());
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &[]);
    webhook.wait_store_synced().await;
    let mut client = webhook.client().await;

    let review = pod_review();
    let (status, answer) = client.review("/mutate-pod", &review).await;
    assert_eq!(status, 200, "{answer}");
    assert_review_envelope(&answer, &review["request"]["uid"]);
    assert_eq!(answer["response"]["allowed"], true);
    let mut pod = review["request"]["object"].clone();
    if let Some(patch) = decoded_patch(&answer["response"]) {
        json_patch::patch(&mut pod, &patch).unwrap();
    }
    let served: Pod = serde_json::from_value(pod).unwrap();
    let expected = expected_admission(&review);
    assert_eq!(served, expected.pod);
    let warnings: Vec<String> =
        serde_json::from_value(answer["response"]["warnings"].clone()).unwrap_or_default();
    assert_eq!(warnings, expected.warnings);
    // Read from the watch-fed store: one cluster-wide LIST when the watch
    // started, none per admission.
    assert_eq!((api.cluster_lists(), api.lists()), (1, 0));
    assert!(webhook.process.stop().success());
}

fn engine_args(pod: &Value) -> Vec<String> {
    let containers = pod["spec"]["containers"].as_array().unwrap();
    let engine = containers
        .iter()
        .find(|c| c["name"] == "vllm")
        .expect("engine container kept");
    serde_json::from_value(engine["args"].clone()).unwrap_or_default()
}

/// The spec'd wiring of a matching vLLM + LMCache pod. Needs the adapters
/// (libs/adapters admit_pod); with the stub it fails at the first assert.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn matching_vllm_pod_is_wired_and_readmission_is_a_no_op() {
    let api = FakeApi::default();
    api.set("inference", backends());
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &[]);
    let mut client = webhook.client().await;

    let review = pod_review();
    let (_, answer) = client.review("/mutate-pod", &review).await;
    let response = &answer["response"];
    assert_eq!(response["allowed"], true);
    let patch = decoded_patch(response).unwrap_or_else(|| panic!("no wiring patch: {answer}"));
    let original = review["request"]["object"].clone();
    let mut pod = original.clone();
    json_patch::patch(&mut pod, &patch).unwrap();

    // Connector wired, user args preserved.
    let args = engine_args(&pod);
    let at = args
        .iter()
        .position(|a| a.starts_with("--kv-transfer-config"))
        .unwrap_or_else(|| panic!("no --kv-transfer-config in {args:?}"));
    let config = if args[at].contains('=') {
        args[at].split_once('=').unwrap().1.to_owned()
    } else {
        args[at + 1].clone()
    };
    assert!(config.contains("LMCacheConnectorV1"), "{config}");
    assert!(config.contains("kv_both"), "{config}");
    for user_arg in [
        "--model",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--max-model-len",
        "8192",
    ] {
        assert!(
            args.iter().any(|a| a == user_arg),
            "{user_arg} lost: {args:?}"
        );
    }
    // Decision annotations name the matched backend (not the selector-less one).
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(
        annotations["inferencecache.io/injected-by"],
        "inference/llama-external"
    );
    assert_eq!(
        annotations["inferencecache.io/injected-by-uid"],
        "1f3e0a54-93c4-4d7e-9a6b-0c2b8e5d7f10"
    );
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    // The subscriber sidecar dials the configured index server.
    let text = pod.to_string();
    assert!(text.contains(SUBSCRIBER_IMAGE), "no subscriber: {text}");
    assert!(text.contains(INDEX_SERVER), "{text}");
    assert!(
        matches!(
            expected_admission(&review).outcome,
            PodOutcome::Injected { .. }
        ),
        "adapters did not inject"
    );

    // Re-admission of the wired pod: nothing left to change.
    let mut readmit = review.clone();
    readmit["request"]["object"] = pod;
    let (_, answer) = client.review("/mutate-pod", &readmit).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none(), "{answer}");

    let metrics = webhook.metrics();
    assert!(
        metrics.contains(
            r#"inferencecache_webhook_admissions_total{kind="pod",result="patched",reason="injected"} 1"#
        ),
        "{metrics}"
    );
    assert!(webhook.process.stop().success());
}

/// Opt-out, no match, list failure and UPDATE: always allowed, never wired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwired_pods_are_always_admitted() {
    let api = FakeApi::default();
    api.set("inference", backends());
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &[]);
    webhook.wait_store_synced().await;
    let mut client = webhook.client().await;

    // No backend selects these labels: admitted, forged annotation stripped.
    let mut review = pod_review();
    review["request"]["object"]["metadata"]["labels"] = json!({"app": "mistral"});
    let (_, answer) = client.review("/mutate-pod", &review).await;
    assert_review_envelope(&answer, &review["request"]["uid"]);
    let response = &answer["response"];
    assert_eq!(response["allowed"], true);
    assert_eq!(response["status"]["reason"], "no_match", "{answer}");
    let mut pod = review["request"]["object"].clone();
    if let Some(patch) = decoded_patch(response) {
        json_patch::patch(&mut pod, &patch).unwrap();
    }
    let served: Pod = serde_json::from_value(pod).unwrap();
    assert_eq!(served, expected_admission(&review).pod);

    // UPDATE is never wired.
    let mut update = pod_review();
    update["request"]["operation"] = json!("UPDATE");
    update["request"]["oldObject"] = update["request"]["object"].clone();
    let (_, answer) = client.review("/mutate-pod", &update).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none(), "{answer}");

    // A CacheBackend sent to the pod endpoint: decode fail-open.
    let mut wrong = pod_review();
    wrong["request"]["object"] = fixture("cachebackend-create.json")["request"]["object"].clone();
    let (status, answer) = client.review("/mutate-pod", &wrong).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], true);
    assert_eq!(answer["response"]["status"]["reason"], "decode", "{answer}");

    // Nothing was listed per admission.
    assert_eq!(api.lists(), 0);

    let metrics = webhook.metrics();
    for line in [
        r#"inferencecache_webhook_admissions_total{kind="pod",result="fail_open",reason="no_match"} 1"#,
        r#"inferencecache_webhook_admissions_total{kind="pod",result="fail_open",reason="decode"} 1"#,
        r#"inferencecache_webhook_admissions_total{kind="pod",result="allowed",reason="operation"} 1"#,
        r#"inferencecache_webhook_admission_duration_seconds_count{kind="pod"} 3"#,
        r#"inferencecache_webhook_backend_lookups_total{source="store"} 1"#,
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert!(webhook.process.stop().success());
}

/// Before the store has synced (here: never, every CacheBackend request
/// fails) admission lists the namespace live; a failed list admits the pod
/// unwired with reason list_failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn before_the_store_syncs_admission_lists_live_and_fails_open() {
    let api = FakeApi::default();
    api.set("inference", backends());
    api.fail_all();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &[]);
    let mut client = webhook.client().await;
    let review = pod_review();
    let (_, answer) = client.review("/mutate-pod", &review).await;
    let response = &answer["response"];
    assert_eq!(response["allowed"], true);
    assert_eq!(response["status"]["reason"], "list_failed", "{answer}");
    if let Some(patch) = decoded_patch(response) {
        let mut pod = review["request"]["object"].clone();
        json_patch::patch(&mut pod, &patch).unwrap();
        assert!(engine_args(&pod).iter().all(|a| !a.contains("kv-transfer")));
    }
    assert_eq!(api.lists(), 1, "listed live");
    let metrics = webhook.metrics();
    for line in [
        r#"inferencecache_webhook_admissions_total{kind="pod",result="fail_open",reason="list_failed"} 1"#,
        r#"inferencecache_webhook_backend_lookups_total{source="live"} 1"#,
        "inferencecache_webhook_backend_store_synced 0",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert!(webhook.process.stop().success());
}

/// A CacheBackend created after the webhook started reaches admission
/// through the watch, without a LIST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_created_later_is_seen_through_the_watch() {
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &[]);
    webhook.wait_store_synced().await;
    let mut client = webhook.client().await;
    let review = pod_review();
    let (_, answer) = client.review("/mutate-pod", &review).await;
    assert_eq!(
        answer["response"]["status"]["reason"], "no_match",
        "{answer}"
    );
    api.set("inference", backends());
    let mut wired = false;
    for _ in 0..100 {
        let (_, answer) = client.review("/mutate-pod", &review).await;
        if decoded_patch(&answer["response"]).is_some_and(|p| {
            serde_json::to_string(&p)
                .unwrap()
                .contains("kv-transfer-config")
        }) {
            wired = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(wired, "the new backend never reached admission");
    assert_eq!((api.cluster_lists(), api.lists()), (1, 0));
    assert!(webhook.process.stop().success());
}

/// `inferencecache.io/skip-inject: "true"` opts out: the skipped marker is
/// stamped, stale injected-by annotations cleared. Needs the adapters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_inject_is_honoured() {
    let api = FakeApi::default();
    api.set("inference", backends());
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(binary(), api_addr, &[]);
    let mut client = webhook.client().await;

    let mut review = pod_review();
    review["request"]["object"]["metadata"]["annotations"]["inferencecache.io/skip-inject"] =
        json!("true");
    let (_, answer) = client.review("/mutate-pod", &review).await;
    let response = &answer["response"];
    assert_eq!(response["allowed"], true);
    assert_eq!(response["status"]["reason"], "skip_inject", "{answer}");
    let patch = decoded_patch(response).expect("skip marker patch");
    let mut pod = review["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(
        annotations["inferencecache.io/inject-skipped"],
        "skip-inject-annotation"
    );
    assert!(
        annotations.get("inferencecache.io/injected-by").is_none(),
        "{annotations}"
    );
    assert!(engine_args(&pod).iter().all(|a| !a.contains("kv-transfer")));
    assert!(webhook.process.stop().success());
}

/// A private registry: the pull secrets the webhook is given reach every
/// pod it wires (the injected subscriber comes from that registry), once
/// each, after the pod's own; unwired pods are left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wired_pods_get_the_configured_pull_secrets_once() {
    let api = FakeApi::default();
    api.set("inference", backends());
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(
        binary(),
        api_addr,
        &[
            "--image-pull-secret=regcred,engine-pull",
            "--image-pull-secret=regcred",
        ],
    );
    webhook.wait_store_synced().await;
    let mut client = webhook.client().await;

    // The pod already names one of them.
    let mut review = pod_review();
    review["request"]["object"]["spec"]["imagePullSecrets"] = json!([{"name": "engine-pull"}]);
    let (_, answer) = client.review("/mutate-pod", &review).await;
    let patch = decoded_patch(&answer["response"]).unwrap_or_else(|| panic!("{answer}"));
    let mut pod = review["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    assert_eq!(
        pod["spec"]["imagePullSecrets"],
        json!([{"name": "engine-pull"}, {"name": "regcred"}]),
        "{answer}"
    );
    assert!(pod.to_string().contains(SUBSCRIBER_IMAGE));
    // Re-admitting the wired pod adds nothing.
    let mut readmit = review.clone();
    readmit["request"]["object"] = pod;
    let (_, answer) = client.review("/mutate-pod", &readmit).await;
    assert!(answer["response"].get("patch").is_none(), "{answer}");

    // A pod no backend selects gets none.
    let mut other = pod_review();
    other["request"]["object"]["metadata"]["labels"] = json!({"app": "mistral"});
    let (_, answer) = client.review("/mutate-pod", &other).await;
    if let Some(patch) = decoded_patch(&answer["response"]) {
        let mut pod = other["request"]["object"].clone();
        json_patch::patch(&mut pod, &patch).unwrap();
        assert!(pod["spec"].get("imagePullSecrets").is_none(), "{pod}");
    }
    assert!(webhook.process.stop().success());
}

/// Behind a private registry the managed provider's image is the default
/// re-homed there, with the pull secrets on its pods, written by the
/// defaulting webhook so the stored backend says what will be pulled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_providers_follow_the_registry_override() {
    let api = FakeApi::default();
    let api_addr = api.serve().await;
    let mut webhook = Webhook::start(
        binary(),
        api_addr,
        &[
            "--provider-image-registry=mirror.example/hub",
            "--image-pull-secret=regcred",
        ],
    );
    let mut client = webhook.client().await;
    let review = fixture("cachebackend-create.json");
    let (status, answer) = client.review("/mutate-cachebackend", &review).await;
    assert_eq!(status, 200, "{answer}");
    let patch = decoded_patch(&answer["response"]).expect("a defaulting patch");
    let mut object = review["request"]["object"].clone();
    json_patch::patch(&mut object, &patch).unwrap();
    assert_eq!(
        object["spec"]["remoteStorage"]["redis"]["image"],
        "mirror.example/hub/library/redis:7.4.2-alpine",
        "{object}"
    );
    assert_eq!(
        object["spec"]["template"]["imagePullSecrets"],
        json!([{"name": "regcred"}])
    );
    // The defaulted backend needs nothing more.
    let mut again = review.clone();
    again["request"]["object"] = object;
    let (_, answer) = client.review("/mutate-cachebackend", &again).await;
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    assert!(webhook.process.stop().success());
}
