//! Tokenizers for `prompt_text` lookups and the endpoint picker: one Hugging
//! Face `tokenizer.json` per model, and the chat template of the
//! `tokenizer_config.json` beside it when there is one, loaded at startup (a
//! bad file stops the server there, not on the first lookup).
//!
//! Chat messages are rendered the way `transformers`' `apply_chat_template`
//! does (Jinja with `trim_blocks` and `lstrip_blocks`, Python string methods,
//! `add_generation_prompt`, the BOS/EOS tokens, `raise_exception`), then
//! tokenized without adding special tokens (the template placed them), as
//! vLLM does for `/v1/chat/completions`.

use std::collections::HashMap;
use std::path::PathBuf;

mod chat;
pub(crate) mod ordered;
mod pyjinja;

pub use chat::{ChatArgsError, ChatMessage, ChatPrompt};

/// A template value as the chat template's `tojson` writes it (tests).
#[cfg(test)]
pub(crate) fn pyjinja_dumps(value: &minijinja::Value) -> String {
    pyjinja::dumps(value).unwrap_or_else(|e| e.to_string())
}

/// A `--tokenizer MODEL=PATH` pair.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizerSpec {
    /// Model id as lookups name it.
    pub model: String,
    /// Path to a Hugging Face `tokenizer.json`.
    pub path: std::path::PathBuf,
}

impl std::str::FromStr for TokenizerSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('=') {
            Some((model, path)) if !model.is_empty() && !path.is_empty() => Ok(Self {
                model: model.to_owned(),
                path: path.into(),
            }),
            _ => Err(format!("expected MODEL=PATH, got {s:?}")),
        }
    }
}

/// A `--chat-template-kwargs MODEL=JSON` pair: variables the model's chat
/// template gets by default, as the engine's `--default-chat-template-kwargs`
/// sets them (a request's own kwargs and fields override them).
#[derive(Clone, Debug)]
pub struct ChatKwargsSpec {
    /// Model id as requests name it.
    pub model: String,
    /// The JSON object's entries, in order.
    pub kwargs: Vec<(String, minijinja::Value)>,
}

impl std::str::FromStr for ChatKwargsSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (model, json) = s
            .split_once('=')
            .filter(|(m, j)| !m.is_empty() && !j.is_empty())
            .ok_or_else(|| format!("expected MODEL=JSON-OBJECT, got {s:?}"))?;
        let value = serde_json::from_str::<ordered::OrderedJson>(json)
            .map_err(|e| format!("{model}: not JSON: {e}"))?
            .0;
        let kwargs = ordered::named_entries(&value)
            .ok_or_else(|| format!("{model}: expected a JSON object"))?;
        Ok(Self {
            model: model.to_owned(),
            kwargs,
        })
    }
}

/// A tokenizer file that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("--tokenizer {model}={}: {reason}", path.display())]
pub struct LoadError {
    model: String,
    path: PathBuf,
    reason: String,
}

/// Why a text could not be tokenized.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    /// No tokenizer is configured for the model.
    #[error(
        "no tokenizer is configured for model {0:?}: start the index server with \
         --tokenizer {0}=/path/to/tokenizer.json, or send token_ids or block_hashes"
    )]
    NoTokenizer(String),
    /// The tokenizer rejected the text.
    #[error("prompt_text: cannot be tokenized: {0}")]
    Failed(String),
    /// The model's tokenizer has no chat template.
    #[error(
        "model {0:?} has no chat template: put its tokenizer_config.json (with chat_template) \
         beside its tokenizer.json"
    )]
    NoChatTemplate(String),
    /// The chat template refused the messages (or failed).
    #[error("messages: the chat template refused them: {0}")]
    Template(String),
}

/// A model's chat template, compiled.
struct ChatTemplate {
    env: minijinja::Environment<'static>,
    /// Its source: vLLM looks into it for the `developer` role, and
    /// transformers for `content` before continuing a message.
    source: String,
    /// The source of the model's `tool_use` template, when its
    /// configuration names one (compiled as `tool_use`).
    tool_use: Option<String>,
    /// The tokenizer's named special tokens that are set, as
    /// `transformers` hands them to the template.
    special_tokens: Vec<(&'static str, String)>,
}

/// The special tokens `transformers` passes to chat templates, by name.
const SPECIAL_TOKENS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// A model's tokenizer and, when it has one, its chat template.
struct ModelTokenizer {
    tokenizer: tokenizers::Tokenizer,
    chat: Option<ChatTemplate>,
    /// `--chat-template-kwargs` for the model.
    default_kwargs: Vec<(String, minijinja::Value)>,
}

/// Tokenizers by model id.
#[derive(Default)]
pub struct Tokenizers {
    by_model: HashMap<String, ModelTokenizer>,
}

/// A special token in `tokenizer_config.json`: a string, or an added-token
/// object with its `content`; `None` when not set.
fn special_token(config: &serde_json::Value, name: &str) -> Option<String> {
    match &config[name] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o
            .get("content")
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned),
        _ => None,
    }
}

/// The chat template of a `tokenizer_config.json` and its `tool_use` one:
/// a string, or a list of named templates of which `default` is the chat
/// one and `tool_use` the one for requests with tools.
fn template_sources(config: &serde_json::Value) -> (Option<String>, Option<String>) {
    match &config["chat_template"] {
        serde_json::Value::String(s) => (Some(s.clone()), None),
        serde_json::Value::Array(list) => {
            let named = |name: &str| {
                list.iter()
                    .find(|t| t["name"] == name)
                    .and_then(|t| t["template"].as_str())
                    .map(str::to_owned)
            };
            (named("default"), named("tool_use"))
        }
        _ => (None, None),
    }
}

fn load_chat_template(dir: &std::path::Path) -> Result<Option<ChatTemplate>, String> {
    let path = dir.join("tokenizer_config.json");
    let raw = match std::fs::read_to_string(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let config: serde_json::Value =
        serde_json::from_str(&raw).map_err(|e| format!("{}: {e}", path.display()))?;
    let (Some(source), tool_use) = template_sources(&config) else {
        return Ok(None);
    };
    let mut env = minijinja::Environment::new();
    // As transformers compiles chat templates.
    let syntax = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    env.set_syntax(syntax);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    // transformers' own `tojson` and `strftime_now` (pyjinja.rs).
    env.add_filter("tojson", pyjinja::tojson);
    env.add_function("strftime_now", pyjinja::strftime_now);
    env.set_formatter(pyjinja::format_value);
    env.add_function(
        "raise_exception",
        |message: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                message,
            ))
        },
    );
    env.add_template_owned("chat", source.clone())
        .map_err(|e| format!("{}: chat_template: {e}", path.display()))?;
    if let Some(tool_use) = &tool_use {
        env.add_template_owned("tool_use", tool_use.clone())
            .map_err(|e| format!("{}: chat_template tool_use: {e}", path.display()))?;
    }
    let special_tokens = SPECIAL_TOKENS
        .iter()
        .filter_map(|&name| special_token(&config, name).map(|text| (name, text)))
        .collect();
    Ok(Some(ChatTemplate {
        env,
        source,
        tool_use,
        special_tokens,
    }))
}

impl std::fmt::Debug for Tokenizers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut models: Vec<&String> = self.by_model.keys().collect();
        models.sort();
        f.debug_struct("Tokenizers")
            .field("models", &models)
            .finish()
    }
}

impl Tokenizers {
    /// Loads every configured tokenizer.
    pub fn load(specs: &[TokenizerSpec]) -> Result<Self, LoadError> {
        let mut by_model = HashMap::new();
        for spec in specs {
            let fail = |reason: String| LoadError {
                model: spec.model.clone(),
                path: spec.path.clone(),
                reason,
            };
            if by_model.contains_key(&spec.model) {
                return Err(fail("model configured twice".into()));
            }
            let tokenizer =
                tokenizers::Tokenizer::from_file(&spec.path).map_err(|e| fail(e.to_string()))?;
            let dir = spec
                .path
                .parent()
                .unwrap_or_else(|| std::path::Path::new("."));
            let chat = load_chat_template(dir).map_err(fail)?;
            by_model.insert(
                spec.model.clone(),
                ModelTokenizer {
                    tokenizer,
                    chat,
                    default_kwargs: Vec::new(),
                },
            );
        }
        Ok(Self { by_model })
    }

    /// Sets each model's default chat template kwargs (the engine's
    /// `--default-chat-template-kwargs`); an error names a model without a
    /// tokenizer, or one given twice.
    pub fn set_chat_kwargs(&mut self, specs: &[ChatKwargsSpec]) -> Result<(), String> {
        for spec in specs {
            let Some(entry) = self.by_model.get_mut(&spec.model) else {
                return Err(format!(
                    "--chat-template-kwargs {}=…: no --tokenizer {}=… to render its chats",
                    spec.model, spec.model
                ));
            };
            if !entry.default_kwargs.is_empty() {
                return Err(format!(
                    "--chat-template-kwargs {}: given twice",
                    spec.model
                ));
            }
            entry.default_kwargs.clone_from(&spec.kwargs);
        }
        Ok(())
    }

    /// Models with a tokenizer.
    pub fn len(&self) -> usize {
        self.by_model.len()
    }

    /// Whether no tokenizer is configured.
    pub fn is_empty(&self) -> bool {
        self.by_model.is_empty()
    }

    /// Token ids of `text` as the engine sees the prompt (special tokens
    /// such as BOS added, as engines do for completion prompts).
    pub fn encode(&self, model: &str, text: &str) -> Result<Vec<u32>, EncodeError> {
        self.encode_with(model, text, true)
    }

    fn encode_with(
        &self,
        model: &str,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, EncodeError> {
        let tokenizer = &self
            .by_model
            .get(model)
            .ok_or_else(|| EncodeError::NoTokenizer(model.to_owned()))?
            .tokenizer;
        // Without offsets (`encode_fast`): only the ids are kept, and the
        // same ids come out (tests/chat_template.rs); no offset is mapped
        // back, 0.6-1.5 % of tokenizing a 2,000-token chat prompt
        // (docs/benchmarks.md, "The picker's decision against LookupRoute").
        tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EncodeError::Failed(e.to_string()))
    }

    /// `prompt` rendered with the model's chat template, as the engine
    /// renders a chat request.
    pub fn render_chat(&self, model: &str, prompt: &ChatPrompt) -> Result<String, EncodeError> {
        let entry = self
            .by_model
            .get(model)
            .ok_or_else(|| EncodeError::NoTokenizer(model.to_owned()))?;
        let chat = entry
            .chat
            .as_ref()
            .ok_or_else(|| EncodeError::NoChatTemplate(model.to_owned()))?;
        let kwargs = chat::merge_kwargs(prompt, &entry.default_kwargs)
            .map_err(|e| EncodeError::Template(e.to_string()))?;
        // A model's `tool_use` template, when it has one, for requests with
        // tools (as transformers picks among named templates).
        let (name, source) = match &chat.tool_use {
            Some(source) if !kwargs.tools.is_none() => ("tool_use", source),
            _ => ("chat", &chat.source),
        };
        let template = chat
            .env
            .get_template(name)
            .map_err(|e| EncodeError::Failed(e.to_string()))?;
        let args = kwargs
            .template_args(&prompt.messages, source, &chat.special_tokens)
            .map_err(|e| EncodeError::Template(e.to_string()))?;
        let rendered = template
            .render(&args.context)
            .map_err(|e| EncodeError::Template(e.to_string()))?;
        args.finish(rendered)
            .map_err(|e| EncodeError::Template(e.to_string()))
    }

    /// Token ids of a chat request as the engine sees it: rendered with the
    /// model's template, then tokenized without adding special tokens
    /// unless the request asks for them.
    pub fn encode_chat(&self, model: &str, prompt: &ChatPrompt) -> Result<Vec<u32>, EncodeError> {
        let text = self.render_chat(model, prompt)?;
        self.encode_with(model, &text, prompt.add_special_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_kwargs_flags_are_checked_at_startup() {
        let spec: ChatKwargsSpec =
            r#"m={"enable_thinking": false, "z": 1, "a": [1]}"#.parse().unwrap();
        let keys: Vec<&str> = spec.kwargs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            (spec.model.as_str(), keys),
            ("m", vec!["enable_thinking", "z", "a"])
        );
        for bad in ["m", "=1", "m=", "m=[1]", "m={x"] {
            assert!(bad.parse::<ChatKwargsSpec>().is_err(), "{bad}");
        }
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat");
        let mut t = Tokenizers::load(&[TokenizerSpec {
            model: "m".into(),
            path: fixtures.join("tokenizer.json"),
        }])
        .unwrap();
        let other: ChatKwargsSpec = "other={}".parse().unwrap();
        let err = t.set_chat_kwargs(&[other]).unwrap_err();
        assert!(err.contains("no --tokenizer other"), "{err}");
        let err = t.set_chat_kwargs(&[spec.clone(), spec]).unwrap_err();
        assert!(err.contains("given twice"), "{err}");
    }
}
