//! Chat prompts are tokenized exactly as the engine does: goldens made by
//! Hugging Face `transformers` (apply_chat_template, then the tokenizer) on
//! the shipped tiny tokenizer and its chat template
//! (tests/fixtures/chat/make_fixtures.py regenerates them).

#![allow(clippy::unwrap_used)]

use std::path::Path;

use ic_index_server::TokenizerSpec;
use ic_index_server::openai::{self, Prompt};
use ic_index_server::tokenize::Tokenizers;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/chat");

fn tokenizers() -> Tokenizers {
    Tokenizers::load(&[TokenizerSpec {
        model: "tiny-chat".into(),
        path: Path::new(FIXTURES).join("tokenizer.json"),
    }])
    .unwrap()
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
        let want: Vec<u32> = g["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| u32::try_from(v.as_u64().unwrap()).unwrap())
            .collect();
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
            &[ic_index_server::tokenize::ChatMessage {
                role: "user".into(),
                content: "hi".into(),
            }],
        )
        .unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
}
