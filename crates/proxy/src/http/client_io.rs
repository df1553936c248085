//! Client-side timeouts of one connection: the time a client has to send a request's head
//! (from its first byte) and the time a connection may sit idle with no request (after accept,
//! or after an answer's end). Either ends the connection. Serving a request (from its head to
//! its answer's last byte) is bounded by the backend-side limits, not by these.
//!
//! One timer serves both, armed lazily: it is moved only when the limit in force comes due
//! earlier than it is set for; set earlier, it may fire before the limit is due, and is then
//! set again for the limit's own time. It is polled only when it was moved, has fired, or the
//! connection is polled with another waker than the one it holds, so a read costs no timer
//! work in the common case (each request makes the limit later, never earlier).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

/// The requests of one connection: how many are being served now (their answers not over),
/// how many have started, when the last one ended.
#[derive(Debug)]
pub(crate) struct Serving {
    active: AtomicU32,
    started: AtomicU32,
    /// Nanoseconds from `base` to the end of the last request served.
    ended: AtomicU64,
    base: Instant,
}

impl Default for Serving {
    fn default() -> Self {
        Serving {
            active: AtomicU32::new(0),
            started: AtomicU32::new(0),
            ended: AtomicU64::new(0),
            base: Instant::now(),
        }
    }
}

impl Serving {
    /// A request's head was read: it is served until the returned guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> Served {
        self.started.fetch_add(1, Ordering::AcqRel);
        self.active.fetch_add(1, Ordering::AcqRel);
        Served(Arc::clone(self))
    }

    fn busy(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }

    fn started(&self) -> u32 {
        self.started.load(Ordering::Acquire)
    }

    fn ended(&self) -> Instant {
        self.base + Duration::from_nanos(self.ended.load(Ordering::Acquire))
    }
}

/// Held by an answer's body: dropped at its end (or when the connection goes).
#[derive(Debug)]
pub(crate) struct Served(Arc<Serving>);

impl Drop for Served {
    fn drop(&mut self) {
        let s = &self.0;
        let since = u64::try_from(s.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        s.ended.store(since, Ordering::Release);
        s.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An answer's body that marks the request served when it is over.
pub(crate) struct Tracked {
    inner: Body,
    _served: Served,
}

/// `body`, ending the request's service when it ends.
pub(crate) fn tracked(body: Body, served: Served) -> Body {
    Body::new(Tracked {
        inner: body,
        _served: served,
    })
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A client connection under the two limits.
pub(crate) struct ClientIo {
    tcp: TcpStream,
    serving: Arc<Serving>,
    /// Requests started as of the last idle moment seen.
    seen: u32,
    header: Duration,
    idle: Duration,
    /// Since when no request is served.
    idle_since: Instant,
    /// When the first byte of the next request's head came.
    head_since: Option<Instant>,
    /// Set for the limit in force or earlier (see the module header).
    timer: Pin<Box<Sleep>>,
    /// The waker the timer was last polled with, while it has not fired or been moved since.
    polled: Option<Waker>,
}

impl ClientIo {
    pub(crate) fn new(
        tcp: TcpStream,
        serving: Arc<Serving>,
        header: Duration,
        idle: Duration,
    ) -> Self {
        let now = Instant::now();
        ClientIo {
            tcp,
            serving,
            seen: 0,
            header,
            idle,
            idle_since: now,
            head_since: None,
            timer: Box::pin(tokio::time::sleep_until(now + idle)),
            polled: None,
        }
    }

    /// Whether the limit that applies now has passed (arming the timer for it otherwise).
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<&'static str> {
        let (due, what) = match self.head_since {
            Some(t) => (t + self.header, "request head not received in time"),
            None => (self.idle_since + self.idle, "connection idle too long"),
        };
        if due < self.timer.deadline() {
            self.set_timer(due);
        }
        while self.timer_fired(cx) {
            if self.timer.deadline() >= due {
                return Some(what);
            }
            // Set for an earlier limit: the one in force is not due yet.
            self.set_timer(due);
        }
        None
    }

    fn set_timer(&mut self, deadline: Instant) {
        self.timer.as_mut().reset(deadline);
        self.polled = None;
    }

    /// Whether the timer has fired; else its wake-up is registered with `cx`'s waker.
    #[inline]
    fn timer_fired(&mut self, cx: &mut Context<'_>) -> bool {
        let registered = self
            .polled
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        if registered && !self.timer.is_elapsed() {
            return false;
        }
        // A poll the task's budget refuses registers no wake-up: then none is recorded.
        let reaches = tokio::task::coop::has_budget_remaining();
        let fired = self.timer.as_mut().poll(cx).is_ready();
        self.polled = (reaches && !fired).then(|| cx.waker().clone());
        fired
    }
}

impl AsyncRead for ClientIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let busy = this.serving.busy();
        let started = this.serving.started();
        if !busy && started != this.seen {
            // Requests were served since the last look: idle since the last one ended.
            this.seen = started;
            this.idle_since = this.serving.ended();
            this.head_since = None;
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.tcp).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if !busy && this.head_since.is_none() && buf.filled().len() > before {
                    this.head_since = Some(Instant::now());
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending if busy => {
                // Keep a wake-up within the idle limit, so the connection is looked at again
                // after the answer ends even if the client sends nothing.
                if this.timer_fired(cx) {
                    this.set_timer(Instant::now() + this.idle);
                    let _ = this.timer_fired(cx);
                }
                Poll::Pending
            }
            Poll::Pending => match this.expired(cx) {
                Some(what) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what))),
                None => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.tcp).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.tcp.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}
