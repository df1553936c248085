//! What the pool learns of one backend's connections, and counts of them: whether it closes a
//! connection after a streamed answer while announcing keep-alive (llama.cpp's `llama-server`
//! does, after every stream), so that such connections are no longer kept; the requests sent
//! again on a new connection after a kept one was found cut; the connections not kept.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;

/// How a connection ended without a byte of answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// An orderly close (end of file).
    Closed,
    /// A reset: the kernel's `ECONNRESET`, `EPIPE` or `ECONNABORTED`.
    Reset,
}

impl Cut {
    /// The kind of drop of an I/O error, if it is one.
    pub(super) fn of(e: &io::Error) -> Option<Cut> {
        use io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
        matches!(e.kind(), ConnectionReset | BrokenPipe | ConnectionAborted).then_some(Cut::Reset)
    }
}

/// A kept connection found closed within this long of going idle after a streamed answer
/// was closed by the backend at that answer's end, not by its keep-alive timeout (seconds in
/// every server this proxy meets; the pool keeps a connection 3 s at the most).
pub(super) const RIGHT_AFTER: Duration = Duration::from_secs(1);

/// One backend's connection facts and counters (the counters are handles into the metric
/// families of `switchboard_upstream_retries_total` and
/// `switchboard_upstream_connections_not_pooled_total`).
#[derive(Debug, Default)]
pub struct ConnWatch {
    backend: String,
    closes_after_stream: AtomicBool,
    retried_closed: Counter,
    retried_reset: Counter,
    not_pooled_after_stream: Counter,
}

impl ConnWatch {
    /// A watch counting into the given counters: requests sent again after a close, after a
    /// reset; connections not kept after a stream.
    pub fn new(
        backend: &str,
        retried_closed: Counter,
        retried_reset: Counter,
        not_pooled: Counter,
    ) -> Self {
        ConnWatch {
            backend: backend.to_string(),
            closes_after_stream: AtomicBool::new(false),
            retried_closed,
            retried_reset,
            not_pooled_after_stream: not_pooled,
        }
    }

    /// Whether this backend was seen closing a connection right after a streamed answer.
    pub fn closes_after_stream(&self) -> bool {
        self.closes_after_stream.load(Ordering::Relaxed)
    }

    /// A kept connection, last used for a streamed answer, was found closed right after it.
    pub(super) fn closed_after_stream(&self) {
        if !self.closes_after_stream.swap(true, Ordering::Relaxed) {
            tracing::info!(
                backend = %self.backend,
                "the backend closes its connection after a streamed answer: such connections are no longer kept"
            );
        }
    }

    /// A request sent again on a new connection: the kept one was cut before an answer.
    pub(super) fn retried(&self, cut: Cut) {
        match cut {
            Cut::Closed => self.retried_closed.inc(),
            Cut::Reset => self.retried_reset.inc(),
        };
    }

    /// A connection not kept after a streamed answer, as this backend would close it.
    pub(super) fn not_pooled(&self) {
        self.not_pooled_after_stream.inc();
    }

    /// Requests sent again after a close and after a reset (for tests).
    #[cfg(test)]
    pub(crate) fn retries(&self) -> (u64, u64) {
        (self.retried_closed.get(), self.retried_reset.get())
    }

    /// Connections not kept after a stream (for tests).
    #[cfg(test)]
    pub(crate) fn not_pooled_count(&self) -> u64 {
        self.not_pooled_after_stream.get()
    }
}
