//! The body read without a JSON tree: only `model`, `messages`, `prompt`
//! and `cache_salt` are decoded, strings borrowed from the body where they
//! have no escapes, every other field skipped. A child module of
//! `openai`; [`read`] answers `None` whenever the body is not a
//! well-formed request of the common shapes (a wrong type, a duplicate key,
//! an empty list, a field in doubt), and the caller then reads it with the
//! tree, whose errors name the field. So what this reader accepts it
//! answers exactly as the tree would (tested on mutated bodies), and it
//! rejects what the tree rejects: skipped fields are checked as the tree
//! checks them ([`Skip`]), without building one.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::{InferenceRequest, Prompt, completion_prompt};
use crate::tokenize::ChatMessage;

/// A string, borrowed from the body when it has no escapes.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

/// A value routing does not read, validated as the tree validates it.
/// serde's `IgnoredAny` would not do: serde_json skips it unchecked (invalid
/// UTF-8 and lone surrogate escapes in strings, numbers beyond f64, nesting
/// past 128 all pass), while `deserialize_any` parses strings and numbers
/// and counts the depth as `Value` does; nothing is kept.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Skip;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Skip, E> {
                Ok(Skip)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
                while seq.next_element::<Skip>()?.is_some() {}
                Ok(Skip)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
                while map.next_entry::<Skip, Skip>()?.is_some() {}
                Ok(Skip)
            }
        }
        d.deserialize_any(V)
    }
}

/// A key of an object: which field, without copying it.
enum Key {
    Model,
    Messages,
    Prompt,
    CacheSalt,
    Role,
    Content,
    Type,
    TextField,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Key, E> {
                Ok(match s {
                    "model" => Key::Model,
                    "messages" => Key::Messages,
                    "prompt" => Key::Prompt,
                    "cache_salt" => Key::CacheSalt,
                    "role" => Key::Role,
                    "content" => Key::Content,
                    "type" => Key::Type,
                    "text" => Key::TextField,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

/// Sets `slot` once: a duplicate key is left to the tree (its last value
/// wins there).
fn once<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    map: &mut A,
    slot: &mut Option<T>,
) -> Result<(), A::Error> {
    if slot.is_some() {
        return Err(de::Error::custom("duplicate key"));
    }
    *slot = Some(map.next_value()?);
    Ok(())
}

/// One content part: its `type` and `text`.
struct Part<'a> {
    kind: Text<'a>,
    text: Option<Text<'a>>,
}

impl<'de> Deserialize<'de> for Part<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Part<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a content part")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut kind, mut text) = (None, None);
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Type => once(&mut map, &mut kind)?,
                        Key::TextField => once(&mut map, &mut text)?,
                        _ => {
                            map.next_value::<Skip>()?;
                        }
                    }
                }
                Ok(Part {
                    kind: kind.ok_or_else(|| de::Error::missing_field("type"))?,
                    text,
                })
            }
        }
        // A map only: a list in its place is the tree's error to name.
        d.deserialize_map(V)
    }
}

/// A message's `content`.
enum Content<'a> {
    Text(Cow<'a, str>),
    Null,
    Parts(Vec<Part<'a>>),
}

impl<'de> Deserialize<'de> for Content<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, null or content parts")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(Content::Text(Cow::Owned(s)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Content::Null)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut parts = Vec::with_capacity(seq.size_hint().unwrap_or(1));
                while let Some(p) = seq.next_element()? {
                    parts.push(p);
                }
                Ok(Content::Parts(parts))
            }
        }
        d.deserialize_any(V)
    }
}

/// One chat message.
struct Message<'a> {
    role: Text<'a>,
    content: Content<'a>,
}

impl<'de> Deserialize<'de> for Message<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Message<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a message")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut role, mut content) = (None, None);
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Role => once(&mut map, &mut role)?,
                        Key::Content => once(&mut map, &mut content)?,
                        _ => {
                            map.next_value::<Skip>()?;
                        }
                    }
                }
                Ok(Message {
                    role: role.ok_or_else(|| de::Error::missing_field("role"))?,
                    // No content: an assistant turn with tool calls only.
                    content: content.unwrap_or(Content::Null),
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// Wraps a present value, null included (`Option<T>` alone reads a null
/// as absent; the tree tells the two apart).
struct Present<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Present<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Present)
    }
}

/// The fields routing reads; each `Some` when the key was present.
struct Body<'a> {
    model: Option<Text<'a>>,
    messages: Option<Present<Option<Vec<Message<'a>>>>>,
    prompt: Option<Present<Value>>,
    cache_salt: Option<Present<Option<Text<'a>>>>,
}

impl<'de> Deserialize<'de> for Body<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Body<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a request object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut body = Body {
                    model: None,
                    messages: None,
                    prompt: None,
                    cache_salt: None,
                };
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Model => once(&mut map, &mut body.model)?,
                        Key::Messages => once(&mut map, &mut body.messages)?,
                        Key::Prompt => once(&mut map, &mut body.prompt)?,
                        Key::CacheSalt => once(&mut map, &mut body.cache_salt)?,
                        _ => {
                            map.next_value::<Skip>()?;
                        }
                    }
                }
                Ok(body)
            }
        }
        d.deserialize_map(V)
    }
}

/// The messages' text as the tree reads them; `None` (the outer one) when
/// the tree must decide.
fn chat(messages: Vec<Message<'_>>) -> Option<Option<Vec<ChatMessage>>> {
    if messages.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        let content = match m.content {
            Content::Text(s) => s.into_owned(),
            Content::Null => String::new(),
            Content::Parts(parts) => {
                let mut texts: Vec<Cow<'_, str>> = Vec::with_capacity(parts.len());
                for part in parts {
                    if part.kind.0 != "text" {
                        // Images, audio: no prompt to route on.
                        return Some(None);
                    }
                    texts.push(part.text?.0);
                }
                texts.join("\n")
            }
        };
        out.push(ChatMessage {
            role: m.role.0.into_owned(),
            content,
        });
    }
    Some(Some(out))
}

/// Reads `body` sent to `path` (its query string removed) without a JSON
/// tree; `None` when the tree must read it.
pub(super) fn read(path: &str, body: &[u8]) -> Option<InferenceRequest> {
    let body: Body<'_> = serde_json::from_slice(body).ok()?;
    let model = body.model.filter(|m| !m.0.is_empty())?.0.into_owned();
    let chat_path = path.ends_with("/chat/completions")
        || (!path.ends_with("/completions") && body.messages.is_some());
    let prompt = if chat_path {
        chat(body.messages?.0?)?.map(Prompt::Chat)
    } else {
        Some(completion_prompt(&body.prompt?.0).ok()?)
    };
    let cache_salt = match body.cache_salt {
        Some(Present(Some(s))) => s.0.into_owned(),
        Some(Present(None)) | None => String::new(),
    };
    Some(InferenceRequest {
        model,
        prompt,
        cache_salt,
    })
}
