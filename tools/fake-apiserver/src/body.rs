//! The body every answer of the fake has.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

/// The body of every answer (a JSON document, or a watch's stream of lines).
pub type Body = UnsyncBoxBody<Bytes, Infallible>;
