//! The pool against backends on loopback: reuse, replacement of closed connections, the one
//! resend of a request a kept connection lost unanswered, bodies cut short, probes.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use http::{header, HeaderValue};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use super::*;
use crate::{read_all, SMALL_ANSWER_LIMIT};
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
                    let body = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
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
