//! Replays a `.lct` trace into a running coordinator over its REST API,
//! keeping the recorded gaps divided by a speed factor.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use ic_coordinator_core::trace::{Frame, LifecycleAction, TraceReader, due_after};
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
    let http = reqwest::Client::new();
    let base = url.trim_end_matches('/');
    let mut report = ReplayReport::default();
    let started = Instant::now();
    let mut first_ts: Option<f64> = None;
    for frame in TraceReader::new(reader) {
        let frame = frame.with_context(|| format!("reading {}", name.display()))?;
        report.frames += 1;
        if let Some(ts) = frame.ts() {
            let origin = *first_ts.get_or_insert(ts);
            let due = due_after(ts - origin, speed);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                tokio::time::sleep(wait).await;
            }
        }
        match frame {
            Frame::Header { .. } => {}
            Frame::Batch { batch, .. } => {
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
                        frame = report.frames,
                        "coordinator refused a replayed batch"
                    );
                }
            }
            Frame::Lifecycle {
                action,
                instance_id,
                instance,
                ..
            } => {
                let req = match action {
                    LifecycleAction::Register => http
                        .post(format!("{base}/instances"))
                        .json(&instance.unwrap_or_else(|| json!({"instance_id": instance_id}))),
                    LifecycleAction::Heartbeat => {
                        http.put(format!("{base}/instances/{instance_id}/heartbeat"))
                    }
                    LifecycleAction::Deregister => {
                        http.delete(format!("{base}/instances/{instance_id}"))
                    }
                };
                let resp = req.send().await.context("membership call")?;
                report.lifecycle += 1;
                if !resp.status().is_success() {
                    report.rejected += 1;
                    let status = resp.status().as_u16();
                    tracing::warn!(status, instance_id = %instance_id, "coordinator refused a replayed membership call");
                }
            }
        }
    }
    Ok(report)
}
