//! Respond: the backend's answer made the client's — a stream relayed event by event, or a whole
//! answer read, its context and loading errors made canonical, its reasoning normalized.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;

use super::call::Call;
use super::call::Routed;
use super::choose::Chosen;
use super::peek;
use super::relay::{self, RelayOptions};
use super::send::{body_failed, is_loading};
use crate::config::Alias;
use crate::error::ProxyError;
use crate::fleet::breaker::{Outcome, Tally};
use crate::fleet::slots::SlotPermit;
use crate::guard;
use crate::live::alias::{LiveAlias, Replica};
use crate::observe::metrics::CountMethod;
use crate::upstream::exchange::{self, Answer, Held};
use crate::upstream::failure::UpstreamReason;
use crate::upstream::{BodyStream, BoxError};
use crate::wire::{Adapter, ApiEvents, StreamContext};

const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");
const SERVED_ALIAS: HeaderName = HeaderName::from_static("x-switchboard-alias");

/// What the answer is for: the alias that served it and its replica that answered, its slot,
/// the word to that replica's breaker.
pub(crate) struct Served {
    pub(crate) alias: Arc<LiveAlias>,
    /// The replica that answered.
    pub(crate) replica: Arc<Replica>,
    pub(crate) slot: Option<SlotPermit>,
    /// What is left to tell the breaker: how the body ends (the head was told).
    pub(crate) tally: Tally,
    /// The client's API when the request was translated to chat completions: the answer is a
    /// chat answer.
    pub(crate) translated: Option<&'static dyn Adapter>,
}

impl Served {
    /// The answer of `chosen`, a replica of `alias`, whose head was not a 5xx.
    pub(crate) fn new(alias: Arc<LiveAlias>, chosen: Chosen) -> Served {
        Served {
            alias,
            replica: chosen.replica,
            slot: Some(chosen.slot),
            tally: chosen.tally,
            translated: None,
        }
    }

    /// A failed answer of replica `index` of `alias` given to the client as it is (its slot
    /// long freed, its breaker told).
    pub(crate) fn unsettled(alias: Arc<LiveAlias>, index: usize) -> Served {
        Served {
            replica: Arc::clone(&alias.replicas[index]),
            alias,
            slot: None,
            tally: Tally::default(),
            translated: None,
        }
    }

    /// The same, for a request that was translated to chat completions for `api`.
    pub(crate) fn translated(mut self, api: Option<&'static dyn Adapter>) -> Served {
        self.translated = api;
        self
    }
}

/// What an answer's transforms are built from.
fn context(routed: &Routed, alias: &Alias) -> StreamContext {
    StreamContext {
        output: routed.output,
        tags: alias.think_tags.clone(),
        model: routed.view.model.clone(),
    }
}

/// The stream's handling of whole events: the translation from chat of a translated request,
/// else the API's own (none for chat, whose events the relay reads itself).
fn events(call: &Call<'_>, served: &Served) -> Option<Box<dyn ApiEvents>> {
    let ctx = context(&call.routed, &served.alias.spec);
    match served.translated {
        Some(_) => call.req.adapter.stream_from_chat(&ctx),
        None => call.req.adapter.stream_events(&ctx),
    }
}

/// The client's answer to `answer`.
pub(crate) async fn respond(
    call: &mut Call<'_>,
    served: Served,
    answer: Answer,
) -> Result<Response, ProxyError> {
    let is_sse = answer
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let status = answer.status;
    let headers = answer_headers(answer.headers, &served.alias.spec, &call.routed);
    if is_sse && status.is_success() {
        stream(call, served, status, headers, answer.body).await
    } else {
        whole(call, served, status, headers, answer.body).await
    }
}

/// The backend's headers without hop-by-hop fields, plus the alias that served the answer
/// and, for an old name, `Deprecation` and the successor's `Link`.
fn answer_headers(upstream: HeaderMap, alias: &Alias, routed: &Routed) -> HeaderMap {
    let mut headers = exchange::client_headers(upstream);
    headers.insert(SERVED_ALIAS, alias.served_as.clone());
    if let Some(old) = &routed.route.deprecated_name {
        headers.insert("deprecation", HeaderValue::from_static("true"));
        let link = format!("</v1/models/{}>; rel=\"successor-version\"", alias.name);
        if let Ok(v) = HeaderValue::from_str(&link) {
            headers.insert(header::LINK, v);
        }
        tracing::debug!(old = %old, alias = %alias.name, "request used an old model name");
    }
    headers
}

/// A runtime that puts a context error inside a 200 stream (SGLang): the answering replica's
/// first event is read before the head goes out. The pieces read (to be sent first), or that
/// error.
async fn peeked(
    call: &Call<'_>,
    served: &Served,
    upstream: &mut BodyStream,
) -> Result<Vec<Result<Bytes, BoxError>>, ProxyError> {
    if !served
        .replica
        .backend
        .flavor
        .runtime()
        .errors_in_first_event
    {
        return Ok(Vec::new());
    }
    let server = &call.snap.config.server;
    let window = served.alias.spec.context_window.map_or(0, |w| w.get());
    let (read, error) =
        peek::first_event(upstream, server.stream_peek, server.event_limit, window).await;
    match error {
        Some(e) => {
            served.alias.metrics.rejection(CountMethod::backend);
            Err(e)
        }
        None => Ok(read),
    }
}

/// A stream: relayed event by event; the slot is held until it ends or the client goes away.
async fn stream(
    call: &mut Call<'_>,
    served: Served,
    status: StatusCode,
    mut headers: HeaderMap,
    mut upstream: BodyStream,
) -> Result<Response, ProxyError> {
    let read = peeked(call, &served, &mut upstream).await?;
    let events = events(call, &served);
    let Served {
        alias, slot, tally, ..
    } = served;
    let (adapter, routed) = (call.req.adapter, &call.routed);
    headers.insert(X_ACCEL_BUFFERING, HeaderValue::from_static("no"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    call.rec.status = status.as_u16();
    call.rec.responding();
    let view = &routed.view;
    let transform = match events {
        Some(_) => None,
        None => adapter.stream_transform(routed.output, alias.spec.think_tags.clone()),
    };
    let opts = RelayOptions {
        drop_usage_chunk: view.stream
            && !view.client_wants_usage()
            && adapter.spec().takes_stream_usage,
        transform,
        events,
        adapter,
        tally,
        event_limit: call.snap.config.server.event_limit,
    };
    let upstream = if read.is_empty() {
        upstream
    } else {
        futures_util::stream::iter(read).chain(upstream).boxed()
    };
    let body = relay::relay(upstream, call.rec.take(), slot, opts);
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    Ok(r)
}

/// An answer longer than `answer_limit_bytes`: relayed as it comes (the slot held to its end)
/// when nothing rewrites it, else refused.
fn over_limit(
    call: &mut Call<'_>,
    served: Served,
    status: StatusCode,
    headers: HeaderMap,
    rest: BodyStream,
) -> Result<Response, ProxyError> {
    let rec = &mut *call.rec;
    let limit = call.snap.config.server.answer_limit;
    let backend = rec.backend.clone().unwrap_or_default();
    let rewrites = call.req.adapter.spec().rewrites_answers || served.translated.is_some();
    if status.is_success() && rewrites {
        rec.metrics().upstream_error(UpstreamReason::too_large);
        return Err(ProxyError::AnswerTooLarge { backend, limit });
    }
    tracing::warn!(%backend, limit, "answer longer than answer_limit_bytes relayed unread");
    rec.responding();
    let slot = served.slot;
    let rest = rest.map(move |piece| {
        let _held = &slot;
        piece
    });
    let mut r = Response::new(Body::from_stream(rest));
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    Ok(r)
}

/// A whole answer: read, the slot freed, then checked and rewritten.
async fn whole(
    call: &mut Call<'_>,
    mut served: Served,
    status: StatusCode,
    headers: HeaderMap,
    body: BodyStream,
) -> Result<Response, ProxyError> {
    let limit = call.snap.config.server.answer_limit;
    let mut bytes = match exchange::read_within(body, limit).await {
        Ok(Held::Whole(b)) => b,
        Ok(Held::Over(rest)) => return over_limit(call, served, status, headers, rest),
        Err(e) => {
            served.tally.tell(Outcome::Failed);
            return Err(body_failed(call.rec, &e).to_client());
        }
    };
    drop(served.slot.take());
    let (alias, rec) = (&served.alias, &mut *call.rec);
    let backend = || rec.backend.clone().unwrap_or_default();
    if status == StatusCode::SERVICE_UNAVAILABLE && is_loading(&bytes) {
        return Err(ProxyError::UpstreamLoading {
            backend: backend(),
            retry_after: exchange::retry_after(&headers),
        });
    }
    if status.is_client_error() {
        let window = alias.spec.context_window.map_or(0, |w| w.get());
        if let Some(e) = guard::canonical::from_backend_error(status.as_u16(), &bytes, window) {
            alias.metrics.rejection(CountMethod::backend);
            return Err(e);
        }
    }
    if status.is_success() {
        bytes = answer_body(call, &served, bytes)?;
    }
    call.rec.responding();
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    Ok(r)
}

/// A successful whole answer: its usage recorded, then rewritten (reasoning, think tags) or
/// translated from chat; a chat answer that cannot be translated is a malformed answer.
fn answer_body(call: &mut Call<'_>, served: &Served, bytes: Bytes) -> Result<Bytes, ProxyError> {
    let (adapter, rec) = (call.req.adapter, &mut *call.rec);
    super::traced::answer(rec, &bytes);
    if served.translated.is_some() {
        if let Some(u) = crate::wire::usage::of_body(&bytes) {
            rec.usage = Some(u);
        }
        let ctx = context(&call.routed, &served.alias.spec);
        let answer = adapter.answer_from_chat(&bytes, &ctx).map_err(|detail| {
            rec.metrics().upstream_error(UpstreamReason::protocol);
            ProxyError::UpstreamMalformed {
                backend: rec.backend.clone().unwrap_or_default(),
                detail: detail.to_string(),
            }
        })?;
        return Ok(answer.map_or(bytes, Bytes::from));
    }
    if let Some(usage) = adapter.usage_of_answer(&bytes) {
        rec.usage = Some(usage);
    }
    let tags = served.alias.spec.think_tags.as_deref();
    Ok(
        match adapter.rewrite_answer(&bytes, call.routed.output, tags) {
            Some(b) => Bytes::from(b),
            None => bytes,
        },
    )
}
