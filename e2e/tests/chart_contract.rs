//! Contract tests that catch the chart drifting from the code:
//! * every container's args (and env) are accepted by that binary's own flag
//!   parser (the real binary in its `IC_CHECK_ARGS` parse-only mode), and so
//!   is the subscriber sidecar the webhook injects with the chart's flags
//!   (streaming to every index replica through the headless Service);
//! * the webhook configurations' paths are the ones the real webhook serves,
//!   on the Service port that reaches its HTTPS port;
//! * the Services carry the names and ports the binaries dial by default;
//! * the RBAC each ServiceAccount is granted is exactly the contract file its
//!   binary's own test records (`charts/inference-cache/rbac/`).

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use ic_e2e::chart::{NAMESPACE, chart_dir, find, objects, of_kind, render};
use ic_fake_apiserver::rbac::{Permission, read_contract};
use serde_json::{Value, json};

#[path = "chart_contract/access.rs"]
mod access;

const CHART: &str = "inference-cache";

fn value_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart_dir(CHART).join("tests/values"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.push(chart_dir(CHART).join("values-ha.yaml"));
    files.sort();
    files
}

fn render_with(values: &Path) -> Vec<Value> {
    objects(&render(CHART, &["-f", values.to_str().unwrap()]))
}

/// (pod name, pod spec) of every Deployment and Pod.
fn pod_specs(objects: &[Value]) -> Vec<(String, Value)> {
    objects
        .iter()
        .filter_map(|o| match o["kind"].as_str()? {
            "Deployment" => Some((
                o["metadata"]["name"].as_str()?.to_owned(),
                o["spec"]["template"]["spec"].clone(),
            )),
            "Pod" => Some((
                o["metadata"]["name"].as_str()?.to_owned(),
                o["spec"].clone(),
            )),
            _ => None,
        })
        .collect()
}

/// The binary a container runs: its command, or its image's entrypoint
/// (images are named after their binary).
fn binary_of(container: &Value) -> String {
    if let Some(cmd) = container["command"].as_array().and_then(|c| c.first()) {
        return cmd.as_str().unwrap().rsplit('/').next().unwrap().to_owned();
    }
    let image = container["image"].as_str().unwrap();
    let name = image.rsplit('/').next().unwrap();
    name.split(['@', ':']).next().unwrap().to_owned()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

/// Runs `binary` parse-only with `args` and the container's `env`.
fn check_args(binary: &str, args: &[String], env: &Value) -> (bool, String) {
    let mut cmd = Command::new(ic_e2e::workspace_binary(binary));
    cmd.args(args).env("IC_CHECK_ARGS", "1");
    for e in env.as_array().into_iter().flatten() {
        let value = e["value"]
            .as_str()
            .unwrap_or("placeholder-from-the-downward-api");
        cmd.env(e["name"].as_str().unwrap(), value);
    }
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (
        out.status.success() && text.contains("arguments accepted"),
        text,
    )
}

#[test]
fn every_container_is_accepted_by_its_binarys_own_parser() {
    let mut checked = BTreeSet::new();
    for values in value_files() {
        for (pod, spec) in pod_specs(&render_with(&values)) {
            for c in spec["containers"].as_array().unwrap() {
                let binary = binary_of(c);
                let args = strings(&c["args"]);
                let (ok, text) = check_args(&binary, &args, &c["env"]);
                assert!(
                    ok,
                    "{}: {pod}/{}: {binary} refuses {args:?}:\n{text}",
                    values.display(),
                    c["name"]
                );
                checked.insert(binary);
            }
        }
    }
    let want: BTreeSet<String> = [
        "ic-controller",
        "ic-webhook",
        "ic-index-server",
        "ic-coordinator",
        "icctl",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(checked, want);
}

#[test]
fn the_injected_subscriber_is_accepted_by_its_parser() {
    // The webhook's injection flags as the chart sets them.
    let all = objects(&render(CHART, &[]));
    let webhook = &find(&all, "Deployment", "inferencecache-webhook").unwrap()["spec"]["template"]
        ["spec"]["containers"][0];
    let flag = |name: &str| {
        strings(&webhook["args"])
            .iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")).map(str::to_owned))
            .unwrap()
    };
    let config = ic_adapters::admission::InjectionConfig {
        subscriber_image: Some(flag("kvevent-subscriber-image")),
        index_server: flag("index-server"),
        index_server_audience: Some(flag("index-server-audience")),
        index_server_ca_pem: None,
        subscriber_otlp_endpoint: None,
        index_server_discovery: match flag("index-server-discovery").as_str() {
            "dns" => ic_adapters::admission::IndexServerDiscovery::Dns,
            "static" => ic_adapters::admission::IndexServerDiscovery::Static,
            other => panic!("--index-server-discovery={other}"),
        },
        image_pull_secrets: Vec::new(),
        subscriber_kafka: None,
    };
    // The subscriber's token carries the audience the index server checks.
    let index = &find(&all, "Deployment", "inferencecache-index-server").unwrap()["spec"]["template"]
        ["spec"]["containers"][0];
    assert!(
        strings(&index["args"])
            .contains(&format!("--api-audience={}", flag("index-server-audience"))),
        "{index}"
    );
    let backend: ic_api::CacheBackend = serde_json::from_value(json!({
        "apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
        "metadata": {"name": "cb", "namespace": "team-a", "uid": "u"},
        "spec": {"runtime": "VLLM", "engineSelector": {"matchLabels": {"app": "engine"}},
                 "observation": {"modelID": "Qwen/Qwen3-8B"}}}))
    .unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "engine-0", "namespace": "team-a", "labels": {"app": "engine"}},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0",
            "args": ["--model", "Qwen/Qwen3-8B", "--kv-events-config",
                     r#"{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv-events"}"#]}]}}))
    .unwrap();
    let admitted = ic_adapters::admission::admit_pod(&pod, &[backend], &config);
    let spec = serde_json::to_value(admitted.pod.spec.unwrap()).unwrap();
    let subscriber = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "kvevent-subscriber")
        .unwrap();
    assert_eq!(subscriber["image"], flag("kvevent-subscriber-image"));
    // It streams to every index replica behind the headless Service.
    for want in [
        format!("--index-server={}", flag("index-server")),
        "--index-server-discovery=dns".to_owned(),
    ] {
        assert!(strings(&subscriber["args"]).contains(&want), "{want}");
    }
    // It reads the token where the projected volume puts it.
    let mount = subscriber["volumeMounts"][0]["mountPath"].as_str().unwrap();
    let volume = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == subscriber["volumeMounts"][0]["name"])
        .unwrap();
    let projected = &volume["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(
        projected["audience"].as_str(),
        Some(flag("index-server-audience").as_str())
    );
    let path = format!("{mount}/{}", projected["path"].as_str().unwrap());
    assert!(strings(&subscriber["args"]).contains(&format!("--index-server-token-file={path}")));
    let (ok, text) = check_args(
        "ic-kvevent-subscriber",
        &strings(&subscriber["args"]),
        &subscriber["env"],
    );
    assert!(ok, "{text}");
}

#[test]
fn webhook_paths_and_ports_are_the_ones_the_webhook_serves() {
    let all = objects(&render(CHART, &[]));
    let mutating = find(
        &all,
        "MutatingWebhookConfiguration",
        "inferencecache-webhook",
    )
    .unwrap();
    let validating = find(
        &all,
        "ValidatingWebhookConfiguration",
        "inferencecache-webhook",
    )
    .unwrap();
    let hooks: Vec<&Value> = mutating["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .chain(validating["webhooks"].as_array().unwrap())
        .collect();
    assert_eq!(hooks.len(), 3);
    // Each configuration names the Service, on its HTTPS port, which
    // targets the container port the webhook listens on.
    let service = find(&all, "Service", "inferencecache-webhook").unwrap();
    let container = &find(&all, "Deployment", "inferencecache-webhook").unwrap()["spec"]["template"]
        ["spec"]["containers"][0];
    let https_port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "https")
        .unwrap()["containerPort"]
        .clone();
    assert!(strings(&container["args"]).contains(&format!("--https-addr=0.0.0.0:{https_port}")));
    for hook in &hooks {
        let svc = &hook["clientConfig"]["service"];
        assert_eq!(svc["name"], "inferencecache-webhook");
        assert_eq!(svc["namespace"], NAMESPACE);
        let port = service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["port"] == svc["port"])
            .unwrap();
        assert_eq!(port["targetPort"], "https");
    }
    // The failure policies and operations the spec asks for.
    let by_name = |n: &str| hooks.iter().find(|h| h["name"] == n).unwrap();
    assert_eq!(
        by_name("mcachebackend.inferencecache.io")["failurePolicy"],
        "Fail"
    );
    assert_eq!(
        by_name("vcachebackend.inferencecache.io")["failurePolicy"],
        "Fail"
    );
    let pods = by_name("mpod.inferencecache.io");
    assert_eq!(pods["failurePolicy"], "Ignore");
    assert_eq!(pods["rules"][0]["operations"], json!(["CREATE"]));
    let excluded = strings(&pods["namespaceSelector"]["matchExpressions"][0]["values"]);
    assert!(
        excluded.contains(&"kube-system".to_owned()) && excluded.contains(&NAMESPACE.to_owned())
    );

    // The real webhook answers every configured path with an AdmissionReview.
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).unwrap();
    std::fs::write(
        dir.path().join("kubeconfig"),
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let mut webhook = ic_e2e::ServiceProcess::start(
        &ic_e2e::workspace_binary("ic-webhook"),
        &[
            "--admin-addr",
            "127.0.0.1:0",
            "--https-addr",
            "127.0.0.1:0",
            "--tls-cert",
            dir.path().join("tls.crt").to_str().unwrap(),
            "--tls-key",
            dir.path().join("tls.key").to_str().unwrap(),
            "--kubeconfig",
            dir.path().join("kubeconfig").to_str().unwrap(),
        ],
    );
    let addr: std::net::SocketAddr = webhook.addr("https");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for hook in &hooks {
        let path = hook["clientConfig"]["service"]["path"].as_str().unwrap();
        let resource = hook["rules"][0]["resources"][0].as_str().unwrap();
        let (group, version, kind) = if resource == "pods" {
            ("", "v1", "Pod")
        } else {
            ("inferencecache.io", "v1alpha1", "CacheBackend")
        };
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "contract", "kind": {"group": group, "version": version, "kind": kind},
                "resource": {"group": group, "version": version, "resource": resource},
                "namespace": "team-a", "operation": "CREATE", "userInfo": {"username": "test"},
                "object": {"apiVersion": if group.is_empty() { "v1".to_owned() } else { format!("{group}/{version}") },
                    "kind": kind, "metadata": {"name": "x", "namespace": "team-a"},
                    "spec": if kind == "Pod" { json!({"containers": [{"name": "c", "image": "i"}]}) } else { json!({"runtime": "VLLM"}) }}}});
        let (status, body) = runtime.block_on(post_insecure(addr, path, &review));
        assert_eq!(status, 200, "{path}: {body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["response"]["uid"], "contract", "{path}: {body}");
    }
    assert!(webhook.stop().success());
}

/// POST over TLS without verifying the certificate (the test's own, for
/// `localhost`): only the path matters here.
async fn post_insecure(addr: std::net::SocketAddr, path: &str, body: &Value) -> (u16, String) {
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    #[derive(Debug)]
    struct AnyCert;
    impl rustls::client::danger::ServerCertVerifier for AnyCert {
        fn verify_server_cert(
            &self,
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &[rustls_pki_types::CertificateDer<'_>],
            _: &rustls_pki_types::ServerName<'_>,
            _: &[u8],
            _: rustls_pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &rustls_pki_types::CertificateDer<'_>,
            _: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            rustls::crypto::ring::default_provider()
                .signature_verification_algorithms
                .supported_schemes()
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(Arc::new(AnyCert))
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls_pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let body = serde_json::to_vec(body).unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(&body).await.unwrap();
    let mut answer = Vec::new();
    tls.read_to_end(&mut answer).await.ok();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

/// `[default: X]` of `--flag` in `binary --help`.
fn default_of(binary: &str, flag: &str) -> String {
    let help = ic_e2e::help_text(&ic_e2e::workspace_binary(binary));
    let at = help
        .find(&format!("{flag} "))
        .unwrap_or_else(|| panic!("{binary} has no {flag}"));
    let rest = &help[at..];
    let start = rest.find("[default: ").unwrap() + "[default: ".len();
    rest[start..].split(']').next().unwrap().to_owned()
}

#[test]
fn services_carry_the_names_and_ports_the_binaries_dial_by_default() {
    let all = objects(&render(CHART, &[]));
    let dialled = [
        ("ic-controller", "--server-probe-url"),
        ("ic-controller", "--snapshot-url"),
        ("ic-controller", "--index-server-grpc"),
        ("ic-webhook", "--index-server"),
    ];
    for (binary, flag) in dialled {
        let url = default_of(binary, flag);
        let authority = url.trim_start_matches("http://").split('/').next().unwrap();
        let (host, port) = authority.rsplit_once(':').unwrap();
        let (service, namespace) = host.split_once('.').unwrap();
        assert_eq!(namespace, NAMESPACE, "{binary} {flag} {url}");
        let svc = find(&all, "Service", service)
            .unwrap_or_else(|| panic!("no Service {service} for {binary} {flag}"));
        assert!(
            svc["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["port"].as_u64().map(|n| n.to_string()).as_deref() == Some(port)),
            "Service {service} has no port {port} ({binary} {flag})"
        );
        // With the default namespace the chart passes exactly the default,
        // except where every replica must be reached (the webhook hands the
        // subscribers, and the controller's CachePolicy pusher takes, the
        // headless Service of the same replicas on the same port).
        let headless = binary == "ic-webhook" || flag == "--index-server-grpc";
        let deployment = format!("inferencecache-{}", binary.trim_start_matches("ic-"));
        let container = &find(&all, "Deployment", &deployment).unwrap()["spec"]["template"]["spec"]
            ["containers"][0];
        let want = if headless {
            url.replace(service, &format!("{service}-headless"))
        } else {
            url.clone()
        };
        assert!(
            strings(&container["args"]).contains(&format!("{flag}={want}")),
            "{binary} {flag}={want}"
        );
        let served = find(&all, "Service", &format!("{service}-headless"))
            .filter(|_| headless)
            .unwrap_or(svc);
        assert_eq!(served["spec"]["selector"], svc["spec"]["selector"]);
        assert!(
            served["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["port"].as_u64().map(|n| n.to_string()).as_deref() == Some(port)),
            "{want}"
        );
    }
    // Each server's listening ports are its container ports and its Service's.
    let listens = [
        (
            "ic-controller",
            "inferencecache-controller",
            "--admin-addr",
            "admin",
        ),
        (
            "ic-webhook",
            "inferencecache-webhook",
            "--admin-addr",
            "admin",
        ),
        (
            "ic-webhook",
            "inferencecache-webhook",
            "--https-addr",
            "https",
        ),
        (
            "ic-index-server",
            "inferencecache-index-server",
            "--http-addr",
            "http",
        ),
        (
            "ic-index-server",
            "inferencecache-index-server",
            "--grpc-addr",
            "grpc",
        ),
    ];
    for (binary, name, flag, port_name) in listens {
        let port: u64 = default_of(binary, flag)
            .rsplit(':')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let container =
            &find(&all, "Deployment", name).unwrap()["spec"]["template"]["spec"]["containers"][0];
        let declared = container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == port_name)
            .unwrap();
        assert_eq!(
            declared["containerPort"].as_u64(),
            Some(port),
            "{binary} {flag}"
        );
        let svc = find(&all, "Service", name).unwrap();
        assert!(
            svc["spec"]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["targetPort"] == port_name),
            "{name} {port_name}"
        );
    }
    let coordinator_port: u64 = default_of("ic-coordinator", "--port").parse().unwrap();
    let svc = find(&all, "Service", "inferencecache-coordinator").unwrap();
    assert_eq!(
        svc["spec"]["ports"][0]["port"].as_u64(),
        Some(coordinator_port)
    );
}
