//! Shared test helpers: the real index server and coordinator on loopback,
//! seeding objects, and tower-test mock API scenarios that assert exact
//! requests.

#![allow(dead_code, clippy::unwrap_used)]

pub mod mock;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use ic_api::cachebackend::{CacheBackend, CacheBackendSpec, EngineSelector};
use ic_controller::metrics::Metrics;
use ic_controller::stores::{self, StoreWriters, Stores, replace_all};
use ic_controller_core::clock::ManualClock;
use ic_e2e::ServiceProcess;
use ic_fake_apiserver::FakeApi;
use ic_proto::index_v1 as pb;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The static token the index server's /probe accepts in tests.
pub const PROBE_TOKEN: &str = "test-probe-token";

/// A running index server: HTTP (snapshot/probe) and gRPC addresses.
pub struct IndexServer {
    pub process: ServiceProcess,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
}

impl IndexServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// With `extra` flags (access control, for instance).
    pub fn start_with(extra: &[&str]) -> Self {
        Self::start_at("127.0.0.1:0", extra)
    }

    /// With gRPC on `grpc_addr` (a port chosen ahead, for an index server
    /// that appears after its clients were configured) and `extra` flags.
    pub fn start_at(grpc_addr: &str, extra: &[&str]) -> Self {
        let mut args = vec![
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            grpc_addr,
            "--probe-static-token",
            PROBE_TOKEN,
            "--replica-gc-after-seconds",
            "0",
        ];
        args.extend_from_slice(extra);
        let mut process =
            ServiceProcess::start(&ic_e2e::workspace_binary("ic-index-server"), &args);
        let http = process.admin_addr();
        let grpc = process.addr("grpc");
        Self {
            process,
            http,
            grpc,
        }
    }

    pub fn snapshot_url(&self) -> String {
        format!("http://{}/snapshot", self.http)
    }

    pub fn probe_url(&self) -> String {
        format!("http://{}/probe", self.http)
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// Reports `blocks` stored blocks (and optional tier-2 counters) for
    /// replica `pod` of `tenant`, as a subscriber would.
    pub async fn ingest(&self, tenant: &str, pod: &str, blocks: u64, tier2: Option<(u64, u64)>) {
        ic_e2e::ingest::ingest(&self.grpc_url(), ingest_batch(tenant, pod, blocks, tier2)).await;
    }
}

/// A resync batch of `blocks` stored blocks (and optional tier-2 counters)
/// for replica `pod` of `tenant` in model `m`, as a subscriber sends it.
pub fn ingest_batch(
    tenant: &str,
    pod: &str,
    blocks: u64,
    tier2: Option<(u64, u64)>,
) -> pb::IngestBatch {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    let replica = ic_e2e::ingest::Replica {
        tenant,
        model: "m",
        replica_id: pod,
        address: "10.0.0.1:8000",
        dp_rank: 0,
    };
    let event = ic_e2e::ingest::stored((1..=blocks).collect(), 16, pb::Tier::T1);
    pb::IngestBatch {
        tier2_stats: tier2.map(|(hits, queries)| pb::Tier2Stats {
            has_counters: true,
            hits,
            queries,
        }),
        sent_at_unix_ms: now,
        ..ic_e2e::ingest::resync(&replica, vec![event])
    }
}

/// A running coordinator.
pub struct Coordinator {
    pub process: ServiceProcess,
    pub addr: SocketAddr,
}

impl Coordinator {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Self {
        let mut args = vec!["--host", "127.0.0.1", "--port", "0"];
        args.extend_from_slice(extra);
        let mut process = ServiceProcess::start(&ic_e2e::workspace_binary("ic-coordinator"), &args);
        let addr = process.admin_addr();
        Self { process, addr }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

pub fn metrics() -> (ic_telemetry::MetricsRegistry, Metrics) {
    let registry = ic_telemetry::MetricsRegistry::new("inferencecache", "test");
    let metrics = Metrics::register(&registry);
    (registry, metrics)
}

pub fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::at_second(1_800_000_000))
}

pub fn backend(ns: &str, name: &str, selector: &[(&str, &str)]) -> CacheBackend {
    let mut spec: CacheBackendSpec =
        serde_json::from_value(serde_json::json!({"runtime": "VLLM"})).unwrap();
    if !selector.is_empty() {
        spec.engine_selector = Some(EngineSelector {
            match_labels: selector
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        });
    }
    let mut b = CacheBackend::new(name, spec);
    b.metadata.namespace = Some(ns.into());
    b
}

pub fn pod(ns: &str, name: &str, labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

pub fn bin_exists(name: &str) -> bool {
    let exe = std::env::current_exe().unwrap();
    exe.parent()
        .and_then(Path::parent)
        .is_some_and(|d| d.join(name).exists())
}

/// Makes the hand-fed stores hold what the fake holds now (the watch-fed
/// stores of a running controller converge to the same; the binary-level
/// tests cover the watches themselves).
pub fn refill(w: &mut StoreWriters, fake: &FakeApi) {
    replace_all(&mut w.backends, fake.list("cachebackends"));
    replace_all(&mut w.pods, fake.list("pods"));
    replace_all(&mut w.deployments, fake.list("deployments"));
    replace_all(&mut w.statefulsets, fake.list("statefulsets"));
    replace_all(&mut w.services, fake.list("services"));
    replace_all(&mut w.hpas, fake.list("horizontalpodautoscalers"));
    replace_all(&mut w.policies, fake.list("cachepolicies"));
    replace_all(&mut w.tenants, fake.list("cachetenants"));
    replace_all(&mut w.indexes, fake.list("cacheindexes"));
}

/// Watch-fed stores on the fake, as a running controller has them.
pub struct Watched {
    pub stores: Stores,
    _tasks: tokio::task::JoinSet<()>,
    stop: tokio_util::sync::CancellationToken,
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Starts the stores on `fake` and waits for their first LIST.
pub async fn watched(fake: &FakeApi, metrics: &Metrics) -> Watched {
    let stop = tokio_util::sync::CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    let (stores, _feeds) = stores::start(&fake.client(), metrics, &mut tasks, &stop);
    stores.synced().await.unwrap();
    Watched {
        stores,
        _tasks: tasks,
        stop,
    }
}

fn versions<K: kube::Resource>(
    objects: impl IntoIterator<Item = K>,
) -> std::collections::BTreeSet<(String, String, String)> {
    objects
        .into_iter()
        .map(|o| {
            let m = o.meta();
            (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
                m.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn caught_up<K>(store: &kube::runtime::reflector::Store<K>, fake: &FakeApi, plural: &str) -> bool
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + 'static,
{
    let stored = versions(store.state().iter().map(|o| K::clone(o)));
    stored == versions(fake.list::<K>(plural))
}

impl Watched {
    /// Waits until the stores of the kinds the pushers and the poller read
    /// hold exactly what the fake holds.
    pub async fn settle(&self, fake: &FakeApi) {
        let s = &self.stores;
        for _ in 0..500 {
            if caught_up(&s.backends, fake, "cachebackends")
                && caught_up(&s.pods, fake, "pods")
                && caught_up(&s.policies, fake, "cachepolicies")
                && caught_up(&s.tenants, fake, "cachetenants")
                && caught_up(&s.indexes, fake, "cacheindexes")
                && caught_up(&s.objectives, fake, "inferenceobjectives")
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the watch-fed stores did not catch up with the fake API server in 5 s");
    }
}

/// Turns on OTLP export in this test process (nextest runs each test in a
/// process of its own), as `--otlp-endpoint` does in the binary.
pub fn export_to(receiver: &ic_e2e::otlp::Receiver) {
    let args = ic_telemetry::LogArgs {
        log_level: "warn".into(),
        log_format: ic_telemetry::LogFormat::Plain,
        listen_report: None,
        otlp: ic_telemetry::otel::OtlpArgs {
            otlp_endpoint: Some(receiver.endpoint()),
            ..ic_telemetry::otel::OtlpArgs::default()
        },
    };
    args.init("ic-controller").unwrap();
}
