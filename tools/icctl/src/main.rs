//! `icctl` binary: parse, run, print; errors go to stderr with exit code 1.

use clap::Parser;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = ic_icctl::cli::Cli::parse();
    match ic_icctl::cli::run(cli).await {
        Ok(out) => {
            print!("{out}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("icctl: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
