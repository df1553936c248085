//! Send: the client's headers made the backend's, the body posted to the chosen replica, the
//! answer's head awaited (within the first-byte limit), its body bounded by the idle and total
//! limits. A failure before any byte of the answer could reach the client is handed back: one
//! before any byte of the request could reach the backend, or a 5xx answer, can go on to the
//! next replica or fallback; once the backend may have the request, it is sent nowhere else,
//! but a connection the backend closed or reset without a byte of answer (a backend killed
//! mid-request) may send it on once ([`Failed::Dropped`]; a timeout or a malformed answer
//! never does). The proxy's own want of file descriptors is no failure of the backend's.

use std::time::Instant;

use axum::http::{HeaderMap, StatusCode};
use futures_util::StreamExt;

use super::deadline;
use crate::config::{Alias, Backend};
use crate::error::ProxyError;
use crate::fleet::routes::FallbackReason;
use crate::live::{AppState, Snapshot};
use crate::observe::record::Record;
use crate::upstream::exchange::{self, Answer, Held, UpstreamReason};
use crate::wire::payload::Payload;

/// An exchange that gave the client nothing yet, and why.
pub enum Failed {
    /// No answer head, and not a byte of the request reached the backend: refused, not
    /// delivered, a failed TLS handshake, timed out while connecting.
    Error(ProxyError, FallbackReason),
    /// No answer head, and some of the request may have reached the backend (a malformed
    /// head, no head in time): the client's answer, as the backend may be running the request.
    Delivered(ProxyError),
    /// The backend closed or reset the connection after taking some of the request, without a
    /// byte of answer: killed mid-request, or refusing this request by hanging up. Not the
    /// backend's failure for its breaker (the request may be the cause; a backend that is
    /// gone fails its next connection and its probe); sent on once where resending is allowed.
    Dropped(ProxyError),
    /// The proxy itself is out of file descriptors: nothing is said of the backend, and no
    /// other backend would fare better now.
    Local(ProxyError),
    /// A 5xx answer, its body read whole (it is the client's answer if nothing else serves).
    Answer(Answer, FallbackReason),
}

impl Failed {
    pub fn reason(&self) -> FallbackReason {
        match self {
            Failed::Error(_, why) | Failed::Answer(_, why) => *why,
            Failed::Delivered(e) => match exchange::reason_of(e) {
                Some(UpstreamReason::timeout) => FallbackReason::timeout,
                _ => FallbackReason::connect,
            },
            Failed::Dropped(_) | Failed::Local(_) => FallbackReason::connect,
        }
    }
}

/// Post `body` to `backend` (a replica of `alias`) at `path`; failures are counted by reason.
#[allow(clippy::too_many_arguments)]
pub async fn send(
    state: &AppState,
    snap: &Snapshot,
    rec: &mut Record,
    headers: HeaderMap,
    path: &str,
    alias: &Alias,
    backend: &Backend,
    body: Payload,
) -> Result<Answer, Failed> {
    let server = &snap.config.server;
    let m = snap.metrics(Some(&alias.name));
    let mut headers = exchange::upstream_headers(headers, backend, snap.clients.closed());
    if let Some(t) = rec.trace.as_deref() {
        t.inject(&mut headers);
    }
    let limits = backend.timeouts;
    let started = Instant::now();
    rec.sending();
    let sent = exchange::send(
        &state.client,
        backend,
        path,
        headers,
        body,
        limits.first_byte.min(limits.total),
    )
    .await;
    let mut answer = match sent {
        Ok(a) => a,
        Err(exchange::Unanswered { error, reached }) => {
            if matches!(error, ProxyError::ProxyExhausted { .. }) {
                return Err(Failed::Local(error));
            }
            let reason = exchange::reason_of(&error);
            if let Some(reason) = reason {
                m.upstream_error(reason);
            }
            if reached && matches!(error, ProxyError::UpstreamProtocol { .. }) {
                return Err(Failed::Dropped(error));
            }
            if reached {
                return Err(Failed::Delivered(error));
            }
            let why = match reason {
                Some(UpstreamReason::timeout) => FallbackReason::timeout,
                _ => FallbackReason::connect,
            };
            return Err(Failed::Error(error, why));
        }
    };
    rec.headers_received();
    answer.body = deadline::bounded(answer.body, limits.idle, started, limits.total);
    if answer.status.is_server_error() {
        m.upstream_error(UpstreamReason::status_5xx);
        return Err(failed_answer(answer, backend, server.answer_limit).await);
    }
    Ok(answer)
}

/// A 5xx answer read whole: a loading 503 or another server error (past `limit` bytes, one
/// passed on as it comes).
async fn failed_answer(mut answer: Answer, backend: &Backend, limit: usize) -> Failed {
    match exchange::read_within(answer.body, limit).await {
        Ok(Held::Over(rest)) => {
            answer.body = rest;
            Failed::Answer(answer, FallbackReason::status_5xx)
        }
        Ok(Held::Whole(bytes)) => {
            let why = if answer.status == StatusCode::SERVICE_UNAVAILABLE && is_loading(&bytes) {
                FallbackReason::loading
            } else {
                FallbackReason::status_5xx
            };
            answer.body = futures_util::stream::once(async move { Ok(bytes) }).boxed();
            Failed::Answer(answer, why)
        }
        Err(e) => Failed::Error(
            ProxyError::UpstreamProtocol {
                backend: backend.name.clone(),
                detail: crate::upstream::chain(e.as_ref()),
            },
            FallbackReason::status_5xx,
        ),
    }
}

/// A backend 503 that means "still loading": llama.cpp's "Loading model", or the empty 503 of
/// SGLang starting up. Other 503s (overload, an unhealthy engine) pass through as they are.
pub fn is_loading(body: &[u8]) -> bool {
    body.iter().all(u8::is_ascii_whitespace)
        || memchr::memmem::find(&body.to_ascii_lowercase(), b"loading").is_some()
}
