//! SSE relay: forwards backend events as they arrive, transforming only the events that need it.
//!
//! Complete events are found by their blank-line terminator. Chat and completions events are
//! read here; an API with events of its own (Messages, Responses, a translation from chat)
//! hands each event to its [`ApiEvents`]. A chunk whose events all pass
//! unchanged is forwarded as the same bytes (no copy); only rewritten or dropped events cause a
//! new buffer. Dropping the relay (client gone) drops the upstream response, which closes the
//! backend connection so the backend frees its slot.

use std::borrow::Cow;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::stream::{BoxStream, StreamExt};
use futures_util::FutureExt;
use memchr::memmem::Finder;
use serde_json::Value;

use crate::error::ProxyError;
use crate::fleet::breaker::Breaker;
use crate::fleet::slots::SlotPermit;
use crate::json_scan::keys::{CONTENT, REASONING, REASONING_CONTENT, TOOL_CALLS};
use crate::json_scan::{self, finder};
use crate::observe::record::Record;
use crate::upstream::exchange::UpstreamReason;
use crate::upstream::BoxError;
use crate::wire::stream::data_payload;
use crate::wire::{Action, Adapter, ApiEvents, EventTransform, Seen};

use super::same_shape::LastShape;

/// What the relay does besides forwarding.
pub struct RelayOptions {
    /// Drop the usage-only chunk: the proxy asked for it, the client did not.
    pub drop_usage_chunk: bool,
    pub transform: Option<Box<dyn EventTransform>>,
    /// The API's own handling of whole events: when set, it reads and writes every event in
    /// place of the chat reading here.
    pub events: Option<Box<dyn ApiEvents>>,
    /// The API of the stream: how an error event is written.
    pub adapter: &'static dyn Adapter,
    /// The breaker of the backend streaming: a broken or stalled stream is its failure.
    pub breaker: Option<Arc<Breaker>>,
    /// Most bytes of one event held until its end (`server.event_limit_bytes`).
    pub event_limit: usize,
}

/// Everything the relay tracks apart from the byte buffer.
struct Tracker {
    ex: Record,
    opts: RelayOptions,
    saw_done: bool,
    /// The last event read in full, for the events shaped as it.
    last: LastShape,
    /// What the API's own events showed; moved into the record when the relay goes.
    seen: Seen,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.ex.absorb(std::mem::take(&mut self.seen));
    }
}

/// Length of the first complete event in `buf` (including its blank-line terminator).
pub(crate) fn event_len(buf: &[u8]) -> Option<usize> {
    event_end_after(buf, 0)
}

/// The end of the first event terminator in `buf` that does not lie wholly in its first
/// `searched` bytes (bytes an earlier search found no terminator in): a terminator is at most
/// three bytes, so the search resumes two bytes back.
pub(crate) fn event_end_after(buf: &[u8], searched: usize) -> Option<usize> {
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

/// The one `data:` line of an event that also has other fields (`event:`, `id:`, comments),
/// as the Responses and Messages APIs send; `None` when there is no or more than one.
fn tagged_data(ev: &[u8]) -> Option<&[u8]> {
    let mut data = None;
    for line in ev.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(rest) = line.strip_prefix(b"data:") {
            if data.is_some() {
                return None;
            }
            data = Some(rest.strip_prefix(b" ").unwrap_or(rest));
        }
    }
    data
}

/// Searchers built once: building one per event costs more than the search.
static DELTA: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""delta""#));
static TEXT: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""text""#));
static USAGE: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""usage""#));
static ERROR: LazyLock<Finder<'static>> = LazyLock::new(|| finder(br#""error""#));

/// One event's data as the relay reads it: by key searches (`json_scan::values`, whitespace
/// and key order as they come), which answer what a parse answers unless a word character
/// is written as an escape; then from a parse, made once.
pub(crate) struct Payload<'a> {
    data: &'a [u8],
    /// The parse, when the key searches cannot be sure (`Null` for data that is no JSON).
    parsed: Option<Value>,
}

impl<'a> Payload<'a> {
    pub(crate) fn new(data: &'a [u8]) -> Self {
        let parsed = json_scan::may_escape_word(data)
            .then(|| serde_json::from_slice(data).unwrap_or(Value::Null));
        Payload { data, parsed }
    }

    /// Some member named `name` (searched as `key`) anywhere has a value `bytes` or `value`
    /// accepts (`bytes` sees the value's JSON text from its first byte on).
    fn any(
        &self,
        key: &Finder<'static>,
        name: &str,
        bytes: fn(&[u8]) -> bool,
        value: fn(&Value) -> bool,
    ) -> bool {
        match &self.parsed {
            None => json_scan::values(self.data, key).any(bytes),
            Some(v) => any_member(v, name, value),
        }
    }

    /// A non-empty string is the value of some `name` member.
    fn has_text(&self, key: &Finder<'static>, name: &str) -> bool {
        self.any(
            key,
            name,
            |v| v.first() == Some(&b'"') && v.get(1).is_some_and(|b| *b != b'"'),
            |v| v.as_str().is_some_and(|s| !s.is_empty()),
        )
    }

    pub(crate) fn has_content(&self) -> bool {
        self.has_text(&CONTENT, "content")
    }

    pub(crate) fn has_token(&self) -> bool {
        self.has_content()
            || self.has_text(&REASONING_CONTENT, "reasoning_content")
            || self.has_text(&REASONING, "reasoning")
            || self.any(
                &TOOL_CALLS,
                "tool_calls",
                |v| v.first() == Some(&b'['),
                Value::is_array,
            )
    }

    /// Responses (`"delta":"…"`) and Messages (`"text":"…"`) carry text this way.
    pub(crate) fn has_tagged_text(&self) -> bool {
        self.has_text(&DELTA, "delta") || self.has_text(&TEXT, "text")
    }

    /// Whether [`crate::wire::usage::of_event`] may find usage: some `usage` member is an object.
    pub(crate) fn may_have_usage(&self) -> bool {
        self.any(
            &USAGE,
            "usage",
            |v| v.first() == Some(&b'{'),
            Value::is_object,
        )
    }

    /// The key searches answer for this data (no word character is written as an escape).
    pub(crate) fn searched(&self) -> bool {
        self.parsed.is_none()
    }

    /// An error event: the top-level object has an `error` that is not null.
    pub(crate) fn is_error(&self) -> bool {
        let top = |v: &Value| v.get("error").is_some_and(|e| !e.is_null());
        match &self.parsed {
            Some(v) => top(v),
            // No `error` key anywhere is the common case; one somewhere is parsed to see
            // whether it is the top level's.
            None => {
                json_scan::values(self.data, &ERROR).next().is_some()
                    && serde_json::from_slice::<Value>(self.data).is_ok_and(|v| top(&v))
            }
        }
    }
}

/// Some member named `name` at any depth of `v` has a value `accept` takes.
fn any_member(v: &Value, name: &str, accept: fn(&Value) -> bool) -> bool {
    match v {
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| (k == name && accept(v)) || any_member(v, name, accept)),
        Value::Array(items) => items.iter().any(|v| any_member(v, name, accept)),
        _ => false,
    }
}

impl Tracker {
    /// First and last token times of one event's data.
    fn track(&mut self, data: &Payload<'_>, now: Instant) {
        if self.ex.first_content.is_some() {
            // Both first times are known: every later event only moves the last one.
            self.ex.last_token = Some(now);
            return;
        }
        if data.has_token() {
            self.ex.first_token.get_or_insert(now);
            self.ex.last_token = Some(now);
            if self.ex.first_content.is_none() && data.has_content() {
                self.ex.first_content = Some(now);
            }
        }
    }

    fn on_event(&mut self, ev: &[u8], now: Instant) -> Action {
        if self.ex.traced().is_some() {
            if let Some(data) = data_payload(ev).or_else(|| tagged_data(ev)) {
                super::traced::event(&mut self.ex, data);
            }
        }
        if let Some(events) = self.opts.events.as_mut() {
            return events.event(ev, now, &mut self.seen);
        }
        let Some(data) = data_payload(ev) else {
            // An event with more fields is forwarded as it is; its data still counts for
            // TTFT and usage.
            if let Some(data) = tagged_data(ev) {
                let payload = Payload::new(data);
                if self.ex.first_content.is_none() && payload.has_tagged_text() {
                    self.ex.first_token.get_or_insert(now);
                    self.ex.first_content.get_or_insert(now);
                    self.ex.last_token = Some(now);
                }
                self.track(&payload, now);
                if payload.may_have_usage() {
                    if let Some((usage, _)) = crate::wire::usage::of_event(data) {
                        self.ex.usage = Some(usage);
                    }
                }
            }
            return Action::Keep;
        };
        if data == b"[DONE]" {
            self.saw_done = true;
            return match self.opts.transform.as_mut().and_then(|t| t.flush()) {
                Some(held) => {
                    let mut out = crate::wire::data_event(&held);
                    out.extend_from_slice(ev);
                    Action::Replace(out)
                }
                None => Action::Keep,
            };
        }
        if let Some(kept) = self.last.matches(data) {
            // The readings of the last event hold: no error, no usage object, no escape.
            self.track_text(data, now);
            return if kept {
                Action::Keep
            } else {
                self.transform(data).0
            };
        }
        let payload = Payload::new(data);
        if payload.is_error() {
            self.last.forget();
            self.ex.error = Some("error event from backend".into());
            return Action::Keep;
        }
        self.track(&payload, now);
        if payload.may_have_usage() {
            self.last.forget();
            if let Some((usage, usage_only)) = crate::wire::usage::of_event(data) {
                self.ex.usage = Some(usage);
                if usage_only && self.opts.drop_usage_chunk {
                    return match self.opts.transform.as_mut().and_then(|t| t.flush()) {
                        Some(held) => Action::Replace(crate::wire::data_event(&held)),
                        None => Action::Drop,
                    };
                }
            }
            return self.transform(data).0;
        }
        let (action, kept) = self.transform(data);
        if payload.searched() {
            self.last.remember(data, kept);
        } else {
            self.last.forget();
        }
        action
    }

    /// First and last token times of an event shaped as the last one.
    fn track_text(&mut self, data: &[u8], now: Instant) {
        if self.ex.first_content.is_some() {
            self.ex.last_token = Some(now);
        } else {
            self.track(&Payload::new(data), now);
        }
    }

    /// The transform's action on `data`, and whether an event shaped as it is left alone
    /// too (nothing changed, by a transform whose verdict follows the keys).
    fn transform(&mut self, data: &[u8]) -> (Action, bool) {
        let Some(t) = self.opts.transform.as_mut() else {
            return (Action::Keep, true);
        };
        match t.rewrite(data) {
            Cow::Borrowed(_) => (Action::Keep, t.follows_keys()),
            Cow::Owned(rewritten) => (Action::Replace(crate::wire::data_event(&rewritten)), false),
        }
    }
}

struct Relay {
    upstream: BoxStream<'static, Result<Bytes, BoxError>>,
    /// The start of an event still to end.
    buf: BytesMut,
    /// How much of `buf` is known to hold no event end: the search for one resumes there,
    /// so each byte is searched a bounded number of times however long the event grows.
    searched: usize,
    t: Tracker,
    permit: Option<SlotPermit>,
    /// An upstream item read while coalescing, to be handled next.
    pending: Option<Option<Result<Bytes, BoxError>>>,
    /// Events have gone out; until then nothing is gathered and the first are flushed alone.
    started: bool,
    /// The first events were given a write of their own (one yield, so the server flushes
    /// them before the relay reads on).
    flushed: bool,
    done: bool,
}

/// Most bytes gathered into one write to the client.
const COALESCE_LIMIT: usize = 64 * 1024;
/// Most time spent gathering them.
const COALESCE_BUDGET: std::time::Duration = std::time::Duration::from_millis(2);
/// Yields in a row with nothing new before writing what there is.
const COALESCE_YIELDS: u8 = 3;

impl Tracker {
    /// Transform the complete events at the start of `data`: how many bytes they span, and
    /// their replacement when any event changed (`None`: forward `data[..len]` as it is).
    fn scan(&mut self, data: &[u8], now: Instant) -> (usize, Option<BytesMut>) {
        let mut out: Option<BytesMut> = None;
        let mut pos = 0;
        let mut copied = 0;
        while let Some(len) = event_len(&data[pos..]) {
            match self.on_event(&data[pos..pos + len], now) {
                Action::Keep => {}
                action => {
                    let o = out.get_or_insert_with(|| BytesMut::with_capacity(data.len() + 64));
                    o.extend_from_slice(&data[copied..pos]);
                    if let Action::Replace(bytes) = action {
                        o.extend_from_slice(&bytes);
                    }
                    copied = pos + len;
                }
            }
            pos += len;
        }
        if let Some(o) = out.as_mut() {
            o.extend_from_slice(&data[copied..pos]);
        }
        (pos, out)
    }
}

impl Relay {
    /// Take the complete events of `chunk` (after what is buffered), transformed.
    fn take_events(&mut self, chunk: Bytes, now: Instant) -> Bytes {
        if self.buf.is_empty() {
            // Nothing pending: unchanged events go out as slices of the chunk itself.
            let (len, out) = self.t.scan(&chunk, now);
            self.buf.extend_from_slice(&chunk[len..]);
            self.searched = self.buf.len();
            return match out {
                Some(o) => o.freeze(),
                None => chunk.slice(..len),
            };
        }
        self.buf.extend_from_slice(&chunk);
        if event_end_after(&self.buf, self.searched).is_none() {
            self.searched = self.buf.len();
            return Bytes::new();
        }
        let (len, out) = self.t.scan(&self.buf, now);
        let events = self.buf.split_to(len);
        self.searched = self.buf.len();
        out.unwrap_or(events).freeze()
    }

    /// The event being gathered is longer than the relay holds.
    fn overlong(&self) -> bool {
        self.buf.len() > self.t.opts.event_limit
    }

    /// The next upstream item: one held back by coalescing first, else wait for the backend.
    async fn pull(&mut self) -> Option<Result<Bytes, BoxError>> {
        match self.pending.take() {
            Some(item) => item,
            None => self.upstream.next().await,
        }
    }

    async fn next_output(&mut self) -> Option<Bytes> {
        if self.started && !self.flushed {
            self.flushed = true;
            tokio::task::yield_now().await;
        }
        loop {
            if self.done {
                return None;
            }
            match self.pull().await {
                Some(Ok(chunk)) => {
                    let out = self.take_events(chunk, Instant::now());
                    if self.overlong() {
                        return Some(self.overflow(out));
                    }
                    if out.is_empty() {
                        continue;
                    }
                    if !self.started {
                        // The first events go out at once: time to first token is what a
                        // client waits on, and a burst behind them is gathered next time.
                        self.started = true;
                        return Some(out);
                    }
                    return Some(self.coalesce(out).await);
                }
                Some(Err(e)) => return Some(self.broken(&e)),
                None => return self.end(),
            }
        }
    }

    /// Append what the backend has already sent, so one write to the client carries every
    /// event that is ready. When nothing is ready, yield (up to `COALESCE_YIELDS` times in a
    /// row) so the upstream connection task can decode what its socket buffer already holds:
    /// a burst arrives as many small chunks handed over one at a time, and a yield is far
    /// cheaper than a write per event. Bounded by `COALESCE_LIMIT` bytes and
    /// `COALESCE_BUDGET` of time, so a busy worker never holds events back for long.
    async fn coalesce(&mut self, first: Bytes) -> Bytes {
        let mut out: Option<BytesMut> = None;
        let mut yielded = 0u8;
        let started = Instant::now();
        let mut gathered = 0u32;
        while out.as_ref().map_or(first.len(), |o| o.len()) < COALESCE_LIMIT
            && (gathered % 16 != 15 || started.elapsed() < COALESCE_BUDGET)
        {
            match self.upstream.next().now_or_never() {
                Some(Some(Ok(chunk))) => {
                    yielded = 0;
                    // Events gathered in one batch share its timestamp (within the budget).
                    gathered += 1;
                    let more = self.take_events(chunk, started);
                    if !more.is_empty() {
                        let o = out.get_or_insert_with(|| {
                            let mut o = BytesMut::with_capacity(first.len() * 8);
                            o.extend_from_slice(&first);
                            o
                        });
                        o.extend_from_slice(&more);
                    }
                    if self.overlong() {
                        // Out with what was gathered; the next output is the error.
                        self.pending = Some(Some(Ok(Bytes::new())));
                        break;
                    }
                }
                Some(item) => {
                    self.pending = Some(item);
                    break;
                }
                None if yielded >= COALESCE_YIELDS => break,
                None => {
                    tokio::task::yield_now().await;
                    yielded += 1;
                }
            }
        }
        out.map_or(first, BytesMut::freeze)
    }

    /// `out` (the events before it), then the end of a stream whose event grew past the limit.
    fn overflow(&mut self, out: Bytes) -> Bytes {
        let err = ProxyError::EventTooLarge {
            backend: self.t.ex.backend.clone().unwrap_or_default(),
            limit: self.t.opts.event_limit,
        };
        self.buf = BytesMut::new();
        let end = self.cut(UpstreamReason::too_large, err);
        [out, end].concat().into()
    }

    fn broken(&mut self, e: &BoxError) -> Bytes {
        let backend = self.t.ex.backend.clone().unwrap_or_default();
        let (reason, err) = match super::deadline::Expired::of(e) {
            Some(expired) => (
                UpstreamReason::timeout,
                ProxyError::UpstreamTimeout {
                    backend,
                    elapsed: expired.limit(),
                },
            ),
            // A body that breaks HTTP/1.1 is the backend's protocol error; any other failure
            // is the stream breaking off (the connection cut or reset).
            None => (
                if crate::upstream::is_malformed(e.as_ref()) {
                    UpstreamReason::protocol
                } else {
                    UpstreamReason::stream_broken
                },
                ProxyError::UpstreamProtocol {
                    backend,
                    detail: format!("stream broken: {}", crate::upstream::chain(e.as_ref())),
                },
            ),
        };
        self.cut(reason, err)
    }

    /// End the stream with `err` as the API's error event, after the text the transform holds.
    fn cut(&mut self, reason: UpstreamReason, err: ProxyError) -> Bytes {
        self.done = true;
        // Text held back by the splitter goes out before the error, not lost with it.
        let mut out = match self.t.opts.transform.as_mut().and_then(|t| t.flush()) {
            Some(held) => crate::wire::data_event(&held),
            None => Vec::new(),
        };
        self.t.ex.metrics().upstream_error(reason);
        if let Some(b) = &self.t.opts.breaker {
            b.failure(Instant::now());
        }
        self.t.ex.error = Some(err.to_string());
        self.t.ex.completed = true;
        match self.t.opts.events.as_mut() {
            Some(events) => out.extend_from_slice(&events.broken(&err, &mut self.t.seen)),
            None => out.extend_from_slice(&self.t.opts.adapter.stream_error(&err)),
        }
        self.t.ex.absorb(std::mem::take(&mut self.t.seen));
        // Free the slot, the backend connection and the in-flight count now, not when the
        // client has read the error event.
        self.permit = None;
        self.upstream = futures_util::stream::empty().boxed();
        drop(self.t.ex.take());
        Bytes::from(out)
    }

    fn end(&mut self) -> Option<Bytes> {
        self.done = true;
        self.t.ex.completed = true;
        let mut out = BytesMut::new();
        if !self.buf.iter().all(u8::is_ascii_whitespace) {
            // A last event without its blank line: terminate it and treat it like the others.
            let mut last = std::mem::take(&mut self.buf);
            last.extend_from_slice(b"\n\n");
            let (len, replaced) = self.t.scan(&last, Instant::now());
            match replaced {
                Some(r) => out.extend_from_slice(&r),
                None => out.extend_from_slice(&last[..len]),
            }
        }
        if !self.t.saw_done {
            if let Some(held) = self.t.opts.transform.as_mut().and_then(|t| t.flush()) {
                let mut with_held = BytesMut::from(&crate::wire::data_event(&held)[..]);
                with_held.extend_from_slice(&out);
                out = with_held;
            }
        }
        if let Some(events) = self.t.opts.events.as_mut() {
            if let Some(tail) = events.end(&mut self.t.seen) {
                out.extend_from_slice(&tail);
            }
        }
        (!out.is_empty()).then(|| out.freeze())
    }
}

/// The `data:` payload of the first complete event in `chunk`.
pub fn first_payload(chunk: &[u8]) -> Option<&[u8]> {
    data_payload(&chunk[..event_len(chunk)?])
}

/// The client's response body for an upstream SSE response.
pub fn relay(
    upstream: BoxStream<'static, Result<Bytes, BoxError>>,
    ex: Record,
    permit: Option<SlotPermit>,
    opts: RelayOptions,
) -> Body {
    let relay = Relay {
        upstream,
        buf: BytesMut::new(),
        searched: 0,
        t: Tracker {
            ex,
            opts,
            saw_done: false,
            last: LastShape::default(),
            seen: Seen::default(),
        },
        permit,
        pending: None,
        started: false,
        flushed: false,
        done: false,
    };
    let stream = futures_util::stream::unfold(relay, |mut r| async move {
        let out = r.next_output().await?;
        Some((Ok::<Bytes, std::convert::Infallible>(out), r))
    });
    Body::from_stream(stream)
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;
    use crate::wire::Endpoint;

    /// The relay's body, fed `chunks` that are all ready at once (a burst in the socket).
    /// The options of a chat stream's relay in these tests.
    pub(super) fn options(
        drop_usage_chunk: bool,
        transform: Option<Box<dyn EventTransform>>,
    ) -> RelayOptions {
        RelayOptions {
            drop_usage_chunk,
            transform,
            events: None,
            adapter: crate::wire::adapter(Endpoint::chat_completions),
            breaker: None,
            event_limit: 1 << 20,
        }
    }

    fn burst(chunks: &[&'static str]) -> Body {
        let metrics = crate::observe::metrics::Metrics::new();
        let ex = Record::start(
            &metrics.alias("a"),
            Endpoint::chat_completions,
            http::HeaderValue::from_static("id"),
        );
        let items: Vec<Result<Bytes, BoxError>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        let opts = options(false, None);
        relay(futures_util::stream::iter(items).boxed(), ex, None, opts)
    }

    /// Events whose blank line is split across pieces come out whole, each once.
    #[tokio::test]
    async fn an_event_end_split_across_pieces_is_found() {
        let body = burst(&["data: a\n", "\ndata: b\r\n", "\r", "\n", "data: c\n", "\n"]);
        let out = http_body_util::BodyExt::collect(body)
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(&out[..], b"data: a\n\ndata: b\r\n\r\ndata: c\n\n");
    }

    /// Regression: an event that does not end was searched from its start again
    /// with every piece (time quadratic in its length); the search now resumes where it ended.
    #[test]
    fn an_unfinished_event_is_not_searched_again() {
        let metrics = crate::observe::metrics::Metrics::new();
        let mut r = Relay {
            upstream: futures_util::stream::empty().boxed(),
            buf: BytesMut::new(),
            searched: 0,
            t: Tracker {
                ex: Record::start(
                    &metrics.alias("a"),
                    Endpoint::chat_completions,
                    http::HeaderValue::from_static("id"),
                ),
                opts: options(false, None),
                saw_done: false,
                last: LastShape::default(),
                seen: Seen::default(),
            },
            permit: None,
            pending: None,
            started: false,
            flushed: false,
            done: false,
        };
        let now = Instant::now();
        for _ in 0..100 {
            let out = r.take_events(Bytes::from_static(b"data: x\n"), now);
            assert!(out.is_empty());
            assert_eq!(r.searched, r.buf.len(), "the next search starts at the end");
        }
        assert!(!r.overlong());
        let out = r.take_events(Bytes::from_static(b"\n"), now);
        assert_eq!(out.len(), 801);
        assert!(r.buf.is_empty());
    }

    /// The first events of a burst get a write of their own: the relay hands them over alone
    /// and then yields once (the server flushes on a pending body) before gathering the rest.
    #[tokio::test]
    async fn first_events_are_flushed_before_the_burst_behind_them() {
        use http_body::Body as _;
        let mut body = burst(&[
            "data: 1\n\n",
            "data: 2\n\n",
            "data: 3\n\n",
            "data: [DONE]\n\n",
        ]);
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut poll = |body: &mut Body| match Pin::new(body).poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(f))) => Some(f.into_data().unwrap_or_default()),
            Poll::Ready(None) => None,
            Poll::Ready(Some(Err(e))) => panic!("{e}"),
            Poll::Pending => Some(Bytes::from_static(b"<pending>")),
        };
        assert_eq!(poll(&mut body).as_deref(), Some(&b"data: 1\n\n"[..]));
        assert_eq!(poll(&mut body).as_deref(), Some(&b"<pending>"[..]));
        assert_eq!(
            poll(&mut body).as_deref(),
            Some(&b"data: 2\n\ndata: 3\n\ndata: [DONE]\n\n"[..])
        );
        assert_eq!(poll(&mut body), None);
    }

    #[test]
    fn finds_event_ends() {
        assert_eq!(event_len(b"data: x\n\ndata: y"), Some(9));
        assert_eq!(event_len(b"data: x\r\n\r\n"), Some(11));
        assert_eq!(event_len(b"data: x\n"), None);
        assert_eq!(event_len(b"event: a\ndata: x\n\n"), Some(18));
    }

    #[test]
    fn finds_the_data_of_events_with_more_fields() {
        let ev = b"event: response.output_text.delta\ndata: {\"delta\":\"Hi\"}\n\n";
        assert_eq!(data_payload(ev), None);
        assert_eq!(tagged_data(ev), Some(&b"{\"delta\":\"Hi\"}"[..]));
        assert_eq!(tagged_data(b"data: a\ndata: b\n\n"), None);
        assert_eq!(tagged_data(b": keep-alive\n\n"), None);
    }

    #[test]
    fn detects_tokens_and_content() {
        let has_token = |d: &[u8]| Payload::new(d).has_token();
        let has_content = |d: &[u8]| Payload::new(d).has_content();
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
        assert!(has_content(
            br#"{"choices": [{"delta": {"content": "Hi"}}]}"#
        ));
        assert!(has_content(
            br#"{"choices":[{"delta":{"c\u006fntent":"Hi"}}]}"#
        ));
        assert!(has_token(
            br#"{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}"#
        ));
        assert!(has_token(
            br#"{"choices":[{"delta":{"tool_calls" : [{"index":0}]}}]}"#
        ));
    }

    /// A usage chunk written with spaces after the separators (Python's
    /// `json.dumps`) is recognised, counted and dropped like a compact one.
    #[tokio::test]
    async fn spaced_usage_chunk_is_dropped_for_a_client_that_did_not_ask() {
        let metrics = crate::observe::metrics::Metrics::new();
        let ex = Record::start(
            &metrics.alias("a"),
            Endpoint::chat_completions,
            http::HeaderValue::from_static("id"),
        );
        let chunks: Vec<Result<Bytes, BoxError>> = [
            "data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"Hi\"}}]}\n\n",
            "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 7, \"completion_tokens\": 3}}\n\n",
            "data: {\"\\u0063hoices\":[],\"\\u0075sage\":{\"prompt_tokens\":1}}\n\n",
            "data: [DONE]\n\n",
        ]
        .iter()
        .map(|c| Ok(Bytes::from_static(c.as_bytes())))
        .collect();
        let opts = options(true, None);
        let body = relay(futures_util::stream::iter(chunks).boxed(), ex, None, opts);
        let out = http_body_util::BodyExt::collect(body)
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"Hi\"}}]}\n\ndata: [DONE]\n\n"
        );
    }

    /// The relay's readings of an event against what its full parse says.
    mod agrees_with_the_parse {
        use super::*;
        use crate::json_scan::respell::{respell, Style};
        use proptest::prelude::*;
        use serde_json::json;

        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                Just(String::new()),
                "[a-z \"\\\\<>/:,{}\\[\\]\u{e9}\u{1F600}]{0,12}",
                Just("\"usage\": {\"prompt_tokens\": 9}".to_owned()),
                Just("\"error\": {}".to_owned()),
            ]
        }

        /// Events of every kind a chat stream carries, and the other APIs' data.
        fn event() -> impl Strategy<Value = Value> {
            let field = prop::sample::select(vec!["content", "reasoning_content", "reasoning"]);
            prop_oneof![
                (field, text()).prop_map(|(field, t)| json!({"id": "c", "object": "chat.completion.chunk",
                    "created": 1, "model": "m", "choices": [{"index": 0, "delta": {field: t}, "finish_reason": null}]})),
                Just(json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null}}]})),
                text().prop_map(|t| json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                    "function": {"arguments": t}}]}}]})),
                (0u64..1000, 0u64..1000, any::<bool>(), any::<bool>()).prop_map(|(p, c, only, timings)| {
                    let mut v = json!({"id": "c", "choices": if only { json!([]) } else {
                        json!([{"index": 0, "delta": {}, "finish_reason": "stop"}]) },
                        "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}});
                    if timings {
                        v["timings"] = json!({"prompt_per_second": 12.5, "predicted_per_second": 3.25});
                    }
                    v
                }),
                Just(json!({"choices": [{"index": 0, "delta": {}}], "usage": null})),
                text().prop_map(|m| json!({"error": {"message": m, "type": "BadRequestError", "code": 400}})),
                Just(json!({"error": null, "choices": []})),
                text().prop_map(|t| json!({"type": "response.output_text.delta", "delta": t})),
                text().prop_map(|t| json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": t}})),
                text().prop_map(|t| json!({"type": "response.created", "response": {"error": null, "text": t}})),
            ]
        }

        proptest! {
            #[test]
            fn readings_match(event in event(), seed: u64) {
                let data = respell(&event, Style::line(seed));
                let data = data.as_bytes();
                let p = Payload::new(data);
                let parsed: Value = serde_json::from_slice(data).unwrap();
                let text = |name| any_member(&parsed, name, |v| v.as_str().is_some_and(|s| !s.is_empty()));
                prop_assert_eq!(p.has_content(), text("content"));
                prop_assert_eq!(
                    p.has_token(),
                    text("content") || text("reasoning_content") || text("reasoning")
                        || any_member(&parsed, "tool_calls", Value::is_array)
                );
                prop_assert_eq!(p.has_tagged_text(), text("delta") || text("text"));
                prop_assert_eq!(p.is_error(), parsed.get("error").is_some_and(|e| !e.is_null()));
                // The relay reads usage only where the gate lets it: never misses any.
                let read = if p.may_have_usage() { crate::wire::usage::of_event(data) } else { None };
                prop_assert_eq!(read, crate::wire::usage::of_event(data));
            }
        }
    }

    /// Events read by the shape of the last one against the same events read in full.
    mod same_shape_agrees_with_a_full_read {
        use super::*;
        use crate::json_scan::respell::{respell, Style};
        use crate::reasoning::{StreamRewriter, ThinkTags};
        use proptest::prelude::*;
        use serde_json::json;

        /// What replaces the text of the envelope: plain text, escaped text, and text that
        /// leaves its string to add members.
        fn text() -> impl Strategy<Value = String> {
            prop_oneof![
                "[a-z <>/:,{}\\[\\]\u{e9}]{0,12}",
                any::<String>().prop_map(|t| {
                    let quoted = serde_json::to_string(&t).unwrap();
                    quoted[1..quoted.len() - 1].to_owned()
                }),
                Just(r#"\u0041\" \\"#.to_owned()),
                Just(r#"","usage":{"prompt_tokens":3},"k":""#.to_owned()),
                Just(r#"","error":{"message":"x"},"k":""#.to_owned()),
                Just(r#"","reasoning":"r"#.to_owned()),
                Just(r#"","reasoning_content":"r"#.to_owned()),
                Just(r#"","content":"c"#.to_owned()),
                Just(r#"", "tool_calls": [{"index": 0}], "k": ""#.to_owned()),
            ]
        }

        /// One envelope (spelled by `seed`) around the texts, with other events between.
        fn stream() -> impl Strategy<Value = Vec<Vec<u8>>> {
            let field = prop::sample::select(vec!["content", "reasoning_content", "reasoning"]);
            let item = prop_oneof![
                4 => text().prop_map(Some),
                1 => Just(None),
            ];
            (field, any::<u64>(), prop::collection::vec(item, 1..12)).prop_map(|(field, seed, items)| {
                let envelope = json!({"id": "c", "object": "chat.completion.chunk", "created": 1,
                    "model": "m", "choices": [{"index": 0, "delta": {field: "MARK"}, "finish_reason": null}]});
                let envelope = respell(&envelope, Style { escapes: seed & 4 == 0, ..Style::line(seed) });
                let other = respell(&json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 2}}), Style::line(seed));
                items
                    .into_iter()
                    .map(|t| match t {
                        Some(t) => envelope.replacen("MARK", &t, 1).into_bytes(),
                        None => other.clone().into_bytes(),
                    })
                    .filter(|e| serde_json::from_slice::<Value>(e).is_ok())
                    .collect()
            })
        }

        fn tracker(tags: bool) -> Tracker {
            let metrics = crate::observe::metrics::Metrics::new();
            let tags = tags.then(|| Arc::new(ThinkTags::preset("qwen3").unwrap()));
            Tracker {
                ex: Record::start(
                    &metrics.alias("a"),
                    Endpoint::chat_completions,
                    http::HeaderValue::from_static("id"),
                ),
                opts: options(
                    true,
                    Some(Box::new(StreamRewriter::new(Default::default(), tags))),
                ),
                saw_done: false,
                last: LastShape::default(),
                seen: Seen::default(),
            }
        }

        fn bytes(a: Action) -> Option<Vec<u8>> {
            match a {
                Action::Keep => Some(Vec::new()),
                Action::Drop => None,
                Action::Replace(b) => Some(b),
            }
        }

        proptest! {
            #[test]
            fn readings_match(events in stream(), tags: bool) {
                let (mut shaped, mut full) = (tracker(tags), tracker(tags));
                let start = Instant::now();
                for (i, data) in events.iter().enumerate() {
                    let now = start + std::time::Duration::from_millis(i as u64);
                    let ev = crate::wire::data_event(data);
                    full.last = LastShape::default();
                    prop_assert_eq!(bytes(shaped.on_event(&ev, now)), bytes(full.on_event(&ev, now)));
                    prop_assert_eq!(&shaped.ex.error, &full.ex.error);
                    prop_assert_eq!(&shaped.ex.usage, &full.ex.usage);
                    prop_assert_eq!(shaped.ex.first_token, full.ex.first_token);
                    prop_assert_eq!(shaped.ex.first_content, full.ex.first_content);
                    prop_assert_eq!(shaped.ex.last_token, full.ex.last_token);
                }
            }
        }
    }
}
