//! OpenTelemetry export with the real binaries and a real OTLP/gRPC
//! receiver on loopback (gRPC's server decoding with the OpenTelemetry
//! project's protobuf classes, `e2e/otlp/receiver.py`).
//!
//! * A gateway's `traceparent` on LookupRoute becomes the parent of the
//!   index server's span.
//! * An engine's batch is one trace from the sidecar's `forward_batch` span
//!   to the index server's `ingest_batch` span (context carried in the
//!   batch).
//! * An icctl command is a trace: its `icctl` span is the parent of the
//!   index server's LookupRoute span.
//! * Every binary's registry is pushed as OTLP metrics, `process_*`
//!   included; the coordinator, like LMCache's, then answers 404 on
//!   `/metrics`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ic_e2e::engine::FakeEngine;
use ic_e2e::otlp::{Receiver, traceparent};
use ic_e2e::{ServiceProcess, http_get, workspace_binary};
use ic_kvevents::encode::{Era, gpu_store};
use ic_proto::IndexServiceClient;
use ic_proto::index_v1 as pb;
use serde_json::Value;

const TENANT: &str = "team-a";
const MODEL: &str = "meta-llama/Llama-3.1-8B";
const WAIT: Duration = Duration::from_secs(30);
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const GATEWAY_SPAN: &str = "00f067aa0ba902b7";

fn otlp_flags(receiver: &Receiver) -> Vec<String> {
    vec![
        "--otlp-endpoint".into(),
        receiver.endpoint(),
        "--otlp-export-interval-seconds".into(),
        "1".into(),
    ]
}

fn start(binary: &str, args: &[impl AsRef<str>]) -> ServiceProcess {
    let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    ServiceProcess::start(&workspace_binary(binary), &args)
}

const SERVER_ADDRS: &[&str] = &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"];
const COORDINATOR_ADDRS: &[&str] = &["--host", "127.0.0.1", "--port", "0"];

/// `binary` on `addrs`, exporting to `receiver`.
fn start_exporting(binary: &str, addrs: &[&str], receiver: &Receiver) -> ServiceProcess {
    let mut args: Vec<String> = addrs.iter().map(|a| (*a).to_owned()).collect();
    args.extend(otlp_flags(receiver));
    start(binary, &args)
}

fn metric_point(receiver: &Receiver, service: &str, name: &str) -> Value {
    receiver.wait_for(&format!("{service} metric {name}"), WAIT, |r| {
        r["signal"] == "metric" && r["service"] == service && r["name"] == name
    })
}

async fn lookup(grpc: &str, tokens: Vec<u32>, parent: Option<&str>) -> pb::LookupRouteResponse {
    let mut client = IndexServiceClient::connect(grpc.to_owned()).await.unwrap();
    let mut request = tonic::Request::new(ic_e2e::ingest::token_lookup(TENANT, MODEL, tokens));
    if let Some(parent) = parent {
        request
            .metadata_mut()
            .insert("traceparent", parent.parse().unwrap());
    }
    client.lookup_route(request).await.unwrap().into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_request_and_an_engine_batch_are_traced_across_processes() {
    let receiver = Receiver::start();
    let mut server = start_exporting("ic-index-server", SERVER_ADDRS, &receiver);
    let grpc = format!("http://{}", server.addr("grpc"));

    let mut engine = FakeEngine::start(Era::VllmMap, "kv-events").await;
    let mut sidecar_args =
        engine.subscriber_args(&grpc, "engine-0", TENANT, MODEL, "10.0.0.1:8000");
    sidecar_args.extend(otlp_flags(&receiver));
    let mut sidecar = start("ic-kvevent-subscriber", &sidecar_args);
    engine.wait_for_subscriber().await;

    let tokens: Vec<u32> = (0..64).collect();
    engine
        .publish(&[gpu_store(vec![11, 12, 13, 14], None, tokens.clone(), 16)])
        .await;
    let deadline = std::time::Instant::now() + WAIT;
    while lookup(&grpc, tokens.clone(), None).await.outcome != pb::LookupOutcome::PrefixMatch as i32
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the blocks never reached the index"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The gateway's context: the index server's span is its child.
    let answer = lookup(&grpc, tokens, Some(&traceparent(TRACE, GATEWAY_SPAN))).await;
    assert_eq!(answer.outcome, pb::LookupOutcome::PrefixMatch as i32);
    let span = receiver.wait_for("the LookupRoute span", WAIT, |r| {
        r["service"] == "ic-index-server" && r["name"] == "LookupRoute" && r["trace_id"] == TRACE
    });
    assert_eq!(span["parent_span_id"], GATEWAY_SPAN, "{span}");
    assert_eq!(span["kind"], 2, "SPAN_KIND_SERVER: {span}");
    assert_eq!(span["attributes"]["tenant"], TENANT, "{span}");
    assert_eq!(span["attributes"]["best"], "engine-0", "{span}");
    assert_eq!(span["attributes"]["matched_blocks"], 4, "{span}");
    assert_eq!(span["attributes"]["outcome"], "PREFIX_MATCH", "{span}");
    // A lookup without context starts its own trace.
    let untraced = receiver.spans("ic-index-server", "LookupRoute");
    assert!(
        untraced
            .iter()
            .any(|s| s["trace_id"] != TRACE && s["parent_span_id"] == ""),
        "{untraced:#?}"
    );

    // The batch that carried the engine's blocks (a delta, or the first
    // resync when the blocks beat it): the sidecar's span is the parent of
    // the server's.
    let sent = receiver.wait_for("the sidecar's span for the blocks", WAIT, |r| {
        r["service"] == "ic-kvevent-subscriber"
            && r["name"] == "forward_batch"
            && r["attributes"]["events"].as_i64() > Some(0)
    });
    assert_eq!(
        sent["resource"]["service.version"],
        env!("CARGO_PKG_VERSION")
    );
    let applied = receiver.wait_for("the server's span for that batch", WAIT, |r| {
        r["service"] == "ic-index-server"
            && r["name"] == "ingest_batch"
            && r["trace_id"] == sent["trace_id"]
    });
    assert_eq!(applied["parent_span_id"], sent["span_id"], "{applied}");
    assert_eq!(applied["attributes"]["outcome"], "applied", "{applied}");
    assert_eq!(applied["attributes"]["replica"], "engine-0", "{applied}");

    // Both binaries push their registries: our series and the process ones.
    for service in ["ic-index-server", "ic-kvevent-subscriber"] {
        let cpu = metric_point(&receiver, service, "process_cpu_seconds");
        assert_eq!(cpu["type"], "sum", "{cpu}");
        assert_eq!(cpu["monotonic"], true, "{cpu}");
        assert_eq!(cpu["temporality"], 2, "cumulative: {cpu}");
        let rss = metric_point(&receiver, service, "process_resident_memory_bytes");
        assert!(rss["value"].as_f64().unwrap() > 1e6, "{rss}");
        let build = metric_point(&receiver, service, "inferencecache_build_info");
        assert_eq!(build["attributes"]["binary"], service, "{build}");
    }
    let lookups = receiver.wait_for("a lookup latency histogram", WAIT, |r| {
        r["service"] == "ic-index-server"
            && r["type"] == "histogram"
            && r["name"]
                .as_str()
                .unwrap()
                .starts_with("inferencecache_index_lookup")
            && r["count"].as_u64() > Some(0)
    });
    let buckets: u64 = lookups["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap())
        .sum();
    assert_eq!(Some(buckets), lookups["count"].as_u64(), "{lookups}");
    receiver.wait_for("exported spans counted", WAIT, |r| {
        r["service"] == "ic-index-server"
            && r["name"] == "inferencecache_otlp_spans_exported"
            && r["value"].as_f64() > Some(0.0)
    });
    // Prometheus is still served next to the push.
    let (status, text) = http_get(server.admin_addr(), "/metrics");
    assert_eq!(status, 200);
    assert!(
        text.contains("inferencecache_otlp_exports_total{"),
        "{text}"
    );

    // SIGTERM flushes and exits cleanly.
    assert!(sidecar.stop().success());
    assert!(server.stop().success());
}

#[test]
fn an_icctl_command_is_one_trace_with_the_lookup_it_sends() {
    let receiver = Receiver::start();
    let mut server = start_exporting("ic-index-server", SERVER_ADDRS, &receiver);
    let grpc = server.addr("grpc").to_string();
    let out = std::process::Command::new(workspace_binary("icctl"))
        .args([
            "--index-grpc",
            &grpc,
            "--otlp-endpoint",
            &receiver.endpoint(),
        ])
        .args(["lookup", "--tenant", TENANT, "--model", MODEL])
        .args(["--block-hashes", "1,2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The command's span is the root; the server's span is its child.
    let root = receiver.wait_for("icctl's span", WAIT, |r| {
        r["service"] == "icctl" && r["name"] == "icctl"
    });
    assert_eq!(root["attributes"]["command"], "lookup", "{root}");
    assert_eq!(root["parent_span_id"], "", "{root}");
    let served = receiver.wait_for("the LookupRoute span icctl caused", WAIT, |r| {
        r["service"] == "ic-index-server"
            && r["name"] == "LookupRoute"
            && r["trace_id"] == root["trace_id"]
    });
    assert_eq!(served["parent_span_id"], root["span_id"], "{served}");
    assert_eq!(served["attributes"]["tenant"], TENANT, "{served}");
    assert!(server.stop().success());
}

#[test]
fn the_coordinator_pushes_its_metrics_over_otlp_like_the_reference() {
    let receiver = Receiver::start();
    let mut coordinator = start_exporting("ic-coordinator", COORDINATOR_ADDRS, &receiver);
    let addr = coordinator.admin_addr();
    // LMCache's coordinator serves no /metrics once it pushes.
    assert_eq!(http_get(addr, "/metrics").0, 404);
    let placements = metric_point(
        &receiver,
        "ic-coordinator",
        "lmcache_coordinator_key_directory_placements",
    );
    assert_eq!(placements["type"], "gauge", "{placements}");
    assert!(placements["attributes"]["tier"].is_string(), "{placements}");
    metric_point(&receiver, "ic-coordinator", "process_open_fds");
    assert!(coordinator.stop().success());

    // Without the flag it scrapes as before.
    let mut plain = start("ic-coordinator", COORDINATOR_ADDRS);
    assert_eq!(http_get(plain.admin_addr(), "/metrics").0, 200);
    assert!(plain.stop().success());
}

#[test]
fn a_collector_that_is_down_costs_counted_failures_not_the_service() {
    // Nothing listens on this port.
    let port = ic_e2e::free_port();
    let mut server = start(
        "ic-index-server",
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{port}"),
            "--otlp-export-interval-seconds",
            "1",
        ]
        .map(String::from),
    );
    let admin = server.admin_addr();
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let (status, text) = http_get(admin, "/metrics");
        assert_eq!(status, 200);
        if text.contains(r#"inferencecache_otlp_exports_total{signal="metrics",outcome="error"}"#) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no failed push counted: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(http_get(admin, "/ready").0, 200);
    // The flush at exit is bounded: a dead collector cannot hold it up.
    assert!(server.stop().success());
}
