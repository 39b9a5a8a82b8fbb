//! Decode + fingerprint throughput of the subscriber's hot path.
//!
//! Payloads are vLLM map-era batches (the current wire) of one BlockStored
//! event with 1, 16 or 64 blocks of 16 or 64 tokens. Throughput is reported
//! in blocks per second (`Elements`).
//!
//! Run: `cargo bench -p ic-kvevents --bench decode_fingerprint`

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ic_kvevents::encode::{Era, encode_batch, gpu_store};
use ic_kvevents::{KvEvent, chain_fingerprints, decode_batch};

/// One `BlockStored` of `blocks` blocks, as vLLM ≥ 0.24 sends it.
fn payload(blocks: u32, block_size: u32) -> Vec<u8> {
    let hashes = (0..u64::from(blocks))
        .map(|b| (1u64 << 63) + b * 7919)
        .collect();
    let tokens = (0..blocks * block_size)
        .map(|t| 1000 + (t * 31) % 150_000)
        .collect();
    let event = gpu_store(hashes, None, tokens, block_size);
    encode_batch(Era::VllmMap, 1_700_000_000.5, &[event], Some(0))
}

/// Decodes and fingerprints one payload; returns the number of blocks.
fn decode_and_fingerprint(bytes: &[u8]) -> usize {
    let batch = decode_batch(bytes).expect("valid payload");
    let mut n = 0;
    for event in &batch.events {
        if let KvEvent::BlockStored(s) = event {
            n += chain_fingerprints(None, &s.token_ids, s.block_size as usize).len();
        }
    }
    n
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_fingerprint");
    for block_size in [16u32, 64] {
        for blocks in [1u32, 16, 64] {
            let bytes = payload(blocks, block_size);
            group.throughput(Throughput::Elements(u64::from(blocks)));
            group.bench_with_input(
                BenchmarkId::new(format!("bs{block_size}"), format!("{blocks}blk")),
                &bytes,
                |b, bytes| b.iter(|| decode_and_fingerprint(std::hint::black_box(bytes))),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
