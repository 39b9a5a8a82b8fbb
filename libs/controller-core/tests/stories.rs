//! Multi-step stories through the public API with a manual clock.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ic_api::consts::{annotations, conditions as t, events as ev, reasons as r};
use ic_controller_core::gates::{
    PROBE_RATE_LIMIT, ProbeOutcome, ProbeRateLimiter, ProbeReport, StageOutcome, StageReport,
};
use ic_controller_core::status::{self, BackendShape, WorkloadState};

fn managed_sim() -> Sim {
    let mut s = Sim::new(managed());
    s.obs.engines = engines(vec![engine("e-0")], Some(1));
    s
}

#[test]
fn rollout_then_first_event_then_ready() {
    let mut s = managed_sim();
    // First apply: no Deployment yet.
    let d = s.step();
    assert!(is(&d, t::READY, "False", r::ROLLOUT_IN_PROGRESS));
    assert!(d.events.is_empty(), "{:?}", d.events);
    assert_eq!(d.status.first_available_at, None);
    // Rolling.
    s.obs.workload = Some(WorkloadState {
        updated_replicas: 0,
        available: false,
        available_replicas: 0,
        ..workload_up(1)
    });
    s.advance(10);
    assert!(s.step().events.is_empty());
    // Available: the window opens.
    s.obs.workload = Some(workload_up(1));
    s.advance(10);
    let up_at = s.now();
    let d = s.step();
    assert!(is(&d, t::READY, "False", r::AWAITING_FIRST_KV_EVENT));
    assert_eq!(reasons(&d), vec![ev::AWAITING_FIRST_KV_EVENT]);
    assert_eq!(
        d.status.first_available_at.as_ref().unwrap().0.as_second(),
        up_at.as_second()
    );
    // Quiet while waiting.
    s.advance(30);
    assert!(s.step().events.is_empty());
    // First event.
    s.advance(30);
    s.poller_last_event(true);
    let d = s.step();
    assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));
    assert_eq!(reasons(&d), vec![ev::KV_EVENTS_OBSERVED]);
    // Steady.
    for _ in 0..3 {
        s.advance(30);
        let d = s.step();
        assert!(d.events.is_empty());
        assert!(!status::status_changed(
            s.backend.status.as_ref(),
            &d.status
        ));
    }
    // The poller drains lastEventAt: the latch keeps the backend Ready.
    s.poller_last_event(false);
    s.advance(600);
    assert!(is(&s.step(), t::READY, "True", r::KV_EVENTS_OBSERVED));
}

#[test]
fn timeout_degrades_then_an_event_recovers_with_each_event_once() {
    let mut s = managed_sim();
    s.obs.workload = Some(workload_up(1));
    assert_eq!(reasons(&s.step()), vec![ev::AWAITING_FIRST_KV_EVENT]);
    s.advance(299);
    assert!(is(&s.step(), t::READY, "False", r::AWAITING_FIRST_KV_EVENT));
    s.advance(1);
    let d = s.step();
    assert!(is(&d, t::DEGRADED, "True", r::NO_KV_EVENTS_OBSERVED));
    assert_eq!(reasons(&d), vec![ev::NO_KV_EVENTS_OBSERVED]);
    assert_eq!(d.events[0].type_.as_str(), "Warning");
    s.advance(30);
    assert!(s.step().events.is_empty(), "never twice");
    // Raising the timeout does not un-degrade: sticky until an event.
    s.backend
        .spec
        .observation
        .as_mut()
        .unwrap()
        .first_event_timeout = "1h".into();
    s.advance(30);
    let d = s.step();
    assert!(is(&d, t::DEGRADED, "True", r::NO_KV_EVENTS_OBSERVED));
    assert!(d.events.is_empty());
    s.poller_last_event(true);
    let d = s.step();
    assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));
    assert!(is(&d, t::DEGRADED, "False", r::NOT_DEGRADED));
    assert_eq!(
        reasons(&d),
        vec![ev::KV_EVENTS_OBSERVED],
        "BackendRecovered is suppressed here"
    );
    assert!(s.step().events.is_empty());
}

#[test]
fn an_availability_flap_after_the_timeout_does_not_reopen_the_window() {
    let mut s = managed_sim();
    s.obs.workload = Some(workload_up(1));
    s.step();
    s.advance(400);
    assert!(is(&s.step(), t::DEGRADED, "True", r::NO_KV_EVENTS_OBSERVED));
    s.obs.workload = Some(WorkloadState {
        available: false,
        available_replicas: 0,
        ..workload_up(1)
    });
    s.advance(10);
    let d = s.step();
    assert!(is(&d, t::DEGRADED, "True", r::REPLICAS_UNAVAILABLE));
    assert_eq!(reasons(&d), vec![ev::BACKEND_DEGRADED]);
    s.obs.workload = Some(workload_up(1));
    s.advance(10);
    let d = s.step();
    assert!(
        is(&d, t::DEGRADED, "True", r::NO_KV_EVENTS_OBSERVED),
        "anchor is stable across the flap"
    );
    assert!(!reasons(&d).contains(&ev::AWAITING_FIRST_KV_EVENT.to_owned()));
}

#[test]
fn replicas_unavailable_degrades_and_recovers_once() {
    let mut b = managed();
    annotate(&mut b, annotations::REQUIRE_KV_EVENTS, "false");
    let mut s = Sim::new(b);
    s.obs.workload = Some(workload_up(1));
    assert!(is(&s.step(), t::READY, "True", r::BACKEND_READY));
    s.obs.workload = Some(WorkloadState {
        available: false,
        available_replicas: 0,
        ready_replicas: 0,
        ..workload_up(1)
    });
    s.advance(5);
    assert_eq!(reasons(&s.step()), vec![ev::BACKEND_DEGRADED]);
    s.advance(5);
    assert!(s.step().events.is_empty());
    s.obs.workload = Some(workload_up(1));
    s.advance(5);
    let d = s.step();
    assert_eq!(reasons(&d), vec![ev::BACKEND_RECOVERED]);
    assert!(s.step().events.is_empty());
}

fn failed(stage: &str, message: &str) -> ProbeOutcome {
    ProbeOutcome::Report(ProbeReport {
        namespace: NS.into(),
        backend: NAME.into(),
        ok: false,
        stages: vec![StageReport {
            stage: stage.into(),
            outcome: StageOutcome::Failed,
            message: message.into(),
        }],
        duration_micros: 1,
    })
}

fn passed() -> ProbeOutcome {
    ProbeOutcome::Report(ProbeReport {
        namespace: NS.into(),
        backend: NAME.into(),
        ok: true,
        stages: vec![
            StageReport {
                stage: "ingest".into(),
                outcome: StageOutcome::Ok,
                message: String::new(),
            },
            StageReport {
                stage: "routing".into(),
                outcome: StageOutcome::Ok,
                message: String::new(),
            },
            StageReport {
                stage: "t2".into(),
                outcome: StageOutcome::Skipped,
                message: String::new(),
            },
        ],
        duration_micros: 1,
    })
}

/// One reconcile the way the service runs it: decide, probe if wanted and
/// allowed, decide again with the outcome.
fn reconcile(
    s: &mut Sim,
    limiter: &mut ProbeRateLimiter,
    call: &mut dyn FnMut() -> ProbeOutcome,
) -> (status::Decision, bool) {
    let key = format!("{NS}/{NAME}");
    s.obs.now = s.now();
    s.obs.probe.outcome = None;
    s.obs.probe.next_allowed_at = limiter.next_allowed(&key).filter(|at| *at > s.now());
    let first = status::decide(&s.backend, &s.obs);
    let mut called = false;
    if first.probe_wanted && limiter.try_acquire(&key, s.now()).is_ok() {
        s.obs.probe.outcome = Some(call());
        s.obs.probe.next_allowed_at = limiter.next_allowed(&key);
        called = true;
    }
    let d = s.step();
    s.obs.probe.outcome = None;
    (d, called)
}

#[test]
fn probe_failure_is_sticky_across_a_transport_error() {
    let mut s = managed_sim();
    s.obs.workload = Some(workload_up(1));
    s.obs.probe.enabled = true;
    s.poller_last_event(true);
    let mut limiter = ProbeRateLimiter::default();

    let (d, called) = reconcile(&mut s, &mut limiter, &mut || {
        failed("routing", "no hint for the synthetic prefix")
    });
    assert!(called);
    assert!(is(&d, t::READY, "False", r::PROBE_ROUTING_FAILED));
    assert!(is(
        &d,
        t::FUNCTIONAL_PROBE_OK,
        "False",
        r::PROBE_ROUTING_FAILED
    ));

    // Rate-limited reconcile: no call, the downgrade is re-applied, requeue at expiry.
    s.advance(10);
    let (d, called) = reconcile(&mut s, &mut limiter, &mut || panic!("rate limited"));
    assert!(!called);
    assert!(is(&d, t::READY, "False", r::PROBE_ROUTING_FAILED));
    assert_eq!(
        d.requeue_after,
        PROBE_RATE_LIMIT - std::time::Duration::from_secs(10)
    );

    // Server unreachable: the failure stays (not Unknown, not Ready).
    s.advance(20);
    let (d, called) = reconcile(&mut s, &mut limiter, &mut || {
        ProbeOutcome::TransportError("connection refused".into())
    });
    assert!(called);
    assert!(is(
        &d,
        t::FUNCTIONAL_PROBE_OK,
        "False",
        r::PROBE_ROUTING_FAILED
    ));
    assert_eq!(
        cond(&d, t::FUNCTIONAL_PROBE_OK).unwrap().message,
        "no hint for the synthetic prefix"
    );
    assert!(is(&d, t::READY, "False", r::PROBE_ROUTING_FAILED));
    assert!(d.events.is_empty());

    // A passing probe resolves it.
    s.advance(30);
    let (d, called) = reconcile(&mut s, &mut limiter, &mut passed);
    assert!(called);
    assert!(is(&d, t::FUNCTIONAL_PROBE_OK, "True", r::PROBE_OK));
    assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));
    assert_eq!(reasons(&d), vec![ev::BACKEND_RECOVERED]);

    // From True, a transport error is Unknown and leaves Ready alone.
    s.advance(30);
    let (d, _) = reconcile(&mut s, &mut limiter, &mut || {
        ProbeOutcome::TransportError("503".into())
    });
    assert!(is(&d, t::FUNCTIONAL_PROBE_OK, "Unknown", r::PROBE_ERROR));
    assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));
}

#[test]
fn disabling_the_probe_clears_a_stale_condition() {
    let mut s = managed_sim();
    s.obs.workload = Some(workload_up(1));
    s.obs.probe.enabled = true;
    s.poller_last_event(true);
    s.obs.probe.outcome = Some(failed("ingest", "lost"));
    assert!(is(&s.step(), t::READY, "False", r::PROBE_INGEST_FAILED));
    s.obs.probe.enabled = false;
    s.obs.probe.outcome = None;
    let d = s.step();
    assert_eq!(cond(&d, t::FUNCTIONAL_PROBE_OK), None);
    assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));
}

#[test]
fn managed_to_events_only_reanchors_and_clears_managed_conditions() {
    let mut s = managed_sim();
    s.obs.workload = Some(workload_up(1));
    s.obs.probe.enabled = true;
    s.poller_t2(Some("0"));
    s.obs.service_endpoint = Some("svc:1".into());
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    s.step();
    s.advance(400);
    let d = s.step();
    assert!(is(&d, t::DEGRADED, "True", r::NO_KV_EVENTS_OBSERVED));
    assert!(d.status.observed_server_instance.is_some());
    let old_anchor = d.status.first_available_at.clone().unwrap();

    s.backend.spec.remote_storage = None;
    s.backend.spec.integration = Some(ic_api::cachebackend::IntegrationSpec {
        mode: ic_api::cachebackend::IntegrationMode::EventsOnly,
        ..Default::default()
    });
    s.advance(5);
    let flip_at = s.now();
    let d = s.step();
    assert_eq!(d.shape, BackendShape::EventsOnly);
    assert!(
        is(&d, t::READY, "False", r::AWAITING_FIRST_KV_EVENT),
        "fresh window, sticky bypassed"
    );
    assert!(is(&d, t::DEGRADED, "False", r::NOT_DEGRADED));
    assert_eq!(types(&d), vec![t::READY, t::DEGRADED, t::PROGRESSING]);
    assert_ne!(d.status.first_available_at.as_ref().unwrap(), &old_anchor);
    assert_eq!(
        d.status.first_available_at.as_ref().unwrap().0.as_second(),
        flip_at.as_second()
    );
    assert_eq!(d.status.endpoint, None);
    assert_eq!(d.status.observed_server_instance, None);
    assert_eq!(reasons(&d), vec![ev::AWAITING_FIRST_KV_EVENT]);
    s.advance(299);
    assert!(is(&s.step(), t::READY, "False", r::AWAITING_FIRST_KV_EVENT));
    s.advance(1);
    assert!(is(&s.step(), t::DEGRADED, "True", r::NO_KV_EVENTS_OBSERVED));
}

#[test]
fn mode_flip_is_detected_from_status_after_a_controller_restart() {
    let mut s = managed_sim();
    s.obs.workload = Some(workload_up(1));
    s.obs.service_endpoint = Some("svc:1".into());
    s.step();
    s.advance(400);
    assert!(is(&s.step(), t::DEGRADED, "True", r::NO_KV_EVENTS_OBSERVED));
    s.backend.spec.remote_storage = None;
    s.backend.spec.integration = Some(ic_api::cachebackend::IntegrationSpec {
        mode: ic_api::cachebackend::IntegrationMode::EventsOnly,
        ..Default::default()
    });
    s.obs.previous_shape = None; // restarted: no in-process memory
    let d = s.step();
    assert!(is(&d, t::READY, "False", r::AWAITING_FIRST_KV_EVENT));
}

#[test]
fn external_is_exempt_and_unmanaged_transition_clears_the_anchor_only() {
    let mut s = managed_sim();
    s.obs.workload = Some(workload_up(1));
    s.step();
    s.poller_last_event(true);
    let d = s.step();
    assert!(d.status.first_available_at.is_some());
    let latch = d.status.first_kv_event_observed_at.clone();
    assert!(latch.is_some());

    s.backend.spec.remote_storage = Some(ic_api::cachebackend::RemoteStorageSpec {
        provider: ic_api::cachebackend::StorageProvider::Redis,
        ownership: ic_api::cachebackend::Ownership::External,
        endpoint: Some("redis.ext:6379".into()),
        redis: None,
        lm_cache_server: None,
        mooncake: None,
    });
    s.poller_last_event(false);
    let d = s.step();
    assert!(is(&d, t::READY, "True", r::EXTERNAL_ENDPOINT_ACCEPTED));
    assert_eq!(d.status.first_available_at, None);
    assert_eq!(
        d.status.first_kv_event_observed_at, latch,
        "the latch is never cleared"
    );
    assert!(d.events.is_empty(), "{:?}", d.events);

    // Back to managed: a fresh anchor, but the ever-observed latch keeps it Ready.
    s.backend.spec.remote_storage.as_mut().unwrap().ownership =
        ic_api::cachebackend::Ownership::Managed;
    s.backend.spec.remote_storage.as_mut().unwrap().endpoint = None;
    s.advance(60);
    let d = s.step();
    assert_eq!(
        d.status.first_available_at.as_ref().unwrap().0.as_second(),
        s.now().as_second()
    );
    assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));
}

#[test]
fn last_transition_time_moves_only_with_the_status() {
    let mut s = managed_sim();
    s.obs.workload = Some(workload_up(1));
    let d = s.step();
    let t0 = cond(&d, t::READY).unwrap().last_transition_time.clone();
    s.advance(400);
    let d = s.step();
    // Reason changed (Awaiting → NoKVEventsObserved), status did not.
    assert!(is(&d, t::READY, "False", r::NO_KV_EVENTS_OBSERVED));
    assert_eq!(cond(&d, t::READY).unwrap().last_transition_time, t0);
    let degraded_t = cond(&d, t::DEGRADED).unwrap().last_transition_time.clone();
    assert_ne!(degraded_t, t0, "Degraded flipped False → True");
    s.advance(30);
    s.poller_last_event(true);
    let d = s.step();
    let t1 = cond(&d, t::READY).unwrap().last_transition_time.clone();
    assert_eq!(t1.0.as_second(), s.now().as_second());
}

#[test]
fn status_changed_ignores_condition_order_and_the_poller_field() {
    let mut s = managed_sim();
    s.obs.workload = Some(workload_up(1));
    let d = s.step();
    let mut reordered = d.status.clone();
    reordered.conditions.reverse();
    reordered.index_participation = Some(Default::default());
    assert!(!status::status_changed(Some(&d.status), &reordered));
    let mut other = d.status.clone();
    other.conditions[0].message.push('!');
    assert!(status::status_changed(Some(&d.status), &other));
    assert!(status::status_changed(None, &d.status));
}

#[test]
fn observed_mode_reanchors_a_flip_the_status_alone_cannot_reveal() {
    // A host-only backend that is Ready on KV events leaves nothing in its
    // conditions that names its mode; only status.observedMode does.
    let run = |keep_observed_mode: bool| {
        let mut s = Sim::new(host_only());
        s.obs.engines = engines(vec![engine("e-0")], Some(1));
        s.step();
        s.poller_last_event(true);
        let d = s.step();
        assert_eq!(d.status.observed_mode.as_deref(), Some("HostOnly"));
        let anchor = d.status.first_available_at.clone();
        assert!(anchor.is_some());
        s.backend.spec.integration = Some(ic_api::cachebackend::IntegrationSpec {
            mode: ic_api::cachebackend::IntegrationMode::EventsOnly,
            ..Default::default()
        });
        s.obs.previous_shape = None; // restarted: no in-process memory
        if !keep_observed_mode && let Some(st) = s.backend.status.as_mut() {
            st.observed_mode = None;
        }
        s.advance(30);
        let d = s.step();
        assert_eq!(d.status.observed_mode.as_deref(), Some("EventsOnly"));
        (anchor, d.status.first_available_at)
    };
    let (before, after) = run(true);
    assert_ne!(before, after, "re-anchored at the flip");
    let (before, after) = run(false);
    assert_eq!(before, after, "without observedMode the flip goes unseen");
}

#[test]
fn every_shape_round_trips_through_its_status_name() {
    for shape in BackendShape::ALL {
        assert_eq!(BackendShape::parse(shape.as_str()), Some(shape));
    }
    assert_eq!(BackendShape::parse("managed"), None);
}

#[test]
fn a_refused_provisioning_says_why_keeps_what_serves_and_recovers() {
    let mut s = managed_sim();
    s.obs.workload = Some(workload_up(1));
    s.obs.service_endpoint = Some("cache-redis.ns.svc:6379".into());
    s.step();
    s.poller_last_event(true);
    s.advance(10);
    assert!(is(&s.step(), t::READY, "True", r::KV_EVENTS_OBSERVED));
    let before = s.backend.status.clone().unwrap();

    // A new generation whose Deployment a policy webhook refuses.
    s.backend.metadata.generation = Some(2);
    s.advance(10);
    let message = "Deployment cache-redis: admission webhook \"policy\" denied the request";
    let d = status::provisioning_failed(&s.backend, s.now(), message);
    assert!(is(&d, t::READY, "False", r::PROVISIONING_FAILED));
    assert!(is(&d, t::PROGRESSING, "False", r::PROVISIONING_FAILED));
    assert_eq!(cond(&d, t::READY).unwrap().message, message);
    assert_eq!(cond(&d, t::READY).unwrap().observed_generation, Some(2));
    assert_eq!(d.status.observed_generation, Some(2));
    // What the last good spec made keeps serving: endpoint, latches and
    // the other conditions stay as they were.
    assert_eq!(d.status.endpoint, before.endpoint);
    assert_eq!(
        d.status.first_kv_event_observed_at,
        before.first_kv_event_observed_at
    );
    assert_eq!(
        cond(&d, t::DEGRADED),
        before.conditions.iter().find(|c| c.type_ == t::DEGRADED)
    );
    assert_eq!(reasons(&d), vec![ev::PROVISIONING_FAILED]);
    s.backend.status = Some(d.status);

    // The same refusal again: nothing new to tell.
    s.advance(10);
    let again = status::provisioning_failed(&s.backend, s.now(), message);
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert!(!status::status_changed(
        s.backend.status.as_ref(),
        &again.status
    ));
    // Another cause is told.
    let other = status::provisioning_failed(&s.backend, s.now(), "quota exceeded");
    assert_eq!(reasons(&other), vec![ev::PROVISIONING_FAILED]);

    // Fixed: the next good reconcile is Ready again, told as a recovery.
    s.advance(10);
    let d = s.step();
    assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));
    assert_eq!(reasons(&d), vec![ev::BACKEND_RECOVERED]);
}
