//! Memory per directory key and the checkpoint's capture and restore time,
//! in process: fills the directory (with its L2 LRU) and the usage view with
//! N keys (one L2 placement each, 16-byte chunk hashes as LMCache's
//! 32-hex-char keys), then writes the checkpoint file the service writes
//! (version 2) and, in a fresh process, restores it as a restart does
//! (decoded as it is read, as the service reads it).
//!
//! Run: `cargo build --release -p ic-coordinator-core --example memory_per_key`, then
//! `target/release/examples/memory_per_key fill 1000000 /tmp/ckpt` and, in a
//! fresh process, `target/release/examples/memory_per_key restore /tmp/ckpt`.

use std::alloc::System;
use std::time::Instant;

use ic_coordinator_core::StorageLevel;
use ic_coordinator_core::checkpoint::{self, Sections};
use ic_coordinator_core::directory::KeyDirectory;
use ic_coordinator_core::events::{Batch, Entry, EventType};
use ic_coordinator_core::key::ObjectKey;
use ic_coordinator_core::usage::UsageView;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

/// Counts heap bytes, so the figure is what the views keep.
#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Live heap bytes.
fn live() -> usize {
    let s = GLOBAL.stats();
    let net = s.bytes_allocated as isize - s.bytes_deallocated as isize + s.bytes_reallocated;
    net.max(0) as usize
}

fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// The process's peak resident set (`VmHWM`).
fn peak_rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<usize>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn batch(seq: u64, first: u64, n: u64) -> Batch {
    Batch {
        instance_id: format!("mp-{}", first % 16),
        incarnation: 1,
        seq,
        event_type: EventType::Store,
        tier: StorageLevel::L2,
        backend: "fs".into(),
        entries: (first..first + n)
            .map(|i| {
                let mut hash = [0u8; 16];
                hash[..8].copy_from_slice(&i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes());
                hash[8..].copy_from_slice(&i.to_le_bytes());
                Entry {
                    key: ObjectKey {
                        chunk_hash: hash.to_vec(),
                        model_name: "meta-llama/Llama-3.1-8B".into(),
                        kv_rank: 16_777_472,
                        object_group_id: 0,
                        cache_salt: String::new(),
                    },
                    size_bytes: 1 << 20,
                    token_ids: Vec::new(),
                    token_offset: -1,
                }
            })
            .collect(),
        shared: false,
        ts: 1.0,
        capacity_bytes: 0,
        capacity_revision: 0,
        dropped_events: 0,
    }
}

#[allow(clippy::cast_precision_loss)]
fn per_key(bytes: usize, keys: u64) -> f64 {
    bytes as f64 / keys as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match (args.get(1).map(String::as_str), args.get(2), args.get(3)) {
        (Some("fill"), Some(keys), Some(path)) => fill(keys.parse().expect("keys"), path),
        (Some("restore"), Some(path), _) => restore(path),
        _ => eprintln!("usage: memory_per_key fill KEYS PATH | memory_per_key restore PATH"),
    }
}

/// Fills the views with `keys` keys, then writes their checkpoint to `path`.
fn fill(keys: u64, path: &str) {
    let (rss0, live0) = (rss(), live());
    // The directory keeps the L2 LRU too.
    let (mut dir, mut usage) = (KeyDirectory::new(), UsageView::new());
    let started = Instant::now();
    let per_batch = 1_000;
    for (seq, first) in (0..keys).step_by(per_batch).enumerate() {
        let b = batch(
            seq as u64 + 1,
            first,
            per_batch.min((keys - first) as usize) as u64,
        );
        let old = dir.apply(&b);
        usage.apply(&b, &old);
    }
    let fill = started.elapsed();
    let (rss1, live1) = (rss(), live());
    println!(
        "filled {keys} keys in {:.2} s: {:.0} B/key live heap, {:.0} B/key RSS",
        fill.as_secs_f64(),
        per_key(live1 - live0, keys),
        per_key(rss1.saturating_sub(rss0), keys)
    );
    let started = Instant::now();
    // What the service does under the views lock: encode the file (the
    // directory's image is one pass over its records).
    let raw = checkpoint::encode_file(&Sections::default(), &dir).expect("encode");
    let captured = started.elapsed();
    std::fs::write(path, &raw).expect("write");
    println!(
        "checkpoint: {} bytes ({:.0} B/key), captured and encoded in {:.2} s (the views lock's hold), written by {:.2} s",
        raw.len(),
        per_key(raw.len(), keys),
        captured.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    drop(usage);
}

/// Restores the views from the checkpoint at `path`, as a restart does: the
/// file decoded as it is read through a 64 KiB buffer, never held whole.
fn restore(path: &str) {
    let (rss0, live0) = (rss(), live());
    let started = Instant::now();
    let file = std::fs::File::open(path).expect("open");
    let loaded =
        checkpoint::read_file(std::io::BufReader::with_capacity(1 << 16, file)).expect("decode");
    assert!(loaded.skipped.is_empty(), "{:?}", loaded.skipped);
    let decoded = started.elapsed();
    let dir = loaded.directory.expect("a directory");
    let usage = checkpoint::restore_usage(&dir);
    let restored = started.elapsed();
    let keys = dir.len() as u64;
    let (rss1, live1, peak) = (rss(), live(), peak_rss());
    println!(
        "restored {keys} keys: read and directory loaded by {:.2} s, usage rebuilt by {:.2} s; {:.0} B/key live heap, {:.0} B/key RSS (peak {:.0} B/key)",
        decoded.as_secs_f64(),
        restored.as_secs_f64(),
        per_key(live1.saturating_sub(live0), keys),
        per_key(rss1.saturating_sub(rss0), keys),
        per_key(peak.saturating_sub(rss0), keys),
    );
    assert_eq!(dir.lru_len() as u64, keys);
    drop(usage);
}
