//! `/metrics`, `/status`, and controllers switched off by name.
#![allow(clippy::unwrap_used)]

mod common;

use common::{Coord, batch, config, key};
use serde_json::json;

const H: &str = "deadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeef";

async fn metrics_text(c: &Coord) -> (u16, String) {
    let resp = c.http.get(c.url("/metrics")).send().await.unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_use_reference_names_and_drop_departed_instances() {
    let c = Coord::start(&[]).await;
    c.register("mp-a", 9).await;
    c.call(reqwest::Method::PUT, "/instances/ghost/heartbeat", None)
        .await;
    c.events(vec![
        batch("mp-a", 1, 1, "store", "l1", "dram", &[(key(H, ""), 100)]),
        batch("mp-a", 1, 1, "store", "l1", "dram", &[(key(H, ""), 100)]),
        batch("mp-a", 1, 2, "store", "l2", "fs", &[(key(H, ""), 300)]),
    ])
    .await;
    let (status, text) = metrics_text(&c).await;
    assert_eq!(status, 200);
    for needle in [
        r#"lmcache_coordinator_key_directory_placements{tier="l1"} 1"#,
        r#"lmcache_coordinator_key_directory_placement_bytes{tier="l2"} 300"#,
        r#"lmcache_mp_key_directory_placement_count{tier="l2"} 1"#,
        r#"lmcache_mp_key_directory_placement_size_bytes{tier="l1"} 100"#,
        r#"lmcache_coordinator_events_batches_total{outcome="applied"} 2"#,
        r#"lmcache_coordinator_events_batches_total{outcome="duplicate"} 1"#,
        r#"lmcache_coordinator_registry_heartbeat_age_seconds{instance_id="mp-a"}"#,
        r#"lmcache_coordinator_controller_up{controller="FleetEvictionController"} 1"#,
        r#"inferencecache_build_info{binary="ic-coordinator""#,
        r#"lmcache_coordinator_http_requests_total{method="POST",route="/events",status="2xx"} 1"#,
        r#"lmcache_coordinator_http_requests_total{method="PUT",route="/instances/{instance_id}/heartbeat",status="4xx"} 1"#,
        r#"lmcache_coordinator_http_request_duration_seconds_count{route="/events"} 1"#,
    ] {
        assert!(text.contains(needle), "missing {needle}:\n{text}");
    }
    // The Prometheus text format (the reference's): typed `_total`
    // counters, no OpenMetrics `# EOF`.
    assert!(!text.contains("# EOF"), "{text}");
    assert!(text.contains("# TYPE lmcache_coordinator_events_batches_total counter"));
    assert!(
        !text.contains(H) && !text.contains("deadbeef"),
        "a cache key leaked into a label"
    );
    c.delete("/instances/mp-a", None).await;
    let (_, text) = metrics_text(&c).await;
    assert!(
        !text.contains(r#"instance_id="mp-a""#),
        "per-instance gauges must go:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_content_type_follows_accept() {
    let c = Coord::start(&[]).await;
    let plain = c.http.get(c.url("/metrics")).send().await.unwrap();
    assert!(
        plain.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=")
    );
    let om = c
        .http
        .get(c.url("/metrics"))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5",
        )
        .send()
        .await
        .unwrap();
    assert!(
        om.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_be_disabled() {
    let c = Coord::start(&["--disable-metrics"]).await;
    assert_eq!(metrics_text(&c).await.0, 404);
    assert_eq!(c.get("/healthz").await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_html_and_json() {
    let c = Coord::start(&[]).await;
    c.register("mp-a", 9).await;
    c.events(vec![batch("mp-a", 3, 1, "access", "l2", "", &[])])
        .await;
    let resp = c.http.get(c.url("/status")).send().await.unwrap();
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = resp.text().await.unwrap();
    assert!(
        html.contains("<td>mp-a</td>") && html.contains("FleetEvictionController"),
        "{html}"
    );
    let resp = c
        .http
        .get(c.url("/status"))
        .header("accept", "application/json")
        .send()
        .await
        .unwrap();
    let snap: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(snap["instances"], 1);
    assert_eq!(snap["streams"][0]["instance_id"], "mp-a");
    assert_eq!(snap["streams"][0]["incarnation"], 3);
    assert_eq!(snap["gate"]["admitted"], 1);
    assert!(snap["loops"].is_object(), "{snap}");
    let names: Vec<&str> = snap["controllers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["FleetEvictionController", "PrefetchManager"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_controller_routes_disappear() {
    let c = Coord::start(&[
        "--extra-config",
        r#"{"disabled_controllers": ["FleetEvictionController"], "acme.x": 1}"#,
    ])
    .await;
    for path in ["/quota", "/quota/t", "/cache/pins"] {
        assert_eq!(
            c.get(path).await,
            (404, json!({"detail": "Not Found"})),
            "{path}"
        );
    }
    assert_eq!(c.post("/cache/delete", json!({})).await.0, 404);
    // Other routes and event intake keep working without it.
    assert_eq!(
        c.events(vec![batch(
            "mp-a",
            1,
            1,
            "store",
            "l2",
            "fs",
            &[(key(H, "t"), 1)]
        )])
        .await["applied"],
        1
    );
    assert_eq!(c.post("/cache/prefetches", json!({})).await.0, 422);
    let (_, text) = metrics_text(&c).await;
    assert!(!text.contains("FleetEvictionController"));
}

#[test]
fn boot_fails_loudly_on_bad_configuration() {
    let clock = std::sync::Arc::new(ic_coordinator::clock::SystemClock::default());
    let err = |args: &[&str]| {
        ic_coordinator::build(&config(args), clock.clone())
            .unwrap_err()
            .to_string()
    };
    assert!(
        err(&[
            "--extra-config",
            r#"{"disabled_controllers": ["FleetEvictionControler"]}"#
        ])
        .contains("unknown controller")
    );
    assert!(
        err(&["--extra-config", r#"{"controller_packages": ["acme"]}"#])
            .contains("cannot load controller packages")
    );
    assert!(err(&["--extra-config", "{nope"]).contains("--extra-config"));
    assert!(err(&["--event-transport", "kafka"]).contains("--kafka-bootstrap-servers"));
    assert!(err(&["--max-ready-lag", "5"]).contains("only with --event-transport kafka"));
    assert!(err(&["--hash-algorithm", "sha256"]).contains("only blake3"));
    assert!(err(&["--trigger-watermark", "0"]).contains("--trigger-watermark"));
    assert!(err(&["--chunk-size", "0"]).contains("--chunk-size"));
    assert!(ic_coordinator::build(&config(&[]), clock).is_ok());
}
