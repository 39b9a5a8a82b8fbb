//! Fixtures shared by the integration tests: backends of each shape, a
//! simulated reconcile loop over a manual clock, and condition look-ups.
#![allow(dead_code, clippy::unwrap_used)]

use std::time::Duration;

use ic_api::cachebackend::{CacheBackend, CacheBackendSpec, IndexParticipation};
use ic_controller_core::cascade::ServerPod;
use ic_controller_core::clock::{self, ClockExt, ManualClock, Timestamp};
use ic_controller_core::gates::ProbeInput;
use ic_controller_core::observe::EnginePod;
use ic_controller_core::status::{
    self, Decision, EngineObservation, Observed, ServerPods, WorkloadState,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::json;

pub const NS: &str = "ns";
pub const NAME: &str = "cb";
pub const UID: &str = "uid-1";

pub fn backend_from(spec: serde_json::Value) -> CacheBackend {
    let spec: CacheBackendSpec = serde_json::from_value(spec).unwrap();
    let mut b = CacheBackend::new(NAME, spec);
    b.metadata.namespace = Some(NS.into());
    b.metadata.uid = Some(UID.into());
    b.metadata.generation = Some(1);
    b
}

pub fn managed() -> CacheBackend {
    backend_from(json!({
        "runtime": "VLLM",
        "remoteStorage": {"provider": "LMCacheServer", "ownership": "Managed"},
        "engineSelector": {"matchLabels": {"app": "vllm"}},
        "observation": {"modelID": "m", "firstEventTimeout": "5m"},
    }))
}

pub fn host_only() -> CacheBackend {
    backend_from(json!({
        "runtime": "VLLM",
        "engineSelector": {"matchLabels": {"app": "vllm"}},
        "observation": {"modelID": "m", "firstEventTimeout": "5m"},
    }))
}

pub fn events_only() -> CacheBackend {
    backend_from(json!({
        "runtime": "VLLM",
        "integration": {"mode": "EventsOnly"},
        "engineSelector": {"matchLabels": {"app": "vllm"}},
        "observation": {"modelID": "m", "firstEventTimeout": "5m"},
    }))
}

pub fn external(endpoint: &str) -> CacheBackend {
    backend_from(json!({
        "runtime": "VLLM",
        "remoteStorage": {"provider": "Redis", "ownership": "External", "endpoint": endpoint},
        "engineSelector": {"matchLabels": {"app": "vllm"}},
    }))
}

pub fn hicache() -> CacheBackend {
    backend_from(json!({
        "runtime": "SGLang",
        "type": "SGLangHiCache",
        "hiCache": {"ratio": "2.0"},
        "engineSelector": {"matchLabels": {"app": "sglang"}},
    }))
}

pub fn annotate(b: &mut CacheBackend, key: &str, value: &str) {
    b.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(key.into(), value.into());
}

pub fn workload_up(replicas: i32) -> WorkloadState {
    WorkloadState {
        spec_replicas: replicas,
        ready_replicas: replicas,
        updated_replicas: replicas,
        available_replicas: replicas,
        observed_generation: 1,
        generation: 1,
        available: true,
    }
}

pub fn engine(name: &str) -> EnginePod {
    EnginePod {
        name: name.into(),
        matches_selector: true,
        injected_by_this: true,
        owner_deployment: Some("engine".into()),
        ..EnginePod::default()
    }
}

pub fn engines(pods: Vec<EnginePod>, expected: Option<i32>) -> Option<EngineObservation> {
    Some(EngineObservation {
        pods,
        expected_replicas: expected,
    })
}

pub fn server_pod(name: &str, uid: &str, restarts: i32) -> ServerPod {
    ServerPod {
        name: name.into(),
        uid: uid.into(),
        ready: true,
        container_restarts: vec![("server".into(), restarts)],
    }
}

pub fn server(pods: Vec<ServerPod>) -> Option<ServerPods> {
    Some(ServerPods {
        pods,
        own_containers: vec!["server".into()],
    })
}

pub fn cond<'a>(d: &'a Decision, t: &str) -> Option<&'a Condition> {
    d.status.conditions.iter().find(|c| c.type_ == t)
}

/// `(status, reason)` of condition `t`, or `None` when absent.
pub fn sr(d: &Decision, t: &str) -> Option<(String, String)> {
    cond(d, t).map(|c| (c.status.clone(), c.reason.clone()))
}

pub fn is(d: &Decision, t: &str, status: &str, reason: &str) -> bool {
    sr(d, t) == Some((status.into(), reason.into()))
}

pub fn reasons(d: &Decision) -> Vec<String> {
    d.events.iter().map(|e| e.reason.clone()).collect()
}

pub fn types(d: &Decision) -> Vec<String> {
    d.status
        .conditions
        .iter()
        .map(|c| c.type_.clone())
        .collect()
}

/// One reconcile of `b` with `obs` (its `now` overwritten by the clock).
pub fn once(b: &CacheBackend, obs: &Observed, clock: &ManualClock) -> Decision {
    let mut obs = obs.clone();
    obs.now = clock.now();
    status::decide(b, &obs)
}

/// A reconcile loop: each step decides, writes the status back the way the
/// service would, and remembers the shape.
pub struct Sim {
    pub backend: CacheBackend,
    pub clock: ManualClock,
    pub obs: Observed,
}

impl Sim {
    pub fn new(backend: CacheBackend) -> Self {
        Self {
            backend,
            clock: ManualClock::at_second(1_700_000_000),
            obs: Observed {
                probe: ProbeInput::default(),
                subscriber_image_configured: true,
                ..Observed::default()
            },
        }
    }

    pub fn step(&mut self) -> Decision {
        self.obs.now = self.clock.now();
        let d = status::decide(&self.backend, &self.obs);
        let mut st = d.status.clone();
        // The poller's field is not ours: keep whatever the poller wrote.
        st.index_participation = self
            .backend
            .status
            .as_ref()
            .and_then(|s| s.index_participation.clone());
        self.backend.status = Some(st);
        self.obs.previous_shape = Some(d.shape);
        d
    }

    pub fn advance(&mut self, secs: u64) {
        self.clock.advance(Duration::from_secs(secs));
    }

    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The poller reports a KV event at now (or clears it).
    pub fn poller_last_event(&mut self, present: bool) {
        let now = self.now();
        let st = self.backend.status.get_or_insert_with(Default::default);
        let ip = st
            .index_participation
            .get_or_insert_with(IndexParticipation::default);
        ip.last_event_at = present.then(|| clock::to_time(now));
    }

    pub fn poller_t2(&mut self, rate: Option<&str>) {
        let st = self.backend.status.get_or_insert_with(Default::default);
        let ip = st
            .index_participation
            .get_or_insert_with(IndexParticipation::default);
        ip.t2_hit_rate = rate.map(str::to_owned);
    }
}
