//! `--log-level` / `--log-format` (and `--listen-report`) flags and the
//! tracing subscriber they configure.

use clap::{Args, ValueEnum};
use tracing_subscriber::{EnvFilter, Layer as _, fmt, prelude::*};

/// How log lines are rendered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line, for log pipelines.
    Json,
    /// Human-readable lines, for terminals.
    #[default]
    Plain,
}

/// Logging and telemetry-export flags shared by every binary (flatten into
/// the binary's own args).
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
    /// server (`admin`, `grpc`, `https`, `epp`), to this file once each is bound
    /// (for supervisors and tests that bind port 0).
    #[arg(long, env = "IC_LISTEN_REPORT", global = true)]
    pub listen_report: Option<std::path::PathBuf>,

    /// OTLP export (`--otlp-endpoint` and its limits).
    #[command(flatten)]
    pub otlp: crate::otel::OtlpArgs,
}

/// The logging or export flags could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LogInitError {
    /// `--log-level` is not a tracing filter.
    #[error("invalid --log-level {value:?}: {source}")]
    Level {
        /// What was given.
        value: String,
        /// Why it does not parse.
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    /// The OTLP pipeline could not be built.
    #[error(transparent)]
    Otlp(#[from] crate::otel::InstallError),
}

impl LogArgs {
    /// Installs the global tracing subscriber, and the OTLP pipeline of
    /// `service` (the binary's name) when `--otlp-endpoint` is set (which
    /// needs the tokio runtime). Logs go to stderr so stdout stays free for
    /// command output (tables, JSON) in the CLI tools.
    pub fn init(&self, service: &str) -> Result<(), LogInitError> {
        if let Some(path) = &self.listen_report {
            crate::listening::report_to(path.clone());
        }
        let filter = EnvFilter::try_new(&self.log_level).map_err(|source| LogInitError::Level {
            value: self.log_level.clone(),
            source,
        })?;
        crate::otel::install(service, &self.otlp)?;
        // The log filter applies to log lines only: the OTLP layer has its own.
        let fmt_layer = match self.log_format {
            LogFormat::Json => fmt::layer()
                .json()
                .flatten_event(false)
                .with_current_span(false)
                .with_writer(std::io::stderr)
                .with_filter(filter)
                .boxed(),
            LogFormat::Plain => fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(filter)
                .boxed(),
        };
        // A second init (tests that run several services in one process) is harmless.
        let _ = tracing_subscriber::registry()
            .with(fmt_layer)
            .with(crate::otel::layer())
            .try_init();
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
            otlp: crate::otel::OtlpArgs::default(),
        };
        let err = args.init("ic-test").unwrap_err();
        assert!(err.to_string().contains("--log-level"), "{err}");
    }
}
