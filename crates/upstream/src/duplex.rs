//! One request's exchange on one connection: the request written, the answer's head read. A
//! request the socket takes in one write (the common case) is followed by the reads of the
//! head; a larger one is written while the connection is read, so that a backend answering
//! before it has read the whole body (a 413, then a close) is heard, and a write that fails
//! still leaves the answer that came before it. What the kernel took of the request tells
//! whether it may be sent again.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncWrite;

use super::conn::{Conn, FIRST_READ};
use super::framing::{parse_head, FramingError, Head};
use super::watch::Cut;
use super::SendError;
use switchboard_wire::payload::Payload;

/// An exchange that ended without an answer head.
#[derive(Debug)]
pub(crate) enum Unanswered {
    /// Not one byte of the request reached the kernel: it may be sent again, elsewhere.
    Untouched(io::Error),
    /// The request, or a part of it, may have reached the backend.
    Failed(SendError),
    /// The backend closed or reset the connection before one byte of an answer: on a
    /// connection it had answered on before, it closed that connection while the request was
    /// on its way, so it read none of it ([`super::Pool::post`] sends it again, once, on a
    /// new connection).
    Dropped(SendError, Cut),
}

/// Why no head could be read.
enum Unread {
    Malformed(FramingError),
    Closed,
    Io(io::Error),
}

/// Write the request (`head`, then `body`) on `conn` and read the answer's head; the bytes read
/// after the head (the body's start) come with it. A head that arrives before the request is
/// written whole ends the writing, and the connection is then not used again. `wrote` is true
/// whenever a byte of the request may have reached the backend, for a caller that stops
/// waiting before this ends.
pub(crate) async fn exchange(
    conn: &mut Conn,
    head: &Bytes,
    body: &Payload,
    wrote: &mut bool,
) -> Result<(Head, BytesMut), Unanswered> {
    let before = conn.sent();
    let mut req = head.clone().chain(body.cursor());
    *wrote = true;
    // One try, not awaited: its `Pending` goes on below as any other unfinished write.
    let first = poll_fn(|cx| Poll::Ready(write(conn, cx, &mut req))).await;
    let failed = match first {
        // The common case: one `writev` took the whole request.
        Poll::Ready(Ok(true)) => {
            let mut buf = BytesMut::with_capacity(FIRST_READ);
            return match poll_fn(|cx| poll_head(conn, cx, &mut buf)).await {
                Ok(head) => Ok((head, buf)),
                Err(e) => Err(unanswered(e, None, &buf)),
            };
        }
        Poll::Ready(Ok(false)) | Poll::Pending => None,
        Poll::Ready(Err(e)) if conn.sent() == before => {
            *wrote = false;
            return Err(Unanswered::Untouched(e));
        }
        Poll::Ready(Err(e)) => Some(e),
    };
    both(conn, &mut req, before, failed, wrote).await
}

/// Write the rest of `req` while reading the answer's head, until the head is read or the
/// connection fails; a write that fails ends the writing only.
async fn both(
    conn: &mut Conn,
    req: &mut impl Buf,
    before: u64,
    mut failed: Option<io::Error>,
    wrote: &mut bool,
) -> Result<(Head, BytesMut), Unanswered> {
    let mut buf = BytesMut::with_capacity(FIRST_READ);
    let mut written = false;
    let head = poll_fn(|cx| {
        while !written && failed.is_none() {
            match write(conn, cx, req) {
                Poll::Ready(Ok(done)) => written = done,
                Poll::Ready(Err(e)) if conn.sent() == before => {
                    *wrote = false;
                    return Poll::Ready(Err(Unanswered::Untouched(e)));
                }
                Poll::Ready(Err(e)) => failed = Some(e),
                Poll::Pending => break,
            }
        }
        match ready!(poll_head(conn, cx, &mut buf)) {
            Ok(mut head) => {
                // The backend answered before it had the whole request: what is left of it
                // would be taken for the next request.
                head.keep_alive &= written;
                Poll::Ready(Ok(head))
            }
            Err(e) => Poll::Ready(Err(unanswered(e, failed.take(), &buf))),
        }
    })
    .await?;
    Ok((head, buf))
}

/// Write some of `req`: `Ready(Ok(true))` once all of it is written (and, under TLS, flushed
/// out), `Ready(Ok(false))` while there is more to write.
fn write(conn: &mut Conn, cx: &mut Context<'_>, req: &mut impl Buf) -> Poll<io::Result<bool>> {
    if req.has_remaining() {
        // A head and a body's parts (`tokio_util::io::poll_write_buf` readies 64 per call).
        let mut slices = [IoSlice::new(&[]); 8];
        let n = req.chunks_vectored(&mut slices);
        match ready!(Pin::new(&mut *conn).poll_write_vectored(cx, &slices[..n])) {
            Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
            Ok(written) => {
                req.advance(written);
                if req.has_remaining() {
                    return Poll::Ready(Ok(false));
                }
            }
            Err(e) => return Poll::Ready(Err(e)),
        }
    }
    // TLS records the socket did not take at once are flushed out.
    if let Conn::Tls(_) = conn {
        ready!(Pin::new(conn).poll_flush(cx))?;
    }
    Poll::Ready(Ok(true))
}

/// Read from `conn` into `buf` until it starts with a whole head, which is split off it.
fn poll_head(
    conn: &mut Conn,
    cx: &mut Context<'_>,
    buf: &mut BytesMut,
) -> Poll<Result<Head, Unread>> {
    loop {
        match parse_head(buf) {
            Ok(Some(head)) => return Poll::Ready(Ok(head)),
            Ok(None) => {}
            Err(e) => return Poll::Ready(Err(Unread::Malformed(e))),
        }
        if buf.capacity() == buf.len() {
            buf.reserve(FIRST_READ);
        }
        match ready!(tokio_util::io::poll_read_buf(Pin::new(&mut *conn), cx, buf)) {
            Ok(0) => return Poll::Ready(Err(Unread::Closed)),
            Ok(_) => {}
            Err(e) => return Poll::Ready(Err(Unread::Io(e))),
        }
    }
}

/// An exchange with no head: dropped when the connection was closed or reset before a byte
/// of the answer (`buf` empty), whatever a failed write (`failed`) said of it; else failed.
fn unanswered(e: Unread, failed: Option<io::Error>, buf: &BytesMut) -> Unanswered {
    let cut = match &e {
        _ if !buf.is_empty() => None,
        Unread::Closed => Some(Cut::Closed),
        Unread::Io(io) => Cut::of(io),
        Unread::Malformed(_) => None,
    };
    // A write that failed says how: a reset it met.
    let cut = match failed.as_ref().map(Cut::of) {
        None => cut,
        Some(write) => cut.and(write),
    };
    match cut {
        Some(cut) => Unanswered::Dropped(unread(e, failed), cut),
        _ => Unanswered::Failed(unread(e, failed)),
    }
}

/// What the caller is told of a head not read; `failed`: the write that failed before.
fn unread(e: Unread, failed: Option<io::Error>) -> SendError {
    match (e, failed) {
        (Unread::Malformed(e), _) => SendError::Malformed(e),
        (_, Some(w)) => SendError::Write(format!("sending the request: {w}")),
        (Unread::Closed, None) => {
            SendError::Head("connection closed before the response head".into())
        }
        (Unread::Io(e), None) => SendError::Head(format!("reading the response: {e}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::super::conn::Wire;
    use super::*;

    const HEAD: &[u8] = b"POST / HTTP/1.1\r\nhost: b\r\ncontent-length: 20971520\r\n\r\n";
    const REFUSAL: &[u8] = b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 4\r\n\r\nnope";

    /// A connection to a backend, and the backend's end of it.
    async fn pair() -> (Conn, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (server, _) = l.accept().await.unwrap();
        (Conn::Plain(Wire::new(client)), server)
    }

    /// 20 MiB: more than the kernel takes before the backend reads.
    fn big() -> Payload {
        Payload::from(vec![b'x'; 20 << 20])
    }

    /// Read until the request head is in (the body stays unread, but for what came with it).
    async fn read_request_head(server: &mut TcpStream) {
        let (mut seen, mut buf) = (Vec::new(), [0u8; 4096]);
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = server.read(&mut buf).await.unwrap();
            assert!(n > 0);
            seen.extend_from_slice(&buf[..n]);
        }
    }

    /// An answer that comes while the body is being written ends the writing, and the
    /// connection is not kept: the rest of the body would be taken for the next request.
    #[tokio::test]
    async fn an_answer_before_the_whole_body_ends_the_writing_and_the_connection() {
        let (mut conn, mut server) = pair().await;
        let backend = tokio::spawn(async move {
            read_request_head(&mut server).await;
            server.write_all(REFUSAL).await.unwrap();
            // Kept open and unread: the head alone has to end the exchange.
            server
        });
        let (body, mut wrote) = (big(), false);
        let sent = exchange(&mut conn, &Bytes::from_static(HEAD), &body, &mut wrote).await;
        let (head, buf) = sent.unwrap();
        assert_eq!(head.status, 413);
        assert!(!head.keep_alive);
        assert!(b"nope".starts_with(&buf), "{buf:?}");
        assert!(wrote);
        assert!(conn.sent() < (HEAD.len() + body.len()) as u64);
        drop(backend.await.unwrap());
    }

    /// The backend answers and closes with the body unread (the kernel resets the
    /// connection): the write fails, and the answer that came before is still read.
    #[tokio::test]
    async fn an_answer_before_a_reset_is_read() {
        let (mut conn, mut server) = pair().await;
        tokio::spawn(async move {
            read_request_head(&mut server).await;
            server.write_all(REFUSAL).await.unwrap();
        });
        let mut wrote = false;
        let sent = exchange(&mut conn, &Bytes::from_static(HEAD), &big(), &mut wrote).await;
        let (head, _) = sent.unwrap();
        assert_eq!(head.status, 413);
        assert!(!head.keep_alive);
    }

    /// Reset halfway through the body without an answer: dropped after the backend had some
    /// of the request (on a connection used before, the pool sends it once more on a new one).
    #[tokio::test]
    async fn a_reset_mid_body_is_dropped_after_bytes_were_sent() {
        let (mut conn, mut server) = pair().await;
        tokio::spawn(async move {
            read_request_head(&mut server).await;
        });
        let mut wrote = false;
        let sent = exchange(&mut conn, &Bytes::from_static(HEAD), &big(), &mut wrote).await;
        let Err(Unanswered::Dropped(SendError::Write(e), Cut::Reset)) = sent else {
            panic!("{sent:?}");
        };
        assert!(e.starts_with("sending the request: "), "{e}");
        assert!(wrote && conn.sent() > 0);
    }

    /// A connection the backend reset before the request: the kernel takes nothing of it,
    /// so it may be sent again on another connection.
    #[tokio::test]
    async fn a_connection_reset_before_the_request_leaves_it_untouched() {
        let (mut conn, server) = pair().await;
        socket2::SockRef::from(&server)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(server);
        conn.tcp().readable().await.unwrap();
        let mut wrote = false;
        let body = Payload::from(Bytes::from_static(b"{}"));
        let sent = exchange(&mut conn, &Bytes::from_static(HEAD), &body, &mut wrote).await;
        assert!(matches!(sent, Err(Unanswered::Untouched(_))), "{sent:?}");
        assert!(!wrote);
        assert_eq!(conn.sent(), 0);
    }
}
