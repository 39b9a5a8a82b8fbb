//! `/directory`: lookups by keys or tokens, key listing, stats, blend lookup.

use std::borrow::Cow;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use ic_coordinator_core::LevelFilter;
use ic_coordinator_core::directory::{KeyDirectory, KeyFilter, KeyView};
use ic_coordinator_core::key::{ObjectKey, WireKey, WireKeyRef as KeyRef};
use ic_coordinator_core::lookup::{KeyText, read_keys};
use ic_coordinator_core::resolve::{TokenQuery, resolve};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{
    ApiError, Body, Query, Schema, decode_body, default_limit, is_json, page_bounds,
};
use crate::state::App;
use ic_coordinator_core::lax::{Model, models};

#[derive(Debug, Deserialize)]
pub(crate) struct LookupRequest {
    #[serde(default)]
    keys: Option<Vec<WireKey>>,
    #[serde(default)]
    token_ids: Option<Vec<i64>>,
    #[serde(default)]
    model_name: Option<String>,
    #[serde(default = "one")]
    world_size: i64,
    #[serde(default)]
    cache_salt: String,
}

impl Schema for LookupRequest {
    const MODEL: &'static Model = &models::LOOKUP;
    fn valid(&self) -> bool {
        let keys = self.keys.as_ref().is_some_and(|k| !k.is_empty());
        let tokens = self.token_ids.as_ref().is_some_and(|t| !t.is_empty());
        self.world_size >= 1
            && keys != tokens
            && (!tokens || self.model_name.as_ref().is_some_and(|m| !m.is_empty()))
            && self
                .keys
                .iter()
                .flatten()
                .all(|k| ObjectKey::from_wire(k).is_ok())
    }
}

fn one() -> i64 {
    1
}

/// A lookup answer written straight to JSON text while the views are read:
/// no `Value` tree per result. Field order is alphabetical, as the `Value`
/// maps it replaced wrote it, so the bytes are unchanged.
struct Answer {
    buf: Vec<u8>,
    results: usize,
}

/// A key as the answer echoes it: the request's own spelling (the hex as
/// sent, not normalized).
struct Echo<'a> {
    cache_salt: &'a str,
    chunk_hash_hex: &'a str,
    kv_rank: i64,
    model_name: &'a str,
    object_group_id: i64,
}

impl<'a> Echo<'a> {
    fn text(k: &KeyText<'a>) -> Self {
        Self {
            cache_salt: k.cache_salt,
            chunk_hash_hex: k.chunk_hash_hex,
            kv_rank: k.kv_rank,
            model_name: k.model_name,
            object_group_id: k.object_group_id,
        }
    }

    fn of(w: &'a WireKey) -> Self {
        Self {
            cache_salt: &w.cache_salt,
            chunk_hash_hex: &w.chunk_hash_hex,
            kv_rank: w.kv_rank,
            model_name: &w.model_name,
            object_group_id: w.object_group_id,
        }
    }
}

impl Answer {
    fn new(keys: usize) -> Self {
        let mut buf = Vec::with_capacity(64 + keys * 320);
        buf.extend_from_slice(b"{\"chunks\":");
        Self { buf, results: 0 }
    }

    /// Writes `"chunks"` and opens the results (once, first).
    fn chunks(&mut self, chunks: usize) {
        self.int(chunks as u64);
        self.buf.extend_from_slice(b",\"results\":[");
    }

    /// Decimal digits without `fmt` (its machinery was ~10 % of a lookup).
    fn int(&mut self, mut n: u64) {
        // Most of an answer's numbers (counts, ranks, groups) are one digit.
        if n < 10 {
            self.buf.push(b'0' + n as u8);
            return;
        }
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.buf.extend_from_slice(&digits[i..]);
    }

    fn signed(&mut self, n: i64) {
        if n < 0 {
            self.buf.push(b'-');
        }
        self.int(n.unsigned_abs());
    }

    /// A JSON string, escaped as serde_json escapes it; one that needs no
    /// escape (the usual name or hex) is copied as it is.
    fn string(&mut self, s: &str) {
        if ic_coordinator_core::events::plain_len(s.as_bytes()) < s.len() {
            // Writing a str into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut self.buf, s);
        } else {
            self.buf.reserve(s.len() + 2);
            self.buf.push(b'"');
            self.buf.extend_from_slice(s.as_bytes());
            self.buf.push(b'"');
        }
    }

    fn raw(&mut self, s: &[u8]) {
        self.buf.extend_from_slice(s);
    }

    /// A JSON string known to need no escape (a plain string of the
    /// request, [`ic_coordinator_core::lookup::PlainLookup`]): copied between quotes.
    fn plain(&mut self, s: &str) {
        self.buf.reserve(s.len() + 2);
        self.buf.push(b'"');
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(b'"');
    }

    fn result(&mut self, key: &Echo<'_>, d: &KeyDirectory, object: &ObjectKey) {
        // Borrowed from the directory, already in the answer's order: no
        // materialized entry, no name's reference count touched, and for
        // a key with one placement no allocation.
        let view = d.probe(object);
        self.entry(key, false, view, d.tokens_for_hash(&object.chunk_hash));
    }

    /// One result; `plain`: the echoed strings need no escape.
    fn entry(&mut self, key: &Echo<'_>, plain: bool, view: Option<KeyView<'_>>, tokens: &[u32]) {
        if self.results > 0 {
            self.buf.push(b',');
        }
        self.results += 1;
        let access_count = view.map_or(0, |v| v.access_count());
        let placements = view.into_iter().flat_map(|v| v.placements_by_owner());
        let echo = |a: &mut Self, s: &str| if plain { a.plain(s) } else { a.string(s) };
        // Field names are fixed text; only the values are escaped.
        self.raw(b"{\"access_count\":");
        self.int(access_count);
        self.raw(b",\"key\":{\"cache_salt\":");
        echo(self, key.cache_salt);
        self.raw(b",\"chunk_hash_hex\":");
        echo(self, key.chunk_hash_hex);
        self.raw(b",\"kv_rank\":");
        self.signed(key.kv_rank);
        self.raw(b",\"model_name\":");
        echo(self, key.model_name);
        self.raw(b",\"object_group_id\":");
        self.signed(key.object_group_id);
        self.raw(b"},\"placements\":[");
        for (i, p) in placements.enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            self.raw(b"{\"backend\":");
            self.string(p.backend);
            self.raw(b",\"incarnation\":");
            self.int(p.incarnation);
            self.raw(b",\"instance_id\":");
            self.string(p.instance_id);
            self.raw(b",\"shared\":");
            self.raw(if p.shared { b"true" } else { b"false" });
            self.raw(b",\"size_bytes\":");
            self.int(p.size_bytes);
            self.raw(b",\"tier\":\"");
            self.raw(p.tier.as_str().as_bytes());
            self.raw(b"\"}");
        }
        self.raw(b"],\"token_ids\":[");
        for (i, t) in tokens.iter().enumerate() {
            if i > 0 {
                self.buf.push(b',');
            }
            self.int(u64::from(*t));
        }
        self.raw(b"]}");
    }

    fn finish(mut self) -> Response {
        self.buf.extend_from_slice(b"]}");
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            self.buf,
        )
            .into_response()
    }
}

/// [`LookupRequest`] with its strings borrowed from the body (owned only
/// when they hold escapes): the same fields, types and defaults, so serde
/// accepts exactly the same bodies.
#[derive(Deserialize)]
struct LookupRef<'a> {
    #[serde(default, borrow)]
    keys: Option<Vec<KeyRef<'a>>>,
    #[serde(default)]
    token_ids: Option<Vec<i64>>,
    #[serde(default)]
    model_name: Option<String>,
    #[serde(default = "one")]
    world_size: i64,
    #[serde(default, borrow)]
    cache_salt: Cow<'a, str>,
}

/// What the lookup answer echoes of a request's key.
fn echo<'a>(key: &'a KeyRef<'a>) -> Echo<'a> {
    Echo {
        cache_salt: &key.cache_salt,
        chunk_hash_hex: &key.chunk_hash_hex,
        kv_rank: key.kv_rank,
        model_name: &key.model_name,
        object_group_id: key.object_group_id,
    }
}

/// A keys-form lookup the cheap decoding accepted: the request's keys and
/// each one parsed.
type KeysForm<'a> = (Vec<KeyRef<'a>>, Vec<ObjectKey>);

/// The cheap decoding: UTF-8 checked once, strings borrowed, each key
/// parsed once. `None` for anything but a valid keys-form request (the
/// token form, a wrong type, an invalid key...), which then takes the
/// reference's validation ([`decode_body`]) with its errors.
fn keys_form(json_type: bool, bytes: &[u8]) -> Option<KeysForm<'_>> {
    if !json_type {
        return None;
    }
    let text = std::str::from_utf8(bytes).ok()?;
    let req: LookupRef<'_> = serde_json::from_str(text).ok()?;
    let keys = req.keys.filter(|k| !k.is_empty())?;
    if req.token_ids.is_some_and(|t| !t.is_empty()) || req.world_size < 1 {
        return None;
    }
    let _ = (req.model_name, req.cache_salt);
    let parsed = keys
        .iter()
        .map(|k| k.parse().ok())
        .collect::<Option<Vec<_>>>()?;
    Some((keys, parsed))
}

pub(crate) async fn lookup(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body.map_err(crate::error::body_rejection)?;
    let json_type = is_json(&headers);
    // The usual body, read in place; then serde's borrowed reading; then
    // the reference's validation with its errors. Each takes only bodies
    // the next would take the same way.
    if let Some(req) = json_type.then(|| read_keys(&bytes)).flatten() {
        let mut answer = Answer::new(req.keys.len());
        answer.chunks(req.keys.len());
        app.views.read(|views| {
            let d = &views.directory;
            for k in &req.keys {
                let hash = req.hash(k);
                let view = d.probe_parts(
                    hash,
                    k.model_name,
                    k.kv_rank,
                    k.object_group_id,
                    k.cache_salt,
                );
                answer.entry(&Echo::text(k), true, view, d.tokens_for_hash(hash));
            }
        });
        return Ok(answer.finish());
    }
    if let Some((keys, parsed)) = keys_form(json_type, &bytes) {
        let mut answer = Answer::new(parsed.len());
        answer.chunks(parsed.len());
        app.views.read(|views| {
            for (wire, key) in keys.iter().zip(&parsed) {
                answer.result(&echo(wire), &views.directory, key);
            }
        });
        return Ok(answer.finish());
    }
    let req: LookupRequest = decode_body(json_type, &bytes)?;
    let keys = req.keys.filter(|k| !k.is_empty());
    let tokens = req.token_ids.filter(|t| !t.is_empty());
    if req.world_size < 1 {
        return Err(ApiError::body("world_size", "world_size must be >= 1"));
    }
    match (keys, tokens) {
        (Some(_), Some(_)) | (None, None) => Err(ApiError::body(
            "keys",
            "exactly one of 'keys' or 'token_ids' must be supplied",
        )),
        (Some(wire_keys), None) => {
            let parsed = wire_keys
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    ObjectKey::from_wire(w).map_err(|e| ApiError::Validation {
                        loc: vec![json!("body"), json!("keys"), json!(i)],
                        msg: e.to_string(),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut answer = Answer::new(parsed.len());
            answer.chunks(parsed.len());
            app.views.read(|views| {
                for (wire, key) in wire_keys.iter().zip(&parsed) {
                    answer.result(&Echo::of(wire), &views.directory, key);
                }
            });
            Ok(answer.finish())
        }
        (None, Some(token_ids)) => {
            let Some(model_name) = req.model_name else {
                return Err(ApiError::body(
                    "model_name",
                    "model_name is required with token_ids",
                ));
            };
            let query = TokenQuery {
                token_ids: &token_ids,
                model_name: &model_name,
                world_size: req.world_size,
                cache_salt: &req.cache_salt,
            };
            let resolved = resolve(&query, app.settings.chunk_size)
                .map_err(|e| ApiError::BadRequest(e.to_string()))?;
            let mut answer = Answer::new(resolved.keys.len());
            answer.chunks(resolved.chunks);
            app.views.read(|views| {
                let d = &views.directory;
                for key in resolved.keys.iter().flat_map(|k| d.expand_groups(k)) {
                    let wire = key.to_wire();
                    answer.result(&Echo::of(&wire), d, &key);
                }
            });
            Ok(answer.finish())
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct KeysQuery {
    #[serde(default)]
    tier: LevelFilter,
    #[serde(default)]
    instance_id: String,
    #[serde(default)]
    backend: String,
    #[serde(default)]
    offset: i64,
    #[serde(default = "default_limit")]
    limit: i64,
}

impl Schema for KeysQuery {
    const MODEL: &'static Model = &models::KEYS_QUERY;
}

pub(crate) async fn keys(
    State(app): State<App>,
    Query(q): Query<KeysQuery>,
) -> Result<Json<Value>, ApiError> {
    let (offset, limit) = page_bounds(q.offset, q.limit)?;
    let filter = KeyFilter {
        tier: q.tier,
        instance_id: &q.instance_id,
        backend: &q.backend,
    };
    let (total, keys) = app.views.read(|views| {
        let (total, page) = views.directory.list(&filter, offset, limit);
        let keys: Vec<Value> = page
            .into_iter()
            .map(|k| {
                json!({"key": k.key.to_wire(), "placements": k.placements,
                       "num_tokens": k.num_tokens, "access_count": k.access_count})
            })
            .collect();
        (total, keys)
    });
    Ok(Json(json!({"total": total, "keys": keys})))
}

pub(crate) async fn stats(State(app): State<App>) -> Json<Value> {
    let s = app.views.read(|v| v.directory.stats());
    Json(json!({
        "num_keys": s.num_keys,
        "num_placements": s.num_placements,
        "l1_keys_by_instance": s.l1_keys_by_instance,
        "blend": {"num_contents": 0, "num_chunks": 0, "num_claims": 0, "num_namespaces": 0, "table_size": 1024},
        "l1_count": s.l1.count,
        "l1_size_bytes": s.l1.bytes,
        "l2_count": s.l2.count,
        "l2_size_bytes": s.l2.bytes,
    }))
}

#[derive(Debug, Deserialize)]
pub(crate) struct BlendRequest {
    #[serde(default)]
    tokens_b64: String,
    #[serde(default)]
    model_name: Option<String>,
    #[serde(default = "one")]
    world_size: i64,
    #[serde(default)]
    #[allow(dead_code)]
    cache_salt: String,
}

impl Schema for BlendRequest {
    const MODEL: &'static Model = &models::BLEND;
    fn valid(&self) -> bool {
        // The base64 and namespace checks stay in the handler; only a
        // clean request takes the fast path.
        self.world_size >= 1
            && (self.tokens_b64.is_empty()
                || self.model_name.as_ref().is_some_and(|m| !m.is_empty()))
            && models_tokens_ok(&self.tokens_b64)
    }
}

fn models_tokens_ok(b64: &str) -> bool {
    base64::engine::general_purpose::STANDARD
        .decode(b64.as_bytes())
        .is_ok_and(|raw| raw.len().is_multiple_of(4))
}

/// Blend lookup is off in this build (the reference's default), so a valid
/// request always matches nothing; the request is still validated.
pub(crate) async fn blend_lookup(Body(req): Body<BlendRequest>) -> Result<Json<Value>, ApiError> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(req.tokens_b64.as_bytes())
        .map_err(|e| ApiError::body("tokens_b64", format!("tokens_b64 is not base64: {e}")))?;
    if !raw.len().is_multiple_of(4) {
        return Err(ApiError::body(
            "tokens_b64",
            "tokens_b64 length is not a multiple of 4",
        ));
    }
    if !raw.is_empty() && req.model_name.is_none() {
        return Err(ApiError::body(
            "model_name",
            "model_name is required with tokens_b64",
        ));
    }
    if req.world_size < 1 {
        return Err(ApiError::body("world_size", "world_size must be >= 1"));
    }
    Ok(Json(json!({"matches": []})))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
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
}
