//! The content fingerprint the index is keyed by.
//!
//! Engine block hashes depend on per-process seeds and hash settings, so two
//! replicas of the same model rarely agree on them. The index instead keys
//! every full block by a fingerprint of its content and of everything before
//! it in the prompt:
//!
//! ```text
//! fp(block 0) = first 8 bytes, big-endian, of SHA-256( tokens(block 0) )
//! fp(block i) = first 8 bytes, big-endian, of SHA-256( be64(fp(block i-1)) ‖ tokens(block i) )
//! tokens(b)   = the block's token ids, each as 4 bytes little-endian
//! ```
//!
//! A partial trailing block has no fingerprint. `docs/fingerprints.md`
//! specifies the scheme for gateway authors, with test vectors that
//! [`tests`] checks.

use sha2::{Digest, Sha256};

/// A block's content fingerprint: what the index is keyed by. A type of
/// its own, so that an engine's block hash ([`crate::EngineHash`]) can never
/// be used as one by mistake; `.0` and `Fingerprint(n)` convert at the
/// edges (the protobuf contract carries plain `uint64`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(transparent)]
pub struct Fingerprint(pub u64);

impl Fingerprint {
    /// Fingerprints from their raw `u64`s (the protobuf form), reusing the
    /// allocation.
    pub fn from_raw(values: Vec<u64>) -> Vec<Fingerprint> {
        values.into_iter().map(Fingerprint).collect()
    }

    /// Fingerprints as raw `u64`s (the protobuf form), reusing the
    /// allocation.
    pub fn to_raw(values: Vec<Fingerprint>) -> Vec<u64> {
        values.into_iter().map(|f| f.0).collect()
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Fingerprint of one block given its parent's fingerprint (`None` for the
/// first block of a prompt).
pub fn block_fingerprint(parent: Option<Fingerprint>, tokens: &[u32]) -> Fingerprint {
    let mut hasher = Sha256::new();
    if let Some(parent) = parent {
        hasher.update(parent.0.to_be_bytes());
    }
    // Hash the tokens in stack-sized chunks: one update per token would cost
    // more than the compression itself on 16-token blocks.
    let mut buf = [0u8; 256];
    for chunk in tokens.chunks(buf.len() / 4) {
        for (slot, token) in buf.chunks_exact_mut(4).zip(chunk) {
            slot.copy_from_slice(&token.to_le_bytes());
        }
        hasher.update(&buf[..chunk.len() * 4]);
    }
    let digest = hasher.finalize();
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    Fingerprint(u64::from_be_bytes(head))
}

/// Fingerprints of every full block of `tokens`, continuing the chain after
/// `parent` (`None` when `tokens` starts the prompt). Trailing tokens that do
/// not fill a block are ignored. `block_size` 0 yields nothing.
pub fn chain_fingerprints(
    parent: Option<Fingerprint>,
    tokens: &[u32],
    block_size: usize,
) -> Vec<Fingerprint> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut prev = parent;
    for block in tokens.chunks_exact(block_size) {
        let fp = block_fingerprint(prev, block);
        out.push(fp);
        prev = Some(fp);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors published in docs/fingerprints.md (computed independently
    /// with Python's hashlib).
    #[test]
    fn published_vectors() {
        let llama_header: [u32; 32] = [
            128000, 128006, 9125, 128007, 271, 38766, 1303, 33025, 2696, 25, 6790, 220, 2366, 18,
            198, 15724, 2696, 25, 220, 1627, 10263, 220, 2366, 19, 271, 128009, 128006, 882,
            128007, 271, 9906, 0,
        ];
        let cases: [(&[u32], usize, &[u64]); 5] = [
            (
                &[1, 2, 3, 4, 5, 6, 7, 8],
                4,
                &[0xcf97_adee_db59_e05b, 0x73d4_d15a_627e_ab4e],
            ),
            (
                &(0..32).collect::<Vec<u32>>(),
                16,
                &[0x5d85_718e_c594_b982, 0x3905_bfb5_eeea_aa81],
            ),
            (
                &llama_header,
                16,
                &[0xafac_fccf_c0f0_db9a, 0x8532_5df9_4145_8d45],
            ),
            (
                &[u32::MAX, 0, 1 << 31, 1],
                2,
                &[0x72a4_fa35_44e4_3a83, 0x175c_4dd3_05b4_faac],
            ),
            (
                &(100..120).collect::<Vec<u32>>(),
                16,
                &[0x3481_9f75_ed7b_029c],
            ),
        ];
        for (tokens, block_size, want) in cases {
            assert_eq!(
                Fingerprint::to_raw(chain_fingerprints(None, tokens, block_size)),
                want
            );
        }
    }

    #[test]
    fn chaining_matches_block_by_block() {
        let tokens: Vec<u32> = (0..64).map(|i| i * 7919).collect();
        let chain = chain_fingerprints(None, &tokens, 16);
        assert_eq!(chain.len(), 4);
        let mut prev = None;
        for (i, block) in tokens.chunks(16).enumerate() {
            let fp = block_fingerprint(prev, block);
            assert_eq!(fp, chain[i]);
            prev = Some(fp);
        }
        // Continuing from the middle gives the same tail.
        assert_eq!(
            chain_fingerprints(Some(chain[1]), &tokens[32..], 16),
            chain[2..]
        );
    }

    #[test]
    fn partial_blocks_and_zero_block_size() {
        let tokens: Vec<u32> = (0..20).collect();
        assert_eq!(chain_fingerprints(None, &tokens, 16).len(), 1);
        assert!(chain_fingerprints(None, &tokens, 0).is_empty());
        assert!(chain_fingerprints(None, &tokens[..3], 4).is_empty());
    }

    #[test]
    fn prefix_position_matters() {
        let block = [1u32, 2, 3, 4];
        let root = block_fingerprint(None, &block);
        let after = block_fingerprint(Some(root), &block);
        assert_ne!(root, after);
    }

    #[test]
    fn long_blocks_hash_all_tokens() {
        // Blocks longer than the internal buffer must still cover every token.
        let a: Vec<u32> = (0..200).collect();
        let mut b = a.clone();
        b[199] = 9999;
        assert_ne!(block_fingerprint(None, &a), block_fingerprint(None, &b));
    }
}
