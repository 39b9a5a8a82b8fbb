//! The chat conversations `epp_bench` and `epp_bench_phases` send: one
//! definition, so both time the same prompts.

use ic_index_server::tokenize::{ChatMessage, ChatPrompt, Tokenizers};

const SENTENCES: [&str; 4] = [
    "What is a KV cache and why does prefix reuse matter for latency? ",
    "The key value cache stores attention keys and values for every token. ",
    "Routing a prompt to the engine that already holds its prefix saves prefill. ",
    "Summarize the conversation so far in three short sentences please. ",
];

/// Conversation `conversation`: a system turn and a user turn of at least
/// 2,000 tokens once rendered with the `tiny-chat` fixture's template.
pub fn messages(conversation: usize, tokenizers: &Tokenizers) -> ChatPrompt {
    let mut user = format!("Conversation {conversation}. ");
    loop {
        let m = ChatPrompt::new(vec![
            ChatMessage::new("system", "You are a helpful assistant."),
            ChatMessage::new("user", user.clone()),
        ]);
        if tokenizers.encode_chat("tiny-chat", &m).unwrap().len() >= 2_000 {
            return m;
        }
        user.push_str(SENTENCES[user.len() % SENTENCES.len()]);
    }
}
