//! Request validation as the reference coordinator's FastAPI/pydantic models
//! do it: lax coercion (`"3"`, `4.0` and `true` are integers), every error
//! collected with pydantic's `type`, `loc`, `msg`, `input` and `ctx`, model
//! validators reported at the model's own `loc`.
//!
//! The service parses with serde first (the fast path); only input that
//! fails there, or fails a model check, is walked here. A walk either
//! returns the errors the reference would answer with, or a coerced copy of
//! the input that the strict types then accept.

use serde::Serialize;
use serde_json::{Map, Value, json};

pub mod json;
pub mod models;

/// One entry of a 422 `detail` list, shaped like pydantic's `errors()`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PydError {
    /// Error type (`missing`, `int_parsing`, `value_error`, ...).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Where: `body` or `query` first, then fields and list indices.
    pub loc: Box<[Value]>,
    /// Pydantic's message.
    pub msg: Box<str>,
    /// The offending input as received.
    pub input: Value,
    /// Error context (`{"ge": 1}`, `{"expected": ...}`, `{"error": {}}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ctx: Option<Box<Value>>,
}

impl PydError {
    fn new(kind: &'static str, loc: &[Value], msg: impl Into<String>, input: &Value) -> Self {
        Self {
            kind,
            loc: loc.into(),
            msg: msg.into().into_boxed_str(),
            input: input.clone(),
            ctx: None,
        }
    }

    fn with_ctx(mut self, ctx: Value) -> Self {
        self.ctx = Some(Box::new(ctx));
        self
    }

    /// A model or field validator's `ValueError`, as pydantic reports it.
    pub fn value_error(loc: &[Value], msg: &str, input: &Value) -> Self {
        Self::new("value_error", loc, format!("Value error, {msg}"), input)
            .with_ctx(json!({"error": {}}))
    }

    /// The request has no body (empty, or JSON `null`).
    pub fn missing_body() -> Self {
        Self::new("missing", &[json!("body")], "Field required", &Value::Null)
    }
}

/// A field's type and constraints.
#[derive(Debug)]
pub enum Ty {
    /// `int` with optional `ge`/`le`.
    Int {
        /// Lower bound.
        ge: Option<i64>,
        /// Upper bound.
        le: Option<i64>,
    },
    /// `float` with an optional `ge`.
    Float {
        /// Lower bound.
        ge: Option<f64>,
    },
    /// `float | None`.
    OptFloat {
        /// Lower bound.
        ge: Option<f64>,
    },
    /// `str`; `strip` trims whitespace first, `min_len` after.
    Str {
        /// `strip_whitespace=True`.
        strip: bool,
        /// `min_length`.
        min_len: usize,
    },
    /// `bool`.
    Bool,
    /// A string enum with these values.
    Enum(&'static [&'static str]),
    /// `list[T]`.
    List(&'static Ty),
    /// `dict[str, str]`.
    DictStrStr,
    /// A nested dataclass.
    Model(&'static Model),
}

/// A plain `str` field.
pub const STR: Ty = Ty::Str {
    strip: false,
    min_len: 0,
};
/// A plain `int` field.
pub const INT: Ty = Ty::Int { ge: None, le: None };

/// A field validator: `Err` is the `ValueError` message.
pub type FieldCheck = fn(&Value) -> Result<(), String>;
/// A model validator over the coerced fields.
pub type ModelCheck = fn(&Map<String, Value>) -> Result<(), String>;

/// One field of a model.
#[derive(Debug)]
pub struct Field {
    /// Wire name.
    pub name: &'static str,
    /// Type.
    pub ty: Ty,
    /// No default: absent is a `missing` error.
    pub required: bool,
    /// A field validator run once the field's type is valid (reported at
    /// the field's `loc` with the raw input).
    pub check: Option<FieldCheck>,
}

/// A model: its fields in declaration order (errors come out in this order)
/// and the validator run after all of them are valid.
#[derive(Debug)]
pub struct Model {
    /// `class_name` in the `dataclass_type` error of a nested model.
    pub name: &'static str,
    /// Fields.
    pub fields: &'static [Field],
    /// `model_validator(mode="after")` / dataclass `__post_init__`, on the
    /// coerced fields.
    pub check: Option<ModelCheck>,
}

/// Validates a request body (already decoded JSON) against `model`;
/// `Ok` carries the coerced body.
pub fn validate_body(model: &Model, body: &Value) -> Result<Value, Vec<PydError>> {
    let loc = [json!("body")];
    if body.is_null() {
        return Err(vec![PydError::missing_body()]);
    }
    if !body.is_object() {
        return Err(vec![PydError::new(
            "model_attributes_type",
            &loc,
            "Input should be a valid dictionary or object to extract fields from",
            body,
        )]);
    }
    let mut errs = Vec::new();
    let out = model_fields(model, body, &loc, &mut errs);
    if errs.is_empty() { Ok(out) } else { Err(errs) }
}

/// A non-JSON body (a content type that is not JSON): FastAPI hands the
/// model the raw text.
pub fn raw_body(model: &Model, text: &str) -> Vec<PydError> {
    let _ = model;
    vec![PydError::new(
        "model_attributes_type",
        &[json!("body")],
        "Input should be a valid dictionary or object to extract fields from",
        &Value::String(text.to_owned()),
    )]
}

/// Validates query parameters (last value of a repeated name wins, as in
/// Starlette); `Ok` carries them as a JSON object of coerced values.
pub fn validate_query(model: &Model, pairs: &[(String, String)]) -> Result<Value, Vec<PydError>> {
    let mut map = Map::new();
    for (k, v) in pairs {
        map.insert(k.clone(), Value::String(v.clone()));
    }
    let input = Value::Object(map);
    let mut errs = Vec::new();
    let out = model_fields(model, &input, &[json!("query")], &mut errs);
    if errs.is_empty() { Ok(out) } else { Err(errs) }
}

fn model_fields(model: &Model, input: &Value, loc: &[Value], errs: &mut Vec<PydError>) -> Value {
    let Some(map) = input.as_object() else {
        errs.push(
            PydError::new(
                "dataclass_type",
                loc,
                format!(
                    "Input should be a dictionary or an instance of {}",
                    model.name
                ),
                input,
            )
            .with_ctx(json!({"class_name": model.name})),
        );
        return Value::Null;
    };
    let before = errs.len();
    // Unknown fields ride along untouched (the reference ignores them; a
    // house extension such as `dropped_events` still reaches serde).
    let mut out = map.clone();
    for f in model.fields {
        let mut at = loc.to_vec();
        at.push(json!(f.name));
        match map.get(f.name) {
            None if f.required => {
                errs.push(PydError::new("missing", &at, "Field required", input));
            }
            None => {}
            Some(v) => {
                let n = errs.len();
                let coerced = value(&f.ty, v, &at, errs);
                if errs.len() == n {
                    if let Some(check) = f.check
                        && let Err(msg) = check(&coerced)
                    {
                        errs.push(PydError::value_error(&at, &msg, v));
                    }
                    out.insert(f.name.to_owned(), coerced);
                }
            }
        }
    }
    if errs.len() == before
        && let Some(check) = model.check
        && let Err(msg) = check(&out)
    {
        errs.push(PydError::value_error(loc, &msg, input));
    }
    Value::Object(out)
}

fn value(ty: &Ty, v: &Value, loc: &[Value], errs: &mut Vec<PydError>) -> Value {
    let r = match ty {
        Ty::Int { ge, le } => int(v, loc)
            .map_err(|e| beyond_i64(v, *ge, *le, loc).unwrap_or(e))
            .and_then(|i| {
                bound_i(i, *ge, *le, v, loc)?;
                Ok(json!(i))
            }),
        Ty::Float { ge } => float(v, loc).and_then(|x| {
            bound_f(x, *ge, v, loc)?;
            finite(x, v, loc)
        }),
        Ty::OptFloat { ge } if v.is_null() => {
            let _ = ge;
            Ok(Value::Null)
        }
        Ty::OptFloat { ge } => float(v, loc).and_then(|x| {
            bound_f(x, *ge, v, loc)?;
            finite(x, v, loc)
        }),
        Ty::Str { strip, min_len } => match v.as_str() {
            None => Err(PydError::new(
                "string_type",
                loc,
                "Input should be a valid string",
                v,
            )),
            Some(s) => {
                let s = if *strip { s.trim() } else { s };
                if s.chars().count() < *min_len {
                    let unit = if *min_len == 1 {
                        "character"
                    } else {
                        "characters"
                    };
                    Err(PydError::new(
                        "string_too_short",
                        loc,
                        format!("String should have at least {min_len} {unit}"),
                        v,
                    )
                    .with_ctx(json!({"min_length": min_len})))
                } else {
                    Ok(json!(s))
                }
            }
        },
        Ty::Bool => boolean(v, loc).map(Value::Bool),
        Ty::Enum(values) => match v.as_str() {
            Some(s) if values.contains(&s) => Ok(v.clone()),
            _ => {
                let expected = expected(values);
                Err(
                    PydError::new("enum", loc, format!("Input should be {expected}"), v)
                        .with_ctx(json!({ "expected": expected })),
                )
            }
        },
        Ty::List(item) => match v.as_array() {
            None => Err(PydError::new(
                "list_type",
                loc,
                "Input should be a valid list",
                v,
            )),
            Some(items) => {
                let mut out = Vec::with_capacity(items.len());
                for (i, x) in items.iter().enumerate() {
                    let mut at = loc.to_vec();
                    at.push(json!(i));
                    out.push(value(item, x, &at, errs));
                }
                Ok(Value::Array(out))
            }
        },
        Ty::DictStrStr => match v.as_object() {
            None => Err(PydError::new(
                "dict_type",
                loc,
                "Input should be a valid dictionary",
                v,
            )),
            Some(m) => {
                for (k, x) in m {
                    if !x.is_string() {
                        let mut at = loc.to_vec();
                        at.push(json!(k));
                        errs.push(PydError::new(
                            "string_type",
                            &at,
                            "Input should be a valid string",
                            x,
                        ));
                    }
                }
                Ok(v.clone())
            }
        },
        Ty::Model(m) => Ok(model_fields(m, v, loc, errs)),
    };
    r.unwrap_or_else(|e| {
        errs.push(e);
        Value::Null
    })
}

/// `'a', 'b' or 'c'`, pydantic's enum listing.
fn expected(values: &[&str]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("'{v}'")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

fn bound_i(
    i: i64,
    ge: Option<i64>,
    le: Option<i64>,
    v: &Value,
    loc: &[Value],
) -> Result<(), PydError> {
    if let Some(ge) = ge
        && i < ge
    {
        return Err(below(ge, v, loc));
    }
    if let Some(le) = le
        && i > le
    {
        return Err(above(le, v, loc));
    }
    Ok(())
}

fn below(ge: i64, v: &Value, loc: &[Value]) -> PydError {
    PydError::new(
        "greater_than_equal",
        loc,
        format!("Input should be greater than or equal to {ge}"),
        v,
    )
    .with_ctx(json!({ "ge": ge }))
}

fn above(le: i64, v: &Value, loc: &[Value]) -> PydError {
    PydError::new(
        "less_than_equal",
        loc,
        format!("Input should be less than or equal to {le}"),
        v,
    )
    .with_ctx(json!({ "le": le }))
}

/// An integer pydantic holds and `i64` cannot (a JSON integer or a string
/// of digits past 64 bits): where a bound on its side refuses it, that
/// bound's error, as in the reference; `None` otherwise (the caller's
/// `int_parsing_size` stands, a documented difference).
fn beyond_i64(v: &Value, ge: Option<i64>, le: Option<i64>, loc: &[Value]) -> Option<PydError> {
    let negative = match v {
        // Past u64 serde reads a float, which pydantic refuses by size.
        Value::Number(n) if n.is_u64() => false,
        Value::String(s) => {
            let t = s.trim();
            let (neg, body) = match t.as_bytes().first() {
                Some(b'-') => (true, &t[1..]),
                Some(b'+') => (false, &t[1..]),
                _ => (false, t),
            };
            digits(body)?;
            neg
        }
        _ => return None,
    };
    if negative {
        ge.map(|ge| below(ge, v, loc))
    } else {
        le.map(|le| above(le, v, loc))
    }
}

/// pydantic's `float` holds `inf` and `nan` (`"inf"`, `"nan"`, `"1e400"`);
/// JSON cannot carry them on to the handlers, so they are refused with
/// pydantic's own error for a field that allows neither.
fn finite(x: f64, v: &Value, loc: &[Value]) -> Result<Value, PydError> {
    if x.is_finite() {
        Ok(json!(x))
    } else {
        Err(PydError::new(
            "finite_number",
            loc,
            "Input should be a finite number",
            v,
        ))
    }
}

fn bound_f(x: f64, ge: Option<f64>, v: &Value, loc: &[Value]) -> Result<(), PydError> {
    // `nan >= ge` is false in Python: nan fails every bound.
    if let Some(ge) = ge
        && (x < ge || x.is_nan())
    {
        return Err(PydError::new(
            "greater_than_equal",
            loc,
            // pydantic-core prints a whole float bound without its `.0`.
            format!("Input should be greater than or equal to {ge}"),
            v,
        )
        .with_ctx(json!({ "ge": ge })));
    }
    Ok(())
}

/// Python's `repr` of a `str`: in single quotes unless it holds a `'` and
/// no `"`; the backslash, that quote, and control characters escaped.
pub fn py_str(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            // C0 and C1 controls, DEL, no-break space, soft hyphen.
            '\0'..='\u{1f}' | '\u{7f}'..='\u{a0}' | '\u{ad}' => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            // Format characters and separators Python does not print.
            '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{feff}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// Python's `repr` of a float (`0.0`, `1.5`, `1e+16`, `-1e-05`), which
/// its `json.dumps` and f-strings write: the shortest digits that read
/// back as `x` (Rust's `{:e}` finds the same), positional from 1e-4 up to
/// below 1e16 (with `.0` when whole), else `d.ddde±XX`.
pub fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    // Digits before the decimal point (`0.001` has -2).
    let point = exp.parse::<i32>().unwrap_or(0) + 1;
    let n = i32::try_from(digits.len()).unwrap_or(i32::MAX);
    if !(-4 < point && point <= 16) {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() { "" } else { "." };
        let e = point - 1;
        let esign = if e < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}{rest}e{esign}{:02}", e.unsigned_abs());
    }
    if point <= 0 {
        let zeros = "0".repeat(point.unsigned_abs() as usize);
        format!("{sign}0.{zeros}{digits}")
    } else if point < n {
        let (int, frac) = digits.split_at(point.unsigned_abs() as usize);
        format!("{sign}{int}.{frac}")
    } else {
        let zeros = "0".repeat((point - n).unsigned_abs() as usize);
        format!("{sign}{digits}{zeros}.0")
    }
}

/// Pydantic's lax integer: JSON integers, floats without a fraction,
/// booleans, and strings of an integer (`" 3 "`, `"+3"`, `"3_0"`, `"3.0"`).
/// A number past `i64` is `int_parsing_size`, pydantic's error for a float
/// past 64 bits.
pub fn int(v: &Value, loc: &[Value]) -> Result<i64, PydError> {
    let parsing = || {
        PydError::new(
            "int_parsing",
            loc,
            "Input should be a valid integer, unable to parse string as an integer",
            v,
        )
    };
    let size = || {
        PydError::new(
            "int_parsing_size",
            loc,
            "Unable to parse input string as an integer, exceeded maximum size",
            v,
        )
    };
    match v {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                return Ok(i);
            }
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() != 0.0 {
                return Err(PydError::new(
                    "int_from_float",
                    loc,
                    "Input should be a valid integer, got a number with a fractional part",
                    v,
                ));
            }
            float_to_i64(f).ok_or_else(size)
        }
        Value::Bool(b) => Ok(i64::from(*b)),
        Value::String(s) => int_str(s).ok_or_else(|| {
            // Digits that overflow: pydantic holds them (up to 4,300).
            let t = s.trim();
            let t = t.strip_prefix(['-', '+']).unwrap_or(t);
            if digits(t).is_some() {
                size()
            } else {
                parsing()
            }
        }),
        _ => Err(PydError::new(
            "int_type",
            loc,
            "Input should be a valid integer",
            v,
        )),
    }
}

#[expect(clippy::cast_possible_truncation, reason = "range checked first")]
fn float_to_i64(f: f64) -> Option<i64> {
    (f.is_finite() && (-9.2e18..=9.2e18).contains(&f)).then_some(f as i64)
}

/// Python's `int(str)` digits with single underscores between digits.
fn digits(s: &str) -> Option<String> {
    let b = s.as_bytes();
    if b.is_empty() || b[0] == b'_' || b[b.len() - 1] == b'_' {
        return None;
    }
    let mut out = String::with_capacity(s.len());
    let mut prev_underscore = false;
    for &c in b {
        match c {
            b'0'..=b'9' => {
                out.push(char::from(c));
                prev_underscore = false;
            }
            b'_' if !prev_underscore => prev_underscore = true,
            _ => return None,
        }
    }
    Some(out)
}

fn int_str(s: &str) -> Option<i64> {
    let t = s.trim();
    let (neg, body) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    // "3.0": an integer written with a zero fraction.
    let body = match body.split_once('.') {
        Some((whole, frac)) if !frac.is_empty() && frac.bytes().all(|c| c == b'0') => whole,
        Some(_) => return None,
        None => body,
    };
    let d = digits(body)?;
    let n: i64 = d.parse().ok()?;
    Some(if neg { -n } else { n })
}

/// Pydantic's lax float: numbers, booleans, numeric strings.
pub fn float(v: &Value, loc: &[Value]) -> Result<f64, PydError> {
    match v {
        Value::Number(n) => Ok(n.as_f64().unwrap_or(f64::NAN)),
        Value::Bool(b) => Ok(if *b { 1.0 } else { 0.0 }),
        Value::String(s) => {
            let t = s.trim();
            let cleaned: String = if t.contains('_') {
                let ok = t.split(['e', 'E', '.']).all(|part| {
                    let p = part.trim_start_matches(['+', '-']);
                    p.is_empty() || digits(p).is_some()
                });
                if ok {
                    t.replace('_', "")
                } else {
                    String::new()
                }
            } else {
                t.to_owned()
            };
            cleaned.parse::<f64>().map_err(|_| {
                PydError::new(
                    "float_parsing",
                    loc,
                    "Input should be a valid number, unable to parse string as a number",
                    v,
                )
            })
        }
        _ => Err(PydError::new(
            "float_type",
            loc,
            "Input should be a valid number",
            v,
        )),
    }
}

/// Pydantic's lax bool: `true`/`false`, 0/1, and the usual words.
pub fn boolean(v: &Value, loc: &[Value]) -> Result<bool, PydError> {
    let parsing = || {
        PydError::new(
            "bool_parsing",
            loc,
            "Input should be a valid boolean, unable to interpret input",
            v,
        )
    };
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Ok(false),
            Some(1.0) => Ok(true),
            // A fraction is not even a candidate: `bool_type`, as pydantic.
            Some(x) if x.fract() != 0.0 => Err(PydError::new(
                "bool_type",
                loc,
                "Input should be a valid boolean",
                v,
            )),
            _ => Err(parsing()),
        },
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Ok(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Ok(true),
            _ => Err(parsing()),
        },
        _ => Err(PydError::new(
            "bool_type",
            loc,
            "Input should be a valid boolean",
            v,
        )),
    }
}

/// Python's `bytes.fromhex` error for `hex`, if it fails (whitespace
/// between byte pairs is allowed there).
pub fn fromhex_error(hex: &str) -> Option<String> {
    let chars: Vec<char> = hex.chars().collect();
    let mut i = 0;
    let bad = |pos: usize| {
        Some(format!(
            "non-hexadecimal number found in fromhex() arg at position {pos}"
        ))
    };
    while i < chars.len() {
        if chars[i].is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if !chars[i].is_ascii_hexdigit() {
            return bad(i);
        }
        if i + 1 >= chars.len() || !chars[i + 1].is_ascii_hexdigit() {
            return bad(i + 1);
        }
        i += 2;
    }
    None
}

#[cfg(test)]
mod tests;
