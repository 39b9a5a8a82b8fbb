//! A chat completions body read into the chat template's arguments, as
//! vLLM reads one (its request model, then its chat message parsing): the
//! messages' text, tool calls (arguments read into values), tool results,
//! reasoning and names; the request's tools in its model's shape; its
//! documents, `chat_template_kwargs`, `reasoning_effort`, generation
//! prompt and special-token switches. What vLLM refuses is an error naming
//! the field. A child module of `openai`.
//!
//! Values a template may print whole (tools, tool calls, kwargs,
//! documents) keep the body's key order, as Python's dicts do: they are
//! read a second time, into template values, only when the body has one.

use minijinja::Value as TemplateValue;
use serde_json::Value;

use super::{BodyError, field};
use crate::tokenize::ordered::{OrderedJson, OrderedMap, named_entries as entries};
use crate::tokenize::{ChatMessage, ChatPrompt};

/// The first line of a system text Claude Code sends, changing on every
/// request: vLLM drops it (and so must we, or no two prompts share it).
pub(super) const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// What `reasoning_effort` may be (vLLM's request model).
const REASONING_EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// The fields read in body order.
#[derive(serde::Deserialize)]
struct Ordered {
    #[serde(default)]
    tools: Option<OrderedJson>,
    #[serde(default)]
    documents: Option<OrderedJson>,
    #[serde(default)]
    chat_template_kwargs: Option<OrderedJson>,
    #[serde(default)]
    messages: Option<Vec<OrderedMessage>>,
}

#[derive(serde::Deserialize)]
struct OrderedMessage {
    #[serde(default)]
    tool_calls: Option<OrderedJson>,
    #[serde(default)]
    tools: Option<OrderedJson>,
}

/// Whether the body has a value only the ordered reading keeps.
fn needs_order(body: &Value) -> bool {
    let set = |v: &Value| !v.is_null();
    set(&body["tools"])
        || set(&body["documents"])
        || set(&body["chat_template_kwargs"])
        || body["messages"].as_array().is_some_and(|list| {
            list.iter()
                .any(|m| set(&m["tool_calls"]) || m["role"] == "developer")
        })
}

fn optional_bool(body: &Value, name: &str, default: bool) -> Result<bool, BodyError> {
    match &body[name] {
        Value::Null => Ok(default),
        Value::Bool(b) => Ok(*b),
        _ => Err(field(name, "expected true or false")),
    }
}

/// The chat prompt of a chat completions `body` (its bytes in `raw`);
/// `None` when a message carries a part that is not text (images, audio:
/// routed by load).
pub(super) fn read(body: &Value, raw: &[u8]) -> Result<Option<ChatPrompt>, BodyError> {
    let ordered = if needs_order(body) {
        Some(serde_json::from_slice::<Ordered>(raw).map_err(|e| field("messages", e.to_string()))?)
    } else {
        None
    };
    let Some(messages) = messages(&body["messages"], ordered.as_ref())? else {
        return Ok(None);
    };
    let mut prompt = ChatPrompt::new(messages);
    prompt.add_generation_prompt = optional_bool(body, "add_generation_prompt", true)?;
    prompt.continue_final_message = optional_bool(body, "continue_final_message", false)?;
    prompt.add_special_tokens = optional_bool(body, "add_special_tokens", false)?;
    if prompt.add_generation_prompt && prompt.continue_final_message {
        return Err(field(
            "continue_final_message",
            "cannot be true with add_generation_prompt",
        ));
    }
    prompt.reasoning_effort = match &body["reasoning_effort"] {
        Value::Null => None,
        Value::String(s) if REASONING_EFFORTS.contains(&s.as_str()) => Some(s.clone()),
        _ => {
            return Err(field(
                "reasoning_effort",
                format!("expected one of {}", REASONING_EFFORTS.join(", ")),
            ));
        }
    };
    if !body["chat_template"].is_null() {
        return Err(field(
            "chat_template",
            "a template sent with the request is not rendered (engines refuse it by default)",
        ));
    }
    if let Some(ordered) = ordered {
        prompt.tools = ordered.tools.map(|t| tools(&t.0)).transpose()?;
        prompt.documents = ordered.documents.map(|d| documents(&d.0)).transpose()?;
        prompt.template_kwargs = match ordered.chat_template_kwargs {
            None => Vec::new(),
            Some(kwargs) => template_kwargs(&kwargs.0)?,
        };
    }
    Ok(Some(prompt))
}

fn template_kwargs(kwargs: &TemplateValue) -> Result<Vec<(String, TemplateValue)>, BodyError> {
    entries(kwargs).ok_or_else(|| field("chat_template_kwargs", "expected an object"))
}

fn items(value: &TemplateValue) -> Option<Vec<TemplateValue>> {
    (value.kind() == minijinja::value::ValueKind::Seq)
        .then(|| value.try_iter().ok().map(Iterator::collect))
        .flatten()
}

fn get<'a>(entries: &'a [(String, TemplateValue)], key: &str) -> Option<&'a TemplateValue> {
    entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// A bool or null field of a tool (`None` for null or absent).
fn tool_flag(
    entries: &[(String, TemplateValue)],
    key: &str,
    at: &str,
) -> Result<Option<TemplateValue>, BodyError> {
    match get(entries, key) {
        None => Ok(None),
        Some(v) if v.is_none() => Ok(None),
        Some(v) if v.kind() == minijinja::value::ValueKind::Bool => Ok(Some(v.clone())),
        Some(_) => Err(field(format!("{at}.{key}"), "expected true, false or null")),
    }
}

/// The request's tools as vLLM's request model writes them back for the
/// template: `type` (`function`, the only one), then `function` with
/// `name`, `description` and `parameters` (absent ones as none), `strict`
/// and `defer_loading` when set, then the tool's `defer_loading` when set
/// (and copied to its function's when that has none); other fields left
/// out.
fn tools(list: &TemplateValue) -> Result<TemplateValue, BodyError> {
    let list = items(list).ok_or_else(|| field("tools", "expected a list of tools"))?;
    let mut out = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let tool = entries(tool).ok_or_else(|| field(&at, "expected an object"))?;
        if get(&tool, "type").is_some_and(|t| t.as_str() != Some("function")) {
            return Err(field(format!("{at}.type"), "expected \"function\""));
        }
        let function_at = format!("{at}.function");
        let function = get(&tool, "function")
            .and_then(entries)
            .ok_or_else(|| field(&function_at, "expected an object"))?;
        let name = get(&function, "name")
            .filter(|n| n.as_str().is_some())
            .ok_or_else(|| field(format!("{function_at}.name"), "expected a string"))?;
        let description = match get(&function, "description") {
            None => TemplateValue::from(()),
            Some(d) if d.is_none() || d.as_str().is_some() => d.clone(),
            Some(_) => {
                return Err(field(
                    format!("{function_at}.description"),
                    "expected a string",
                ));
            }
        };
        let parameters = match get(&function, "parameters") {
            None => TemplateValue::from(()),
            Some(p) if p.is_none() || p.kind() == minijinja::value::ValueKind::Map => p.clone(),
            Some(_) => {
                return Err(field(
                    format!("{function_at}.parameters"),
                    "expected an object",
                ));
            }
        };
        let tool_defer = tool_flag(&tool, "defer_loading", &at)?;
        let strict = tool_flag(&function, "strict", &function_at)?;
        let defer =
            tool_flag(&function, "defer_loading", &function_at)?.or_else(|| tool_defer.clone());
        let mut function_out: Vec<(&str, TemplateValue)> = vec![
            ("name", name.clone()),
            ("description", description),
            ("parameters", parameters),
        ];
        function_out.extend(strict.map(|s| ("strict", s)));
        function_out.extend(defer.map(|d| ("defer_loading", d)));
        let mut tool_out: Vec<(&str, TemplateValue)> = vec![
            ("type", TemplateValue::from("function")),
            ("function", OrderedMap::from_pairs(function_out)),
        ];
        tool_out.extend(tool_defer.map(|d| ("defer_loading", d)));
        out.push(OrderedMap::from_pairs(tool_out));
    }
    Ok(TemplateValue::from(out))
}

/// Documents: a list of objects of strings.
fn documents(list: &TemplateValue) -> Result<TemplateValue, BodyError> {
    let docs = items(list).ok_or_else(|| field("documents", "expected a list of objects"))?;
    for (i, doc) in docs.iter().enumerate() {
        let doc =
            entries(doc).ok_or_else(|| field(format!("documents[{i}]"), "expected an object"))?;
        if let Some((key, _)) = doc.iter().find(|(_, v)| v.as_str().is_none()) {
            return Err(field(format!("documents[{i}].{key}"), "expected a string"));
        }
    }
    Ok(list.clone())
}

/// An assistant turn's tool calls as vLLM hands them on: `None` for an
/// empty list (dropped, so the template takes its plain path); each call
/// as the request model requires it (`id`, `type` `function`, a
/// `function` with `name` and `arguments` strings), its `arguments` read
/// from JSON text into a value (an object; anything else, or text that is
/// not JSON, as an empty object, as vLLM coerces them).
fn tool_calls(calls: &TemplateValue, at: &str) -> Result<Option<TemplateValue>, BodyError> {
    let list = items(calls).ok_or_else(|| field(at, "expected a list of tool calls"))?;
    if list.is_empty() {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, call) in list.iter().enumerate() {
        let call_at = format!("{at}[{i}]");
        let call = entries(call).ok_or_else(|| field(&call_at, "expected an object"))?;
        if get(&call, "type").and_then(TemplateValue::as_str) != Some("function") {
            return Err(field(format!("{call_at}.type"), "expected \"function\""));
        }
        if get(&call, "id").and_then(TemplateValue::as_str).is_none() {
            return Err(field(format!("{call_at}.id"), "expected a string"));
        }
        let function_at = format!("{call_at}.function");
        let function = get(&call, "function")
            .and_then(entries)
            .ok_or_else(|| field(&function_at, "expected an object"))?;
        for key in ["name", "arguments"] {
            if get(&function, key)
                .and_then(TemplateValue::as_str)
                .is_none()
            {
                return Err(field(format!("{function_at}.{key}"), "expected a string"));
            }
        }
        let function_out: Vec<(String, TemplateValue)> = function
            .into_iter()
            .map(|(k, v)| match k.as_str() {
                "arguments" => (k, arguments(v.as_str().unwrap_or_default())),
                _ => (k, v),
            })
            .collect();
        let call_out: Vec<(String, TemplateValue)> = call
            .into_iter()
            .map(|(k, v)| match k.as_str() {
                "function" => (k, OrderedMap::from_pairs(function_out.iter().cloned())),
                _ => (k, v),
            })
            .collect();
        out.push(OrderedMap::from_pairs(call_out));
    }
    Ok(Some(TemplateValue::from(out)))
}

/// A call's `arguments` text read into an object (empty when the text is
/// empty, not JSON, or not an object).
fn arguments(text: &str) -> TemplateValue {
    match serde_json::from_str::<OrderedJson>(text) {
        Ok(OrderedJson(parsed)) if parsed.kind() == minijinja::value::ValueKind::Map => parsed,
        _ => OrderedMap::from_pairs(std::iter::empty::<(String, TemplateValue)>()),
    }
}

/// A message's text from its content parts, as vLLM joins them for
/// string-content templates; `None` when a part is not text.
fn parts_text<'b>(parts: &'b [Value], i: usize, system: bool) -> Result<Option<String>, BodyError> {
    let mut texts: Vec<&'b str> = Vec::with_capacity(parts.len());
    // vLLM drops the billing header from a system message's plain text
    // parts (strings and `text` parts) only.
    let mut push = |text: &'b str, plain: bool| {
        let kept = if system && plain {
            without_billing_header(text)
        } else {
            Some(text)
        };
        texts.extend(kept);
    };
    for (j, part) in parts.iter().enumerate() {
        let at = |name: &str| format!("messages[{i}].content[{j}].{name}");
        let (kind, key) = match part {
            Value::String(s) => {
                push(s, true);
                continue;
            }
            Value::Object(_) => match part["type"].as_str() {
                Some(kind @ ("text" | "input_text" | "output_text")) => (kind, "text"),
                Some("refusal") => ("refusal", "refusal"),
                Some("thinking") => ("thinking", "thinking"),
                Some("tool_reference") => ("tool_reference", "name"),
                Some(_) => return Ok(None),
                None => return Err(field(at("type"), "expected a string")),
            },
            _ => {
                return Err(field(
                    format!("messages[{i}].content[{j}]"),
                    "expected an object",
                ));
            }
        };
        match &part[key] {
            Value::String(s) => push(s, kind == "text"),
            // vLLM skips a text or refusal part without its text.
            Value::Null if matches!(kind, "text" | "refusal") => {}
            _ => return Err(field(at(key), "expected a string")),
        }
    }
    Ok(Some(texts.join("\n")))
}

/// A system text less Claude Code's billing header line (`None` when
/// nothing is left).
fn without_billing_header(text: &str) -> Option<&str> {
    if !text.starts_with(BILLING_HEADER) {
        return Some(text);
    }
    text.split_once('\n')
        .map(|(_, rest)| rest)
        .filter(|rest| !rest.is_empty())
}

fn messages(
    messages: &Value,
    ordered: Option<&Ordered>,
) -> Result<Option<Vec<ChatMessage>>, BodyError> {
    let Value::Array(list) = messages else {
        return Err(field("messages", "expected a list of messages"));
    };
    if list.is_empty() {
        return Err(field("messages", "must not be empty"));
    }
    let ordered = ordered.and_then(|o| o.messages.as_deref());
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let role = m["role"]
            .as_str()
            .ok_or_else(|| field(format!("messages[{i}].role"), "expected a string"))?;
        let content = match &m["content"] {
            Value::String(s) if role == "system" => {
                without_billing_header(s).unwrap_or_default().to_owned()
            }
            Value::String(s) => s.clone(),
            // An assistant turn with tool calls only.
            Value::Null => String::new(),
            Value::Array(parts) => match parts_text(parts, i, role == "system")? {
                Some(text) => text,
                None => return Ok(None),
            },
            _ => {
                return Err(field(
                    format!("messages[{i}].content"),
                    "expected a string or a list of content parts",
                ));
            }
        };
        let mut message = ChatMessage::new(role, content);
        let extra = ordered.and_then(|o| o.get(i));
        match role {
            "assistant" => {
                if let Some(calls) = extra.and_then(|e| e.tool_calls.as_ref()) {
                    message.tool_calls =
                        tool_calls(&calls.0, &format!("messages[{i}].tool_calls"))?;
                }
                match &m["reasoning"] {
                    Value::Null => {}
                    Value::String(r) => {
                        message.reasoning = Some(r.clone());
                        message.reasoning_content = Some(r.clone());
                    }
                    _ => {
                        return Err(field(
                            format!("messages[{i}].reasoning"),
                            "expected a string",
                        ));
                    }
                }
            }
            "tool" => {
                if let Some(id) = m.get("tool_call_id") {
                    message.tool_call_id = Some(TemplateValue::from(minijinja::value::Serde(id)));
                }
            }
            "developer" => {
                message.tools = Some(
                    extra
                        .and_then(|e| e.tools.as_ref())
                        .map_or_else(|| TemplateValue::from(()), |t| t.0.clone()),
                );
            }
            _ => {}
        }
        if let Value::String(name) = &m["name"] {
            message.name = Some(name.clone());
        }
        if let Value::String(task) = &m["task"] {
            message.task = Some(task.clone());
        }
        out.push(message);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::super::{Prompt, parse};
    use crate::tokenize::ChatPrompt;

    fn chat(body: &str) -> ChatPrompt {
        match parse("/v1/chat/completions", body.as_bytes())
            .unwrap()
            .prompt
        {
            Some(Prompt::Chat(chat)) => chat,
            other => panic!("{body}: {other:?}"),
        }
    }

    fn refused(body: &str) -> String {
        parse("/v1/chat/completions", body.as_bytes())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn tools_take_the_request_model_s_shape_in_body_order() {
        let c = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[
              {"x":1,"function":{"parameters":{"z":1,"a":{"y":2,"b":3}},"name":"f","extra":true},"type":"function"}]}"#,
        );
        let tools = c.tools.unwrap();
        let json = crate::tokenize::pyjinja_dumps(&tools);
        assert_eq!(
            json,
            r#"[{"type": "function", "function": {"name": "f", "description": null, "parameters": {"z": 1, "a": {"y": 2, "b": 3}}}}]"#
        );
    }

    #[test]
    fn tool_calls_have_their_arguments_read_and_empty_lists_dropped() {
        let c = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"x"},
              {"role":"assistant","content":null,"tool_calls":[
                {"type":"function","id":"1","function":{"arguments":"{\"b\": 1, \"a\": [2]}","name":"f"}},
                {"type":"function","id":"2","function":{"name":"g","arguments":"oops"}}]},
              {"role":"assistant","content":"y","tool_calls":[],"reasoning":"r"},
              {"role":"tool","content":"z","tool_call_id":"1","name":"f"}]}"#,
        );
        let calls = c.messages[1].tool_calls.as_ref().unwrap();
        assert_eq!(
            crate::tokenize::pyjinja_dumps(calls),
            r#"[{"type": "function", "id": "1", "function": {"arguments": {"b": 1, "a": [2]}, "name": "f"}}, {"type": "function", "id": "2", "function": {"name": "g", "arguments": {}}}]"#
        );
        assert_eq!(c.messages[2].tool_calls, None);
        assert_eq!(c.messages[2].reasoning.as_deref(), Some("r"));
        assert_eq!(c.messages[2].reasoning_content.as_deref(), Some("r"));
        assert_eq!(c.messages[3].name.as_deref(), Some("f"));
        assert!(c.messages[3].tool_call_id.is_some());
    }

    #[test]
    fn request_fields_are_read_and_kwargs_kept_in_order() {
        let c = chat(
            r#"{"model":"m","messages":[{"role":"user","content":"x"},{"role":"assistant","content":"y"}],
              "add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":true,
              "reasoning_effort":"high","chat_template_kwargs":{"z":1,"a":false},
              "documents":[{"title":"t","text":"d"}]}"#,
        );
        assert!(!c.add_generation_prompt && c.continue_final_message && c.add_special_tokens);
        assert_eq!(c.reasoning_effort.as_deref(), Some("high"));
        let keys: Vec<&str> = c.template_kwargs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z", "a"]);
        assert!(c.documents.is_some());
    }

    #[test]
    fn system_turns_lose_the_billing_header_and_text_parts_join() {
        let c = chat(
            r#"{"model":"m","messages":[
              {"role":"system","content":"x-anthropic-billing-header: cch=1\nKeep me"},
              {"role":"system","content":[{"type":"text","text":"x-anthropic-billing-header: only"},"s"]},
              {"role":"user","content":[{"type":"input_text","text":"a"},{"type":"text","text":null},
                {"type":"refusal","refusal":"b"},{"type":"thinking","thinking":"c"},"d"]}]}"#,
        );
        assert_eq!(c.messages[0].content, "Keep me");
        assert_eq!(c.messages[1].content, "s");
        assert_eq!(c.messages[2].content, "a\nb\nc\nd");
    }

    /// What vLLM refuses is an error naming the field.
    #[test]
    fn what_the_engine_refuses_names_the_field() {
        let m = r#""messages":[{"role":"user","content":"x"}]"#;
        for (body, field) in [
            (format!(r#"{{"model":"m",{m},"tools":[{{"type":"function","function":{{}}}}]}}"#), "tools[0].function.name"),
            (format!(r#"{{"model":"m",{m},"tools":[{{"type":"custom","function":{{"name":"f"}}}}]}}"#), "tools[0].type"),
            (format!(r#"{{"model":"m",{m},"tools":{{"a":1}}}}"#), "tools"),
            (format!(r#"{{"model":"m",{m},"tools":[{{"function":{{"name":"f","strict":"yes"}}}}]}}"#), "tools[0].function.strict"),
            (format!(r#"{{"model":"m",{m},"documents":[{{"title":1}}]}}"#), "documents[0].title"),
            (format!(r#"{{"model":"m",{m},"chat_template_kwargs":[1]}}"#), "chat_template_kwargs"),
            (format!(r#"{{"model":"m",{m},"continue_final_message":true}}"#), "continue_final_message"),
            (format!(r#"{{"model":"m",{m},"add_generation_prompt":"yes"}}"#), "add_generation_prompt"),
            (format!(r#"{{"model":"m",{m},"reasoning_effort":"huge"}}"#), "reasoning_effort"),
            (format!(r#"{{"model":"m",{m},"chat_template":"{{{{ x }}}}"}}"#), "chat_template"),
            (
                r#"{"model":"m","messages":[{"role":"assistant","content":"","tool_calls":[{"type":"function","id":"1","function":{"name":"f","arguments":{"a":1}}}]}]}"#.to_owned(),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (
                r#"{"model":"m","messages":[{"role":"assistant","content":"","tool_calls":[{"type":"function","function":{"name":"f","arguments":""}}]}]}"#.to_owned(),
                "messages[0].tool_calls[0].id",
            ),
            (
                r#"{"model":"m","messages":[{"role":"user","content":[{"type":"input_text","text":null}]}]}"#.to_owned(),
                "messages[0].content[0].text",
            ),
        ] {
            let error = refused(&body);
            assert!(error.starts_with(&format!("{field}:")), "{body}: {error}");
        }
    }
}
