//! The upstream HTTP/1.1 client for plain-http backends: a pool of keep-alive connections,
//! each used by one request at a time inside that request's own task. The response head is
//! parsed by `httparse`; the body is decoded straight from the socket buffer, so every event the
//! backend has already sent comes out of one read as one piece (no per-chunk hand-off). One
//! pool per worker thread.

pub mod exchange;
mod framing;
pub mod hop;

use std::fmt::Write as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
// foldhash: read on every request, keyed by names from the config (no untrusted keys).
use foldhash::HashMap;
use futures_util::Stream;
use http::{HeaderMap, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use framing::{parse_head, Decoder};

/// Any error of the exchange with a backend, as the relay sees it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong before a response head arrived.
#[derive(Debug)]
pub enum SendError {
    /// No TCP connection could be made (refused, unreachable, connect timeout).
    Connect(String),
    /// Not delivered: a new connection was reset before any byte of the request was written,
    /// so the backend cannot have seen it and it may go to another one.
    Unsent(String),
    /// The connection failed while sending or reading the head.
    Protocol(String),
}

/// Keep-alive connections by authority (`host:port`), each with the time it went idle (the
/// newest last).
#[derive(Default)]
pub struct Pool {
    idle: Mutex<HashMap<String, Vec<(TcpStream, Instant)>>>,
    connect_timeout: Duration,
    /// Connections idle at least this long are checked by asking the kernel (see
    /// [`open_by_the_kernel`]); `PROBE_AFTER` but in tests.
    probe_after: Duration,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pool")
    }
}

/// Most idle connections kept per backend.
const MAX_IDLE: usize = 256;
/// How long a connection may sit idle in the pool. Below the keep-alive timeout of the
/// backends' HTTP servers (5 s in uvicorn as vLLM and SGLang run it, and in llama.cpp's), so
/// a request seldom meets a connection the backend is closing at that very moment: once the
/// request is written it is never sent again (RFC 9112 §9.3.1), so that race is an error.
const IDLE_TIMEOUT: Duration = Duration::from_secs(3);
/// A connection idle this long or longer is checked with a system call at checkout; one
/// reused sooner, by the readiness tokio last saw (no system call under load).
const PROBE_AFTER: Duration = Duration::from_millis(100);
/// First read buffer of a response; it doubles while reads fill it, up to `MAX_READ`.
const FIRST_READ: usize = 8 * 1024;
const MAX_READ: usize = 128 * 1024;

/// The chain of an error's messages.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(err) = source {
        s.push_str(": ");
        s.push_str(&err.to_string());
        source = err.source();
    }
    s
}

/// An idle connection is still usable: the backend has neither closed it nor sent anything.
/// Every read of a connection goes through `AsyncRead::poll_read`, which forgets the socket's
/// read readiness when a read comes back short (the socket is drained), so here `try_read`
/// makes a system call only if the backend has written or closed since and the runtime has
/// polled the OS for events after that. A close the runtime has not seen yet would go
/// unnoticed (the write succeeds, the answer never comes), so this check is used only for
/// connections back in the pool for less than `PROBE_AFTER`; older ones, which is where a
/// backend's keep-alive timeout strikes, are asked with [`open_by_the_kernel`]. A byte it
/// does read means the connection is dropped anyway.
fn still_open(tcp: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(tcp.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// The kernel's word that `tcp` is still open and has nothing to read: a peek that would
/// block (it sees a FIN the runtime has not yet been told of).
fn open_by_the_kernel(tcp: &TcpStream) -> bool {
    let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    matches!(
        socket2::SockRef::from(tcp).peek(&mut probe),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock
    )
}

/// Drop the connections of `list` idle since before `now - IDLE_TIMEOUT` (oldest first).
fn prune<C>(list: &mut Vec<(C, Instant)>, now: Instant) {
    let fresh = list
        .iter()
        .position(|(_, since)| now.saturating_duration_since(*since) < IDLE_TIMEOUT)
        .unwrap_or(list.len());
    list.drain(..fresh);
}

/// The request head: `POST path HTTP/1.1`, the headers but the hop-by-hop ones (`Host` and
/// the length written anew), the length.
fn request_head(authority: &str, path: &str, headers: &HeaderMap, body_len: usize) -> Bytes {
    let mut head = BytesMut::with_capacity(128 + path.len() + headers.len() * 48);
    head.put_slice(b"POST ");
    head.put_slice(path.as_bytes());
    head.put_slice(b" HTTP/1.1\r\nhost: ");
    head.put_slice(authority.as_bytes());
    head.put_slice(b"\r\n");
    for (name, value) in headers {
        if hop::request(name) {
            continue;
        }
        head.put_slice(name.as_str().as_bytes());
        head.put_slice(b": ");
        head.put_slice(value.as_bytes());
        head.put_slice(b"\r\n");
    }
    head.put_slice(b"content-length: ");
    let _ = write!(head, "{body_len}");
    head.put_slice(b"\r\n\r\n");
    head.freeze()
}

/// Read from `tcp` into `buf` (growing it by `want` when full); `Ok(0)` at the end.
async fn read_more(tcp: &mut TcpStream, buf: &mut BytesMut, want: usize) -> std::io::Result<usize> {
    if buf.capacity() == buf.len() {
        buf.reserve(want);
    }
    tcp.read_buf(buf).await
}

impl Pool {
    pub fn new(connect_timeout: Duration) -> Pool {
        Pool {
            idle: Mutex::default(),
            connect_timeout,
            probe_after: PROBE_AFTER,
        }
    }

    /// An idle connection that is still open, if there is one.
    fn checkout(&self, authority: &str) -> Option<TcpStream> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(authority)?;
        let now = Instant::now();
        prune(list, now);
        while let Some((tcp, since)) = list.pop() {
            let open = if now.saturating_duration_since(since) < self.probe_after {
                still_open(&tcp)
            } else {
                open_by_the_kernel(&tcp)
            };
            if open {
                return Some(tcp);
            }
        }
        None
    }

    fn checkin(&self, authority: &str, tcp: TcpStream) {
        let now = Instant::now();
        if let Ok(mut idle) = self.idle.lock() {
            match idle.get_mut(authority) {
                Some(list) => {
                    prune(list, now);
                    if list.len() < MAX_IDLE {
                        list.push((tcp, now));
                    }
                }
                None => {
                    idle.insert(authority.to_string(), vec![(tcp, now)]);
                }
            }
        }
    }

    /// Idle connections kept for `authority` (for tests).
    #[cfg(test)]
    fn idle_count(&self, authority: &str) -> usize {
        self.idle
            .lock()
            .map_or(0, |idle| idle.get(authority).map_or(0, Vec::len))
    }

    async fn connect(&self, authority: &str, within: Duration) -> Result<TcpStream, SendError> {
        let tcp = tokio::time::timeout(within, TcpStream::connect(authority))
            .await
            .map_err(|_| SendError::Connect("connect timed out".into()))?
            .map_err(|e| SendError::Connect(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        Ok(tcp)
    }

    /// POST `body` to `http://{authority}{path}`; resolves with the response head. The body
    /// reads from the connection as it is polled and returns it to the pool at its end.
    pub async fn post(
        self: &Arc<Self>,
        authority: &str,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, SendError> {
        self.post_within(self.connect_timeout, authority, path, headers, body)
            .await
    }

    /// [`Pool::post`] with a connect timeout of the backend's own.
    pub async fn post_within(
        self: &Arc<Self>,
        connect_timeout: Duration,
        authority: &str,
        path: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, SendError> {
        let head = request_head(authority, path, &headers, body.len());
        // A pooled connection the backend closed after the check-out check fails the write;
        // then (and only then: the backend cannot have seen the request) it goes again on a
        // new connection. Once written, a request is never sent twice.
        let mut tcp = match self.checkout(authority) {
            Some(mut tcp) => match write_request(&mut tcp, &head, &body).await {
                Ok(()) => tcp,
                Err(e) => {
                    tracing::debug!(error = %e, "pooled connection failed; using a new one");
                    self.send_on_new(authority, &head, &body, connect_timeout)
                        .await?
                }
            },
            None => {
                self.send_on_new(authority, &head, &body, connect_timeout)
                    .await?
            }
        };
        let mut buf = BytesMut::with_capacity(FIRST_READ);
        let parsed = loop {
            match parse_head(&mut buf) {
                Ok(Some(parsed)) => break parsed,
                Ok(None) => {}
                Err(e) => return Err(SendError::Protocol(e)),
            }
            match read_more(&mut tcp, &mut buf, FIRST_READ).await {
                Ok(0) => {
                    return Err(SendError::Protocol(
                        "connection closed before the response head".into(),
                    ))
                }
                Ok(_) => {}
                Err(e) => return Err(SendError::Protocol(format!("reading the response: {e}"))),
            }
        };
        Ok(UpstreamResponse {
            status: parsed.status,
            headers: parsed.headers,
            body: UpstreamBody {
                conn: Some(tcp),
                buf,
                read: FIRST_READ,
                decoder: Decoder::new(parsed.framing),
                keep_alive: parsed.keep_alive,
                pool: Arc::clone(self),
                authority: authority.to_string(),
            },
        })
    }

    /// A new connection with the request written on it.
    async fn send_on_new(
        &self,
        authority: &str,
        head: &Bytes,
        body: &Bytes,
        connect_timeout: Duration,
    ) -> Result<TcpStream, SendError> {
        let mut tcp = self.connect(authority, connect_timeout).await?;
        let mut unsent = head.clone().chain(body.clone());
        let whole = unsent.remaining();
        match tcp.write_all_buf(&mut unsent).await {
            Ok(()) => Ok(tcp),
            Err(e) if unsent.remaining() == whole => Err(SendError::Unsent(e.to_string())),
            Err(e) => Err(SendError::Protocol(format!("sending the request: {e}"))),
        }
    }
}

/// Write the request (head, then body) on `tcp`, in one `writev` where the socket takes it.
async fn write_request(tcp: &mut TcpStream, head: &Bytes, body: &Bytes) -> std::io::Result<()> {
    tcp.write_all_buf(&mut head.clone().chain(body.clone()))
        .await
}

/// A backend's response: head, and a body that reads its connection.
pub struct UpstreamResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: UpstreamBody,
}

/// The body of a backend response. Dropped before its end, it closes the connection (the
/// backend sees the client go away); read to the end, it returns the connection to the pool.
pub struct UpstreamBody {
    conn: Option<TcpStream>,
    /// Bytes read and not yet decoded.
    buf: BytesMut,
    /// How much room the next read gets.
    read: usize,
    decoder: Decoder,
    keep_alive: bool,
    pool: Arc<Pool>,
    authority: String,
}

impl UpstreamBody {
    /// End the body with `e`: the connection is closed and the stream ends after the error.
    fn fail(&mut self, e: String) -> Poll<Option<Result<Bytes, BoxError>>> {
        self.conn = None;
        self.decoder = Decoder::new(framing::Framing::Empty);
        Poll::Ready(Some(Err(e.into())))
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
                Err(e) => return this.fail(e),
            }
            if this.decoder.is_done() {
                if let Some(tcp) = this.conn.take() {
                    // Bytes after the body would be the start of nothing we asked for.
                    if this.keep_alive && this.buf.is_empty() {
                        this.pool.checkin(&this.authority, tcp);
                    }
                }
                return Poll::Ready(None);
            }
            let Some(tcp) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            if this.buf.capacity() - this.buf.len() < this.read / 2 {
                this.buf.reserve(this.read);
            }
            let room = this.buf.capacity() - this.buf.len();
            match tokio_util::io::poll_read_buf(Pin::new(tcp), cx, &mut this.buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    if let Err(e) = this.decoder.eof() {
                        return this.fail(e);
                    }
                    this.conn = None;
                }
                Poll::Ready(Ok(n)) => {
                    if n == room {
                        this.read = (this.read * 2).min(MAX_READ);
                    }
                }
                Poll::Ready(Err(e)) => return this.fail(e.to_string()),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use http::{header, HeaderValue};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpListener;

    use super::*;

    /// How the test backend frames its "ok".
    #[derive(Clone, Copy)]
    enum Answer {
        /// `content-length: 2`.
        Length,
        /// `content-length: 2` and `connection: close`.
        Close,
        /// `transfer-encoding: chunked`, in two chunks, as an SSE stream is sent.
        Chunked,
    }

    /// A backend answering "ok" that counts its TCP connections.
    async fn backend(answer: Answer) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let svc = service_fn(move |_req| async move {
                        let chunks = match answer {
                            Answer::Chunked => {
                                vec![Bytes::from_static(b"o"), Bytes::from_static(b"k")]
                            }
                            _ => vec![Bytes::from_static(b"ok")],
                        };
                        let frames: Vec<Result<_, Infallible>> = chunks
                            .into_iter()
                            .map(|b| Ok(hyper::body::Frame::data(b)))
                            .collect();
                        let body =
                            http_body_util::StreamBody::new(futures_util::stream::iter(frames));
                        let mut resp = hyper::Response::new(body);
                        if !matches!(answer, Answer::Chunked) {
                            resp.headers_mut()
                                .insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
                        }
                        if matches!(answer, Answer::Close) {
                            resp.headers_mut()
                                .insert(header::CONNECTION, HeaderValue::from_static("close"));
                        }
                        Ok::<_, Infallible>(resp)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        (addr, accepted)
    }

    async fn post(pool: &Arc<Pool>, addr: &str) -> Bytes {
        let r = pool
            .post(
                addr,
                "/v1/chat/completions",
                HeaderMap::new(),
                Bytes::from_static(b"{}"),
            )
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::OK);
        crate::upstream::exchange::read_all(r.body).await.unwrap()
    }

    /// How many connections three requests in a row took, each body read to its end.
    async fn connections_for(answer: Answer) -> usize {
        let (addr, accepted) = backend(answer).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        for _ in 0..3 {
            assert_eq!(post(&pool, &addr).await, Bytes::from_static(b"ok"));
        }
        accepted.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn reuses_a_connection_read_to_the_end() {
        assert_eq!(connections_for(Answer::Length).await, 1);
    }

    /// Regression: a chunked body (every SSE stream) read to its end used to close its
    /// connection, so each stream paid for a new TCP connection to the backend.
    #[tokio::test]
    async fn reuses_a_connection_after_a_chunked_body() {
        assert_eq!(connections_for(Answer::Chunked).await, 1);
    }

    #[tokio::test]
    async fn a_closed_connection_is_replaced() {
        assert_eq!(connections_for(Answer::Close).await, 3);
    }

    /// A backend that answers each connection's first request with `answer`, byte for byte,
    /// then closes it; counts connections.
    async fn raw_backend(answer: &'static [u8]) -> (String, Arc<AtomicUsize>) {
        let (addr, accepted, _) = scripted_backend(vec![answer]).await;
        (addr, accepted)
    }

    /// The test backends' requests are complete: a head and the 2-byte body `{}`.
    fn whole_request(req: &[u8]) -> bool {
        req.windows(4).any(|w| w == b"\r\n\r\n") && req.ends_with(b"{}")
    }

    /// A backend that reads requests on each connection and answers the n-th with
    /// `answers[n]` byte for byte; an empty answer, or running out of them, closes the
    /// connection. Counts connections and requests received.
    async fn scripted_backend(
        answers: Vec<&'static [u8]>,
    ) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        use tokio::io::AsyncReadExt;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (accepted, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (conns, reqs) = (Arc::clone(&accepted), Arc::clone(&requests));
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                conns.fetch_add(1, Ordering::SeqCst);
                let reqs = Arc::clone(&reqs);
                let answers = answers.clone();
                tokio::spawn(async move {
                    for answer in answers {
                        let mut req = Vec::new();
                        let mut buf = [0u8; 4096];
                        while !whole_request(&req) {
                            match tcp.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => req.extend_from_slice(&buf[..n]),
                            }
                        }
                        reqs.fetch_add(1, Ordering::SeqCst);
                        if answer.is_empty() || tcp.write_all(answer).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, accepted, requests)
    }

    /// A request written on a kept-alive connection that then closes without an answer is an
    /// error: it is not sent again (the backend may be running it).
    #[tokio::test]
    async fn a_written_request_is_never_sent_twice() {
        const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let (addr, accepted, requests) = scripted_backend(vec![OK, b""]).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        assert_eq!(post(&pool, &addr).await, Bytes::from_static(b"ok"));
        assert_eq!(pool.idle_count(&addr), 1);
        let second = pool
            .post(&addr, "/", HeaderMap::new(), Bytes::from_static(b"{}"))
            .await;
        assert!(matches!(second, Err(SendError::Protocol(_))));
        assert_eq!(requests.load(Ordering::SeqCst), 2);
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.idle_count(&addr), 0);
    }

    /// Connections idle for longer than `IDLE_TIMEOUT` are dropped, oldest first.
    #[test]
    fn idle_connections_expire() {
        let now = Instant::now();
        let ago = |s: u64| now.checked_sub(Duration::from_secs(s)).unwrap();
        let mut list = vec![(1, ago(10)), (2, ago(4)), (3, ago(2)), (4, now)];
        prune(&mut list, now);
        assert_eq!(list.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [3, 4]);
        prune(&mut list, now + IDLE_TIMEOUT);
        assert!(list.is_empty());
    }

    /// A backend that drops a kept-alive connection without a word: the next request finds
    /// out at checkout or on its first read, and goes again on a new connection.
    #[tokio::test]
    async fn a_connection_closed_silently_is_replaced() {
        let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        assert_eq!(raw_connections(answer, b"ok", 3).await, 3);
    }

    /// A backend closes a kept-alive connection (its keep-alive timeout, say) while the
    /// runtime is busy: the FIN is in the kernel, not yet in tokio's readiness. Checked out
    /// after `probe_after`, the connection is asked of the kernel and replaced; trusting the
    /// readiness alone, the request would be written into the closed connection and fail.
    #[tokio::test]
    async fn a_connection_closed_while_the_runtime_was_busy_is_replaced() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (close_tx, close_rx) = std::sync::mpsc::channel::<()>();
        let (closed_tx, closed_rx) = std::sync::mpsc::channel::<()>();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        std::thread::spawn(move || {
            for (i, conn) in listener.incoming().take(2).enumerate() {
                let mut tcp = conn.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                let (mut req, mut buf) = (Vec::new(), [0u8; 4096]);
                while !whole_request(&req) {
                    match tcp.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                tcp.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .unwrap();
                if i == 0 {
                    close_rx.recv().unwrap();
                    drop(tcp);
                    closed_tx.send(()).unwrap();
                }
            }
        });
        let mut pool = Pool::new(Duration::from_secs(5));
        pool.probe_after = Duration::ZERO;
        let pool = Arc::new(pool);
        assert_eq!(post(&pool, &addr).await, Bytes::from_static(b"ok"));
        close_tx.send(()).unwrap();
        // Blocks the runtime's only thread: tokio polls no events until the close is done.
        closed_rx.recv().unwrap();
        assert_eq!(post(&pool, &addr).await, Bytes::from_static(b"ok"));
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    /// How many connections `rounds` requests in a row took from a `raw_backend`, each
    /// answer read to its end and equal to `body`.
    async fn raw_connections(answer: &'static [u8], body: &'static [u8], rounds: usize) -> usize {
        let (addr, accepted) = raw_backend(answer).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        for _ in 0..rounds {
            assert_eq!(post(&pool, &addr).await, Bytes::from_static(body));
        }
        accepted.load(Ordering::SeqCst)
    }

    /// A body cut short is an error at its end, never a clean end of stream.
    #[tokio::test]
    async fn a_body_cut_short_is_an_error() {
        for answer in [
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\ndata:"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\ndata:\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
        ] {
            let (addr, _) = raw_backend(answer).await;
            let pool = Arc::new(Pool::new(Duration::from_secs(5)));
            let r = pool
                .post(&addr, "/", HeaderMap::new(), Bytes::from_static(b"{}"))
                .await
                .unwrap();
            let mut body = r.body;
            let e = loop {
                match futures_util::StreamExt::next(&mut body).await {
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => break e.to_string(),
                    None => panic!("a clean end for a body cut short"),
                }
            };
            assert!(e.contains("before the body was complete"), "{e}");
            // The error is the body's last word.
            assert!(futures_util::StreamExt::next(&mut body).await.is_none());
        }
    }

    /// A body delimited by the end of the connection is complete at that end.
    #[tokio::test]
    async fn a_close_delimited_body_ends_with_the_connection() {
        let answer = b"HTTP/1.1 200 OK\r\n\r\nall of it";
        assert_eq!(raw_connections(answer, b"all of it", 2).await, 2);
    }

    /// What the backend receives: the path, a host, the caller's headers but the hop-by-hop
    /// ones, and the body's real length.
    #[tokio::test]
    async fn the_request_head_is_well_formed() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("999"));
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        h.insert(header::HOST, HeaderValue::from_static("proxy:1"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        h.insert(
            hop::PROXY_CONNECTION,
            HeaderValue::from_static("keep-alive"),
        );
        let head = request_head("b:1", "/v1/chat/completions?x=1", &h, 42);
        let head = std::str::from_utf8(&head).unwrap();
        assert!(head.starts_with("POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: b:1\r\n"));
        assert!(head.contains("\r\nauthorization: Bearer k\r\n"));
        assert!(head.ends_with("\r\ncontent-length: 42\r\n\r\n"));
        assert!(!head.contains("999") && !head.contains("close"));
        assert!(!head.contains("proxy:1") && !head.contains("trailers"));
        assert!(!head.contains("keep-alive"));
    }

    #[tokio::test]
    async fn refused_connections_are_connect_errors() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        let r = pool.post(&addr, "/", HeaderMap::new(), Bytes::new()).await;
        assert!(matches!(r, Err(SendError::Connect(_))));
    }
}
