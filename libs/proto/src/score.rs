//! `CandidateScore` (`inferencecache.index.v1.CandidateScore`) with a
//! hand-written encoder, mapped in place of the generated type
//! (`extern_path` in build.rs).
//!
//! Why: a LookupRoute answer carries one per holder plus `best`, and
//! prost's generated encoder writes each field's key and value through a
//! call of `encode_varint` (eight per candidate) and computes each
//! candidate's length twice and its replica's three times: about 460
//! instructions a candidate, a tenth of what a 4-replica LookupRoute costs
//! the server beyond an empty RPC. This writes the keys as the single
//! bytes they are and each length once per message it prefixes. The bytes
//! are prost's exactly (fields in tag order, defaults omitted); decoding is
//! prost's, field by field.

use prost::DecodeError;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{
    DecodeContext, WireType, bool as pbool, double, encode_varint, encoded_len_varint, int32,
    message, skip_field, uint32,
};

use crate::index_v1::{ReplicaRef, Tier};

/// How much of the prompt one replica holds.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct CandidateScore {
    /// Field 1: the replica.
    pub replica: Option<ReplicaRef>,
    /// Field 2: consecutive blocks matched from the start of the prompt.
    pub matched_blocks: u32,
    /// Field 3: matched_blocks × the block size of the match.
    pub matched_tokens: u32,
    /// Field 4: the coldest tier among the matched blocks ([`Tier`]).
    pub tier: i32,
    /// Field 5: the routing score (see docs/routing.md). Higher is better.
    pub score: f64,
    /// Field 6: the match counted is a speculative holder's.
    pub speculative: bool,
    /// Field 7: requests the replica is estimated to be busy with.
    pub load: f64,
}

impl CandidateScore {
    /// `tier` as the enum; the default when the value is not one.
    pub fn tier(&self) -> Tier {
        Tier::try_from(self.tier).unwrap_or_default()
    }

    /// Sets `tier`.
    pub fn set_tier(&mut self, value: Tier) {
        self.tier = value as i32;
    }
}

/// A field's key, one byte for fields 1 to 15.
fn key(tag: u8, wire_type: WireType) -> u8 {
    (tag << 3) | wire_type as u8
}

/// `value` as a varint: most values here fit one or two bytes.
#[inline]
fn put_varint(value: u64, buf: &mut impl BufMut) {
    if value < 0x80 {
        buf.put_u8(value as u8);
    } else {
        encode_varint(value, buf);
    }
}

/// A string field's bytes after its key.
fn string_len(s: &str) -> usize {
    encoded_len_varint(s.len() as u64) + s.len()
}

/// Length of a [`ReplicaRef`]'s body.
fn replica_len(r: &ReplicaRef) -> usize {
    let mut n = 0;
    if !r.replica_id.is_empty() {
        n += 1 + string_len(&r.replica_id);
    }
    if !r.address.is_empty() {
        n += 1 + string_len(&r.address);
    }
    n
}

impl prost::Message for CandidateScore {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        if let Some(r) = &self.replica {
            buf.put_u8(key(1, WireType::LengthDelimited));
            put_varint(replica_len(r) as u64, buf);
            for (tag, s) in [(1, &r.replica_id), (2, &r.address)] {
                if !s.is_empty() {
                    buf.put_u8(key(tag, WireType::LengthDelimited));
                    put_varint(s.len() as u64, buf);
                    buf.put_slice(s.as_bytes());
                }
            }
        }
        if self.matched_blocks != 0 {
            buf.put_u8(key(2, WireType::Varint));
            put_varint(u64::from(self.matched_blocks), buf);
        }
        if self.matched_tokens != 0 {
            buf.put_u8(key(3, WireType::Varint));
            put_varint(u64::from(self.matched_tokens), buf);
        }
        if self.tier != 0 {
            buf.put_u8(key(4, WireType::Varint));
            // An enum is an int32: a negative one takes ten bytes.
            put_varint(i64::from(self.tier) as u64, buf);
        }
        if self.score != 0.0 {
            buf.put_u8(key(5, WireType::SixtyFourBit));
            buf.put_f64_le(self.score);
        }
        if self.speculative {
            buf.put_u8(key(6, WireType::Varint));
            buf.put_u8(1);
        }
        if self.load != 0.0 {
            buf.put_u8(key(7, WireType::SixtyFourBit));
            buf.put_f64_le(self.load);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        let field = |name: &'static str| {
            move |mut error: DecodeError| {
                // The location prost's generated code records.
                error.push("CandidateScore", name);
                error
            }
        };
        match tag {
            1 => message::merge(
                wire_type,
                self.replica.get_or_insert_with(ReplicaRef::default),
                buf,
                ctx,
            )
            .map_err(field("replica")),
            2 => uint32::merge(wire_type, &mut self.matched_blocks, buf, ctx)
                .map_err(field("matched_blocks")),
            3 => uint32::merge(wire_type, &mut self.matched_tokens, buf, ctx)
                .map_err(field("matched_tokens")),
            4 => int32::merge(wire_type, &mut self.tier, buf, ctx).map_err(field("tier")),
            5 => double::merge(wire_type, &mut self.score, buf, ctx).map_err(field("score")),
            6 => pbool::merge(wire_type, &mut self.speculative, buf, ctx)
                .map_err(field("speculative")),
            7 => double::merge(wire_type, &mut self.load, buf, ctx).map_err(field("load")),
            _ => skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let varint = |v: u64| if v == 0 { 0 } else { 1 + encoded_len_varint(v) };
        self.replica.as_ref().map_or(0, |r| {
            let n = replica_len(r);
            1 + encoded_len_varint(n as u64) + n
        }) + varint(u64::from(self.matched_blocks))
            + varint(u64::from(self.matched_tokens))
            + varint(i64::from(self.tier) as u64)
            + if self.score != 0.0 { 9 } else { 0 }
            + usize::from(self.speculative) * 2
            + if self.load != 0.0 { 9 } else { 0 }
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::CandidateScore;
    use crate::index_v1::ReplicaRef;

    /// What prost generates for the same message: the reference (same
    /// name, as the errors name it).
    mod reference {
        use crate::index_v1::ReplicaRef;

        #[derive(Clone, PartialEq, prost::Message)]
        pub(super) struct CandidateScore {
            #[prost(message, optional, tag = "1")]
            pub(super) replica: Option<ReplicaRef>,
            #[prost(uint32, tag = "2")]
            pub(super) matched_blocks: u32,
            #[prost(uint32, tag = "3")]
            pub(super) matched_tokens: u32,
            #[prost(int32, tag = "4")]
            pub(super) tier: i32,
            #[prost(double, tag = "5")]
            pub(super) score: f64,
            #[prost(bool, tag = "6")]
            pub(super) speculative: bool,
            #[prost(double, tag = "7")]
            pub(super) load: f64,
        }
    }
    use reference::CandidateScore as Reference;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Zero, small or large, each a third of the time.
        fn value(&mut self) -> u64 {
            match self.next() % 3 {
                0 => 0,
                1 => self.next() % 200,
                _ => self.next(),
            }
        }
        fn text(&mut self) -> String {
            let n = [0, 1, 12, 200][(self.next() % 4) as usize];
            (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect()
        }
    }

    #[test]
    fn encodes_what_prost_encodes_and_decodes_it_back() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..2_000 {
            let replica = (rng.next() % 4 != 0).then(|| ReplicaRef {
                replica_id: rng.text(),
                address: rng.text(),
            });
            let score = |rng: &mut Rng| match rng.next() % 4 {
                0 => 0.0,
                1 => -0.0,
                2 => f64::from_bits(rng.next()),
                _ => (rng.next() % 1000) as f64 / 7.0,
            };
            let ours = CandidateScore {
                replica: replica.clone(),
                matched_blocks: rng.value() as u32,
                matched_tokens: rng.value() as u32,
                tier: rng.value() as i32,
                score: score(&mut rng),
                speculative: rng.next() % 2 == 0,
                load: score(&mut rng),
            };
            let reference = Reference {
                replica,
                matched_blocks: ours.matched_blocks,
                matched_tokens: ours.matched_tokens,
                tier: ours.tier,
                score: ours.score,
                speculative: ours.speculative,
                load: ours.load,
            };
            let bytes = ours.encode_to_vec();
            assert_eq!(bytes, reference.encode_to_vec(), "case {case}");
            assert_eq!(ours.encoded_len(), bytes.len(), "case {case}");
            let back = CandidateScore::decode(bytes.as_slice()).unwrap_or_default();
            // NaN scores compare unequal: compare their encodings.
            assert_eq!(back.encode_to_vec(), bytes, "case {case}");
        }
    }

    #[test]
    fn decoding_errors_are_prosts() {
        // A truncated double, a wrong wire type, an unknown field skipped.
        for bytes in [
            &[0x29, 1, 2][..],
            &[0x10, 0x80][..],
            &[0x15, 0, 0, 0, 0][..],
        ] {
            let ours = CandidateScore::decode(bytes).map_err(|e| e.to_string());
            let reference = Reference::decode(bytes).map_err(|e| e.to_string());
            assert_eq!(ours.is_err(), reference.is_err(), "{bytes:?}");
            assert_eq!(ours.err(), reference.err(), "{bytes:?}");
        }
        let skipped = CandidateScore::decode(&[0x40, 5, 0x10, 3][..]).unwrap_or_default();
        assert_eq!(skipped.matched_blocks, 3);
    }
}
