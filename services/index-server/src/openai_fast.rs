//! The body read without a JSON tree: a reader over the bytes that decodes
//! only `model`, `messages`, `prompt` and `cache_salt` (strings borrowed
//! from the body where they have no escapes, token ids straight into the
//! prompt's `Vec<u32>`) and checks every other field as the tree would,
//! keeping nothing. A child module of `openai`; [`read`]
//! answers `None` whenever the body is not a well-formed request of the
//! common shapes (a wrong type, a duplicate key, an empty list, a field in
//! doubt), and the caller then reads it with the tree, whose errors name
//! the field. So what this reader accepts it answers exactly as the tree
//! would (tested on mutated bodies), and it rejects what the tree rejects:
//! invalid UTF-8, control characters and lone surrogates in strings,
//! numbers beyond f64, nesting past serde_json's limit; where checking as
//! closely would cost more than it saves (very deep nesting, long numbers)
//! it leaves the body to the tree.
//!
//! Why not serde_json with borrowed fields: it scans a string 8 bytes at a
//! time and then checks its UTF-8 again, most of a pick's reading of a
//! long prompt; here `memchr` finds the string's end and `simdutf8` checks
//! it, both with the CPU's vector instructions.

use std::borrow::Cow;

use serde_json::Value;

use super::chat::BILLING_HEADER;
use super::{InferenceRequest, Prompt, completion_prompt};
use crate::tokenize::{ChatMessage, ChatPrompt};

/// Deepest nesting read; deeper bodies go to the tree (serde_json's own
/// limit is 128 levels, and no request nests near this).
const MAX_DEPTH: usize = 64;

/// Longest number read, in bytes, and most exponent digits: within both,
/// every number is finite as an f64, as the tree requires; others go to
/// the tree.
const MAX_NUMBER_BYTES: usize = 40;
const MAX_EXPONENT_DIGITS: usize = 2;

#[cfg(test)]
thread_local! {
    /// `prompt` values this thread left to the tree (tests read it).
    pub(super) static PROMPTS_BY_TREE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The bytes of a body and how far they are read.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

/// The room for the ids of a list whose `[` is consumed: its commas up to
/// the first `]` (the list's own when it holds ids only; else it is refused
/// anyway), at most `(end + 1) / 2`, since each id takes a digit and all but
/// the last a comma. The cap keeps a hostile body (commas inside a later
/// string element) from sizing the Vec past what the span could hold.
/// `None` without a `]`.
fn id_capacity(rest: &[u8]) -> Option<usize> {
    let end = memchr::memchr(b']', rest)?;
    let commas = memchr::memchr_iter(b',', &rest[..end]).count();
    Some((commas + 1).min(end.div_ceil(2)).max(1))
}

/// `text` when it holds no control character (below U+0020: the tree
/// refuses them raw in a string) and is UTF-8.
fn text(bytes: &[u8]) -> Option<&str> {
    // The least byte of 256 at a time: fixed-length folds that compile to
    // vector minima, one comparison per block.
    let (blocks, rest) = bytes.as_chunks::<256>();
    let block_least = |block: &[u8; 256]| block.iter().fold(u8::MAX, |m, &b| m.min(b));
    let rest_least = rest.iter().fold(u8::MAX, |m, &b| m.min(b));
    if blocks.iter().any(|block| block_least(block) < 0x20) || rest_least < 0x20 {
        return None;
    }
    simdutf8::basic::from_utf8(bytes).ok()
}

impl<'a> Reader<'a> {
    /// The next byte past whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        while let Some(&c) = self.b.get(self.at) {
            if !matches!(c, b' ' | b'\t' | b'\n' | b'\r') {
                return Some(c);
            }
            self.at += 1;
        }
        None
    }

    /// Consumes `c` (past whitespace), or fails.
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.at += 1)
    }

    /// Consumes `word` (`true`, `false`, `null`).
    fn word(&mut self, word: &[u8]) -> Option<()> {
        self.peek()?;
        let end = self.at + word.len();
        (self.b.get(self.at..end)? == word).then(|| self.at = end)
    }

    /// A string, borrowed when it has no escapes; with `keep` false an
    /// escaped string is checked but not decoded (an empty string comes
    /// back).
    fn string(&mut self, keep: bool) -> Option<Cow<'a, str>> {
        self.eat(b'"')?;
        let (mut escaped, mut out) = (false, String::new());
        loop {
            let end = self.at + memchr::memchr2(b'"', b'\\', &self.b[self.at..])?;
            let segment = text(&self.b[self.at..end])?;
            if self.b[end] == b'"' {
                self.at = end + 1;
                if !escaped {
                    return Some(Cow::Borrowed(segment));
                }
                if keep {
                    out.push_str(segment);
                }
                return Some(Cow::Owned(out));
            }
            let c = self.escape(end)?;
            if keep {
                out.push_str(segment);
                out.push(c);
            }
            escaped = true;
        }
    }

    /// The escape at `at` (a backslash), decoded as the tree decodes it: a
    /// surrogate only in a pair, high then low.
    fn escape(&mut self, at: usize) -> Option<char> {
        let e = *self.b.get(at + 1)?;
        self.at = at + 2;
        Some(match e {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let high = self.hex4()?;
                match high {
                    0xD800..=0xDBFF => {
                        if self.b.get(self.at..self.at + 2)? != b"\\u" {
                            return None;
                        }
                        self.at += 2;
                        let low = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return None;
                        }
                        char::from_u32(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))?
                    }
                    0xDC00..=0xDFFF => return None,
                    _ => char::from_u32(high)?,
                }
            }
            _ => return None,
        })
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.b.get(self.at..self.at + 4)?;
        let mut v = 0;
        for &d in digits {
            v = v * 16 + char::from(d).to_digit(16)?;
        }
        self.at += 4;
        Some(v)
    }

    /// A number in JSON's grammar, within [`MAX_NUMBER_BYTES`] and
    /// [`MAX_EXPONENT_DIGITS`].
    fn number(&mut self) -> Option<()> {
        let start = self.at;
        if self.b.get(self.at) == Some(&b'-') {
            self.at += 1;
        }
        match self.b.get(self.at)? {
            b'0' => self.at += 1,
            b'1'..=b'9' => {
                self.digits();
            }
            _ => return None,
        }
        if self.b.get(self.at) == Some(&b'.') {
            self.at += 1;
            if self.digits() == 0 {
                return None;
            }
        }
        if matches!(self.b.get(self.at), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.b.get(self.at), Some(b'+' | b'-')) {
                self.at += 1;
            }
            let n = self.digits();
            if n == 0 || n > MAX_EXPONENT_DIGITS {
                return None;
            }
        }
        (self.at - start <= MAX_NUMBER_BYTES).then_some(())
    }

    /// Consumes ASCII digits; how many.
    fn digits(&mut self) -> usize {
        let n = self.b[self.at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        self.at += n;
        n
    }

    /// An object at `depth`, each key's value read by `field` (which must
    /// consume it).
    fn object(
        &mut self,
        depth: usize,
        mut field: impl FnMut(&mut Self, &str) -> Option<()>,
    ) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            let key = self.string(true)?;
            self.eat(b':')?;
            field(self, &key)?;
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A list at `depth`, each element read by `element`.
    fn list(
        &mut self,
        depth: usize,
        mut element: impl FnMut(&mut Self) -> Option<()>,
    ) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.eat(b'[')?;
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            element(self)?;
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// Any value at `depth`, checked and not kept.
    fn skip(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string(false).map(drop),
            b'{' => self.object(depth, |r, _| r.skip(depth + 1)),
            b'[' => self.list(depth, |r| r.skip(depth + 1)),
            b't' => self.word(b"true"),
            b'f' => self.word(b"false"),
            b'n' => self.word(b"null"),
            _ => self.number(),
        }
    }

    /// `null` (`Some(None)`) or what `read` reads.
    fn nullable<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.peek()? == b'n' {
            self.word(b"null")?;
            return Some(None);
        }
        read(self).map(Some)
    }
}

/// Sets `slot` once: a duplicate key is left to the tree (its last value
/// wins there).
fn once<T>(slot: &mut Option<T>, value: Option<T>) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value?);
    Some(())
}

/// One content part: its `type` and `text`.
struct Part<'a> {
    kind: Cow<'a, str>,
    text: Option<Cow<'a, str>>,
}

/// A message's `content`.
enum Content<'a> {
    Text(Cow<'a, str>),
    Null,
    Parts(Vec<Part<'a>>),
}

/// One chat message.
struct Message<'a> {
    role: Cow<'a, str>,
    content: Content<'a>,
}

/// A `prompt`: text and token ids read directly, any other value as its
/// bytes (for the tree's reading of lists of strings and its errors).
enum PromptField<'a> {
    Text(Cow<'a, str>),
    Tokens(Vec<u32>),
    Other(&'a [u8]),
}

impl<'a> Reader<'a> {
    fn part(&mut self, depth: usize) -> Option<Part<'a>> {
        let (mut kind, mut text) = (None, None);
        self.object(depth, |r, key| match key {
            "type" => once(&mut kind, r.string(true)),
            "text" => once(&mut text, r.string(true)),
            _ => r.skip(depth + 1),
        })?;
        Some(Part { kind: kind?, text })
    }

    fn content(&mut self, depth: usize) -> Option<Content<'a>> {
        match self.peek()? {
            b'"' => Some(Content::Text(self.string(true)?)),
            b'n' => self.word(b"null").map(|()| Content::Null),
            b'[' => {
                let mut parts = Vec::new();
                self.list(depth, |r| {
                    parts.push(r.part(depth + 1)?);
                    Some(())
                })?;
                Some(Content::Parts(parts))
            }
            _ => None,
        }
    }

    fn message(&mut self, depth: usize) -> Option<Message<'a>> {
        let (mut role, mut content) = (None, None);
        self.object(depth, |r, key| match key {
            "role" => once(&mut role, r.string(true)),
            "content" => once(&mut content, r.content(depth + 1)),
            // Passed on to the template: the tree reads them.
            "tool_calls" | "tool_call_id" | "name" | "task" | "reasoning" | "tools" => None,
            _ => r.skip(depth + 1),
        })?;
        Some(Message {
            role: role?,
            // No content: an assistant turn with tool calls only.
            content: content.unwrap_or(Content::Null),
        })
    }

    fn messages(&mut self, depth: usize) -> Option<Vec<Message<'a>>> {
        let mut messages = Vec::new();
        self.list(depth, |r| {
            messages.push(r.message(depth + 1)?);
            Some(())
        })?;
        Some(messages)
    }

    fn prompt(&mut self, depth: usize) -> Option<PromptField<'a>> {
        if self.peek()? == b'"' {
            return self.string(true).map(PromptField::Text);
        }
        let start = self.at;
        if let Some(ids) = self.token_prompt(depth) {
            return Some(PromptField::Tokens(ids));
        }
        // Not plain token ids: the value is checked here and read (or
        // refused, naming the field) by the tree.
        self.at = start;
        self.skip(depth)?;
        #[cfg(test)]
        PROMPTS_BY_TREE.with(|n| n.set(n.get() + 1));
        Some(PromptField::Other(&self.b[start..self.at]))
    }

    /// Token ids as the tree reads a `prompt` (`[1,2]`, or of a batch
    /// `[[1,2],…]` the first, the rest checked and not kept) straight into
    /// a `Vec<u32>`; `None` when the tree must read it (text, an empty
    /// list, a number that is not an id, anything in doubt).
    fn token_prompt(&mut self, depth: usize) -> Option<Vec<u32>> {
        self.eat(b'[')?;
        if self.peek()? != b'[' {
            return self.token_ids();
        }
        // A batch: the first prompt decides, the others are only checked.
        self.at += 1;
        let ids = self.token_ids()?;
        loop {
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.skip(depth + 1)?;
                }
                b']' => {
                    self.at += 1;
                    return Some(ids);
                }
                _ => return None,
            }
        }
    }

    /// The ids of a list whose `[` is consumed, up to its `]`: each a
    /// non-negative integer below 2^32 written as JSON writes one (no
    /// fraction or exponent, which the tree reads as a float and refuses as
    /// an id). `None` for an empty list or any other element.
    fn token_ids(&mut self) -> Option<Vec<u32>> {
        let mut ids = Vec::with_capacity(id_capacity(&self.b[self.at..])?);
        loop {
            self.peek()?;
            ids.push(self.token_id()?);
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(ids);
                }
                _ => return None,
            }
        }
    }

    /// One id: ASCII digits, no leading zero, within `u32`.
    fn token_id(&mut self) -> Option<u32> {
        let rest = &self.b[self.at..];
        let n = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        // Ten digits hold every u32; a leading zero is not JSON.
        if n == 0 || n > 10 || (n > 1 && rest[0] == b'0') {
            return None;
        }
        if matches!(rest.get(n), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        let value = rest[..n]
            .iter()
            .fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
        self.at += n;
        u32::try_from(value).ok()
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
        // A developer turn may become a system one, and a system text may
        // start with a header vLLM drops: the tree reads both.
        if m.role == "developer" {
            return None;
        }
        let system = m.role == "system";
        let content = match m.content {
            Content::Text(s) if system && s.starts_with(BILLING_HEADER) => return None,
            Content::Text(s) => s.into_owned(),
            Content::Null => String::new(),
            Content::Parts(parts) => {
                let mut texts: Vec<Cow<'_, str>> = Vec::with_capacity(parts.len());
                for part in parts {
                    match &*part.kind {
                        "text" => {}
                        // Text under other names: the tree reads them.
                        "input_text" | "output_text" | "refusal" | "thinking"
                        | "tool_reference" => return None,
                        // Images, audio: no prompt to route on.
                        _ => return Some(None),
                    }
                    let text = part.text?;
                    if system && text.starts_with(BILLING_HEADER) {
                        return None;
                    }
                    texts.push(text);
                }
                texts.join("\n")
            }
        };
        out.push(ChatMessage::new(m.role.into_owned(), content));
    }
    Some(Some(out))
}

/// Reads `body` sent to `path` (its query string removed) without a JSON
/// tree; `None` when the tree must read it.
pub(super) fn read(path: &str, body: &[u8]) -> Option<InferenceRequest> {
    let mut r = Reader { b: body, at: 0 };
    let (mut model, mut messages, mut prompt, mut cache_salt) = (None, None, None, None);
    r.object(1, |r, key| match key {
        // What else a chat template is given: the tree reads it.
        "tools"
        | "documents"
        | "chat_template_kwargs"
        | "chat_template"
        | "reasoning_effort"
        | "add_generation_prompt"
        | "continue_final_message"
        | "add_special_tokens" => None,
        "model" => once(&mut model, r.string(true)),
        "messages" => once(&mut messages, r.nullable(|r| r.messages(2))),
        "prompt" => once(&mut prompt, r.prompt(2)),
        "cache_salt" => once(&mut cache_salt, r.nullable(|r| r.string(true))),
        _ => r.skip(2),
    })?;
    // Nothing but whitespace after the object, as the tree requires.
    if r.peek().is_some() {
        return None;
    }
    let model = model.filter(|m: &Cow<'_, str>| !m.is_empty())?.into_owned();
    let chat_path = path.ends_with("/chat/completions")
        || (!path.ends_with("/completions") && messages.is_some());
    let prompt = if chat_path {
        chat(messages??)?.map(|m| Prompt::Chat(ChatPrompt::new(m)))
    } else {
        Some(match prompt? {
            PromptField::Text(text) => Prompt::Text(text.into_owned()),
            PromptField::Tokens(ids) => Prompt::Tokens(ids),
            PromptField::Other(bytes) => {
                completion_prompt(&serde_json::from_slice::<Value>(bytes).ok()?).ok()?
            }
        })
    };
    let cache_salt = cache_salt
        .flatten()
        .map(Cow::into_owned)
        .unwrap_or_default();
    Some(InferenceRequest {
        model,
        prompt,
        cache_salt,
    })
}

#[cfg(test)]
mod tests {
    use super::id_capacity;

    #[test]
    fn id_capacity_is_the_lists_ids_and_no_more_than_its_span_holds() {
        // A list of ids: exactly its ids, whitespace or not.
        assert_eq!(id_capacity(b"1,2,3]"), Some(3));
        assert_eq!(id_capacity(b" 10 , 2 ,3 ]"), Some(3));
        assert_eq!(id_capacity(b"7]"), Some(1));
        assert_eq!(id_capacity(b"]"), Some(1));
        assert_eq!(id_capacity(b"1,2"), None);
        // Commas inside a later string element: the span's bound, not
        // one slot a comma.
        let hostile = [&b"1,\""[..], &[b','; 10_000], b"\"]"].concat();
        let end = hostile.len() - 1;
        let cap = id_capacity(&hostile).unwrap();
        assert!(
            cap <= end.div_ceil(2),
            "{cap} slots for a span of {end} bytes"
        );
        assert!(cap < 10_000 / 2 + 3, "{cap}");
    }
}
