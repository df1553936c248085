//! SSE relay: forwards backend events as they arrive, transforming only the events that need it.
//!
//! Complete events are found by their blank-line terminator; what each event becomes, and what
//! it tells about usage and first tokens, is the API's [`EventTransform`]: the relay knows no
//! API. A chunk whose events all pass
//! unchanged is forwarded as the same bytes (no copy); only rewritten or dropped events cause a
//! new buffer. Dropping the relay (client gone) drops the upstream response, which closes the
//! backend connection so the backend frees its slot.

use std::time::Instant;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use futures_util::stream::{BoxStream, StreamExt};
use futures_util::FutureExt;

use crate::error::ProxyError;
use crate::fleet::slots::SlotPermit;
use crate::observe::record::Record;
use crate::upstream::exchange::UpstreamReason;
use crate::upstream::BoxError;
use crate::wire::stream::{data_payload, event_len};
use crate::wire::{Action, EventTransform, Seen};

/// Everything the relay tracks apart from the byte buffer.
struct Tracker {
    ex: Record,
    /// What the events showed; moved into the record when the relay goes.
    seen: Seen,
    /// The API's handling of each event.
    t: Box<dyn EventTransform>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.ex.absorb(std::mem::take(&mut self.seen));
    }
}

struct Relay {
    upstream: BoxStream<'static, Result<Bytes, BoxError>>,
    buf: BytesMut,
    t: Tracker,
    _permit: Option<SlotPermit>,
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
            match self.t.event(&data[pos..pos + len], now, &mut self.seen) {
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
            return match out {
                Some(o) => o.freeze(),
                None => chunk.slice(..len),
            };
        }
        self.buf.extend_from_slice(&chunk);
        let (len, out) = self.t.scan(&self.buf, now);
        let events = self.buf.split_to(len);
        out.unwrap_or(events).freeze()
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

    fn broken(&mut self, e: &BoxError) -> Bytes {
        self.done = true;
        self.t
            .ex
            .metrics()
            .upstream_error(UpstreamReason::stream_broken);
        let backend = self.t.ex.backend.clone().unwrap_or_default();
        let err = ProxyError::UpstreamProtocol {
            backend,
            detail: format!("stream broken: {}", crate::upstream::chain(e.as_ref())),
        };
        self.t.ex.error = Some(err.to_string());
        self.t.ex.completed = true;
        Bytes::from(self.t.t.broken(&err, &mut self.t.seen))
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
        if let Some(tail) = self.t.t.end(&mut self.t.seen) {
            out.extend_from_slice(&tail);
        }
        (!out.is_empty()).then(|| out.freeze())
    }
}

/// Whether `buf` holds a complete event.
pub fn has_complete_event(buf: &[u8]) -> bool {
    event_len(buf).is_some()
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
    transform: Box<dyn EventTransform>,
) -> Body {
    let relay = Relay {
        upstream,
        buf: BytesMut::new(),
        t: Tracker {
            ex,
            seen: Seen::default(),
            t: transform,
        },
        _permit: permit,
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
    fn burst(chunks: &[&'static str]) -> Body {
        let metrics = crate::observe::metrics::Metrics::new();
        let ex = Record::start(&metrics.alias("a"), Endpoint::chat_completions, "id".into());
        let items: Vec<Result<Bytes, BoxError>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        let transform = Box::new(crate::wire::chat::stream::ChatStream::new(None, false));
        relay(
            futures_util::stream::iter(items).boxed(),
            ex,
            None,
            transform,
        )
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
}
