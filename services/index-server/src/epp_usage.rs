//! What an engine's response says about the request it served: the
//! OpenAI `usage` object (prompt tokens, and the prompt tokens it found in
//! its cache when the engine reports them: vLLM with
//! `--enable-prompt-tokens-details`, SGLang with `--enable-cache-report`).
//! Read from a JSON body or a server-sent-events stream (`stream_options:
//! {include_usage: true}` puts it on the last event), chunk by chunk,
//! keeping at most [`MAX_HELD_BYTES`] of it. No I/O.

use serde_json::Value;

/// Most response bytes held while looking for the usage: a JSON body
/// larger than this, or one SSE line larger than this, is not read.
pub const MAX_HELD_BYTES: usize = 1 << 20;

/// The usage an engine reported.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Prompt tokens the engine served from its cache; `None` when it does
    /// not report them.
    pub cached_tokens: Option<u64>,
}

/// Reads the usage out of a response body as its chunks arrive.
#[derive(Debug, Default)]
pub struct UsageReader {
    event_stream: bool,
    held: Vec<u8>,
    overflowed: bool,
    found: Option<Usage>,
}

impl UsageReader {
    /// A reader for a body of `content_type` (`text/event-stream` is read
    /// event by event, anything else as one JSON document).
    pub fn new(content_type: Option<&str>) -> Self {
        Self {
            event_stream: content_type
                .is_some_and(|c| c.to_ascii_lowercase().contains("text/event-stream")),
            ..Self::default()
        }
    }

    /// Whether the body is an event stream (`text/event-stream`).
    pub fn is_event_stream(&self) -> bool {
        self.event_stream
    }

    /// One chunk of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.event_stream {
            self.feed_events(chunk);
        } else if !self.overflowed {
            if self.held.len() + chunk.len() > MAX_HELD_BYTES {
                self.overflowed = true;
                self.held = Vec::new();
            } else {
                self.held.extend_from_slice(chunk);
            }
        }
    }

    fn feed_events(&mut self, mut chunk: &[u8]) {
        while let Some(end) = chunk.iter().position(|&b| b == b'\n') {
            let (line, rest) = chunk.split_at(end);
            if !self.overflowed && self.held.len() + line.len() <= MAX_HELD_BYTES {
                self.held.extend_from_slice(line);
                let line = std::mem::take(&mut self.held);
                self.event_line(&line);
            } else {
                self.held.clear();
            }
            // A line too long to hold is skipped; the next starts clean.
            self.overflowed = false;
            chunk = &rest[1..];
        }
        if self.held.len() + chunk.len() > MAX_HELD_BYTES {
            self.overflowed = true;
            self.held.clear();
        } else if !self.overflowed {
            self.held.extend_from_slice(chunk);
        }
    }

    fn event_line(&mut self, line: &[u8]) {
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        let data = data.trim_ascii();
        // Most events carry tokens, not usage: skip them unparsed.
        if data == b"[DONE]" || !contains(data, b"\"usage\"") {
            return;
        }
        if let Some(u) = usage_of(data) {
            self.found = Some(u);
        }
    }

    /// The body ended: the usage it carried, if any.
    pub fn finish(mut self) -> Option<Usage> {
        if self.event_stream {
            let rest = std::mem::take(&mut self.held);
            if !self.overflowed {
                self.event_line(&rest);
            }
            self.found
        } else if self.overflowed {
            None
        } else {
            usage_of(&self.held)
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn usage_of(json: &[u8]) -> Option<Usage> {
    let doc: Value = serde_json::from_slice(json).ok()?;
    let usage = doc.get("usage")?;
    let prompt_tokens = usage.get("prompt_tokens")?.as_u64()?;
    let cached_tokens = usage
        .get("prompt_tokens_details")
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64);
    Some(Usage {
        prompt_tokens,
        cached_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(content_type: Option<&str>, chunks: &[&[u8]]) -> Option<Usage> {
        let mut r = UsageReader::new(content_type);
        for c in chunks {
            r.feed(c);
        }
        r.finish()
    }

    #[test]
    fn a_json_body_split_anywhere() {
        let body = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":5,"total_tokens":125,"prompt_tokens_details":{"cached_tokens":96}}}"#;
        let want = Some(Usage {
            prompt_tokens: 120,
            cached_tokens: Some(96),
        });
        for cut in [0, 1, 30, body.len() - 1] {
            let (a, b) = body.split_at(cut);
            assert_eq!(read(Some("application/json"), &[a, b]), want, "cut {cut}");
        }
        // No details: the prompt only.
        let plain = br#"{"usage":{"prompt_tokens":7,"prompt_tokens_details":null}}"#;
        assert_eq!(
            read(None, &[plain]),
            Some(Usage {
                prompt_tokens: 7,
                cached_tokens: None
            })
        );
        assert_eq!(read(None, &[b"{not json"]), None);
        assert_eq!(read(None, &[br#"{"choices":[]}"#]), None);
    }

    #[test]
    fn an_event_stream_s_last_usage_event() {
        let events = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2048,\"completion_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":2032}}}\n\n\
data: [DONE]\n\n";
        let want = Some(Usage {
            prompt_tokens: 2048,
            cached_tokens: Some(2032),
        });
        for size in [1, 7, 64, events.len()] {
            let chunks: Vec<&[u8]> = events.chunks(size).collect();
            assert_eq!(
                read(Some("text/event-stream; charset=utf-8"), &chunks),
                want,
                "chunks of {size}"
            );
        }
        // Without include_usage: none.
        assert_eq!(
            read(
                Some("text/event-stream"),
                &[b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n"]
            ),
            None
        );
    }

    #[test]
    fn bodies_over_the_limit_are_not_held() {
        let big = vec![b' '; MAX_HELD_BYTES + 1];
        let mut r = UsageReader::new(None);
        r.feed(&big);
        r.feed(br#"{"usage":{"prompt_tokens":1}}"#);
        assert!(r.held.is_empty());
        assert_eq!(r.finish(), None);
        // An overlong event line is skipped; the next event is read.
        let mut r = UsageReader::new(Some("text/event-stream"));
        r.feed(b"data: ");
        r.feed(&big);
        r.feed(b"\ndata: {\"usage\":{\"prompt_tokens\":3}}\n");
        assert_eq!(
            r.finish(),
            Some(Usage {
                prompt_tokens: 3,
                cached_tokens: None
            })
        );
    }
}
