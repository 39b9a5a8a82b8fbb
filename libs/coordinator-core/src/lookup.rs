//! The plain keys-form `/directory/lookup` body read in one pass, its
//! strings borrowed and each key's hash decoded once into one buffer.
//!
//! [`read_keys`] is a shortcut, not a second definition of the request:
//! it answers only for a body that serde's reading takes as a valid
//! keys-form lookup with the same keys, and `None` for everything else —
//! escapes, unknown or repeated fields, numbers it does not spell the
//! simple way, token lookups, invalid keys — which then takes the
//! service's serde reading with its errors. So it needs no error paths of
//! its own, and an agreement test over generated and mutated bodies holds
//! it to that (services/coordinator, `http::directory`).

use crate::events::plain_len;
use crate::key::{decode_hex_onto, validate_group, validate_model, validate_salt};

/// A key of the request, its strings as the body spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyText<'a> {
    /// Hex as sent (either case).
    pub chunk_hash_hex: &'a str,
    /// Model name.
    pub model_name: &'a str,
    /// Packed rank.
    pub kv_rank: i64,
    /// Object group (0 when absent).
    pub object_group_id: i64,
    /// Tenant salt ("" when absent).
    pub cache_salt: &'a str,
    /// Where the decoded hash sits in [`PlainLookup::hashes`].
    hash: (u32, u32),
}

/// A keys-form lookup [`read_keys`] took. Every string in it is plain
/// JSON text (no `"`, `\` or control byte), so an answer may write it
/// between quotes as it is.
#[derive(Debug, Default)]
pub struct PlainLookup<'a> {
    /// The keys in request order.
    pub keys: Vec<KeyText<'a>>,
    hashes: Vec<u8>,
}

impl PlainLookup<'_> {
    /// The raw chunk hash of `key` (one of [`Self::keys`]).
    pub fn hash(&self, key: &KeyText<'_>) -> &[u8] {
        let (from, to) = key.hash;
        self.hashes.get(from as usize..to as usize).unwrap_or(&[])
    }
}

/// Reads a plain keys-form lookup body; `None` for anything else (see the
/// module docs).
pub fn read_keys(body: &[u8]) -> Option<PlainLookup<'_>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut r = Reader {
        text,
        b: text.as_bytes(),
        i: 0,
    };
    // Sized for the most keys and hash bytes the body can hold: no growth.
    let mut out = PlainLookup {
        keys: Vec::with_capacity(body.len() / MIN_KEY_LEN),
        hashes: Vec::with_capacity(body.len() / 2),
    };
    let mut seen = 0u8;
    r.ws();
    r.eat(b'{')?;
    r.ws();
    if r.peek()? == b'}' {
        return None;
    }
    loop {
        let name = r.string()?;
        r.ws();
        r.eat(b':')?;
        r.ws();
        let bit = match name {
            "keys" => {
                r.keys(&mut out)?;
                1
            }
            "token_ids" => {
                // Only an absent token list: a token lookup (or a request
                // naming both forms) is the serde reading's to judge.
                if !r.literal(b"null") {
                    r.eat(b'[')?;
                    r.ws();
                    r.eat(b']')?;
                }
                2
            }
            "model_name" => {
                if !r.literal(b"null") {
                    r.string()?;
                }
                4
            }
            "world_size" => {
                if r.int()? < 1 {
                    return None;
                }
                8
            }
            "cache_salt" => {
                r.string()?;
                16
            }
            _ => return None,
        };
        if seen & bit != 0 {
            return None;
        }
        seen |= bit;
        r.ws();
        match r.next()? {
            b',' => r.ws(),
            b'}' => break,
            _ => return None,
        }
    }
    r.ws();
    (r.i == r.b.len() && !out.keys.is_empty()).then_some(out)
}

/// The shortest key object: `{"chunk_hash_hex":"","model_name":"","kv_rank":0}`.
const MIN_KEY_LEN: usize = 48;

/// A key object's field.
#[derive(Clone, Copy)]
enum Field {
    Hex,
    Model,
    Rank,
    Group,
    Salt,
}

struct Reader<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    /// JSON's whitespace, as serde_json skips it.
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> bool {
        let found = self
            .b
            .get(self.i..)
            .is_some_and(|rest| rest.starts_with(word));
        if found {
            self.i += word.len();
        }
        found
    }

    /// A string without escapes or control bytes, borrowed.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let rest = self.b.get(self.i..)?;
        let n = plain_len(rest);
        if rest.get(n) != Some(&b'"') {
            return None;
        }
        // Both ends are ASCII quotes of a valid UTF-8 text: char bounds.
        let s = self.text.get(self.i..self.i + n)?;
        self.i += n + 1;
        Some(s)
    }

    /// An integer spelled `0` or `-?[1-9][0-9]{0,17}` (always within i64);
    /// anything else (a fraction, an exponent, `-0`, more digits) is left
    /// to serde.
    fn int(&mut self) -> Option<i64> {
        let negative = self.peek()? == b'-';
        if negative {
            self.i += 1;
        }
        let start = self.i;
        let mut n: i64 = 0;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            // Counted before accumulating: 18 digits always fit i64, a
            // 19th may not (and would panic where overflow is checked).
            if self.i - start == 18 {
                return None;
            }
            n = n * 10 + i64::from(d - b'0');
            self.i += 1;
        }
        let digits = self.i - start;
        let zero_led = self.b.get(start) == Some(&b'0');
        if digits == 0 || (zero_led && (digits > 1 || negative)) {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = self.peek() {
            return None;
        }
        Some(if negative { -n } else { n })
    }

    /// `[key, ...]`, at least one key.
    fn keys(&mut self, out: &mut PlainLookup<'a>) -> Option<()> {
        self.eat(b'[')?;
        self.ws();
        loop {
            let key = self.key(&mut out.hashes)?;
            out.keys.push(key);
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b']' => return Some(()),
                _ => return None,
            }
        }
    }

    /// A key object's field name (the opening quote read); `None` for a
    /// name that is not one, or that is spelled with escapes.
    fn field(&mut self) -> Option<Field> {
        let rest = self.b.get(self.i..)?;
        let (field, len) = match rest.first()? {
            b'c' if rest.starts_with(b"chunk_hash_hex\"") => (Field::Hex, 15),
            b'c' if rest.starts_with(b"cache_salt\"") => (Field::Salt, 11),
            b'm' if rest.starts_with(b"model_name\"") => (Field::Model, 11),
            b'k' if rest.starts_with(b"kv_rank\"") => (Field::Rank, 8),
            b'o' if rest.starts_with(b"object_group_id\"") => (Field::Group, 16),
            _ => return None,
        };
        self.i += len;
        Some(field)
    }

    /// A hex string of even length, decoded onto `out`.
    fn hex(&mut self, out: &mut Vec<u8>) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let len = self.b.get(start..)?.iter().position(|&c| c == b'"')?;
        let digits = self.b.get(start..start + len)?;
        if !decode_hex_onto(digits, out) {
            return None;
        }
        // Both ends are ASCII (a quote, or hex digits): char bounds.
        let s = self.text.get(start..start + len)?;
        self.i = start + len + 1;
        Some(s)
    }

    /// One key object, valid as `ObjectKey::from_parts` judges it.
    fn key(&mut self, hashes: &mut Vec<u8>) -> Option<KeyText<'a>> {
        let (mut hex, mut model, mut rank, mut group, mut salt) = (None, None, None, None, None);
        let mut hash = (0, 0);
        self.eat(b'{')?;
        self.ws();
        loop {
            self.eat(b'"')?;
            let field = self.field()?;
            self.ws();
            self.eat(b':')?;
            self.ws();
            let fresh = match field {
                Field::Hex => {
                    let from = u32::try_from(hashes.len()).ok()?;
                    let h = self.hex(hashes)?;
                    hash = (from, u32::try_from(hashes.len()).ok()?);
                    hex.replace(h).is_none()
                }
                Field::Model => model.replace(self.string()?).is_none(),
                Field::Rank => rank.replace(self.int()?).is_none(),
                Field::Group => group.replace(self.int()?).is_none(),
                Field::Salt => salt.replace(self.string()?).is_none(),
            };
            if !fresh {
                return None;
            }
            self.ws();
            match self.next()? {
                b',' => self.ws(),
                b'}' => break,
                _ => return None,
            }
        }
        let (chunk_hash_hex, model_name, kv_rank) = (hex?, model?, rank?);
        let (object_group_id, cache_salt) = (group.unwrap_or(0), salt.unwrap_or(""));
        // `ObjectKey::from_parts`'s own checks, on the borrowed strings (an
        // invalid key is rare, and then serde's reading names the error).
        validate_model(model_name).ok()?;
        validate_salt(cache_salt).ok()?;
        validate_group(object_group_id).ok()?;
        Some(KeyText {
            chunk_hash_hex,
            model_name,
            kv_rank,
            object_group_id,
            cache_salt,
            hash,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{MAX_SALT_LEN, ObjectKey, decode_hex};

    #[test]
    fn reads_the_plain_body_and_its_hashes() {
        let body = br#" {"keys": [ {"chunk_hash_hex":"00fF","model_name":"m","kv_rank":-7},
            {"cache_salt":"t","object_group_id":3,"kv_rank":0,"model_name":"n","chunk_hash_hex":""}],
            "world_size":2, "token_ids":null, "model_name":null, "cache_salt":"x"} "#;
        let got = read_keys(body).unwrap();
        assert_eq!(got.keys.len(), 2);
        let (a, b) = (&got.keys[0], &got.keys[1]);
        assert_eq!(
            (
                a.chunk_hash_hex,
                a.model_name,
                a.kv_rank,
                a.object_group_id,
                a.cache_salt
            ),
            ("00fF", "m", -7, 0, "")
        );
        assert_eq!(got.hash(a), &[0x00, 0xff]);
        assert_eq!(
            (b.model_name, b.kv_rank, b.object_group_id, b.cache_salt),
            ("n", 0, 3, "t")
        );
        assert_eq!(got.hash(b), b"");
        let key = ObjectKey::from_parts(a.chunk_hash_hex, a.model_name, a.kv_rank, 0, "").unwrap();
        assert_eq!(key.chunk_hash, got.hash(a));
    }

    #[test]
    fn leaves_everything_else_to_serde() {
        let k = r#"{"chunk_hash_hex":"00","model_name":"m","kv_rank":0}"#;
        for body in [
            String::new(),
            "{}".into(),
            r#"{"keys":[]}"#.into(),
            format!(r#"{{"keys":[{k}],"keys":[{k}]}}"#),
            format!(r#"{{"keys":[{k}],"extra":1}}"#),
            format!(r#"{{"keys":[{k}],"token_ids":[1]}}"#),
            format!(r#"{{"keys":[{k}],"world_size":0}}"#),
            format!(r#"{{"keys":[{k}],"world_size":1.0}}"#),
            format!(r#"{{"keys":[{k}],"world_size":"1"}}"#),
            format!(r#"{{"keys":[{k}]}} x"#),
            format!(r#"{{"keys":[{k}],}}"#),
            r#"{"keys":[{"chunk_hash_hex":"0","model_name":"m","kv_rank":0}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"0g","model_name":"m","kv_rank":0}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m@","kv_rank":0}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":0,"cache_salt":"a/b"}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":0,"object_group_id":-1}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":-0}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":01}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":1e2}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":1234567890123456789}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":9999999999999999999}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":-9999999999999999999}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":99999999999999999999}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":0,"object_group_id":9999999999999999999}]}"#.into(),
            format!(r#"{{"keys":[{k}],"world_size":9999999999999999999}}"#),
            format!(r#"{{"keys":[{k}],"world_size":-99999999999999999999}}"#),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m\u0040","kv_rank":0}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m"}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":0,"kv_rank":0}]}"#.into(),
            r#"{"keys":[{"chunk_hash_hex":"00","model_name":null,"kv_rank":0}]}"#.into(),
        ] {
            assert!(read_keys(body.as_bytes()).is_none(), "{body}");
        }
        assert!(read_keys(&[b'{', 0xff, b'}']).is_none());
        let long = format!(
            r#"{{"keys":[{{"chunk_hash_hex":"00","model_name":"m","kv_rank":0,"cache_salt":"{}"}}]}}"#,
            "é".repeat(MAX_SALT_LEN)
        );
        assert!(read_keys(long.as_bytes()).is_some());
        let longer = long.replace("é\"", "éé\"");
        assert!(read_keys(longer.as_bytes()).is_none());
    }

    #[test]
    fn hex_decodes_as_the_key_does() {
        for hex in [
            "",
            "00",
            "aBcD",
            "0123456789abcdefABCDEF00",
            "abc",
            "zz",
            "é0",
            "0\\u0030",
        ] {
            let text = format!("\"{hex}\"");
            let mut r = Reader {
                text: &text,
                b: text.as_bytes(),
                i: 0,
            };
            let mut out = vec![9];
            let ours = r.hex(&mut out).map(|h| (h, out[1..].to_vec()));
            assert_eq!(ours.as_ref().map(|o| o.1.clone()), decode_hex(hex), "{hex}");
            assert!(ours.is_none_or(|(h, _)| h == hex && r.i == text.len()));
        }
    }

    #[test]
    fn names_with_slashes_and_salts_with_at_signs() {
        let body = br#"{"keys":[{"chunk_hash_hex":"00","model_name":"org/model-7b","kv_rank":0}]}"#;
        assert_eq!(read_keys(body).unwrap().keys[0].model_name, "org/model-7b");
        let salted = br#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":0,"cache_salt":"a@b"}]}"#;
        assert!(read_keys(salted).is_none());
    }
}
