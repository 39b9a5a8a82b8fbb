//! `--log-level` / `--log-format` (and `--listen-report`) flags and the
//! tracing subscriber they configure.

use clap::{Args, ValueEnum};
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// How log lines are rendered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for log pipelines.
    Json,
    /// Human-readable lines, for terminals.
    #[default]
    Plain,
}

/// Logging flags shared by every binary (flatten into the binary's own args).
#[derive(Clone, Debug, Args)]
pub struct LogArgs {
    /// Log filter: a level (`info`, `debug`, …) or a full `tracing` directive
    /// such as `info,ic_index=debug`.
    #[arg(long, env = "IC_LOG_LEVEL", default_value = "info", global = true)]
    pub log_level: String,

    /// Log line format.
    #[arg(long, env = "IC_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain, global = true)]
    pub log_format: LogFormat,

    /// Write the addresses this process listens on, as a JSON object by
    /// server (`admin`, `grpc`, `https`), to this file once each is bound
    /// (for supervisors and tests that bind port 0).
    #[arg(long, env = "IC_LISTEN_REPORT", global = true)]
    pub listen_report: Option<std::path::PathBuf>,
}

/// The `--log-level` value could not be parsed as a tracing filter.
#[derive(Debug, thiserror::Error)]
#[error("invalid --log-level {value:?}: {source}")]
pub struct LogInitError {
    value: String,
    #[source]
    source: tracing_subscriber::filter::ParseError,
}

impl LogArgs {
    /// Installs the global tracing subscriber. Logs go to stderr so stdout stays
    /// free for command output (tables, JSON) in the CLI tools.
    pub fn init(&self) -> Result<(), LogInitError> {
        if let Some(path) = &self.listen_report {
            crate::listening::report_to(path.clone());
        }
        let filter = EnvFilter::try_new(&self.log_level).map_err(|source| LogInitError {
            value: self.log_level.clone(),
            source,
        })?;
        let registry = tracing_subscriber::registry().with(filter);
        // A second init (tests that run several services in one process) is harmless.
        let _ = match self.log_format {
            LogFormat::Json => registry
                .with(
                    fmt::layer()
                        .json()
                        .flatten_event(false)
                        .with_current_span(false)
                        .with_writer(std::io::stderr),
                )
                .try_init(),
            LogFormat::Plain => registry
                .with(fmt::layer().with_writer(std::io::stderr))
                .try_init(),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_garbage_level() {
        let args = LogArgs {
            log_level: "info,=[".into(),
            log_format: LogFormat::Plain,
            listen_report: None,
        };
        let err = args.init().unwrap_err();
        assert!(err.to_string().contains("--log-level"), "{err}");
    }
}
