//! A chat request as the engine hands it to the chat template: the
//! messages with their tool calls, tool results and reasoning, the tools
//! the request offers, its documents and `chat_template_kwargs`, and the
//! generation prompt or the final message continued. vLLM builds the
//! template's arguments this way (its chat utilities, then `transformers`'
//! `apply_chat_template`); tests/chat_template.rs checks the result against
//! goldens the real packages made.

use std::borrow::Cow;

use minijinja::Value;

/// One chat message, with the fields vLLM passes on to the template (in
/// its order: a template that prints a message whole sees the same text).
/// Absent fields are not passed at all (`message.name is defined` is false).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, `developer`, …
    pub role: String,
    /// The text (content parts already joined; `""` for none).
    pub content: String,
    /// An assistant turn's tool calls, as sent, each call's
    /// `function.arguments` read from its JSON text into a value.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// An assistant turn's reasoning (vLLM passes it under both names).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The same text as `reasoning`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// A tool message's `tool_call_id`, as sent (null included).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<Value>,
    /// The message's `name`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The message's `task`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// A developer message's `tools` (`none` when it has none: vLLM sets
    /// the field on every developer message).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
}

impl ChatMessage {
    /// A message of `role` with text `content` and nothing else.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}

/// A chat prompt: the messages and what else the template is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatPrompt {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// The request's `tools`, each as vLLM's request model writes it back
    /// (`type`, then `function` with `name`, `description` and
    /// `parameters`, absent ones as `none`); `None` for no field.
    pub tools: Option<Value>,
    /// The request's `documents` (retrieval-augmented templates).
    pub documents: Option<Value>,
    /// End with the assistant's turn opened (the request's default).
    pub add_generation_prompt: bool,
    /// Leave the last message open for the model to continue.
    pub continue_final_message: bool,
    /// The request's `reasoning_effort`, a template variable (and
    /// `enable_thinking` unless the kwargs set it).
    pub reasoning_effort: Option<String>,
    /// The request's `chat_template_kwargs`, in order: more variables for
    /// the template (`enable_thinking`, …).
    pub template_kwargs: Vec<(String, Value)>,
    /// Tokenize the rendered text with the tokenizer's special tokens added
    /// (the request's `add_special_tokens`; off by default for chat, as
    /// the template places them).
    pub add_special_tokens: bool,
}

impl ChatPrompt {
    /// `messages` with a request's defaults: nothing else given, the
    /// generation prompt added.
    pub fn new(messages: Vec<ChatMessage>) -> Self {
        Self {
            messages,
            tools: None,
            documents: None,
            add_generation_prompt: true,
            continue_final_message: false,
            reasoning_effort: None,
            template_kwargs: Vec::new(),
            add_special_tokens: false,
        }
    }
}

/// `apply_chat_template`'s own parameters that do not change the text: a
/// kwarg naming one sets the call's argument, not a template variable.
const CALL_ONLY_KWARGS: &[&str] = &[
    "tokenize",
    "padding",
    "truncation",
    "max_length",
    "return_tensors",
    "return_dict",
    "return_assistant_tokens_mask",
    "tokenizer_kwargs",
];

/// Marks where the continued message ends (transformers' own tag).
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// Why a chat prompt cannot be rendered as the engine would.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChatArgsError {
    /// A kwarg the engine refuses, or one rendering cannot reproduce.
    #[error("chat_template_kwargs.{0}: {1}")]
    Kwarg(String, &'static str),
    /// `continue_final_message` with a template or message it cannot use.
    #[error("continue_final_message: {0}")]
    Continue(&'static str),
}

/// What the template renders: its variables and whether the final message
/// is continued.
pub(super) struct TemplateArgs {
    pub(super) context: Value,
    continue_final: Option<String>,
}

/// `pairs` with a later value of a name over an earlier one (in the
/// earlier one's place), in one pass: a body may carry a million kwargs.
fn layered(pairs: impl Iterator<Item = (String, Value)>) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = Vec::new();
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (key, value) in pairs {
        match at.get(&key) {
            Some(&i) => out[i].1 = value,
            None => {
                at.insert(key.clone(), out.len());
                out.push((key, value));
            }
        }
    }
    out
}

fn take(vars: &mut Vec<(String, Value)>, key: &str) -> Option<Value> {
    let at = vars.iter().position(|(k, _)| k == key)?;
    Some(vars.remove(at).1)
}

/// A request's kwargs merged as vLLM merges them, split as
/// `apply_chat_template` splits its arguments.
pub(super) struct MergedKwargs {
    /// The tools the template gets (`none` for none); also what picks a
    /// model's `tool_use` template.
    pub(super) tools: Value,
    documents: Value,
    add_generation_prompt: bool,
    continue_final_message: bool,
    /// The other template variables, in order.
    rest: Vec<(String, Value)>,
}

/// `prompt`'s kwargs merged as vLLM merges them: the server's `defaults`
/// (`--chat-template-kwargs`, the engine's `--default-chat-template-kwargs`)
/// under the tools, those under the request's `chat_template_kwargs`, its
/// own fields over all; a null or `"auto"` value of the request's dropped.
pub(super) fn merge_kwargs(
    prompt: &ChatPrompt,
    defaults: &[(String, Value)],
) -> Result<MergedKwargs, ChatArgsError> {
    // The common request: nothing to merge.
    if defaults.is_empty()
        && prompt.template_kwargs.is_empty()
        && prompt.tools.is_none()
        && prompt.documents.is_none()
        && prompt.reasoning_effort.is_none()
    {
        return Ok(MergedKwargs {
            tools: Value::from(()),
            documents: Value::from(()),
            add_generation_prompt: prompt.add_generation_prompt,
            continue_final_message: prompt.continue_final_message,
            rest: Vec::new(),
        });
    }
    // The request's own fields, over its kwargs.
    let effort = prompt.reasoning_effort.as_deref();
    let thinking = effort
        .filter(|_| {
            !prompt
                .template_kwargs
                .iter()
                .any(|(k, _)| k == "enable_thinking")
        })
        .map(|e| ("enable_thinking".to_owned(), Value::from(e != "none")));
    let fields = [
        (
            "add_generation_prompt".to_owned(),
            Value::from(prompt.add_generation_prompt),
        ),
        (
            "continue_final_message".to_owned(),
            Value::from(prompt.continue_final_message),
        ),
    ]
    .into_iter()
    .chain(
        prompt
            .documents
            .clone()
            .map(|d| ("documents".to_owned(), d)),
    )
    .chain(effort.map(|e| ("reasoning_effort".to_owned(), Value::from(e))))
    .chain(thinking);
    let request = prompt
        .template_kwargs
        .iter()
        .cloned()
        .chain(fields)
        .filter(|(_, value)| !(value.is_none() || value.as_str() == Some("auto")));
    let tools = prompt.tools.clone().map(|t| ("tools".to_owned(), t));
    let mut kwargs = layered(defaults.iter().cloned().chain(tools).chain(request));
    for refused in ["chat_template", "messages", "conversation"] {
        if kwargs.iter().any(|(k, _)| k == refused) {
            return Err(ChatArgsError::Kwarg(
                refused.into(),
                "not a variable the engine lets a request set",
            ));
        }
    }
    kwargs.retain(|(k, _)| !CALL_ONLY_KWARGS.contains(&k.as_str()));
    Ok(MergedKwargs {
        tools: take(&mut kwargs, "tools").unwrap_or_else(|| Value::from(())),
        documents: take(&mut kwargs, "documents").unwrap_or_else(|| Value::from(())),
        add_generation_prompt: take(&mut kwargs, "add_generation_prompt")
            .is_some_and(|v| v.is_true()),
        continue_final_message: take(&mut kwargs, "continue_final_message")
            .is_some_and(|v| v.is_true()),
        rest: kwargs,
    })
}

impl MergedKwargs {
    /// The template's variables for `messages` (with `template` the
    /// source chosen, `special_tokens` the tokenizer's named tokens, under
    /// the other kwargs as transformers layers them).
    pub(super) fn template_args(
        self,
        messages: &[ChatMessage],
        template: &str,
        special_tokens: &[(&'static str, String)],
    ) -> Result<TemplateArgs, ChatArgsError> {
        // Borrowed unless a turn changes: a prompt's text is copied only
        // for a developer turn or a continued message.
        let mut messages = convert_developer_turns(messages, template);
        let continue_final = if self.continue_final_message {
            if !template.contains("content") {
                return Err(ChatArgsError::Continue(
                    "the chat template has no content to continue",
                ));
            }
            let last = messages
                .to_mut()
                .last_mut()
                .ok_or(ChatArgsError::Continue("no message to continue"))?;
            let text = last.content.clone();
            last.content.push_str(CONTINUE_TAG);
            Some(text)
        } else {
            None
        };
        // In the order transformers layers them: a later pair overrides an
        // earlier one of the same name. A map searched in order (a dozen
        // names; indexed when a request brings many): cheaper to build
        // than a sorted one.
        let base = [
            ("messages", Value::from(minijinja::value::Serde(&*messages))),
            ("tools", self.tools),
            ("documents", self.documents),
            (
                "add_generation_prompt",
                Value::from(self.add_generation_prompt),
            ),
        ];
        // The tokenizer's special token names are distinct from the four.
        let special = special_tokens
            .iter()
            .map(|(name, text)| (*name, Value::from(text.as_str())));
        let context =
            super::ordered::OrderedMap::layered(base.into_iter().chain(special), self.rest);
        Ok(TemplateArgs {
            context,
            continue_final,
        })
    }
}

impl TemplateArgs {
    /// The rendered text, cut where the continued message ends as
    /// transformers cuts it (at its tag; trailing space the template
    /// trimmed off the message trimmed here too).
    pub(super) fn finish(&self, rendered: String) -> Result<String, ChatArgsError> {
        let Some(final_text) = &self.continue_final else {
            return Ok(rendered);
        };
        let tag = CONTINUE_TAG.trim_end();
        let Some(at) = rendered.rfind(tag) else {
            return Err(ChatArgsError::Continue(
                "the final message is not in the rendered chat",
            ));
        };
        if !rendered.contains(final_text.trim()) {
            return Err(ChatArgsError::Continue(
                "the final message is not in the rendered chat",
            ));
        }
        let mut rendered = rendered;
        let spaced = rendered[at..].starts_with(CONTINUE_TAG);
        rendered.truncate(at);
        if !spaced {
            let kept = rendered.trim_end().len();
            rendered.truncate(kept);
        }
        Ok(rendered)
    }
}

/// A template that never names the `developer` role gets developer
/// messages as system ones (their tools dropped), and every system message
/// merged into one at the start, as vLLM does before rendering.
fn convert_developer_turns<'m>(
    messages: &'m [ChatMessage],
    template: &str,
) -> Cow<'m, [ChatMessage]> {
    let has_developer = messages.iter().any(|m| m.role == "developer");
    if !has_developer || template.contains("\"developer\"") || template.contains("'developer'") {
        return Cow::Borrowed(messages);
    }
    let mut system: Vec<&str> = Vec::new();
    let mut others: Vec<ChatMessage> = Vec::new();
    let mut merge = false;
    for (i, m) in messages.iter().enumerate() {
        if m.role == "system" || m.role == "developer" {
            merge |= i > 0 || !system.is_empty();
            if !m.content.is_empty() {
                system.push(&m.content);
            }
        } else {
            others.push(m.clone());
        }
    }
    if !merge {
        // One leading message, converted in place.
        return Cow::Owned(
            messages
                .iter()
                .map(|m| match m.role.as_str() {
                    "developer" => ChatMessage {
                        role: "system".into(),
                        tools: None,
                        ..m.clone()
                    },
                    _ => m.clone(),
                })
                .collect(),
        );
    }
    let mut out = Vec::with_capacity(others.len() + 1);
    out.push(ChatMessage::new("system", system.join("\n\n")));
    out.extend(others);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(prompt: &ChatPrompt, template: &str) -> Result<String, ChatArgsError> {
        render_over(prompt, &[], template)
    }

    fn render_over(
        prompt: &ChatPrompt,
        defaults: &[(String, Value)],
        template: &str,
    ) -> Result<String, ChatArgsError> {
        let mut env = minijinja::Environment::new();
        env.add_template("t", template).unwrap();
        let args =
            merge_kwargs(prompt, defaults)?.template_args(&prompt.messages, template, &[])?;
        let rendered = env
            .get_template("t")
            .unwrap()
            .render(&args.context)
            .unwrap();
        args.finish(rendered)
    }

    const TURNS: &str =
        "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}";

    #[test]
    fn a_continued_message_ends_where_its_text_does() {
        let mut p = ChatPrompt::new(vec![
            ChatMessage::new("user", "q"),
            ChatMessage::new("assistant", "The cache "),
        ]);
        p.add_generation_prompt = false;
        p.continue_final_message = true;
        // The template trimmed the message's trailing space, and the tag's:
        // the cut is made before the tag and the space left trimmed.
        assert_eq!(
            render(&p, TURNS).unwrap(),
            "<user>q</user>\n<assistant>The cache"
        );
        let kept = "{% for m in messages %}[{{ m.content }}]{% endfor %}";
        assert_eq!(render(&p, kept).unwrap(), "[q][The cache ");
        // A template with no content to continue.
        let err = render(&p, "{% for m in messages %}{{ m.role }}{% endfor %}").unwrap_err();
        assert!(
            err.to_string().starts_with("continue_final_message:"),
            "{err}"
        );
    }

    #[test]
    fn developer_turns_stay_for_templates_that_name_them() {
        let p = ChatPrompt::new(vec![
            ChatMessage::new("developer", "d"),
            ChatMessage::new("user", "u"),
        ]);
        let naming = format!("{{# 'developer' #}}{TURNS}");
        assert_eq!(
            render(&p, &naming).unwrap(),
            "<developer>d</developer>\n<user>u</user>\n"
        );
        // Not named: a system turn.
        assert_eq!(
            render(&p, TURNS).unwrap(),
            "<system>d</system>\n<user>u</user>\n"
        );
    }

    #[test]
    fn kwargs_merge_as_vllm_merges_them() {
        let mut p = ChatPrompt::new(vec![ChatMessage::new("user", "u")]);
        p.template_kwargs = vec![
            ("add_generation_prompt".into(), Value::from(false)),
            ("dropped".into(), Value::from(())),
            ("auto".into(), Value::from("auto")),
            ("tokenize".into(), Value::from(true)),
            ("flag".into(), Value::from(1)),
        ];
        let t = "{{ add_generation_prompt }} {{ dropped is defined }} {{ auto is defined }} \
                 {{ tokenize is defined }} {{ flag }}";
        assert_eq!(render(&p, t).unwrap(), "True False False False 1");
        // The server's defaults sit under the tools and the request's
        // kwargs and fields; a request's null leaves a default as it is.
        let defaults = vec![
            ("flag".to_owned(), Value::from("server")),
            ("mode".to_owned(), Value::from("server")),
            ("tools".to_owned(), Value::from("server")),
            ("add_generation_prompt".to_owned(), Value::from(false)),
        ];
        p.template_kwargs = vec![
            ("flag".into(), Value::from("request")),
            ("mode".into(), Value::from(())),
        ];
        let t2 = "{{ flag }} {{ mode }} {{ tools }} {{ add_generation_prompt }}";
        assert_eq!(
            render_over(&p, &defaults, t2).unwrap(),
            "request server server True"
        );
        p.tools = Some(Value::from("request"));
        assert_eq!(
            render_over(&p, &defaults, t2).unwrap(),
            "request server request True"
        );
        p.tools = None;
        // Many kwargs merge in one pass (a body may carry a million).
        p.template_kwargs = (0..200_000)
            .map(|i| (format!("k{i}"), Value::from(i)))
            .collect();
        assert_eq!(render(&p, "{{ k199999 }}").unwrap(), "199999");
        p.template_kwargs = vec![("messages".into(), Value::from(1))];
        assert!(
            render(&p, t)
                .unwrap_err()
                .to_string()
                .starts_with("chat_template_kwargs.messages:")
        );
    }
}
