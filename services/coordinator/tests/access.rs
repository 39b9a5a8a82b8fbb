//! The real binary with `--api-audience`: the operator endpoints (quotas,
//! pins, delete, prefetch) refuse anonymous callers, tokens for another
//! audience and identities that are neither `--api-admin` nor allowed the
//! endpoint by RBAC, with tokens checked by TokenReview and RBAC asked by
//! SubjectAccessReview against the stateful fake API server; everything
//! LMCache's workers call stays open.
#![allow(clippy::unwrap_used)]

use ic_e2e::ServiceProcess;
use ic_fake_apiserver::{FakeApi, Grant, TokenIdentity};
use serde_json::{Value, json};

const AUDIENCE: &str = "inferencecache-coordinator";
const CONTROLLER: &str = "system:serviceaccount:ic-system:inferencecache-controller";
const PIN_OPERATOR: &str = "system:serviceaccount:ops:pinner";

/// Every operator mutation, with a body it accepts.
fn operator_calls() -> Vec<(reqwest::Method, &'static str, Value)> {
    use reqwest::Method;
    let tokens = json!({"token_ids": [1, 2, 3, 4], "model_name": "org/model-a", "world_size": 1, "cache_salt": ""});
    vec![
        (Method::PUT, "/quota/_default", json!({"limit_gb": 0})),
        (Method::PUT, "/quota/config", json!({"default_limit_gb": 0})),
        (Method::PUT, "/quota/tenant-a", json!({"limit_gb": 1})),
        (Method::DELETE, "/quota/tenant-a", json!({})),
        (Method::POST, "/cache/pins", tokens.clone()),
        (Method::DELETE, "/cache/pins", tokens.clone()),
        (
            Method::POST,
            "/cache/delete",
            json!({"instance_id": "mp-a", "token_ids": [1, 2, 3, 4], "model_name": "org/model-a", "world_size": 1}),
        ),
        (
            Method::POST,
            "/cache/prefetches",
            json!({"instance_id": "mp-a", "token_ids": [1, 2, 3, 4], "model_name": "org/model-a", "world_size": 1}),
        ),
    ]
}

async fn call(
    http: &reqwest::Client,
    base: &str,
    (method, path, body): &(reqwest::Method, &str, Value),
    token: Option<&str>,
) -> (u16, Value) {
    let mut request = http
        .request(method.clone(), format!("{base}{path}"))
        .json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

async fn get(http: &reqwest::Client, base: &str, path: &str) -> Value {
    let response = http.get(format!("{base}{path}")).send().await.unwrap();
    response.json().await.unwrap()
}

/// The coordinator with `--api-audience` (and `extra`), asking `fake`'s
/// API server; what must live as long as the process rides along.
async fn start_with_api(
    fake: &FakeApi,
    extra: &[&str],
) -> (
    ServiceProcess,
    String,
    ic_fake_apiserver::Served,
    tempfile::TempDir,
) {
    let served = fake.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig =
        ic_fake_apiserver::write_kubeconfig(dir.path(), served.addr, "coordinator", "ic-system")
            .unwrap();
    let mut args = vec![
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--api-audience",
        AUDIENCE,
    ];
    args.extend_from_slice(extra);
    let mut process = ServiceProcess::start_with_env(
        std::path::Path::new(env!("CARGO_BIN_EXE_ic-coordinator")),
        &args,
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    );
    let base = format!("http://{}", process.admin_addr());
    (process, base, served, dir)
}

async fn metrics_text(http: &reqwest::Client, base: &str) -> String {
    http.get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_endpoints_refuse_anyone_but_the_admins_and_rbac_grants() {
    let fake = FakeApi::new();
    fake.add_token("controller", TokenIdentity::new(CONTROLLER, AUDIENCE, None));
    fake.add_token(
        "intruder",
        TokenIdentity::new("system:serviceaccount:team-b:default", AUDIENCE, None),
    );
    fake.add_token(
        "other-audience",
        TokenIdentity::new(CONTROLLER, "vault", None),
    );
    // RBAC lets the pinner create and delete pins, and nothing else (a
    // grant on the resource itself does not cover its subresources).
    fake.add_token("pinner", TokenIdentity::new(PIN_OPERATOR, AUDIENCE, None));
    for verb in ["create", "delete"] {
        fake.grant(Grant::new(
            PIN_OPERATOR,
            verb,
            "inferencecache.io",
            "coordinators/pins",
            "",
        ));
    }
    fake.grant(Grant::new(
        PIN_OPERATOR,
        "update",
        "inferencecache.io",
        "coordinators",
        "",
    ));
    fake.grant(Grant::new(
        "system:serviceaccount:team-b:default",
        "delete",
        "inferencecache.io",
        "coordinators/entries",
        "team-b",
    ));
    let (mut process, base, _served, _dir) =
        start_with_api(&fake, &["--api-admin", CONTROLLER]).await;
    let http = reqwest::Client::new();

    // LMCache's workers send no credentials: registration and events work.
    let register = http
        .post(format!("{base}/instances"))
        .json(&json!({"instance_id": "mp-a", "ip": "127.0.0.1", "http_port": 8080}))
        .send()
        .await
        .unwrap();
    assert_eq!(register.status(), 200);
    let key = json!({"chunk_hash_hex": "00ff", "model_name": "org/model-a", "kv_rank": 16_777_472,
                     "object_group_id": 0, "cache_salt": ""});
    let events = http
        .post(format!("{base}/events"))
        .json(
            &json!({"batches": [{"instance_id": "mp-a", "incarnation": 1000, "seq": 1,
            "event_type": "store", "tier": "l2", "backend": "s3",
            "entries": [{"key": key, "size_bytes": 8192}]}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let keys = |stats: Value| stats["num_keys"].as_u64().unwrap();
    assert_eq!(keys(get(&http, &base, "/directory/stats").await), 1);

    let mut refused = 0;
    for op in operator_calls() {
        let (status, body) = call(&http, &base, &op, None).await;
        assert_eq!(status, 401, "anonymous {} {}: {body}", op.0, op.1);
        assert!(
            body["detail"].as_str().unwrap().contains("bearer"),
            "{body}"
        );
        let (status, body) = call(&http, &base, &op, Some("other-audience")).await;
        assert_eq!(status, 401, "wrong audience {} {}: {body}", op.0, op.1);
        // A namespaced grant does not cover the cluster-wide endpoints.
        let (status, body) = call(&http, &base, &op, Some("intruder")).await;
        assert_eq!(status, 403, "non-admin {} {}: {body}", op.0, op.1);
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains("team-b") && detail.contains("coordinators/"),
            "{body}"
        );
        refused += 3;
        if op.1 != "/cache/pins" {
            let (status, body) = call(&http, &base, &op, Some("pinner")).await;
            assert_eq!(status, 403, "pinner {} {}: {body}", op.0, op.1);
            refused += 1;
        }
    }
    // What RBAC grants it, the pinner may do.
    for op in operator_calls()
        .into_iter()
        .filter(|op| op.1 == "/cache/pins")
    {
        let (status, body) = call(&http, &base, &op, Some("pinner")).await;
        assert!(
            status != 401 && status != 403,
            "pinner {} {} refused: {status} {body}",
            op.0,
            op.1
        );
    }
    // Nothing the refused calls asked for happened: no quota of 0, the key
    // still there.
    let quota = get(&http, &base, "/quota/config").await;
    assert!(quota["default_limit_gb"].is_null(), "{quota}");
    assert_eq!(keys(get(&http, &base, "/directory/stats").await), 1);

    // The controller's token is accepted on every one of them.
    for op in operator_calls() {
        let (status, body) = call(&http, &base, &op, Some("controller")).await;
        assert!(
            status != 401 && status != 403,
            "admin {} {} refused: {status} {body}",
            op.0,
            op.1
        );
    }
    let metrics = metrics_text(&http, &base).await;
    let counted: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("lmcache_coordinator_access_refusals_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(counted, f64::from(refused), "{metrics}");
    // What it asked the API server is what the chart grants it.
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../charts/inference-cache/rbac/ic-coordinator.txt");
    ic_fake_apiserver::rbac::check_contract(
        &file,
        "ic-coordinator",
        "services/coordinator/tests/access.rs",
        &ic_fake_apiserver::rbac::permissions(&fake.requests()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(process.stop().success());
}

/// A flood of distinct unknown tokens costs the API server at most
/// `--token-reviews-per-second` reviews beyond the burst; the rest are
/// answered 503 without asking, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tokens_cost_the_api_server_a_bounded_number_of_reviews() {
    let fake = FakeApi::new();
    let (_process, base, _served, _dir) = start_with_api(
        &fake,
        &[
            "--token-reviews-per-second",
            "1",
            "--token-review-burst",
            "2",
        ],
    )
    .await;
    let http = reqwest::Client::new();
    let started = std::time::Instant::now();
    let quota = (
        reqwest::Method::PUT,
        "/quota/config",
        json!({"default_limit_gb": 0}),
    );
    let mut unavailable = 0;
    for i in 0..20 {
        let (status, body) = call(&http, &base, &quota, Some(&format!("garbage-{i}"))).await;
        assert!(status == 401 || status == 503, "{status} {body}");
        unavailable += usize::from(status == 503);
    }
    let reviews = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/tokenreviews"))
        .count();
    let bound = 2 + started.elapsed().as_secs() as usize;
    assert!(reviews <= bound, "{reviews} reviews, bound {bound}");
    assert_eq!(reviews + unavailable, 20);
    let metrics = metrics_text(&http, &base).await;
    assert!(
        metrics.contains(&format!(
            "lmcache_coordinator_token_reviews_throttled_total {unavailable}"
        )),
        "{metrics}"
    );
}
