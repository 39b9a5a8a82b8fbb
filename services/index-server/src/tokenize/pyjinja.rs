//! What `transformers` adds to the Jinja environment it renders chat
//! templates in, rebuilt for minijinja: its `tojson` (Python's
//! `json.dumps`, not Jinja's HTML-safe compact one) and `strftime_now`.
//! Templates print tool schemas and tool-call arguments through `tojson`,
//! and Llama 3.x prints today's date through `strftime_now` into every
//! system header: a byte of difference there and no block of the prompt
//! matches what the engine cached.

use minijinja::value::{Rest, ValueKind, ValueOrKwargs};
use minijinja::{Error, ErrorKind, Value};

/// Deepest value `tojson` writes (Python's own limit is its recursion
/// limit; a template value is never near this).
const MAX_DEPTH: usize = 128;

fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, message.into())
}

/// How `json.dumps` lays a value out.
struct Layout {
    /// `None`: one line.
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// The `tojson` filter as transformers defines it:
/// `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, i.e. `json.dumps` with those arguments (so `", "`
/// and `": "` between items and after keys, `","` between items once
/// indented, keys in insertion order, text beyond ASCII as it is).
pub(super) fn tojson(value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    let mut given: [Option<Value>; 4] = Default::default();
    let mut positional = args.into_values();
    if positional.last().is_some_and(Value::is_kwargs) {
        let kwargs = positional.pop().unwrap_or_default();
        for key in kwargs.try_iter()? {
            let name = key.as_str().unwrap_or_default();
            let at = NAMES
                .iter()
                .position(|n| *n == name)
                .ok_or_else(|| invalid(format!("tojson: unexpected argument {name}")))?;
            given[at] = Some(kwargs.get_item(&key)?);
        }
    }
    if positional.len() > NAMES.len() {
        return Err(invalid("tojson: too many arguments"));
    }
    for (at, v) in positional.into_iter().enumerate() {
        if given[at].is_some() {
            return Err(invalid(format!("tojson: {} given twice", NAMES[at])));
        }
        given[at] = Some(v);
    }
    let [ensure_ascii, indent, separators, sort_keys] = given.map(|v| v.filter(|v| !v.is_none()));
    let ensure_ascii = ensure_ascii.is_some_and(|v| v.is_true());
    let indent = match indent {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => match i64::try_from(v.clone()) {
            Ok(n) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            Err(_) => {
                return Err(invalid(format!(
                    "tojson: indent must be a number or a string, got {v}"
                )));
            }
        },
    };
    let (item_separator, key_separator) = match separators {
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
        Some(pair) => {
            let parts: Vec<Value> = pair
                .try_iter()
                .map_err(|_| invalid("tojson: separators must be a pair of strings"))?
                .collect();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => (
                    item.as_str().unwrap_or_default().to_owned(),
                    key.as_str().unwrap_or_default().to_owned(),
                ),
                _ => return Err(invalid("tojson: separators must be a pair of strings")),
            }
        }
    };
    let sort_keys = sort_keys.is_some_and(|v| v.is_true());
    let layout = Layout {
        indent,
        item_separator,
        key_separator,
        sort_keys,
        ensure_ascii,
    };
    let mut out = String::new();
    dump(value, &layout, 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

/// `json.dumps(value)` with its default arguments but `ensure_ascii=False`.
#[cfg(test)]
pub(crate) fn dumps(value: &Value) -> Result<String, Error> {
    let layout = Layout {
        indent: None,
        item_separator: ", ".into(),
        key_separator: ": ".into(),
        sort_keys: false,
        ensure_ascii: false,
    };
    let mut out = String::new();
    dump(value, &layout, 0, &mut out)?;
    Ok(out)
}

fn newline(layout: &Layout, level: usize, out: &mut String) {
    if let Some(indent) = &layout.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(indent);
        }
    }
}

fn dump(value: &Value, layout: &Layout, level: usize, out: &mut String) -> Result<(), Error> {
    if level > MAX_DEPTH {
        return Err(invalid("tojson: value nested too deeply"));
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => number(value, out)?,
        ValueKind::String => string(value.as_str().unwrap_or_default(), layout.ensure_ascii, out),
        ValueKind::Map => {
            let mut pairs = super::ordered::entries(value)
                .ok_or_else(|| invalid("tojson: a map that cannot be read"))?;
            if pairs.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            if layout.sort_keys {
                pairs.sort_by_cached_key(|(k, _)| key_text(k));
            }
            out.push('{');
            for (i, (key, item)) in pairs.iter().enumerate() {
                if i > 0 {
                    out.push_str(&layout.item_separator);
                }
                newline(layout, level + 1, out);
                string(&key_text(key), layout.ensure_ascii, out);
                out.push_str(&layout.key_separator);
                dump(item, layout, level + 1, out)?;
            }
            newline(layout, level, out);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&layout.item_separator);
                }
                newline(layout, level + 1, out);
                dump(item, layout, level + 1, out)?;
            }
            newline(layout, level, out);
            out.push(']');
        }
        other => {
            return Err(invalid(format!(
                "tojson: a value of kind {other} is not JSON serializable"
            )));
        }
    }
    Ok(())
}

/// A key as `json.dumps` writes it: strings as they are; numbers, booleans
/// and None as their JSON text.
fn key_text(key: &Value) -> String {
    match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".to_owned(),
        ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_owned(),
        _ => {
            let mut text = String::new();
            if number(key, &mut text).is_err() {
                text = key.to_string();
            }
            text
        }
    }
}

fn number(value: &Value, out: &mut String) -> Result<(), Error> {
    if value.is_integer() {
        let n = i128::try_from(value.clone())?;
        out.push_str(&n.to_string());
        return Ok(());
    }
    out.push_str(&float_repr(f64::try_from(value.clone())?));
    Ok(())
}

/// A float as Python's `repr` (and so `json.dumps`) writes it: the
/// shortest digits that read back the same, in positional form for
/// decimal exponents from -4 to 15 (with `.0` when whole), else as
/// `1.5e+16`; `NaN` and `Infinity` as `json.dumps` allows them.
pub(super) fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    if !(-4..16).contains(&exponent) {
        let mut out = format!("{sign}{}", &digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let (exp_sign, magnitude) = if exponent < 0 {
            ('-', -exponent)
        } else {
            ('+', exponent)
        };
        out.push_str(&format!("e{exp_sign}{magnitude:02}"));
        return out;
    }
    if exponent < 0 {
        let zeros = "0".repeat(usize::try_from(-exponent - 1).unwrap_or(0));
        return format!("{sign}0.{zeros}{digits}");
    }
    let whole = usize::try_from(exponent).unwrap_or(0) + 1;
    if digits.len() <= whole {
        let zeros = "0".repeat(whole - digits.len());
        format!("{sign}{digits}{zeros}.0")
    } else {
        format!("{sign}{}.{}", &digits[..whole], &digits[whole..])
    }
}

/// A JSON string as `json.dumps` writes it: `"` and `\` escaped, `\n`,
/// `\r`, `\t`, `\b`, `\f` by name, other control characters as `\u00XX`;
/// with `ensure_ascii`, everything outside printable ASCII as `\uXXXX`
/// (surrogate pairs beyond the BMP).
fn string(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if u32::from(c) < 0x20 || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Prints a value as Python's `str` does where it differs from minijinja:
/// `None`, `True`, `False` (a template printing a flag or an absent id).
pub(super) fn format_value(
    out: &mut minijinja::Output<'_>,
    state: &mut minijinja::State<'_, '_>,
    value: &Value,
) -> Result<(), Error> {
    let text = match value.kind() {
        ValueKind::None => "None",
        ValueKind::Bool if value.is_true() => "True",
        ValueKind::Bool => "False",
        _ => return minijinja::escape_formatter(out, state, value),
    };
    out.write_str(text).map_err(Error::from)
}

/// `strftime_now(format)` as transformers defines it (the engine's clock,
/// `datetime.now().strftime(format)`), read in UTC: engine containers run
/// in UTC unless told otherwise.
pub(super) fn strftime_now(format: String) -> Result<String, Error> {
    let now = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC);
    strftime(&format, &now)
}

/// `format` applied to `at` with C's `strftime` directives.
pub(super) fn strftime(format: &str, at: &jiff::Zoned) -> Result<String, Error> {
    jiff::fmt::strtime::format(format, at)
        .map_err(|e| invalid(format!("strftime_now({format:?}): {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values read as a template sees a request's JSON (order kept).
    fn json(text: &str) -> Value {
        serde_json::from_str::<super::super::ordered::OrderedJson>(text)
            .unwrap()
            .0
    }

    fn render(template: &str, ctx: Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.set_formatter(format_value);
        env.render_str(template, ctx).unwrap()
    }

    /// Each against what Python 3's `json.dumps(..., ensure_ascii=False)`
    /// prints (written down from the interpreter).
    #[test]
    fn dumps_writes_what_python_writes() {
        let cases = [
            (
                r#"{"b": 1, "a": [true, null, "x"]}"#,
                r#"{"b": 1, "a": [true, null, "x"]}"#,
            ),
            (r#"{"z":{},"y":[]}"#, r#"{"z": {}, "y": []}"#),
            (r#""é 漢 😀 \u007f""#, "\"é 漢 😀 \u{7f}\""),
            (
                r#""q\"b\\n\nr\rt\tb\bf\fc\u0001/""#,
                r#""q\"b\\n\nr\rt\tb\bf\fc\u0001/""#,
            ),
            (
                "[1.0, 0.5, 1e16, 1e-5, 0.0001, 123456789.125, -2.5e-7, 1e22, 3.0e15]",
                "[1.0, 0.5, 1e+16, 1e-05, 0.0001, 123456789.125, -2.5e-07, 1e+22, 3000000000000000.0]",
            ),
            (
                "[18446744073709551615, -9223372036854775808, 0, -0.0]",
                "[18446744073709551615, -9223372036854775808, 0, -0.0]",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(dumps(&json(input)).unwrap(), want, "{input}");
        }
    }

    #[test]
    fn floats_as_python_reprs_them() {
        for (f, want) in [
            (0.1, "0.1"),
            (1.0 / 3.0, "0.3333333333333333"),
            (100.0, "100.0"),
            (1e15, "1000000000000000.0"),
            (9_999_999_999_999_998.0, "9999999999999998.0"),
            (1.5e300, "1.5e+300"),
            (5e-324, "5e-324"),
            (-0.00012, "-0.00012"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn the_filter_takes_json_dumps_arguments() {
        let ctx = minijinja::context! { x => json(r#"{"b": [1, 2], "a": "é"}"#) };
        assert_eq!(
            render("{{ x | tojson }}", ctx.clone()),
            r#"{"b": [1, 2], "a": "é"}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2) }}", ctx.clone()),
            "{\n  \"b\": [\n    1,\n    2\n  ],\n  \"a\": \"é\"\n}"
        );
        assert_eq!(
            render(
                "{{ x | tojson(sort_keys=true, separators=[',', ':']) }}",
                ctx.clone()
            ),
            r#"{"a":"é","b":[1,2]}"#
        );
        assert_eq!(
            render("{{ x | tojson(true) }}", ctx.clone()),
            r#"{"b": [1, 2], "a": "\u00e9"}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent='\t') }}", ctx.clone()),
            "{\n\t\"b\": [\n\t\t1,\n\t\t2\n\t],\n\t\"a\": \"é\"\n}"
        );
        // Printed as Python prints them.
        let ctx = minijinja::context! { t => true, f => false, n => () };
        assert_eq!(
            render("{{ t }} {{ f }} {{ n }} {{ 1 }} {{ 'x' }}", ctx),
            "True False None 1 x"
        );
        // Not escaped for HTML, as Jinja's own filter would.
        let ctx = minijinja::context! { x => "<a href='x'>&</a>" };
        assert_eq!(render("{{ x | tojson }}", ctx), r#""<a href='x'>&</a>""#);
    }

    #[test]
    fn a_wrong_argument_is_an_error_naming_it() {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        let err = env
            .render_str("{{ 1 | tojson(indent=[1]) }}", ())
            .unwrap_err();
        assert!(err.to_string().contains("indent"), "{err}");
        let err = env
            .render_str("{{ 1 | tojson(separators='x') }}", ())
            .unwrap_err();
        assert!(err.to_string().contains("separators"), "{err}");
        assert!(env.render_str("{{ 1 | tojson(colour=1) }}", ()).is_err());
    }

    /// Against Python's `time.strftime(f, time.gmtime(1722000000))` (26 Jul
    /// 2024 13:20:00 UTC, a Friday).
    #[test]
    fn strftime_formats_as_c_does() {
        let at = jiff::Timestamp::from_second(1_722_000_000)
            .unwrap()
            .to_zoned(jiff::tz::TimeZone::UTC);
        for (format, want) in [
            ("%d %b %Y", "26 Jul 2024"),
            ("%B %d, %Y", "July 26, 2024"),
            (
                "%A %a %m/%d/%y %H:%M:%S %j",
                "Friday Fri 07/26/24 13:20:00 208",
            ),
            ("%I %p %-d %e %%", "01 PM 26 26 %"),
            ("%Y-%m-%d", "2024-07-26"),
        ] {
            assert_eq!(strftime(format, &at).unwrap(), want, "{format}");
        }
        assert!(strftime_now("%Y".into()).unwrap().len() == 4);
    }
}
