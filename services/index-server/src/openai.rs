//! The OpenAI request bodies the endpoint picker reads: `/v1/completions`
//! (a prompt as text or token ids) and `/v1/chat/completions` (messages),
//! as vLLM and SGLang accept them. Only what routing needs is read: the
//! model and the prompt. Errors name the field.

use serde_json::Value;

use crate::tokenize::ChatPrompt;

#[path = "openai_chat.rs"]
mod chat;
#[path = "openai_fast.rs"]
mod fast;

/// Largest request body read, bytes (a 1 M-token prompt as JSON is ~8 MB).
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// What the prompt is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    /// Completion text (tokenized with special tokens, as the engine does).
    Text(String),
    /// Completion token ids, as sent.
    Tokens(Vec<u32>),
    /// Chat messages and what else the chat template is given.
    Chat(ChatPrompt),
}

/// A request, as routing sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InferenceRequest {
    /// The `model` field.
    pub model: String,
    /// The prompt; `None` when it carries non-text parts (images, audio):
    /// their content is hashed into the engine's blocks in a way the index
    /// cannot reproduce yet, so such requests are routed by load alone.
    pub prompt: Option<Prompt>,
    /// The request's `cache_salt` (vLLM and SGLang): its blocks are
    /// fingerprinted in the salt's domain. Empty for none.
    pub cache_salt: String,
}

/// Why a body could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    /// Not a JSON object.
    #[error("request body is not a JSON object: {0}")]
    NotJson(String),
    /// A field is missing or has the wrong shape.
    #[error("{field}: {reason}")]
    Field {
        /// The field, as a JSON path.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// Neither a prompt nor messages.
    #[error("{0}: not an OpenAI completions or chat completions request (no prompt, no messages)")]
    Unsupported(String),
}

fn field(field: impl Into<String>, reason: impl Into<String>) -> BodyError {
    BodyError::Field {
        field: field.into(),
        reason: reason.into(),
    }
}

fn token_ids(values: &[Value], at: &str) -> Result<Vec<u32>, BodyError> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| field(format!("{at}[{i}]"), "expected a token id (0..2^32)"))
        })
        .collect()
}

fn completion_prompt(prompt: &Value) -> Result<Prompt, BodyError> {
    match prompt {
        Value::String(s) => Ok(Prompt::Text(s.clone())),
        Value::Array(items) => match items.first() {
            // A batch of prompts: the first decides (the engine serves the
            // batch on the one replica picked).
            Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
            Some(Value::Array(ids)) => Ok(Prompt::Tokens(token_ids(ids, "prompt[0]")?)),
            Some(_) => Ok(Prompt::Tokens(token_ids(items, "prompt")?)),
            None => Err(field("prompt", "must not be empty")),
        },
        _ => Err(field(
            "prompt",
            "expected a string, a list of strings, or token ids",
        )),
    }
}

/// Reads a request body sent to `path` (query string allowed).
///
/// The common shapes are read without a JSON tree (the strings copied
/// once, every other field skipped: a third of the picker's decision was
/// the tree); anything else, errors included, by the tree.
pub fn parse(path: &str, body: &[u8]) -> Result<InferenceRequest, BodyError> {
    let path = path.split('?').next().unwrap_or_default();
    match fast::read(path, body) {
        Some(request) => Ok(request),
        None => parse_tree(path, body),
    }
}

/// [`parse`] through a JSON tree: every body, and errors that name the
/// field. `path` has no query string.
fn parse_tree(path: &str, body: &[u8]) -> Result<InferenceRequest, BodyError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| BodyError::NotJson(e.to_string()))?;
    if !value.is_object() {
        return Err(BodyError::NotJson("expected an object".into()));
    }
    let model = value["model"]
        .as_str()
        .filter(|m| !m.is_empty())
        .ok_or_else(|| field("model", "expected a non-empty string"))?
        .to_owned();
    let chat = path.ends_with("/chat/completions")
        || (!path.ends_with("/completions") && value.get("messages").is_some());
    let prompt = if chat {
        chat::read(&value, body)?.map(Prompt::Chat)
    } else if let Some(prompt) = value.get("prompt") {
        Some(completion_prompt(prompt)?)
    } else {
        return Err(BodyError::Unsupported(path.to_owned()));
    };
    let cache_salt = match &value["cache_salt"] {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        _ => return Err(field("cache_salt", "expected a string")),
    };
    Ok(InferenceRequest {
        model,
        prompt,
        cache_salt,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::tokenize::ChatMessage;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage::new(role, content)
    }

    #[test]
    fn completions_in_every_prompt_form() {
        let parse_body = |b: &str| parse("/v1/completions", b.as_bytes()).unwrap().prompt;
        assert_eq!(
            parse_body(r#"{"model":"m","prompt":"hi"}"#),
            Some(Prompt::Text("hi".into()))
        );
        assert_eq!(
            parse_body(r#"{"model":"m","prompt":["a","b"]}"#),
            Some(Prompt::Text("a".into()))
        );
        assert_eq!(
            parse_body(r#"{"model":"m","prompt":[1,2,3]}"#),
            Some(Prompt::Tokens(vec![1, 2, 3]))
        );
        assert_eq!(
            parse_body(r#"{"model":"m","prompt":[[4,5],[6]]}"#),
            Some(Prompt::Tokens(vec![4, 5]))
        );
    }

    #[test]
    fn chat_messages_with_parts_and_tool_turns() {
        let body = r#"{"model":"m","stream":true,"messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"assistant","content":null,"tool_calls":[]}]}"#;
        let r = parse("/v1/chat/completions?x=1", body.as_bytes()).unwrap();
        assert_eq!(r.model, "m");
        assert_eq!(
            r.prompt,
            Some(Prompt::Chat(ChatPrompt::new(vec![
                msg("system", "be brief"),
                msg("user", "a\nb"),
                msg("assistant", "")
            ])))
        );
    }

    #[test]
    fn images_mean_no_prompt_to_route_on() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":[
            {"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"x"}}]}]}"#;
        let r = parse("/v1/chat/completions", body.as_bytes()).unwrap();
        assert_eq!(r.prompt, None);
    }

    /// A tiny deterministic generator (xorshift64).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// The first (a well-formed choice) half the time, else any.
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            if self.next().is_multiple_of(2) {
                return from[0];
            }
            from[(self.next() % from.len() as u64) as usize]
        }
    }

    /// Whatever the fast reader accepts, it answers exactly as the tree
    /// does: bodies built from every shape a field may take (right and
    /// wrong types, nulls, duplicates, escapes, lists where objects
    /// belong), then mutated byte by byte, on every kind of path.
    #[test]
    fn the_fast_reader_answers_as_the_tree() {
        let deep = format!("{}{}", "[".repeat(130), "]".repeat(130));
        let values = [
            r#""m""#,
            r#""""#,
            "null",
            "1",
            "[]",
            "{}",
            r#""a\nb\u00e9""#,
            "true",
            r#"["x"]"#,
            // What the tree rejects wherever it stands: invalid UTF-8
            // (BAD_BYTE, swapped in below), a lone surrogate, a number
            // beyond f64, nesting past 128.
            "\"x\u{1}\"",
            r#""\ud800""#,
            "1e400",
            &deep,
            r#"{"k":[1e400]}"#,
            // The byte reader's own edges: escapes, numbers, words,
            // whitespace, text beyond ASCII.
            r#""\ud83d\ude00 ok""#,
            r#""\ud83dx""#,
            r#""\ud83d\u0041""#,
            r#""\u00G1""#,
            r#""\x""#,
            r#""tab\t\/\b\f\r\\""#,
            "-0",
            "1.5e3",
            "-2E+2",
            "1e-07",
            "01",
            "1.",
            ".5",
            "-",
            "1e",
            "1e005",
            "123456789012345678901234567890123456789012345",
            "tru",
            "nul",
            "false",
            " [ 1 , {\"a\" : null} ] ",
            "\"é ü 漢字 \u{7f}\"",
            // Roles read apart.
            r#""system""#,
            r#""developer""#,
        ];
        let contents = [
            r#""hi""#,
            "null",
            "[]",
            "7",
            "{}",
            r#""esc\"aped""#,
            r#"[{"type":"text","text":"a"},{"type":"text","text":"b"}]"#,
            r#"[{"type":"text","text":"a"},{"type":"image_url","image_url":{}}]"#,
            r#"[{"type":"image_url","text":3}]"#,
            r#"[{"type":"text"}]"#,
            r#"[{"type":null}]"#,
            r#"[["text","a"]]"#,
            r#"[{"text":"a","type":"text","type":"text"}]"#,
            // Text under other names, and the header vLLM drops from a
            // system turn.
            r#"[{"type":"input_text","text":"a"},{"type":"refusal","refusal":"r"}]"#,
            r#"[{"type":"text","text":null},"plain"]"#,
            r#""x-anthropic-billing-header: c=1\nrest""#,
            r#"[{"type":"text","text":"x-anthropic-billing-header: c"}]"#,
        ];
        let messages = [
            "[M]",
            "[M,M]",
            "[]",
            "null",
            "{}",
            r#"[["user","x"]]"#,
            r#"[{"content":"x"}]"#,
            r#"[{"role":"user","role":"system","content":"x"}]"#,
            r#"[M,{"role":3}]"#,
            r#"[{"role":"user","content":"x","name":V}]"#,
            r#"[{"role":"system","content":"a"},{"role":"developer","content":V}]"#,
            r#"[{"role":"assistant","content":null,"tool_calls":V},M]"#,
            r#"[{"role":"tool","content":"r","tool_call_id":V}]"#,
            r#"[{"role":"assistant","content":"a","reasoning":V}]"#,
        ];
        let prompts = [
            r#""text""#,
            r#"["a","b"]"#,
            "[1,2,3]",
            "[[4,5],[6]]",
            "[-1]",
            "[]",
            "null",
            "{}",
            // Token ids at the edges of the fast reader's: u32's ends,
            // whitespace, what JSON or the tree refuses as an id, batches.
            "[0,4294967295]",
            "[4294967296]",
            "[99999999999]",
            " [ 7 ,\n\t8\r] ",
            "[01]",
            "[-0]",
            "[1.0]",
            "[1e2]",
            "[1E0,2]",
            "[1,]",
            "[1 2]",
            "[[]]",
            "[[],[1]]",
            r#"[[1,2],"x",{"k":[3]}]"#,
            "[[1],[2,]]",
            "[1,[2]]",
            r#"[1,"a"]"#,
            "[[1]",
            "[1",
        ];
        let shapes = [
            r#"{"model":V,"messages":L,"stream":true}"#,
            r#"{"messages":L,"model":V,"cache_salt":V}"#,
            r#"{"model":V,"prompt":P,"cache_salt":V,"max_tokens":16}"#,
            r#"{"model":V,"prompt":P,"messages":L}"#,
            r#"{"model":"m","model":V,"messages":L}"#,
            r#"{"mod\u0065l":V,"messages":L,"extra":{"deep":[1,{"x":null}]}}"#,
            r#"["m",L]"#,
            r#"{"model":V}"#,
            // Skipped fields: the fast reader checks them as the tree does.
            r#"{"model":"m","prompt":P,"user":V,"extra":[V]}"#,
            r#"{"model":"m","messages":L,"tools":{"t":V}}"#,
            r#"{"model":"m","messages":L,"tools":[{"type":"function","function":{"name":V}}]}"#,
            r#"{"model":"m","messages":L,"add_generation_prompt":V,"continue_final_message":V}"#,
            r#"{"model":"m","messages":L,"chat_template_kwargs":{"k":V},"reasoning_effort":V}"#,
            // Whitespace where JSON allows it, and trailing bytes.
            "{ \"model\" : V ,\n\t\"messages\" :L\r}\n",
            r#"{"model":V,"messages":L} x"#,
        ];
        let paths = [
            "/v1/chat/completions",
            "/v1/completions",
            "/generate",
            "/v1/embeddings",
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut fast, mut checked) = (0, 0);
        for _ in 0..6_000 {
            let message = format!(
                r#"{{"role":{},"content":{}}}"#,
                rng.pick(&values),
                rng.pick(&contents)
            );
            let body = rng
                .pick(&shapes)
                .replace('L', &rng.pick(&messages).replace('M', &message))
                .replace('P', rng.pick(&prompts))
                .replacen('V', rng.pick(&values), 1)
                .replace('V', rng.pick(&values));
            let mut bytes = body.into_bytes();
            for b in bytes.iter_mut().filter(|b| **b == 1) {
                *b = BAD_BYTE;
            }
            // Half of them with a few bytes changed: syntax at the edges.
            if rng.next().is_multiple_of(2) {
                for _ in 0..=rng.next() % 3 {
                    let at = (rng.next() as usize) % bytes.len();
                    bytes[at] = b"{}[]\":,n1 \\e"[(rng.next() % 12) as usize];
                }
            }
            for path in paths {
                checked += 1;
                if let Some(read) = fast::read(path, &bytes) {
                    fast += 1;
                    assert_eq!(
                        Ok(read),
                        parse_tree(path, &bytes),
                        "{path} {}",
                        String::from_utf8_lossy(&bytes)
                    );
                }
            }
        }
        // Both readers were exercised, on enough bodies each.
        assert!(
            fast > checked / 20,
            "fast reader used {fast} of {checked} times"
        );
        assert!(
            fast < checked / 2,
            "fast reader used {fast} of {checked} times"
        );
    }

    /// Token ids are read by the byte reader straight into the prompt's
    /// ids, in every form a well-formed request sends them (a list, the
    /// first of a batch, with whitespace): no JSON tree is built for them.
    #[test]
    fn token_ids_are_read_without_a_tree() {
        let by_tree = || fast::PROMPTS_BY_TREE.with(std::cell::Cell::get);
        let ids: Vec<u32> = (0..2_000).map(|i| i * 2_147_483 + i % 7).collect();
        let list = serde_json::to_string(&ids).unwrap();
        for (prompt, expected) in [
            (list.clone(), ids.clone()),
            (format!("[{list}, [1], \"x\"]"), ids.clone()),
            ("[ 0 ,\n4294967295 ]".to_owned(), vec![0, u32::MAX]),
            ("[[5]]".to_owned(), vec![5]),
        ] {
            let body = format!(r#"{{"model":"m","prompt":{prompt},"max_tokens":8}}"#);
            let before = by_tree();
            let read = fast::read("/v1/completions", body.as_bytes()).expect("read fast");
            assert_eq!(read.prompt, Some(Prompt::Tokens(expected)), "{prompt}");
            assert_eq!(by_tree(), before, "{prompt}: left to the tree");
            assert_eq!(Ok(read), parse_tree("/v1/completions", body.as_bytes()));
        }
        // What is not a list of ids goes to the tree, which names the field.
        let before = by_tree();
        let err = parse(
            "/v1/completions",
            br#"{"model":"m","prompt":[1,4294967296]}"#,
        );
        assert_eq!(
            err.unwrap_err().to_string(),
            "prompt[1]: expected a token id (0..2^32)"
        );
        assert_eq!(by_tree(), before + 1);
    }

    /// Not UTF-8 anywhere: the byte the invalid-UTF-8 cases carry.
    const BAD_BYTE: u8 = 0xff;

    /// A value the tree rejects is rejected by the fast reader in every
    /// field it skips: at the top, nested, as an object's key, in a
    /// message, in a content part (each body is otherwise one the fast
    /// reader reads, so the skipped value is why).
    #[test]
    fn the_fast_reader_rejects_in_skipped_fields_what_the_tree_rejects() {
        let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        // (value, whether it can stand as a key)
        let bad = [
            ("\"x\u{1}y\"", true),
            (r#""\ud800""#, true),
            (r#""\udc00x""#, true),
            ("1e400", false),
            ("-1e400", false),
            (deep.as_str(), false),
        ];
        let bodies = [
            ("/v1/completions", r#"{"model":"m","prompt":"p","extra":X}"#),
            (
                "/v1/completions",
                r#"{"model":"m","prompt":"p","extra":{"deep":[1,X]}}"#,
            ),
            (
                "/v1/completions",
                r#"{"model":"m","prompt":"p","extra":{X:1}}"#,
            ),
            ("/v1/completions", r#"{"model":"m","prompt":"p",X:1}"#),
            (
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"u","content":"c","note":X}]}"#,
            ),
            (
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"u","content":[{"type":"text","text":"a","x":X}]}]}"#,
            ),
            (
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"role":"u","content":"c","meta":[{"f":X}]}]}"#,
            ),
        ];
        let mut rejected = 0;
        for (path, body) in bodies {
            let good = body.replace('X', r#""ok""#);
            assert!(fast::read(path, good.as_bytes()).is_some(), "{good}");
            let as_key = body.contains("X:");
            for (x, key_ok) in bad {
                if as_key && !key_ok {
                    continue;
                }
                let mut bytes = body.replace('X', x).into_bytes();
                for b in bytes.iter_mut().filter(|b| **b == 1) {
                    *b = BAD_BYTE;
                }
                let shown = String::from_utf8_lossy(&bytes).into_owned();
                assert!(
                    matches!(parse_tree(path, &bytes), Err(BodyError::NotJson(_))),
                    "the tree reads {shown}"
                );
                assert_eq!(
                    fast::read(path, &bytes),
                    None,
                    "the fast reader read {shown}"
                );
                assert!(
                    matches!(parse(path, &bytes), Err(BodyError::NotJson(_))),
                    "{shown}"
                );
                rejected += 1;
            }
        }
        assert_eq!(rejected, 5 * 6 + 2 * 3);
    }

    /// Long strings, where the fast reader checks 256 bytes at a time: one
    /// odd byte or escape at every offset around the chunk edges, in read
    /// and in skipped fields. What the tree reads the fast reader reads
    /// the same; what the tree refuses it leaves to the tree.
    #[test]
    fn long_strings_read_as_the_tree() {
        // Each odd piece, and whether JSON allows it in a string.
        let odd: [(&[u8], bool); 10] = [
            (b"\x01", false),
            (b"\x1f", false),
            (&[BAD_BYTE], false),
            (&[0xc3], false),
            ("é".as_bytes(), true),
            ("漢".as_bytes(), true),
            (b"\x7f", true),
            (br"\n", true),
            (br#"\""#, true),
            (br"\u00e9", true),
        ];
        let (mut read, mut refused, mut cases) = (0, 0, 0);
        for len in [63, 64, 65, 130, 255, 256, 257, 600] {
            let edges = [
                0, 1, 31, 62, 63, 64, 65, 127, 128, 254, 255, 256, 257, 511, 512,
            ];
            for at in edges.into_iter().chain([len - 1]).filter(|&at| at < len) {
                cases += 1;
                for (bytes, allowed) in odd {
                    let mut text = vec![b'a'; len];
                    text.splice(at..=at, bytes.iter().copied());
                    for shape in [
                        &br#"{"model":"m","messages":[{"role":"user","content":"S"}]}"#[..],
                        br#"{"model":"m","messages":[{"role":"user","content":"c","note":"S"}]}"#,
                        br#"{"model":"m","prompt":"S"}"#,
                    ] {
                        let at_s = shape.iter().position(|&b| b == b'S').unwrap();
                        let mut body = shape.to_vec();
                        body.splice(at_s..=at_s, text.iter().copied());
                        let path = if shape.ends_with(br#""S"}"#) {
                            "/v1/completions"
                        } else {
                            "/v1/chat/completions"
                        };
                        let shown = String::from_utf8_lossy(&body).into_owned();
                        let tree = parse_tree(path, &body);
                        assert_eq!(tree.is_ok(), allowed, "{shown}");
                        match tree {
                            Ok(tree) => {
                                assert_eq!(fast::read(path, &body), Some(tree), "{shown}");
                                read += 1;
                            }
                            Err(_) => {
                                assert_eq!(fast::read(path, &body), None, "{shown}");
                                refused += 1;
                            }
                        }
                    }
                }
            }
        }
        // Three shapes each: the allowed six of ten read, the rest refused.
        assert_eq!((read, refused), (cases * 3 * 6, cases * 3 * 4));
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let err = |path: &str, b: &str| parse(path, b.as_bytes()).unwrap_err().to_string();
        assert!(err("/v1/completions", "nope").starts_with("request body is not a JSON object"));
        assert!(err("/v1/completions", r#"{"prompt":"x"}"#).starts_with("model:"));
        assert!(err("/v1/completions", r#"{"model":"m","prompt":[-1]}"#).starts_with("prompt[0]:"));
        assert!(err("/v1/completions", r#"{"model":"m","prompt":[]}"#).starts_with("prompt:"));
        assert!(
            err(
                "/v1/chat/completions",
                r#"{"model":"m","messages":[{"content":"x"}]}"#
            )
            .starts_with("messages[0].role:")
        );
        assert!(
            err("/v1/chat/completions", r#"{"model":"m","messages":[]}"#).starts_with("messages:")
        );
        assert!(err("/v1/embeddings", r#"{"model":"m","input":"x"}"#).contains("not an OpenAI"));
    }
}
