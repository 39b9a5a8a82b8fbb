//! Load driver for the real `ic-webhook` binary over HTTPS on loopback.
//!
//! Starts a fake Kubernetes API (every pod admission lists CacheBackends
//! from it, live) and the webhook binary, then drives kept-alive HTTP/1.1
//! connections and reports client-side latency percentiles:
//!
//! * pod mutation paced at 200 requests/s (open loop: requests are sent on
//!   schedule whether or not earlier ones finished);
//! * pod mutation as fast as 8 connections go (closed loop);
//! * CacheBackend validation paced at 200/s and at the maximum.
//!
//! `cargo bench -p ic-webhook --bench admission_load` (set
//! `IC_BENCH_SECONDS` to change the length of each phase, default 10).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Client, FakeApi, Webhook, fixture};
use serde_json::Value;
use tokio_rustls::TlsConnector;

const CONNECTIONS: usize = 8;

#[derive(Debug)]
struct Report {
    name: String,
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Report {
    fn percentile(&self, p: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
        sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
    }

    fn print(&self) {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {} | {} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} |",
            self.name,
            self.latencies.len(),
            self.latencies.len() as f64 / self.elapsed.as_secs_f64(),
            ms(self.percentile(50.0)),
            ms(self.percentile(90.0)),
            ms(self.percentile(99.0)),
            ms(self.percentile(100.0)),
        );
    }
}

async fn send(client: &mut Client, path: &str, body: &[u8]) -> Duration {
    let started = Instant::now();
    let (status, answer) = client.request("POST", path, body.to_vec()).await;
    let elapsed = started.elapsed();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    elapsed
}

/// `rate` requests/s spread over the connections, for `seconds`.
async fn paced(
    name: &str,
    addr: std::net::SocketAddr,
    connector: &TlsConnector,
    path: &'static str,
    body: Arc<Vec<u8>>,
    rate: u32,
    seconds: u64,
) -> Report {
    let per_connection = Duration::from_secs_f64(CONNECTIONS as f64 / f64::from(rate));
    let count = u64::from(rate) * seconds / CONNECTIONS as u64;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..CONNECTIONS {
        let mut client = Client::connect(addr, connector).await;
        let body = body.clone();
        // Stagger the connections so the aggregate schedule is even.
        let offset = per_connection.mul_f64(i as f64 / CONNECTIONS as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(offset).await;
            let mut ticker = tokio::time::interval(per_connection);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut out = Vec::new();
            for _ in 0..count {
                ticker.tick().await;
                out.push(send(&mut client, path, &body).await);
            }
            out
        }));
    }
    collect(name, tasks, started).await
}

/// As fast as the connections go, for `seconds`.
async fn flat_out(
    name: &str,
    addr: std::net::SocketAddr,
    connector: &TlsConnector,
    path: &'static str,
    body: Arc<Vec<u8>>,
    seconds: u64,
) -> Report {
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut client = Client::connect(addr, connector).await;
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            while Instant::now() < until {
                out.push(send(&mut client, path, &body).await);
            }
            out
        }));
    }
    collect(name, tasks, started).await
}

async fn collect(
    name: &str,
    tasks: Vec<tokio::task::JoinHandle<Vec<Duration>>>,
    started: Instant,
) -> Report {
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    Report {
        name: name.to_owned(),
        latencies,
        elapsed: started.elapsed(),
    }
}

fn main() {
    // `cargo bench` passes `--bench`; test runners (`cargo test
    // --all-targets`, nextest's `--list`) run bench targets without it, and
    // this load run is not a test: list nothing, run nothing.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let seconds: u64 = std::env::var("IC_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // The fake API server gets its own thread, so it does not queue behind
    // the load driver's tasks.
    let api = FakeApi::default();
    let backends: Vec<Value> =
        serde_json::from_value(fixture("cachebackends-inference.json")).unwrap();
    api.set("inference", backends);
    let (tx, rx) = std::sync::mpsc::channel();
    let served = api.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            tx.send(served.serve().await).unwrap();
            std::future::pending::<()>().await;
        });
    });
    let api_addr = rx.recv().unwrap();
    runtime.block_on(async move {
        let binary = Path::new(env!("CARGO_BIN_EXE_ic-webhook"));
        let mut webhook = Webhook::start(binary, api_addr, &[]);
        let connector = webhook.connector();
        let pod = Arc::new(serde_json::to_vec(&fixture("pod-create-vllm.json")).unwrap());
        let backend =
            Arc::new(serde_json::to_vec(&fixture("cachebackend-update-preexisting.json")).unwrap());

        // Warm-up: connections, allocator, the API client's pool.
        let _ = flat_out(
            "warm-up",
            webhook.https,
            &connector,
            "/mutate-pod",
            pod.clone(),
            1,
        )
        .await;

        let https = webhook.https;
        let mut reports = Vec::new();
        let mut server = Vec::new();
        type Phase = (&'static str, &'static str, &'static str, Option<u32>);
        let phases: [Phase; 4] = [
            ("pod mutation @200/s", "/mutate-pod", "pod", Some(200)),
            ("pod mutation, max (8 conns)", "/mutate-pod", "pod", None),
            (
                "CacheBackend validation @200/s",
                "/validate-cachebackend",
                "cachebackend_validate",
                Some(200),
            ),
            (
                "CacheBackend validation, max (8 conns)",
                "/validate-cachebackend",
                "cachebackend_validate",
                None,
            ),
        ];
        for (name, path, kind, rate) in phases {
            let body = if kind == "pod" {
                pod.clone()
            } else {
                backend.clone()
            };
            let before = buckets(&webhook, kind);
            let list_before = list_buckets(&webhook);
            let report = match rate {
                Some(rate) => paced(name, https, &connector, path, body, rate, seconds).await,
                None => flat_out(name, https, &connector, path, body, seconds).await,
            };
            server.push((
                server_quantiles(&before, &buckets(&webhook, kind)),
                server_quantiles(&list_before, &list_buckets(&webhook)),
            ));
            reports.push(report);
        }
        println!("client-side latency (TLS, kept-alive HTTP/1.1):");
        println!("| phase | requests | req/s | p50 ms | p90 ms | p99 ms | max ms |");
        println!("|---|---|---|---|---|---|---|");
        for report in &reports {
            report.print();
        }
        println!("server-side (admission_duration_seconds, upper bound of the bucket):");
        println!("| phase | p50 <= ms | p99 <= ms | of which CacheBackend list p50 / p99 <= ms |");
        println!("|---|---|---|---|");
        for (report, ((p50, p99), (l50, l99))) in reports.iter().zip(server) {
            println!("| {} | {p50} | {p99} | {l50} / {l99} |", report.name);
        }
        println!("fake API lists served: {}", api.lists());
        let metrics = webhook.metrics();
        for line in metrics
            .lines()
            .filter(|l| l.starts_with("inferencecache_webhook_admissions_total"))
        {
            println!("{line}");
        }
        assert!(webhook.process.stop().success());
    });
    drop(runtime);
    in_process(&serde_json::to_vec(&fixture("pod-create-vllm.json")).unwrap());
}

/// Cumulative `(le, count)` of the server's latency histogram for `kind`.
fn buckets(webhook: &Webhook, kind: &str) -> Vec<(String, u64)> {
    let prefix = "inferencecache_webhook_admission_duration_seconds_bucket{le=\"";
    let suffix = format!("\",kind=\"{kind}\"}}");
    webhook
        .metrics()
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(prefix)?;
            let (le, count) = rest.split_once(&suffix)?;
            Some((le.to_owned(), count.trim().parse().ok()?))
        })
        .collect()
}

/// Cumulative `(le, count)` of the server's CacheBackend-list histogram.
fn list_buckets(webhook: &Webhook) -> Vec<(String, u64)> {
    let prefix = "inferencecache_webhook_backend_list_duration_seconds_bucket{le=\"";
    webhook
        .metrics()
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(prefix)?;
            let (le, count) = rest.split_once("\"}")?;
            Some((le.to_owned(), count.trim().parse().ok()?))
        })
        .collect()
}

/// The bucket bounds (ms) holding the p50 and p99 of what happened between
/// two snapshots.
fn server_quantiles(before: &[(String, u64)], after: &[(String, u64)]) -> (String, String) {
    let diff: Vec<(String, u64)> = after
        .iter()
        .map(|(le, n)| {
            let old = before.iter().find(|(l, _)| l == le).map_or(0, |(_, n)| *n);
            (le.clone(), n - old)
        })
        .collect();
    let total = diff.last().map_or(0, |(_, n)| *n);
    if total == 0 {
        return ("-".to_owned(), "-".to_owned());
    }
    let at = |q: f64| {
        diff.iter()
            .find(|(_, n)| *n as f64 >= q * total as f64)
            .map_or("?".to_owned(), |(le, _)| {
                le.parse::<f64>()
                    .map_or(le.clone(), |s| format!("{}", s * 1e3))
            })
    };
    (at(0.5), at(0.99))
}

/// A fixed in-memory backend list (no API server).
#[derive(Debug)]
struct Fixed(Vec<ic_api::CacheBackend>);

impl ic_webhook::pod::BackendSource for Fixed {
    fn list<'a>(&'a self, _namespace: &'a str) -> ic_webhook::pod::ListFuture<'a> {
        let items = self.0.clone();
        Box::pin(async move { Ok(items) })
    }
}

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let at = |q: f64| samples[((q * samples.len() as f64) as usize).min(samples.len() - 1)];
    println!(
        "| {name} | {:.1} | {:.1} |",
        at(0.5).as_secs_f64() * 1e6,
        at(0.99).as_secs_f64() * 1e6
    );
}

/// Where the pod path's time goes without any network: the adapters'
/// decision alone, and the whole handler (decode, decide, diff, encode).
fn in_process(body: &[u8]) {
    let request = ic_webhook::review::AdmissionReview::parse(body).unwrap();
    let backends: Vec<ic_api::CacheBackend> =
        serde_json::from_value(fixture("cachebackends-inference.json")).unwrap();
    let pod: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(request.object.clone().unwrap()).unwrap();
    let config = ic_adapters::admission::InjectionConfig {
        subscriber_image: Some(common::SUBSCRIBER_IMAGE.to_owned()),
        index_server: common::INDEX_SERVER.to_owned(),
        index_server_audience: Some(common::INDEX_SERVER_AUDIENCE.to_owned()),
        index_server_ca_pem: None,
        subscriber_otlp_endpoint: None,
        index_server_discovery: Default::default(),
        image_pull_secrets: Vec::new(),
        subscriber_kafka: None,
    };
    let source = Fixed(backends.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut admit = Vec::new();
    let mut handler = Vec::new();
    for _ in 0..2000 {
        let t = Instant::now();
        std::hint::black_box(ic_adapters::admission::admit_pod(&pod, &backends, &config));
        admit.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(runtime.block_on(ic_webhook::pod::mutate(&request, &source, &config)));
        handler.push(t.elapsed());
    }
    println!("in-process, no network (2000 iterations):");
    println!("| step | p50 µs | p99 µs |");
    println!("|---|---|---|");
    summary("admit_pod (adapters)", admit);
    summary("pod handler: decode + admit_pod + diff + encode", handler);
}
