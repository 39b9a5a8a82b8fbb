//! Thin entry point: flags, then the library does the work.

use std::process::ExitCode;

use clap::Parser;

// mimalloc below 1 MiB, the system allocator from there (libs/alloc): the
// request paths allocate per key, where mimalloc's fast paths cost a
// fraction of glibc's, and glibc moves a huge block's pages on `realloc`
// where mimalloc copies it (the record slab's doublings; docs/coordinator.md).
#[global_allocator]
static ALLOCATOR: ic_alloc::SplitAlloc = ic_alloc::SplitAlloc;

/// ic-coordinator: the LMCache-compatible fleet coordinator.
// `infer_long_args`: an unambiguous prefix of a flag is that flag, as
// Python's argparse takes it (`lmcache coordinator --chunk 16`).
#[derive(Debug, Parser)]
#[command(name = ic_coordinator::BINARY, version, infer_long_args = true)]
struct Args {
    #[command(flatten)]
    log: ic_telemetry::LogArgs,
    #[command(flatten)]
    config: ic_coordinator::Config,
    #[command(subcommand)]
    command: Option<Command>,
    /// Threads of the async runtime that serves HTTP (0: one per core,
    /// tokio's default). Event batches apply on a thread of their own
    /// either way. With two, a lone request also wakes the idle worker (2
    /// context switches a lookup against 1, measured): where the clients
    /// share the cores, 1 answers one request at a time sooner and 8 at a
    /// time slower (docs/coordinator.md).
    /// At most 1024: each is an OS thread with its own stack, and more
    /// than a few per core only adds switching.
    #[arg(
        long,
        env = "IC_WORKER_THREADS",
        default_value_t = 0,
        global = true,
        value_parser = clap::value_parser!(u16).range(0..=MAX_WORKER_THREADS)
    )]
    worker_threads: u16,
    /// Milliseconds a page mimalloc freed stays mapped before it goes back
    /// to the OS (`madvise`, from inside whatever allocation or free comes
    /// next: on a server, a request's). Unset: -1, freed pages are kept
    /// and resident memory stays at the peak of the small-block memory,
    /// unless mimalloc's own `MIMALLOC_PURGE_DELAY` is set; 0 returns them
    /// at once, N after N ms (mimalloc's default 1000). At most 3600000.
    /// `lmcache_coordinator_allocator_purge_delay_ms` shows the delay in
    /// effect (docs/coordinator.md).
    #[arg(
        long,
        env = "IC_ALLOCATOR_PURGE_DELAY_MS",
        global = true,
        allow_negative_numbers = true,
        value_parser = clap::value_parser!(i32).range(-1..=MAX_PURGE_DELAY_MS)
    )]
    allocator_purge_delay_ms: Option<i32>,
}

/// Upper bound of `--worker-threads`.
const MAX_WORKER_THREADS: i64 = 1024;

/// Upper bound of `--allocator-purge-delay-ms`: an hour (longer is as good
/// as -1).
const MAX_PURGE_DELAY_MS: i64 = 3_600_000;

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run the coordinator, as `lmcache coordinator ...` does (the same
    /// flags; the bare form without a subcommand is the same thing).
    #[command(infer_long_args = true)]
    Coordinator(Box<CoordinatorArgs>),
    /// Replay a recorded `.lct` event trace into a running coordinator.
    Replay(ic_coordinator_client::replay::ReplayArgs),
}

#[derive(Debug, clap::Args)]
struct CoordinatorArgs {
    #[command(flatten)]
    config: ic_coordinator::Config,
}

/// The long flags of LMCache 0.5.6's `lmcache coordinator` (its argparse
/// parser, `--help` included).
const REFERENCE_FLAGS: &[&str] = &[
    "help",
    "host",
    "port",
    "instance-timeout",
    "health-check-interval",
    "eviction-check-interval",
    "eviction-ratio",
    "trigger-watermark",
    "chunk-size",
    "hash-algorithm",
    "enable-blend-lookup",
    "blend-probe-stride",
    "checkpoint-path",
    "checkpoint-interval",
    "extra-config",
    "metadata-path",
    "timeout-keep-alive",
    "disable-metrics",
    "otlp-endpoint",
    "event-transport",
    "kafka-bootstrap-servers",
    "kafka-topic",
    "kafka-group-id",
    "format",
    "output",
    "quiet",
];

/// Our long flags (the coordinator's and the global ones, each once), from
/// clap: all of them, and those that take a value.
fn our_flags() -> (Vec<String>, Vec<String>) {
    let cmd = <Args as clap::CommandFactory>::command();
    let sub = cmd.find_subcommand("coordinator").cloned();
    let mut all = std::collections::BTreeSet::new();
    let mut valued = std::collections::BTreeSet::new();
    for a in cmd
        .get_arguments()
        .chain(sub.iter().flat_map(|s| s.get_arguments()))
    {
        if let Some(long) = a.get_long() {
            all.insert(long.to_owned());
            if a.get_action().takes_values() {
                valued.insert(long.to_owned());
            }
        }
    }
    (all.into_iter().collect(), valued.into_iter().collect())
}

/// An abbreviation argparse reads as one of the reference's flags (the one
/// flag of the reference it begins) but that begins more than one of ours
/// (a house flag shares the prefix: `--eve` is also `--events-require-auth`)
/// is written out as the reference's flag, so it means here what it means
/// there; any other argument is left to clap, which takes a prefix that
/// names one flag of ours. Not for `replay` (no reference command).
fn expand_reference_abbreviations(
    args: Vec<std::ffi::OsString>,
    ours: &[String],
    valued: &[String],
) -> Vec<std::ffi::OsString> {
    if is_replay(&args, ours, valued) {
        return args;
    }
    let mut rest = false;
    args.into_iter()
        .map(|arg| {
            rest |= arg == "--";
            match arg.to_str().filter(|_| !rest).and_then(|a| expand(a, ours)) {
                Some(full) => full.into(),
                None => arg,
            }
        })
        .collect()
}

/// Whether the command is `replay`: its first argument that is neither a
/// flag nor a flag's value (`--kafka-topic replay` names a topic). A flag
/// is known by its full name, by a prefix of one of ours, or by the
/// reference's flag it abbreviates; our only short flag, `-q`, takes no
/// value.
fn is_replay(args: &[std::ffi::OsString], ours: &[String], valued: &[String]) -> bool {
    let mut rest = args.iter().skip(1);
    while let Some(arg) = rest.next() {
        let Some(arg) = arg.to_str() else {
            return false;
        };
        if arg == "--" {
            return false;
        }
        if let Some(flag) = arg.strip_prefix("--") {
            if flag.contains('=') {
                continue;
            }
            let mut prefixed = ours.iter().filter(|f| f.starts_with(flag));
            let name = match (prefixed.next(), prefixed.next()) {
                _ if ours.iter().any(|f| f == flag) => Some(flag.to_owned()),
                (Some(one), None) => Some(one.clone()),
                _ => expand(arg, ours).map(|full| full.trim_start_matches('-').to_owned()),
            };
            if name.is_some_and(|n| valued.contains(&n)) {
                rest.next();
            }
            continue;
        }
        if arg.starts_with('-') && arg.len() > 1 {
            continue;
        }
        return arg == "replay";
    }
    false
}

/// The reference's flag `argument` abbreviates, written out, when our own
/// flags make the abbreviation ambiguous; `None` to leave it as it is.
fn expand(argument: &str, ours: &[String]) -> Option<String> {
    let flag = argument.strip_prefix("--")?;
    let (name, value) = match flag.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (flag, None),
    };
    if name.is_empty() || ours.iter().any(|f| f == name) {
        return None;
    }
    let mut theirs = REFERENCE_FLAGS.iter().filter(|f| f.starts_with(name));
    let (Some(full), None) = (theirs.next(), theirs.next()) else {
        return None;
    };
    if ours.iter().filter(|f| f.starts_with(name)).count() < 2 {
        return None;
    }
    Some(match value {
        Some(v) => format!("--{full}={v}"),
        None => format!("--{full}"),
    })
}

fn main() -> ExitCode {
    let (ours, valued) = our_flags();
    let args = Args::parse_from(expand_reference_abbreviations(
        std::env::args_os().collect(),
        &ours,
        &valued,
    ));
    // Pages freed after an ingest burst were returned to the OS from inside
    // later requests (`madvise`, ~15-40 a second after each burst) and
    // faulted back in by the next burst: kept unless the flag or
    // mimalloc's variable says otherwise (docs/coordinator.md).
    match args.allocator_purge_delay_ms {
        Some(ms) => ic_alloc::set_purge_delay_ms(ms),
        None => ic_alloc::keep_freed_pages(),
    }
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if args.worker_threads > 0 {
        runtime.worker_threads(usize::from(args.worker_threads));
    }
    match runtime.build() {
        Ok(runtime) => runtime.block_on(serve(args)),
        Err(error) => {
            eprintln!(
                "{}: cannot start the async runtime: {error}",
                ic_coordinator::BINARY
            );
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> ExitCode {
    let Args {
        log,
        config,
        command,
        worker_threads: _,
        allocator_purge_delay_ms: _,
    } = args;
    // The log and OTLP flags are global, so they parse before or after
    // the subcommand alike.
    let (config, replay) = match command {
        Some(Command::Coordinator(args)) => (args.config, None),
        Some(Command::Replay(args)) => (config, Some(args)),
        None => (config, None),
    };
    match replay {
        None => {
            ic_telemetry::run_service(ic_coordinator::BINARY, &log, |shutdown| {
                ic_coordinator::run(config, shutdown)
            })
            .await
        }
        Some(args) => {
            ic_telemetry::run_service(ic_coordinator::BINARY, &log, |_shutdown| async move {
                let report = ic_coordinator_client::replay::replay(&args).await?;
                tracing::info!(
                    frames = report.frames,
                    applied = report.applied,
                    duplicates = report.duplicates,
                    stale = report.stale,
                    lifecycle = report.lifecycle,
                    rejected = report.rejected,
                    unknown_qualnames = report.unknown_qualnames,
                    unknown_phases = report.unknown_phases,
                    malformed = report.malformed,
                    "replay finished"
                );
                anyhow::Ok(())
            })
            .await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<std::ffi::OsString> {
        v.iter().map(std::ffi::OsString::from).collect()
    }

    #[test]
    fn a_reference_abbreviation_is_written_out_where_ours_are_ambiguous() {
        let (ours, valued) = our_flags();
        assert_eq!(
            expand_reference_abbreviations(
                args(&[
                    "ic", "--eve", "http", "--m=/x", "--chunk", "16", "--hea", "0"
                ]),
                &ours,
                &valued
            ),
            args(&[
                "ic",
                "--event-transport",
                "http",
                "--metadata-path=/x",
                "--chunk",
                "16",
                "--health-check-interval",
                "0"
            ])
        );
        // After `--`, and for `replay`, nothing is rewritten.
        let untouched = [
            args(&["ic", "--", "--eve"]),
            args(&["ic", "replay", "--eve"]),
            args(&["ic", "--log-format", "json", "replay", "--eve"]),
            args(&["ic", "-q", "replay", "--eve"]),
        ];
        for a in untouched {
            assert_eq!(expand_reference_abbreviations(a.clone(), &ours, &valued), a);
        }
        // `replay` as a flag's value (full, abbreviated, or after `=`)
        // is no command: the reference's abbreviations are still written
        // out.
        for value_first in [
            &["ic", "--kafka-topic", "replay"][..],
            &["ic", "coordinator", "--kafka-group-id", "replay"],
            &["ic", "--kafka-g", "replay"],
            &["ic", "--checkpoint-path=replay"],
        ] {
            let mut given = value_first.to_vec();
            given.extend(["--eve", "http"]);
            let mut want = value_first.to_vec();
            want.extend(["--event-transport", "http"]);
            assert_eq!(
                expand_reference_abbreviations(args(&given), &ours, &valued),
                args(&want),
                "{given:?}"
            );
        }
        // Ambiguous in the reference too, a full name, a house flag's own
        // abbreviation: left to clap.
        for a in ["--ev", "--event-transport", "--events", "--o", "-q", "--"] {
            assert_eq!(expand(a, &ours), None, "{a}");
        }
    }
}
