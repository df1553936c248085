//! One stream as its API sees it: the per-stream handling the Messages and Responses adapters
//! (and their translations from chat) supply to the relay, what the events showed (usage,
//! first and last token), and the SSE framing: where an event ends, its data lines, events
//! written.
//!
//! The relay frames events and knows no API: each complete event of such a stream goes to its
//! [`ApiEvents`], which forwards, drops or replaces it (with any number of events) and notes in
//! [`Seen`] what the event told about the generation.

use std::sync::Arc;
use std::time::Instant;

use super::usage::Usage;
use crate::error::ProxyError;
use crate::reasoning::{OutputField, ThinkTags};

/// What a stream's events showed about its generation.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    pub usage: Option<Usage>,
    /// The first generated token of any kind: answer text, reasoning or a tool call.
    pub first_token: Option<Instant>,
    /// The first answer text.
    pub first_content: Option<Instant>,
    pub last_token: Option<Instant>,
    /// The backend reported an error inside the stream.
    pub error: Option<String>,
    /// Token events seen.
    pub tokens: u64,
}

impl Seen {
    /// A token arrived at `now`; `content`: it is answer text.
    pub(crate) fn token(&mut self, now: Instant, content: bool) {
        self.tokens += 1;
        self.first_token.get_or_insert(now);
        if content {
            self.first_content.get_or_insert(now);
        }
        self.last_token = Some(now);
    }
}

/// What becomes of one event.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Forwarded as the same bytes.
    Keep,
    /// Not forwarded.
    Drop,
    /// These bytes (zero or more whole events) go out instead.
    Replace(Vec<u8>),
}

/// The per-stream handling of one API's whole events.
pub trait ApiEvents: Send {
    /// One complete event (its lines and blank-line terminator) that arrived at `now`.
    fn event(&mut self, ev: &[u8], now: Instant, seen: &mut Seen) -> Action;
    /// The backend's stream ended: events to send after its last one, if any.
    fn end(&mut self, seen: &mut Seen) -> Option<Vec<u8>>;
    /// The stream broke with `e`: what the client gets as its last events (text still held
    /// back, then the API's error event).
    fn broken(&mut self, e: &ProxyError, seen: &mut Seen) -> Vec<u8>;
}

/// What a stream's transform is built from.
#[derive(Debug, Clone)]
pub struct StreamContext {
    /// The field the client gets reasoning in (chat).
    pub output: OutputField,
    /// The alias's inline think tags.
    pub tags: Option<Arc<ThinkTags>>,
    /// The model name the client asked for (what a translated answer names).
    pub model: String,
}

/// The payload of a single-line `data:` event, or `None` for anything else.
pub fn data_payload(ev: &[u8]) -> Option<&[u8]> {
    let rest = ev.strip_prefix(b"data:")?;
    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
    let end = memchr::memchr(b'\n', rest)?;
    let line = &rest[..end];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    // More lines in the event than the terminator: not a single-data event.
    let tail = &rest[end + 1..];
    if tail.iter().any(|b| *b != b'\n' && *b != b'\r') {
        return None;
    }
    Some(line)
}

/// An event's `event:` name (if any) and its one `data:` line (`None` when it has none or
/// several), as the Responses and Messages APIs send them.
pub fn named_data(ev: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    let mut name = None;
    let mut data = None;
    let mut several = false;
    for line in ev.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(rest) = line.strip_prefix(b"data:") {
            several |= data.is_some();
            data = Some(rest.strip_prefix(b" ").unwrap_or(rest));
        } else if let Some(rest) = line.strip_prefix(b"event:") {
            name = Some(rest.strip_prefix(b" ").unwrap_or(rest));
        }
    }
    (name, if several { None } else { data })
}

/// Length of the first complete event in `buf` (including its blank-line terminator).
pub fn event_len(buf: &[u8]) -> Option<usize> {
    event_end_after(buf, 0)
}

/// The end of the first event terminator in `buf` that does not lie wholly in its first
/// `searched` bytes (bytes an earlier search found no terminator in): a terminator is at most
/// three bytes, so the search resumes two bytes back.
pub fn event_end_after(buf: &[u8], searched: usize) -> Option<usize> {
    let mut from = searched.saturating_sub(2);
    while let Some(i) = memchr::memchr(b'\n', &buf[from..]) {
        let i = from + i;
        match buf.get(i + 1) {
            Some(b'\n') => return Some(i + 2),
            Some(b'\r') if buf.get(i + 2) == Some(&b'\n') => return Some(i + 3),
            None => return None,
            _ => from = i + 1,
        }
    }
    None
}

/// The `data:` payload of the first complete event in `chunk`.
pub fn first_payload(chunk: &[u8]) -> Option<&[u8]> {
    data_payload(&chunk[..event_len(chunk)?])
}

/// `payload` as one SSE `data:` event.
pub fn data_event(payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(payload.len() + 8);
    v.extend_from_slice(b"data: ");
    v.extend_from_slice(payload);
    v.extend_from_slice(b"\n\n");
    v
}

/// Appends `event: name` with `payload` as its data.
pub(crate) fn push_named(out: &mut Vec<u8>, name: &str, payload: &[u8]) {
    out.reserve(payload.len() + name.len() + 17);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_event_ends() {
        assert_eq!(event_len(b"data: x\n\ndata: y"), Some(9));
        assert_eq!(event_len(b"data: x\r\n\r\n"), Some(11));
        assert_eq!(event_len(b"data: x\n"), None);
        assert_eq!(event_len(b"event: a\ndata: x\n\n"), Some(18));
    }

    #[test]
    fn extracts_single_data_payloads() {
        assert_eq!(
            data_payload(b"data: {\"a\":1}\n\n"),
            Some(&b"{\"a\":1}"[..])
        );
        assert_eq!(data_payload(b"data:[DONE]\r\n\r\n"), Some(&b"[DONE]"[..]));
        assert_eq!(data_payload(b"event: x\ndata: y\n\n"), None);
        assert_eq!(data_payload(b": comment\n\n"), None);
    }

    #[test]
    fn finds_the_name_and_data_of_named_events() {
        let ev = b"event: response.output_text.delta\ndata: {\"delta\":\"Hi\"}\n\n";
        assert_eq!(
            named_data(ev),
            (
                Some(&b"response.output_text.delta"[..]),
                Some(&b"{\"delta\":\"Hi\"}"[..])
            )
        );
        assert_eq!(named_data(b"data: a\ndata: b\n\n"), (None, None));
        assert_eq!(named_data(b": keep-alive\n\n"), (None, None));
        assert_eq!(named_data(b"data: x\r\n\r\n"), (None, Some(&b"x"[..])));
        let mut out = Vec::new();
        push_named(&mut out, "ping", b"{}");
        assert_eq!(out, b"event: ping\ndata: {}\n\n");
    }
}
