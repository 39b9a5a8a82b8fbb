//! Replays an LMCache `.lct` event trace (recorded with `--trace-level
//! events`) into a running coordinator over its REST API, keeping the
//! recorded `t_mono` gaps divided by a speed factor.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use ic_coordinator_core::trace::{LifecyclePhase, Skipped, TraceEvent, TraceReader, due_after};
use serde::Serialize;
use serde_json::{Value, json};

/// `replay` subcommand flags.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplayArgs {
    /// The `.lct` file to replay.
    pub file: std::path::PathBuf,
    /// Base URL of the coordinator to feed.
    #[arg(long, default_value = "http://127.0.0.1:9300")]
    pub url: String,
    /// Speed factor: 1 keeps the recorded pace, 2 is twice as fast, 0 sends
    /// as fast as possible.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
}

/// What a replay did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// Frames read (header included).
    pub frames: u64,
    /// Batches the coordinator admitted.
    pub applied: u64,
    /// Batches it dropped as duplicates.
    pub duplicates: u64,
    /// Batches it dropped as stale.
    pub stale: u64,
    /// Membership calls made.
    pub lifecycle: u64,
    /// Requests the coordinator refused (logged, replay goes on).
    pub rejected: u64,
    /// Records with a qualname replay does not handle (skipped).
    pub unknown_qualnames: u64,
    /// Lifecycle records with a phase replay does not handle (skipped).
    pub unknown_phases: u64,
    /// `events.*` records whose args did not fit (logged and skipped).
    pub malformed: u64,
}

/// Replays `args.file` into `args.url`.
pub async fn replay(args: &ReplayArgs) -> anyhow::Result<ReplayReport> {
    let file = std::fs::File::open(&args.file)
        .with_context(|| format!("cannot open {}", args.file.display()))?;
    replay_from(
        std::io::BufReader::new(file),
        &args.url,
        args.speed,
        &args.file,
    )
    .await
}

async fn replay_from(
    reader: impl std::io::Read,
    url: &str,
    speed: f64,
    name: &Path,
) -> anyhow::Result<ReplayReport> {
    let reading = || format!("reading {}", name.display());
    let trace = TraceReader::open(reader).with_context(reading)?;
    let http = reqwest::Client::new();
    let base = url.trim_end_matches('/');
    let mut report = ReplayReport {
        frames: 1,
        ..ReplayReport::default()
    };
    let started = Instant::now();
    let mut first_t: Option<f64> = None;
    for event in trace {
        let event = event.with_context(reading)?;
        report.frames += 1;
        // Gaps are measured on the recorder's monotonic clock, from the
        // first record on.
        let t_mono = event.t_mono();
        let origin = *first_t.get_or_insert(t_mono);
        let due = due_after(t_mono - origin, speed);
        if let Some(wait) = due.checked_sub(started.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        match event {
            TraceEvent::Skipped { index, reason, .. } => match reason {
                Skipped::Qualname(qualname) => {
                    report.unknown_qualnames += 1;
                    tracing::debug!(frame = index, qualname = %qualname, "skipping a record replay does not handle");
                }
                Skipped::Phase(phase) => {
                    report.unknown_phases += 1;
                    tracing::debug!(frame = index, phase = %phase, "skipping an unknown lifecycle phase");
                }
                Skipped::Malformed { qualname, detail } => {
                    report.malformed += 1;
                    tracing::warn!(frame = index, qualname = %qualname, detail = %detail, "skipping a record whose args do not fit");
                }
            },
            TraceEvent::Batch { batch, .. } => {
                let resp = http
                    .post(format!("{base}/events"))
                    .json(&json!({ "batches": [batch] }))
                    .send()
                    .await
                    .context("POST /events")?;
                if resp.status().is_success() {
                    let counts: Value = resp.json().await.context("POST /events answer")?;
                    report.applied += counts["applied"].as_u64().unwrap_or(0);
                    report.duplicates += counts["duplicates"].as_u64().unwrap_or(0);
                    report.stale += counts["stale"].as_u64().unwrap_or(0);
                } else {
                    report.rejected += 1;
                    let status = resp.status().as_u16();
                    tracing::warn!(
                        status,
                        frame = report.frames - 1,
                        "coordinator refused a replayed batch"
                    );
                }
            }
            TraceEvent::Lifecycle {
                phase,
                instance_id,
                registration,
                ..
            } => {
                let req = match phase {
                    LifecyclePhase::Register => http
                        .post(format!("{base}/instances"))
                        .json(&registration.unwrap_or_else(|| json!({"instance_id": instance_id}))),
                    LifecyclePhase::Heartbeat => {
                        http.put(format!("{base}/instances/{instance_id}/heartbeat"))
                    }
                    LifecyclePhase::Deregister => {
                        http.delete(format!("{base}/instances/{instance_id}"))
                    }
                };
                let resp = req.send().await.context("membership call")?;
                report.lifecycle += 1;
                if !resp.status().is_success() {
                    report.rejected += 1;
                    let status = resp.status().as_u16();
                    tracing::warn!(status, instance_id = %instance_id, phase = phase.as_str(), "coordinator refused a replayed membership call");
                }
            }
        }
    }
    Ok(report)
}
