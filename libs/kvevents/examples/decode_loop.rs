//! A fixed amount of decode + fingerprint work, for instruction counting
//! (`valgrind --tool=callgrind`), which unlike wall time is repeatable on a
//! noisy machine:
//!
//! ```text
//! cargo build --release -p ic-kvevents --example decode_loop
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/decode_loop 16 1 100000
//! ```
//! Arguments: block size, blocks per event, iterations.

use ic_kvevents::encode::{Era, encode_batch, gpu_store};
use ic_kvevents::{KvEvent, chain_fingerprints, decode_batch};

fn main() {
    let args: Vec<u32> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("numeric arguments"))
        .collect();
    let (block_size, blocks, iterations) = match args[..] {
        [bs, b, n] => (bs, b, n),
        _ => (16, 1, 100_000),
    };
    let hashes = (0..u64::from(blocks))
        .map(|b| (1u64 << 63) + b * 7919)
        .collect();
    let tokens = (0..blocks * block_size)
        .map(|t| 1000 + (t * 31) % 150_000)
        .collect();
    let bytes = encode_batch(
        Era::VllmMap,
        1_700_000_000.5,
        &[gpu_store(hashes, None, tokens, block_size)],
        Some(0),
    );
    let mut total = 0usize;
    for _ in 0..iterations {
        let batch = decode_batch(std::hint::black_box(&bytes)).expect("valid payload");
        for event in &batch.events {
            if let KvEvent::BlockStored(s) = event {
                total += chain_fingerprints(None, &s.token_ids, s.block_size as usize).len();
            }
        }
    }
    println!("{total} blocks");
}
