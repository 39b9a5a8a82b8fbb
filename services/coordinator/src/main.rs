//! Thin entry point: flags, then the library does the work.

use std::process::ExitCode;

use clap::Parser;

// The request paths allocate per key and per entry; mimalloc's fast paths
// cost a fraction of glibc's there (docs/benchmarks.md). Blocks from
// `HUGE` up go to the system allocator: the directory's record slab grows
// by doubling, and glibc moves an mmapped block's pages on `realloc`
// (mremap) where mimalloc copies it, a stall of tens of ms under the views
// lock at every doubling past a million keys (the `/events` p99 at 8 in
// flight). glibc mmaps only above its dynamic threshold (128 KiB, rising
// to at most 32 MiB as mmapped blocks are freed): blocks of 1-32 MiB may
// still be copied, every block from 32 MiB up is moved.
#[global_allocator]
static ALLOCATOR: SplitAlloc = SplitAlloc;

/// Bytes from which a block is the system allocator's.
const HUGE: usize = 1 << 20;

/// mimalloc below [`HUGE`] bytes, the system allocator from it. Which one
/// owns a block follows from its layout's size alone, which every call
/// carries.
struct SplitAlloc;

// SAFETY: every block is freed or resized by the allocator that made it
// (chosen by its size, which `dealloc` and `realloc` are given unchanged);
// a resize across `HUGE` allocates in the other one, copies, and frees.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for SplitAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on.
        unsafe {
            if layout.size() >= HUGE {
                std::alloc::System.alloc(layout)
            } else {
                mimalloc::MiMalloc.alloc(layout)
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        unsafe {
            if layout.size() >= HUGE {
                std::alloc::System.alloc_zeroed(layout)
            } else {
                mimalloc::MiMalloc.alloc_zeroed(layout)
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` came from the allocator its size chose.
        unsafe {
            if layout.size() >= HUGE {
                std::alloc::System.dealloc(ptr, layout)
            } else {
                mimalloc::MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same-side resizes go to the owner; a crossing one makes a
        // block of the new size (and the old alignment) on the other side,
        // copies the smaller length, and frees the old block with its owner.
        unsafe {
            match (layout.size() >= HUGE, new_size >= HUGE) {
                (true, true) => std::alloc::System.realloc(ptr, layout, new_size),
                (false, false) => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
                _ => {
                    let new_layout =
                        std::alloc::Layout::from_size_align_unchecked(new_size, layout.align());
                    let new = self.alloc(new_layout);
                    if !new.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    new
                }
            }
        }
    }
}

/// ic-coordinator: the LMCache-compatible fleet coordinator.
#[derive(Debug, Parser)]
#[command(name = ic_coordinator::BINARY, version)]
struct Args {
    #[command(flatten)]
    log: ic_telemetry::LogArgs,
    #[command(flatten)]
    config: ic_coordinator::Config,
    #[command(subcommand)]
    command: Option<Command>,
    /// Threads that serve HTTP connections, each on a single-threaded
    /// runtime, connections dealt to them in turn (0: one per core). Event
    /// batches apply on a thread of their own either way.
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
}

/// Upper bound of `--worker-threads`.
const MAX_WORKER_THREADS: i64 = 1024;

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run the coordinator, as `lmcache coordinator ...` does (the same
    /// flags; the bare form without a subcommand is the same thing).
    Coordinator(Box<CoordinatorArgs>),
    /// Replay a recorded `.lct` event trace into a running coordinator.
    Replay(ic_coordinator_client::replay::ReplayArgs),
}

#[derive(Debug, clap::Args)]
struct CoordinatorArgs {
    #[command(flatten)]
    config: ic_coordinator::Config,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // One thread for the accept loop and the timers: HTTP connections are
    // served on threads of their own (`--worker-threads`, lib.rs).
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
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
        worker_threads,
    } = args;
    // The log and OTLP flags are global, so they parse before or after
    // the subcommand alike.
    let (mut config, replay) = match command {
        Some(Command::Coordinator(args)) => (args.config, None),
        Some(Command::Replay(args)) => (config, Some(args)),
        None => (config, None),
    };
    config.worker_threads = worker_threads;
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
    /// Blocks grown and shrunk across `HUGE` (each time moved to the other
    /// allocator) and within either side keep their bytes, and free cleanly.
    #[test]
    fn blocks_keep_their_bytes_across_the_split() {
        let fill = |v: &mut Vec<u64>, n: usize| {
            let start = v.len();
            v.extend((start..n).map(|i| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
        };
        let check = |v: &[u64]| {
            v.iter()
                .enumerate()
                .all(|(i, x)| *x == (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
        };
        let words = |bytes: usize| bytes / std::mem::size_of::<u64>();
        let mut v = Vec::with_capacity(words(super::HUGE / 4));
        fill(&mut v, words(super::HUGE / 4));
        // mimalloc to the system allocator, then within it (mremap).
        v.reserve_exact(words(super::HUGE * 3));
        fill(&mut v, words(super::HUGE * 3));
        v.reserve_exact(words(super::HUGE * 8));
        fill(&mut v, words(super::HUGE * 5));
        assert!(check(&v), "the bytes moved intact");
        // Back under the line: the system allocator to mimalloc.
        v.truncate(words(super::HUGE / 8));
        v.shrink_to_fit();
        assert!(v.capacity() * 8 < super::HUGE);
        assert!(check(&v), "the bytes kept after shrinking");
        // Aligned past the system allocator's minimum, across the line.
        #[repr(align(4096))]
        #[derive(Clone, Copy, Debug, PartialEq)]
        struct Page([u8; 4096]);
        let mut pages: Vec<Page> = (0..64).map(|i| Page([i as u8; 4096])).collect();
        pages.extend((64..600).map(|i| Page([i as u8; 4096])));
        assert!(pages.capacity() * 4096 >= super::HUGE);
        assert!(
            pages
                .iter()
                .all(|p| (p.0.as_ptr() as usize).is_multiple_of(4096))
        );
        assert!(
            pages
                .iter()
                .enumerate()
                .all(|(i, p)| p.0.iter().all(|b| *b == i as u8))
        );
    }
}
