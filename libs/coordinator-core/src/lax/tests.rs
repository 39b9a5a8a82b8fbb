use serde_json::json;

use super::json::{DecodeError, decode};
use super::models::{EVENTS, KEYS_QUERY, LOOKUP, REGISTER};
use super::{py_float, validate_body, validate_query};

fn errs(model: &super::Model, body: serde_json::Value) -> serde_json::Value {
    json!(validate_body(model, &body).expect_err("should fail"))
}

#[test]
fn integers_coerce_like_pydantic_lax_mode() {
    for port in [
        json!("3"),
        json!(" 3 "),
        json!("3_0"),
        json!("+3"),
        json!("3.0"),
        json!(4.0),
        json!(true),
    ] {
        let out = validate_body(&REGISTER, &json!({"ip": "a", "http_port": port})).unwrap();
        assert!(out["http_port"].is_i64(), "{port} -> {out}");
    }
    let e = errs(&REGISTER, json!({"ip": "a", "http_port": 4.5}));
    assert_eq!(e[0]["type"], "int_from_float");
    let e = errs(&REGISTER, json!({"ip": "a", "http_port": "3__0"}));
    assert_eq!(e[0]["type"], "int_parsing");
    let e = errs(&REGISTER, json!({"ip": "a", "http_port": 0}));
    assert_eq!(
        e[0],
        json!({"type": "greater_than_equal", "loc": ["body", "http_port"],
        "msg": "Input should be greater than or equal to 1", "input": 0, "ctx": {"ge": 1}})
    );
}

#[test]
fn errors_are_collected_in_field_order_with_the_containing_input() {
    let e = errs(&REGISTER, json!({"http_port": null}));
    assert_eq!(
        e,
        json!([
            {"type": "missing", "loc": ["body", "ip"], "msg": "Field required", "input": {"http_port": null}},
            {"type": "int_type", "loc": ["body", "http_port"], "msg": "Input should be a valid integer", "input": null},
        ])
    );
}

#[test]
fn model_validators_report_at_the_model() {
    let batch = json!({"instance_id": "", "incarnation": 1, "seq": 1, "event_type": "store", "tier": "l2", "backend": "fs"});
    let e = errs(&EVENTS, json!({"batches": [batch.clone()]}));
    assert_eq!(e[0]["loc"], json!(["body", "batches", 0]));
    assert_eq!(e[0]["msg"], "Value error, instance_id must be non-empty");
    assert_eq!(e[0]["input"], batch);
    let e = errs(&LOOKUP, json!({}));
    assert_eq!(e[0]["loc"], json!(["body"]));
    let e = errs(
        &LOOKUP,
        json!({"keys": [{"chunk_hash_hex": "abc", "model_name": "m", "kv_rank": 0}]}),
    );
    assert_eq!(
        e[0]["msg"],
        "Value error, non-hexadecimal number found in fromhex() arg at position 3"
    );
    assert_eq!(e[0]["loc"], json!(["body", "keys"]));
}

#[test]
fn query_takes_the_last_repeated_value() {
    let pairs = vec![
        ("limit".to_owned(), "5".to_owned()),
        ("limit".to_owned(), "abc".to_owned()),
    ];
    let e = json!(validate_query(&KEYS_QUERY, &pairs).unwrap_err());
    assert_eq!(e[0]["input"], "abc");
    assert_eq!(e[0]["loc"], json!(["query", "limit"]));
}

#[test]
fn malformed_json_reports_pythons_message_and_position() {
    let cases: [(&str, usize, &str); 6] = [
        (
            "{\"ip\":\"1.2.3.4\",",
            16,
            "Expecting property name enclosed in double quotes",
        ),
        ("{\"a\":1", 6, "Expecting ',' delimiter"),
        ("{\"a\" 1}", 5, "Expecting ':' delimiter"),
        ("[1,]", 3, "Expecting value"),
        ("{} x", 3, "Extra data"),
        ("{\"a\":\"b", 5, "Unterminated string starting at"),
    ];
    for (body, pos, msg) in cases {
        let Err(DecodeError::Invalid(e)) = decode(body.as_bytes()) else {
            panic!("{body} decoded")
        };
        assert_eq!(
            (
                e.loc[1].as_u64().unwrap() as usize,
                e.ctx.unwrap()["error"].as_str().unwrap()
            ),
            (pos, msg),
            "{body}"
        );
    }
    assert_eq!(decode(b"").unwrap(), serde_json::Value::Null);
    assert_eq!(decode(b"{\"a\":1,\"a\":2}").unwrap(), json!({"a": 2}));
}

/// Python 3.11's `base64.b64decode(s, validate=True)` on each input, as
/// the conformance venv's interpreter answered (2026-12-06).
#[test]
fn base64_decodes_as_python_strict_mode() {
    use super::models::b64_strict_len;
    let bad = |m: &str| Err::<usize, String>(m.to_owned());
    for (s, want) in [
        ("", Ok(0)),
        ("AA==", Ok(1)),
        ("AAA=", Ok(2)),
        ("AAAA=", Ok(3)),
        ("AAAA====", Ok(3)),
        (
            "\u{e9}",
            bad("string argument should contain only ASCII characters"),
        ),
        ("=AAA", bad("Leading padding not allowed")),
        ("A=AA", bad("Discontinuous padding not allowed")),
        ("AB=C", bad("Discontinuous padding not allowed")),
        ("AA==AA==", bad("Excess data after padding")),
        ("AAA==", bad("Excess data after padding")),
        ("AAAA\n", bad("Only base64 data is allowed")),
        ("AA=", bad("Incorrect padding")),
        ("AAAAAA=", bad("Incorrect padding")),
        (
            "AAAAA",
            bad(
                "Invalid base64-encoded string: number of data characters (5) cannot be 1 more than a multiple of 4",
            ),
        ),
        (
            "A===",
            bad(
                "Invalid base64-encoded string: number of data characters (1) cannot be 1 more than a multiple of 4",
            ),
        ),
    ] {
        assert_eq!(b64_strict_len(s), want, "{s:?}");
    }
}

#[test]
fn python_reprs_of_strings() {
    use super::py_str;
    assert_eq!(py_str("a/b"), "'a/b'");
    assert_eq!(py_str("a\\b"), "'a\\\\b'");
    assert_eq!(py_str("it's"), "\"it's\"");
    assert_eq!(py_str("'\""), "'\\'\"'");
    assert_eq!(
        py_str("a\u{0}\t\n\u{7f}\u{ad}\u{2028}"),
        "'a\\x00\\t\\n\\x7f\\xad\\u2028'"
    );
}

#[test]
fn numbers_pydantic_holds_and_json_cannot() {
    // A fraction is not a boolean candidate; 2.0 is one that fails.
    let force = |v| {
        let body = json!({"instance_id": "x", "model_name": "m", "world_size": 1, "force": v});
        errs(&super::models::DELETE, body)[0]["type"].clone()
    };
    assert_eq!(force(json!(0.5)), "bool_type");
    assert_eq!(force(json!(2.0)), "bool_parsing");
    // nan fails a bound; inf, which JSON cannot carry on, is refused.
    let quota = |v| errs(&super::models::SET_QUOTA, json!({"limit_gb": v}))[0].clone();
    assert_eq!(quota(json!("nan"))["type"], "greater_than_equal");
    assert_eq!(quota(json!("-inf"))["type"], "greater_than_equal");
    assert_eq!(
        quota(json!("inf")),
        json!({"type": "finite_number", "loc": ["body", "limit_gb"],
        "msg": "Input should be a finite number", "input": "inf"})
    );
    // Past 64 bits: the bound on its side, else int_parsing_size.
    let port = |v| errs(&REGISTER, json!({"ip": "h", "http_port": v}))[0].clone();
    assert_eq!(
        port(json!(9_223_372_036_854_775_808_u64))["type"],
        "less_than_equal"
    );
    assert_eq!(
        port(json!("-99999999999999999999"))["type"],
        "greater_than_equal"
    );
    assert_eq!(port(json!(1.5e300))["type"], "int_parsing_size");
    let rank = |v| {
        let key = json!({"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": v});
        errs(&LOOKUP, json!({"keys": [key]}))[0]["type"].clone()
    };
    assert_eq!(rank(json!("99999999999999999999")), "int_parsing_size");
    assert_eq!(rank(json!("--3")), "int_parsing");
}

/// `py_float` writes what CPython 3.11's `repr` writes (the strings below
/// are its output for the same literals).
#[test]
fn floats_are_written_as_python_writes_them() {
    let cases: [(f64, &str); 26] = [
        (0.0, "0.0"),
        (-0.0, "-0.0"),
        (1.0, "1.0"),
        (1.5, "1.5"),
        (-1e-05, "-1e-05"),
        (1e-05, "1e-05"),
        (0.0001, "0.0001"),
        (0.00012345, "0.00012345"),
        (1e16, "1e+16"),
        (1e15, "1000000000000000.0"),
        (123456789012345.6, "123456789012345.6"),
        (1234567890123456.7, "1234567890123456.8"),
        (1.5e16, "1.5e+16"),
        (2.5e-07, "2.5e-07"),
        (1e308, "1e+308"),
        (5e-324, "5e-324"),
        (0.1, "0.1"),
        (0.3, "0.3"),
        (100.0, "100.0"),
        (-2.0, "-2.0"),
        (1e22, "1e+22"),
        (123.456, "123.456"),
        (9999999999999998.0, "9999999999999998.0"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
        (f64::INFINITY, "inf"),
        (f64::NAN, "nan"),
    ];
    for (x, want) in cases {
        assert_eq!(py_float(x), want, "{x:e}");
    }
}
