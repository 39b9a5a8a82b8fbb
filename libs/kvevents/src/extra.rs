//! Extra keys: what an engine folds into a block's hash besides its tokens.
//!
//! vLLM hashes a block from its parent, its tokens and a per-block tuple of
//! *extra keys*: the LoRA adapter's name, the identifiers of multimodal
//! items whose placeholder tokens overlap the block, the request's cache
//! salt (first block only) and a digest of prompt embeddings. SGLang folds a
//! request's cache salt into its whole chain. Two prompts with the same
//! tokens but a different image, adapter or salt are different caches, so
//! the fingerprint of a block with extra keys is taken in their domain:
//!
//! ```text
//! fp(block)   = fp₀(block)                                           (no extra keys)
//! fp(block)   = first8(SHA-256( 0x78 ‖ be64(fp₀(block)) ‖ SHA-256(extras(block)) ))
//! fp₀(block)  = the plain fingerprint of the block's parent and tokens
//! extras(b)   = for each key, in canonical order: tag ‖ be32(len) ‖ bytes
//! ```
//!
//! The 41-byte input can never be a plain fingerprint's input (those are a
//! multiple of 4 bytes long), so no token sequence forges a keyed block.
//! Keys are ordered by tag, keeping their given order within a tag
//! (multimodal items by position). Multimodal positions are not hashed: the
//! placeholder tokens already fix where an item sits, and vLLM changed how
//! it sends offsets between releases. `docs/fingerprints.md` has the scheme
//! and its test vectors.

use sha2::{Digest, Sha256};

use crate::fingerprint::{Fingerprint, block_fingerprint};

/// One key an engine folds into a block's hash.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExtraKey {
    /// The LoRA adapter the block was computed under (every block of it).
    Adapter(String),
    /// A string key: a multimodal item's identifier, or the cache salt.
    Key(String),
    /// A binary key: vLLM's digest of a block's prompt embeddings.
    Digest(Vec<u8>),
    /// A key of a kind this version does not know, as its msgpack bytes: it
    /// still separates the block from every lookup that lacks it.
    Opaque(Vec<u8>),
}

impl ExtraKey {
    fn tag(&self) -> u8 {
        match self {
            ExtraKey::Adapter(_) => 1,
            ExtraKey::Key(_) => 2,
            ExtraKey::Digest(_) => 3,
            ExtraKey::Opaque(_) => 4,
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            ExtraKey::Adapter(s) | ExtraKey::Key(s) => s.as_bytes(),
            ExtraKey::Digest(b) | ExtraKey::Opaque(b) => b,
        }
    }
}

/// Sorts keys into canonical order: by kind, stable within a kind.
pub fn canonicalize(keys: &mut [ExtraKey]) {
    keys.sort_by_key(ExtraKey::tag);
}

/// Fingerprint of a block whose engine hash also covered `keys` (already
/// in canonical order). With no keys it is the plain fingerprint.
pub fn keyed_block_fingerprint(
    parent: Option<Fingerprint>,
    tokens: &[u32],
    keys: &[ExtraKey],
) -> Fingerprint {
    let base = block_fingerprint(parent, tokens);
    if keys.is_empty() {
        return base;
    }
    let mut extras = Sha256::new();
    for key in keys {
        let bytes = key.bytes();
        extras.update([key.tag()]);
        // Keys are bounded by the frame size, far below 4 GiB.
        extras.update(u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes());
        extras.update(bytes);
    }
    let mut outer = Sha256::new();
    outer.update([0x78]);
    outer.update(base.0.to_be_bytes());
    outer.update(extras.finalize());
    let digest = outer.finalize();
    let mut head = [0u8; 8];
    head.copy_from_slice(&digest[..8]);
    Fingerprint(u64::from_be_bytes(head))
}

/// A multimodal item of a prompt: its identifier and the token positions
/// its placeholder tokens cover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MediaSpan {
    /// The engine's identifier of the item (vLLM's `mm_hash` or the
    /// request's multimodal UUID).
    pub identifier: String,
    /// First placeholder token, from the start of the prompt.
    pub offset: u64,
    /// Placeholder tokens.
    pub length: u64,
}

/// Everything besides the tokens that a prompt's block hashes cover, as a
/// gateway knows it from the request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PromptExtras {
    /// LoRA adapter, empty for the base model.
    pub adapter: String,
    /// Multimodal items, any order.
    pub media: Vec<MediaSpan>,
    /// The request's cache salt, empty for none.
    pub cache_salt: String,
    /// Further keys per block, as the engine computed them (for example
    /// prompt-embedding digests); block `i` gets entry `i`.
    pub per_block: Vec<Vec<ExtraKey>>,
}

impl PromptExtras {
    /// Whether the prompt has no extra keys at all (plain fingerprints).
    pub fn is_empty(&self) -> bool {
        self.adapter.is_empty()
            && self.media.is_empty()
            && self.cache_salt.is_empty()
            && self.per_block.iter().all(Vec::is_empty)
    }

    /// The canonical keys of block `index`, covering tokens `[start, end)`.
    pub fn block_keys(&self, index: usize, start: u64, end: u64) -> Vec<ExtraKey> {
        let mut keys = Vec::new();
        if !self.adapter.is_empty() {
            keys.push(ExtraKey::Adapter(self.adapter.clone()));
        }
        let mut media: Vec<&MediaSpan> = self
            .media
            .iter()
            .filter(|m| m.offset < end && m.offset.saturating_add(m.length) > start)
            .collect();
        media.sort_by_key(|m| m.offset);
        keys.extend(
            media
                .into_iter()
                .map(|m| ExtraKey::Key(m.identifier.clone())),
        );
        if index == 0 && !self.cache_salt.is_empty() {
            keys.push(ExtraKey::Key(self.cache_salt.clone()));
        }
        if let Some(more) = self.per_block.get(index) {
            keys.extend(more.iter().cloned());
        }
        canonicalize(&mut keys);
        keys
    }
}

/// Fingerprints of every full block of a prompt whose hashes also cover
/// `extras`. Equal to [`crate::chain_fingerprints`] when there are none.
pub fn keyed_chain_fingerprints(
    tokens: &[u32],
    block_size: usize,
    extras: &PromptExtras,
) -> Vec<Fingerprint> {
    keyed_chain_fingerprints_from(None, 0, tokens, block_size, extras)
}

/// [`keyed_chain_fingerprints`] of a prompt's later part: `tokens` start at
/// block `first_block`, whose parent is `prev`. Fingerprinting a long
/// prompt piece by piece gives the same chain as all at once.
pub fn keyed_chain_fingerprints_from(
    prev: Option<Fingerprint>,
    first_block: usize,
    tokens: &[u32],
    block_size: usize,
    extras: &PromptExtras,
) -> Vec<Fingerprint> {
    if block_size == 0 {
        return Vec::new();
    }
    if extras.is_empty() {
        return crate::chain_fingerprints(prev, tokens, block_size);
    }
    let mut out = Vec::with_capacity(tokens.len() / block_size);
    let mut prev = prev;
    for (j, block) in tokens.chunks_exact(block_size).enumerate() {
        let i = first_block + j;
        let start = (i * block_size) as u64;
        let keys = extras.block_keys(i, start, start + block_size as u64);
        let fp = keyed_block_fingerprint(prev, block, &keys);
        out.push(fp);
        prev = Some(fp);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> ExtraKey {
        ExtraKey::Key(s.into())
    }

    /// The vectors published in docs/fingerprints.md (computed independently
    /// with Python's hashlib).
    #[test]
    fn published_vectors() {
        let tokens: Vec<u32> = (1..=8).collect();
        let adapter = PromptExtras {
            adapter: "sql-lora".into(),
            ..Default::default()
        };
        assert_eq!(
            keyed_chain_fingerprints(&tokens, 4, &adapter),
            [
                Fingerprint(0xb200_ba7d_d178_51a8),
                Fingerprint(0x359e_f5c8_c4c1_0a66)
            ]
        );
        let salted = PromptExtras {
            cache_salt: "tenant-a".into(),
            ..Default::default()
        };
        assert_eq!(
            keyed_chain_fingerprints(&tokens, 4, &salted),
            [
                Fingerprint(0x1d16_6f43_a915_eaa7),
                Fingerprint(0xde7f_723b_7a36_5a66)
            ]
        );
        let image = PromptExtras {
            media: vec![MediaSpan {
                identifier: "img-0".into(),
                offset: 2,
                length: 4,
            }],
            ..Default::default()
        };
        assert_eq!(
            keyed_chain_fingerprints(&tokens, 4, &image),
            [
                Fingerprint(0x949c_7a65_1738_3181),
                Fingerprint(0x1200_3890_1691_f46b)
            ]
        );
    }

    #[test]
    fn no_keys_is_the_plain_scheme() {
        let tokens: Vec<u32> = (0..64).collect();
        assert_eq!(
            keyed_chain_fingerprints(&tokens, 16, &PromptExtras::default()),
            crate::chain_fingerprints(None, &tokens, 16)
        );
        assert_eq!(
            keyed_block_fingerprint(Some(Fingerprint(7)), &tokens[..16], &[]),
            block_fingerprint(Some(Fingerprint(7)), &tokens[..16])
        );
    }

    #[test]
    fn every_key_separates_the_block() {
        let tokens: Vec<u32> = (0..16).collect();
        let plain = block_fingerprint(None, &tokens);
        let variants = [
            vec![ExtraKey::Adapter("a".into())],
            vec![key("a")],
            vec![ExtraKey::Digest(b"a".to_vec())],
            vec![ExtraKey::Opaque(b"a".to_vec())],
            vec![key("a"), key("b")],
            vec![key("b"), key("a")],
            vec![key("ab")],
        ];
        let mut seen = std::collections::HashSet::from([plain]);
        for keys in variants {
            assert!(
                seen.insert(keyed_block_fingerprint(None, &tokens, &keys)),
                "{keys:?}"
            );
        }
    }

    #[test]
    fn media_land_in_the_blocks_they_overlap_and_salt_in_the_first() {
        let extras = PromptExtras {
            adapter: "lora".into(),
            media: vec![
                MediaSpan {
                    identifier: "late".into(),
                    offset: 20,
                    length: 30,
                },
                MediaSpan {
                    identifier: "early".into(),
                    offset: 10,
                    length: 8,
                },
            ],
            cache_salt: "salt".into(),
            per_block: vec![vec![], vec![], vec![ExtraKey::Digest(vec![1])]],
        };
        let adapter = ExtraKey::Adapter("lora".into());
        assert_eq!(
            extras.block_keys(0, 0, 16),
            [adapter.clone(), key("early"), key("salt")]
        );
        assert_eq!(
            extras.block_keys(1, 16, 32),
            [adapter.clone(), key("early"), key("late")]
        );
        assert_eq!(
            extras.block_keys(2, 32, 48),
            [adapter.clone(), key("late"), ExtraKey::Digest(vec![1])]
        );
        assert_eq!(extras.block_keys(3, 48, 64), [adapter, key("late")]);
    }

    #[test]
    fn canonical_order_is_by_kind_then_given_order() {
        let mut keys = vec![
            ExtraKey::Digest(vec![1]),
            key("b"),
            ExtraKey::Adapter("x".into()),
            key("a"),
        ];
        canonicalize(&mut keys);
        assert_eq!(
            keys,
            [
                ExtraKey::Adapter("x".into()),
                key("b"),
                key("a"),
                ExtraKey::Digest(vec![1])
            ]
        );
    }
}
