//! The authenticated data plane on loopback: the real index server in
//! Kubernetes access mode (TokenReview and SubjectAccessReview answered by
//! the fake API server), the real subscriber presenting its projected token
//! from a file, a gateway presenting its own. The token file is read again
//! on every reconnect, so a rotated token needs no restart; a subscriber
//! that claims another pod gets nothing into the index.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use ic_e2e::engine::FakeEngine;
use ic_e2e::{ServiceProcess, workspace_binary};
use ic_fake_apiserver::{FakeApi, Grant, TokenIdentity};
use ic_kvevents::encode::{Era, gpu_store};
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;

const AUDIENCE: &str = "inferencecache";
const MODEL: &str = "meta-llama/Llama-3.1-8B";
const GATEWAY: &str = "system:serviceaccount:gateway:envoy";

fn pod_token(fake: &FakeApi, token: &str, pod: &str) {
    fake.add_token(
        token,
        TokenIdentity::new("system:serviceaccount:team-a:default", AUDIENCE, Some(pod)),
    );
}

fn index_server(grpc_port: u16, kubeconfig: &std::path::Path) -> ServiceProcess {
    ServiceProcess::start_with_env(
        &workspace_binary("ic-index-server"),
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            &format!("127.0.0.1:{grpc_port}"),
            "--api-audience",
            AUDIENCE,
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    )
}

/// Blocks the gateway is told `llama-0` holds for `prompt`.
async fn matched(grpc: &str, prompt: &[u32]) -> u32 {
    matched_by(grpc, None, Some("gateway"), prompt, "llama-0").await
}

/// Blocks `replica` holds for `prompt`, asked over TLS trusting `ca_pem`
/// when given, presenting `token` when given.
async fn matched_by(
    grpc: &str,
    ca_pem: Option<&str>,
    token: Option<&str>,
    prompt: &[u32],
    replica: &str,
) -> u32 {
    let endpoint = ic_proto::channel::endpoint(grpc, ca_pem.map(str::as_bytes), "test").unwrap();
    let mut client = IndexServiceClient::new(endpoint.connect().await.unwrap());
    let mut request = tonic::Request::new(pb::LookupRouteRequest {
        scope: Some(pb::IndexScope {
            tenant: "team-a".into(),
            model: MODEL.into(),
            hash_scheme: pb::HashScheme::Vllm as i32,
            adapter: String::new(),
        }),
        key: Some(pb::lookup_route_request::Key::TokenIds(pb::TokenIds {
            ids: prompt.to_vec(),
        })),
        observe_only: true,
        ..Default::default()
    });
    if let Some(token) = token {
        let value = ic_proto::bearer::metadata(token).unwrap();
        request.metadata_mut().insert("authorization", value);
    }
    let answer = client.lookup_route(request).await.unwrap().into_inner();
    answer
        .candidates
        .iter()
        .filter(|c| c.replica.as_ref().is_some_and(|r| r.replica_id == replica))
        .map(|c| c.matched_blocks)
        .sum()
}

async fn wait_for_blocks(grpc: &str, prompt: &[u32], want: u32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while matched(grpc, prompt).await != want {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_authenticate_with_a_rotating_token_and_cannot_speak_for_other_pods() {
    let fake = FakeApi::new();
    pod_token(&fake, "token-1", "llama-0");
    pod_token(&fake, "forger", "llama-1");
    fake.add_token("gateway", TokenIdentity::new(GATEWAY, AUDIENCE, None));
    fake.grant(Grant::new(
        GATEWAY,
        "get",
        "inferencecache.io",
        "routes",
        "team-a",
    ));
    let served = fake.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig =
        ic_fake_apiserver::write_kubeconfig(dir.path(), served.addr, "index-server", "ic").unwrap();
    let mut server = index_server(0, &kubeconfig);
    // The restart below reuses the port the first server bound.
    let port = server.addr("grpc").port();
    let grpc = format!("http://{}", server.addr("grpc"));

    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "token-1\n").unwrap();
    let mut engine = FakeEngine::start(Era::VllmMap, "kv-events").await;
    let mut args = engine.subscriber_args(&grpc, "llama-0", "team-a", MODEL, "10.0.0.1:8000");
    args.push(format!(
        "--index-server-token-file={}",
        token_file.display()
    ));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _sidecar = ServiceProcess::start(&workspace_binary("ic-kvevent-subscriber"), &args);
    // A subscriber in another pod of the namespace claiming to be llama-0.
    let mut forged_engine = FakeEngine::start(Era::VllmMap, "kv-events").await;
    let forged_file = dir.path().join("forged");
    std::fs::write(&forged_file, "forger").unwrap();
    let mut args =
        forged_engine.subscriber_args(&grpc, "llama-0", "team-a", MODEL, "10.6.6.6:8000");
    args.push(format!(
        "--index-server-token-file={}",
        forged_file.display()
    ));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut forger = ServiceProcess::start(&workspace_binary("ic-kvevent-subscriber"), &args);
    engine.wait_for_subscriber().await;
    forged_engine.wait_for_subscriber().await;

    let prompt: Vec<u32> = (0..64).map(|t| 500 + t).collect();
    engine
        .publish(&[gpu_store(vec![1, 2], None, prompt[..32].to_vec(), 16)])
        .await;
    // The forger claims the whole prompt for "llama-0" at its own address.
    forged_engine
        .publish(&[gpu_store(vec![7, 8, 9, 10], None, prompt.clone(), 16)])
        .await;
    wait_for_blocks(&grpc, &prompt, 2, "the engine's blocks never arrived").await;
    forger.wait_for_log("ingest stream ended");

    // The kubelet rotates the token: the old one stops working, the file
    // holds the new one. The index server restarts (its review cache goes
    // with it), and the subscriber reconnects with the new token.
    pod_token(&fake, "token-2", "llama-0");
    fake.remove_token("token-1");
    std::fs::write(&token_file, "token-2\n").unwrap();
    server.stop();
    let mut server = index_server(port, &kubeconfig);
    assert_eq!(format!("http://{}", server.addr("grpc")), grpc);
    wait_for_blocks(
        &grpc,
        &prompt,
        2,
        "the subscriber did not come back with the rotated token",
    )
    .await;
    // Still only what the real engine holds, never the forger's claim.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(matched(&grpc, &prompt).await, 2);
    server.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_stream_over_tls_and_refuse_a_server_they_do_not_trust() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ic_e2e::tls::TestCa::new();
    let (cert, key, _) = ca.write_loopback(dir.path());
    let mut server = ServiceProcess::start(
        &workspace_binary("ic-index-server"),
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-key-file",
            key.to_str().unwrap(),
        ],
    );
    let grpc = format!("https://127.0.0.1:{}", server.addr("grpc").port());

    // The CA arrives inline, as the webhook injects it.
    let mut engine = FakeEngine::start(Era::VllmMap, "kv-events").await;
    let args = engine.subscriber_args(&grpc, "llama-0", "team-a", MODEL, "10.0.0.1:8000");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let ca_pem = ca.pem();
    let _sidecar = ServiceProcess::start_with_env(
        &workspace_binary("ic-kvevent-subscriber"),
        &args,
        &[("IC_INDEX_SERVER_CA_PEM", ca_pem.as_str())],
    );
    // Another subscriber trusts a different CA: it must not stream.
    let stranger = ic_e2e::tls::TestCa::new();
    let stranger_file = dir.path().join("stranger.crt");
    std::fs::write(&stranger_file, stranger.pem()).unwrap();
    let mut other_engine = FakeEngine::start(Era::VllmMap, "kv-events").await;
    let mut args = other_engine.subscriber_args(&grpc, "llama-1", "team-a", MODEL, "10.0.0.2:8000");
    args.push(format!(
        "--index-server-ca-file={}",
        stranger_file.display()
    ));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut distrustful = ServiceProcess::start(&workspace_binary("ic-kvevent-subscriber"), &args);
    engine.wait_for_subscriber().await;
    other_engine.wait_for_subscriber().await;

    let prompt: Vec<u32> = (0..32).map(|t| 900 + t).collect();
    engine
        .publish(&[gpu_store(vec![1, 2], None, prompt.clone(), 16)])
        .await;
    other_engine
        .publish(&[gpu_store(vec![3, 4], None, prompt.clone(), 16)])
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while matched_by(&grpc, Some(&ca_pem), None, &prompt, "llama-0").await != 2 {
        assert!(
            Instant::now() < deadline,
            "the blocks never arrived over TLS"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let refused = distrustful.wait_for_log("cannot connect to index server");
    assert!(
        refused.to_string().contains("certificate"),
        "the refusal says why: {refused}"
    );
    assert_eq!(
        matched_by(&grpc, Some(&ca_pem), None, &prompt, "llama-1").await,
        0
    );
    server.stop();
}
