//! The engine's own KV-event publisher, read from its command line, so the
//! injected subscriber listens where the engine actually publishes.
//!
//! vLLM and SGLang both take `--kv-events-config` as JSON (vLLM also takes
//! its fields one by one as `--kv-events-config.<field> value`). The fields
//! that matter here, with the engines' defaults:
//!
//! | field | default | meaning |
//! |---|---|---|
//! | `enable_kv_cache_events` | false | vLLM only: the master switch |
//! | `publisher` | vLLM: `zmq` when enabled, else `null` (older releases: `null`); SGLang: `null` | `zmq` publishes |
//! | `endpoint` | `tcp://*:5557` | the PUB socket; bound when it has a wildcard host, connected otherwise |
//! | `replay_endpoint` | none | a ROUTER the subscriber asks for missed batches |
//! | `topic` | `""` | first frame of every message |
//! | `bind` | unset | SGLang only: `true` binds and `false` connects, whatever the host |
//!
//! The engine binds `tcp://*:PORT`; the sidecar, in the same network
//! namespace, dials `tcp://127.0.0.1:PORT`.

use k8s_openapi::api::core::v1::Container;
use serde_json::{Map, Value};

use ic_api::cachebackend::Runtime;

use crate::merge::parse_args;

/// The flag both engines take.
pub const FLAG: &str = "--kv-events-config";
/// The engines' default publisher endpoint.
pub const DEFAULT_ENDPOINT: &str = "tcp://*:5557";

/// Where the subscriber listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Publisher {
    /// `--engine-endpoint`: the engine's PUB socket as the sidecar dials it.
    pub endpoint: String,
    /// `--replay-endpoint`: the engine's replay ROUTER, when it has one.
    pub replay_endpoint: Option<String>,
    /// `--topic`.
    pub topic: String,
}

/// What the engine's command line says about KV events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEvents {
    /// Where to listen (the engine defaults when it does not publish).
    pub publisher: Publisher,
    /// Why the subscriber will hear nothing (or only part), for an admission
    /// warning; empty when the engine publishes where the sidecar can hear it.
    pub problems: Vec<String>,
}

/// Reads `engine`'s `--kv-events-config` (in `command` and `args`, including
/// a `sh -c` script) as `runtime` interprets it. Never fails: whatever cannot
/// be understood becomes a problem and the defaults.
pub fn read(engine: &Container, runtime: Runtime) -> KvEvents {
    let tokens = command_line(engine);
    let mut config = Map::new();
    let mut problems = Vec::new();
    let mut found = false;
    for item in parse_args(&tokens) {
        let Some(raw) = item.flag.as_deref() else {
            continue;
        };
        // vLLM's parser reads `--kv_events_config` as `--kv-events-config`.
        let flag = match raw.split_once('.') {
            Some((name, field)) => format!("{}.{field}", name.replace('_', "-")),
            None => raw.replace('_', "-"),
        };
        let flag = flag.as_str();
        let value = item.value.clone().unwrap_or_default();
        if flag == FLAG {
            found = true;
            match serde_json::from_str::<Value>(&value) {
                Ok(Value::Object(fields)) => config.extend(fields),
                Ok(_) | Err(_) => problems.push(format!(
                    "the engine's {FLAG} value {value:?} is not a JSON object"
                )),
            }
        } else if let Some(field) = flag.strip_prefix(FLAG).and_then(|f| f.strip_prefix('.')) {
            found = true;
            // Dotted form: vLLM parses the value as JSON where it can.
            let parsed = serde_json::from_str(&value).unwrap_or(Value::String(value));
            config.insert(field.replace('-', "_"), parsed);
        }
    }
    let text = |key: &str| config.get(key).and_then(Value::as_str).map(str::trim);
    let publisher_kind = text("publisher");
    let publishing = match runtime {
        Runtime::Vllm => {
            let enabled = match config.get("enable_kv_cache_events") {
                Some(Value::Bool(b)) => *b,
                Some(Value::String(s)) => s.eq_ignore_ascii_case("true"),
                _ => false,
            };
            enabled && publisher_kind.is_none_or(|p| p == "zmq")
        }
        Runtime::SGLang => publisher_kind == Some("zmq"),
    };
    if !found {
        problems.push(format!(
            "the engine is not started with {FLAG}, so it publishes no KV events"
        ));
    } else if !publishing {
        problems.push(match runtime {
            Runtime::Vllm => format!(
                "the engine's {FLAG} does not publish: it needs \"enable_kv_cache_events\": true and \"publisher\": \"zmq\""
            ),
            Runtime::SGLang => format!(
                "the engine's {FLAG} does not publish: it needs \"publisher\": \"zmq\""
            ),
        });
    }
    let endpoint = text("endpoint").unwrap_or(DEFAULT_ENDPOINT);
    // SGLang's `bind` overrides its endpoint heuristic (vLLM has no such field).
    let bind = match runtime {
        Runtime::SGLang => config.get("bind").and_then(Value::as_bool),
        Runtime::Vllm => None,
    };
    let (endpoint, problem) = match bind {
        Some(bind) => dial_sglang_bind(endpoint, bind),
        None => dial(endpoint, "endpoint", true),
    };
    problems.extend(problem);
    let replay_endpoint = match text("replay_endpoint").filter(|e| !e.is_empty()) {
        Some(replay) => {
            let (replay, problem) = dial(replay, "replay_endpoint", false);
            problems.extend(problem);
            Some(replay)
        }
        None => None,
    };
    KvEvents {
        publisher: Publisher {
            endpoint,
            replay_endpoint,
            topic: text("topic").unwrap_or_default().to_owned(),
        },
        problems: if publishing || !found {
            problems
        } else {
            // Endpoint details do not matter when nothing is published.
            problems.into_iter().take(1).collect()
        },
    }
}

/// The address the sidecar dials for an endpoint the engine binds: a
/// wildcard host becomes loopback. `pub_socket`: the engine connects (rather
/// than binds) its PUB socket to a non-wildcard TCP address, which a
/// subscriber that also connects can never meet.
fn dial(endpoint: &str, field: &str, pub_socket: bool) -> (String, Option<String>) {
    if let Some(rest) = endpoint.strip_prefix("tcp://") {
        let (host, port) = match rest.rsplit_once(':') {
            Some(split) => split,
            None => {
                return (
                    endpoint.to_owned(),
                    Some(format!(
                        "the engine's {FLAG} {field} {endpoint:?} has no port"
                    )),
                );
            }
        };
        return match host {
            "*" | "0.0.0.0" => (format!("tcp://127.0.0.1:{port}"), None),
            "[::]" | "::" | "[*]" => (format!("tcp://[::1]:{port}"), None),
            _ if pub_socket => (
                endpoint.to_owned(),
                Some(format!(
                    "the engine's {FLAG} {field} {endpoint:?} names a host, so the engine connects its \
                     publisher there instead of binding it; bind on all interfaces with \"tcp://*:{port}\""
                )),
            ),
            _ => (endpoint.to_owned(), None),
        };
    }
    let problem = endpoint.starts_with("ipc://").then(|| {
        format!(
            "the engine's {FLAG} {field} {endpoint:?} is an ipc:// socket, which the kvevent-subscriber \
             container reaches only if the socket's directory is a volume both containers mount"
        )
    });
    (endpoint.to_owned(), problem)
}

/// [`dial`] for an SGLang endpoint with an explicit `"bind"`: `true` binds
/// even a named host (the sidecar dials it as written: only this pod's own
/// address is reachable), `false` connects even a wildcard one, which
/// SGLang cannot do (ZMQ refuses to connect to `*`: the engine fails to
/// start).
fn dial_sglang_bind(endpoint: &str, bind: bool) -> (String, Option<String>) {
    let host = endpoint
        .strip_prefix("tcp://")
        .and_then(|rest| rest.rsplit_once(':'))
        .map(|(host, _)| host);
    let wildcard = host.is_some_and(|h| matches!(h, "*" | "0.0.0.0" | "[::]" | "::" | "[*]"));
    match (host, bind) {
        (Some(_), false) if wildcard => (
            endpoint.to_owned(),
            Some(format!(
                "the engine's {FLAG} sets \"bind\": false with the wildcard endpoint {endpoint:?}: \
                 SGLang then connects its publisher to \"*\", which fails at engine start; drop \"bind\" or set it true"
            )),
        ),
        (Some(host), true) if !wildcard => {
            let loopback = matches!(host, "127.0.0.1" | "localhost" | "[::1]");
            let problem = (!loopback).then(|| {
                format!(
                    "the engine's {FLAG} sets \"bind\": true with endpoint {endpoint:?}: SGLang binds only {host}, \
                     which the sidecar reaches only if it is this pod's own address; bind \"tcp://*:PORT\""
                )
            });
            (endpoint.to_owned(), problem)
        }
        _ => dial(endpoint, "endpoint", true),
    }
}

/// The engine container's command line as separate words: `command` then
/// `args`, with a `sh -c '<script>'` (or `bash -c`) split into words.
pub fn command_line(engine: &Container) -> Vec<String> {
    let words: Vec<String> = engine
        .command
        .iter()
        .flatten()
        .chain(engine.args.iter().flatten())
        .cloned()
        .collect();
    let mut out = Vec::with_capacity(words.len());
    let mut iter = words.iter().peekable();
    while let Some(word) = iter.next() {
        let shell = word
            .rsplit('/')
            .next()
            .is_some_and(|w| matches!(w, "sh" | "bash" | "dash" | "zsh"));
        if shell && iter.peek().is_some_and(|w| w.as_str() == "-c") {
            iter.next();
            if let Some(script) = iter.next() {
                out.extend(shell_words(script));
            }
            continue;
        }
        out.push(word.clone());
    }
    out
}

/// Splits a shell command into words the way a POSIX shell would for plain
/// words and quoting (single quotes, double quotes with backslash escapes,
/// backslashes); expansions are left as written and `;`, `&&`, `|` and
/// newlines separate words like spaces.
pub fn shell_words(script: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut chars = script.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    current.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => match chars.peek() {
                            Some(&n @ ('"' | '\\' | '$' | '`')) => {
                                current.push(n);
                                chars.next();
                            }
                            Some('\n') => {
                                chars.next();
                            }
                            _ => current.push('\\'),
                        },
                        _ => current.push(q),
                    }
                }
            }
            '\\' => match chars.next() {
                Some('\n') | None => {}
                Some(n) => {
                    in_word = true;
                    current.push(n);
                }
            },
            c if c.is_whitespace() || matches!(c, ';' | '&' | '|') => {
                if in_word {
                    words.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                current.push(c);
            }
        }
    }
    if in_word {
        words.push(current);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn engine(value: serde_json::Value) -> Container {
        serde_json::from_value(value).unwrap()
    }

    fn vllm(args: &[&str]) -> KvEvents {
        read(
            &engine(json!({"name": "vllm", "args": args})),
            Runtime::Vllm,
        )
    }

    #[test]
    fn a_publishing_vllm_engine_is_heard_where_it_binds() {
        let got = vllm(&[
            "--model",
            "m",
            "--kv-events-config",
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6001", "topic": "kv"}"#,
        ]);
        assert_eq!(
            got,
            KvEvents {
                publisher: Publisher {
                    endpoint: "tcp://127.0.0.1:6000".into(),
                    replay_endpoint: Some("tcp://127.0.0.1:6001".into()),
                    topic: "kv".into(),
                },
                problems: vec![],
            }
        );
    }

    #[test]
    fn vllm_defaults_the_publisher_to_zmq_and_the_endpoint_to_5557() {
        let got = vllm(&[r#"--kv-events-config={"enable_kv_cache_events":true}"#]);
        assert_eq!(got.publisher.endpoint, "tcp://127.0.0.1:5557");
        assert_eq!(got.publisher.replay_endpoint, None);
        assert!(got.problems.is_empty(), "{:?}", got.problems);
    }

    #[test]
    fn dotted_fields_count_like_json_ones() {
        let got = vllm(&[
            "--kv-events-config.enable_kv_cache_events",
            "true",
            "--kv-events-config.endpoint=tcp://*:7000",
            "--kv-events-config.topic",
            "t",
        ]);
        assert_eq!(got.publisher.endpoint, "tcp://127.0.0.1:7000");
        assert_eq!(got.publisher.topic, "t");
        assert!(got.problems.is_empty(), "{:?}", got.problems);
    }

    #[test]
    fn underscored_flags_are_the_same_flag() {
        let got = vllm(&[
            "--kv_events_config",
            r#"{"enable_kv_cache_events":true,"endpoint":"tcp://*:6100"}"#,
        ]);
        assert_eq!(got.publisher.endpoint, "tcp://127.0.0.1:6100");
    }

    #[test]
    fn engines_that_do_not_publish_are_named() {
        let absent = vllm(&["--model", "m"]);
        assert_eq!(absent.publisher.endpoint, "tcp://127.0.0.1:5557");
        assert!(absent.problems[0].contains("not started with --kv-events-config"));
        let disabled = vllm(&["--kv-events-config", r#"{"publisher": "zmq"}"#]);
        assert!(disabled.problems[0].contains("enable_kv_cache_events"));
        let null = vllm(&[
            "--kv-events-config",
            r#"{"enable_kv_cache_events": true, "publisher": "null"}"#,
        ]);
        assert_eq!(null.problems.len(), 1);
        let garbage = vllm(&["--kv-events-config", "{not json"]);
        assert!(garbage.problems[0].contains("not a JSON object"));
    }

    #[test]
    fn sglang_publishes_with_publisher_zmq_alone() {
        let on = read(
            &engine(
                json!({"name": "sglang", "args": ["--kv-events-config", r#"{"publisher":"zmq","endpoint":"tcp://*:5600"}"#]}),
            ),
            Runtime::SGLang,
        );
        assert_eq!(on.publisher.endpoint, "tcp://127.0.0.1:5600");
        assert!(on.problems.is_empty());
        let off = read(
            &engine(
                json!({"name": "sglang", "args": ["--kv-events-config", r#"{"endpoint":"tcp://*:5600"}"#]}),
            ),
            Runtime::SGLang,
        );
        assert!(off.problems[0].contains("\"publisher\": \"zmq\""));
    }

    #[test]
    fn a_publisher_that_connects_or_uses_ipc_is_flagged() {
        let connects = vllm(&[
            "--kv-events-config",
            r#"{"enable_kv_cache_events":true,"endpoint":"tcp://10.0.0.5:5557"}"#,
        ]);
        assert!(connects.problems[0].contains("connects its publisher"));
        let ipc = vllm(&[
            "--kv-events-config",
            r#"{"enable_kv_cache_events":true,"endpoint":"ipc:///tmp/kv"}"#,
        ]);
        assert_eq!(ipc.publisher.endpoint, "ipc:///tmp/kv");
        assert!(ipc.problems[0].contains("ipc://"));
        let v6 = vllm(&[
            "--kv-events-config",
            r#"{"enable_kv_cache_events":true,"endpoint":"tcp://[::]:5557"}"#,
        ]);
        assert_eq!(v6.publisher.endpoint, "tcp://[::1]:5557");
    }

    #[test]
    fn a_shell_script_command_line_is_read_too() {
        let got = read(
            &engine(json!({"name": "vllm", "command": ["/bin/sh", "-c",
                "pip list >/dev/null; exec vllm serve m --kv-events-config '{\"enable_kv_cache_events\": true, \"endpoint\": \"tcp://*:5800\"}' --port 8000"]})),
            Runtime::Vllm,
        );
        assert_eq!(got.publisher.endpoint, "tcp://127.0.0.1:5800");
        assert!(got.problems.is_empty(), "{:?}", got.problems);
    }

    #[test]
    fn shell_words_follow_posix_quoting() {
        assert_eq!(
            shell_words(r#"a 'b c' "d \"e\" \$f" g\ h i&&j"#),
            ["a", "b c", r#"d "e" $f"#, "g h", "i", "j"]
        );
        assert_eq!(shell_words("  "), Vec::<String>::new());
        assert_eq!(shell_words("''"), [""]);
    }
}
