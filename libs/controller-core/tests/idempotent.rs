//! Property: a decision is a fixed point. Feeding the produced status back
//! as the previous status, with the same observations, yields the same
//! status, no Events and no cascade.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use ic_api::consts::annotations;
use ic_controller_core::clock::{self, Timestamp};
use ic_controller_core::gates::{ProbeInput, ProbeOutcome, ProbeReport, StageOutcome, StageReport};
use ic_controller_core::observe::{EnginePod, KernelCheck};
use ic_controller_core::status::{self, BackendShape, EngineObservation, Observed, WorkloadState};
use proptest::prelude::*;

fn arb_backend() -> impl Strategy<Value = ic_api::cachebackend::CacheBackend> {
    (
        0..6usize,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0..3usize,
    )
        .prop_map(|(kind, opt_out, fail_open, bypass, selector, timeout)| {
            let mut b = match kind {
                0 => managed(),
                1 => host_only(),
                2 => events_only(),
                3 => external("redis.ext:6379"),
                4 => external("bad endpoint"),
                _ => hicache(),
            };
            if opt_out {
                annotate(&mut b, annotations::REQUIRE_KV_EVENTS, "false");
            }
            if bypass {
                annotate(&mut b, annotations::SKIP_FUNCTIONAL_PROBE, "true");
            }
            if !fail_open {
                let mut i = b.spec.integration.clone().unwrap_or_default();
                i.fail_open = false;
                b.spec.integration = Some(i);
            }
            if !selector {
                b.spec.engine_selector = None;
            }
            if let Some(o) = b.spec.observation.as_mut() {
                o.first_event_timeout = ["0", "30s", "5m"][timeout].into();
            }
            b
        })
}

fn arb_workload() -> impl Strategy<Value = Option<WorkloadState>> {
    proptest::option::of(
        (0..3i32, 0..3i32, 0..3i32, any::<bool>(), 0..2i64).prop_map(
            |(spec, ready, updated, available, lag)| WorkloadState {
                spec_replicas: spec,
                ready_replicas: ready,
                updated_replicas: updated,
                available_replicas: ready,
                observed_generation: 2 - lag,
                generation: 2,
                available,
            },
        ),
    )
}

fn arb_pod() -> impl Strategy<Value = EnginePod> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0..5usize,
        any::<bool>(),
        0..3usize,
    )
        .prop_map(|(matches, ours, looping, check, strict, owner)| EnginePod {
            name: format!("e-{owner}-{check}"),
            matches_selector: matches,
            injected_by_this: ours,
            owner_deployment: Some(format!("engine-{owner}")),
            kernel_check: match check {
                0 => None,
                1 => Some(KernelCheck::Pending),
                2 => Some(KernelCheck::Healthy),
                3 => Some(KernelCheck::Failed("libcudart".into())),
                _ => Some(KernelCheck::Error("exit 1".into())),
            },
            admitted_kernel_mode: Some(if strict { "strict" } else { "report-only" }.into()),
            engine_crash_looping: looping,
            remote_client: match check {
                0 | 1 => None,
                2 => Some(Ok(())),
                _ => Some(Err("no module named mooncake".into())),
            },
        })
}

fn arb_probe() -> impl Strategy<Value = ProbeInput> {
    (any::<bool>(), 0..4usize, any::<bool>()).prop_map(|(enabled, kind, limited)| {
        let stage = |n: &str, o| StageReport {
            stage: n.into(),
            outcome: o,
            message: format!("{n} says so"),
        };
        ProbeInput {
            enabled,
            outcome: match kind {
                0 => None,
                1 => Some(ProbeOutcome::TransportError("refused".into())),
                2 => Some(ProbeOutcome::Report(ProbeReport {
                    namespace: NS.into(),
                    backend: NAME.into(),
                    ok: true,
                    stages: vec![
                        stage("ingest", StageOutcome::Ok),
                        stage("t2", StageOutcome::Skipped),
                    ],
                    duration_micros: 3,
                })),
                _ => Some(ProbeOutcome::Report(ProbeReport {
                    namespace: NS.into(),
                    backend: NAME.into(),
                    ok: false,
                    stages: vec![
                        stage("ingest", StageOutcome::Ok),
                        stage("routing", StageOutcome::Failed),
                    ],
                    duration_micros: 3,
                })),
            },
            next_allowed_at: limited.then(|| Timestamp::from_second(1_700_000_020).unwrap()),
        }
    })
}

fn arb_observed() -> impl Strategy<Value = Observed> {
    (
        arb_workload(),
        proptest::option::of(proptest::collection::vec(arb_pod(), 0..4)),
        proptest::option::of(0..3i32),
        arb_probe(),
        proptest::option::of(proptest::collection::vec(
            (0..3usize, 0..2i32, any::<bool>()),
            0..3,
        )),
        any::<bool>(),
        proptest::option::of(0..6usize),
        0..400u64,
    )
        .prop_map(
            |(workload, pods, expected, probe, server_pods, svc, prev_shape, secs)| Observed {
                now: clock::add(
                    Timestamp::from_second(1_700_000_000).unwrap(),
                    Duration::from_secs(secs),
                ),
                workload,
                service_endpoint: svc.then(|| "cb.ns.svc:65432".into()),
                server_pods: server_pods.map(|ps| {
                    server(
                        ps.into_iter()
                            .map(|(i, n, ready)| {
                                let mut p = server_pod(&format!("s-{i}"), &format!("u{i}"), n);
                                p.ready = ready;
                                p
                            })
                            .collect(),
                    )
                    .unwrap()
                }),
                engines: pods.map(|pods| EngineObservation {
                    pods,
                    expected_replicas: expected,
                }),
                probe,
                subscriber_image_configured: true,
                previous_shape: prev_shape.map(|i| {
                    [
                        BackendShape::Managed,
                        BackendShape::External,
                        BackendShape::HostOnly,
                        BackendShape::EventsOnly,
                        BackendShape::HiCache,
                        BackendShape::Unsupported,
                    ][i]
                }),
                cascade_not_before: None,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decision_is_a_fixed_point(
        backend in arb_backend(),
        history in arb_observed(),
        observed in arb_observed(),
        last_event in any::<bool>(),
        t2 in proptest::option::of(prop_oneof![Just("0"), Just("0.5"), Just("junk")]),
    ) {
        // A realistic previous status: one earlier reconcile.
        let mut b = backend;
        let mut history = history;
        history.now = clock::add(observed.now, Duration::from_secs(0)).checked_sub(Duration::from_secs(60)).unwrap();
        let first = status::decide(&b, &history);
        b.status = Some(first.status);
        let ip = b.status.as_mut().unwrap().index_participation.get_or_insert_with(Default::default);
        ip.last_event_at = last_event.then(|| clock::to_time(history.now));
        ip.t2_hit_rate = t2.map(str::to_owned);

        let mut observed = observed;
        observed.previous_shape = Some(first.shape);
        let once = status::decide(&b, &observed);
        let mut again_backend = b.clone();
        again_backend.status = Some(once.status.clone());
        observed.previous_shape = Some(once.shape);
        let twice = status::decide(&again_backend, &observed);

        prop_assert_eq!(&twice.status, &once.status);
        prop_assert!(!status::status_changed(Some(&once.status), &twice.status));
        prop_assert!(twice.events.is_empty(), "events on a fixed point: {:?}", twice.events);
        prop_assert_eq!(&twice.cascade, &None);
        prop_assert_eq!(twice.requeue_after, once.requeue_after);
        prop_assert_eq!(twice.probe_wanted, once.probe_wanted);
    }
}
