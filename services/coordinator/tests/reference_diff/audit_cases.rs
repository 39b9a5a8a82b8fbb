//! The cases of the conformance audit of 2026-12-06 (issue 43 items 1-4),
//! each answered differently by ours before it: sent after the main list of
//! `cases()` and before its last request, in this order.

use serde_json::json;

use super::{Req, encoded, j, raw};

pub(super) fn cases() -> Vec<Req> {
    vec![
        // The audit of 2026-12-06 (each answered differently before).
        // Routing on the percent-decoded path, as uvicorn hands Starlette.
        raw("GET", "/%69nstances", None, ""),
        raw("PUT", "/%69nstances", None, ""),
        raw("GET", "/instances%2F", None, ""),
        raw("PUT", "/instances/a%2Fb/heartbeat", None, ""),
        raw("GET", "/quota/a%2Fb", None, ""),
        raw("GET", "/instances/%FF/usage", None, ""),
        raw("GET", "/instances/%C3%A9%2525/usage", None, ""),
        // Empty segments match no parameter; every trailing slash is stripped.
        raw("PUT", "/instances//heartbeat", None, ""),
        raw("GET", "/cache/prefetches//b", None, ""),
        raw("GET", "/quota//", None, ""),
        // The reference's route order: DELETE /instances/{id} takes "usage".
        raw("DELETE", "/instances/usage", None, ""),
        // FastAPI's pages: GET and HEAD, the Allow in that order.
        raw("POST", "/openapi.json", None, ""),
        raw("OPTIONS", "/docs", None, ""),
        raw("GET", "/docs", None, ""),
        raw("GET", "/redoc", None, ""),
        raw("HEAD", "/redoc", None, ""),
        raw("GET", "/docs/oauth2-redirect", None, ""),
        raw("GET", "/redoc/", None, ""),
        // Lax coercion: a fraction is no boolean; nan fails a bound; an
        // integer past 64 bits fails the bound on its side; a float past
        // them is int_parsing_size.
        j(
            "POST",
            "/cache/delete",
            json!({"instance_id": "x", "model_name": "m", "world_size": 1, "force": 0.5}),
        ),
        j("PUT", "/quota/t3", json!({"limit_gb": "nan"})),
        j("PUT", "/quota/t3", json!({"limit_gb": "-inf"})),
        j("PUT", "/quota/config", json!({"default_limit_gb": "NaN"})),
        j(
            "POST",
            "/instances",
            json!({"ip": "h", "http_port": 9_223_372_036_854_775_808_u64}),
        ),
        j(
            "POST",
            "/instances",
            json!({"ip": "h", "http_port": 1, "mq_port": "1111111111111111111111111"}),
        ),
        j(
            "POST",
            "/instances",
            json!({"ip": "h", "http_port": 1.5e300}),
        ),
        raw(
            "GET",
            "/directory/keys?limit=1111111111111111111111111",
            None,
            "",
        ),
        // A UTF-8 byte order mark: json.loads(bytes) skips it.
        raw(
            "PUT",
            "/quota/t4",
            Some("application/json"),
            "\u{feff}{\"tier\":\"l1\"}",
        ),
        // base64 as Python 3.11's strict b64decode reads it.
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "\u{e9}", "model_name": "m"}),
        ),
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "AA==AA==", "model_name": "m"}),
        ),
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "=AAA", "model_name": "m"}),
        ),
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "AAAAAB==", "model_name": "m"}),
        ),
        j(
            "POST",
            "/directory/blend-lookup",
            json!({"tokens_b64": "AAAAAAAAAAAAAAAA=", "model_name": "m"}),
        ),
        // Python's repr of a control character in a refused salt.
        j(
            "POST",
            "/cache/pins",
            json!({"model_name": "m", "world_size": 1, "cache_salt": "a\u{0}b\n"}),
        ),
        j(
            "POST",
            "/cache/pins",
            json!({"model_name": "m", "world_size": 1, "cache_salt": "a\\b"}),
        ),
        j(
            "POST",
            "/cache/pins",
            json!({"model_name": "m", "world_size": 1, "cache_salt": "it's/"}),
        ),
        // Session 11: methods outside uvicorn's parser (httptools) are its
        // 400, before any routing; the ones it knows reach Starlette.
        raw("FOO", "/instances", None, ""),
        raw("get", "/instances", None, ""),
        raw("DESCRIBE", "/nothing", None, ""),
        raw("PROPFIND", "/instances", None, ""),
        raw("QUERY", "/quota/t1", None, ""),
        // A wrong method on a path Starlette does not match but axum's
        // router does (an empty or encoded-slash segment): a plain 404.
        raw("GET", "/instances//heartbeat", None, ""),
        raw("GET", "/instances/a%2Fb/heartbeat", None, ""),
        raw("PUT", "/cache/prefetches//b", None, ""),
        // JSON in UTF-16 and UTF-32, as json.loads(bytes) detects them.
        encoded("/quota/t5", r#"{"limit_gb": 2, "tier": "l1"}"#, "utf-16"),
        encoded("/quota/t5", r#"{"limit_gb": 3, "tier": "l2"}"#, "utf-16-le"),
        encoded("/quota/t5", r#"{"limit_gb": 4}"#, "utf-16-be"),
        encoded("/quota/t5", r#"{"limit_gb": 5, "tier": "l1"}"#, "utf-32"),
        encoded(
            "/quota/t5",
            r#"{"limit_gb": 6, "tier": "all"}"#,
            "utf-32-le",
        ),
        encoded("/quota/t5", r#"{"limit_gb": 7}"#, "utf-32-be"),
        encoded("/quota/t5", r#"{"limit_gb": }"#, "utf-16-be"),
        encoded("/quota/t5", "{\"tier\": \"\u{1f600}\u{e9}\"}", "utf-16"),
        encoded("/quota/t5", r#"{"tier": "l9"}"#, "utf-32-le"),
        encoded("/quota/t5", "7", "utf-16-le"),
        // An odd byte count is no UTF-16: the 400 of any undecodable body.
        Req(
            "PUT",
            "/quota/t5",
            Some("application/json"),
            vec![0xff, 0xfe, b'{'],
        ),
        // A lone surrogate (Python's surrogatepass keeps it): one character.
        Req(
            "PUT",
            "/quota/t5",
            Some("application/json"),
            vec![0xfe, 0xff, 0xd8, 0x00, 0x00, b'{'],
        ),
        raw("GET", "/quota/t5", None, ""),
    ]
}
