//! A chat completions (or legacy completions) stream: `data:` events, usage capture, the
//! usage chunk the client did not ask for dropped, reasoning normalized, first tokens timed.
//!
//! This is the hot path of the proxy: an event is looked at by byte searches; only events
//! carrying usage are parsed, and only events the reasoning rewriter must change are rebuilt.

use std::borrow::Cow;
use std::sync::LazyLock;
use std::time::Instant;

use memchr::memmem;

use crate::error::ProxyError;
use crate::json_scan::finder;
use crate::reasoning::StreamRewriter;
use crate::wire::stream::{data_event, data_payload, Action, EventTransform, Seen};
use crate::wire::usage;

/// The events of one chat or completions stream.
pub struct ChatStream {
    rewriter: Option<StreamRewriter>,
    /// Drop the usage-only chunk: the proxy asked for it, the client did not.
    drop_usage_chunk: bool,
    saw_done: bool,
}

impl ChatStream {
    /// `rewriter`: the reasoning rewriter (chat); none for streams passed as they are.
    pub fn new(rewriter: Option<StreamRewriter>, drop_usage_chunk: bool) -> Self {
        ChatStream {
            rewriter,
            drop_usage_chunk,
            saw_done: false,
        }
    }

    fn flush(&mut self) -> Option<Vec<u8>> {
        self.rewriter.as_mut().and_then(StreamRewriter::flush)
    }
}

/// Searchers built once: building one per event costs more than the search.
static CONTENT: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| finder(br#""content":""#));
static REASONING_CONTENT: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| finder(br#""reasoning_content":""#));
static REASONING: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| finder(br#""reasoning":""#));
static TOOL_CALLS: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| finder(br#""tool_calls":["#));
static TEXT: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| finder(br#""text":""#));
static USAGE: LazyLock<memmem::Finder<'static>> = LazyLock::new(|| finder(br#""usage":{"#));

/// A non-empty string value follows `key` somewhere in `data`.
fn has_text(data: &[u8], key: &memmem::Finder<'static>) -> bool {
    let len = key.needle().len();
    key.find_iter(data)
        .any(|i| data.get(i + len).is_some_and(|b| *b != b'"'))
}

/// Answer text: chat's `content`, or legacy completions' `text`.
fn has_content(data: &[u8]) -> bool {
    has_text(data, &CONTENT) || has_text(data, &TEXT)
}

fn has_token(data: &[u8]) -> bool {
    has_content(data)
        || has_text(data, &REASONING_CONTENT)
        || has_text(data, &REASONING)
        || TOOL_CALLS.find(data).is_some()
}

/// First and last token times of one event's data.
fn track(seen: &mut Seen, data: &[u8], now: Instant) {
    if seen.first_content.is_some() {
        // Both first times are known: every later event only moves the last one.
        seen.last_token = Some(now);
        return;
    }
    if has_token(data) {
        seen.token(now, has_content(data));
    }
}

impl EventTransform for ChatStream {
    fn event(&mut self, ev: &[u8], now: Instant, seen: &mut Seen) -> Action {
        let Some(data) = data_payload(ev) else {
            // Comments and events with more fields are forwarded as they are.
            return Action::Keep;
        };
        if data == b"[DONE]" {
            self.saw_done = true;
            return match self.flush() {
                Some(held) => {
                    let mut out = data_event(&held);
                    out.extend_from_slice(ev);
                    Action::Replace(out)
                }
                None => Action::Keep,
            };
        }
        if data.starts_with(b"{\"error\"") {
            seen.error = Some("error event from backend".into());
            return Action::Keep;
        }
        track(seen, data, now);
        if USAGE.find(data).is_some() {
            if let Some((u, usage_only)) = usage::of_event(data) {
                seen.usage = Some(u);
                if usage_only && self.drop_usage_chunk {
                    return match self.flush() {
                        Some(held) => Action::Replace(data_event(&held)),
                        None => Action::Drop,
                    };
                }
            }
        }
        let Some(rw) = self.rewriter.as_mut() else {
            return Action::Keep;
        };
        match rw.rewrite(data) {
            Cow::Borrowed(_) => Action::Keep,
            Cow::Owned(rewritten) => Action::Replace(data_event(&rewritten)),
        }
    }

    fn end(&mut self, _seen: &mut Seen) -> Option<Vec<u8>> {
        if self.saw_done {
            return None;
        }
        self.flush().map(|held| data_event(&held))
    }

    fn broken(&mut self, e: &ProxyError, _seen: &mut Seen) -> Vec<u8> {
        // Text held back by the splitter goes out before the error, not lost with it.
        let mut out = self.flush().map(|h| data_event(&h)).unwrap_or_default();
        out.extend_from_slice(&data_event(&e.envelope_json()));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_tokens_and_content() {
        assert!(!has_token(
            br#"{"choices":[{"delta":{"role":"assistant","content":null}}]}"#
        ));
        assert!(!has_token(br#"{"choices":[{"delta":{"content":""}}]}"#));
        assert!(has_token(
            br#"{"choices":[{"delta":{"reasoning_content":"L"}}]}"#
        ));
        assert!(!has_content(
            br#"{"choices":[{"delta":{"reasoning_content":"L"}}]}"#
        ));
        assert!(has_content(br#"{"choices":[{"delta":{"content":"Hi"}}]}"#));
        assert!(has_content(br#"{"choices":[{"text":"Hi","index":0}]}"#));
        assert!(has_token(
            br#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#
        ));
    }

    #[test]
    fn the_usage_chunk_asked_by_the_proxy_is_read_and_dropped() {
        let mut s = ChatStream::new(None, true);
        let mut seen = Seen::default();
        let now = Instant::now();
        let token = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        assert_eq!(s.event(token, now, &mut seen), Action::Keep);
        assert_eq!(seen.first_content, Some(now));
        let usage =
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n";
        assert_eq!(s.event(usage, now, &mut seen), Action::Drop);
        assert_eq!(seen.usage.map(|u| (u.prompt, u.completion)), Some((3, 1)));
        assert_eq!(s.event(b"data: [DONE]\n\n", now, &mut seen), Action::Keep);
        assert_eq!(s.end(&mut seen), None);
    }
}
