//! Access control of the gRPC API and `/snapshot` in Kubernetes mode, with
//! the real binary asking the fake API server's TokenReview and
//! SubjectAccessReview endpoints: every privileged path refuses anonymous
//! and wrong-tenant callers, and the forgeries a hostile pod could make
//! before are refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;

use ic_e2e::ServiceProcess;
use ic_e2e::ingest::{Replica, resync, stored};
use ic_fake_apiserver::{FakeApi, Grant, TokenIdentity};
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use tonic::Code;

const AUDIENCE: &str = "inferencecache";
const CONTROLLER: &str = "system:serviceaccount:ic-system:ic-controller";
const GATEWAY: &str = "system:serviceaccount:gateway:envoy";

struct World {
    fake: FakeApi,
    _served: ic_fake_apiserver::Served,
    _dir: tempfile::TempDir,
    _process: ServiceProcess,
    grpc: String,
    admin: SocketAddr,
}

fn token(fake: &FakeApi, token: &str, username: &str, pod: Option<&str>, audience: &str) {
    fake.add_token(token, TokenIdentity::new(username, audience, pod));
}

async fn world() -> World {
    world_with(&[]).await
}

async fn world_with(extra: &[&str]) -> World {
    let fake = FakeApi::new();
    // The subscriber in engine pod team-a/vllm-0 (a projected, pod-bound
    // token); a token of the same service account without a pod; a
    // token for another audience; the gateway; the controller.
    token(
        &fake,
        "sub-a",
        "system:serviceaccount:team-a:default",
        Some("vllm-0"),
        AUDIENCE,
    );
    // A second engine pod of the same service account.
    token(
        &fake,
        "sub-a1",
        "system:serviceaccount:team-a:default",
        Some("vllm-1"),
        AUDIENCE,
    );
    token(
        &fake,
        "unbound-a",
        "system:serviceaccount:team-a:default",
        None,
        AUDIENCE,
    );
    token(
        &fake,
        "other-audience",
        "system:serviceaccount:team-a:default",
        Some("vllm-0"),
        "vault",
    );
    token(&fake, "gateway", GATEWAY, None, AUDIENCE);
    token(&fake, "controller", CONTROLLER, None, AUDIENCE);
    token(
        &fake,
        "monitor",
        "system:serviceaccount:obs:reader",
        None,
        AUDIENCE,
    );
    fake.grant(Grant::new(
        GATEWAY,
        "get",
        "inferencecache.io",
        "routes",
        "team-a",
    ));
    fake.grant(Grant::new(
        "system:serviceaccount:obs:reader",
        "list",
        "inferencecache.io",
        "routes",
        "",
    ));
    let served = fake.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig =
        ic_fake_apiserver::write_kubeconfig(dir.path(), served.addr, "index-server", "ic-system")
            .unwrap();
    let mut args = vec![
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--api-audience",
        AUDIENCE,
        "--api-admin",
        CONTROLLER,
        // No --probe-allowed-identity: the --api-admin may probe.
        "--probe-audience",
        AUDIENCE,
    ];
    args.extend_from_slice(extra);
    let mut process = ServiceProcess::start_with_env(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-index-server")),
        &args,
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let grpc = format!("http://{}", process.addr("grpc"));
    let admin = process.admin_addr();
    World {
        fake,
        _served: served,
        _dir: dir,
        _process: process,
        grpc,
        admin,
    }
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

impl World {
    async fn client(&self) -> IndexServiceClient<tonic::transport::Channel> {
        IndexServiceClient::connect(self.grpc.clone())
            .await
            .unwrap()
    }

    async fn ingest(
        &self,
        token: Option<&str>,
        batch: pb::IngestBatch,
    ) -> Result<(), tonic::Status> {
        let ack = self
            .client()
            .await
            .ingest_events(with_token(futures::stream::iter(vec![batch]), token))
            .await?
            .into_inner();
        assert!(!ack.resync_required, "{ack:?}");
        Ok(())
    }

    async fn lookup(&self, token: Option<&str>, tenant: &str) -> Result<u32, tonic::Status> {
        let request = pb::LookupRouteRequest {
            scope: Some(pb::IndexScope {
                tenant: tenant.into(),
                model: "m".into(),
                hash_scheme: pb::HashScheme::Vllm as i32,
                adapter: String::new(),
            }),
            key: Some(pb::lookup_route_request::Key::BlockHashes(
                pb::BlockHashes {
                    hashes: vec![1, 2, 3],
                },
            )),
            observe_only: true,
            ..Default::default()
        };
        let answer = self
            .client()
            .await
            .lookup_route(with_token(request, token))
            .await?
            .into_inner();
        Ok(answer.best.map_or(0, |b| b.matched_blocks))
    }

    async fn set_policies(&self, token: Option<&str>) -> Result<(), tonic::Status> {
        self.client()
            .await
            .set_policies(with_token(pb::SetPoliciesRequest::default(), token))
            .await
            .map(|_| ())
    }

    async fn snapshot(&self, token: Option<&str>) -> (u16, serde_json::Value) {
        let mut request = reqwest::Client::new().get(format!("http://{}/snapshot", self.admin));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.admin))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

fn replica<'a>(tenant: &'a str, replica_id: &'a str, address: &'a str) -> Replica<'a> {
    Replica {
        tenant,
        model: "m",
        replica_id,
        address,
        dp_rank: 0,
    }
}

fn holding(r: &Replica<'_>) -> pb::IngestBatch {
    resync(r, vec![stored(vec![1, 2, 3], 16, pb::Tier::T1)])
}

fn code(result: Result<impl std::fmt::Debug, tonic::Status>) -> (Code, String) {
    let status = result.unwrap_err();
    (status.code(), status.message().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_speaks_only_for_the_callers_own_pod_in_its_own_namespace() {
    let w = world().await;
    let mine = replica("team-a", "vllm-0", "10.0.0.7:8000");
    w.ingest(Some("sub-a"), holding(&mine)).await.unwrap();

    assert_eq!(
        code(w.ingest(None, holding(&mine)).await).0,
        Code::Unauthenticated
    );
    let (c, m) = code(w.ingest(Some("stolen"), holding(&mine)).await);
    assert_eq!(c, Code::Unauthenticated, "{m}");
    let (c, m) = code(w.ingest(Some("other-audience"), holding(&mine)).await);
    assert_eq!(c, Code::Unauthenticated, "{m}");
    assert!(m.contains("audience"), "{m}");
    // Writing into another tenant, kube-system included.
    let (c, m) = code(
        w.ingest(
            Some("sub-a"),
            holding(&replica("kube-system", "vllm-0", "10.0.0.7:8000")),
        )
        .await,
    );
    assert_eq!(c, Code::PermissionDenied, "{m}");
    assert!(m.contains("replica.scope.tenant"), "{m}");
    // Claiming another (real) replica, or a phantom one, to send gateways
    // elsewhere or win `best`.
    let (c, m) = code(
        w.ingest(
            Some("sub-a"),
            holding(&replica("team-a", "vllm-1", "10.6.6.6:8000")),
        )
        .await,
    );
    assert_eq!(c, Code::PermissionDenied, "{m}");
    assert!(m.contains("replica.replica_id"), "{m}");
    // A token of the right service account that is not bound to a pod.
    let (c, m) = code(w.ingest(Some("unbound-a"), holding(&mine)).await);
    assert_eq!(c, Code::PermissionDenied, "{m}");
    // The controller is an admin, not a subscriber.
    let (c, _) = code(w.ingest(Some("controller"), holding(&mine)).await);
    assert_eq!(c, Code::PermissionDenied);

    // Nothing refused reached the index: only the real replica is there.
    let (status, snapshot) = w.snapshot(Some("controller")).await;
    assert_eq!(status, 200);
    let rows: Vec<(String, String)> = snapshot["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["tenant"].as_str().unwrap().to_owned(),
                r["replicaId"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(rows, vec![("team-a".to_owned(), "vllm-0".to_owned())]);
    let metrics = w.metrics().await;
    assert!(
        metrics.contains(
            "inferencecache_index_access_refusals_total{path=\"ingest\",reason=\"permission_denied\"} 4"
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_need_the_right_to_read_the_tenants_routes() {
    let w = world().await;
    let mine = replica("team-a", "vllm-0", "10.0.0.7:8000");
    w.ingest(Some("sub-a"), holding(&mine)).await.unwrap();

    assert_eq!(w.lookup(Some("gateway"), "team-a").await.unwrap(), 3);
    assert_eq!(
        code(w.lookup(None, "team-a").await).0,
        Code::Unauthenticated
    );
    let (c, m) = code(w.lookup(Some("gateway"), "team-b").await);
    assert_eq!(c, Code::PermissionDenied, "{m}");
    assert!(m.contains("routes.inferencecache.io"), "{m}");
    assert!(m.contains("team-b"), "{m}");
    // An engine pod's subscriber may not read its tenant's hints.
    assert_eq!(
        code(w.lookup(Some("sub-a"), "team-a").await).0,
        Code::PermissionDenied
    );
    // The controller may (the probe and icctl read through it).
    assert_eq!(w.lookup(Some("controller"), "team-a").await.unwrap(), 3);
    // Decisions are cached: the gateway's repeated lookups ask once.
    w.fake.clear_requests();
    for _ in 0..5 {
        assert_eq!(w.lookup(Some("gateway"), "team-a").await.unwrap(), 3);
    }
    let reviews = w
        .fake
        .requests()
        .iter()
        .filter(|r| r.path.contains("subjectaccessreviews") || r.path.contains("tokenreviews"))
        .count();
    assert_eq!(reviews, 0, "cached reviews and decisions ask no one");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_server_asks_the_api_is_what_the_chart_grants() {
    let w = world().await;
    // Every kind of call: a TokenReview and a SubjectAccessReview.
    assert!(w.lookup(Some("gateway"), "team-a").await.is_ok());
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts/inference-cache/rbac/ic-index-server.txt");
    ic_fake_apiserver::rbac::check_contract(
        &file,
        "ic-index-server",
        "services/index-server/tests/access.rs",
        &ic_fake_apiserver::rbac::permissions(&w.fake.requests()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_controller_sets_policies_and_snapshot_readers_need_cluster_wide_list() {
    let w = world().await;
    assert_eq!(code(w.set_policies(None).await).0, Code::Unauthenticated);
    let (c, m) = code(w.set_policies(Some("gateway")).await);
    assert_eq!(c, Code::PermissionDenied, "{m}");
    assert!(m.contains("--api-admin"), "{m}");
    assert_eq!(
        code(w.set_policies(Some("sub-a")).await).0,
        Code::PermissionDenied
    );
    w.set_policies(Some("controller")).await.unwrap();

    let (status, body) = w.snapshot(None).await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = w.snapshot(Some("gateway")).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("cluster-wide"),
        "{body}"
    );
    assert_eq!(w.snapshot(Some("monitor")).await.0, 200);
    assert_eq!(w.snapshot(Some("controller")).await.0, 200);
    // Health stays open for probes and load balancers.
    let healthz = reqwest::get(format!("http://{}/healthz", w.admin))
        .await
        .unwrap();
    assert_eq!(healthz.status().as_u16(), 200);
}

/// An ingest stream held open with `token`: the call's outcome arrives on
/// the task once the server answers (at once when it refuses the stream).
async fn hold_stream(
    w: &World,
    token: &str,
) -> (
    tokio::sync::mpsc::Sender<pb::IngestBatch>,
    tokio::task::JoinHandle<Result<(), tonic::Status>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut client = w.client().await;
    let request = with_token(tokio_stream::wrappers::ReceiverStream::new(rx), Some(token));
    let call = tokio::spawn(async move { client.ingest_events(request).await.map(|_| ()) });
    (tx, call)
}

fn gauge(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The per-client stream cap counts pods, not service accounts: two engine
/// pods sharing one account each get their own share, and one pod cannot
/// take its neighbour's.
#[tokio::test]
async fn the_stream_cap_is_per_pod_not_per_service_account() {
    let w = world_with(&["--max-ingest-streams-per-client", "1"]).await;
    let (_a, a_call) = hold_stream(&w, "sub-a").await;
    let (_b, b_call) = hold_stream(&w, "sub-a1").await;
    // Both admitted: two streams open, neither call answered.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let m = w.metrics().await;
        if gauge(&m, "inferencecache_index_ingest_streams") == 2.0 {
            break;
        }
        assert!(
            !b_call.is_finished() && !a_call.is_finished(),
            "a pod's stream was refused (the cap counted the service account)"
        );
        assert!(std::time::Instant::now() < deadline, "{m}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // vllm-0's second stream is over its own share.
    let (_a2, a2_call) = hold_stream(&w, "sub-a").await;
    let (code, message) = code(a2_call.await.unwrap());
    assert_eq!(code, Code::ResourceExhausted, "{message}");
    assert!(
        message.contains("--max-ingest-streams-per-client"),
        "{message}"
    );
    assert!(!a_call.is_finished() && !b_call.is_finished());
}

/// `/probe` takes the audience's tokens only from the identities allowed
/// to probe (here the `--api-admin`, the chart's controller): an engine
/// pod's subscriber token carries the same audience and gets 403.
#[tokio::test]
async fn only_the_controller_may_probe_though_subscribers_share_its_audience() {
    let w = world().await;
    let probe = |token: &'static str| {
        let admin = w.admin;
        async move {
            reqwest::Client::new()
                .post(format!("http://{admin}/probe"))
                .bearer_auth(token)
                .header("content-type", "application/json")
                .body(r#"{"namespace": "team-a", "backend": "cache"}"#)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    assert_eq!(probe("controller").await, 200);
    assert_eq!(probe("sub-a").await, 403);
    assert_eq!(probe("gateway").await, 403);
}

/// A flood of distinct unknown tokens costs the API server at most
/// `--token-reviews-per-second` (after its burst) reviews: the rest are
/// answered UNAVAILABLE without asking, counted, while a token already
/// reviewed keeps working from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tokens_cost_the_api_server_a_bounded_number_of_reviews() {
    let w = world_with(&["--token-reviews-per-second=1", "--token-review-burst=2"]).await;
    let started = std::time::Instant::now();
    assert!(w.lookup(Some("gateway"), "team-a").await.is_ok());
    w.fake.clear_requests();
    let mut unavailable = 0;
    for i in 0..20 {
        let code = w
            .lookup(Some(&format!("garbage-{i}")), "team-a")
            .await
            .unwrap_err()
            .code();
        assert!(
            matches!(
                code,
                tonic::Code::Unauthenticated | tonic::Code::Unavailable
            ),
            "{code:?}"
        );
        unavailable += usize::from(code == tonic::Code::Unavailable);
    }
    let reviews = w
        .fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/tokenreviews"))
        .count();
    // The burst (less the gateway's review) and one a second since.
    let bound = 2 + started.elapsed().as_secs() as usize;
    assert!(reviews <= bound, "{reviews} reviews, bound {bound}");
    assert_eq!(reviews + unavailable, 20);
    assert!(w.lookup(Some("gateway"), "team-a").await.is_ok(), "cached");
    let metrics = reqwest::get(format!("http://{}/metrics", w.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!(
            "inferencecache_index_token_reviews_throttled_total {unavailable}"
        )),
        "{metrics}"
    );
}
