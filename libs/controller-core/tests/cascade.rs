//! Cascade restarts driven through the reconcile decision.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ic_api::consts::annotations;
use ic_controller_core::cascade::CascadeRateLimiter;
use ic_controller_core::observe::EnginePod;
use ic_controller_core::status::WorkloadState;

fn sim() -> Sim {
    let mut b = managed();
    annotate(&mut b, annotations::REQUIRE_KV_EVENTS, "false");
    let mut s = Sim::new(b);
    s.obs.workload = Some(workload_up(1));
    let mut other = engine("x-0");
    other.injected_by_this = false;
    other.owner_deployment = Some("someone-else".into());
    let mut second = engine("f-0");
    second.owner_deployment = Some("engine-b".into());
    s.obs.engines = engines(
        vec![
            engine("e-0"),
            engine("e-1"),
            second,
            other,
            EnginePod {
                owner_deployment: None,
                ..engine("bare")
            },
        ],
        None,
    );
    s
}

#[test]
fn empty_to_set_never_cascades() {
    let mut s = sim();
    s.obs.server_pods = server(vec![]);
    let d = s.step();
    assert_eq!(d.status.observed_server_instance, None);
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    let d = s.step();
    assert_eq!(d.status.observed_server_instance.as_deref(), Some("u0:0"));
    assert_eq!(d.cascade, None);
}

#[test]
fn pod_replacement_cascades_the_injected_engine_deployments() {
    let mut s = sim();
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    s.step();
    // Replaced (Recreate): a window with no Ready pod keeps the baseline.
    s.obs.server_pods = server(vec![]);
    s.obs.workload = Some(WorkloadState {
        available: false,
        available_replicas: 0,
        ready_replicas: 0,
        ..workload_up(1)
    });
    let d = s.step();
    assert_eq!(
        d.status.observed_server_instance.as_deref(),
        Some("u0:0"),
        "stale while unavailable"
    );
    assert_eq!(d.cascade, None);
    s.obs.server_pods = server(vec![server_pod("s-1", "u1", 0)]);
    s.obs.workload = Some(workload_up(1));
    let d = s.step();
    let plan = d.cascade.clone().unwrap();
    assert_eq!(
        plan.deployments,
        vec!["engine".to_owned(), "engine-b".to_owned()]
    );
    assert_eq!(plan.annotation, annotations::CACHE_SERVER_RESTART_TRIGGER);
    assert!(plan.trigger.contains("u1:0"));
    assert_eq!(d.status.observed_server_instance.as_deref(), Some("u1:0"));
    assert_eq!(s.step().cascade, None, "once");
}

#[test]
fn in_place_restart_of_an_own_container_cascades_but_a_sidecar_does_not() {
    let mut s = sim();
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    s.step();
    let mut p = server_pod("s-0", "u0", 0);
    p.container_restarts.push(("istio-proxy".into(), 4));
    s.obs.server_pods = server(vec![p.clone()]);
    assert_eq!(s.step().cascade, None);
    p.container_restarts[0].1 = 1;
    s.obs.server_pods = server(vec![p]);
    let d = s.step();
    assert!(d.cascade.is_some());
    assert_eq!(d.status.observed_server_instance.as_deref(), Some("u0:1"));
}

#[test]
fn rolling_update_midpoint_and_rollback_do_not_cascade() {
    let mut s = sim();
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    s.step();
    // Midpoint: new pod Ready next to the old one, Deployment not converged.
    s.obs.workload = Some(WorkloadState {
        generation: 2,
        observed_generation: 2,
        ready_replicas: 2,
        updated_replicas: 1,
        ..workload_up(1)
    });
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0), server_pod("s-1", "u1", 0)]);
    let d = s.step();
    assert_eq!(d.cascade, None);
    assert_eq!(
        d.status.observed_server_instance.as_deref(),
        Some("u0:0"),
        "midpoint not persisted"
    );
    // Rollback: the new pod is killed, the original remains.
    s.obs.workload = Some(workload_up(1));
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    let d = s.step();
    assert_eq!(d.cascade, None);
    assert_eq!(d.status.observed_server_instance.as_deref(), Some("u0:0"));
    // A completed rolling update (old pod gone) does cascade.
    s.obs.server_pods = server(vec![server_pod("s-1", "u1", 0)]);
    assert!(s.step().cascade.is_some());
}

#[test]
fn stale_ready_replicas_cannot_fake_convergence() {
    let mut s = sim();
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    s.step();
    // The Deployment status still says 1/1/1 while two pods are listed Ready.
    s.obs.workload = Some(workload_up(1));
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0), server_pod("s-1", "u1", 0)]);
    let d = s.step();
    assert_eq!(d.status.observed_server_instance.as_deref(), Some("u0:0"));
    assert_eq!(d.cascade, None);
}

#[test]
fn converged_scale_up_is_adopted_so_a_later_replacement_cascades() {
    let mut s = sim();
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    s.step();
    s.obs.workload = Some(workload_up(2));
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0), server_pod("s-1", "u1", 0)]);
    let d = s.step();
    assert_eq!(d.cascade, None);
    assert_eq!(
        d.status.observed_server_instance.as_deref(),
        Some("u0:0,u1:0")
    );
    // Replacing just an added pod is a replacement.
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0), server_pod("s-2", "u2", 0)]);
    let d = s.step();
    assert!(d.cascade.is_some(), "u1 was replaced");
}

#[test]
fn cascades_are_rate_limited_and_hold_the_baseline() {
    let mut s = sim();
    let key = format!("{NS}/{NAME}");
    let mut limiter = CascadeRateLimiter::default();
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    s.step();
    s.obs.server_pods = server(vec![server_pod("s-1", "u1", 0)]);
    let d = s.step();
    assert!(d.cascade.is_some());
    limiter.record(&key, s.now());
    s.advance(10);
    s.obs.cascade_not_before = limiter.not_before(&key);
    s.obs.server_pods = server(vec![server_pod("s-2", "u2", 0)]);
    let d = s.step();
    assert_eq!(d.cascade, None);
    assert_eq!(
        d.status.observed_server_instance.as_deref(),
        Some("u1:0"),
        "held, not skipped"
    );
    assert_eq!(d.requeue_after, std::time::Duration::from_secs(20));
    s.advance(20);
    let d = s.step();
    assert!(d.cascade.is_some());
    assert_eq!(d.status.observed_server_instance.as_deref(), Some("u2:0"));
}

#[test]
fn a_failed_engine_list_holds_the_cascade() {
    let mut s = sim();
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    s.step();
    s.obs.engines = None;
    s.obs.server_pods = server(vec![server_pod("s-1", "u1", 0)]);
    let d = s.step();
    assert_eq!(d.cascade, None);
    assert_eq!(d.status.observed_server_instance.as_deref(), Some("u0:0"));
}

#[test]
fn leaving_the_managed_path_clears_the_baseline() {
    let mut s = sim();
    s.obs.server_pods = server(vec![server_pod("s-0", "u0", 0)]);
    s.step();
    s.backend.spec.remote_storage = None;
    let d = s.step();
    assert_eq!(d.status.observed_server_instance, None);
    assert_eq!(d.cascade, None);
    // Back to managed with a different pod: a fresh baseline, no cascade.
    s.backend = {
        let mut b = managed();
        b.status = s.backend.status.clone();
        annotate(&mut b, annotations::REQUIRE_KV_EVENTS, "false");
        b
    };
    s.obs.server_pods = server(vec![server_pod("s-9", "u9", 0)]);
    let d = s.step();
    assert_eq!(d.cascade, None);
    assert_eq!(d.status.observed_server_instance.as_deref(), Some("u9:0"));
}
