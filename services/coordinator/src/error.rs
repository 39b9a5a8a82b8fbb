//! HTTP errors and the JSON/query extractors that turn bad input into the
//! reference's status codes (422 for validation, 400/404/502 for handlers).

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use ic_coordinator_core::events::{FieldError, LocPart};
use ic_coordinator_core::lax::{self, Model, PydError};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Every error a handler answers with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Schema validation failed: 422 with FastAPI's `detail` list.
    #[error("validation failed: {msg}")]
    Validation {
        /// `loc` of the offending input.
        loc: Vec<Value>,
        /// What is wrong.
        msg: String,
    },
    /// 422 with the errors pydantic would report (the reference's models).
    #[error("validation failed: {}", .0.first().map_or("", |e| &*e.msg))]
    Pydantic(Vec<PydError>),
    /// 400 `{"detail": ...}`.
    #[error("{0}")]
    BadRequest(String),
    /// 404 `{"detail": ...}`.
    #[error("{0}")]
    NotFound(String),
    /// 404 `{"error": ...}` (the heartbeat of an unknown instance).
    #[error("{0}")]
    UnknownInstance(String),
    /// 413: the body is larger than the server accepts.
    #[error("{0}")]
    TooLarge(String),
    /// 500 `{"detail": ...}`: a bug or a failed internal task.
    #[error("{0}")]
    Internal(String),
    /// 502 `{"detail": ...}`: an MP server call failed.
    #[error("{0}")]
    BadGateway(String),
    /// 503 `{"detail": ...}` with `Retry-After: 1`: a bounded queue is
    /// full; nothing was done.
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    /// A 422 on a body field.
    pub fn body(field: &str, msg: impl Into<String>) -> Self {
        Self::Validation {
            loc: vec![json!("body"), json!(field)],
            msg: msg.into(),
        }
    }

    /// A 422 on a query parameter.
    pub fn query(param: &str, msg: impl Into<String>) -> Self {
        Self::Validation {
            loc: vec![json!("query"), json!(param)],
            msg: msg.into(),
        }
    }

    /// A 422 located by a core [`FieldError`].
    pub fn from_field(err: FieldError) -> Self {
        let mut loc = vec![json!("body")];
        loc.extend(err.loc.iter().map(|p| match p {
            LocPart::Field(f) => json!(f),
            LocPart::Index(i) => json!(i),
        }));
        Self::Validation { loc, msg: err.msg }
    }
}

/// A 422 body whose errors keep their fields in pydantic's order (`type`,
/// `loc`, `msg`, `input`, `ctx`), as FastAPI writes them: `json!` would
/// sort the keys. (Objects echoed as `input` are still sorted.)
#[derive(serde::Serialize)]
struct Detail<T> {
    detail: T,
}

/// Writes floats as Python's `json.dumps` does (`-1e-05`, `2.5e-07`,
/// `2.0`: [`lax::py_float`]) where serde_json writes `-0.00001` and
/// `2.5e-7`, so an echoed float is the reference's byte for byte.
struct PyFloats;

impl serde_json::ser::Formatter for PyFloats {
    fn write_f64<W: ?Sized + std::io::Write>(&mut self, w: &mut W, x: f64) -> std::io::Result<()> {
        w.write_all(lax::py_float(x).as_bytes())
    }
}

/// A 422 with `detail`, its floats written as Python writes them.
fn unprocessable<T: serde::Serialize>(detail: T) -> Response {
    let mut body = Vec::new();
    let mut writer = serde_json::Serializer::with_formatter(&mut body, PyFloats);
    match serde::Serialize::serialize(&Detail { detail }, &mut writer) {
        Ok(()) => (
            StatusCode::UNPROCESSABLE_ENTITY,
            [(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            )],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"detail": format!("cannot write a 422 body: {e}")})),
        )
            .into_response(),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Validation { loc, msg } => {
                let detail = [PydError {
                    kind: "value_error",
                    loc: loc.into(),
                    msg: msg.into(),
                    input: Value::Null,
                    ctx: None,
                }];
                unprocessable(detail)
            }
            ApiError::Pydantic(detail) => unprocessable(detail),
            ApiError::BadRequest(m) => {
                (StatusCode::BAD_REQUEST, Json(json!({"detail": m}))).into_response()
            }
            ApiError::NotFound(m) => {
                (StatusCode::NOT_FOUND, Json(json!({"detail": m}))).into_response()
            }
            ApiError::UnknownInstance(m) => {
                (StatusCode::NOT_FOUND, Json(json!({"error": m}))).into_response()
            }
            ApiError::TooLarge(m) => {
                (StatusCode::PAYLOAD_TOO_LARGE, Json(json!({"detail": m}))).into_response()
            }
            ApiError::Internal(m) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({"detail": m})),
            )
                .into_response(),
            ApiError::BadGateway(m) => {
                (StatusCode::BAD_GATEWAY, Json(json!({"detail": m}))).into_response()
            }
            ApiError::Unavailable(m) => (
                StatusCode::SERVICE_UNAVAILABLE,
                [(axum::http::header::RETRY_AFTER, "1")],
                Json(json!({"detail": m})),
            )
                .into_response(),
        }
    }
}

/// A request type validated like the reference's pydantic model.
pub trait Schema {
    /// The reference's model: field order, coercions, bounds, validators.
    const MODEL: &'static Model;
    /// Whether a value serde accepted also passes the model's bounds and
    /// validators (cheap checks on the typed value; `false` sends the body
    /// through the model walk, which reports the reference's errors).
    fn valid(&self) -> bool {
        true
    }
}

/// A JSON body validated as FastAPI does: serde first (the fast path),
/// then, for anything serde or [`Schema::valid`] refuses, the reference
/// model's lax coercion and pydantic-shaped 422s. Like FastAPI, a body
/// without a JSON `Content-Type` is handed to the model as text (a 422).
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Schema> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json_type = is_json(req.headers());
        let bytes = read_body(req, state).await?;
        decode_body(json_type, &bytes).map(Body)
    }
}

/// [`Body`]'s decoding of a body already read (for handlers that try a
/// cheaper decoding first and fall back to this one).
pub fn decode_body<T: DeserializeOwned + Schema>(
    json_type: bool,
    bytes: &[u8],
) -> Result<T, ApiError> {
    if json_type
        && let Ok(v) = serde_json::from_slice::<T>(bytes)
        && v.valid()
    {
        return Ok(v);
    }
    let coerced = validate(T::MODEL, json_type, bytes)?;
    serde_json::from_value(coerced).map_err(|e| ApiError::Validation {
        loc: vec![json!("body")],
        msg: e.to_string(),
    })
}

/// Reads the whole body (413 past the limit).
pub async fn read_body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state)
        .await
        .map_err(body_rejection)
}

/// A body that could not be read: 413 past the limit, else 400.
pub fn body_rejection(e: axum::extract::rejection::BytesRejection) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::TooLarge(e.body_text())
    } else {
        ApiError::BadRequest(e.body_text())
    }
}

/// FastAPI's rule (0.11x): only `application/json` or an
/// `application/*+json` body is parsed as JSON; without a `Content-Type`
/// the model gets the raw text.
pub fn is_json(headers: &axum::http::HeaderMap) -> bool {
    let Some(ct) = headers.get(axum::http::header::CONTENT_TYPE) else {
        return false;
    };
    if ct.as_bytes().is_ascii() {
        // The usual header, without the allocations below (same answer:
        // ASCII lowercases and trims the same either way).
        let mime = ct.as_bytes().split(|&b| b == b';').next().unwrap_or(b"");
        // str::trim's ASCII whitespace (it includes the vertical tab).
        let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\x0B' | b'\x0C' | b'\r');
        let start = mime.iter().position(|b| !ws(b)).unwrap_or(mime.len());
        let end = mime.iter().rposition(|b| !ws(b)).map_or(start, |e| e + 1);
        let mime = &mime[start..end];
        let Some(sub) = mime
            .get(..12)
            .filter(|p| p.eq_ignore_ascii_case(b"application/"))
            .map(|_| &mime[12..])
        else {
            return false;
        };
        return sub.eq_ignore_ascii_case(b"json")
            || sub.len() >= 5 && sub[sub.len() - 5..].eq_ignore_ascii_case(b"+json");
    }
    let ct = String::from_utf8_lossy(ct.as_bytes()).to_ascii_lowercase();
    let mime = ct.split(';').next().unwrap_or("").trim();
    mime.strip_prefix("application/")
        .is_some_and(|sub| sub == "json" || sub.ends_with("+json"))
}

/// The slow path: decode as Python would and walk the reference model;
/// `Ok` is the coerced body.
pub fn validate(model: &Model, json_type: bool, bytes: &[u8]) -> Result<Value, ApiError> {
    if !json_type {
        if bytes.is_empty() {
            return Err(ApiError::Pydantic(vec![PydError::missing_body()]));
        }
        return Err(ApiError::Pydantic(lax::raw_body(
            model,
            &String::from_utf8_lossy(bytes),
        )));
    }
    let value = lax::json::decode(bytes).map_err(|e| match e {
        lax::json::DecodeError::Invalid(e) => ApiError::Pydantic(vec![*e]),
        lax::json::DecodeError::NotUtf8 => {
            ApiError::BadRequest("There was an error parsing the body".to_owned())
        }
    })?;
    lax::validate_body(model, &value).map_err(ApiError::Pydantic)
}

/// Parses a JSON document into `T`, mapping every failure to a 422.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let loc = if e.is_syntax() || e.is_eof() {
            vec![json!("body"), json!(offset_of(bytes, e.line(), e.column()))]
        } else {
            vec![json!("body")]
        };
        ApiError::Validation {
            loc,
            msg: e.to_string(),
        }
    })
}

fn offset_of(bytes: &[u8], line: usize, column: usize) -> usize {
    let mut offset = 0;
    for (i, l) in bytes.split(|&b| b == b'\n').enumerate() {
        if i + 1 == line {
            return offset + column.saturating_sub(1);
        }
        offset += l.len() + 1;
    }
    offset
}

/// Query parameters validated like FastAPI's: the last of a repeated name
/// wins, values coerce as pydantic's lax mode does, 422s name the field.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Schema> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let pairs = query_pairs(parts.uri.query().unwrap_or(""));
        let coerced = lax::validate_query(T::MODEL, &pairs).map_err(ApiError::Pydantic)?;
        serde_json::from_value(coerced)
            .map(Query)
            .map_err(|e| ApiError::Validation {
                loc: vec![json!("query")],
                msg: e.to_string(),
            })
    }
}

/// `a=1&b=x%20y` into pairs, form-decoded (`+` is a space).
fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (form_decode(k), form_decode(v))
        })
        .collect()
}

fn form_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("zz"), 16)
                {
                    Ok(x) => {
                        out.push(x);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Default page size of listing endpoints.
pub(crate) fn default_limit() -> i64 {
    1000
}

/// Checks a page request: `offset ≥ 0` and `limit` in 1..=10000.
pub(crate) fn page_bounds(offset: i64, limit: i64) -> Result<(usize, usize), ApiError> {
    let offset =
        usize::try_from(offset).map_err(|_| ApiError::query("offset", "offset must be >= 0"))?;
    let limit = usize::try_from(limit)
        .ok()
        .filter(|l| (1..=10_000).contains(l))
        .ok_or_else(|| ApiError::query("limit", "limit must be in 1..10000"))?;
    Ok((offset, limit))
}
