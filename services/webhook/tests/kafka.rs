//! `--subscriber-transport kafka` through the real binary: the pod patch it
//! serves over HTTPS makes the injected subscriber produce to the topic
//! (its `--transport kafka` flags, the SASL password mounted from a Secret
//! of the pod's namespace, the brokers' CA inline), with no gRPC wiring;
//! flags that do not fit stop the webhook at start, naming the flag.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;

use common::{FakeApi, Webhook, fixture};
use serde_json::Value;

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_ic-webhook"))
}

fn patched_pod(review: &Value, response: &Value) -> Value {
    use base64::Engine as _;
    assert_eq!(response["allowed"], true, "{response}");
    let b64 = response["patch"]
        .as_str()
        .unwrap_or_else(|| panic!("no patch: {response}"));
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&raw).unwrap();
    let mut pod = review["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    pod
}

fn subscriber(pod: &Value) -> &Value {
    pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "kvevent-subscriber")
        .unwrap_or_else(|| panic!("no subscriber in {pod}"))
}

fn args(container: &Value) -> Vec<String> {
    serde_json::from_value(container["args"].clone()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kafka_transport_reaches_the_injected_subscriber() {
    let api = FakeApi::default();
    api.set(
        "inference",
        serde_json::from_value(fixture("cachebackends-inference.json")).unwrap(),
    );
    let api_addr = api.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("kafka-ca.crt");
    let pem = common::TestCa::new().pem();
    std::fs::write(&ca, &pem).unwrap();
    let ca_flag = format!("--subscriber-kafka-ca-file={}", ca.display());
    let mut webhook = Webhook::start(
        binary(),
        api_addr,
        &[
            "--subscriber-transport=kafka",
            "--subscriber-kafka-brokers=b-1.kafka.example:9096,b-2.kafka.example:9096",
            "--subscriber-kafka-security-protocol=sasl_ssl",
            "--subscriber-kafka-sasl-mechanism=SCRAM-SHA-512",
            "--subscriber-kafka-sasl-username=producer",
            "--subscriber-kafka-sasl-password-secret=inferencecache-kafka",
            &ca_flag,
        ],
    );
    webhook.wait_store_synced().await;
    let mut client = webhook.client().await;
    let review = fixture("pod-create-vllm.json");
    let (status, answer) = client.review("/mutate-pod", &review).await;
    assert_eq!(status, 200, "{answer}");
    let pod = patched_pod(&review, &answer["response"]);
    let sidecar = subscriber(&pod);
    let args = args(sidecar);
    for want in [
        "--transport=kafka",
        "--kafka-brokers=b-1.kafka.example:9096,b-2.kafka.example:9096",
        "--kafka-topic=inferencecache.index-events",
        "--kafka-security-protocol=sasl_ssl",
        "--kafka-sasl-mechanism=SCRAM-SHA-512",
        "--kafka-sasl-username=producer",
        "--kafka-sasl-password-file=/var/run/secrets/inferencecache.io/kafka-sasl/password",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} missing: {args:?}");
    }
    assert!(
        !args.iter().any(|a| a.starts_with("--index-server")),
        "no gRPC wiring with the topic: {args:?}"
    );
    let env = sidecar["env"].as_array().unwrap();
    let ca_env = env.iter().find(|e| e["name"] == "IC_KAFKA_CA_PEM").unwrap();
    assert_eq!(ca_env["value"], pem.as_str());
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    let sasl = volumes
        .iter()
        .find(|v| v["name"] == "inferencecache-kafka-sasl")
        .unwrap_or_else(|| panic!("no SASL volume: {volumes:?}"));
    assert_eq!(sasl["secret"]["secretName"], "inferencecache-kafka");
    assert_eq!(sasl["secret"]["items"][0]["key"], "password");
    assert!(
        volumes
            .iter()
            .all(|v| v["name"] != "inferencecache-index-token"),
        "no index-server token with the topic: {volumes:?}"
    );
    // Re-admitting the wired pod changes nothing.
    let mut again = review.clone();
    again["request"]["object"] = pod;
    let (_, answer) = client.review("/mutate-pod", &again).await;
    assert_eq!(answer["response"]["allowed"], true);
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    assert!(webhook.process.stop().success());
}

/// Runs the binary until it exits; returns its stderr and stdout.
fn start_fails(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, _) = common::TestCa::new().write_pair(dir.path(), "ic-webhook");
    let kubeconfig = common::write_kubeconfig(
        dir.path(),
        format!("127.0.0.1:{}", ic_e2e::free_port())
            .parse()
            .unwrap(),
    );
    let out = std::process::Command::new(binary())
        .args([
            "--admin-addr=127.0.0.1:0",
            "--https-addr=127.0.0.1:0",
            &format!("--tls-cert={}", cert.display()),
            &format!("--tls-key={}", key.display()),
            &format!("--kubeconfig={}", kubeconfig.display()),
            "--drain-seconds=0",
        ])
        .args(extra)
        .output()
        .unwrap();
    assert!(!out.status.success(), "started with {extra:?}");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    )
}

#[test]
fn kafka_settings_that_do_not_fit_stop_the_webhook_naming_the_flag() {
    for (flags, named) in [
        (
            &["--subscriber-transport=kafka"][..],
            "--subscriber-kafka-brokers",
        ),
        (
            &[
                "--subscriber-transport=kafka",
                "--subscriber-kafka-brokers=b:9096",
                "--subscriber-kafka-security-protocol=sasl_ssl",
                "--subscriber-kafka-sasl-mechanism=PLAIN",
                "--subscriber-kafka-sasl-username=u",
            ][..],
            "--subscriber-kafka-sasl-password-secret",
        ),
        (
            &[
                "--subscriber-transport=kafka",
                "--subscriber-kafka-brokers=b:9092",
                "--subscriber-kafka-ca-file=/nonexistent/ca.crt",
            ][..],
            "--subscriber-kafka-security-protocol",
        ),
    ] {
        let out = start_fails(flags);
        assert!(out.contains(named), "{flags:?} should name {named}: {out}");
    }
}
