//! `icctl` binary: parse, run, print; errors go to stderr with exit code 1.

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = ic_icctl::cli::Cli::parse();
    // The same parse-only mode as the services (deployment contract tests).
    if ic_telemetry::check_args_requested() {
        println!("arguments accepted");
        return std::process::ExitCode::SUCCESS;
    }
    if cli.otlp.otlp_endpoint.is_some() {
        // Warnings only on stderr: the command's output is the point.
        let logs = ic_telemetry::LogArgs {
            log_level: "warn".to_owned(),
            log_format: ic_telemetry::LogFormat::Plain,
            listen_report: None,
            otlp: cli.otlp.clone(),
        };
        if let Err(e) = logs.init("icctl") {
            eprintln!("icctl: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    let result = ic_icctl::cli::run(cli).await;
    // The command's spans go out before the process does.
    ic_telemetry::otel::shutdown(std::time::Duration::from_secs(5)).await;
    match result {
        Ok(out) => {
            print!("{out}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            if let Some(failed) = e.downcast_ref::<ic_icctl::check::ChecksFailed>() {
                print!("{}", failed.report);
            }
            eprintln!("icctl: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
