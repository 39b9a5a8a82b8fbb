//! Differential tests against the real LMCache 0.5.6 coordinator: the same
//! requests go to `lmcache coordinator` (from the conformance venv,
//! `IC_CONFORMANCE_VENV`; the test fails without it) and to our binary, in
//! the same order, and status, JSON body and the routing headers must be
//! equal. Covers lax coercions, pydantic's error bodies, malformed JSON,
//! content types, duplicate query parameters, trailing slashes, HEAD,
//! `405 Allow`, `/openapi.json`, and the command line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[path = "reference_diff/audit_cases.rs"]
mod audit_cases;
#[path = "reference_diff/flags.rs"]
mod flags;
#[path = "reference_diff/sweep.rs"]
mod sweep;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn lmcache() -> std::path::PathBuf {
    ic_e2e::conformance::venv().join("bin/lmcache")
}

fn start_reference(port: u16, extra: &[&str]) -> Proc {
    let child = Command::new(lmcache())
        .args([
            "coordinator",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .args(extra)
        .env("LMCACHE_DISABLE_BANNER", "1")
        .env("LMCACHE_TRACK_USAGE", "false")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start lmcache coordinator");
    Proc(child)
}

fn start_ours(port: u16, extra: &[&str]) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_ic-coordinator"))
        .args([
            "coordinator",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ic-coordinator");
    Proc(child)
}

async fn wait_ready(http: &reqwest::Client, port: u16, proc: &mut Proc) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(r) = http
            .get(format!("http://127.0.0.1:{port}/healthz"))
            .send()
            .await
            && r.status().is_success()
        {
            return;
        }
        if let Ok(Some(status)) = proc.0.try_wait() {
            panic!("server on {port} exited before it was ready: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "server on {port} never became ready"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Both servers, started with the same extra flags (loops off unless the
/// flags name them), ready.
async fn pair(http: &reqwest::Client, extra: &[&str]) -> ((u16, Proc), (u16, Proc)) {
    let (rp, op) = (ic_e2e::free_port(), ic_e2e::free_port());
    let mut reference = start_reference(rp, extra);
    let mut ours = start_ours(op, extra);
    wait_ready(http, rp, &mut reference).await;
    wait_ready(http, op, &mut ours).await;
    ((rp, reference), (op, ours))
}

/// One request: method, path (with query), content type (None: no header),
/// raw body.
struct Req(&'static str, &'static str, Option<&'static str>, Vec<u8>);

fn j(method: &'static str, path: &'static str, body: Value) -> Req {
    Req(
        method,
        path,
        Some("application/json"),
        body.to_string().into_bytes(),
    )
}

fn raw(method: &'static str, path: &'static str, ct: Option<&'static str>, body: &str) -> Req {
    Req(method, path, ct, body.as_bytes().to_vec())
}

/// A JSON body in another encoding (`json.loads` of bytes detects UTF-16
/// and UTF-32 by the byte order mark or the zero bytes around ASCII).
fn encoded(path: &'static str, body: &str, encoding: &str) -> Req {
    let bom: &[u8] = match encoding {
        "utf-16" => &[0xff, 0xfe],
        "utf-32" => &[0xff, 0xfe, 0, 0],
        _ => &[],
    };
    let mut bytes = bom.to_vec();
    for c in body.chars() {
        let mut units = [0u16; 2];
        match encoding {
            "utf-16" | "utf-16-le" => {
                for u in c.encode_utf16(&mut units) {
                    bytes.extend(u.to_le_bytes());
                }
            }
            "utf-16-be" => {
                for u in c.encode_utf16(&mut units) {
                    bytes.extend(u.to_be_bytes());
                }
            }
            "utf-32" | "utf-32-le" => bytes.extend(u32::from(c).to_le_bytes()),
            "utf-32-be" => bytes.extend(u32::from(c).to_be_bytes()),
            other => panic!("no encoding {other}"),
        }
    }
    Req("PUT", path, Some("application/json"), bytes)
}

#[derive(Debug, PartialEq)]
struct Answer {
    status: u16,
    allow: Option<String>,
    location: Option<String>,
    body: Value,
}

async fn send(http: &reqwest::Client, port: u16, r: &Req) -> Answer {
    let url = format!("http://127.0.0.1:{port}{}", r.1);
    let mut b = http.request(r.0.parse().unwrap(), url);
    if let Some(ct) = r.2 {
        b = b.header("content-type", ct);
    }
    if !r.3.is_empty() {
        b = b.body(r.3.clone());
    }
    let resp = b.send().await.unwrap();
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().replace(&port.to_string(), "PORT"))
    };
    // Starlette lists a route's methods from a Python set: their order
    // changes from one reference process to the next.
    let allow = header("allow").map(|a| {
        let mut m: Vec<&str> = a.split(", ").collect();
        m.sort_unstable();
        m.join(", ")
    });
    let location = header("location");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    let mut body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    // A registration without an id gets a random one.
    unrandom(&mut body);
    // Registration times differ by the microseconds between the two sends.
    if let Some(list) = body.get_mut("instances").and_then(Value::as_array_mut) {
        for i in list {
            i["registration_time"] = Value::Null;
        }
    }
    Answer {
        status,
        allow,
        location,
        body,
    }
}

/// Replaces the random instance ids a registration without one gets
/// (`mp-` and 32 hex digits, in both) by one placeholder.
fn unrandom(v: &mut Value) {
    match v {
        Value::String(s)
            if s.len() == 35
                && s.starts_with("mp-")
                && s[3..].bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            *s = "mp-RANDOM".to_owned();
        }
        Value::Array(items) => items.iter_mut().for_each(unrandom),
        Value::Object(map) => map.values_mut().for_each(unrandom),
        _ => {}
    }
}

fn batch(seq: Value, extra: Value) -> Value {
    let mut b = json!({"instance_id": "mp-a", "incarnation": 1, "seq": seq, "event_type": "store",
        "tier": "l2", "backend": "fs", "entries": []});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn key(hex: &str) -> Value {
    json!({"chunk_hash_hex": hex, "model_name": "m", "kv_rank": 0})
}

fn cases() -> Vec<Req> {
    let mut c = vec![
        // Registration: lax integers, bounds, missing fields, strip.
        j(
            "POST",
            "/instances",
            json!({"instance_id": "a", "ip": " 10.0.0.1 ", "http_port": "8080"}),
        ),
        j(
            "POST",
            "/instances",
            json!({"instance_id": "b", "ip": "h", "http_port": 4.0, "mq_port": " 7 "}),
        ),
        j(
            "POST",
            "/instances",
            json!({"instance_id": "c", "ip": "h", "http_port": true}),
        ),
        j("POST", "/instances", json!({"ip": "h", "http_port": 4.5})),
        j("POST", "/instances", json!({"ip": "h", "http_port": "x"})),
        j(
            "POST",
            "/instances",
            json!({"ip": "h", "http_port": "3__0"}),
        ),
        j(
            "POST",
            "/instances",
            json!({"ip": "h", "http_port": 0, "mq_port": 70000}),
        ),
        j("POST", "/instances", json!({"ip": "  ", "http_port": 1})),
        j("POST", "/instances", json!({"http_port": null})),
        j(
            "POST",
            "/instances",
            json!({"ip": 5, "http_port": [1], "metadata": {"a": 1}}),
        ),
        j(
            "POST",
            "/instances",
            json!({"ip": "h", "http_port": 1, "metadata": []}),
        ),
        j("POST", "/instances", json!([1])),
        // Bodies that are not JSON objects.
        raw(
            "POST",
            "/instances",
            Some("text/plain"),
            r#"{"ip":"h","http_port":3}"#,
        ),
        raw(
            "POST",
            "/instances",
            Some("application/x-www-form-urlencoded"),
            "ip=h",
        ),
        raw(
            "POST",
            "/instances",
            None,
            r#"{"instance_id":"d","ip":"h","http_port":3}"#,
        ),
        raw(
            "POST",
            "/instances",
            Some("application/vnd.api+json"),
            r#"{"instance_id":"e","ip":"h","http_port":3}"#,
        ),
        raw("POST", "/instances", Some("application/json"), ""),
        raw("POST", "/instances", Some("application/json"), "null"),
        raw(
            "POST",
            "/instances",
            Some("application/json"),
            r#"{"ip":"1.2.3.4","#,
        ),
        raw(
            "POST",
            "/instances",
            Some("application/json"),
            r#"{"ip" 1}"#,
        ),
        raw("POST", "/instances", Some("application/json"), r#"{"ip":1"#),
        raw("POST", "/instances", Some("application/json"), "[1,]"),
        raw("POST", "/instances", Some("application/json"), "{} x"),
        raw(
            "POST",
            "/instances",
            Some("application/json"),
            r#"{"ip":"h"#,
        ),
        raw("POST", "/instances", Some("application/json"), "  "),
        raw(
            "POST",
            "/instances",
            Some("application/json"),
            r#"{"instance_id":"f","ip":"x","ip":"h","http_port":1}"#,
        ),
        // Events: coercions, then each kind of error.
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(1.0), json!({"incarnation": "1", "shared": "yes", "ts": "2.5",
            "entries": [{"key": key("ab"), "size_bytes": "10", "token_ids": ["1", 2.0, true]}]}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"incarnation": -1, "event_type": "stor", "tier": "l3"}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"instance_id": ""}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(0), json!({}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"tier": "all"}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"ts": -1}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"event_type": "config", "entries": [{"key": key("ab")}]}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"backend": ""}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"entries": [{"key": key("ab"), "size_bytes": -1}]}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"entries": [{"key": key("ab"), "token_offset": -5}]}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"entries": [{"key": key("zz")}]}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"entries": [{"key": key("abc")}]}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"entries": [{"key": {"model_name": "m"}}]}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"entries": [{"key": {"chunk_hash_hex": "ab", "model_name": "m@x", "kv_rank": 0}}]}))]}),
        ),
        j(
            "POST",
            "/events",
            json!({"batches": [batch(json!(2), json!({"entries": [7]}))]}),
        ),
        j("POST", "/events", json!({"batches": [{}]})),
        j("POST", "/events", json!({"batches": {}})),
        j("POST", "/events", json!({"batches": [3]})),
        j("POST", "/events", json!({})),
        raw("POST", "/events", Some("application/json"), ""),
        // Lookup: the model validator, coercions, the stored key.
        j("POST", "/directory/lookup", json!({})),
        j(
            "POST",
            "/directory/lookup",
            json!({"keys": [key("ab")], "token_ids": [1]}),
        ),
        j("POST", "/directory/lookup", json!({"keys": [key("zz")]})),
        j("POST", "/directory/lookup", json!({"keys": [key("ab")]})),
        j(
            "POST",
            "/directory/lookup",
            json!({"keys": [{"chunk_hash_hex": "ab", "model_name": "m", "kv_rank": "0"}]}),
        ),
        j("POST", "/directory/lookup", json!({"token_ids": [1, 2]})),
        j(
            "POST",
            "/directory/lookup",
            json!({"token_ids": [1, 2], "model_name": "m", "world_size": 0}),
        ),
        j(
            "POST",
            "/directory/lookup",
            json!({"token_ids": [1, 2], "model_name": "m", "world_size": "2"}),
        ),
        j(
            "POST",
            "/directory/lookup",
            json!({"token_ids": [1, 2], "model_name": 5}),
        ),
        j(
            "POST",
            "/directory/lookup",
            json!({"token_ids": [1, 2], "model_name": "m", "world_size": false}),
        ),
        j(
            "POST",
            "/directory/lookup",
            json!({"token_ids": ["x"], "model_name": "m"}),
        ),
        // Blend lookup validation.
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "AAAA"}),
        ),
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "AAAAAA==", "model_name": "m"}),
        ),
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "AAAAA", "model_name": "m"}),
        ),
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "A!AA", "model_name": "m"}),
        ),
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "AAAAAAAAAAA=", "model_name": "m"}),
        ),
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "AAAAAA", "model_name": "m"}),
        ),
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"world_size": "0"}),
        ),
        // Query parameters: last repeated value wins, lax ints, bounds.
        raw("GET", "/directory/keys?limit=5&limit=abc", None, ""),
        raw("GET", "/directory/keys?limit=abc&limit=5", None, ""),
        raw("GET", "/directory/keys?limit=0&tier=l3&offset=-1", None, ""),
        raw("GET", "/directory/keys?limit=4.0&tier=l2", None, ""),
        raw("GET", "/directory/keys?limit=10001", None, ""),
        raw("GET", "/cache/pins?offset=x&limit=2", None, ""),
        raw("GET", "/quota?tier=l9", None, ""),
        // Operator bodies (validation only: no MP server needed).
        j("PUT", "/quota/t1", json!({"limit_gb": "1.5"})),
        j("PUT", "/quota/t2", json!({"limit_gb": -1})),
        j("PUT", "/quota/t2", json!({"limit_gb": "x", "tier": "l4"})),
        j("PUT", "/quota/t2", json!({})),
        j("PUT", "/quota/config", json!({"default_limit_gb": "2"})),
        j("PUT", "/quota/config", json!({"default_limit_gb": -2})),
        j("PUT", "/quota/config", json!({"default_limit_gb": null})),
        raw("GET", "/quota", None, ""),
        j("POST", "/cache/pins", json!({"model_name": "m"})),
        j(
            "POST",
            "/cache/pins",
            json!({"model_name": "m", "world_size": "0"}),
        ),
        j(
            "POST",
            "/cache/pins",
            json!({"model_name": "m", "world_size": "1", "token_ids": [1]}),
        ),
        j("DELETE", "/cache/pins", json!({"world_size": 1.5})),
        j(
            "POST",
            "/cache/delete",
            json!({"instance_id": "x", "model_name": "m", "world_size": 1, "tier": "l7", "force": "maybe"}),
        ),
        j("POST", "/cache/delete", json!({})),
        j("POST", "/cache/prefetches", json!({"instance_id": "x"})),
        j(
            "POST",
            "/cache/prefetches",
            json!({"instance_id": "x", "model_name": "m", "world_size": 0, "token_ids": {}}),
        ),
        // Routing edges.
        raw("PATCH", "/instances", None, ""),
        raw("PATCH", "/instances/usage", None, ""),
        raw("PATCH", "/quota/config", None, ""),
        raw("POST", "/healthz", None, ""),
        raw("HEAD", "/healthz", None, ""),
        raw("HEAD", "/instances", None, ""),
        raw("HEAD", "/openapi.json", None, ""),
        raw(
            "POST",
            "/instances/",
            Some("application/json"),
            r#"{"ip":"h","http_port":3}"#,
        ),
        raw("GET", "/directory/keys/?limit=2", None, ""),
        raw("PUT", "/instances/a/heartbeat/", None, ""),
        raw("GET", "/nothing/", None, ""),
        raw("GET", "/nothing", None, ""),
        raw("GET", "/openapi.json", None, ""),
        raw("GET", "/instances", None, ""),
        raw("GET", "/directory/keys", None, ""),
        raw("GET", "/directory/stats", None, ""),
    ];
    c.extend(audit_cases::cases());
    c.extend(sweep::cases());
    c.push(raw("GET", "/quota/t1", None, ""));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_errors_match_the_reference() {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let (rp, op) = (ic_e2e::free_port(), ic_e2e::free_port());
    // Loops off on both so no sweep changes state between the two runs.
    let flags = [
        "--health-check-interval",
        "0",
        "--eviction-check-interval",
        "0",
    ];
    let mut reference = start_reference(rp, &flags);
    let mut ours = start_ours(op, &flags);
    wait_ready(&http, rp, &mut reference).await;
    wait_ready(&http, op, &mut ours).await;
    let mut mismatches = Vec::new();
    let cases = cases();
    for r in &cases {
        let want = send(&http, rp, r).await;
        let got = send(&http, op, r).await;
        if want != got {
            mismatches.push(format!(
                "{} {} ({:?}) {}\n  reference: {want:?}\n  ours:      {got:?}",
                r.0,
                r.1,
                r.2,
                String::from_utf8_lossy(&r.3)
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} requests answered differently:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
    // A documented edge (docs/coordinator.md, "Request edges not
    // reproduced"): an integer past i64 in a lookup, which Python takes, is
    // ours to refuse as `int_parsing_size` (pydantic's error for a number
    // past 64 bits) naming the field — never a dropped connection (the
    // in-place reader's 19th digit once overflowed).
    for (value, body, loc) in [
        (
            "9999999999999999999",
            r#"{"keys":[{"chunk_hash_hex":"ab","model_name":"m","kv_rank":9999999999999999999}]}"#,
            json!(["body", "keys", 0, "kv_rank"]),
        ),
        (
            "-9999999999999999999",
            r#"{"keys":[{"chunk_hash_hex":"ab","model_name":"m","kv_rank":-9999999999999999999}]}"#,
            json!(["body", "keys", 0, "kv_rank"]),
        ),
        (
            "99999999999999999999",
            r#"{"keys":[{"chunk_hash_hex":"ab","model_name":"m","kv_rank":0,"object_group_id":99999999999999999999}]}"#,
            json!(["body", "keys", 0, "object_group_id"]),
        ),
        (
            "9999999999999999999",
            r#"{"keys":[{"chunk_hash_hex":"ab","model_name":"m","kv_rank":0}],"world_size":9999999999999999999}"#,
            json!(["body", "world_size"]),
        ),
    ] {
        let r = raw("POST", "/directory/lookup", Some("application/json"), body);
        assert_eq!(send(&http, rp, &r).await.status, 200, "reference: {body}");
        let got = send(&http, op, &r).await;
        let want: Value = serde_json::from_str(&format!(
            r#"{{"detail":[{{"type":"int_parsing_size","loc":{loc},"msg":"Unable to parse input string as an integer, exceeded maximum size","input":{value}}}]}}"#
        ))
        .unwrap();
        assert_eq!((got.status, got.body), (422, want), "{body}");
    }
}

/// Families of a `/metrics` body as prometheus_client (the reference's own
/// library, from the venv) parses the text format: `(name, type, help)`.
fn parse_families(text: &str) -> Vec<(String, String, String)> {
    let script = "import sys, json\nfrom prometheus_client.parser import text_string_to_metric_families as f\nprint(json.dumps([[m.name, m.type, m.documentation] for m in f(sys.stdin.read())]))";
    let mut child = Command::new(ic_e2e::conformance::venv().join("bin/python3"))
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "parser failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `/metrics` is the text format its content type names, every family is
/// typed and documented, and the reference's coordinator families (with
/// `target_info` and the event-bus gauges) are all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exposition_parses_like_the_references() {
    let http = reqwest::Client::new();
    let ((rp, _reference), (op, _ours)) = pair(&http, &[]).await;
    let get = |port: u16| {
        let http = http.clone();
        async move {
            let r = http
                .get(format!("http://127.0.0.1:{port}/metrics"))
                .send()
                .await
                .unwrap();
            let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
            (ct, r.text().await.unwrap())
        }
    };
    let (ref_ct, ref_text) = get(rp).await;
    let (our_ct, our_text) = get(op).await;
    assert_eq!(our_ct, ref_ct);
    let theirs = parse_families(&ref_text);
    let ours_f = parse_families(&our_text);
    for (name, kind, help) in &ours_f {
        assert!(
            kind != "unknown" && !help.is_empty(),
            "{name}: type {kind}, help {help:?}\n{our_text}"
        );
    }
    for (name, kind, help) in theirs
        .iter()
        .filter(|(n, _, _)| n.starts_with("lmcache") || n == "target_info")
    {
        assert!(
            ours_f.iter().any(|(n, k, _)| n == name && k == kind),
            "reference family {name} ({kind}) missing:\n{our_text}"
        );
        // The same help, but where ours counts something else (event
        // batches of requests, not events: docs/coordinator.md) or the
        // encoder ends it with a period.
        let own_words = [
            "lmcache_mp_event_bus_queue_depth",
            "lmcache_mp_event_bus_drain_lag_seconds",
            "target_info",
        ];
        if !own_words.contains(&name.as_str()) {
            let (_, _, ours_help) = ours_f.iter().find(|(n, _, _)| n == name).unwrap();
            assert_eq!(ours_help, help, "help of {name}");
        }
    }
}

/// 422 bodies are the reference's byte for byte where the input echoed is
/// no object (the errors' fields in pydantic's order: `type`, `loc`,
/// `msg`, `input`, `ctx`; docs/coordinator.md, "JSON key order").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_bodies_are_the_references_byte_for_byte() {
    let http = reqwest::Client::new();
    let ((rp, _reference), (op, _ours)) = pair(&http, &[]).await;
    let cases = [
        j("POST", "/instances", json!({"ip": "h", "http_port": "x"})),
        j(
            "POST",
            "/instances",
            json!({"ip": "h", "http_port": 4.5, "mq_port": -1}),
        ),
        j("PUT", "/quota/t1", json!({"limit_gb": -1})),
        j("PUT", "/quota/t1", json!({"limit_gb": 1, "tier": "l9"})),
        raw("GET", "/directory/keys?limit=0&offset=x", None, ""),
        raw("POST", "/instances", Some("application/json"), r#"{"ip":1"#),
        raw("POST", "/instances", Some("application/json"), ""),
        // Echoed floats in exponent form, written as Python writes them.
        raw(
            "PUT",
            "/quota/t1",
            Some("application/json"),
            r#"{"limit_gb": -1e-05}"#,
        ),
        raw(
            "PUT",
            "/quota/t1",
            Some("application/json"),
            r#"{"limit_gb": -1.5e16}"#,
        ),
        raw(
            "POST",
            "/instances",
            Some("application/json"),
            r#"{"ip": "h", "http_port": 2.5e-7}"#,
        ),
    ];
    let text = |port: u16, r: &Req| {
        let mut b = http.request(
            r.0.parse().unwrap(),
            format!("http://127.0.0.1:{port}{}", r.1),
        );
        if let Some(ct) = r.2 {
            b = b.header("content-type", ct);
        }
        let b = b.body(r.3.clone());
        async move {
            let resp = b.send().await.unwrap();
            (resp.status().as_u16(), resp.text().await.unwrap())
        }
    };
    let mut wrong = Vec::new();
    for r in &cases {
        let (want, got) = (text(rp, r).await, text(op, r).await);
        assert_eq!(want.0, 422, "{} {}", r.0, r.1);
        if want != got {
            wrong.push(format!(
                "{} {}\n  reference: {}\n  ours:      {}",
                r.0, r.1, want.1, got.1
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
