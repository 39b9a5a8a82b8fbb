//! Cache object keys and their JSON form (`EncodedObjectKey`).

use serde::{Deserialize, Serialize};

/// Longest accepted `cache_salt`, in characters.
pub const MAX_SALT_LEN: usize = 128;

/// Why a key (or a key's parts) is invalid. The messages follow the
/// reference's wording, Python reprs included, because operators grep for them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// `chunk_hash_hex` is not an even-length hex string.
    #[error("chunk_hash_hex is not valid hex (got '{0}')")]
    BadHex(String),
    /// `model_name` contains `@`.
    #[error("model_name must not contain '@' (got '{0}')")]
    ModelHasAt(String),
    /// `cache_salt` contains a forbidden character.
    #[error("cache_salt must not contain frozenset({{'{ch}'}}) (got {salt})")]
    SaltChar {
        /// The offending character, escaped like Python's repr.
        ch: String,
        /// The salt as sent, as Python's repr (quoted).
        salt: String,
    },
    /// `cache_salt` is longer than [`MAX_SALT_LEN`].
    #[error("cache_salt exceeds max length {MAX_SALT_LEN} (got {0})")]
    SaltTooLong(usize),
    /// `object_group_id` is negative.
    #[error("object_group_id must be >= 0 (got {0})")]
    NegativeGroup(i64),
    /// A token-addressed request carried a token outside u32.
    #[error("token id out of range for u32 (got {0})")]
    TokenOutOfRange(i64),
    /// More token ids than one request may carry.
    #[error("too many token_ids in a single request (limit={limit}, got={got})")]
    TooManyTokens {
        /// The cap.
        limit: usize,
        /// What was sent.
        got: usize,
    },
    /// `world_size` below 1.
    #[error("world_size must be >= 1 (got {0})")]
    BadWorldSize(i64),
    /// `world_size` that does not fit the 8 bits `kv_rank` keeps for it.
    #[error("world_size must be <= 255 (got {0})")]
    WorldSizeTooLarge(i64),
    /// The request would expand to more keys than one request may touch.
    #[error("too many keys in a single request (limit={limit}, got={got})")]
    TooManyKeys {
        /// The cap.
        limit: usize,
        /// chunks × world_size.
        got: usize,
    },
}

impl KeyError {
    /// The request bound passed (the `requests_refused_total` label), when
    /// that is why.
    pub fn limit(&self) -> Option<&'static str> {
        match self {
            Self::TooManyTokens { .. } => Some("tokens_per_request"),
            Self::TooManyKeys { .. } => Some("keys_per_request"),
            _ => None,
        }
    }
}

/// Checks a tenant salt.
pub fn validate_salt(salt: &str) -> Result<(), KeyError> {
    for (ch, repr) in [('@', "@"), ('/', "/"), ('\\', "\\\\"), ('\0', "\\x00")] {
        if salt.contains(ch) {
            return Err(KeyError::SaltChar {
                ch: repr.to_owned(),
                salt: crate::lax::py_str(salt),
            });
        }
    }
    let len = salt.chars().count();
    if len > MAX_SALT_LEN {
        return Err(KeyError::SaltTooLong(len));
    }
    Ok(())
}

/// Checks a model name.
pub fn validate_model(model: &str) -> Result<(), KeyError> {
    if model.contains('@') {
        return Err(KeyError::ModelHasAt(model.to_owned()));
    }
    Ok(())
}

/// Checks an object group.
pub fn validate_group(group: i64) -> Result<(), KeyError> {
    if group < 0 {
        return Err(KeyError::NegativeGroup(group));
    }
    Ok(())
}

/// A key handed to several consumers at once (the keys the directory's
/// bound dropped, told to every controller). A batch's entries hold their
/// keys by value: every view borrows them while the batch applies.
pub type SharedKey = std::sync::Arc<ObjectKey>;

/// A cache key. Equality compares the chunk hash as bytes, so upper- and
/// lowercase hex of the same digest are the same key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// Raw chunk hash bytes (32 for BLAKE3, but any length is accepted).
    pub chunk_hash: Vec<u8>,
    /// Model the KV belongs to.
    pub model_name: String,
    /// Packed world size and rank (see [`crate::resolve::kv_rank`]).
    pub kv_rank: i64,
    /// Object group (0 for the token resolver's keys).
    pub object_group_id: i64,
    /// Tenant identity.
    pub cache_salt: String,
}

impl ObjectKey {
    /// Validates and decodes the JSON form.
    pub fn from_wire(wire: &WireKey) -> Result<Self, KeyError> {
        Self::from_parts(
            &wire.chunk_hash_hex,
            &wire.model_name,
            wire.kv_rank,
            wire.object_group_id,
            &wire.cache_salt,
        )
    }

    /// Validates and decodes the JSON form's fields (borrowed from a
    /// request body, so decoding a batch needs no `WireKey` per entry).
    pub fn from_parts(
        chunk_hash_hex: &str,
        model_name: &str,
        kv_rank: i64,
        object_group_id: i64,
        cache_salt: &str,
    ) -> Result<Self, KeyError> {
        let chunk_hash = decode_hex(chunk_hash_hex)
            .ok_or_else(|| KeyError::BadHex(chunk_hash_hex.to_owned()))?;
        validate_model(model_name)?;
        validate_salt(cache_salt)?;
        validate_group(object_group_id)?;
        Ok(Self {
            chunk_hash,
            model_name: model_name.to_owned(),
            kv_rank,
            object_group_id,
            cache_salt: cache_salt.to_owned(),
        })
    }

    /// The JSON form, with lowercase hex.
    pub fn to_wire(&self) -> WireKey {
        WireKey {
            chunk_hash_hex: encode_hex(&self.chunk_hash),
            model_name: self.model_name.clone(),
            kv_rank: self.kv_rank,
            object_group_id: self.object_group_id,
            cache_salt: self.cache_salt.clone(),
        }
    }

    /// The same key in object group 0 (what pins are stored under).
    pub fn group_zero(&self) -> Self {
        Self {
            object_group_id: 0,
            ..self.clone()
        }
    }

    /// World size encoded in `kv_rank`.
    pub fn world_size(&self) -> i64 {
        (self.kv_rank >> 24) & 0xFF
    }
}

/// `EncodedObjectKey`: the JSON form of a key, as sent and as emitted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireKey {
    /// Hex of the chunk hash.
    pub chunk_hash_hex: String,
    /// Model name.
    pub model_name: String,
    /// Packed rank.
    pub kv_rank: i64,
    /// Object group.
    #[serde(default)]
    pub object_group_id: i64,
    /// Tenant salt.
    #[serde(default)]
    pub cache_salt: String,
}

/// [`WireKey`] with its strings borrowed from the request body where they
/// need no unescaping: the fast decodings of `/events` and
/// `/directory/lookup` read keys this way.
#[derive(Debug, Deserialize)]
pub struct WireKeyRef<'a> {
    /// Hex of the chunk hash.
    #[serde(borrow)]
    pub chunk_hash_hex: std::borrow::Cow<'a, str>,
    /// Model name.
    #[serde(borrow)]
    pub model_name: std::borrow::Cow<'a, str>,
    /// Packed rank.
    pub kv_rank: i64,
    /// Object group.
    #[serde(default)]
    pub object_group_id: i64,
    /// Tenant salt.
    #[serde(default, borrow)]
    pub cache_salt: std::borrow::Cow<'a, str>,
}

impl WireKeyRef<'_> {
    /// The key these parts name.
    pub fn parse(&self) -> Result<ObjectKey, KeyError> {
        ObjectKey::from_parts(
            &self.chunk_hash_hex,
            &self.model_name,
            self.kv_rank,
            self.object_group_id,
            &self.cache_salt,
        )
    }
}

/// Lowercase hex of `bytes`.
pub fn encode_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xF)]));
    }
    out
}

/// Decodes even-length hex of either case; `None` when it is not hex.
pub fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(hex.len() / 2);
    decode_hex_onto(hex.as_bytes(), &mut out).then_some(out)
}

/// Appends the bytes of even-length hex of either case to `out`; `false`,
/// with `out` as it was, when it is not hex. The one hex decoding of a key
/// (a batch's entries and a lookup's keys).
pub(crate) fn decode_hex_onto(hex: &[u8], out: &mut Vec<u8>) -> bool {
    let (pairs, []) = hex.as_chunks::<2>() else {
        return false;
    };
    // Two table reads a byte and one check at the end (the per-digit
    // `match` with an early return was ~410 instructions a 16-byte hash),
    // written by `extend`: one capacity check for the whole hash.
    let start = out.len();
    let mut flags = 0u8;
    out.extend(pairs.iter().map(|&[hi, lo]| {
        let (hi, lo) = (NIBBLE[usize::from(hi)], NIBBLE[usize::from(lo)]);
        flags |= hi | lo;
        hi << 4 | lo
    }));
    // A digit is at most 0x0F; anything else set a high bit.
    if flags > 0x0F {
        out.truncate(start);
        return false;
    }
    true
}

/// Hex digit values; 0xFF for anything else.
pub(crate) const NIBBLE: [u8; 256] = {
    let mut t = [0xFFu8; 256];
    let mut c = 0;
    while c < 10 {
        t[b'0' as usize + c] = c as u8;
        c += 1;
    }
    let mut c = 0;
    while c < 6 {
        t[b'a' as usize + c] = 10 + c as u8;
        t[b'A' as usize + c] = 10 + c as u8;
        c += 1;
    }
    t
};

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(hex: &str, model: &str, salt: &str, group: i64) -> WireKey {
        WireKey {
            chunk_hash_hex: hex.into(),
            model_name: model.into(),
            kv_rank: 16777472,
            object_group_id: group,
            cache_salt: salt.into(),
        }
    }

    #[test]
    fn hex_decodes_every_digit_and_refuses_every_other_byte() {
        assert_eq!(decode_hex(""), Some(vec![]));
        assert_eq!(decode_hex("00fFA9"), Some(vec![0x00, 0xff, 0xa9]));
        assert_eq!(decode_hex("abc"), None);
        for b in 0..=255u8 {
            let digit = char::from(b).to_digit(16);
            for (at, text) in [(0, [b, b'0']), (1, [b'0', b])] {
                let Ok(text) = std::str::from_utf8(&text) else {
                    assert!(digit.is_none());
                    continue;
                };
                let want = digit.map(|d| vec![(d as u8) << (4 * (1 - at))]);
                assert_eq!(decode_hex(text), want, "{text:?}");
            }
        }
    }

    #[test]
    fn hex_case_does_not_change_identity() {
        let a = ObjectKey::from_wire(&wire("ABcd", "m", "", 0)).unwrap();
        let b = ObjectKey::from_wire(&wire("abCD", "m", "", 0)).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_wire().chunk_hash_hex, "abcd");
        assert_eq!(
            ObjectKey::from_wire(&wire("", "m", "", 0))
                .unwrap()
                .chunk_hash,
            Vec::<u8>::new()
        );
    }

    #[test]
    fn invalid_parts_are_rejected() {
        assert!(matches!(
            ObjectKey::from_wire(&wire("abc", "m", "", 0)),
            Err(KeyError::BadHex(_))
        ));
        assert!(matches!(
            ObjectKey::from_wire(&wire("zz", "m", "", 0)),
            Err(KeyError::BadHex(_))
        ));
        assert!(matches!(
            ObjectKey::from_wire(&wire("aa", "a@b", "", 0)),
            Err(KeyError::ModelHasAt(_))
        ));
        assert!(matches!(
            ObjectKey::from_wire(&wire("aa", "m", "", -1)),
            Err(KeyError::NegativeGroup(-1))
        ));
        for bad in ["a@b", "a/b", "a\\b", "a\0b"] {
            assert!(
                matches!(validate_salt(bad), Err(KeyError::SaltChar { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(
            validate_salt("a/b").unwrap_err().to_string(),
            "cache_salt must not contain frozenset({'/'}) (got 'a/b')"
        );
        assert_eq!(
            validate_salt(&"x".repeat(129)).unwrap_err().to_string(),
            "cache_salt exceeds max length 128 (got 129)"
        );
        assert!(validate_salt(&"x".repeat(128)).is_ok());
    }

    #[test]
    fn world_size_reads_back_from_rank() {
        let mut k = ObjectKey::from_wire(&wire("aa", "m", "", 3)).unwrap();
        k.kv_rank = 67306499;
        assert_eq!(k.world_size(), 4);
        assert_eq!(k.group_zero().object_group_id, 0);
    }
}
