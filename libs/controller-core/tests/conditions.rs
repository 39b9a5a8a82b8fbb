//! Per-mode, per-reason condition tables.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use ic_api::consts::{annotations, conditions as t, events as ev, reasons as r};
use ic_controller_core::gates::{ProbeInput, ProbeOutcome, ProbeReport, StageOutcome, StageReport};
use ic_controller_core::observe::KernelCheck;
use ic_controller_core::status::{BackendShape, CHURN_REQUEUE, STEADY_REQUEUE, WorkloadState};
use serde_json::json;

fn up_sim(b: ic_api::cachebackend::CacheBackend) -> Sim {
    let mut s = Sim::new(b);
    s.obs.workload = Some(workload_up(1));
    s.obs.engines = engines(vec![engine("e-0")], Some(1));
    s
}

// === managed: deployment-level reasons ===

#[test]
fn managed_deployment_reasons() {
    type Case = (
        &'static str,
        Option<WorkloadState>,
        i32,
        &'static str,
        (&'static str, &'static str),
        (&'static str, &'static str),
    );
    let cases: Vec<Case> = vec![
        (
            "missing",
            None,
            1,
            r::ROLLOUT_IN_PROGRESS,
            ("False", r::NOT_DEGRADED),
            ("True", r::ROLLOUT_IN_PROGRESS),
        ),
        (
            "scaled-to-zero",
            Some(WorkloadState {
                generation: 1,
                observed_generation: 1,
                ..Default::default()
            }),
            0,
            r::SCALED_TO_ZERO,
            ("False", r::NOT_DEGRADED),
            ("False", r::SCALED_TO_ZERO),
        ),
        (
            "old generation",
            Some(WorkloadState {
                observed_generation: 0,
                ..workload_up(1)
            }),
            1,
            r::ROLLOUT_IN_PROGRESS,
            ("False", r::NOT_DEGRADED),
            ("True", r::ROLLOUT_IN_PROGRESS),
        ),
        (
            "updating",
            Some(WorkloadState {
                updated_replicas: 1,
                ..workload_up(2)
            }),
            2,
            r::ROLLOUT_IN_PROGRESS,
            ("False", r::NOT_DEGRADED),
            ("True", r::ROLLOUT_IN_PROGRESS),
        ),
        (
            "unavailable",
            Some(WorkloadState {
                available: false,
                available_replicas: 0,
                ready_replicas: 0,
                ..workload_up(1)
            }),
            1,
            r::REPLICAS_UNAVAILABLE,
            ("True", r::REPLICAS_UNAVAILABLE),
            ("False", r::REPLICAS_UNAVAILABLE),
        ),
        (
            "up, gates off",
            Some(workload_up(1)),
            1,
            r::BACKEND_READY,
            ("False", r::NOT_DEGRADED),
            ("False", r::SYNCED),
        ),
    ];
    for (name, workload, replicas, ready, degraded, progressing) in cases {
        let mut b = managed();
        b.spec.replicas = replicas;
        annotate(&mut b, annotations::REQUIRE_KV_EVENTS, "false");
        let mut s = Sim::new(b);
        s.obs.workload = workload;
        let d = s.step();
        let want_ready = if ready == r::BACKEND_READY {
            "True"
        } else {
            "False"
        };
        assert!(
            is(&d, t::READY, want_ready, ready),
            "{name}: {:?}",
            sr(&d, t::READY)
        );
        assert!(
            is(&d, t::DEGRADED, degraded.0, degraded.1),
            "{name}: {:?}",
            sr(&d, t::DEGRADED)
        );
        assert!(
            is(&d, t::PROGRESSING, progressing.0, progressing.1),
            "{name}: {:?}",
            sr(&d, t::PROGRESSING)
        );
        assert_eq!(d.shape, BackendShape::Managed);
    }
}

#[test]
fn hpa_owned_replicas_are_the_desired_count() {
    let mut b = backend_from(json!({
        "runtime": "VLLM",
        "replicas": 1,
        "autoscaling": {"minReplicas": 1, "maxReplicas": 5},
        "remoteStorage": {"provider": "Redis", "ownership": "Managed"},
    }));
    annotate(&mut b, annotations::REQUIRE_KV_EVENTS, "false");
    let mut s = Sim::new(b);
    // HPA scaled the Deployment to 3, all rolled out: Ready even though spec.replicas is 1.
    s.obs.workload = Some(workload_up(3));
    assert!(is(&s.step(), t::READY, "True", r::BACKEND_READY));
    s.obs.workload = Some(WorkloadState {
        spec_replicas: 0,
        ..workload_up(0)
    });
    assert!(is(&s.step(), t::READY, "False", r::SCALED_TO_ZERO));
}

#[test]
fn managed_endpoint_comes_from_the_live_service() {
    let mut s = up_sim(managed());
    s.obs.service_endpoint = Some("cb-server.ns.svc:65432".into());
    assert_eq!(
        s.step().status.endpoint.as_deref(),
        Some("cb-server.ns.svc:65432")
    );
    s.obs.service_endpoint = None;
    assert_eq!(s.step().status.endpoint, None);
}

// === KV-event gate reasons ===

#[test]
fn kv_gate_reasons_per_gated_mode() {
    for (b, base) in [
        (managed(), r::BACKEND_READY),
        (host_only(), r::HOST_ONLY_ACTIVE),
        (events_only(), r::EVENTS_ONLY_ACTIVE),
    ] {
        let mut s = up_sim(b.clone());
        let d = s.step();
        assert!(
            is(&d, t::READY, "False", r::AWAITING_FIRST_KV_EVENT),
            "{base}"
        );
        assert!(
            is(&d, t::PROGRESSING, "True", r::AWAITING_FIRST_KV_EVENT),
            "{base}"
        );
        assert!(is(&d, t::DEGRADED, "False", r::NOT_DEGRADED), "{base}");
        s.advance(301);
        let d = s.step();
        assert!(
            is(&d, t::READY, "False", r::NO_KV_EVENTS_OBSERVED),
            "{base}"
        );
        assert!(
            is(&d, t::DEGRADED, "True", r::NO_KV_EVENTS_OBSERVED),
            "{base}"
        );
        assert!(
            is(&d, t::PROGRESSING, "False", r::NO_KV_EVENTS_OBSERVED),
            "{base}"
        );
        s.poller_last_event(true);
        let d = s.step();
        assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED), "{base}");
        assert!(is(&d, t::DEGRADED, "False", r::NOT_DEGRADED), "{base}");
        assert!(is(&d, t::PROGRESSING, "False", r::SYNCED), "{base}");

        // Opted out: the base reason.
        let mut opted = b;
        annotate(&mut opted, annotations::REQUIRE_KV_EVENTS, "false");
        let d = up_sim(opted).step();
        assert!(
            is(&d, t::READY, "True", base),
            "{base}: {:?}",
            sr(&d, t::READY)
        );
        assert!(
            d.events
                .iter()
                .all(|e| e.reason != ev::AWAITING_FIRST_KV_EVENT)
        );
    }
}

#[test]
fn an_event_present_on_the_first_reconcile_counts() {
    let mut s = up_sim(managed());
    s.poller_last_event(true);
    let d = s.step();
    assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));
    assert_eq!(reasons(&d), vec![ev::KV_EVENTS_OBSERVED.to_owned()]);
    assert!(d.status.first_kv_event_observed_at.is_some());
}

#[test]
fn require_kv_events_only_false_opts_out() {
    for (value, gated) in [
        ("false", false),
        ("true", true),
        ("False", true),
        ("0", true),
    ] {
        let mut b = managed();
        annotate(&mut b, annotations::REQUIRE_KV_EVENTS, value);
        let d = up_sim(b).step();
        assert_eq!(
            is(&d, t::READY, "False", r::AWAITING_FIRST_KV_EVENT),
            gated,
            "{value}"
        );
    }
}

// === functional probe ===

fn report(stages: &[(&str, StageOutcome, &str)]) -> ProbeOutcome {
    ProbeOutcome::Report(ProbeReport {
        namespace: NS.into(),
        backend: NAME.into(),
        ok: stages.iter().all(|s| s.1 != StageOutcome::Failed),
        stages: stages
            .iter()
            .map(|(n, o, m)| StageReport {
                stage: (*n).into(),
                outcome: *o,
                message: (*m).into(),
            })
            .collect(),
        duration_micros: 5,
    })
}

fn probed(
    outcome: Option<ProbeOutcome>,
    bypass: bool,
    enabled: bool,
) -> ic_controller_core::status::Decision {
    let mut b = managed();
    if bypass {
        annotate(&mut b, annotations::SKIP_FUNCTIONAL_PROBE, "true");
    }
    let mut s = up_sim(b);
    s.poller_last_event(true);
    s.obs.probe = ProbeInput {
        enabled,
        outcome,
        next_allowed_at: None,
    };
    s.step()
}

#[test]
fn functional_probe_reasons() {
    use StageOutcome::*;
    let ok = report(&[
        ("ingest", Ok, ""),
        ("routing", Ok, ""),
        ("t2", Skipped, "none"),
    ]);
    let d = probed(Some(ok), false, true);
    assert!(is(&d, t::FUNCTIONAL_PROBE_OK, "True", r::PROBE_OK));
    assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));

    for (stage, reason) in [
        ("ingest", r::PROBE_INGEST_FAILED),
        ("routing", r::PROBE_ROUTING_FAILED),
        ("t2", r::PROBE_T2_FAILED),
    ] {
        let stages: Vec<(&str, StageOutcome, &str)> = ["ingest", "routing", "t2"]
            .into_iter()
            .map(|n| {
                (
                    n,
                    if n == stage { Failed } else { Ok },
                    if n == stage { "broken here" } else { "" },
                )
            })
            .collect();
        let d = probed(Some(report(&stages)), false, true);
        assert!(is(&d, t::FUNCTIONAL_PROBE_OK, "False", reason), "{stage}");
        assert_eq!(
            cond(&d, t::FUNCTIONAL_PROBE_OK).unwrap().message,
            "broken here"
        );
        assert!(is(&d, t::READY, "False", reason), "{stage}");
        assert!(
            is(&d, t::DEGRADED, "False", r::NOT_DEGRADED),
            "probe never degrades"
        );
    }

    let d = probed(
        Some(ProbeOutcome::TransportError("connection refused".into())),
        false,
        true,
    );
    assert!(is(&d, t::FUNCTIONAL_PROBE_OK, "Unknown", r::PROBE_ERROR));
    assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));

    let d = probed(None, true, true);
    assert!(is(&d, t::FUNCTIONAL_PROBE_OK, "True", r::PROBE_BYPASSED));
    assert!(!d.probe_wanted);

    let d = probed(Some(report(&[("ingest", Failed, "x")])), false, false);
    assert_eq!(
        cond(&d, t::FUNCTIONAL_PROBE_OK),
        None,
        "no probe URL: no condition"
    );
    assert!(!d.probe_wanted);
}

#[test]
fn probe_is_wanted_only_when_upstream_is_ready() {
    let mut s = up_sim(managed());
    s.obs.probe.enabled = true;
    assert!(
        !s.step().probe_wanted,
        "awaiting the first KV event: no probe"
    );
    s.poller_last_event(true);
    assert!(s.step().probe_wanted);
}

// === engine-side advisories ===

#[test]
fn engine_kernels_healthy_reasons_and_strict_downgrade() {
    let pod = |check: KernelCheck, mode: &str| {
        let mut p = engine("e-0");
        p.kernel_check = Some(check);
        p.admitted_kernel_mode = Some(mode.into());
        p
    };
    let cases = [
        (
            vec![pod(KernelCheck::Healthy, "report-only")],
            Some(("True", r::KERNELS_HEALTHY)),
            r::KV_EVENTS_OBSERVED,
        ),
        (
            vec![pod(
                KernelCheck::Failed("libcudart.so.13".into()),
                "report-only",
            )],
            Some(("False", r::KERNEL_LOAD_FAILED)),
            r::KV_EVENTS_OBSERVED,
        ),
        (
            vec![pod(KernelCheck::Failed("libcudart.so.13".into()), "strict")],
            Some(("False", r::KERNEL_LOAD_FAILED)),
            r::ENGINE_KERNEL_DEGRADED,
        ),
        (
            vec![pod(KernelCheck::Pending, "strict")],
            Some(("Unknown", r::KERNEL_CHECK_PENDING)),
            r::KV_EVENTS_OBSERVED,
        ),
        (
            vec![
                pod(KernelCheck::Error("exit 1".into()), "strict"),
                pod(KernelCheck::Pending, "auto"),
            ],
            Some(("Unknown", r::KERNEL_CHECK_ERROR)),
            r::KV_EVENTS_OBSERVED,
        ),
        (vec![engine("e-0")], None, r::KV_EVENTS_OBSERVED),
    ];
    for (b, published) in [
        (managed(), true),
        (host_only(), true),
        (events_only(), false),
    ] {
        for (pods, want, ready) in &cases {
            let mut s = up_sim(b.clone());
            s.obs.engines = engines(pods.clone(), Some(1));
            s.poller_last_event(true);
            let d = s.step();
            let got = sr(&d, t::ENGINE_KERNELS_HEALTHY);
            if published {
                assert_eq!(got, want.map(|(a, b)| (a.into(), b.into())));
                let ready_status = if *ready == r::ENGINE_KERNEL_DEGRADED {
                    "False"
                } else {
                    "True"
                };
                assert!(
                    is(&d, t::READY, ready_status, ready),
                    "{:?}",
                    sr(&d, t::READY)
                );
            } else {
                assert_eq!(got, None);
                assert!(is(&d, t::READY, "True", r::KV_EVENTS_OBSERVED));
            }
        }
    }
}

#[test]
fn engine_compatibility_and_its_event() {
    let mut looping = engine("e-0");
    looping.engine_crash_looping = true;
    let mut foreign = engine("other");
    foreign.engine_crash_looping = true;
    foreign.injected_by_this = false;

    let mut s = up_sim(managed());
    s.obs.engines = engines(vec![foreign.clone()], Some(1));
    assert_eq!(cond(&s.step(), t::ENGINE_COMPATIBILITY), None, "not ours");
    s.obs.engines = engines(vec![looping.clone(), foreign], Some(1));
    let d = s.step();
    assert!(is(
        &d,
        t::ENGINE_COMPATIBILITY,
        "False",
        r::INJECTED_ENGINE_CRASH_LOOPING
    ));
    assert!(reasons(&d).contains(&ev::INJECTED_ENGINE_CRASH_LOOPING.to_owned()));
    assert!(s.step().events.is_empty(), "once per transition");
    // A failed pod list keeps the verdict and does not re-fire.
    s.obs.engines = None;
    let d = s.step();
    assert!(is(
        &d,
        t::ENGINE_COMPATIBILITY,
        "False",
        r::INJECTED_ENGINE_CRASH_LOOPING
    ));
    assert!(d.events.is_empty());
    s.obs.engines = engines(vec![engine("e-0")], Some(1));
    assert_eq!(cond(&s.step(), t::ENGINE_COMPATIBILITY), None);

    let mut e = up_sim(events_only());
    e.obs.engines = engines(vec![looping], Some(1));
    assert_eq!(
        cond(&e.step(), t::ENGINE_COMPATIBILITY),
        None,
        "events-only never publishes it"
    );
}

#[test]
fn t2_degraded_from_hit_rate() {
    for (rate, want) in [
        (None, None),
        (Some("0"), Some(("True", r::T2_ZERO_HIT_RATE))),
        (Some("0.000"), Some(("True", r::T2_ZERO_HIT_RATE))),
        (Some("0.42"), Some(("False", r::T2_SERVING))),
    ] {
        for (b, published) in [
            (managed(), true),
            (host_only(), true),
            (events_only(), false),
            (external("r:6379"), false),
        ] {
            let mut s = up_sim(b);
            s.poller_t2(rate);
            let d = s.step();
            let want = if published {
                want.map(|(a, b)| (a.to_owned(), b.to_owned()))
            } else {
                None
            };
            assert_eq!(sr(&d, t::T2_DEGRADED), want, "{rate:?}");
            if published {
                assert!(
                    is(&d, t::READY, "False", r::AWAITING_FIRST_KV_EVENT),
                    "T2 never gates Ready"
                );
            }
        }
    }
}

// === external, events-only, host-only, HiCache ===

#[test]
fn external_endpoint_reasons() {
    for (endpoint, ready, reason, mirrored) in [
        (
            "  redis.other:6379 ",
            "True",
            r::EXTERNAL_ENDPOINT_ACCEPTED,
            Some("redis.other:6379"),
        ),
        ("   ", "False", r::EXTERNAL_ENDPOINT_MISSING, None),
        (
            "redis://r:6379",
            "False",
            r::EXTERNAL_ENDPOINT_INVALID,
            None,
        ),
        ("r:99999", "False", r::EXTERNAL_ENDPOINT_INVALID, None),
    ] {
        let mut s = up_sim(external(endpoint));
        // Poller data and a long wait do not matter: the gate never applies.
        s.advance(3600);
        let d = s.step();
        assert!(
            is(&d, t::READY, ready, reason),
            "{endpoint:?}: {:?}",
            sr(&d, t::READY)
        );
        assert!(is(&d, t::PROGRESSING, "False", reason), "{endpoint:?}");
        assert_eq!(types(&d), vec![t::READY, t::PROGRESSING]);
        assert_eq!(d.status.endpoint.as_deref(), mirrored);
        assert_eq!(d.status.first_available_at, None);
        assert_eq!(d.shape, BackendShape::External);
        if reason == r::EXTERNAL_ENDPOINT_INVALID {
            assert!(
                cond(&d, t::READY)
                    .unwrap()
                    .message
                    .contains("spec.remoteStorage.endpoint")
            );
        }
    }
}

#[test]
fn events_only_publishes_exactly_three() {
    let mut s = up_sim(events_only());
    s.obs.probe.enabled = true;
    s.poller_t2(Some("0"));
    s.obs.service_endpoint = Some("stale:1".into());
    let d = s.step();
    assert_eq!(types(&d), vec![t::READY, t::DEGRADED, t::PROGRESSING]);
    assert_eq!(d.status.endpoint, None);
    assert!(
        d.status.first_available_at.is_some(),
        "latched on the first reconcile"
    );
    assert!(!d.probe_wanted);
}

#[test]
fn host_only_has_no_probe_and_no_endpoint() {
    let mut b = host_only();
    annotate(&mut b, annotations::REQUIRE_KV_EVENTS, "false");
    let mut s = up_sim(b);
    s.obs.probe.enabled = true;
    let d = s.step();
    assert!(is(&d, t::READY, "True", r::HOST_ONLY_ACTIVE));
    assert_eq!(cond(&d, t::FUNCTIONAL_PROBE_OK), None);
    assert_eq!(d.status.endpoint, None);
    assert_eq!(d.status.observed_server_instance, None);
}

#[test]
fn hicache_publishes_no_ready_contract() {
    let d = up_sim(hicache()).step();
    assert_eq!(d.shape, BackendShape::HiCache);
    assert!(d.status.conditions.is_empty());
    assert_eq!(
        d.status.matched_engine_pods,
        Some(1),
        "the selector count is still kept"
    );
}

#[test]
fn unsupported_pair() {
    let b = backend_from(
        json!({"runtime": "VLLM", "type": "SGLangHiCache", "hiCache": {"ratio": "2"}}),
    );
    let d = up_sim(b).step();
    assert!(is(&d, t::READY, "False", r::UNSUPPORTED_RUNTIME_CACHE_PAIR));
    assert_eq!(types(&d), vec![t::READY, t::PROGRESSING]);
}

// === status fields ===

#[test]
fn matched_engine_pods_nil_versus_zero() {
    // No selector / empty selector: nil, whatever the pods.
    for spec in [
        json!({"runtime": "VLLM"}),
        json!({"runtime": "VLLM", "engineSelector": {"matchLabels": {}}}),
    ] {
        let mut s = up_sim(backend_from(spec));
        s.obs.engines = engines(vec![engine("e-0")], None);
        let d = s.step();
        assert_eq!(d.status.matched_engine_pods, None);
        assert_eq!(d.status.engine_selector_message, None);
    }
    // Selector, no pods, no matching Deployment: 0 with the diagnosis.
    let mut s = up_sim(managed());
    s.obs.engines = engines(vec![], None);
    let d = s.step();
    assert_eq!(d.status.matched_engine_pods, Some(0));
    let msg = d.status.engine_selector_message.clone().unwrap();
    assert!(
        msg.contains("spec.engineSelector.matchLabels={app=vllm}"),
        "{msg}"
    );
    assert!(reasons(&d).contains(&ev::ENGINE_SELECTOR_UNMATCHED.to_owned()));
    assert!(
        !reasons(&s.step()).contains(&ev::ENGINE_SELECTOR_UNMATCHED.to_owned()),
        "steady zero is quiet"
    );
    // Deployment intentionally at zero: 0, no message.
    s.obs.engines = engines(vec![], Some(0));
    let d = s.step();
    assert_eq!(d.status.matched_engine_pods, Some(0));
    assert_eq!(d.status.engine_selector_message, None);
    // A failed list keeps the last values.
    s.obs.engines = engines(vec![engine("a"), engine("b")], Some(2));
    assert_eq!(s.step().status.matched_engine_pods, Some(2));
    s.obs.engines = None;
    let d = s.step();
    assert_eq!(d.status.matched_engine_pods, Some(2));
    assert_eq!(d.requeue_after, CHURN_REQUEUE);
    // Matched → zero re-emits.
    s.obs.engines = engines(vec![], Some(2));
    assert!(reasons(&s.step()).contains(&ev::ENGINE_SELECTOR_UNMATCHED.to_owned()));
    // Selector removed: cleared back to nil.
    s.backend.spec.engine_selector = None;
    let d = s.step();
    assert_eq!(d.status.matched_engine_pods, None);
    assert_eq!(d.status.engine_selector_message, None);
}

#[test]
fn upgrade_from_a_zero_count_without_message_emits_once() {
    let mut s = up_sim(managed());
    s.backend.status = Some(ic_api::cachebackend::CacheBackendStatus {
        matched_engine_pods: Some(0),
        ..Default::default()
    });
    s.obs.engines = engines(vec![], None);
    assert!(reasons(&s.step()).contains(&ev::ENGINE_SELECTOR_UNMATCHED.to_owned()));
    assert!(!reasons(&s.step()).contains(&ev::ENGINE_SELECTOR_UNMATCHED.to_owned()));
}

#[test]
fn cadence_steady_churn_and_gate_deadline() {
    let mut b = managed();
    annotate(&mut b, annotations::REQUIRE_KV_EVENTS, "false");
    let mut s = up_sim(b);
    assert_eq!(s.step().requeue_after, STEADY_REQUEUE);
    s.obs.engines = engines(vec![engine("a")], Some(3));
    assert_eq!(s.step().requeue_after, CHURN_REQUEUE);

    let mut g = up_sim(managed());
    g.step();
    g.advance(290);
    assert_eq!(
        g.step().requeue_after,
        std::time::Duration::from_secs(10),
        "requeue when the window closes"
    );
}

#[test]
fn fail_open_echo_and_events() {
    let mut s = up_sim(managed());
    let d = s.step();
    assert_eq!(d.status.fail_open, Some(true));
    assert!(!reasons(&d).contains(&ev::FAIL_OPEN_RESTORED.to_owned()));
    s.backend.spec.integration = Some(ic_api::cachebackend::IntegrationSpec {
        fail_open: false,
        ..Default::default()
    });
    let d = s.step();
    assert_eq!(d.status.fail_open, Some(false));
    let warning = d
        .events
        .iter()
        .find(|e| e.reason == ev::FAIL_CLOSED_ENABLED)
        .unwrap();
    assert_eq!(warning.type_.as_str(), "Warning");
    assert!(!reasons(&s.step()).contains(&ev::FAIL_CLOSED_ENABLED.to_owned()));
    s.backend.spec.integration = None;
    assert!(reasons(&s.step()).contains(&ev::FAIL_OPEN_RESTORED.to_owned()));

    // Created fail-closed: warned on the first reconcile.
    let mut c = managed();
    c.spec.integration = Some(ic_api::cachebackend::IntegrationSpec {
        fail_open: false,
        ..Default::default()
    });
    assert!(reasons(&up_sim(c).step()).contains(&ev::FAIL_CLOSED_ENABLED.to_owned()));
}

#[test]
fn observed_generation_is_echoed_everywhere() {
    let mut s = up_sim(managed());
    s.backend.metadata.generation = Some(7);
    let d = s.step();
    assert_eq!(d.status.observed_generation, Some(7));
    assert!(
        d.status
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(7))
    );
}
