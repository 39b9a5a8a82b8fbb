#![allow(clippy::unwrap_used)]

use super::*;

/// The cheap decoding takes a body only when the reference's decoding
/// ([`decode_body`]) takes it as a keys-form lookup, with the same keys;
/// and it takes the usual body.
#[test]
fn keys_form_agrees_with_the_reference_decoding() {
    let k = r#"{"chunk_hash_hex":"00fF","model_name":"m","kv_rank":7}"#;
    let bodies = [
        format!(r#"{{"keys":[{k}]}}"#),
        format!(r#"{{"keys":[{k},{k}],"world_size":2,"extra":[1]}}"#),
        // Escapes, group and salt, whitespace.
        r#" { "keys" : [ {"chunk_hash_hex":"0\u0030","model_name":"m\"x","kv_rank":-1,"object_group_id":3,"cache_salt":"t\u00e9"} ] } "#.to_owned(),
        format!(r#"{{"keys":[{k}],"token_ids":[]}}"#),
        format!(r#"{{"keys":[{k}],"token_ids":null,"model_name":null}}"#),
        // Taken by the reference's path, not the cheap one.
        format!(r#"{{"keys":[{k}],"token_ids":[1]}}"#),
        format!(r#"{{"keys":[{k}],"world_size":0}}"#),
        format!(r#"{{"keys":[{k}],"world_size":"2"}}"#),
        r#"{"keys":[{"chunk_hash_hex":"0","model_name":"m","kv_rank":0}]}"#.to_owned(),
        r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m@x","kv_rank":0}]}"#.to_owned(),
        r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":"0"}]}"#.to_owned(),
        r#"{"keys":[{"chunk_hash_hex":"00","model_name":"m","kv_rank":0,"kv_rank":1}]}"#.to_owned(),
        r#"{"keys":[]}"#.to_owned(),
        r#"{"token_ids":[1,2],"model_name":"m"}"#.to_owned(),
        r#"{}"#.to_owned(),
        "not json".to_owned(),
    ];
    let mut cheap = 0;
    for body in &bodies {
        let reference = decode_body::<LookupRequest>(true, body.as_bytes())
            .ok()
            .and_then(|r| {
                let tokens = r.token_ids.is_some_and(|t| !t.is_empty());
                let keys = r.keys.filter(|k| !k.is_empty() && !tokens)?;
                keys.iter()
                    .map(|w| ObjectKey::from_wire(w).ok())
                    .collect::<Option<Vec<_>>>()
                    .map(|parsed| (keys, parsed))
            });
        let ours = keys_form(true, body.as_bytes());
        // The reverse need not hold: what the reference coerces
        // (`"2"`) takes its path.
        assert!(ours.is_none() || reference.is_some(), "{body}");
        if let (Some((keys, parsed)), Some((wire, reference))) = (ours, reference) {
            assert_eq!(parsed, reference, "{body}");
            for (k, w) in keys.iter().zip(&wire) {
                let e = echo(k);
                assert_eq!(
                    (e.chunk_hash_hex, e.model_name, e.cache_salt),
                    (&*w.chunk_hash_hex, &*w.model_name, &*w.cache_salt)
                );
            }
            cheap += 1;
        }
        assert!(keys_form(false, body.as_bytes()).is_none());
    }
    assert_eq!(cheap, 5);
}

/// A small deterministic generator (xorshift), so failures repeat.
struct Gen(u64);

impl Gen {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len())]
    }

    /// From `good` four times in five, else from `bad`.
    fn choose<'a>(&mut self, good: &[&'a str], bad: &[&'a str]) -> &'a str {
        if self.below(5) > 0 {
            self.pick(good)
        } else {
            self.pick(bad)
        }
    }

    fn ws(&mut self) -> &'static str {
        self.pick(&["", "", "", " ", "\n\t", "\r "])
    }

    fn key(&mut self) -> String {
        let hex = self.choose(
            &[r#""00fF""#, r#""0011223344556677""#, r#""""#],
            &[r#""0""#, r#""zz""#, r#""0\u0030""#, "null", "12"],
        );
        let model = self.choose(
            &[r#""m""#, r#""loadgen-model""#, r#""é""#, r#""o/m""#],
            &[r#""m@x""#, r#""m\"x""#, "null"],
        );
        let rank = self.choose(
            &["0", "7", "-1", "16777472", "123456789012345678"],
            &[
                "-0",
                "01",
                "1.0",
                "1e2",
                r#""3""#,
                "true",
                "9223372036854775807",
                "-123456789012345678",
                // Past i64 on the 19th digit, and 20 digits.
                "9999999999999999999",
                "-9999999999999999999",
                "99999999999999999999",
                "-99999999999999999999",
            ],
        );
        let mut fields = vec![
            format!(r#""chunk_hash_hex":{hex}"#),
            format!(r#""model_name":{model}"#),
            format!(r#""kv_rank":{rank}"#),
        ];
        if self.below(2) == 0 {
            let group = self.choose(&["0", "3"], &["-1", "null", "9999999999999999999"]);
            fields.push(format!(r#""object_group_id":{group}"#));
        }
        if self.below(2) == 0 {
            let salt = self.choose(
                &[r#""""#, r#""t""#],
                &[r#""a/b""#, r#""a@b""#, r#""t\u00e9""#, r#""\\""#, "null"],
            );
            fields.push(format!(r#""cache_salt":{salt}"#));
        }
        match self.below(12) {
            0 => {
                fields.pop();
            }
            1 => fields.push(r#""extra":[1,{"a":null}]"#.into()),
            2 => fields.push(r#""kv_rank":1"#.into()),
            _ => {}
        }
        for i in (1..fields.len()).rev() {
            fields.swap(i, self.below(i + 1));
        }
        let sep = format!("{},{}", self.ws(), self.ws());
        format!("{{{}{}{}}}", self.ws(), fields.join(&sep), self.ws())
    }

    fn body(&mut self) -> String {
        let n = 1 + self.below(3) - usize::from(self.below(10) == 0);
        let keys: Vec<String> = (0..n).map(|_| self.key()).collect();
        let mut fields = vec![format!(r#""keys":[{}]"#, keys.join(","))];
        for (field, values) in [
            ("token_ids", &["null", "[]", "[ ]", "[1]", "{}"][..]),
            ("model_name", &["null", r#""m""#, "1"][..]),
            (
                "world_size",
                &["1", "2", "0", "-1", r#""2""#, "1.0", "-9999999999999999999"][..],
            ),
            ("cache_salt", &[r#""""#, r#""s""#, "null"][..]),
        ] {
            if self.below(3) == 0 {
                fields.push(format!(r#""{field}":{}"#, self.pick(values)));
            }
        }
        if self.below(10) == 0 {
            fields.push(r#""keys":[]"#.into());
        }
        for i in (1..fields.len()).rev() {
            fields.swap(i, self.below(i + 1));
        }
        format!("{}{{{}}}{}", self.ws(), fields.join(","), self.ws())
    }

    /// `body` with one byte deleted, replaced or inserted, or cut.
    fn mutate(&mut self, body: &str) -> Vec<u8> {
        let mut b = body.as_bytes().to_vec();
        if b.is_empty() {
            return b;
        }
        let at = self.below(b.len());
        const BYTES: &[u8] = b"{}[]\":,0-1.e \\u@/x\x00\xff";
        let byte = BYTES[self.below(BYTES.len())];
        match self.below(4) {
            0 => {
                b.remove(at);
            }
            1 => b[at] = byte,
            2 => b.insert(at, byte),
            _ => b.truncate(at),
        }
        b
    }
}

/// The in-place reading ([`read_keys`]) takes a body only when serde's
/// borrowed reading ([`keys_form`], itself held to the reference's
/// decoding above) takes it, with the same keys, the same echo and the
/// same answer bytes; over generated bodies and one-byte mutations.
#[test]
fn the_in_place_reading_agrees_with_serde() {
    // Every good key of the generator stored, in object group 0 and
    // without salt: lookups both hit and miss.
    let mut entries = Vec::new();
    for hex in ["00ff", "0011223344556677", ""] {
        for model in ["m", "loadgen-model", "é", "o/m"] {
            for rank in ["0", "7", "-1", "16777472", "123456789012345678"] {
                entries.push(format!(
                    r#"{{"key":{{"chunk_hash_hex":"{hex}","model_name":"{model}","kv_rank":{rank}}},"size_bytes":5}}"#
                ));
            }
        }
    }
    let store = format!(
        r#"{{"batches":[{{"instance_id":"mp-0","incarnation":1,"seq":1,"event_type":"store","tier":"l2","backend":"fs","entries":[{}]}}]}}"#,
        entries.join(",")
    );
    let mut d = KeyDirectory::new();
    let batches = ic_coordinator_core::events::decode_valid(store.as_bytes());
    for batch in batches.expect("a valid batch") {
        d.apply(&batch);
    }
    let mut g = Gen(0x9e37_79b9_7f4a_7c15);
    let (mut taken, mut left, mut hits) = (0, 0, 0);
    for round in 0..40_000 {
        let body = g.body();
        let bytes = if round % 2 == 0 {
            body.into_bytes()
        } else {
            g.mutate(&body)
        };
        let fast = read_keys(&bytes);
        let slow = keys_form(true, &bytes);
        let Some(fast) = fast else {
            left += usize::from(slow.is_some());
            continue;
        };
        let text = String::from_utf8_lossy(&bytes);
        let (wire, parsed) = slow.unwrap_or_else(|| panic!("serde refuses {text}"));
        assert_eq!(fast.keys.len(), parsed.len(), "{text}");
        let (mut a, mut b) = (Answer::new(0), Answer::new(0));
        a.chunks(parsed.len());
        b.chunks(parsed.len());
        for ((k, w), key) in fast.keys.iter().zip(&wire).zip(&parsed) {
            let e = echo(w);
            assert_eq!(
                (k.chunk_hash_hex, k.model_name, k.cache_salt),
                (e.chunk_hash_hex, e.model_name, e.cache_salt),
                "{text}"
            );
            assert_eq!(
                (k.kv_rank, k.object_group_id),
                (key.kv_rank, key.object_group_id)
            );
            assert_eq!(fast.hash(k), &key.chunk_hash[..], "{text}");
            let view = d.probe_parts(
                fast.hash(k),
                k.model_name,
                k.kv_rank,
                k.object_group_id,
                k.cache_salt,
            );
            hits += usize::from(view.is_some());
            a.entry(&Echo::text(k), true, view, d.tokens_for_hash(fast.hash(k)));
            b.result(&e, &d, key);
        }
        assert_eq!(a.buf, b.buf, "{text}");
        taken += 1;
    }
    // Both readings are exercised: the usual bodies in place, the
    // rest (escapes, coercions, repeated fields...) by serde.
    assert!(
        taken > 1_000 && left > 500 && hits > 300,
        "{taken} {left} {hits}"
    );
}

/// `is_json`'s allocation-free reading of an ASCII header answers as
/// the lowercased, trimmed reading does.
#[test]
fn json_content_types() {
    let reference = |ct: &str| {
        let ct = ct.to_ascii_lowercase();
        let mime = ct.split(';').next().unwrap_or("").trim();
        mime.strip_prefix("application/")
            .is_some_and(|sub| sub == "json" || sub.ends_with("+json"))
    };
    for ct in [
        "application/json",
        "Application/JSON; charset=utf-8",
        " application/json ",
        "application/vnd.api+json",
        "application/+json",
        "application/jsonx",
        "application/",
        "text/json",
        "application/json\t;x",
        "applicationXjson",
        "",
        ";application/json",
    ] {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
        assert_eq!(is_json(&h), reference(ct), "{ct:?}");
    }
    assert!(!is_json(&HeaderMap::new()));
}

#[test]
fn integers_are_written_as_fmt_writes_them() {
    let mut a = Answer::new(0);
    a.buf.clear();
    for n in [0, 7, 10, 99, 1_000_000, u64::MAX] {
        a.int(n);
        a.raw(b" ");
    }
    for n in [0, -1, -10, i64::MIN, i64::MAX] {
        a.signed(n);
        a.raw(b" ");
    }
    let want = [0u64, 7, 10, 99, 1_000_000, u64::MAX]
        .iter()
        .map(|n| format!("{n} "))
        .chain(
            [0i64, -1, -10, i64::MIN, i64::MAX]
                .iter()
                .map(|n| format!("{n} ")),
        )
        .collect::<String>();
    assert_eq!(String::from_utf8(a.buf).unwrap(), want);
}
