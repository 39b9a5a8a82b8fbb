//! Tokenizers for `prompt_text` lookups: one Hugging Face `tokenizer.json`
//! per model, loaded at startup (a bad file stops the server there, not on
//! the first lookup).

use std::collections::HashMap;
use std::path::PathBuf;

use crate::TokenizerSpec;

/// Largest prompt text accepted, in bytes.
pub const MAX_PROMPT_TEXT_BYTES: usize = 4 << 20;

/// A tokenizer file that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("--tokenizer {model}={}: {reason}", path.display())]
pub struct LoadError {
    model: String,
    path: PathBuf,
    reason: String,
}

/// Why a text could not be tokenized.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EncodeError {
    /// No tokenizer is configured for the model.
    #[error(
        "no tokenizer is configured for model {0:?}: start the index server with \
         --tokenizer {0}=/path/to/tokenizer.json, or send token_ids or block_hashes"
    )]
    NoTokenizer(String),
    /// The text is larger than the server accepts.
    #[error("prompt_text: at most {MAX_PROMPT_TEXT_BYTES} bytes")]
    TooLong,
    /// The tokenizer rejected the text.
    #[error("prompt_text: cannot be tokenized: {0}")]
    Failed(String),
}

/// Tokenizers by model id.
#[derive(Default)]
pub struct Tokenizers {
    by_model: HashMap<String, tokenizers::Tokenizer>,
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
            by_model.insert(spec.model.clone(), tokenizer);
        }
        Ok(Self { by_model })
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
        let tokenizer = self
            .by_model
            .get(model)
            .ok_or_else(|| EncodeError::NoTokenizer(model.to_owned()))?;
        if text.len() > MAX_PROMPT_TEXT_BYTES {
            return Err(EncodeError::TooLong);
        }
        tokenizer
            .encode(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| EncodeError::Failed(e.to_string()))
    }
}
