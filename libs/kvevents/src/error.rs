//! What goes wrong decoding the engines' KV-event wire.

/// Why a payload (or one event in it) could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The input ended inside a value (or a length claimed more bytes than exist).
    #[error("truncated msgpack at byte {offset}")]
    Truncated {
        /// Where decoding stopped.
        offset: usize,
    },
    /// A length does not fit this platform.
    #[error("length too large at byte {offset}")]
    TooLarge {
        /// Where decoding stopped.
        offset: usize,
    },
    /// The reserved msgpack marker 0xc1.
    #[error("invalid msgpack marker at byte {offset}")]
    InvalidMarker {
        /// Where decoding stopped.
        offset: usize,
    },
    /// Nesting deeper than any engine produces.
    #[error("msgpack nested too deep at byte {offset}")]
    TooDeep {
        /// Where decoding stopped.
        offset: usize,
    },
    /// Bytes left over after the batch.
    #[error("trailing bytes after the batch at byte {offset}")]
    TrailingBytes {
        /// Where the batch ended.
        offset: usize,
    },
    /// A field had the wrong msgpack type.
    #[error("{field}: expected {expected}, found {found}")]
    TypeMismatch {
        /// The field.
        field: &'static str,
        /// What was expected.
        expected: &'static str,
        /// What arrived.
        found: &'static str,
    },
    /// The outer batch has the wrong shape.
    #[error("malformed batch: {0}")]
    BadBatch(&'static str),
    /// An event has the wrong shape.
    #[error("malformed event: {0}")]
    BadEvent(&'static str),
    /// A required field is absent.
    #[error("missing field {0}")]
    MissingField(&'static str),
    /// A number does not fit its field.
    #[error("{0}: value out of range")]
    OutOfRange(&'static str),
    /// A string is not UTF-8.
    #[error("{0}: invalid UTF-8")]
    InvalidUtf8(&'static str),
}

impl WireError {
    /// A fixed, low-cardinality name for metrics labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "truncated",
            Self::TooLarge { .. } => "too_large",
            Self::InvalidMarker { .. } => "invalid_marker",
            Self::TooDeep { .. } => "too_deep",
            Self::TrailingBytes { .. } => "trailing_bytes",
            Self::TypeMismatch { .. } => "wrong_type",
            Self::BadBatch(_) => "bad_batch",
            Self::BadEvent(_) => "bad_event",
            Self::MissingField(_) => "missing_field",
            Self::OutOfRange(_) => "out_of_range",
            Self::InvalidUtf8(_) => "invalid_utf8",
        }
    }
}
