//! The one upstream HTTP/1.1 client, for http and https backends alike: a pool of keep-alive
//! connections (TCP, or TLS over TCP through rustls), each used by one request at a time inside
//! that request's own task. The response head is parsed by `httparse`; the body is decoded
//! straight from the connection's buffer, so every event the backend has already sent comes out
//! of one read as one piece (no per-chunk hand-off). A request the socket does not take at
//! once is written while the answer is read (`duplex`), and one that may have reached the
//! backend is never sent again. One pool per worker thread. Proxied requests, health probes
//! (GET) and backend token counting (POST, whole body) all use it.
//!
//! Here: the [`Client`] and where a backend is reached ([`Origin`]). The pool and the writing
//! of requests are in `pool.rs`, an answer's body and the readers that hold one whole in
//! `body.rs`, the client's errors in `error.rs`, a failed exchange as the layers above read it
//! (where, how, whether the request may have reached the backend) in `failure.rs`; the connection (`conn.rs`), the duplex write
//! (`duplex.rs`), response framing (`framing/`), TLS (`tls.rs`), hop-by-hop fields (`hop.rs`),
//! a proxied request's exchange (`exchange.rs`) and backend counting (`counting.rs`) have
//! files of their own.
//!
//! Measured against hyper's client on 2026-12-01 with `benches/load/instructions.sh`
//! (callgrind, proxy instructions per request, release builds): a chat 36,330 before TLS
//! (6a3bbfb), 36,175 with it (595b973), 56,595 with plain http through hyper-util's legacy
//! client instead of this pool; a 200-event stream 387,503 / 388,843 / 1,164,266. Kept: this.

mod body;
mod conn;
mod counting;
mod duplex;
mod error;
pub(crate) mod exchange;
pub(crate) mod failure;
mod framing;
pub(crate) mod hop;
mod pool;
mod request;
pub(crate) mod tls;
pub(crate) mod watch;

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use http::HeaderMap;

use tls::{BackendTls, TlsSettings};

#[cfg(test)]
pub(crate) use body::TooLong;
pub(crate) use body::{read_all, read_within, Held, UpstreamResponse, SMALL_ANSWER_LIMIT};
pub use error::{chain, is_malformed, BoxError, Malformed, SendError};

/// A backend answer's body as it arrives: its bytes, or why they stopped.
pub(crate) type BodyStream =
    futures_util::stream::BoxStream<'static, Result<bytes::Bytes, BoxError>>;
pub(crate) use pool::{Pool, Target};

use crate::wire::payload::Payload;

/// A backend as the client reaches it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin<'a> {
    /// The backend's config name: what its TLS settings are found by.
    pub(crate) name: &'a str,
    /// `host:port`: what is connected to and sent as `Host`.
    pub(crate) authority: &'a str,
    /// https: a TLS session is opened over the TCP connection.
    pub(crate) tls: bool,
    /// The backend's own connect timeout; `None`: the pool's.
    pub(crate) connect: Option<Duration>,
}

/// The backend as the client reaches it.
impl crate::config::Backend {
    pub(crate) fn origin(&self) -> Origin<'_> {
        Origin {
            name: &self.name,
            authority: &self.authority,
            tls: self.tls.is_some(),
            connect: Some(self.timeouts.connect),
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
    pub(crate) fn new(connect_timeout: Duration, tls: TlsSettings) -> Client {
        Client {
            pool: Arc::new(Pool::new(connect_timeout)),
            tls: Arc::new(ArcSwap::from_pointee(tls)),
        }
    }

    /// A client with a pool of its own (one per worker thread, so each worker's connections
    /// live on its own runtime) and the same TLS settings.
    pub(crate) fn for_worker(&self) -> Client {
        Client {
            pool: Arc::new(Pool::new(self.pool.connect_timeout)),
            tls: Arc::clone(&self.tls),
        }
    }

    /// Use `tls` for new connections from now on (a reload).
    pub(crate) fn set_tls(&self, tls: TlsSettings) {
        self.tls.store(Arc::new(tls));
    }

    /// This worker's pool.
    pub(crate) fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The TLS settings `to` is reached with: `None` for plain http (no lookup), an error
    /// for an https backend whose settings did not load.
    pub(crate) fn tls_for(&self, to: Origin<'_>) -> Result<Option<Arc<BackendTls>>, SendError> {
        if to.tls {
            self.tls_of(to).map(Some)
        } else {
            Ok(None)
        }
    }

    /// POST `body` to `path` of `to`; resolves with the response head ([`Pool::post`]).
    pub(crate) async fn post(
        &self,
        to: Origin<'_>,
        path: &str,
        headers: HeaderMap,
        body: Payload,
    ) -> Result<UpstreamResponse, SendError> {
        let tls = self.tls_for(to)?;
        let target = Target {
            authority: to.authority,
            tls: tls.as_deref(),
            connect: to.connect,
            watch: None,
        };
        self.pool
            .post(target, path, headers, body, &mut false)
            .await
    }

    /// GET `path` of `to`, the head within `wait` ([`Pool::get`]).
    pub(crate) async fn get(
        &self,
        to: Origin<'_>,
        path: &str,
        headers: &HeaderMap,
        wait: Duration,
    ) -> Result<UpstreamResponse, SendError> {
        let tls = self.tls_for(to)?;
        let target = Target {
            authority: to.authority,
            tls: tls.as_deref(),
            connect: to.connect,
            watch: None,
        };
        self.pool.get(target, path, headers, wait).await
    }

    fn tls_of(&self, to: Origin<'_>) -> Result<Arc<BackendTls>, SendError> {
        self.tls.load().get(to.name).cloned().ok_or_else(|| {
            SendError::Tls("no TLS settings are loaded for this backend (see its ca_file)".into())
        })
    }
}
