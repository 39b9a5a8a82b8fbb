//! Chat prompts are tokenized exactly as the engine does: goldens made by
//! Hugging Face `transformers` (apply_chat_template, then the tokenizer) on
//! the shipped tiny tokenizer and its chat template
//! (tests/fixtures/chat/make_fixtures.py regenerates them).

#![allow(clippy::unwrap_used)]

use std::path::Path;

use ic_index_server::TokenizerSpec;
use ic_index_server::openai::{self, Prompt};
use ic_index_server::tokenize::{ChatMessage, ChatPrompt, Tokenizers};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat");

fn tokenizers() -> Tokenizers {
    Tokenizers::load(&[TokenizerSpec {
        model: "tiny-chat".into(),
        path: Path::new(FIXTURES).join("tokenizer.json"),
    }])
    .unwrap()
}

/// A golden's token ids.
fn token_ids(ids: &serde_json::Value) -> Vec<u32> {
    ids.as_array()
        .unwrap()
        .iter()
        .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
        .collect()
}

#[test]
fn requests_tokenize_to_the_transformers_goldens() {
    let t = tokenizers();
    let goldens: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(FIXTURES).join("goldens.json")).unwrap(),
    )
    .unwrap();
    let goldens = goldens.as_array().unwrap();
    assert_eq!(goldens.len(), 3);
    for g in goldens {
        let name = g["name"].as_str().unwrap();
        let body = serde_json::to_vec(&g["body"]).unwrap();
        let request = openai::parse(g["path"].as_str().unwrap(), &body).unwrap();
        let want = token_ids(&g["token_ids"]);
        let got = match request.prompt.unwrap() {
            Prompt::Chat(messages) => {
                let rendered = t.render_chat(&request.model, &messages).unwrap();
                assert_eq!(rendered, g["rendered"].as_str().unwrap(), "{name}");
                t.encode_chat(&request.model, &messages).unwrap()
            }
            Prompt::Text(text) => t.encode(&request.model, &text).unwrap(),
            Prompt::Tokens(ids) => ids,
        };
        assert_eq!(got, want, "{name}");
    }
}

/// Tool-use chat requests (tools offered, tool calls and results,
/// reasoning, documents, `chat_template_kwargs`, a continued final
/// message, developer turns, a model's `tool_use` template) render and
/// tokenize as vLLM 0.33 renders them through transformers: goldens made
/// by the real packages (tests/fixtures/chat-tools/make_fixtures.py).
#[test]
fn tool_requests_render_as_vllm_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat-tools");
    let goldens: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("goldens.json")).unwrap()).unwrap();
    let goldens = goldens.as_array().unwrap();
    assert_eq!(goldens.len(), 12);
    for g in goldens {
        let name = g["name"].as_str().unwrap();
        // The engine's --default-chat-template-kwargs, where the case has them.
        let mut t = Tokenizers::load(&[TokenizerSpec {
            model: "tiny-tools".into(),
            path: dir.join("tokenizer.json"),
        }])
        .unwrap();
        if let Some(kwargs) = g["server_kwargs"].as_str() {
            let spec = format!("tiny-tools={kwargs}").parse().unwrap();
            t.set_chat_kwargs(&[spec]).unwrap();
        }
        // As sent (a JSON tree here would sort its keys).
        let body = g["body"].as_str().unwrap().as_bytes();
        let request = openai::parse(g["path"].as_str().unwrap(), body).unwrap();
        let Some(Prompt::Chat(chat)) = request.prompt else {
            panic!("{name}: not read as a chat prompt");
        };
        let rendered = t.render_chat(&request.model, &chat).unwrap();
        assert_eq!(rendered, g["rendered"].as_str().unwrap(), "{name}");
        let want = token_ids(&g["token_ids"]);
        assert_eq!(
            t.encode_chat(&request.model, &chat).unwrap(),
            want,
            "{name}"
        );
    }
}

/// Long and varied prompts (spaces and newlines in runs, digits,
/// punctuation, accents, CJK, emoji, the template's special tokens typed
/// as text) get the ids the tokenizer library's full `encode` gives, with
/// offsets and all: the picker tokenizes without offsets (`encode_fast`),
/// which must not change an id. Chat prompts without special tokens added
/// (the template places them), text prompts with them.
#[test]
fn prompts_tokenize_as_the_library_s_full_encode() {
    let t = tokenizers();
    let library =
        tokenizers::Tokenizer::from_file(Path::new(FIXTURES).join("tokenizer.json")).unwrap();
    let pieces = [
        "What is a KV cache?  ",
        "\n\n\t  indented\n",
        "Prefix reuse: 1234567890, 3.14159; a-b_c/d. ",
        "caf\u{e9} na\u{ef}ve \u{fc}ber ",
        "\u{6f22}\u{5b57}\u{304b}\u{306a} ",
        "\u{1f600}\u{1f680} ",
        "<|im_start|>user\nnot a turn<|im_end|> ",
        "    trailing spaces    ",
    ];
    for n in [1, 7, 40, 300] {
        let text: String = (0..n).map(|i| pieces[i % pieces.len()]).collect();
        let messages = ChatPrompt::new(vec![
            ChatMessage::new("system", "You are a helpful assistant."),
            ChatMessage::new("user", text.clone()),
        ]);
        let rendered = t.render_chat("tiny-chat", &messages).unwrap();
        let full = library.encode(rendered.as_str(), false).unwrap();
        assert_eq!(
            t.encode_chat("tiny-chat", &messages).unwrap(),
            full.get_ids(),
            "chat, {n} pieces"
        );
        let full = library.encode(text.as_str(), true).unwrap();
        assert_eq!(
            t.encode("tiny-chat", &text).unwrap(),
            full.get_ids(),
            "text, {n} pieces"
        );
    }
}

#[test]
fn a_model_without_a_chat_template_says_so() {
    // The older fixture has a tokenizer.json and no tokenizer_config.json.
    let t = Tokenizers::load(&[TokenizerSpec {
        model: "plain".into(),
        path: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer.json"),
    }])
    .unwrap();
    let err = t
        .encode_chat(
            "plain",
            &ChatPrompt::new(vec![ChatMessage::new("user", "hi")]),
        )
        .unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
}
