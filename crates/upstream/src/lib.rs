//! The one HTTP/1.1 client to the backends, for http and https backends alike: a pool of keep-alive
//! connections (TCP, or TLS over TCP through rustls), each used by one request at a time inside
//! that request's own task. The response head is parsed by `httparse`; the body is decoded
//! straight from the connection's buffer, so every event the backend has already sent comes out
//! of one read as one piece (no per-chunk hand-off). A request the socket does not take at
//! once is written while the answer is read (`duplex`), and one that may have reached the
//! backend is never sent again. One pool per worker thread. Proxied requests, health probes
//! (GET) and backend token counting (POST, whole body) all use it.
//!
//! Here: the [`Client`] and its narrow settings, a backend as it is reached ([`Origin`]: the
//! proxy makes one from a configured backend, in one place; this crate knows no config). The
//! pool and the writing of requests are in `pool.rs`, an answer's body and the readers that
//! hold one whole in `body.rs`, the client's errors in `error.rs`, a failed exchange as the
//! layers above read it (where, how, whether the request may have reached the backend) in
//! `failure.rs`; the connection (`conn.rs`), the duplex write (`duplex.rs`), response framing
//! (`framing/`), TLS (`tls.rs`, with the settings config validates into), hop-by-hop fields
//! (`hop.rs`) and a proxied request's exchange (`exchange.rs`) have files of their own.
//!
//! Measured against hyper's client on 2026-12-01 with `benches/load/instructions.sh`
//! (callgrind, proxy instructions per request, release builds): a chat 36,330 before TLS
//! (6a3bbfb), 36,175 with it (595b973), 56,595 with plain http through hyper-util's legacy
//! client instead of this pool; a 200-event stream 387,503 / 388,843 / 1,164,266. Kept: this.

mod body;
mod conn;
mod duplex;
mod error;
pub mod exchange;
pub mod failure;
mod framing;
mod hop;
mod pool;
mod request;
pub mod tls;
pub mod watch;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::{header, HeaderMap, HeaderValue};

use tls::{BackendTls, TlsSettings};
use watch::ConnWatch;

#[cfg(test)]
pub(crate) use body::TooLong;
pub use body::{read_all, read_within, Held, UpstreamBody, UpstreamResponse, SMALL_ANSWER_LIMIT};
pub(crate) use error::is_malformed;
pub(crate) use error::Malformed;
pub use error::{chain, BoxError, SendError};
pub use framing::FramingError;

/// A backend answer's body as it arrives: its bytes, or why they stopped.
pub type BodyStream = futures_util::stream::BoxStream<'static, Result<bytes::Bytes, BoxError>>;
pub(crate) use pool::{Pool, Target};

use switchboard_wire::payload::Payload;

/// A backend as the client reaches it: the client's settings of one backend, borrowed from
/// wherever the caller keeps them (no copy per request).
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    /// The backend's config name: what its TLS settings are found by, and what a failure names.
    pub name: &'a str,
    /// `host:port`: what is connected to and sent as `Host`.
    pub authority: &'a str,
    /// The URL's path, put before every request path (empty for a server root).
    pub path_prefix: &'a str,
    /// https: a TLS session is opened over the TCP connection.
    pub tls: bool,
    /// The backend's own connect timeout; `None`: the pool's.
    pub connect: Option<Duration>,
    /// The backend's own `Authorization` value, sent in place of any other.
    pub auth: Option<&'a HeaderValue>,
}

impl<'a> Origin<'a> {
    /// `path` under the backend's path prefix.
    pub(crate) fn path<'p>(&self, path: &'p str) -> std::borrow::Cow<'p, str> {
        if self.path_prefix.is_empty() {
            std::borrow::Cow::Borrowed(path)
        } else {
            std::borrow::Cow::Owned(format!("{}{path}", self.path_prefix))
        }
    }

    /// Where the pool sends its requests: over `tls` (its loaded settings, for https), its
    /// connections told to `watch`.
    pub(crate) fn target<'t>(
        &self,
        tls: Option<&'t BackendTls>,
        watch: Option<&'t Arc<ConnWatch>>,
    ) -> Target<'t>
    where
        'a: 't,
    {
        Target {
            authority: self.authority,
            tls,
            connect: self.connect,
            watch,
        }
    }
}

/// The one client to the backends: a worker's pool, and the TLS settings of the live config's
/// https backends (shared by every worker, replaced on reload).
#[derive(Clone, Debug)]
pub struct Client {
    pool: Arc<Pool>,
    tls: Arc<ArcSwap<TlsSettings>>,
}

impl Default for Client {
    /// A client with the default connect timeout and no https backends (tests, tools).
    fn default() -> Client {
        Client::new(Duration::from_secs(3), TlsSettings::default())
    }
}

impl Client {
    pub fn new(connect_timeout: Duration, tls: TlsSettings) -> Client {
        Client {
            pool: Arc::new(Pool::new(connect_timeout)),
            tls: Arc::new(ArcSwap::from_pointee(tls)),
        }
    }

    /// A client with a pool of its own (one per worker thread, so each worker's connections
    /// live on its own runtime) and the same TLS settings.
    pub fn for_worker(&self) -> Client {
        Client {
            pool: Arc::new(Pool::new(self.pool.connect_timeout)),
            tls: Arc::clone(&self.tls),
        }
    }

    /// Use `tls` for new connections from now on (a reload).
    pub fn set_tls(&self, tls: TlsSettings) {
        self.tls.store(Arc::new(tls));
    }

    /// This worker's pool.
    pub(crate) fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The TLS settings `to` is reached with: `None` for plain http (no lookup), an error
    /// for an https backend whose settings did not load.
    fn tls_for(&self, to: Origin<'_>) -> Result<Option<Arc<BackendTls>>, SendError> {
        if to.tls {
            self.tls_of(to).map(Some)
        } else {
            Ok(None)
        }
    }

    /// POST `body` to `path` (under the prefix) of `to`, with its key; resolves with the
    /// response head ([`Pool::post`]).
    pub async fn post(
        &self,
        to: Origin<'_>,
        path: &str,
        mut headers: HeaderMap,
        body: Payload,
    ) -> Result<UpstreamResponse, SendError> {
        if let Some(auth) = to.auth {
            headers.insert(header::AUTHORIZATION, auth.clone());
        }
        let path = to.path(path);
        let tls = self.tls_for(to)?;
        self.pool
            .post(
                to.target(tls.as_deref(), None),
                &path,
                headers,
                body,
                &mut false,
            )
            .await
    }

    /// GET `path` (under the prefix) of `to`, with its key and no other field, the head within
    /// `wait` ([`Pool::get`]).
    pub async fn get(
        &self,
        to: Origin<'_>,
        path: &str,
        wait: Duration,
    ) -> Result<UpstreamResponse, SendError> {
        let mut headers = HeaderMap::new();
        if let Some(auth) = to.auth {
            headers.insert(header::AUTHORIZATION, auth.clone());
        }
        let path = to.path(path);
        let tls = self.tls_for(to)?;
        self.pool
            .get(to.target(tls.as_deref(), None), &path, &headers, wait)
            .await
    }

    fn tls_of(&self, to: Origin<'_>) -> Result<Arc<BackendTls>, SendError> {
        self.tls.load().get(to.name).cloned().ok_or_else(|| {
            SendError::Tls("no TLS settings are loaded for this backend (see its ca_file)".into())
        })
    }
}
