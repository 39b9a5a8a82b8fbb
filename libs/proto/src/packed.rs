//! `BlockHashes` (`inferencecache.index.v1.BlockHashes`) with a hand-written
//! decoder for its packed hashes, mapped in place of the generated type
//! (`extern_path` in build.rs).
//!
//! Why: prost reads a packed `fixed64` one `get_u64_le` at a time, growing
//! the vector as it goes — about 84 instructions a hash, a third of a
//! 128-block LookupRoute's server cost. This reads the whole field from the
//! buffer's contiguous chunk into a vector sized once. Only a well-formed
//! packed field (its length a multiple of 8 and inside the buffer) takes the
//! fast path; anything else — an unpacked hash, a wrong wire type, a
//! truncated or over-long length — is left untouched for prost's own
//! `merge_repeated`, so results and errors are prost's exactly.

use prost::DecodeError;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType, decode_varint, fixed64, skip_field};

/// Fingerprints of the prompt's full blocks in order (see
/// docs/fingerprints.md for how to compute them).
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
pub struct BlockHashes {
    /// Field 1, `repeated fixed64 hashes` (packed).
    pub hashes: Vec<u64>,
}

impl prost::Message for BlockHashes {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        fixed64::encode_packed(1, &self.hashes, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        if tag != 1 {
            return skip_field(wire_type, tag, buf, ctx);
        }
        if wire_type == WireType::LengthDelimited && merge_packed(&mut self.hashes, buf) {
            return Ok(());
        }
        fixed64::merge_repeated(wire_type, &mut self.hashes, buf, ctx).map_err(|mut error| {
            // The location prost's generated code records.
            error.push("BlockHashes", "hashes");
            error
        })
    }

    fn encoded_len(&self) -> usize {
        fixed64::encoded_len_packed(1, &self.hashes)
    }

    fn clear(&mut self) {
        self.hashes.clear();
    }
}

/// Appends a packed field's hashes when its length prefix lies in the
/// buffer's first chunk, is a multiple of 8 and fits in what remains (then
/// prost could not fail either); otherwise returns false with `buf`
/// untouched.
fn merge_packed(values: &mut Vec<u64>, buf: &mut impl Buf) -> bool {
    let (prefix, len) = {
        let mut head = buf.chunk();
        let before = head.len();
        let Ok(len) = decode_varint(&mut head) else {
            return false;
        };
        (before - head.len(), len)
    };
    if len % 8 != 0 || len > (buf.remaining() - prefix) as u64 {
        return false;
    }
    buf.advance(prefix);
    let mut left = (len / 8) as usize;
    values.reserve(left);
    while left > 0 {
        let chunk = buf.chunk();
        let whole = (chunk.len() / 8).min(left);
        if whole == 0 {
            // A hash split across two chunks.
            values.push(buf.get_u64_le());
            left -= 1;
            continue;
        }
        values.extend(
            chunk[..whole * 8]
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(<[u8; 8]>::try_from(b).unwrap_or_default())),
        );
        buf.advance(whole * 8);
        left -= whole;
    }
    true
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::BlockHashes;

    /// What prost generates for the same messages: the reference (same
    /// names, as the errors name them).
    mod reference {
        #[derive(Clone, PartialEq, prost::Message)]
        pub(super) struct BlockHashes {
            #[prost(fixed64, repeated, tag = "1")]
            pub(super) hashes: Vec<u64>,
        }

        #[derive(Clone, PartialEq, prost::Message)]
        pub(super) struct Outer {
            #[prost(fixed64, tag = "2")]
            pub(super) prefix: u64,
            #[prost(message, optional, tag = "3")]
            pub(super) hashes: Option<BlockHashes>,
            #[prost(string, tag = "5")]
            pub(super) text: String,
        }
    }

    /// The message inside another, as in LookupRouteRequest (the inner
    /// length checks meet the outer ones).
    #[derive(Clone, PartialEq, prost::Message)]
    struct Outer {
        #[prost(fixed64, tag = "2")]
        prefix: u64,
        #[prost(message, optional, tag = "3")]
        hashes: Option<BlockHashes>,
        #[prost(string, tag = "5")]
        text: String,
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    fn same_as_prost(bytes: &[u8]) -> Result<(), String> {
        let ours = BlockHashes::decode(bytes)
            .map(|m| m.hashes)
            .map_err(|e| e.to_string());
        let theirs = reference::BlockHashes::decode(bytes)
            .map(|m| m.hashes)
            .map_err(|e| e.to_string());
        if ours != theirs {
            return Err(format!(
                "BlockHashes {bytes:?}: ours {ours:?}, prost {theirs:?}"
            ));
        }
        let ours = Outer::decode(bytes)
            .map(|m| (m.prefix, m.hashes.map(|h| h.hashes), m.text))
            .map_err(|e| e.to_string());
        let theirs = reference::Outer::decode(bytes)
            .map(|m| (m.prefix, m.hashes.map(|h| h.hashes), m.text))
            .map_err(|e| e.to_string());
        if ours != theirs {
            return Err(format!("Outer {bytes:?}: ours {ours:?}, prost {theirs:?}"));
        }
        // The same bytes split in two chunks at every point (tonic's
        // buffers need not be contiguous).
        for cut in 0..=bytes.len() {
            let split = || (&bytes[..cut]).chain(&bytes[cut..]);
            let ours = Outer::decode(split())
                .map(|m| (m.prefix, m.hashes.map(|h| h.hashes), m.text))
                .map_err(|e| e.to_string());
            if ours != theirs {
                return Err(format!(
                    "Outer split at {cut} {bytes:?}: ours {ours:?}, prost {theirs:?}"
                ));
            }
        }
        Ok(())
    }

    use prost::bytes::Buf;

    fn valid(rng: &mut Rng) -> Vec<u8> {
        let hashes: Vec<u64> = (0..rng.below(20)).map(|_| rng.next()).collect();
        let outer = reference::Outer {
            prefix: rng.next() % 3,
            hashes: Some(reference::BlockHashes { hashes }),
            text: "ab".repeat(rng.below(3)),
        };
        if rng.below(2) == 0 {
            outer.encode_to_vec()
        } else {
            // The inner message alone.
            outer.hashes.unwrap_or_default().encode_to_vec()
        }
    }

    #[test]
    fn decodes_as_prost_does_on_valid_and_mutated_inputs() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut mutated_errors = 0;
        for round in 0..4_000 {
            let mut bytes = valid(&mut rng);
            if let Err(e) = same_as_prost(&bytes) {
                panic!("valid input, round {round}: {e}");
            }
            for _ in 0..=rng.below(3) {
                match rng.below(5) {
                    0 if !bytes.is_empty() => {
                        let at = rng.below(bytes.len());
                        bytes[at] = rng.next() as u8;
                    }
                    1 => bytes.truncate(rng.below(bytes.len() + 1)),
                    2 => {
                        let at = rng.below(bytes.len() + 1);
                        bytes.insert(at, rng.next() as u8);
                    }
                    3 if !bytes.is_empty() => {
                        let at = rng.below(bytes.len());
                        bytes.remove(at);
                    }
                    _ => {
                        // An unpacked hash, a length-delimited field 1 of odd
                        // length, or another wire type for field 1.
                        let extra: &[u8] = match rng.below(3) {
                            0 => &[0x09, 1, 2, 3, 4, 5, 6, 7, 8],
                            1 => &[0x0a, 3, 1, 2, 3],
                            _ => &[0x08, 7],
                        };
                        let at = rng.below(bytes.len() + 1);
                        bytes.splice(at..at, extra.iter().copied());
                    }
                }
            }
            if reference::Outer::decode(&bytes[..]).is_err() {
                mutated_errors += 1;
            }
            if let Err(e) = same_as_prost(&bytes) {
                panic!("mutated input, round {round}: {e}");
            }
        }
        // The mutations reach prost's error paths, not only valid messages.
        assert!(
            mutated_errors > 500,
            "only {mutated_errors} mutated inputs were errors"
        );
    }

    #[test]
    fn unpacked_hashes_mixed_with_packed_ones_keep_their_order() {
        // Field 1 packed [1, 2], then unpacked 3, then packed [4].
        let mut bytes = vec![0x0a, 16];
        bytes.extend(1u64.to_le_bytes());
        bytes.extend(2u64.to_le_bytes());
        bytes.push(0x09);
        bytes.extend(3u64.to_le_bytes());
        bytes.extend([0x0a, 8]);
        bytes.extend(4u64.to_le_bytes());
        let decoded = BlockHashes::decode(&bytes[..]).map(|m| m.hashes);
        assert_eq!(decoded, Ok(vec![1, 2, 3, 4]));
        assert_eq!(same_as_prost(&bytes), Ok(()));
    }

    #[test]
    fn encodes_as_prost_does() {
        let hashes = vec![0, 1, u64::MAX, 0x0102_0304_0506_0708];
        let ours = BlockHashes {
            hashes: hashes.clone(),
        };
        let theirs = reference::BlockHashes { hashes };
        assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec());
        assert_eq!(ours.encoded_len(), theirs.encoded_len());
        assert_eq!(BlockHashes::default().encode_to_vec(), Vec::<u8>::new());
    }
}
