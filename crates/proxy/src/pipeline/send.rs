//! Send: the client's headers made the backend's, the body posted to the chosen replica, the
//! answer's head awaited (within the first-byte limit), its body bounded by the idle and total
//! limits. A failure before any byte of the answer could reach the client is handed back: one
//! before any byte of the request could reach the backend, or a 5xx answer, can go on to the
//! next replica or fallback; once the backend may have the request, it is sent nowhere else,
//! but a connection the backend closed or reset without a byte of answer (a backend killed
//! mid-request) may send it on once ([`UpstreamError::dropped`]; a timeout or a malformed
//! answer never does). The proxy's own want of file descriptors is no failure of the
//! backend's. What failed is read from the [`UpstreamError`], never from the client's error.

use std::time::Instant;

use axum::http::{HeaderMap, StatusCode};
use futures_util::StreamExt;

use super::call::Call;
use super::deadline;
use super::shape::Outgoing;
use crate::config::Backend;
use crate::fleet::breaker::Outcome;
use crate::fleet::routes::FallbackReason;
use crate::live::alias::Replica;
use crate::observe::record::Record;
use crate::upstream::exchange::{self, Answer, Held, Outbound};
use crate::upstream::failure::UpstreamReason;
use crate::upstream::failure::{Limit, UpstreamError};
use crate::upstream::BoxError;

/// An exchange that gave the client nothing yet, and why.
pub(crate) enum Failed {
    /// No answer head, or a 5xx whose body broke off: what failed, where, and whether the
    /// request may have reached the backend; the fallback's reason.
    Error(UpstreamError, FallbackReason),
    /// A 5xx answer, its body read whole (it is the client's answer if nothing else serves).
    Answer(Answer, FallbackReason),
}

impl Failed {
    pub(crate) fn reason(&self) -> FallbackReason {
        match self {
            Failed::Error(_, why) | Failed::Answer(_, why) => *why,
        }
    }

    /// The failed exchange; `None` for a 5xx answer.
    pub(crate) fn error(&self) -> Option<&UpstreamError> {
        match self {
            Failed::Error(e, _) => Some(e),
            Failed::Answer(..) => None,
        }
    }

    /// What the backend's breaker is told of it.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            Failed::Error(e, _) if !e.counts_against_backend() => Outcome::Neither,
            Failed::Answer(_, FallbackReason::loading) => Outcome::Neither,
            _ => Outcome::Failed,
        }
    }
}

/// What an attempt's head tells its backend's breaker: an answer that is no 5xx is a
/// success; a failure, what the backend did on its own ([`Failed::outcome`]).
pub(crate) fn outcome(sent: &Result<Answer, Failed>) -> Outcome {
    match sent {
        Ok(_) => Outcome::Answered,
        Err(failed) => failed.outcome(),
    }
}

/// The fallback's reason for a failed exchange: a limit run out, or a connection failing.
fn fallback_reason(e: &UpstreamError) -> FallbackReason {
    if e.timed_out() {
        FallbackReason::timeout
    } else {
        FallbackReason::connect
    }
}

/// The one classifier of an answer's body that failed after its head, whole
/// ([`super::respond`]) or streamed ([`super::relay`]): a body limit run out
/// ([`deadline::Expired`]), HTTP/1.1 broken, or the connection cut; counted by its reason.
pub(crate) fn body_failed(rec: &Record, e: &BoxError) -> UpstreamError {
    let limit = deadline::Expired::of(e).map(|expired| {
        let limit = match expired {
            deadline::Expired::Idle(_) => Limit::Idle,
            deadline::Expired::Total(_) => Limit::Total,
        };
        (limit, expired.limit())
    });
    let backend = rec.backend.as_deref().unwrap_or_default();
    let failed = UpstreamError::body(backend, e.as_ref(), limit);
    if let Some(reason) = failed.reason() {
        rec.metrics().upstream_error(reason);
    }
    failed
}

/// Post `out` to `replica` with the client's `headers`; failures are counted by reason (in
/// the metrics of the alias the record is on).
pub(crate) async fn send(
    call: &mut Call<'_>,
    replica: &Replica,
    headers: HeaderMap,
    out: Outgoing,
) -> Result<Answer, Failed> {
    let (snap, rec) = (call.snap, &mut *call.rec);
    let backend = &*replica.backend;
    let mut headers = exchange::upstream_headers(headers, backend.origin(), snap.clients.closed());
    if let Some(t) = rec.trace.as_deref() {
        t.inject(&mut headers);
    }
    let limits = backend.timeouts;
    let started = Instant::now();
    rec.sending();
    let to = Outbound {
        backend: backend.origin(),
        watch: Some(&replica.conns),
        path_and_query: out.path.unwrap_or(&call.req.path),
        headers,
        body: out.body,
        header_timeout: limits.first_byte.min(limits.total),
    };
    let sent = call.state.post(to).await;
    let mut answer = match sent {
        Ok(a) => a,
        Err(e) => {
            if let Some(reason) = e.reason() {
                rec.metrics().upstream_error(reason);
            }
            let why = fallback_reason(&e);
            return Err(Failed::Error(e, why));
        }
    };
    rec.headers_received();
    answer.body = deadline::bounded(answer.body, limits.idle, started, limits.total);
    if answer.status.is_server_error() {
        rec.metrics().upstream_error(UpstreamReason::status_5xx);
        return Err(failed_answer(answer, backend, snap.config.server.answer_limit).await);
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
        // Not counted again: the 5xx was.
        Err(e) => Failed::Error(
            UpstreamError::body(&backend.name, e.as_ref(), None),
            FallbackReason::status_5xx,
        ),
    }
}

/// A backend 503 that means "still loading": llama.cpp's "Loading model", or the empty 503 of
/// SGLang starting up. Other 503s (overload, an unhealthy engine) pass through as they are.
pub(crate) fn is_loading(body: &[u8]) -> bool {
    body.iter().all(u8::is_ascii_whitespace)
        || memchr::memmem::find(&body.to_ascii_lowercase(), b"loading").is_some()
}
