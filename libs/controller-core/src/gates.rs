//! The two readiness gates layered on top of workload health.
//!
//! * The KV-event gate: once a backend is up, Ready waits for the first KV
//!   event (`indexParticipation.lastEventAt`) and turns Degraded when none
//!   arrives within `spec.observation.firstEventTimeout`, measured from the
//!   `firstAvailableAt` anchor. The verdict is a startup check, not liveness:
//!   once `firstKVEventObservedAt` is latched it passes for good.
//! * The functional-probe gate: the server's `POST /probe` round trip,
//!   rate-limited per backend, with a sticky False on transport errors after a
//!   stage failure. The HTTP call is the service's; this module parses the
//!   response ([`parse_probe_response`]), holds the rate limit
//!   ([`ProbeRateLimiter`]) and turns outcomes into FunctionalProbeOK
//!   ([`functional_probe`]).

use std::collections::HashMap;
use std::time::Duration;

use ic_api::cachebackend::DEFAULT_FIRST_EVENT_TIMEOUT;
use ic_api::consts::{conditions, reasons};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde::Deserialize;

use crate::clock::{self, Timestamp};

/// How often one backend may be probed.
pub const PROBE_RATE_LIMIT: Duration = Duration::from_secs(30);

// === KV-event gate ===

/// Why a Go duration string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Nothing to parse.
    #[error("empty duration")]
    Empty,
    /// A number without a unit, an unknown unit, or stray characters.
    #[error("invalid duration {0:?}: expected e.g. 90s, 5m, 1h30m")]
    Invalid(String),
    /// Too large to represent.
    #[error("duration {0:?} is out of range")]
    OutOfRange(String),
}

/// Parses a Go duration (`300ms`, `1.5h`, `2h45m`; units ns, us, µs, ms, s,
/// m, h). Negative durations are rejected; `0` alone is accepted.
pub fn parse_go_duration(text: &str) -> Result<Duration, DurationError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let invalid = || DurationError::Invalid(text.to_owned());
    let mut rest = s;
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        if num_len == 0 {
            return Err(invalid());
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| invalid())?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(invalid()),
        };
        rest = &rest[unit_len..];
        total_nanos += value * scale;
    }
    if !total_nanos.is_finite() || total_nanos > u64::MAX as f64 {
        return Err(DurationError::OutOfRange(text.to_owned()));
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

/// The effective first-event window: the spec's value, or 5m when unset or
/// unreadable (admission enforces the format, so the fallback only covers
/// objects stored before the webhook).
pub fn first_event_timeout(spec: &ic_api::cachebackend::CacheBackendSpec) -> Duration {
    let fallback =
        parse_go_duration(DEFAULT_FIRST_EVENT_TIMEOUT).unwrap_or(Duration::from_secs(300));
    spec.observation
        .as_ref()
        .and_then(|o| parse_go_duration(&o.first_event_timeout).ok())
        .unwrap_or(fallback)
}

/// Whether the annotations opt the backend out of the KV-event gate
/// (`inferencecache.io/require-kv-events: "false"`, exactly).
pub fn kv_gate_opted_out(annotations: Option<&std::collections::BTreeMap<String, String>>) -> bool {
    annotations
        .and_then(|a| a.get(ic_api::consts::annotations::REQUIRE_KV_EVENTS))
        .is_some_and(|v| v.trim() == "false")
}

/// What the KV-event gate sees this reconcile.
#[derive(Debug, Clone, PartialEq)]
pub struct KvGateInput {
    /// The backend is up (managed workload Available; always for host-only
    /// and events-only).
    pub up: bool,
    /// `status.firstAvailableAt` after this reconcile's latch / re-anchor.
    pub anchor: Option<Timestamp>,
    /// `status.firstKVEventObservedAt` is set (after this reconcile's latch).
    pub ever_observed: bool,
    /// The previous status already said Degraded/NoKVEventsObserved and no
    /// re-anchor happened since: the verdict stays until an event arrives.
    pub sticky_timed_out: bool,
    /// The first-event window.
    pub timeout: Duration,
    /// Now.
    pub now: Timestamp,
}

/// The KV-event gate's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvGateVerdict {
    /// The backend is not up; the gate has nothing to say.
    NotUp,
    /// Up, no event yet, window still open until `deadline`.
    Awaiting {
        /// When the window closes (requeue then).
        deadline: Timestamp,
    },
    /// An event has been observed (ever).
    Observed,
    /// The window closed with no event.
    TimedOut,
}

/// Evaluates the KV-event gate.
pub fn kv_gate(input: &KvGateInput) -> KvGateVerdict {
    if input.ever_observed {
        return KvGateVerdict::Observed;
    }
    if input.sticky_timed_out {
        return KvGateVerdict::TimedOut;
    }
    if !input.up {
        return KvGateVerdict::NotUp;
    }
    let anchor = input.anchor.unwrap_or(input.now);
    let deadline = clock::add(anchor, input.timeout);
    if input.now >= deadline {
        KvGateVerdict::TimedOut
    } else {
        KvGateVerdict::Awaiting { deadline }
    }
}

// === functional probe: wire ===

/// Outcome of one probe stage, as the server reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StageOutcome {
    /// Round-tripped.
    Ok,
    /// Ran and failed.
    Failed,
    /// Did not run.
    Skipped,
}

/// One stage of a probe report.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct StageReport {
    /// `ingest`, `routing` or `t2`.
    pub stage: String,
    /// What happened.
    pub outcome: StageOutcome,
    /// The server's diagnostic.
    #[serde(default)]
    pub message: String,
}

/// The `POST /probe` response body (unknown fields ignored).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeReport {
    /// Echoed namespace.
    #[serde(default)]
    pub namespace: String,
    /// Echoed backend name.
    #[serde(default)]
    pub backend: String,
    /// No stage failed (informational; the stages decide).
    #[serde(default)]
    pub ok: bool,
    /// Stages in order: ingest, routing, t2.
    pub stages: Vec<StageReport>,
    /// Wall time on the server.
    #[serde(default)]
    pub duration_micros: u64,
}

/// What one probe call produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// A well-formed report.
    Report(ProbeReport),
    /// The server could not be reached, answered non-2xx, or answered
    /// something that is not a report. The text is for the condition message.
    TransportError(String),
}

/// Reads a `/probe` HTTP answer: 2xx with a report body is a
/// [`ProbeOutcome::Report`]; anything else is a transport error. The service
/// maps connection failures to [`ProbeOutcome::TransportError`] itself.
pub fn parse_probe_response(http_status: u16, body: &[u8]) -> ProbeOutcome {
    if !(200..300).contains(&http_status) {
        let text = String::from_utf8_lossy(body);
        let text = text.trim();
        let snippet: String = text.chars().take(200).collect();
        return ProbeOutcome::TransportError(if snippet.is_empty() {
            format!("/probe answered HTTP {http_status}")
        } else {
            format!("/probe answered HTTP {http_status}: {snippet}")
        });
    }
    match serde_json::from_slice::<ProbeReport>(body) {
        Ok(report) => ProbeOutcome::Report(report),
        Err(e) => {
            ProbeOutcome::TransportError(format!("/probe answered an unreadable report: {e}"))
        }
    }
}

// === functional probe: rate limit ===

/// Per-backend probe rate limit (in-process state the service keeps; pure,
/// time comes from the caller).
#[derive(Debug, Clone)]
pub struct ProbeRateLimiter {
    window: Duration,
    last: HashMap<String, Timestamp>,
}

impl Default for ProbeRateLimiter {
    fn default() -> Self {
        Self::new(PROBE_RATE_LIMIT)
    }
}

impl ProbeRateLimiter {
    /// A limiter allowing one probe per `window` per key.
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            last: HashMap::new(),
        }
    }

    /// When `key` may next be probed (`None`: now).
    pub fn next_allowed(&self, key: &str) -> Option<Timestamp> {
        self.last.get(key).map(|at| clock::add(*at, self.window))
    }

    /// Takes the slot for `key` if the window has passed: `Ok(())` means
    /// probe now; `Err(at)` means wait until `at`.
    pub fn try_acquire(&mut self, key: &str, now: Timestamp) -> Result<(), Timestamp> {
        match self.next_allowed(key) {
            Some(at) if now < at => Err(at),
            _ => {
                self.last.insert(key.to_owned(), now);
                Ok(())
            }
        }
    }

    /// Forgets `key` (backend deleted, or left the probed shape).
    pub fn forget(&mut self, key: &str) {
        self.last.remove(key);
    }
}

// === functional probe: verdict ===

/// What the reconciler knows about the probe this reconcile.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProbeInput {
    /// The controller was started with a non-empty `--server-probe-url`.
    pub enabled: bool,
    /// The call made this reconcile, if one was made.
    pub outcome: Option<ProbeOutcome>,
    /// When the rate limit next allows a probe of this backend (requeue
    /// hint); `None` when a probe is allowed now.
    pub next_allowed_at: Option<Timestamp>,
}

/// The FunctionalProbeOK verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeVerdict {
    /// `(status, reason, message)` for FunctionalProbeOK; `None` removes it.
    pub condition: Option<(&'static str, &'static str, String)>,
    /// Ready must be False with this reason and message.
    pub ready_downgrade: Option<(&'static str, String)>,
}

fn stage_failure_reason(stage: &str) -> Option<&'static str> {
    match stage {
        "ingest" => Some(reasons::PROBE_INGEST_FAILED),
        "routing" => Some(reasons::PROBE_ROUTING_FAILED),
        "t2" => Some(reasons::PROBE_T2_FAILED),
        _ => None,
    }
}

fn is_stage_failure(reason: &str) -> Option<&'static str> {
    [
        reasons::PROBE_INGEST_FAILED,
        reasons::PROBE_ROUTING_FAILED,
        reasons::PROBE_T2_FAILED,
    ]
    .into_iter()
    .find(|r| *r == reason)
}

/// Turns the probe input and the previous FunctionalProbeOK into this
/// reconcile's verdict. `bypassed` is the skip-functional-probe annotation.
pub fn functional_probe(
    input: &ProbeInput,
    bypassed: bool,
    previous: Option<&Condition>,
) -> ProbeVerdict {
    if !input.enabled {
        return ProbeVerdict {
            condition: None,
            ready_downgrade: None,
        };
    }
    if bypassed {
        return ProbeVerdict {
            condition: Some((
                "True",
                reasons::PROBE_BYPASSED,
                "functional probe skipped: inferencecache.io/skip-functional-probe is set"
                    .to_owned(),
            )),
            ready_downgrade: None,
        };
    }
    let prior_failure = previous
        .filter(|c| c.type_ == conditions::FUNCTIONAL_PROBE_OK && c.status == "False")
        .and_then(|c| is_stage_failure(&c.reason).map(|r| (r, c.message.clone())));
    let keep_prior = || match (previous, prior_failure.clone()) {
        (_, Some((reason, message))) => ProbeVerdict {
            condition: Some(("False", reason, message.clone())),
            ready_downgrade: Some((reason, message)),
        },
        (Some(prev), None) => ProbeVerdict {
            condition: Some((
                status_str(&prev.status),
                known_probe_reason(&prev.reason),
                prev.message.clone(),
            )),
            ready_downgrade: None,
        },
        (None, None) => ProbeVerdict {
            condition: None,
            ready_downgrade: None,
        },
    };
    match &input.outcome {
        None => keep_prior(),
        Some(ProbeOutcome::TransportError(text)) => {
            if prior_failure.is_some() {
                keep_prior()
            } else {
                ProbeVerdict {
                    condition: Some((
                        "Unknown",
                        reasons::PROBE_ERROR,
                        format!("could not run the functional probe: {text}"),
                    )),
                    ready_downgrade: None,
                }
            }
        }
        Some(ProbeOutcome::Report(report)) => {
            let failed = report
                .stages
                .iter()
                .find(|s| s.outcome == StageOutcome::Failed);
            match failed {
                None => ProbeVerdict {
                    condition: Some(("True", reasons::PROBE_OK, probe_ok_message(report))),
                    ready_downgrade: None,
                },
                Some(stage) => match stage_failure_reason(&stage.stage) {
                    Some(reason) => {
                        let message = if stage.message.is_empty() {
                            format!("probe stage {} failed", stage.stage)
                        } else {
                            stage.message.clone()
                        };
                        ProbeVerdict {
                            condition: Some(("False", reason, message.clone())),
                            ready_downgrade: Some((reason, message)),
                        }
                    }
                    // A stage this controller does not know: not a verdict it
                    // can name, so treat the report like an unreadable one.
                    None if prior_failure.is_some() => keep_prior(),
                    None => ProbeVerdict {
                        condition: Some((
                            "Unknown",
                            reasons::PROBE_ERROR,
                            format!(
                                "probe reported unknown stage {:?} failed: {}",
                                stage.stage, stage.message
                            ),
                        )),
                        ready_downgrade: None,
                    },
                },
            }
        }
    }
}

fn probe_ok_message(report: &ProbeReport) -> String {
    let parts: Vec<String> = report
        .stages
        .iter()
        .map(|s| {
            let o = match s.outcome {
                StageOutcome::Ok => "ok",
                StageOutcome::Failed => "failed",
                StageOutcome::Skipped => "skipped",
            };
            format!("{}={o}", s.stage)
        })
        .collect();
    format!("functional probe passed ({})", parts.join(", "))
}

fn status_str(s: &str) -> &'static str {
    match s {
        "True" => "True",
        "False" => "False",
        _ => "Unknown",
    }
}

fn known_probe_reason(r: &str) -> &'static str {
    [
        reasons::PROBE_OK,
        reasons::PROBE_BYPASSED,
        reasons::PROBE_INGEST_FAILED,
        reasons::PROBE_ROUTING_FAILED,
        reasons::PROBE_T2_FAILED,
    ]
    .into_iter()
    .find(|k| *k == r)
    .unwrap_or(reasons::PROBE_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_go_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_go_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        assert!(parse_go_duration("").is_err());
        assert!(parse_go_duration("5").is_err());
        assert!(parse_go_duration("5d").is_err());
        assert!(parse_go_duration("-5m").is_err());
        assert!(parse_go_duration("m").is_err());
    }

    #[test]
    fn probe_response_shape_matches_the_server() {
        let body = br#"{"namespace":"ns","backend":"b","ok":false,"stages":[
            {"stage":"ingest","outcome":"ok","message":"in index"},
            {"stage":"routing","outcome":"failed","message":"no hint"},
            {"stage":"t2","outcome":"skipped","message":"none"}],"durationMicros":12}"#;
        let ProbeOutcome::Report(r) = parse_probe_response(200, body) else {
            panic!("not a report");
        };
        assert_eq!(r.stages.len(), 3);
        assert_eq!(r.stages[1].outcome, StageOutcome::Failed);
        assert_eq!(r.duration_micros, 12);
        assert!(matches!(
            parse_probe_response(503, b"down"),
            ProbeOutcome::TransportError(m) if m.contains("503")
        ));
        assert!(matches!(
            parse_probe_response(200, b"not json"),
            ProbeOutcome::TransportError(_)
        ));
    }

    #[test]
    fn rate_limiter_window() {
        let mut l = ProbeRateLimiter::default();
        let t0 = Timestamp::UNIX_EPOCH;
        assert_eq!(l.try_acquire("ns/b", t0), Ok(()));
        let t10 = clock::add(t0, Duration::from_secs(10));
        assert_eq!(
            l.try_acquire("ns/b", t10),
            Err(clock::add(t0, PROBE_RATE_LIMIT))
        );
        assert_eq!(l.try_acquire("ns/other", t10), Ok(()));
        assert_eq!(
            l.try_acquire("ns/b", clock::add(t0, PROBE_RATE_LIMIT)),
            Ok(())
        );
    }
}
