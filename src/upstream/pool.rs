//! The keep-alive pool: connections by backend, checked with the kernel at checkout, new ones
//! made within the connect timeout (TLS over them for https), requests written on them and
//! never sent twice once a byte may have reached the backend — but for one that a kept
//! connection lost before a byte of answer, sent once more on a new connection.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
// foldhash: read on every request, keyed by names from the config (no untrusted keys).
use foldhash::HashMap;
use http::HeaderMap;
use tokio::net::TcpStream;

use super::body::{Checkin, UpstreamBody, UpstreamResponse};
use super::conn::{Conn, Wire, FIRST_READ};
use super::duplex::{exchange, Unanswered};
use super::error::out_of_descriptors;
use super::framing::{Decoder, Framing, Head};
use super::tls::{self, BackendTls};
use super::watch::{ConnWatch, RIGHT_AFTER};
use super::{hop, SendError};
use crate::wire::payload::Payload;

/// Where the pool sends a request: the TCP address and, for https, the TLS session's settings.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub authority: &'a str,
    pub tls: Option<&'a BackendTls>,
    /// The connect timeout of this backend; `None`: the pool's.
    pub connect: Option<Duration>,
    /// What is learned and counted of this backend's connections (`None`: nothing).
    pub watch: Option<&'a Arc<ConnWatch>>,
}

impl<'a> Target<'a> {
    pub fn plain(authority: &'a str) -> Target<'a> {
        Target {
            authority,
            tls: None,
            connect: None,
            watch: None,
        }
    }

    /// What its kept-alive connections are pooled under.
    pub(super) fn key(&self) -> &'a str {
        match self.tls {
            None => self.authority,
            Some(tls) => &tls.pool_key,
        }
    }
}

/// Keep-alive connections by pool key (`host:port` for plain http), each with the time it
/// went idle (the newest last).
#[derive(Default)]
pub struct Pool {
    pub(super) idle: Mutex<HashMap<String, Vec<(Kept, Instant)>>>,
    pub(super) connect_timeout: Duration,
}

/// An idle connection and what its last answer was.
pub(super) struct Kept {
    conn: Conn,
    /// Its last answer was streamed (chunked): a backend that closes such connections is
    /// learned of when it is found closed right after.
    after_stream: bool,
}

impl Kept {
    /// Its TCP socket (for tests that look at the pool).
    #[cfg(test)]
    pub(super) fn tcp(&self) -> &TcpStream {
        self.conn.tcp()
    }
}

/// A connection taken from the pool: used before, so a request it loses before a byte of
/// answer goes once more on a new one.
pub(super) struct Reused {
    conn: Conn,
    /// It went idle right after a streamed answer.
    after_stream: bool,
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

/// The kernel's word that `tcp` is still open and has nothing to read: a peek that would
/// block. Asked at every checkout (one system call): it sees a FIN the runtime has not been
/// told of yet (the backend's keep-alive timeout struck while the runtime was busy), which
/// tokio's readiness alone misses, and a request written into such a connection would fail,
/// never to be sent again. Under TLS the check is on the TCP socket: a backend's close (its
/// `close_notify`, then the FIN) is bytes to read there.
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

/// The request head: `METHOD path HTTP/1.1`, the headers but the hop-by-hop ones (`Host` and
/// the length written anew), the body's length when there is a body.
fn request_head(
    method: &[u8],
    authority: &str,
    path: &str,
    headers: &HeaderMap,
    body_len: Option<usize>,
) -> Bytes {
    let mut head = BytesMut::with_capacity(128 + path.len() + headers.len() * 48);
    head.put_slice(method);
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
    if let Some(len) = body_len {
        head.put_slice(b"content-length: ");
        let _ = write!(head, "{len}");
        head.put_slice(b"\r\n");
    }
    head.put_slice(b"\r\n");
    head.freeze()
}

impl Pool {
    pub fn new(connect_timeout: Duration) -> Pool {
        Pool {
            idle: Mutex::default(),
            connect_timeout,
        }
    }

    /// An idle connection of `to` that is still open, if there is one. One found closed right
    /// after a streamed answer teaches `to`'s watch that its backend closes those.
    pub(super) fn checkout(&self, to: Target<'_>) -> Option<Reused> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(to.key())?;
        let now = Instant::now();
        prune(list, now);
        while let Some((kept, since)) = list.pop() {
            let after_stream = kept.after_stream && now.duration_since(since) < RIGHT_AFTER;
            if open_by_the_kernel(kept.conn.tcp()) {
                return Some(Reused {
                    conn: kept.conn,
                    after_stream,
                });
            }
            if let (true, Some(watch)) = (after_stream, to.watch) {
                watch.closed_after_stream();
            }
        }
        None
    }

    /// Keep `conn` for the next request under `key`; `after_stream`: its answer was streamed.
    pub(super) fn checkin(&self, key: &str, conn: Conn, after_stream: bool) {
        let now = Instant::now();
        let kept = Kept { conn, after_stream };
        if let Ok(mut idle) = self.idle.lock() {
            match idle.get_mut(key) {
                Some(list) => {
                    prune(list, now);
                    if list.len() < MAX_IDLE {
                        list.push((kept, now));
                    }
                }
                None => {
                    idle.insert(key.to_string(), vec![(kept, now)]);
                }
            }
        }
    }

    /// Idle connections kept under `key` (for tests).
    #[cfg(test)]
    pub(super) fn idle_count(&self, key: &str) -> usize {
        self.idle
            .lock()
            .map_or(0, |idle| idle.get(key).map_or(0, Vec::len))
    }

    /// A new connection to `to`: TCP, then for https the TLS handshake (SNI `to`'s server
    /// name, ALPN `http/1.1`), each within the connect timeout.
    async fn connect(&self, to: Target<'_>) -> Result<Conn, SendError> {
        let within = to.connect.unwrap_or(self.connect_timeout);
        let tcp = tokio::time::timeout(within, TcpStream::connect(to.authority))
            .await
            .map_err(|_| SendError::ConnectTimeout)?
            .map_err(|e| {
                if out_of_descriptors(&e) {
                    SendError::Local(e.to_string())
                } else {
                    SendError::Connect(e.to_string())
                }
            })?;
        let _ = tcp.set_nodelay(true);
        let Some(tls) = to.tls else {
            return Ok(Conn::Plain(Wire::new(tcp)));
        };
        let handshake = tls
            .connector
            .connect(tls.server_name.clone(), Wire::new(tcp));
        match tokio::time::timeout(within, handshake).await {
            Ok(Ok(stream)) => Ok(Conn::Tls(Box::new(stream))),
            Ok(Err(e)) => Err(SendError::Tls(tls::handshake_error(&e))),
            Err(_) => Err(SendError::Tls("tls handshake timed out".into())),
        }
    }

    /// POST `body` to `path` of `to`; resolves with the response head. The body reads from
    /// the connection as it is polled and returns it to the pool at its end. A request goes
    /// once more on a new connection only when a kept one lost it before a byte of answer:
    /// the kernel took nothing of it, or the backend closed or reset the connection without
    /// answering (a backend closes an idle connection while a request is on its way: it read
    /// none of it). Else, once a byte of it may have reached the backend, it is never sent
    /// again, and a new connection that takes nothing is [`SendError::Unsent`]. `wrote`
    /// tells a caller that stops waiting whether a byte of the request may have reached the
    /// backend.
    pub async fn post(
        self: &Arc<Self>,
        to: Target<'_>,
        path: &str,
        headers: HeaderMap,
        body: Payload,
        wrote: &mut bool,
    ) -> Result<UpstreamResponse, SendError> {
        let head = request_head(b"POST ", to.authority, path, &headers, Some(body.len()));
        let (conn, parsed, buf) = self.send(to, &head, &body, wrote).await?;
        Ok(self.answer(to, conn, parsed, buf))
    }

    /// GET `path` of `to` within `wait`: past it, [`SendError::ConnectTimeout`] while no
    /// connection took the request, else [`SendError::Timeout`] (a backend that accepts
    /// connections but does not answer yet). A kept connection that loses it goes as in
    /// [`Pool::post`] (a probe must not take a backend's close after a stream for its fall).
    pub async fn get(
        self: &Arc<Self>,
        to: Target<'_>,
        path: &str,
        headers: &HeaderMap,
        wait: Duration,
    ) -> Result<UpstreamResponse, SendError> {
        let head = request_head(b"GET ", to.authority, path, headers, None);
        let (body, mut wrote) = (Payload::from(Bytes::new()), false);
        match tokio::time::timeout(wait, self.send(to, &head, &body, &mut wrote)).await {
            Ok(sent) => {
                let (conn, parsed, buf) = sent?;
                Ok(self.answer(to, conn, parsed, buf))
            }
            Err(_) if wrote => Err(SendError::Timeout),
            Err(_) => Err(SendError::ConnectTimeout),
        }
    }

    /// The request (`head`, `body`) written on a kept connection or a new one, and the
    /// answer's head read ([`Pool::post`] says when it goes once more).
    async fn send(
        &self,
        to: Target<'_>,
        head: &Bytes,
        body: &Payload,
        wrote: &mut bool,
    ) -> Result<(Conn, Head, BytesMut), SendError> {
        if let Some(Reused {
            mut conn,
            after_stream,
        }) = self.checkout(to)
        {
            match exchange(&mut conn, head, body, wrote).await {
                Ok((parsed, buf)) => return Ok((conn, parsed, buf)),
                Err(Unanswered::Failed(e)) => return Err(e),
                Err(Unanswered::Untouched(e)) => {
                    tracing::debug!(error = %e, "pooled connection failed; using a new one");
                }
                Err(Unanswered::Dropped(e, cut)) => {
                    tracing::debug!(error = %e, "pooled connection cut unanswered; sending again on a new one");
                    if let Some(watch) = to.watch {
                        watch.retried(cut);
                        if after_stream {
                            watch.closed_after_stream();
                        }
                    }
                }
            }
        }
        let mut conn = self.connect(to).await?;
        match exchange(&mut conn, head, body, wrote).await {
            Ok((parsed, buf)) => Ok((conn, parsed, buf)),
            Err(Unanswered::Failed(e) | Unanswered::Dropped(e, _)) => Err(e),
            Err(Unanswered::Untouched(e)) => {
                Err(SendError::Unsent(format!("sending the request: {e}")))
            }
        }
    }

    /// The response of a parsed head; its body reads on from `conn`.
    #[inline]
    fn answer(
        self: &Arc<Self>,
        to: Target<'_>,
        conn: Conn,
        parsed: Head,
        buf: BytesMut,
    ) -> UpstreamResponse {
        UpstreamResponse {
            status: parsed.status,
            headers: parsed.headers,
            body: UpstreamBody {
                conn: Some(conn),
                buf,
                read: FIRST_READ,
                streamed: parsed.framing == Framing::Chunked,
                decoder: Decoder::new(parsed.framing),
                keep_alive: parsed.keep_alive,
                pool: Arc::clone(self) as Arc<dyn Checkin>,
                key: to.key().to_string(),
                watch: to.watch.cloned(),
            },
        }
    }
}

impl Checkin for Pool {
    fn checkin(&self, key: &str, conn: Conn, after_stream: bool) {
        Pool::checkin(self, key, conn, after_stream);
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
    use crate::upstream::{read_all, SMALL_ANSWER_LIMIT};
    use http::StatusCode;

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
                Target::plain(addr),
                "/v1/chat/completions",
                HeaderMap::new(),
                Bytes::from_static(b"{}").into(),
                &mut false,
            )
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::OK);
        read_all(r.body, SMALL_ANSWER_LIMIT).await.unwrap()
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

    /// The test backends' requests are complete: a head and the 2-byte body `{}`, or a GET's
    /// head.
    fn whole_request(req: &[u8]) -> bool {
        let head = req.windows(4).any(|w| w == b"\r\n\r\n");
        head && (req.ends_with(b"{}") || req.starts_with(b"GET ") && req.ends_with(b"\r\n\r\n"))
    }

    /// A backend that reads requests on each connection and answers the n-th with
    /// `answers[n]` byte for byte; an empty answer, or running out of them, closes the
    /// connection. Counts connections and requests received.
    async fn scripted_backend(
        answers: Vec<&'static [u8]>,
    ) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        scripted_connections(vec![answers]).await
    }

    /// [`scripted_backend`] with a script per connection: the i-th connection follows
    /// `scripts[i]` (the last script once they run out).
    async fn scripted_connections(
        scripts: Vec<Vec<&'static [u8]>>,
    ) -> (String, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (accepted, requests) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (conns, reqs) = (Arc::clone(&accepted), Arc::clone(&requests));
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let i = conns.fetch_add(1, Ordering::SeqCst);
                let reqs = Arc::clone(&reqs);
                let answers = scripts[i.min(scripts.len() - 1)].clone();
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

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
    const STREAMED: &[u8] =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\no\r\n1\r\nk\r\n0\r\n\r\n";

    async fn try_post(pool: &Arc<Pool>, to: Target<'_>) -> Result<Bytes, SendError> {
        let r = pool
            .post(
                to,
                "/",
                HeaderMap::new(),
                Bytes::from_static(b"{}").into(),
                &mut false,
            )
            .await?;
        Ok(read_all(r.body, SMALL_ANSWER_LIMIT).await.unwrap())
    }

    /// Regression: a backend that closes a kept connection as a request arrives on it (as
    /// llama-server does after every stream) cost that request a 502. A request a kept
    /// connection loses before a byte of answer goes once more, on a new connection.
    #[tokio::test]
    async fn a_request_a_kept_connection_loses_unanswered_goes_again_on_a_new_one() {
        let (addr, accepted, requests) = scripted_backend(vec![OK, b""]).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        let watch = Arc::new(ConnWatch::default());
        let to = Target {
            watch: Some(&watch),
            ..Target::plain(&addr)
        };
        assert_eq!(try_post(&pool, to).await.unwrap(), "ok");
        assert_eq!(pool.idle_count(&addr), 1);
        assert_eq!(try_post(&pool, to).await.unwrap(), "ok");
        assert_eq!(requests.load(Ordering::SeqCst), 3);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(watch.retries(), (1, 0));
    }

    /// Sent again once only: a new connection that loses the request the same way is the
    /// request's failure, and it goes no further.
    #[tokio::test]
    async fn a_request_a_new_connection_loses_is_never_sent_again() {
        let (addr, accepted, requests) = scripted_connections(vec![vec![OK, b""], vec![b""]]).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        assert_eq!(post(&pool, &addr).await, Bytes::from_static(b"ok"));
        let second = try_post(&pool, Target::plain(&addr)).await;
        assert!(matches!(second, Err(SendError::Head(_))), "{second:?}");
        assert_eq!(requests.load(Ordering::SeqCst), 3);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        assert_eq!(pool.idle_count(&addr), 0);
    }

    /// Regression: a health probe that took the connection a stream had ended on failed,
    /// and the backend could be taken for down. It goes once more on a new connection.
    #[tokio::test]
    async fn a_probe_on_a_connection_closed_after_a_stream_is_answered() {
        let (addr, accepted, requests) =
            scripted_connections(vec![vec![STREAMED, b""], vec![OK]]).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        assert_eq!(post(&pool, &addr).await, Bytes::from_static(b"ok"));
        let wait = Duration::from_secs(5);
        let r = pool
            .get(Target::plain(&addr), "/health", &HeaderMap::new(), wait)
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(read_all(r.body, SMALL_ANSWER_LIMIT).await.unwrap(), "ok");
        assert_eq!(requests.load(Ordering::SeqCst), 3);
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    /// A backend seen closing a connection right after a streamed answer: from then on its
    /// streams' connections are closed at their end, not kept (and counted), while its
    /// whole answers' connections are still kept.
    #[tokio::test]
    async fn a_backend_that_closes_after_streams_is_learned_and_its_streams_not_kept() {
        let (addr, accepted, _) =
            scripted_connections(vec![vec![STREAMED], vec![STREAMED, OK, b""], vec![OK, OK]]).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        let watch = Arc::new(ConnWatch::default());
        let to = Target {
            watch: Some(&watch),
            ..Target::plain(&addr)
        };
        assert_eq!(try_post(&pool, to).await.unwrap(), "ok");
        assert!(!watch.closes_after_stream());
        // The backend closed that connection after the stream: found at checkout or on the
        // request written into it, the request goes on a new one, and the backend is learned.
        assert_eq!(try_post(&pool, to).await.unwrap(), "ok");
        assert!(watch.closes_after_stream());
        assert_eq!(
            pool.idle_count(&addr),
            0,
            "a stream's connection is not kept"
        );
        assert_eq!(watch.not_pooled_count(), 1);
        assert_eq!(try_post(&pool, to).await.unwrap(), "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        assert_eq!(
            pool.idle_count(&addr),
            1,
            "a whole answer's connection is kept"
        );
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
    /// at once, the connection is asked of the kernel and replaced; trusting the readiness
    /// alone, the request would be written into the closed connection and fail.
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
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
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
                .post(
                    Target::plain(&addr),
                    "/",
                    HeaderMap::new(),
                    Bytes::from_static(b"{}").into(),
                    &mut false,
                )
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
        let head = request_head(b"POST ", "b:1", "/v1/chat/completions?x=1", &h, Some(42));
        let head = std::str::from_utf8(&head).unwrap();
        assert!(head.starts_with("POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: b:1\r\n"));
        assert!(head.contains("\r\nauthorization: Bearer k\r\n"));
        assert!(head.ends_with("\r\ncontent-length: 42\r\n\r\n"));
        assert!(!head.contains("999") && !head.contains("close"));
        assert!(!head.contains("proxy:1") && !head.contains("trailers"));
        assert!(!head.contains("keep-alive"));
    }

    /// A GET's head: no body, so no length.
    #[test]
    fn a_get_head_has_no_length() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        let head = request_head(b"GET ", "b:1", "/health", &h, None);
        assert_eq!(
            std::str::from_utf8(&head).unwrap(),
            "GET /health HTTP/1.1\r\nhost: b:1\r\nauthorization: Bearer k\r\n\r\n"
        );
    }

    /// What a health probe tells apart: an answer, a backend that accepts connections but
    /// does not answer (loading), and one that refuses them (down).
    #[tokio::test]
    async fn a_get_tells_no_answer_from_no_connection() {
        let (addr, _) = backend(Answer::Length).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        let wait = Duration::from_millis(300);
        let r = pool
            .get(Target::plain(&addr), "/health", &HeaderMap::new(), wait)
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(read_all(r.body, SMALL_ANSWER_LIMIT).await.unwrap(), "ok");

        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let held = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((tcp, _)) = silent.accept().await {
                held.push(tcp);
            }
        });
        let r = pool
            .get(Target::plain(&addr), "/health", &HeaderMap::new(), wait)
            .await;
        assert!(matches!(r, Err(SendError::Timeout)), "{:?}", r.err());
        held.abort();

        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let r = pool
            .get(Target::plain(&addr), "/health", &HeaderMap::new(), wait)
            .await;
        assert!(matches!(r, Err(SendError::Connect(_))), "{:?}", r.err());
    }

    #[tokio::test]
    async fn refused_connections_are_connect_errors() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        let r = pool
            .post(
                Target::plain(&addr),
                "/",
                HeaderMap::new(),
                Payload::default(),
                &mut false,
            )
            .await;
        assert!(matches!(r, Err(SendError::Connect(_))));
    }
}
