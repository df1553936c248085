//! SSE relay: forwards backend events as they arrive, transforming only the events that need it.
//!
//! Complete events are found by their blank-line terminator. Chat and completions events are
//! read here; an API with events of its own (Messages, Responses, a translation from chat)
//! hands each event to its [`ApiEvents`]. A chunk whose events all pass
//! unchanged is forwarded as the same bytes (no copy); only rewritten or dropped events cause a
//! new buffer. Dropping the relay (client gone) drops the upstream response, which closes the
//! backend connection so the backend frees its slot.
//!
//! The events' framing is [`crate::wire::stream`]'s; what one chat event's data says is read
//! in `readings.rs`; what the events showed and what becomes of each, in `tracker.rs`; here,
//! the buffer, the coalescing of writes and the end of a stream (its last event, or the error
//! that cuts it).

mod readings;
mod tracker;

use std::time::Instant;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::stream::StreamExt;
use futures_util::FutureExt;

use crate::error::ProxyError;
use crate::fleet::breaker::{Outcome, Tally};
use crate::fleet::slots::SlotPermit;
use crate::observe::record::Record;
use crate::upstream::failure::UpstreamReason;
use crate::upstream::BoxError;
use crate::wire::stream::event_end_after;
use crate::wire::{Adapter, ApiEvents, EventTransform, Seen};

use super::same_shape::LastShape;
use super::send::body_failed;
use crate::upstream::BodyStream;
use tracker::Tracker;

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
    /// The word to the breaker of the backend streaming: a broken or stalled stream is its
    /// failure.
    pub tally: Tally,
    /// Most bytes of one event held until its end (`server.event_limit_bytes`).
    pub event_limit: usize,
}

struct Relay {
    upstream: BodyStream,
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
            backend: self.t.rec.backend.clone().unwrap_or_default(),
            limit: self.t.opts.event_limit,
        };
        self.buf = BytesMut::new();
        let end = self.cut(Some(UpstreamReason::too_large), err);
        [out, end].concat().into()
    }

    /// The end of a stream whose body failed, classified as a whole answer's is
    /// ([`body_failed`], which counts it).
    fn broken(&mut self, e: &BoxError) -> Bytes {
        let err = body_failed(&self.t.rec, e).to_client();
        self.cut(None, err)
    }

    /// End the stream with `err` as the API's error event, after the text the transform holds.
    /// `reason`: the metric's, when not counted already.
    fn cut(&mut self, reason: Option<UpstreamReason>, err: ProxyError) -> Bytes {
        self.done = true;
        // Text held back by the splitter goes out before the error, not lost with it.
        let mut out = match self.t.opts.transform.as_mut().and_then(|t| t.flush()) {
            Some(held) => crate::wire::data_event(&held),
            None => Vec::new(),
        };
        if let Some(reason) = reason {
            self.t.rec.metrics().upstream_error(reason);
        }
        self.t.opts.tally.tell(Outcome::Failed);
        self.t.rec.error = Some(err.to_string());
        self.t.rec.completed = true;
        match self.t.opts.events.as_mut() {
            Some(events) => out.extend_from_slice(&events.broken(&err, &mut self.t.seen)),
            None => out.extend_from_slice(&self.t.opts.adapter.stream_error(&err)),
        }
        self.t.rec.absorb(std::mem::take(&mut self.t.seen));
        // Free the slot, the backend connection and the in-flight count now, not when the
        // client has read the error event.
        self.permit = None;
        self.upstream = futures_util::stream::empty().boxed();
        drop(self.t.rec.take());
        Bytes::from(out)
    }

    fn end(&mut self) -> Option<Bytes> {
        self.done = true;
        self.t.rec.completed = true;
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

/// The client's response body for an upstream SSE response.
pub fn relay(
    upstream: BodyStream,
    rec: Record,
    permit: Option<SlotPermit>,
    opts: RelayOptions,
) -> Body {
    let relay = Relay {
        upstream,
        buf: BytesMut::new(),
        searched: 0,
        t: Tracker {
            rec,
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
            tally: Tally::default(),
            event_limit: 1 << 20,
        }
    }

    fn burst(chunks: &[&'static str]) -> Body {
        let metrics = crate::observe::metrics::Metrics::new();
        let rec = Record::start(
            &metrics.alias("a"),
            Endpoint::chat_completions,
            http::HeaderValue::from_static("id"),
        );
        let items: Vec<Result<Bytes, BoxError>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        let opts = options(false, None);
        relay(futures_util::stream::iter(items).boxed(), rec, None, opts)
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
                rec: Record::start(
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

    /// A usage chunk written with spaces after the separators (Python's
    /// `json.dumps`) is recognised, counted and dropped like a compact one.
    #[tokio::test]
    async fn spaced_usage_chunk_is_dropped_for_a_client_that_did_not_ask() {
        let metrics = crate::observe::metrics::Metrics::new();
        let rec = Record::start(
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
        let body = relay(futures_util::stream::iter(chunks).boxed(), rec, None, opts);
        let out = http_body_util::BodyExt::collect(body)
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            "data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"Hi\"}}]}\n\ndata: [DONE]\n\n"
        );
    }
}
