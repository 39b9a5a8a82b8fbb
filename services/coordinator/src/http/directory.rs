//! `/directory`: lookups by keys or tokens, key listing, stats, blend lookup.

use std::borrow::Cow;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
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
            self.plain(s);
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
            let resolved = resolve(&query, app.settings.chunk_size, app.settings.request_limits)
                .map_err(|e| app.metrics.request_refused(&e))?;
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
    models::b64_strict_len(b64).is_ok_and(|len| len.is_multiple_of(4))
}

/// Blend lookup is off in this build (the reference's default), so a valid
/// request always matches nothing; the request is still validated.
pub(crate) async fn blend_lookup(Body(req): Body<BlendRequest>) -> Result<Json<Value>, ApiError> {
    // As Python decodes it (padding after whole quads, spare bits).
    let len = models::b64_strict_len(&req.tokens_b64)
        .map_err(|e| ApiError::body("tokens_b64", format!("tokens_b64 is not base64: {e}")))?;
    if !len.is_multiple_of(4) {
        return Err(ApiError::body(
            "tokens_b64",
            "tokens_b64 length is not a multiple of 4",
        ));
    }
    if len > 0 && req.model_name.is_none() {
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
mod tests;
