//! What a record means to a coordinator being replayed into: an event
//! batch, a membership change, or a record skipped with its reason; and
//! when, at a given speed, it is due.

use serde_json::{Map, Value};

use super::format::{QUALNAME_BATCH, QUALNAME_LIFECYCLE, Record};
use crate::events::WireBatch;

/// Membership phases replay knows how to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LifecyclePhase {
    /// `POST /instances`.
    Register,
    /// `PUT /instances/{id}/heartbeat`.
    Heartbeat,
    /// `DELETE /instances/{id}`.
    Deregister,
}

impl LifecyclePhase {
    /// The `phase` string in a record.
    pub fn as_str(self) -> &'static str {
        match self {
            LifecyclePhase::Register => "register",
            LifecyclePhase::Heartbeat => "heartbeat",
            LifecyclePhase::Deregister => "deregister",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "register" => Some(LifecyclePhase::Register),
            "heartbeat" => Some(LifecyclePhase::Heartbeat),
            "deregister" => Some(LifecyclePhase::Deregister),
            _ => None,
        }
    }
}

/// Registration fields copied from a `register` record into the
/// `POST /instances` body, when present.
pub const REGISTRATION_FIELDS: [&str; 6] = [
    "instance_id",
    "ip",
    "http_port",
    "metadata",
    "p2p_advertised_url",
    "mq_port",
];

/// Why a record was not turned into an event.
#[derive(Clone, Debug, PartialEq)]
pub enum Skipped {
    /// A qualname replay does not handle.
    Qualname(String),
    /// A lifecycle phase replay does not handle.
    Phase(String),
    /// A known qualname whose args do not fit.
    Malformed {
        /// The record's qualname.
        qualname: String,
        /// What was wrong.
        detail: String,
    },
}

/// A record interpreted for replay.
#[derive(Clone, Debug, PartialEq)]
pub enum TraceEvent {
    /// An event batch as an MP server sent it.
    Batch {
        /// Seconds since recording started.
        t_mono: f64,
        /// The batch.
        batch: Box<WireBatch>,
    },
    /// A membership change.
    Lifecycle {
        /// Seconds since recording started.
        t_mono: f64,
        /// What happened.
        phase: LifecyclePhase,
        /// Instance concerned.
        instance_id: String,
        /// `POST /instances` body (`register` only).
        registration: Option<Value>,
    },
    /// A record left out, with the reason.
    Skipped {
        /// Seconds since recording started.
        t_mono: f64,
        /// Frame number (the header is frame 0).
        index: u64,
        /// Why.
        reason: Skipped,
    },
}

impl TraceEvent {
    /// Recording time of the event, seconds since recording started.
    pub fn t_mono(&self) -> f64 {
        match self {
            TraceEvent::Batch { t_mono, .. }
            | TraceEvent::Lifecycle { t_mono, .. }
            | TraceEvent::Skipped { t_mono, .. } => *t_mono,
        }
    }
}

impl Record {
    /// Interprets the record for replay; `index` is its frame number.
    pub fn into_event(self, index: u64) -> TraceEvent {
        let t_mono = self.t_mono;
        let skip = |reason| TraceEvent::Skipped {
            t_mono,
            index,
            reason,
        };
        let malformed = |qualname: &str, detail: String| {
            skip(Skipped::Malformed {
                qualname: qualname.to_owned(),
                detail,
            })
        };
        match self.qualname.as_str() {
            QUALNAME_BATCH => match serde_json::from_value::<WireBatch>(Value::Object(self.args)) {
                Ok(batch) => TraceEvent::Batch {
                    t_mono,
                    batch: Box::new(batch),
                },
                Err(e) => malformed(QUALNAME_BATCH, e.to_string()),
            },
            QUALNAME_LIFECYCLE => {
                let Some(phase) = self.args.get("phase").and_then(Value::as_str) else {
                    return malformed(QUALNAME_LIFECYCLE, "no phase".to_owned());
                };
                let Some(phase_known) = LifecyclePhase::parse(phase) else {
                    return skip(Skipped::Phase(phase.to_owned()));
                };
                let Some(instance_id) = self.args.get("instance_id").and_then(Value::as_str) else {
                    return malformed(QUALNAME_LIFECYCLE, "no instance_id".to_owned());
                };
                let registration = (phase_known == LifecyclePhase::Register).then(|| {
                    let body: Map<String, Value> = REGISTRATION_FIELDS
                        .iter()
                        .filter_map(|k| {
                            self.args
                                .get(*k)
                                .filter(|v| !v.is_null())
                                .map(|v| ((*k).to_owned(), v.clone()))
                        })
                        .collect();
                    Value::Object(body)
                });
                TraceEvent::Lifecycle {
                    t_mono,
                    phase: phase_known,
                    instance_id: instance_id.to_owned(),
                    registration,
                }
            }
            _ => skip(Skipped::Qualname(self.qualname)),
        }
    }
}

/// How long after the replay started a record made `offset` seconds after
/// the first one is due, at `speed` (0 or less = no pacing).
pub fn due_after(offset: f64, speed: f64) -> std::time::Duration {
    if speed <= 0.0 || offset <= 0.0 || !offset.is_finite() {
        return std::time::Duration::ZERO;
    }
    std::time::Duration::try_from_secs_f64(offset / speed).unwrap_or(std::time::Duration::ZERO)
}
