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
    /// Not UTF-8: FastAPI answers 400 "There was an error parsing the body".
    NotUtf8,
}

/// Decodes `bytes` as `json.loads` would; an empty body or `null` is
/// `Value::Null` (the caller reports it as a missing body).
pub fn decode(bytes: &[u8]) -> Result<Value, DecodeError> {
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    // `json.loads(bytes)` takes a UTF-8 byte order mark as the encoding's.
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|_| DecodeError::NotUtf8)?;
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
