//! An answer's body: read from its connection as it is polled (the connection back to the
//! pool at its end), and the readers that hold a body whole up to a limit.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use http::{HeaderMap, StatusCode};

use super::conn::Conn;
use super::framing::{self, Decoder};
use super::watch::ConnWatch;
use super::BodyStream;
use super::{BoxError, Malformed};

/// The most room a read of a body gets: the first read's ([`super::conn::FIRST_READ`]) doubles while
/// reads fill it, up to this.
const MAX_READ: usize = 128 * 1024;

/// Most of a small answer read whole (a probe's, a count's): a backend's answer to
/// `/props`, `/v1/models` or `/tokenize` is a few KiB.
pub const SMALL_ANSWER_LIMIT: usize = 4 << 20;

/// A body longer than the bytes a reader holds.
#[derive(Debug, thiserror::Error)]
#[error("the answer is longer than {0} bytes")]
pub(crate) struct TooLong(pub(crate) usize);

/// An answer's body read up to a limit.
pub enum Held {
    /// The whole body, within the limit (a body that came in one piece is not copied).
    Whole(Bytes),
    /// A body longer than the limit: the pieces read (at most the limit and one piece), and
    /// the rest as it comes.
    Over(BodyStream),
}

/// Read `body` whole if it ends within `limit` bytes.
pub async fn read_within(mut body: BodyStream, limit: usize) -> Result<Held, BoxError> {
    let Some(first) = body.next().await.transpose()? else {
        return Ok(Held::Whole(Bytes::new()));
    };
    if first.len() > limit {
        return Ok(Held::Over(
            futures_util::stream::iter([Ok(first)]).chain(body).boxed(),
        ));
    }
    // The pieces are kept as they came and joined once at the end, into a buffer of their
    // size: a buffer grown as they come would hold up to three times the limit while it
    // moves (the old block and the doubled one), and a body past the limit is never joined.
    let mut pieces = vec![first];
    let mut len = pieces[0].len();
    while len <= limit {
        match body.next().await {
            Some(chunk) => {
                let chunk = chunk?;
                len += chunk.len();
                pieces.push(chunk);
            }
            None if pieces.len() == 1 => return Ok(Held::Whole(pieces.swap_remove(0))),
            None => {
                let mut out = BytesMut::with_capacity(len);
                for p in pieces {
                    out.extend_from_slice(&p);
                }
                return Ok(Held::Whole(out.freeze()));
            }
        }
    }
    let held = futures_util::stream::iter(pieces.into_iter().map(Ok));
    Ok(Held::Over(held.chain(body).boxed()))
}

/// The whole body of an answer; [`TooLong`] past `limit` bytes.
pub async fn read_all<S>(body: S, limit: usize) -> Result<Bytes, BoxError>
where
    S: Stream<Item = Result<Bytes, BoxError>> + Send + 'static,
{
    match read_within(body.boxed(), limit).await? {
        Held::Whole(bytes) => Ok(bytes),
        Held::Over(_) => Err(Box::new(TooLong(limit))),
    }
}

/// A backend's response: head, and a body that reads its connection.
pub struct UpstreamResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: UpstreamBody,
}

/// Where a body read to its end gives its connection back (the pool), under `key`;
/// `after_stream`: the body was a streamed answer.
pub(super) trait Checkin: Send + Sync {
    fn checkin(&self, key: &str, conn: Conn, after_stream: bool);
}

/// The body of a backend response. Dropped before its end, it closes the connection (the
/// backend sees the client go away); read to the end, it returns the connection to the pool.
pub struct UpstreamBody {
    pub(super) conn: Option<Conn>,
    /// Bytes read and not yet decoded.
    pub(super) buf: BytesMut,
    /// How much room the next read gets.
    pub(super) read: usize,
    pub(super) decoder: Decoder,
    pub(super) keep_alive: bool,
    /// Chunked: a streamed answer (what some backends close their connection after).
    pub(super) streamed: bool,
    pub(super) pool: Arc<dyn Checkin>,
    /// The pool key the connection goes back under.
    pub(super) key: String,
    /// The backend's connection facts: a connection it would close is not kept.
    pub(super) watch: Option<Arc<ConnWatch>>,
}

impl UpstreamBody {
    /// The body is read whole: its connection back to the pool, unless the backend closes
    /// such connections (then it is closed here, and counted).
    fn done(&mut self, conn: Conn) {
        match &self.watch {
            Some(watch) if self.streamed && watch.closes_after_stream() => watch.not_pooled(),
            _ => self.pool.checkin(&self.key, conn, self.streamed),
        }
    }
}

impl UpstreamBody {
    /// End the body with `e`: the connection is closed and the stream ends after the error.
    fn fail(&mut self, e: BoxError) -> Poll<Option<Result<Bytes, BoxError>>> {
        self.conn = None;
        self.decoder = Decoder::new(framing::Framing::Empty);
        Poll::Ready(Some(Err(e)))
    }
}

impl Stream for UpstreamBody {
    type Item = Result<Bytes, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            match this.decoder.decode(&mut this.buf) {
                Ok(Some(data)) => return Poll::Ready(Some(Ok(data))),
                Ok(None) => {}
                Err(e) => return this.fail(Malformed(e).into()),
            }
            if this.decoder.is_done() {
                if let Some(conn) = this.conn.take() {
                    // Bytes after the body would be the start of nothing we asked for.
                    if this.keep_alive && this.buf.is_empty() {
                        this.done(conn);
                    }
                }
                return Poll::Ready(None);
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if this.buf.capacity() - this.buf.len() < this.read / 2 {
                this.buf.reserve(this.read);
            }
            let room = this.buf.capacity() - this.buf.len();
            match tokio_util::io::poll_read_buf(Pin::new(conn), cx, &mut this.buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    if let Err(e) = this.decoder.eof() {
                        return this.fail(e.into());
                    }
                    this.conn = None;
                }
                Poll::Ready(Ok(n)) => {
                    if n == room {
                        this.read = (this.read * 2).min(MAX_READ);
                    }
                }
                Poll::Ready(Err(e)) => return this.fail(e.into()),
            }
        }
    }
}
