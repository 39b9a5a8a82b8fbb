//! Every field of every request model and every query parameter, each sent
//! with pydantic's lax-mode edge values (after the audit's
//! e2e/conformance/coordinator_diff.py, without the values whose answers
//! differ for a documented reason: integers past 64 bits, `inf`/`nan`,
//! `world_size` past 255, token ids past u32, hex with spaces;
//! docs/coordinator.md, "Request edges not reproduced").

use serde_json::{Value, json};

use super::{Req, j, key, raw};

/// Integer edge values (a bound refuses some, the lax rules others).
fn ints() -> Vec<Value> {
    json!([
        "3",
        4.0,
        true,
        false,
        "3.5",
        3.5,
        " 3",
        "3 ",
        null,
        [],
        {},
        "1e3",
        "0x10",
        "",
        "  ",
        "\u{663}",
        3.000_000_1,
        -0.0,
        "-0",
        "+0",
        "00",
        "0_1",
        "1_",
        "_1",
        "3.0",
        "3.",
        ".0",
        "-3",
        255,
        0,
        -1,
        7
    ])
    .as_array()
    .unwrap()
    .clone()
}

fn floats() -> Vec<Value> {
    json!([
        "1.5",
        2,
        true,
        "x",
        null,
        [],
        " 1.5 ",
        "1_0",
        "",
        -0.0,
        "1e-3",
        "0x1p3",
        ".5",
        "5.",
        -1,
        0
    ])
    .as_array()
    .unwrap()
    .clone()
}

fn bools() -> Vec<Value> {
    json!([
        "yes",
        "no",
        "on",
        "off",
        "t",
        "f",
        "y",
        "n",
        1,
        0,
        2,
        1.0,
        0.5,
        "1",
        "0",
        "true",
        "TRUE",
        "True",
        " true",
        null,
        [],
        "",
        "2"
    ])
    .as_array()
    .unwrap()
    .clone()
}

fn strs() -> Vec<Value> {
    json!([
        5,
        5.5,
        true,
        null,
        [],
        {},
        "",
        " x ",
        "\u{e9}",
        "a\u{0}b",
        "a".repeat(300)
    ])
    .as_array()
    .unwrap()
    .clone()
}

fn tiers() -> Vec<Value> {
    json!(["l1", "l2", "all", "L2", " l2", "l3", 1, null, "", []])
        .as_array()
        .unwrap()
        .clone()
}

fn event_types() -> Vec<Value> {
    json!([
        "store", "remove", "config", "clear", "STORE", "Store", 1, null, "", "stor"
    ])
    .as_array()
    .unwrap()
    .clone()
}

/// `base` with `path` removed (`None`) or set.
fn with(base: &Value, path: &[Value], v: Option<&Value>) -> Value {
    let mut out = base.clone();
    let mut cur = &mut out;
    for p in &path[..path.len() - 1] {
        cur = match p {
            Value::String(s) => &mut cur[s.as_str()],
            Value::Number(n) => &mut cur[usize::try_from(n.as_u64().unwrap()).unwrap()],
            _ => unreachable!(),
        };
    }
    let last = path[path.len() - 1].as_str().unwrap();
    match v {
        Some(v) => cur[last] = v.clone(),
        None => {
            cur.as_object_mut().unwrap().remove(last);
        }
    }
    out
}

/// The requests for one body: as is, each field missing and each field
/// with each of its values, and with a field the model does not know.
fn sweep(
    out: &mut Vec<Req>,
    method: &'static str,
    path: &'static str,
    base: &Value,
    fields: &[(&[Value], Vec<Value>)],
) {
    out.push(j(method, path, base.clone()));
    for (at, values) in fields {
        out.push(j(method, path, with(base, at, None)));
        for v in values {
            out.push(j(method, path, with(base, at, Some(v))));
        }
    }
    let mut extra = base.clone();
    extra["extra_field"] = json!(1);
    out.push(j(method, path, extra));
}

pub(super) fn cases() -> Vec<Req> {
    let mut c = Vec::new();
    let f = |name: &str| vec![json!(name)];
    // world_size past 255 is a house bound (400).
    let not_world = |v: Vec<Value>| -> Vec<Value> {
        v.into_iter()
            .filter(|v| !v.as_f64().is_some_and(|n| n > 255.0))
            .collect()
    };
    let register = json!({"instance_id": "sw-i1", "ip": "h", "http_port": 1, "metadata": {"a": "b"},
        "p2p_advertised_url": "u", "mq_port": 2});
    let metadata = json!([{"a": 1}, {"a": null}, {"a": true}, [], null, "x", {"a": ["x"]}]);
    sweep(
        &mut c,
        "POST",
        "/instances",
        &register,
        &[
            (&f("http_port"), ints()),
            (&f("mq_port"), ints()),
            (&f("ip"), strs()),
            (&f("instance_id"), strs()),
            (&f("p2p_advertised_url"), strs()),
            (&f("metadata"), metadata.as_array().unwrap().clone()),
        ],
    );
    let blend =
        json!({"tokens_b64": "AAAAAA==", "model_name": "m", "world_size": 1, "cache_salt": ""});
    sweep(
        &mut c,
        "POST",
        "/directory/blend-lookup",
        &blend,
        &[
            (&f("world_size"), not_world(ints())),
            (&f("model_name"), strs()),
            (&f("cache_salt"), strs()),
        ],
    );
    let token_lists = json!([
        [],
        null,
        "1",
        [null],
        [[1]],
        ["1", 2.0, true],
        [1.5],
        ["x"],
        {}
    ]);
    let token_lists = token_lists.as_array().unwrap().clone();
    let delete = json!({"instance_id": "x", "model_name": "m", "world_size": 1, "token_ids": [1],
        "cache_salt": "", "tier": "l2", "force": false});
    sweep(
        &mut c,
        "POST",
        "/cache/delete",
        &delete,
        &[
            (&f("world_size"), not_world(ints())),
            (&f("force"), bools()),
            (&f("tier"), tiers()),
            (&f("instance_id"), strs()),
            (&f("model_name"), strs()),
            (&f("cache_salt"), strs()),
            (&f("token_ids"), token_lists.clone()),
        ],
    );
    let pins = json!({"model_name": "m", "world_size": 1, "token_ids": [1], "cache_salt": ""});
    for method in ["POST", "DELETE"] {
        sweep(
            &mut c,
            method,
            "/cache/pins",
            &pins,
            &[
                (&f("world_size"), not_world(ints())),
                (&f("model_name"), strs()),
                (&f("cache_salt"), strs()),
                (&f("token_ids"), token_lists.clone()),
            ],
        );
    }
    // Prefetch: validation only (an MP server that answers is elsewhere).
    let prefetch = json!({"instance_id": "sw-nobody", "model_name": "m", "world_size": 1,
        "token_ids": [1], "cache_salt": ""});
    sweep(
        &mut c,
        "POST",
        "/cache/prefetches",
        &prefetch,
        &[
            (&f("world_size"), not_world(ints())),
            (&f("model_name"), strs()),
            (&f("cache_salt"), strs()),
        ],
    );
    sweep(
        &mut c,
        "PUT",
        "/quota/sw1",
        &json!({"limit_gb": 1.0, "tier": "l2"}),
        &[(&f("limit_gb"), floats()), (&f("tier"), tiers())],
    );
    sweep(
        &mut c,
        "PUT",
        "/quota/config",
        &json!({"default_limit_gb": 1.0, "tier": "l2"}),
        &[(&f("default_limit_gb"), floats()), (&f("tier"), tiers())],
    );
    // Lookup by keys and by tokens.
    let mut lookup_key = key("ab");
    lookup_key["object_group_id"] = json!(0);
    lookup_key["cache_salt"] = json!("");
    let lk = json!({"keys": [lookup_key]});
    let k = |name: &str| vec![json!("keys"), json!(0), json!(name)];
    let hexes: Vec<Value> = strs()
        .into_iter()
        .chain(
            json!(["AB", "0xab", "a", "gg", "abab".repeat(40)])
                .as_array()
                .unwrap()
                .clone(),
        )
        .collect();
    sweep(
        &mut c,
        "POST",
        "/directory/lookup",
        &lk,
        &[
            (&k("kv_rank"), ints()),
            (&k("object_group_id"), ints()),
            (&k("chunk_hash_hex"), hexes.clone()),
            (&k("model_name"), strs()),
            (&k("cache_salt"), strs()),
        ],
    );
    let tk = json!({"token_ids": [1, 2, 3], "model_name": "m", "world_size": 1, "cache_salt": ""});
    sweep(
        &mut c,
        "POST",
        "/directory/lookup",
        &tk,
        &[
            (&f("world_size"), not_world(ints())),
            (&f("model_name"), strs()),
            (&f("cache_salt"), strs()),
            (&f("token_ids"), token_lists),
        ],
    );
    // Events: every batch and entry field (each batch its own instance, so
    // the gate admits it whatever came before).
    let mut n = 0;
    let mut batch = || {
        n += 1;
        json!({"batches": [{"instance_id": format!("sw-{n}"), "incarnation": 1, "seq": 1,
            "event_type": "store", "tier": "l2", "backend": "fs",
            "entries": [{"key": key("ab"), "size_bytes": 10, "token_ids": [1, 2], "token_offset": 0}],
            "shared": false, "ts": 1.0, "capacity_bytes": 100, "capacity_revision": 1}]})
    };
    let b = |name: &str| vec![json!("batches"), json!(0), json!(name)];
    let e = |name: &str| {
        vec![
            json!("batches"),
            json!(0),
            json!("entries"),
            json!(0),
            json!(name),
        ]
    };
    let ek = |name: &str| {
        vec![
            json!("batches"),
            json!(0),
            json!("entries"),
            json!(0),
            json!("key"),
            json!(name),
        ]
    };
    let entries = json!([null, {}, [], "x", [null]])
        .as_array()
        .unwrap()
        .clone();
    let keys = json!([null, "ab", [], {}]).as_array().unwrap().clone();
    let fields: Vec<(Vec<Value>, Vec<Value>)> = vec![
        (b("instance_id"), strs()),
        (b("incarnation"), ints()),
        (b("seq"), ints()),
        (b("event_type"), event_types()),
        (b("tier"), tiers()),
        (b("backend"), strs()),
        (b("shared"), bools()),
        (b("ts"), floats()),
        (b("capacity_bytes"), ints()),
        (b("capacity_revision"), ints()),
        (b("entries"), entries),
        (e("size_bytes"), ints()),
        (e("token_offset"), ints()),
        (e("key"), keys),
        (ek("kv_rank"), ints()),
        (ek("object_group_id"), ints()),
        (
            ek("chunk_hash_hex"),
            strs().into_iter().filter(|v| v != " ").collect(),
        ),
    ];
    for (at, values) in &fields {
        c.push(j("POST", "/events", with(&batch(), at, None)));
        for v in values {
            c.push(j("POST", "/events", with(&batch(), at, Some(v))));
        }
    }
    for et in ["remove", "config", "clear"] {
        c.push(j(
            "POST",
            "/events",
            with(&batch(), &b("event_type"), Some(&json!(et))),
        ));
    }
    // Every route once more with its other answers: a known and an
    // unknown instance, the listings' filters, the quota reads and deletes.
    for (method, path) in [
        ("GET", "/healthz"),
        ("PUT", "/instances/a/heartbeat"),
        ("PUT", "/instances/nobody/heartbeat"),
        ("GET", "/instances/a/usage"),
        ("GET", "/instances/nobody/usage"),
        ("GET", "/instances/usage"),
        ("GET", "/cache/prefetches/nobody/r1"),
        ("GET", "/directory/keys?instance_id=sw-3&backend=fs&tier=l2"),
        ("GET", "/directory/keys?instance_id=nobody"),
        ("GET", "/directory/keys?backend=zz&tier=l1&offset=1&limit=2"),
        ("GET", "/cache/pins?model_name=m&cache_salt=s"),
        ("GET", "/cache/pins?model_name=zz"),
        ("GET", "/quota/config?tier=l2"),
        ("GET", "/quota/config?tier=l1"),
        ("GET", "/quota/sw1?tier=l2"),
        ("DELETE", "/quota/sw1?tier=l1"),
        ("DELETE", "/quota/sw1?tier=l2"),
        ("DELETE", "/quota/nothing"),
        ("GET", "/quota/sw1"),
        ("DELETE", "/instances/a"),
        ("DELETE", "/instances/a"),
        ("PUT", "/instances/a/heartbeat"),
        ("GET", "/instances"),
        ("GET", "/directory/stats"),
    ] {
        c.push(raw(method, path, None, ""));
    }
    c
}
