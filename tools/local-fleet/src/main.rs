//! `ic-local-fleet`: starts every InferenceCache service on loopback, checks
//! that each is live and ready and exports metrics, prints where they are,
//! and stops them with SIGTERM (or keeps them running with `--keep-running`).
//!
//! Today this is the whole data plane the workspace can run; the simulated
//! engines, subscribers and trace-driven routing comparison grow here as the
//! services land.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use ic_e2e::{ServiceProcess, http_get};
use nix::sys::signal::Signal;

/// Run the InferenceCache services together on this machine.
#[derive(Debug, Parser)]
#[command(name = "ic-local-fleet", version)]
struct Args {
    /// Keep the services running (until Ctrl-C) after the checks.
    #[arg(long)]
    keep_running: bool,
    /// Directory holding the service binaries (default: next to this one).
    #[arg(long, env = "IC_BIN_DIR")]
    bin_dir: Option<PathBuf>,
}

struct Service {
    binary: &'static str,
    role: &'static str,
    args: &'static [&'static str],
}

const SERVICES: &[Service] = &[
    Service {
        binary: "ic-index-server",
        role: "prefix index, LookupRoute",
        args: &["--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"],
    },
    Service {
        binary: "ic-coordinator",
        role: "LMCache fleet coordinator",
        args: &["--host", "127.0.0.1", "--port", "0"],
    },
    Service {
        binary: "ic-kvevent-subscriber",
        role: "engine KV-event sidecar",
        args: &[
            "--admin-addr",
            "127.0.0.1:0",
            "--model-id",
            "demo/model",
            "--replica-id",
            "engine-0",
            "--tenant",
            "demo",
        ],
    },
    Service {
        binary: "ic-controller",
        role: "CacheBackend controller",
        args: &["--admin-addr", "127.0.0.1:0"],
    },
    Service {
        binary: "ic-webhook",
        role: "admission webhooks",
        args: &["--admin-addr", "127.0.0.1:0"],
    },
];

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin_dir = match args.bin_dir {
        Some(dir) => dir,
        None => std::env::current_exe()?
            .parent()
            .context("binary has no directory")?
            .to_path_buf(),
    };
    let started = Instant::now();
    let mut running = Vec::new();
    println!("Starting {} services on loopback…\n", SERVICES.len());
    for service in SERVICES {
        let path = bin_dir.join(service.binary);
        if !path.exists() {
            bail!(
                "{} not found in {}: build with `cargo build --workspace --bins`",
                service.binary,
                bin_dir.display()
            );
        }
        let mut process = ServiceProcess::start(&path, service.args);
        let addr = process.admin_addr();
        wait_ready(addr)?;
        let (_, metrics) = http_get(addr, "/metrics");
        let families = metrics.lines().filter(|l| l.starts_with("# TYPE")).count();
        running.push((service, process, addr, families));
    }
    println!(
        "{:<24} {:<28} {:<22} {:>7} {:>9}",
        "SERVICE", "ROLE", "HTTP", "READY", "METRICS"
    );
    for (service, _, addr, families) in &running {
        println!(
            "{:<24} {:<28} {:<22} {:>7} {:>9}",
            service.binary,
            service.role,
            addr.to_string(),
            "yes",
            families
        );
    }
    println!(
        "\nAll services live and ready in {:.1}s.",
        started.elapsed().as_secs_f64()
    );

    if args.keep_running {
        println!("Services stay up; press Ctrl-C to stop them.");
        let (tx, rx) = std::sync::mpsc::channel();
        ctrl_c(tx);
        let _ = rx.recv();
    }

    println!("Stopping with SIGTERM…");
    let mut failures = Vec::new();
    for (service, process, _, _) in &mut running {
        let status = process.stop();
        if !status.success() {
            failures.push(format!("{} exited with {status}", service.binary));
        }
    }
    if !failures.is_empty() {
        bail!("unclean shutdown: {}", failures.join("; "));
    }
    println!("All services stopped cleanly.");
    Ok(())
}

fn wait_ready(addr: std::net::SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(addr, "/ready").0 != 200 {
        if Instant::now() > deadline {
            bail!("{addr} not ready after 30s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Forwards the first SIGINT/SIGTERM to `tx` (blocking the signals and
/// waiting for them on a helper thread, so no unsafe handler is needed).
fn ctrl_c(tx: std::sync::mpsc::Sender<()>) {
    use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    // Block in this thread (inherited by the helper) so delivery is synchronous.
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set), None);
    std::thread::spawn(move || {
        let _ = set.wait();
        let _ = tx.send(());
    });
}
