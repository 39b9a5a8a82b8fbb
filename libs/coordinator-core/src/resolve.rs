//! Token → key resolution, identical to the reference: complete chunks only,
//! a BLAKE3 rolling hash seeded with `NONE_HASH`, and rank fan-out.

use crate::key::{KeyError, ObjectKey, validate_model, validate_salt};

/// Most token ids a single request may carry, by default (the reference's
/// fixed cap).
pub const MAX_TOKENS_PER_REQUEST: usize = 1_000_000;
/// Most keys one request may expand to (chunks × world size), by default;
/// bounds the memory a single request can make the coordinator allocate.
pub const MAX_KEYS_PER_REQUEST: usize = 1_000_000;

/// How much one token request may ask for (`--max-tokens-per-request`,
/// `--max-keys-per-request`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Token ids one request may carry.
    pub max_tokens: usize,
    /// Keys (chunks × world size) one request may expand to.
    pub max_keys: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_tokens: MAX_TOKENS_PER_REQUEST,
            max_keys: MAX_KEYS_PER_REQUEST,
        }
    }
}
/// Largest world size: `kv_rank` keeps it in 8 bits.
pub const MAX_WORLD_SIZE: i64 = 255;

/// `BLAKE3(0i64 big-endian ‖ 0u32 big-endian)`: the hash chained before the
/// first chunk.
pub fn none_hash() -> [u8; 32] {
    let mut seed = [0u8; 12];
    seed[..8].copy_from_slice(&0i64.to_be_bytes());
    seed[8..].copy_from_slice(&0u32.to_be_bytes());
    *blake3::hash(&seed).as_bytes()
}

/// The packed `kv_rank` of rank `rank` in a world of `world_size`.
pub fn kv_rank(world_size: i64, rank: i64) -> i64 {
    (world_size << 24) | (rank << 16) | (world_size << 8) | rank
}

/// Chunk hashes of every complete chunk of `tokens`; a trailing partial chunk
/// is dropped.
pub fn chunk_hashes(tokens: &[u32], chunk_size: usize) -> Vec<[u8; 32]> {
    if chunk_size == 0 {
        return Vec::new();
    }
    let mut prev = none_hash();
    let mut out = Vec::with_capacity(tokens.len() / chunk_size);
    // Sized by what a chunk of these tokens can hold: `--chunk-size` may be
    // far larger than any request.
    let mut buf = Vec::with_capacity(32 + chunk_size.min(tokens.len()) * 4);
    for chunk in tokens.chunks_exact(chunk_size) {
        buf.clear();
        buf.extend_from_slice(&prev);
        for t in chunk {
            buf.extend_from_slice(&t.to_be_bytes());
        }
        prev = *blake3::hash(&buf).as_bytes();
        out.push(prev);
    }
    out
}

/// What a token-addressed request asks to resolve.
#[derive(Debug, Clone, Copy)]
pub struct TokenQuery<'a> {
    /// The sequence from position 0, as sent (checked against u32 here).
    pub token_ids: &'a [i64],
    /// Model name.
    pub model_name: &'a str,
    /// Ranks per chunk.
    pub world_size: i64,
    /// Tenant salt.
    pub cache_salt: &'a str,
}

/// The keys of a token sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Complete chunks.
    pub chunks: usize,
    /// `chunks × world_size` keys, chunk-major, rank-minor, group 0.
    pub keys: Vec<ObjectKey>,
}

/// Resolves `query` into keys, validating as the reference does: the request
/// cap, then the salt (even with no complete chunk), then the token range,
/// then the model (only when a key is built).
pub fn resolve(
    query: &TokenQuery<'_>,
    chunk_size: usize,
    limits: RequestLimits,
) -> Result<Resolved, KeyError> {
    if query.token_ids.len() > limits.max_tokens {
        return Err(KeyError::TooManyTokens {
            limit: limits.max_tokens,
            got: query.token_ids.len(),
        });
    }
    if query.world_size < 1 {
        return Err(KeyError::BadWorldSize(query.world_size));
    }
    if query.world_size > MAX_WORLD_SIZE {
        return Err(KeyError::WorldSizeTooLarge(query.world_size));
    }
    validate_salt(query.cache_salt)?;
    let tokens = query
        .token_ids
        .iter()
        .map(|&t| u32::try_from(t).map_err(|_| KeyError::TokenOutOfRange(t)))
        .collect::<Result<Vec<u32>, _>>()?;
    let ws = query.world_size;
    let chunks = tokens.len().checked_div(chunk_size).unwrap_or(0);
    // ws is in 1..=255 here, so the cast is exact.
    let total = chunks.saturating_mul(ws.unsigned_abs() as usize);
    if total > limits.max_keys {
        return Err(KeyError::TooManyKeys {
            limit: limits.max_keys,
            got: total,
        });
    }
    let hashes = chunk_hashes(&tokens, chunk_size);
    if !hashes.is_empty() {
        validate_model(query.model_name)?;
    }
    let mut keys = Vec::with_capacity(hashes.len() * usize::try_from(ws).unwrap_or(1));
    for hash in &hashes {
        for rank in 0..ws {
            keys.push(ObjectKey {
                chunk_hash: hash.to_vec(),
                model_name: query.model_name.to_owned(),
                kv_rank: kv_rank(ws, rank),
                object_group_id: 0,
                cache_salt: query.cache_salt.to_owned(),
            });
        }
    }
    Ok(Resolved {
        chunks: hashes.len(),
        keys,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::encode_hex;

    const H0: &str = "6309ed506b8721905753f5c73c070bb21c3aafbd9b474b1e231f41368b71123c";
    const H1: &str = "98efc76eafb06cfe774c31ff151f300b61a614c27982a211bb8cdbd83a8c0e19";
    const L0: &str = "084547b6c40ed5b05ba8cd0305db5bf74d5617673948d9ed193ab7d6cbc484d4";
    const L1: &str = "e5ffee45c2b9db326814c9692dc594369887ba3b0df5761817820b60f864c8e0";

    fn run(tokens: &[i64], model: &str, ws: i64, salt: &str, cs: usize) -> Resolved {
        resolve(
            &TokenQuery {
                token_ids: tokens,
                model_name: model,
                world_size: ws,
                cache_salt: salt,
            },
            cs,
            RequestLimits::default(),
        )
        .unwrap()
    }

    fn summary(r: &Resolved) -> Vec<(String, i64)> {
        r.keys
            .iter()
            .map(|k| (encode_hex(&k.chunk_hash), k.kv_rank))
            .collect()
    }

    #[test]
    fn none_hash_matches_reference() {
        assert_eq!(
            encode_hex(&none_hash()),
            "7e3eff9ef7613a50340eb12677ee03b83ac759fcba9bb32705f07248d56d473b"
        );
    }

    #[test]
    fn a_chunk_size_beyond_any_request_allocates_nothing_for_it() {
        // 16 GiB of buffer before the chunk size was bounded by the tokens.
        assert!(chunk_hashes(&[1, 2, 3], u32::MAX as usize).is_empty());
    }

    #[test]
    fn golden_v1_partial_chunk_dropped() {
        let r = run(&(1..=10).collect::<Vec<_>>(), "test-model", 1, "", 4);
        assert_eq!(r.chunks, 2);
        assert_eq!(
            summary(&r),
            vec![(H0.into(), 16777472), (H1.into(), 16777472)]
        );
        assert!(
            r.keys
                .iter()
                .all(|k| k.object_group_id == 0 && k.cache_salt.is_empty())
        );
    }

    #[test]
    fn golden_v2_world_size_two() {
        let r = run(&(1..=8).collect::<Vec<_>>(), "test-model", 2, "tenant-a", 4);
        assert_eq!(r.chunks, 2);
        assert_eq!(
            summary(&r),
            vec![
                (H0.into(), 33554944),
                (H0.into(), 33620481),
                (H1.into(), 33554944),
                (H1.into(), 33620481)
            ]
        );
        assert!(r.keys.iter().all(|k| k.cache_salt == "tenant-a"));
    }

    #[test]
    fn golden_v3_and_v4_chunk_256() {
        let r = run(
            &(0..512).collect::<Vec<_>>(),
            "meta-llama/Llama-3.1-8B",
            1,
            "",
            256,
        );
        assert_eq!(
            summary(&r),
            vec![(L0.into(), 16777472), (L1.into(), 16777472)]
        );
        let r = run(
            &(0..256).collect::<Vec<_>>(),
            "meta-llama/Llama-3.1-8B",
            2,
            "",
            256,
        );
        assert_eq!(r.chunks, 1);
        assert_eq!(
            summary(&r),
            vec![(L0.into(), 33554944), (L0.into(), 33620481)]
        );
    }

    #[test]
    fn rank_packing_examples() {
        assert_eq!(kv_rank(1, 0), 16777472);
        assert_eq!(kv_rank(4, 3), 67306499);
    }

    #[test]
    fn validation_order() {
        let q = |tokens: &[i64], model: &str, salt: &str| {
            resolve(
                &TokenQuery {
                    token_ids: tokens,
                    model_name: model,
                    world_size: 1,
                    cache_salt: salt,
                },
                4,
                RequestLimits::default(),
            )
        };
        // Salt checked even without a complete chunk.
        assert!(matches!(
            q(&[1], "m", "a/b"),
            Err(KeyError::SaltChar { .. })
        ));
        // Model checked only when a key is built.
        assert_eq!(q(&[1, 2], "a@b", "").unwrap().chunks, 0);
        assert_eq!(
            q(&[1, 2, 3, 4], "a@b", "").unwrap_err().to_string(),
            "model_name must not contain '@' (got 'a@b')"
        );
        assert!(matches!(
            q(&[1, -1, 3, 4], "m", ""),
            Err(KeyError::TokenOutOfRange(-1))
        ));
        assert!(matches!(
            q(&[1, 1 << 32, 3, 4], "m", ""),
            Err(KeyError::TokenOutOfRange(_))
        ));
        let big_world = |ws: i64, n: usize| {
            resolve(
                &TokenQuery {
                    token_ids: &vec![1; n],
                    model_name: "m",
                    world_size: ws,
                    cache_salt: "",
                },
                1,
                RequestLimits::default(),
            )
        };
        assert!(matches!(
            big_world(256, 1),
            Err(KeyError::WorldSizeTooLarge(256))
        ));
        assert!(matches!(
            big_world(255, 4000),
            Err(KeyError::TooManyKeys { got: 1_020_000, .. })
        ));
        assert_eq!(big_world(255, 3000).unwrap().keys.len(), 765_000);
        let many = vec![0i64; MAX_TOKENS_PER_REQUEST + 1];
        let refused = q(&many, "m", "").unwrap_err();
        assert_eq!(
            refused.to_string(),
            "too many token_ids in a single request (limit=1000000, got=1000001)"
        );
        assert_eq!(refused.limit(), Some("tokens_per_request"));
    }

    #[test]
    fn the_request_bounds_are_the_callers() {
        let limits = RequestLimits {
            max_tokens: 8,
            max_keys: 4,
        };
        let q = |n: usize, ws: i64| {
            resolve(
                &TokenQuery {
                    token_ids: &vec![1; n],
                    model_name: "m",
                    world_size: ws,
                    cache_salt: "",
                },
                2,
                limits,
            )
        };
        assert_eq!(q(8, 1).unwrap().keys.len(), 4);
        let tokens = q(9, 1).unwrap_err();
        assert_eq!(
            tokens.to_string(),
            "too many token_ids in a single request (limit=8, got=9)"
        );
        assert_eq!(tokens.limit(), Some("tokens_per_request"));
        let keys = q(6, 2).unwrap_err();
        assert_eq!(
            keys.to_string(),
            "too many keys in a single request (limit=4, got=6)"
        );
        assert_eq!(keys.limit(), Some("keys_per_request"));
        assert_eq!(q(2, 0).unwrap_err().limit(), None);
    }
}
