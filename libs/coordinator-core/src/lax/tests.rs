use serde_json::json;

use super::json::{DecodeError, decode};
use super::models::{EVENTS, KEYS_QUERY, LOOKUP, REGISTER};
use super::{validate_body, validate_query};

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
