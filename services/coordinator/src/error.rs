//! HTTP errors and the JSON/query extractors that turn bad input into the
//! reference's status codes (422 for validation, 400/404/502 for handlers).

use axum::Json;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use ic_coordinator_core::events::{FieldError, LocPart};
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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Validation { loc, msg } => (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({"detail": [{"type": "value_error", "loc": loc, "msg": msg, "input": null}]})),
            )
                .into_response(),
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, Json(json!({"detail": m}))).into_response(),
            ApiError::NotFound(m) => (StatusCode::NOT_FOUND, Json(json!({"detail": m}))).into_response(),
            ApiError::UnknownInstance(m) => (StatusCode::NOT_FOUND, Json(json!({"error": m}))).into_response(),
            ApiError::TooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, Json(json!({"detail": m}))).into_response(),
            ApiError::Internal(m) => {
                (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"detail": m}))).into_response()
            }
            ApiError::BadGateway(m) => (StatusCode::BAD_GATEWAY, Json(json!({"detail": m}))).into_response(),
        }
    }
}

/// A JSON body parsed without looking at `Content-Type` (like the reference),
/// with malformed or mistyped input answered as 422.
#[derive(Debug)]
pub struct Body<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::TooLarge(e.body_text())
            } else {
                ApiError::BadRequest(e.body_text())
            }
        })?;
        parse_json(&bytes).map(Body)
    }
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

/// Query parameters with bad values answered as 422.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::try_from_uri(&parts.uri)
            .map(|q| Query(q.0))
            .map_err(|e| ApiError::Validation {
                loc: vec![json!("query")],
                msg: e.body_text(),
            })
    }
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
