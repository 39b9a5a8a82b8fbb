//! One measured phase as the flags say: the closed loop, or the open
//! loop on `--rate`'s schedule, and `--floor`'s TCP echo through the
//! chosen `--open-loop-client`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ic_loadgen::PhaseStats;
use tonic::transport::Channel;

use crate::open_loop::{self, OpenLoop, ScheduleStats};
use crate::{Args, OpenLoopClient, closed_loop, floor};

/// One phase, closed or open loop as the flags say.
pub(crate) async fn phase<F, Fut>(
    channels: &[Channel],
    args: &Args,
    call: F,
) -> anyhow::Result<(PhaseStats, u64, Option<ScheduleStats>)>
where
    F: Fn(Channel, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<bool, tonic::Status>> + Send + 'static,
{
    match args.rate {
        None => {
            let (stats, hits) = closed_loop::closed_phase(
                channels,
                args.concurrency,
                Duration::from_secs_f64(args.warmup_secs),
                Duration::from_secs_f64(args.duration_secs),
                call,
            )
            .await;
            Ok((stats, hits, None))
        }
        Some(rate) => {
            let (stats, hits, schedule) =
                open_loop::run(channels, &open_loop_settings(args, rate), call).await?;
            Ok((stats, hits, Some(schedule)))
        }
    }
}

pub(crate) fn open_loop_settings(args: &Args, rate: f64) -> OpenLoop {
    OpenLoop {
        rate,
        spacing: args.spacing,
        seed: args.seed,
        spin: Duration::from_micros(args.spin_us),
        concurrency: args.concurrency,
        warmup: Duration::from_secs_f64(args.warmup_secs),
        duration: Duration::from_secs_f64(args.duration_secs),
    }
}

/// `--floor`: the TCP echo on the open loop's schedule.
pub(crate) async fn floor_phase(
    args: &Args,
    rate: f64,
) -> anyhow::Result<(PhaseStats, ScheduleStats)> {
    let addr = floor::start_echo(args.server_cpus.clone()).context("starting the echo")?;
    let open = open_loop_settings(args, rate);
    let n = args.concurrency;
    let ping = |pool: Arc<floor::Pool>, _| async move { pool.ping().await.map(|()| true) };
    let (stats, _, schedule) = match args.open_loop_client {
        OpenLoopClient::Channel => {
            let pool = floor::Pool::connect(addr, n)
                .await
                .context("connecting to the echo")?;
            open_loop::run(&[pool], &open, ping).await?
        }
        OpenLoopClient::Direct => {
            let connect = move || async move {
                let pool = floor::Pool::connect(addr, n)
                    .await
                    .context("connecting to the echo")?;
                Ok(vec![pool])
            };
            open_loop::run_owned(&open, connect, ping).await?
        }
    };
    Ok((stats, schedule))
}
