//! Decode + fingerprint throughput of the subscriber's hot path.
//!
//! Payloads are vLLM map-era batches (the current wire) of one BlockStored
//! event with 1, 16 or 64 blocks of 16 or 64 tokens. Throughput is reported
//! in blocks per second (`Elements`).
//!
//! Run: `cargo bench -p ic-kvevents --bench decode_fingerprint`

// Test and benchmark helpers panic on bad fixtures by design.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)]

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ic_kvevents::{KvEvent, chain_fingerprints, decode_batch};

fn put_uint(out: &mut Vec<u8>, v: u64) {
    if v < 128 {
        out.push(v as u8);
    } else if v <= u64::from(u32::MAX) {
        out.push(0xce);
        out.extend_from_slice(&(v as u32).to_be_bytes());
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.push(0xa0 | s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

fn put_array(out: &mut Vec<u8>, len: usize) {
    out.push(0xdd);
    out.extend_from_slice(&(len as u32).to_be_bytes());
}

/// `[ts, [{"type":"BlockStored", …}], 0]`, as vLLM ≥ 0.24 sends it.
fn payload(blocks: usize, block_size: usize) -> Vec<u8> {
    let mut out = vec![0x93, 0xcb];
    out.extend_from_slice(&1_700_000_000.5f64.to_be_bytes());
    out.push(0x91);
    out.push(0x87); // 7 keys
    put_str(&mut out, "type");
    put_str(&mut out, "BlockStored");
    put_str(&mut out, "block_hashes");
    put_array(&mut out, blocks);
    for b in 0..blocks {
        put_uint(&mut out, (1u64 << 63) + b as u64 * 7919);
    }
    put_str(&mut out, "parent_block_hash");
    out.push(0xc0);
    put_str(&mut out, "token_ids");
    put_array(&mut out, blocks * block_size);
    for t in 0..blocks * block_size {
        put_uint(&mut out, 1000 + (t as u64 * 31) % 150_000);
    }
    put_str(&mut out, "block_size");
    put_uint(&mut out, block_size as u64);
    put_str(&mut out, "medium");
    put_str(&mut out, "GPU");
    put_str(&mut out, "lora_name");
    out.push(0xc0);
    out.push(0x00);
    out
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode_fingerprint");
    for block_size in [16usize, 64] {
        for blocks in [1usize, 16, 64] {
            let bytes = payload(blocks, block_size);
            group.throughput(Throughput::Elements(blocks as u64));
            group.bench_with_input(
                BenchmarkId::new(format!("bs{block_size}"), format!("{blocks}blk")),
                &bytes,
                |b, bytes| {
                    b.iter(|| {
                        let batch = decode_batch(std::hint::black_box(bytes)).expect("valid");
                        let mut n = 0usize;
                        for event in &batch.events {
                            if let KvEvent::BlockStored(s) = event {
                                n += chain_fingerprints(None, &s.token_ids, s.block_size as usize)
                                    .len();
                            }
                        }
                        assert_eq!(n, blocks);
                        n
                    });
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
