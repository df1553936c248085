//! The keep-alive pool: connections by backend, checked with the kernel at checkout, new ones
//! made within the connect timeout (TLS over them for https), requests written on them and
//! never sent twice once a byte may have reached the backend — but for one that a kept
//! connection lost before a byte of answer, sent once more on a new connection.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
// foldhash: read on every request, keyed by names from the config (no untrusted keys).
use foldhash::HashMap;
use http::HeaderMap;
use tokio::net::TcpStream;

use super::body::{Checkin, UpstreamBody, UpstreamResponse};
use super::conn::{Conn, Wire, FIRST_READ};
use super::duplex::{exchange, Unanswered};
use super::error::out_of_descriptors;
use super::framing::{Decoder, Framing, Head};
use super::request::request_head;
use super::tls::{self, BackendTls};
use super::watch::{ConnWatch, RIGHT_AFTER};
use super::SendError;
use switchboard_wire::payload::Payload;

/// Where the pool sends a request: the TCP address and, for https, the TLS session's settings.
#[derive(Clone, Copy)]
pub(crate) struct Target<'a> {
    pub(crate) authority: &'a str,
    pub(crate) tls: Option<&'a BackendTls>,
    /// The connect timeout of this backend; `None`: the pool's.
    pub(crate) connect: Option<Duration>,
    /// What is learned and counted of this backend's connections (`None`: nothing).
    pub(crate) watch: Option<&'a Arc<ConnWatch>>,
}

impl<'a> Target<'a> {
    #[cfg(test)]
    pub(crate) fn plain(authority: &'a str) -> Target<'a> {
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
pub(crate) struct Pool {
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

impl Pool {
    pub(crate) fn new(connect_timeout: Duration) -> Pool {
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
    pub(crate) async fn post(
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
    pub(crate) async fn get(
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
mod tests;
