//! Decoding a body the way FastAPI does (Python's `json.loads`): the same
//! documents accepted, and for a malformed one the `json_invalid` error
//! with Python's message and character position, so clients that show
//! the reference's errors see the same text.

use serde_json::{Value, json};

use super::PydError;

/// Why a body could not be decoded.
#[derive(Debug, PartialEq)]
pub enum DecodeError {
    /// 422 `json_invalid` (Python's message and position).
    Invalid(Box<PydError>),
    /// Not text in the encoding `json.loads` detects (UTF-8, or UTF-16 or
    /// UTF-32 by their byte order mark or zero bytes): FastAPI answers 400
    /// "There was an error parsing the body".
    NotUtf8,
}

/// The text of a body in the encoding `json.loads(bytes)` reads it in:
/// the one Python's `json.detect_encoding` picks (a byte order mark, else
/// the zero bytes around the first characters, else UTF-8), its mark
/// dropped. A lone surrogate unit of UTF-16 or UTF-32, which Python's
/// `surrogatepass` lets through, is read as U+FFFD (a Rust string cannot
/// hold it): one character either way, so error positions agree. UTF-8
/// bytes encoding a surrogate are refused (`NotUtf8`), where Python takes
/// them (docs/coordinator.md, "Bodies").
fn text(bytes: &[u8]) -> Result<std::borrow::Cow<'_, str>, DecodeError> {
    // (bytes a unit, big-endian, byte order mark length)
    let (unit, big, mark) = match bytes {
        [0, 0, 0xfe, 0xff, ..] => (4, true, 4),
        [0xff, 0xfe, 0, 0, ..] => (4, false, 4),
        [0xfe, 0xff, ..] => (2, true, 2),
        [0xff, 0xfe, ..] => (2, false, 2),
        [0, b1, _, _, ..] => (if *b1 == 0 { 4 } else { 2 }, true, 0),
        [_, 0, b2, b3, ..] => (if *b2 == 0 && *b3 == 0 { 4 } else { 2 }, false, 0),
        [0, _] => (2, true, 0),
        [_, 0] => (2, false, 0),
        _ => {
            let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
            let text = std::str::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8)?;
            return Ok(std::borrow::Cow::Borrowed(text));
        }
    };
    let body = &bytes[mark..];
    if !body.len().is_multiple_of(unit) {
        return Err(DecodeError::NotUtf8);
    }
    let fold = |n: u32, b: &u8| n << 8 | u32::from(*b);
    let word = |c: &[u8]| {
        if big {
            c.iter().fold(0, fold)
        } else {
            c.iter().rev().fold(0, fold)
        }
    };
    let text = if unit == 2 {
        let units = body
            .chunks_exact(2)
            .map(|c| u16::try_from(word(c)).unwrap_or(0));
        Some(
            char::decode_utf16(units)
                .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                .collect::<String>(),
        )
    } else {
        body.chunks_exact(4)
            .map(|c| match word(c) {
                0xd800..=0xdfff => Some(char::REPLACEMENT_CHARACTER),
                w => char::from_u32(w),
            })
            .collect()
    };
    text.map(std::borrow::Cow::Owned)
        .ok_or(DecodeError::NotUtf8)
}

/// Decodes `bytes` as `json.loads` would; an empty body or `null` is
/// `Value::Null` (the caller reports it as a missing body).
pub fn decode(bytes: &[u8]) -> Result<Value, DecodeError> {
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    let text = text(bytes)?;
    let text = &*text;
    let chars: Vec<char> = text.chars().collect();
    let mut p = Parser { s: &chars, i: 0 };
    match p.document() {
        Ok(()) => serde_json::from_str(text).map_err(|_| {
            // Python accepts NaN/Infinity and numbers serde cannot hold;
            // such bodies are refused as malformed here (a documented difference).
            invalid(0, "Expecting value")
        }),
        Err((pos, msg)) => Err(invalid(pos, &msg)),
    }
}

fn invalid(pos: usize, msg: &str) -> DecodeError {
    DecodeError::Invalid(Box::new(PydError {
        kind: "json_invalid",
        loc: vec![json!("body"), json!(pos)].into(),
        msg: "JSON decode error".into(),
        input: json!({}),
        ctx: Some(Box::new(json!({ "error": msg }))),
    }))
}

type Fail = (usize, String);

struct Parser<'a> {
    s: &'a [char],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\n' | '\r')) {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<char> {
        self.s.get(self.i).copied()
    }

    fn fail<T>(&self, at: usize, msg: &str) -> Result<T, Fail> {
        Err((at, msg.to_owned()))
    }

    fn document(&mut self) -> Result<(), Fail> {
        self.ws();
        self.value()?;
        self.ws();
        if self.i != self.s.len() {
            return self.fail(self.i, "Extra data");
        }
        Ok(())
    }

    fn lit(&mut self, word: &str) -> bool {
        let w: Vec<char> = word.chars().collect();
        if self.s[self.i..].starts_with(&w) {
            self.i += w.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self) -> Result<(), Fail> {
        match self.peek() {
            Some('"') => {
                self.i += 1;
                self.string()
            }
            Some('{') => {
                self.i += 1;
                self.object()
            }
            Some('[') => {
                self.i += 1;
                self.array()
            }
            _ if self.lit("null")
                || self.lit("true")
                || self.lit("false")
                || self.lit("NaN")
                || self.lit("Infinity")
                || self.lit("-Infinity") =>
            {
                Ok(())
            }
            _ if self.number() => Ok(()),
            _ => self.fail(self.i, "Expecting value"),
        }
    }

    fn number(&mut self) -> bool {
        let start = self.i;
        let mut j = self.i;
        let digit = |j: usize| self.s.get(j).is_some_and(char::is_ascii_digit);
        if self.s.get(j) == Some(&'-') {
            j += 1;
        }
        match self.s.get(j) {
            Some('0') => j += 1,
            Some('1'..='9') => {
                while digit(j) {
                    j += 1;
                }
            }
            _ => return false,
        }
        if self.s.get(j) == Some(&'.') && digit(j + 1) {
            j += 1;
            while digit(j) {
                j += 1;
            }
        }
        if matches!(self.s.get(j), Some('e' | 'E')) {
            let mut k = j + 1;
            if matches!(self.s.get(k), Some('+' | '-')) {
                k += 1;
            }
            if digit(k) {
                while digit(k) {
                    k += 1;
                }
                j = k;
            }
        }
        self.i = j;
        j > start
    }

    /// After the opening quote.
    fn string(&mut self) -> Result<(), Fail> {
        let begin = self.i - 1;
        loop {
            match self.peek() {
                None => return self.fail(begin, "Unterminated string starting at"),
                Some('"') => {
                    self.i += 1;
                    return Ok(());
                }
                Some('\\') => {
                    let at = self.i;
                    match self.s.get(self.i + 1) {
                        None => return self.fail(begin, "Unterminated string starting at"),
                        Some('"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't') => self.i += 2,
                        Some('u') => {
                            let hex = self.s.get(self.i + 2..self.i + 6);
                            if !hex.is_some_and(|h| h.iter().all(char::is_ascii_hexdigit)) {
                                return self.fail(at, "Invalid \\uXXXX escape");
                            }
                            self.i += 6;
                        }
                        Some(c) => return self.fail(at, &format!("Invalid \\escape: '{c}'")),
                    }
                }
                Some(c) if u32::from(c) < 0x20 => {
                    return self.fail(self.i, "Invalid control character at");
                }
                Some(_) => self.i += 1,
            }
        }
    }

    /// After `{`.
    fn object(&mut self) -> Result<(), Fail> {
        self.ws();
        match self.peek() {
            Some('}') => {
                self.i += 1;
                return Ok(());
            }
            Some('"') => {}
            _ => return self.fail(self.i, "Expecting property name enclosed in double quotes"),
        }
        loop {
            self.i += 1;
            self.string()?;
            self.ws();
            if self.peek() != Some(':') {
                return self.fail(self.i, "Expecting ':' delimiter");
            }
            self.i += 1;
            self.ws();
            self.value()?;
            self.ws();
            match self.peek() {
                Some('}') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(',') => self.i += 1,
                _ => return self.fail(self.i, "Expecting ',' delimiter"),
            }
            self.ws();
            if self.peek() != Some('"') {
                return self.fail(self.i, "Expecting property name enclosed in double quotes");
            }
        }
    }

    /// After `[`.
    fn array(&mut self) -> Result<(), Fail> {
        self.ws();
        if self.peek() == Some(']') {
            self.i += 1;
            return Ok(());
        }
        loop {
            self.ws();
            self.value()?;
            self.ws();
            match self.peek() {
                Some(']') => {
                    self.i += 1;
                    return Ok(());
                }
                Some(',') => self.i += 1,
                _ => return self.fail(self.i, "Expecting ',' delimiter"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{DecodeError, text};

    /// The encodings `json.detect_encoding` tells apart, with and without
    /// their byte order marks, and what Python's codecs refuse.
    #[test]
    fn a_body_is_read_in_the_encoding_python_detects() {
        let read = |bytes: &[u8]| text(bytes).map(|t| t.into_owned());
        // UTF-32 big-endian by its mark, and little-endian by its zeros.
        assert_eq!(
            read(&[0, 0, 0xfe, 0xff, 0, 0, 0, b'1']).ok().as_deref(),
            Some("1")
        );
        assert_eq!(read(&[b'2', 0, 0, 0]).ok().as_deref(), Some("2"));
        // A lone surrogate unit is one U+FFFD, in UTF-32 and in UTF-16.
        assert_eq!(
            read(&[b'"', 0, 0, 0, 0x00, 0xd8, 0, 0, b'"', 0, 0, 0])
                .ok()
                .as_deref(),
            Some("\"\u{fffd}\"")
        );
        assert_eq!(
            read(&[0xfe, 0xff, 0xd8, 0x00]).ok().as_deref(),
            Some("\u{fffd}")
        );
        // Past U+10FFFF, and a unit cut short: no text.
        assert!(matches!(
            read(&[b'1', 0, 0, 0, 0, 0, 0x11, 0]),
            Err(DecodeError::NotUtf8)
        ));
        assert!(matches!(
            read(&[0xff, 0xfe, b'1', 0, b'2']),
            Err(DecodeError::NotUtf8)
        ));
        // A body that is only a byte order mark is empty text.
        for mark in [
            &[0xff, 0xfe][..],
            &[0xfe, 0xff],
            &[0xef, 0xbb, 0xbf],
            &[0xff, 0xfe, 0, 0],
        ] {
            assert_eq!(read(mark).ok().as_deref(), Some(""), "{mark:?}");
        }
        // UTF-8 bytes of a surrogate are refused (a documented difference).
        assert!(matches!(
            read(b"\"\xed\xa0\x80\""),
            Err(DecodeError::NotUtf8)
        ));
    }
}
