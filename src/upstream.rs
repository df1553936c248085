//! The upstream HTTP/1 client: a pool of backend connections driven inside the request's own
//! task, so a response and its body chunks reach the relay without a connection task, a
//! cross-task channel hand-off or a wake-up per chunk. One pool per worker thread.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use http::{header, HeaderMap, HeaderValue, Request, StatusCode};
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Any error of the exchange with a backend, as the relay sees it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

type Conn = Pin<Box<Connection<TokioIo<TcpStream>, Full<Bytes>>>>;

/// An idle keep-alive connection.
struct Idle {
    sender: SendRequest<Full<Bytes>>,
    conn: Conn,
}

/// What went wrong before a response head arrived.
#[derive(Debug)]
pub enum SendError {
    /// No TCP connection could be made (refused, unreachable, connect timeout).
    Connect(String),
    /// The connection failed while sending or reading the head.
    Protocol(String),
}

/// Keep-alive connections by authority (`host:port`).
#[derive(Default)]
pub struct Pool {
    idle: Mutex<HashMap<String, Vec<Idle>>>,
    connect_timeout: Duration,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pool")
    }
}

/// Most idle connections kept per backend.
const MAX_IDLE: usize = 256;

/// The chain of an error's messages (no URLs: hyper's errors carry none).
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

/// Poll the connection (so it reads and writes) without letting its end stop the caller.
fn drive(conn: &mut Conn, cx: &mut Context<'_>) -> Option<Result<(), hyper::Error>> {
    match conn.as_mut().poll(cx) {
        Poll::Ready(r) => Some(r),
        Poll::Pending => None,
    }
}

impl Pool {
    pub fn new(connect_timeout: Duration) -> Pool {
        Pool {
            idle: Mutex::default(),
            connect_timeout,
        }
    }

    /// An idle connection that is still open, if there is one.
    fn checkout(&self, authority: &str) -> Option<Idle> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(authority)?;
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        while let Some(mut c) = list.pop() {
            // A connection the backend closed resolves at once; one still open is pending.
            if drive(&mut c.conn, &mut cx).is_none() && c.sender.is_ready() {
                return Some(c);
            }
        }
        None
    }

    fn checkin(&self, authority: &str, c: Idle) {
        if let Ok(mut idle) = self.idle.lock() {
            let list = idle.entry(authority.to_string()).or_default();
            if list.len() < MAX_IDLE {
                list.push(c);
            }
        }
    }

    async fn connect(&self, authority: &str) -> Result<Idle, SendError> {
        let tcp = tokio::time::timeout(self.connect_timeout, TcpStream::connect(authority))
            .await
            .map_err(|_| SendError::Connect("connect timed out".into()))?
            .map_err(|e| SendError::Connect(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let (sender, conn) = http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| SendError::Connect(chain(&e)))?;
        Ok(Idle {
            sender,
            conn: Box::pin(conn),
        })
    }

    /// POST `body` to `http://{authority}{path}`; resolves with the response head. The body
    /// drives the connection as it is read and returns it to the pool at its end.
    pub async fn post(
        self: &std::sync::Arc<Self>,
        authority: &str,
        path: &str,
        mut headers: HeaderMap,
        body: Bytes,
    ) -> Result<UpstreamResponse, SendError> {
        if let Ok(host) = HeaderValue::from_str(authority) {
            headers.insert(header::HOST, host);
        }
        let uri: http::Uri = path
            .parse()
            .map_err(|e| SendError::Protocol(format!("invalid request path: {e}")))?;
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        // A pooled connection may have been closed by the backend just now: then the request
        // comes back unsent and goes on a new connection.
        for attempt in 0..2 {
            let mut c = match self.checkout(authority).filter(|_| attempt == 0) {
                Some(c) => c,
                None => self.connect(authority).await?,
            };
            let mut fut = std::pin::pin!(c.sender.try_send_request(req));
            let head = std::future::poll_fn(|cx| {
                let closed = drive(&mut c.conn, cx);
                match fut.as_mut().poll(cx) {
                    Poll::Pending if closed.is_some() => Poll::Ready(Err(None)),
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(r) => Poll::Ready(r.map_err(Some)),
                }
            })
            .await;
            match head {
                Ok(resp) => {
                    let (parts, incoming) = resp.into_parts();
                    return Ok(UpstreamResponse {
                        status: parts.status,
                        headers: parts.headers,
                        body: UpstreamBody {
                            incoming,
                            conn: Some(c),
                            pool: std::sync::Arc::clone(self),
                            authority: authority.to_string(),
                        },
                    });
                }
                Err(Some(mut e)) => match e.take_message() {
                    Some(unsent) if attempt == 0 => req = unsent,
                    _ => return Err(SendError::Protocol(chain(e.error()))),
                },
                Err(None) => return Err(SendError::Protocol("connection closed".into())),
            }
        }
        Err(SendError::Protocol("connection closed".into()))
    }
}

/// A backend's response: head, and a body that drives its connection.
pub struct UpstreamResponse {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: UpstreamBody,
}

/// The body of a backend response. Dropped before its end, it closes the connection (the
/// backend sees the client go away); read to the end, it returns the connection to the pool.
pub struct UpstreamBody {
    incoming: Incoming,
    conn: Option<Idle>,
    pool: std::sync::Arc<Pool>,
    authority: String,
}

impl Stream for UpstreamBody {
    type Item = Result<Bytes, BoxError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(c) = this.conn.as_mut() {
                if let Some(Err(e)) = drive(&mut c.conn, cx) {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
            match Pin::new(&mut this.incoming).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => return Poll::Ready(Some(Ok(data))),
                    _ => continue,
                },
                Poll::Ready(Some(Err(e))) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
                Poll::Ready(None) => {
                    // The body ended cleanly (an error would have come as one): whatever its
                    // framing, length or chunked, the connection is free for the next request.
                    if let Some(c) = this.conn.take() {
                        this.pool.checkin(&this.authority, c);
                    }
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl UpstreamBody {
    /// The whole body.
    pub async fn bytes(mut self) -> Result<Bytes, BoxError> {
        use futures_util::StreamExt;
        let mut out = bytes::BytesMut::new();
        while let Some(chunk) = self.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out.freeze())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use hyper::service::service_fn;
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
        r.body.bytes().await.unwrap()
    }

    #[tokio::test]
    async fn reuses_a_connection_read_to_the_end() {
        let (addr, accepted) = backend(Answer::Length).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        for _ in 0..3 {
            assert_eq!(post(&pool, &addr).await, Bytes::from_static(b"ok"));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    /// Regression: a chunked body (every SSE stream) read to its end used to close its
    /// connection, so each stream paid for a new TCP connection to the backend.
    #[tokio::test]
    async fn reuses_a_connection_after_a_chunked_body() {
        let (addr, accepted) = backend(Answer::Chunked).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        for _ in 0..3 {
            assert_eq!(post(&pool, &addr).await, Bytes::from_static(b"ok"));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_closed_connection_is_replaced() {
        let (addr, accepted) = backend(Answer::Close).await;
        let pool = Arc::new(Pool::new(Duration::from_secs(5)));
        for _ in 0..3 {
            assert_eq!(post(&pool, &addr).await, Bytes::from_static(b"ok"));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
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
