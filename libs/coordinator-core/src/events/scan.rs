//! A `POST /events` body read by a hand-written scanner: the usual body
//! (known fields, plain strings, integers) decoded without serde's
//! visitor machinery, which was a third of a 256-entry batch's cost.
//!
//! It recognizes a strict subset of what serde accepts and answers `None`
//! for anything outside it — an escape or control byte in a string, an
//! unknown or repeated field, a float where an integer goes, `null` where
//! serde would refuse it — so the caller decodes those bodies with serde
//! as before. Where it answers, the batches are the ones serde's decoding
//! and the same validation rules give (tests compare the two).

use super::{EntryParts, EventType, Head, validate_parts};
use crate::StorageLevel;
use crate::events::Batch;

/// One entry as scanned; its tokens are a range of the request's token
/// buffer.
struct RawEntry<'a> {
    chunk_hash_hex: &'a str,
    model_name: &'a str,
    kv_rank: i64,
    object_group_id: i64,
    cache_salt: &'a str,
    size_bytes: i64,
    tokens: std::ops::Range<usize>,
    token_offset: i64,
}

/// Decodes and validates `text` (already checked UTF-8); `None` when the
/// body is outside the scanner's subset or breaks a rule.
pub(super) fn decode(text: &str) -> Option<Vec<Batch>> {
    let mut s = Scan { text, i: 0 };
    let mut batches = Vec::new();
    let mut tokens = Vec::new();
    let mut entries = Vec::new();
    s.eat(b'{')?;
    if s.peek()? == b'}' {
        s.i += 1;
    } else {
        let mut seen = false;
        loop {
            match s.string()? {
                "batches" if !seen => seen = true,
                _ => return None,
            }
            s.eat(b':')?;
            s.eat(b'[')?;
            if s.peek()? == b']' {
                s.i += 1;
            } else {
                loop {
                    entries.clear();
                    tokens.clear();
                    let head = s.batch(&mut entries, &mut tokens)?;
                    let parts = entries.iter().map(|e| EntryParts {
                        chunk_hash_hex: e.chunk_hash_hex,
                        model_name: e.model_name,
                        kv_rank: e.kv_rank,
                        object_group_id: e.object_group_id,
                        cache_salt: e.cache_salt,
                        size_bytes: e.size_bytes,
                        token_ids: &tokens[e.tokens.clone()],
                        token_offset: e.token_offset,
                    });
                    batches.push(validate_parts(batches.len(), &head, parts).ok()?);
                    if !s.more(b']')? {
                        break;
                    }
                }
            }
            if !s.more(b'}')? {
                break;
            }
        }
    }
    s.ws();
    (s.i == text.len()).then_some(batches)
}

/// Length of the run of `bytes` before the first `"`, `\` or control
/// byte (what a JSON string holds without an escape), eight bytes at a
/// time: the per-byte loop was most of a batch's scanning.
pub fn plain_len(bytes: &[u8]) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut chunks = bytes.chunks_exact(8);
    let mut at = 0;
    for chunk in chunks.by_ref() {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        let quote = w ^ (ONES * u64::from(b'"'));
        let slash = w ^ (ONES * u64::from(b'\\'));
        // Each term flags its lowest matching byte exactly (a borrow can
        // only flag bytes above a true match), so the lowest flag is the
        // first special byte.
        let flags = ((quote.wrapping_sub(ONES) & !quote)
            | (slash.wrapping_sub(ONES) & !slash)
            | (w.wrapping_sub(ONES * 0x20) & !w))
            & HIGH;
        if flags != 0 {
            return at + (flags.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    let rest = chunks.remainder();
    at + rest
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .unwrap_or(rest.len())
}

struct Scan<'a> {
    text: &'a str,
    i: usize,
}

/// Fields of a batch, for the repeated-field check.
const INSTANCE_ID: u32 = 1;
const INCARNATION: u32 = 1 << 1;
const SEQ: u32 = 1 << 2;
const EVENT_TYPE: u32 = 1 << 3;
const TIER: u32 = 1 << 4;
const BACKEND: u32 = 1 << 5;
const ENTRIES: u32 = 1 << 6;
const SHARED: u32 = 1 << 7;
const TS: u32 = 1 << 8;
const CAPACITY_BYTES: u32 = 1 << 9;
const CAPACITY_REVISION: u32 = 1 << 10;
const DROPPED_EVENTS: u32 = 1 << 11;
const REQUIRED: u32 = INSTANCE_ID | INCARNATION | SEQ | EVENT_TYPE | TIER | BACKEND;
/// The batch fields' names, in the order of their bits.
const HEAD_NAMES: [&str; 12] = [
    "instance_id",
    "incarnation",
    "seq",
    "event_type",
    "tier",
    "backend",
    "entries",
    "shared",
    "ts",
    "capacity_bytes",
    "capacity_revision",
    "dropped_events",
];

/// `lit`'s length if the bytes after a name's opening quote begin with it:
/// `lit` is a field name with its closing quote, so the length is how far
/// the name reaches (what `Scan::object`'s `field` answers with the bit).
#[inline]
fn name_len(rest: &[u8], lit: &'static [u8]) -> Option<usize> {
    rest.starts_with(lit).then_some(lit.len())
}

impl<'a> Scan<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    /// JSON's whitespace.
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.i) {
            self.i += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.bytes().get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// After a member: `true` at a comma (another follows), `false` at
    /// `close`.
    fn more(&mut self, close: u8) -> Option<bool> {
        match self.peek()? {
            b',' => {
                self.i += 1;
                Some(true)
            }
            c if c == close => {
                self.i += 1;
                Some(false)
            }
            _ => None,
        }
    }

    /// A string without escapes or control bytes (which serde would
    /// unescape or refuse).
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let rest = &self.bytes()[start..];
        let len = plain_len(rest);
        if rest.get(len) != Some(&b'"') {
            return None;
        }
        self.i = start + len + 1;
        // Both ends are ASCII quotes, so char boundaries.
        self.text.get(start..start + len)
    }

    /// An integer serde reads exactly into an `i64`: no fraction or
    /// exponent, no leading zero, at most 18 digits.
    fn int(&mut self) -> Option<i64> {
        self.ws();
        let b = self.bytes();
        let negative = b.get(self.i) == Some(&b'-');
        let start = self.i + usize::from(negative);
        // Digits counted and summed in one pass (two passes were ~120
        // instructions a field); at most 18, so the sum cannot overflow.
        let mut end = start;
        let mut n = 0i64;
        while let Some(&c) = b.get(end) {
            let digit = c.wrapping_sub(b'0');
            if digit > 9 {
                break;
            }
            if end - start == 18 {
                return None;
            }
            n = n * 10 + i64::from(digit);
            end += 1;
        }
        let digits = end - start;
        if digits == 0 || (digits > 1 && b[start] == b'0') {
            return None;
        }
        if matches!(b.get(end), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        if negative && n == 0 {
            // serde_json reads `-0` as the float -0.0, which no integer
            // field takes.
            return None;
        }
        self.i = end;
        Some(if negative { -n } else { n })
    }

    /// A number read as serde reads an `f64` (by serde, on the token).
    fn float(&mut self) -> Option<f64> {
        self.ws();
        let start = self.i;
        let len = self.bytes()[start..]
            .iter()
            .take_while(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
            .count();
        self.i = start + len;
        serde_json::from_str(self.text.get(start..start + len)?).ok()
    }

    fn literal(&mut self, word: &str) -> Option<()> {
        self.ws();
        let end = self.i + word.len();
        (self.text.get(self.i..end)? == word).then(|| self.i = end)
    }

    fn bool(&mut self) -> Option<bool> {
        match self.peek()? {
            b't' => self.literal("true").map(|()| true),
            b'f' => self.literal("false").map(|()| false),
            _ => None,
        }
    }

    /// An object of known fields, each at most once: `field` maps the
    /// bytes after a name's opening quote to the name's bit and its length
    /// with the closing quote (`None` for an unknown name: a name with an
    /// escape is one, and serde then reads the body), `value` reads the
    /// value of the field with that bit. The bits seen; `None` for an empty
    /// object or anything outside the subset.
    fn object(
        &mut self,
        field: impl Fn(&[u8]) -> Option<(u32, usize)>,
        mut value: impl FnMut(&mut Self, u32) -> Option<()>,
    ) -> Option<u32> {
        let mut seen = 0u32;
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            return None;
        }
        loop {
            self.eat(b'"')?;
            // Names are matched as bytes, quote included: no string
            // scanned and compared a name (a fifth of a batch's decoding).
            let (bit, len) = field(&self.bytes()[self.i..])?;
            self.i += len;
            if seen & bit != 0 {
                return None;
            }
            seen |= bit;
            self.eat(b':')?;
            value(self, bit)?;
            if !self.more(b'}')? {
                return Some(seen);
            }
        }
    }

    /// An array, `item` reading each element.
    fn array(&mut self, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.i += 1;
            return Some(());
        }
        loop {
            item(self)?;
            if !self.more(b']')? {
                return Some(());
            }
        }
    }

    /// One batch object: its head, its entries pushed to `entries` (their
    /// tokens to `tokens`).
    fn batch(
        &mut self,
        entries: &mut Vec<RawEntry<'a>>,
        tokens: &mut Vec<i64>,
    ) -> Option<Head<'a>> {
        let mut h = Head {
            instance_id: "",
            incarnation: 0,
            seq: 0,
            event_type: EventType::Store,
            tier: StorageLevel::L1,
            backend: "",
            entries: 0,
            shared: false,
            ts: 0.0,
            capacity_bytes: 0,
            capacity_revision: 0,
            dropped_events: None,
        };
        let seen = self.object(
            |name| {
                let bit = match name.first()? {
                    b'i' if name.starts_with(b"instance_id\"") => INSTANCE_ID,
                    b'i' if name.starts_with(b"incarnation\"") => INCARNATION,
                    b's' if name.starts_with(b"seq\"") => SEQ,
                    b's' if name.starts_with(b"shared\"") => SHARED,
                    b'e' if name.starts_with(b"event_type\"") => EVENT_TYPE,
                    b'e' if name.starts_with(b"entries\"") => ENTRIES,
                    b't' if name.starts_with(b"tier\"") => TIER,
                    b't' if name.starts_with(b"ts\"") => TS,
                    b'b' if name.starts_with(b"backend\"") => BACKEND,
                    b'c' if name.starts_with(b"capacity_bytes\"") => CAPACITY_BYTES,
                    b'c' if name.starts_with(b"capacity_revision\"") => CAPACITY_REVISION,
                    b'd' if name.starts_with(b"dropped_events\"") => DROPPED_EVENTS,
                    _ => return None,
                };
                Some((bit, HEAD_NAMES[bit.trailing_zeros() as usize].len() + 1))
            },
            |s, field| {
                match field {
                    INSTANCE_ID => h.instance_id = s.string()?,
                    INCARNATION => h.incarnation = s.int()?,
                    SEQ => h.seq = s.int()?,
                    EVENT_TYPE => {
                        h.event_type = match s.string()? {
                            "store" => EventType::Store,
                            "delete" => EventType::Delete,
                            "access" => EventType::Access,
                            "config" => EventType::Config,
                            _ => return None,
                        }
                    }
                    TIER => {
                        h.tier = match s.string()? {
                            "l1" => StorageLevel::L1,
                            "l2" => StorageLevel::L2,
                            _ => return None,
                        }
                    }
                    BACKEND => h.backend = s.string()?,
                    ENTRIES => s.array(|s| {
                        entries.push(s.entry(tokens)?);
                        Some(())
                    })?,
                    SHARED => h.shared = s.bool()?,
                    TS => h.ts = s.float()?,
                    CAPACITY_BYTES => h.capacity_bytes = s.int()?,
                    CAPACITY_REVISION => h.capacity_revision = s.int()?,
                    _ => {
                        h.dropped_events = if s.peek()? == b'n' {
                            s.literal("null")?;
                            None
                        } else {
                            Some(s.int()?)
                        }
                    }
                }
                Some(())
            },
        )?;
        h.entries = entries.len();
        (seen & REQUIRED == REQUIRED).then_some(h)
    }

    /// One entry object, its key inline.
    fn entry(&mut self, tokens: &mut Vec<i64>) -> Option<RawEntry<'a>> {
        const KEY: u32 = 1;
        const SIZE: u32 = 2;
        const TOKENS: u32 = 4;
        const OFFSET: u32 = 8;
        let first = tokens.len();
        let mut e = RawEntry {
            chunk_hash_hex: "",
            model_name: "",
            kv_rank: 0,
            object_group_id: 0,
            cache_salt: "",
            size_bytes: 0,
            tokens: first..first,
            token_offset: -1,
        };
        let seen = self.object(
            |name| match name.first()? {
                b'k' if let Some(len) = name_len(name, b"key\"") => Some((KEY, len)),
                b's' if let Some(len) = name_len(name, b"size_bytes\"") => Some((SIZE, len)),
                b't' if let Some(len) = name_len(name, b"token_ids\"") => Some((TOKENS, len)),
                b't' if let Some(len) = name_len(name, b"token_offset\"") => Some((OFFSET, len)),
                _ => None,
            },
            |s, field| {
                match field {
                    KEY => s.key(&mut e)?,
                    SIZE => e.size_bytes = s.int()?,
                    TOKENS => {
                        // Only one token list per entry (repeats are
                        // refused), so the range is the tokens pushed here.
                        s.array(|s| {
                            tokens.push(s.int()?);
                            Some(())
                        })?;
                        e.tokens = first..tokens.len();
                    }
                    _ => e.token_offset = s.int()?,
                }
                Some(())
            },
        )?;
        (seen & KEY != 0).then_some(e)
    }

    fn key(&mut self, e: &mut RawEntry<'a>) -> Option<()> {
        const HEX: u32 = 1;
        const MODEL: u32 = 2;
        const RANK: u32 = 4;
        const GROUP: u32 = 8;
        const SALT: u32 = 16;
        let seen = self.object(
            |name| match name.first()? {
                b'c' if let Some(len) = name_len(name, b"chunk_hash_hex\"") => Some((HEX, len)),
                b'm' if let Some(len) = name_len(name, b"model_name\"") => Some((MODEL, len)),
                b'k' if let Some(len) = name_len(name, b"kv_rank\"") => Some((RANK, len)),
                b'o' if let Some(len) = name_len(name, b"object_group_id\"") => Some((GROUP, len)),
                b'c' if let Some(len) = name_len(name, b"cache_salt\"") => Some((SALT, len)),
                _ => None,
            },
            |s, field| {
                match field {
                    HEX => e.chunk_hash_hex = s.string()?,
                    MODEL => e.model_name = s.string()?,
                    RANK => e.kv_rank = s.int()?,
                    GROUP => e.object_group_id = s.int()?,
                    _ => e.cache_salt = s.string()?,
                }
                Some(())
            },
        )?;
        (seen & (HEX | MODEL | RANK) == (HEX | MODEL | RANK)).then_some(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::decode_serde;
    use super::decode;

    const ENTRY: &str = r#"{"key":{"chunk_hash_hex":"00000000000000030000000000000007","model_name":"loadgen-model","kv_rank":0},"size_bytes":65536}"#;

    fn usual(entries: usize) -> String {
        let e = vec![ENTRY; entries].join(",");
        format!(
            r#"{{"batches":[{{"instance_id":"mp-3","incarnation":1,"seq":9,"event_type":"store","tier":"l2","backend":"fs","entries":[{e}]}}]}}"#
        )
    }

    /// Where the scanner answers, serde's decoding gives the same batches;
    /// the usual bodies are answered by the scanner.
    #[test]
    fn scanner_agrees_with_serde() {
        let takes = [
            usual(3),
            usual(0),
            "{}".to_owned(),
            r#"{"batches":[]}"#.to_owned(),
            // Every field, whitespace, an MP server's float stamp.
            r#" { "batches" : [ { "instance_id" : "a" , "incarnation" : 0 , "seq" : 1 , "event_type" : "access" , "tier" : "l1" , "backend" : "" ,
                "entries" : [ { "key" : { "chunk_hash_hex" : "AB" , "model_name" : "m" , "kv_rank" : -7 , "object_group_id" : 2 , "cache_salt" : "tenant" } ,
                "size_bytes" : 0 , "token_ids" : [ 1 , 2 , 4294967296 ] , "token_offset" : -1 } ] , "shared" : true , "ts" : 1733412345.123456 ,
                "capacity_bytes" : 0 , "capacity_revision" : 0 , "dropped_events" : null } ] } "#.to_owned(),
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"config","tier":"l1","backend":"dram","capacity_bytes":100,"capacity_revision":3,"dropped_events":2,"ts":5,"shared":false}]}"#.to_owned(),
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"delete","tier":"l2","backend":"fs","entries":[{"key":{"chunk_hash_hex":"","model_name":"","kv_rank":0},"token_ids":[]}]},{"instance_id":"b","incarnation":0,"seq":2,"event_type":"store","tier":"l1","backend":"x","entries":[]}]}"#.to_owned(),
        ];
        for body in &takes {
            let ours = decode(body);
            assert!(ours.is_some(), "{body}");
            assert_eq!(ours, decode_serde(body), "{body}");
        }
        let big = decode(&usual(256)).unwrap();
        assert_eq!(big[0].entries.len(), 256);
        assert_eq!(
            big[0].entries[255].key.chunk_hash,
            [0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 7]
        );
        // Left to serde: escapes, unknown and repeated fields, floats where
        // integers go, nulls, trailing text; and what breaks a rule.
        let leaves = [
            r#"{"batches":[{"instance_id":"a\u0031","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d"}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d","x":1}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d"}],"x":1}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"seq":2,"event_type":"store","tier":"l1","backend":"d"}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1.0,"seq":1,"event_type":"store","tier":"l1","backend":"d"}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1e0,"seq":1,"event_type":"store","tier":"l1","backend":"d"}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":01,"seq":1,"event_type":"store","tier":"l1","backend":"d"}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":-0,"seq":1,"event_type":"store","tier":"l1","backend":"d"}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":9223372036854775807,"seq":1,"event_type":"store","tier":"l1","backend":"d"}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d","entries":null}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d"}]} x"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d",}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":0,"event_type":"store","tier":"l1","backend":"d"}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"store","tier":"l3","backend":"d"}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"store","tier":"l1"}]}"#,
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"d","entries":[{"key":{"chunk_hash_hex":"0","model_name":"m","kv_rank":0}}]}]}"#,
        ];
        for body in leaves {
            assert_eq!(decode(body), None, "{body}");
        }
        // The first four and the huge integer are serde's to accept.
        assert!(decode_serde(leaves[0]).is_some());
        assert!(decode_serde(leaves[8]).is_some());
    }

    #[test]
    fn plain_len_stops_at_the_first_special_byte() {
        let naive = |b: &[u8]| {
            b.iter()
                .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
                .unwrap_or(b.len())
        };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..40 {
            for _ in 0..200 {
                let b: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        // Mostly plain, sometimes special or high bytes.
                        match x % 16 {
                            0 => b'"',
                            1 => b'\\',
                            2 => (x >> 8) as u8 % 0x20,
                            3 => 0x80 | (x >> 8) as u8,
                            _ => b'!' + (x >> 8) as u8 % 90,
                        }
                    })
                    .collect();
                assert_eq!(super::plain_len(&b), naive(&b), "{b:?}");
            }
        }
    }

    /// Names are matched whole, closing quote included: a longer or
    /// shorter name, or a known one spelled with an escape (which serde
    /// unescapes), is left to serde.
    #[test]
    fn a_field_name_is_matched_whole_and_unescaped() {
        let one = usual(1);
        for (name, edited) in [
            ("\"key\"", "\"k\\u0065y\""),
            ("\"kv_rank\"", "\"kv_ranks\""),
            ("\"kv_rank\"", "\"kv_ran\""),
            ("\"size_bytes\"", "\"size_bytesx\""),
            ("\"seq\"", "\"se\""),
            ("\"chunk_hash_hex\"", "\"chunk_hash_he\\u0078\""),
        ] {
            let body = one.replacen(name, edited, 1);
            assert_ne!(body, one);
            assert_eq!(decode(&body), None, "{body}");
        }
        let escaped = one.replacen("\"model_name\"", "\"model_nam\\u0065\"", 1);
        assert_eq!(decode_serde(&escaped), decode(&one));
        assert!(decode(&one).is_some());
    }

    /// Random edits of valid bodies: wherever the scanner answers, serde
    /// agrees.
    #[test]
    fn scanner_agrees_with_serde_on_edited_bodies() {
        let seeds = [
            usual(2),
            r#"{"batches":[{"instance_id":"a","incarnation":1,"seq":1,"event_type":"store","tier":"l1","backend":"dram","entries":[{"key":{"chunk_hash_hex":"0a","model_name":"m","kv_rank":1,"object_group_id":0,"cache_salt":""},"size_bytes":1,"token_ids":[1,2],"token_offset":0}],"shared":false,"ts":1.5,"dropped_events":0}]}"#.to_owned(),
        ];
        let alphabet: &[u8] = b" \t\n{}[],:\"\\-+.0123456789eEabclnrstu";
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut answered, mut total) = (0, 0);
        for seed in &seeds {
            for _ in 0..4000 {
                let mut b = seed.as_bytes().to_vec();
                for _ in 0..1 + next() % 3 {
                    let at = (next() % b.len() as u64) as usize;
                    let c = alphabet[(next() % alphabet.len() as u64) as usize];
                    match next() % 3 {
                        0 => b[at] = c,
                        1 => b.insert(at, c),
                        _ => {
                            b.remove(at);
                        }
                    }
                }
                let Ok(text) = std::str::from_utf8(&b) else {
                    continue;
                };
                total += 1;
                if let Some(ours) = decode(text) {
                    answered += 1;
                    assert_eq!(Some(ours), decode_serde(text), "{text}");
                }
            }
        }
        // Enough edits keep a body the scanner reads (whitespace, digits).
        assert!(answered > total / 50, "{answered} of {total}");
    }
}
