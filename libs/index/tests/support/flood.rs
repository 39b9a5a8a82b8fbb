//! Flood inputs shared by `tests/memory.rs` and `examples/flood_memory.rs`.

use ic_index::{Change, Fingerprint, Tier};

/// Distinct, well-spread fingerprints: splitmix64 of (stream, position).
pub fn spread(stream: u64, i: u64) -> Fingerprint {
    let mut z = (stream << 32 | i).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    Fingerprint(z ^ (z >> 31))
}

/// One stored chain of `n` new blocks of `stream`, from position `from`.
pub fn chain(stream: u64, from: u64, n: u64) -> Vec<Change> {
    vec![Change::Stored {
        start_depth: 0,
        fingerprints: (from..from + n).map(|i| spread(stream, i)).collect(),
        block_size: 16,
        tier: Tier::T1,
    }]
}
