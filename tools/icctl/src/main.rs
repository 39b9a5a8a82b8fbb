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
    match ic_icctl::cli::run(cli).await {
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
