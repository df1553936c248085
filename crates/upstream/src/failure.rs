//! A failed exchange with a backend as the layers above read it: where it failed (connecting,
//! writing the request, awaiting the answer's head, reading its body), how (no connection, TLS,
//! the connection broken, HTTP/1.1 broken, a limit run out, the proxy's own want of
//! descriptors), and whether the request may have reached the backend. Resending, fallbacks,
//! the breaker and the metrics' reason read these facts; the client's [`ProxyError`] is made
//! from them here, in [`UpstreamError::to_client`], and nowhere else.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelValue;

use super::{chain, is_malformed, SendError};
use switchboard_wire::error::ProxyError;

/// Why an upstream exchange failed.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum UpstreamReason {
    connect,
    timeout,
    status_5xx,
    /// The answer's body broke off (the connection cut or reset).
    stream_broken,
    /// The backend's answer breaks HTTP/1.1: a malformed head, chunk or trailer.
    protocol,
    /// An answer to be held whole, or one stream event, longer than the proxy holds.
    too_large,
}

/// Where in the exchange it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Opening the connection (TCP, then TLS), or before the kernel took a byte of the request.
    Connect,
    /// Sending the request, some of it taken.
    Write,
    /// Awaiting or reading the answer's head, the request sent.
    Head,
    /// Reading the answer's body, its head received.
    Body,
}

/// A limit that ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// The backend's `connect_timeout_ms`.
    Connect,
    /// `header_timeout_secs` (the first byte of the answer, its head).
    FirstByte,
    /// `stream_idle_timeout_ms` between two pieces of the body.
    Idle,
    /// `total_timeout_secs` for the whole exchange.
    Total,
}

/// How it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// No connection: refused or unreachable, or a new connection that took nothing.
    Unreachable,
    /// The TLS handshake failed, or the backend's TLS settings did not load.
    Tls,
    /// The connection closed, reset or failed.
    Broken,
    /// The backend's answer breaks HTTP/1.1 (a malformed head, chunk or trailer).
    Malformed,
    /// A limit ran out.
    TimedOut(Limit),
    /// The proxy could not open a socket (out of file descriptors): nothing is said of the
    /// backend.
    Local,
}

/// A failed exchange with one backend.
#[derive(Debug)]
pub struct UpstreamError {
    /// The backend's config name.
    pub backend: String,
    pub stage: Stage,
    pub kind: Kind,
    /// Some of the request may have reached the backend (false: certainly none did).
    pub reached: bool,
    /// What went wrong, naming no address.
    pub detail: String,
    /// The limit that ran out, or the time waited.
    pub elapsed: Duration,
}

impl UpstreamError {
    /// An exchange that got no answer head: the pool's `e`, whether a byte of the request may
    /// have reached the backend, and how long it waited.
    pub fn unanswered(backend: &str, e: SendError, reached: bool, waited: Duration) -> Self {
        let detail = e.to_string();
        let (stage, kind, reached) = match e {
            SendError::Connect(_) => (Stage::Connect, Kind::Unreachable, false),
            SendError::ConnectTimeout => (Stage::Connect, Kind::TimedOut(Limit::Connect), false),
            SendError::Unsent(_) => (Stage::Connect, Kind::Unreachable, false),
            SendError::Tls(_) => (Stage::Connect, Kind::Tls, false),
            SendError::Local(_) => (Stage::Connect, Kind::Local, false),
            SendError::Write(_) => (Stage::Write, Kind::Broken, reached),
            SendError::Head(_) => (Stage::Head, Kind::Broken, reached),
            SendError::Malformed(_) => (Stage::Head, Kind::Malformed, reached),
            // The first-byte limit covers the whole wait for a head: with nothing of the
            // request taken yet, it ran out while connecting.
            SendError::Timeout if reached => (Stage::Head, Kind::TimedOut(Limit::FirstByte), true),
            SendError::Timeout => (Stage::Connect, Kind::TimedOut(Limit::FirstByte), false),
        };
        UpstreamError {
            backend: backend.to_string(),
            stage,
            kind,
            reached,
            detail,
            elapsed: waited,
        }
    }

    /// The one classifier of a body that failed after its head, whole or streamed: `limit`
    /// when a body limit ran out (after `elapsed`), else HTTP/1.1 broken or the connection.
    pub fn body(
        backend: &str,
        e: &(dyn std::error::Error + 'static),
        limit: Option<(Limit, Duration)>,
    ) -> Self {
        let (kind, elapsed) = match limit {
            Some((limit, after)) => (Kind::TimedOut(limit), after),
            None if is_malformed(e) => (Kind::Malformed, Duration::ZERO),
            None => (Kind::Broken, Duration::ZERO),
        };
        UpstreamError {
            backend: backend.to_string(),
            stage: Stage::Body,
            kind,
            reached: true,
            detail: format!("stream broken: {}", chain(e)),
            elapsed,
        }
    }

    /// The backend took (some of) the request and hung up without a byte of answer: killed
    /// mid-request, or refusing this request by closing. The request may be the cause, so it
    /// is not held against the backend; where resending is allowed it goes on once.
    pub fn dropped(&self) -> bool {
        self.reached
            && self.kind == Kind::Broken
            && matches!(self.stage, Stage::Write | Stage::Head)
    }

    /// The request may be running on the backend, which gave no answer head: it goes nowhere
    /// else (but for a [`dropped`](Self::dropped) one, resent once where allowed).
    pub fn held_by_backend(&self) -> bool {
        self.reached && self.stage != Stage::Body
    }

    /// What the backend did on its own, as its breaker counts it: all but the proxy's own want
    /// of descriptors and a hang-up on a request it took.
    pub fn counts_against_backend(&self) -> bool {
        self.kind != Kind::Local && !self.dropped()
    }

    /// A limit other than the connect timeout ran out (the fallback's and metric's `timeout`).
    pub fn timed_out(&self) -> bool {
        matches!(self.kind, Kind::TimedOut(l) if l != Limit::Connect)
    }

    /// The `reason` label of `switchboard_upstream_errors_total`; `None`: not the backend's.
    pub fn reason(&self) -> Option<UpstreamReason> {
        Some(match self.kind {
            Kind::Local => return None,
            Kind::Malformed => UpstreamReason::protocol,
            _ if self.timed_out() => UpstreamReason::timeout,
            Kind::Broken if self.stage == Stage::Body => UpstreamReason::stream_broken,
            Kind::Unreachable | Kind::Tls | Kind::Broken | Kind::TimedOut(_) => {
                UpstreamReason::connect
            }
        })
    }

    /// What the client is told: the one place a failed exchange becomes a [`ProxyError`].
    pub fn to_client(&self) -> ProxyError {
        let backend = self.backend.clone();
        let detail = self.detail.clone();
        match self.kind {
            Kind::Unreachable | Kind::TimedOut(Limit::Connect) => {
                ProxyError::UpstreamConnect { backend }
            }
            Kind::Tls => ProxyError::UpstreamTls { backend, detail },
            Kind::Broken => ProxyError::UpstreamProtocol { backend, detail },
            Kind::Malformed => ProxyError::UpstreamMalformed { backend, detail },
            Kind::TimedOut(_) => ProxyError::UpstreamTimeout {
                backend,
                elapsed: self.elapsed,
            },
            Kind::Local => ProxyError::ProxyExhausted { detail },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Malformed;
    use crate::framing::FramingError;
    use crate::BoxError;

    fn unanswered(e: SendError, reached: bool) -> UpstreamError {
        UpstreamError::unanswered("b", e, reached, Duration::from_secs(1))
    }

    #[test]
    fn a_failed_connection_never_reached_the_backend() {
        for e in [
            SendError::Connect("refused".into()),
            SendError::ConnectTimeout,
            SendError::Unsent("reset".into()),
            SendError::Tls("bad certificate".into()),
        ] {
            let e = unanswered(e, true);
            assert_eq!(e.stage, Stage::Connect);
            assert!(!e.reached && !e.held_by_backend() && !e.dropped());
            assert!(e.counts_against_backend());
            assert_eq!(e.reason(), Some(UpstreamReason::connect));
        }
    }

    #[test]
    fn a_hang_up_after_the_request_is_dropped_not_the_backends_failure() {
        for e in [
            SendError::Write("reset".into()),
            SendError::Head("closed".into()),
        ] {
            let e = unanswered(e, true);
            assert!(e.dropped() && e.held_by_backend());
            assert!(!e.counts_against_backend());
            assert_eq!(e.reason(), Some(UpstreamReason::connect));
        }
    }

    #[test]
    fn a_head_timeout_after_the_request_is_held_and_counted() {
        let e = unanswered(SendError::Timeout, true);
        assert_eq!(
            (e.stage, e.kind),
            (Stage::Head, Kind::TimedOut(Limit::FirstByte))
        );
        assert!(e.held_by_backend() && !e.dropped() && e.counts_against_backend());
        assert_eq!(e.reason(), Some(UpstreamReason::timeout));
        assert!(matches!(e.to_client(), ProxyError::UpstreamTimeout { .. }));
    }

    #[test]
    fn the_proxys_want_of_descriptors_says_nothing_of_the_backend() {
        let e = unanswered(SendError::Local("EMFILE".into()), false);
        assert!(!e.counts_against_backend());
        assert_eq!(e.reason(), None);
        assert!(matches!(e.to_client(), ProxyError::ProxyExhausted { .. }));
    }

    #[test]
    fn a_failed_body_is_classified_by_what_broke() {
        let cut: BoxError = "connection reset".into();
        let e = UpstreamError::body("b", cut.as_ref(), None);
        assert_eq!((e.stage, e.kind), (Stage::Body, Kind::Broken));
        assert!(!e.held_by_backend() && !e.dropped() && e.counts_against_backend());
        assert_eq!(e.reason(), Some(UpstreamReason::stream_broken));
        let bad: BoxError = Box::new(Malformed(FramingError::ChunkSize));
        let e = UpstreamError::body("b", bad.as_ref(), None);
        assert_eq!(e.reason(), Some(UpstreamReason::protocol));
        assert!(matches!(
            e.to_client(),
            ProxyError::UpstreamMalformed { .. }
        ));
        let idle = UpstreamError::body("b", cut.as_ref(), Some((Limit::Idle, Duration::ZERO)));
        assert_eq!(idle.reason(), Some(UpstreamReason::timeout));
    }
}
