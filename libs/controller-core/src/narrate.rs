//! The CacheBackend Events: derived from the difference between the previous
//! status and the one being written, so a steady-state reconcile (same
//! status) never records anything, and each transition is told once.

use ic_api::cachebackend::CacheBackendStatus;
use ic_api::consts::{conditions as types, events, reasons};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

use crate::conditions::find;
use crate::event::{EventToRecord, EventType};

/// Ready=False reasons a return to Ready=True counts as a recovery from.
const RECOVERABLE: [&str; 8] = [
    reasons::REPLICAS_UNAVAILABLE,
    reasons::PROVISIONING_FAILED,
    reasons::PROBE_INGEST_FAILED,
    reasons::PROBE_ROUTING_FAILED,
    reasons::PROBE_T2_FAILED,
    reasons::ENGINE_KERNEL_DEGRADED,
    reasons::EXTERNAL_ENDPOINT_MISSING,
    reasons::EXTERNAL_ENDPOINT_INVALID,
];

fn is(c: Option<&Condition>, status: &str, reason: &str) -> bool {
    c.is_some_and(|c| c.status == status && c.reason == reason)
}

fn event(type_: EventType, reason: &str, message: impl Into<String>) -> EventToRecord {
    EventToRecord {
        type_,
        reason: reason.to_owned(),
        message: message.into(),
    }
}

/// The Events for the transition `prev` → `new`. `kv_gate_on`: the KV-event
/// gate applies to this backend (its Events are suppressed otherwise).
pub fn events(
    prev: &CacheBackendStatus,
    new: &CacheBackendStatus,
    kv_gate_on: bool,
) -> Vec<EventToRecord> {
    let mut out = Vec::new();
    let old_c = |t: &str| find(&prev.conditions, t);
    let new_c = |t: &str| find(&new.conditions, t);

    // Fail-open / fail-closed.
    match (prev.fail_open, new.fail_open) {
        (before, Some(false)) if before != Some(false) => out.push(event(
            EventType::Warning,
            events::FAIL_CLOSED_ENABLED,
            "spec.integration.failOpen is false: engine pods no longer fall back to local prefill, the cache is now a serving dependency",
        )),
        (Some(false), Some(true)) => out.push(event(
            EventType::Normal,
            events::FAIL_OPEN_RESTORED,
            "spec.integration.failOpen is true again: engine pods fall back to local prefill when the cache is unreachable",
        )),
        _ => {}
    }

    // Degraded (workload flavour; the KV-gate flavour has its own Event).
    let degraded_now = new_c(types::DEGRADED);
    if is(degraded_now, "True", reasons::REPLICAS_UNAVAILABLE)
        && !is(
            old_c(types::DEGRADED),
            "True",
            reasons::REPLICAS_UNAVAILABLE,
        )
    {
        out.push(event(
            EventType::Warning,
            events::BACKEND_DEGRADED,
            degraded_now.map(|c| c.message.clone()).unwrap_or_default(),
        ));
    }

    // Provisioning refused: told once per distinct cause.
    let ready_new = new_c(types::READY);
    if let Some(c) = ready_new.filter(|c| c.reason == reasons::PROVISIONING_FAILED)
        && !old_c(types::READY)
            .is_some_and(|o| o.reason == reasons::PROVISIONING_FAILED && o.message == c.message)
    {
        out.push(event(
            EventType::Warning,
            events::PROVISIONING_FAILED,
            c.message.clone(),
        ));
    }

    // Recovery to Ready=True.
    let ready_old = old_c(types::READY);
    let ready_new = new_c(types::READY);
    if ready_new.is_some_and(|c| c.status == "True")
        && ready_old
            .is_some_and(|c| c.status == "False" && RECOVERABLE.contains(&c.reason.as_str()))
    {
        let from = ready_old.map(|c| c.reason.as_str()).unwrap_or_default();
        out.push(event(
            EventType::Normal,
            events::BACKEND_RECOVERED,
            format!("Ready again (was {from})"),
        ));
    }

    // KV-event gate.
    if kv_gate_on {
        let prog_new = new_c(types::PROGRESSING);
        if is(prog_new, "True", reasons::AWAITING_FIRST_KV_EVENT)
            && !is(
                old_c(types::PROGRESSING),
                "True",
                reasons::AWAITING_FIRST_KV_EVENT,
            )
        {
            out.push(event(
                EventType::Normal,
                events::AWAITING_FIRST_KV_EVENT,
                "backend is up; waiting for the first KV event from an engine pod",
            ));
        }
        if prev.first_kv_event_observed_at.is_none() && new.first_kv_event_observed_at.is_some() {
            out.push(event(
                EventType::Normal,
                events::KV_EVENTS_OBSERVED,
                "the first KV event for this backend was observed",
            ));
        }
        if is(degraded_now, "True", reasons::NO_KV_EVENTS_OBSERVED)
            && !is(
                old_c(types::DEGRADED),
                "True",
                reasons::NO_KV_EVENTS_OBSERVED,
            )
        {
            out.push(event(
                EventType::Warning,
                events::NO_KV_EVENTS_OBSERVED,
                degraded_now.map(|c| c.message.clone()).unwrap_or_default(),
            ));
        }
    }

    // Engine selector drift.
    if let Some(message) = &new.engine_selector_message
        && prev.engine_selector_message.as_ref() != Some(message)
    {
        out.push(event(
            EventType::Normal,
            events::ENGINE_SELECTOR_UNMATCHED,
            message.clone(),
        ));
    }

    // Injected engines crash-looping.
    let compat = new_c(types::ENGINE_COMPATIBILITY);
    if compat.is_some_and(|c| c.status == "False")
        && old_c(types::ENGINE_COMPATIBILITY).is_none_or(|c| c.status != "False")
    {
        out.push(event(
            EventType::Warning,
            events::INJECTED_ENGINE_CRASH_LOOPING,
            compat.map(|c| c.message.clone()).unwrap_or_default(),
        ));
    }

    out
}
