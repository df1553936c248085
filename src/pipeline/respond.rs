//! Respond: the backend's answer made the client's — a stream relayed event by event, or a whole
//! answer read, its context and loading errors made canonical, its reasoning normalized.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;

use super::choose::Chosen;
use super::peek;
use super::relay::{self, RelayOptions};
use super::resolve::Routed;
use super::send::{body_failed, is_loading};
use crate::config::{Alias, Backend};
use crate::error::ProxyError;
use crate::fleet::breaker::{Outcome, Tally};
use crate::fleet::slots::SlotPermit;
use crate::guard;
use crate::live::Snapshot;
use crate::observe::metrics::CountMethod;
use crate::observe::record::Record;
use crate::upstream::exchange::{self, Answer, Held};
use crate::upstream::failure::UpstreamReason;
use crate::upstream::BodyStream;
use crate::wire::{Adapter, ApiEvents, StreamContext};

const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");
const SERVED_ALIAS: HeaderName = HeaderName::from_static("x-switchboard-alias");

/// What the answer is for: the API, the request, the alias that served it, its slot, the
/// word to the breaker of the backend that answered.
pub struct Served<'a> {
    pub adapter: &'static dyn Adapter,
    pub routed: &'a Routed,
    pub alias: &'a Alias,
    /// The replica that answered.
    pub backend: Arc<Backend>,
    pub slot: Option<SlotPermit>,
    pub tally: Tally,
    /// The client's API when the request was translated to chat completions: the answer is a
    /// chat answer.
    pub translated: Option<&'static dyn Adapter>,
}

impl<'a> Served<'a> {
    /// The answer of `chosen`, whose head was not a 5xx: its breaker counts a success.
    pub fn new(
        adapter: &'static dyn Adapter,
        routed: &'a Routed,
        alias: &'a Alias,
        chosen: Chosen,
    ) -> Served<'a> {
        let mut tally = Tally::new(chosen.pass, chosen.breaker);
        tally.tell(Outcome::Answered);
        Served {
            adapter,
            routed,
            alias,
            backend: chosen.backend,
            slot: chosen.slot,
            tally,
            translated: None,
        }
    }

    /// A failed answer of `backend` given to the client as it is (its slot long freed).
    pub fn unsettled(
        adapter: &'static dyn Adapter,
        routed: &'a Routed,
        alias: &'a Alias,
        backend: Arc<Backend>,
    ) -> Served<'a> {
        Served {
            adapter,
            routed,
            alias,
            backend,
            slot: None,
            tally: Tally::default(),
            translated: None,
        }
    }

    /// The same, for a request that was translated to chat completions for `api`.
    pub fn translated(mut self, api: Option<&'static dyn Adapter>) -> Served<'a> {
        self.translated = api;
        self
    }

    /// What the answer's transforms are built from.
    fn context(&self) -> StreamContext {
        StreamContext {
            output: self.routed.output,
            tags: self.alias.think_tags.clone(),
            model: self.routed.view.model.clone(),
        }
    }

    /// The stream's handling of whole events: the translation from chat of a translated
    /// request, else the API's own (none for chat, whose events the relay reads itself).
    fn events(&self) -> Option<Box<dyn ApiEvents>> {
        let ctx = self.context();
        match self.translated {
            Some(_) => self.adapter.stream_from_chat(&ctx),
            None => self.adapter.stream_events(&ctx),
        }
    }
}

/// The client's answer to `answer`.
pub async fn respond(
    snap: &Snapshot,
    rec: &mut Record,
    served: Served<'_>,
    answer: Answer,
) -> Result<Response, ProxyError> {
    let is_sse = answer
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let status = answer.status;
    let headers = answer_headers(answer.headers, served.alias, served.routed);
    if is_sse && status.is_success() {
        stream(snap, rec, served, status, headers, answer.body).await
    } else {
        whole(snap, rec, served, status, headers, answer.body).await
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

/// A stream: relayed event by event; the slot is held until it ends or the client goes away.
async fn stream(
    snap: &Snapshot,
    rec: &mut Record,
    served: Served<'_>,
    status: StatusCode,
    mut headers: HeaderMap,
    mut upstream: BodyStream,
) -> Result<Response, ProxyError> {
    let events = served.events();
    let Served {
        adapter,
        routed,
        alias,
        backend,
        slot,
        tally,
        ..
    } = served;
    let server = &snap.config.server;
    let mut read = Vec::new();
    // A runtime that puts a context error inside a 200 stream (SGLang): the answering
    // replica's first event is read before the head goes out.
    if backend.flavor.runtime().errors_in_first_event {
        let window = alias.context_window.map_or(0, |w| w.get());
        let (chunks, error) = peek::first_event(
            &mut upstream,
            server.stream_peek,
            server.event_limit,
            window,
        )
        .await;
        if let Some(e) = error {
            snap.metrics(Some(&alias.name))
                .rejection(CountMethod::backend);
            return Err(e);
        }
        read = chunks;
    }
    headers.insert(X_ACCEL_BUFFERING, HeaderValue::from_static("no"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    rec.status = status.as_u16();
    rec.responding();
    let view = &routed.view;
    let transform = match events {
        Some(_) => None,
        None => adapter.stream_transform(routed.output, alias.think_tags.clone()),
    };
    let opts = RelayOptions {
        drop_usage_chunk: view.stream
            && !view.client_wants_usage()
            && adapter.spec().takes_stream_usage,
        transform,
        events,
        adapter,
        tally,
        event_limit: server.event_limit,
    };
    let upstream = if read.is_empty() {
        upstream
    } else {
        futures_util::stream::iter(read).chain(upstream).boxed()
    };
    let body = relay::relay(upstream, rec.take(), slot, opts);
    let mut r = Response::new(body);
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    Ok(r)
}

/// An answer longer than `limit`: relayed as it comes (the slot held to its end) when nothing
/// rewrites it, else refused.
fn over_limit(
    rec: &mut Record,
    served: Served<'_>,
    status: StatusCode,
    headers: HeaderMap,
    rest: BodyStream,
    limit: usize,
) -> Result<Response, ProxyError> {
    let backend = rec.backend.clone().unwrap_or_default();
    if status.is_success()
        && (served.adapter.spec().rewrites_answers || served.translated.is_some())
    {
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
    snap: &Snapshot,
    rec: &mut Record,
    mut served: Served<'_>,
    status: StatusCode,
    headers: HeaderMap,
    body: BodyStream,
) -> Result<Response, ProxyError> {
    let alias = served.alias;
    // Looked up only for a failure to count.
    let m = || snap.metrics(Some(&alias.name));
    let backend = || rec.backend.clone().unwrap_or_default();
    let limit = snap.config.server.answer_limit;
    let mut bytes = match exchange::read_within(body, limit).await {
        Ok(Held::Whole(b)) => b,
        Ok(Held::Over(rest)) => return over_limit(rec, served, status, headers, rest, limit),
        Err(e) => {
            served.tally.tell(Outcome::Failed);
            return Err(body_failed(rec, &e).to_client());
        }
    };
    drop(served.slot.take());
    if status == StatusCode::SERVICE_UNAVAILABLE && is_loading(&bytes) {
        return Err(ProxyError::UpstreamLoading {
            backend: backend(),
            retry_after: exchange::retry_after(&headers),
        });
    }
    if status.is_client_error() {
        let window = alias.context_window.map_or(0, |w| w.get());
        if let Some(e) = guard::canonical::from_backend_error(status.as_u16(), &bytes, window) {
            m().rejection(CountMethod::backend);
            return Err(e);
        }
    }
    if status.is_success() {
        bytes = match answer_body(rec, &served, bytes) {
            Ok(b) => b,
            Err(detail) => {
                m().upstream_error(UpstreamReason::protocol);
                return Err(ProxyError::UpstreamMalformed {
                    backend: rec.backend.clone().unwrap_or_default(),
                    detail,
                });
            }
        };
    }
    rec.responding();
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    *r.headers_mut() = headers;
    Ok(r)
}

/// A successful whole answer: its usage recorded, then rewritten (reasoning, think tags) or
/// translated from chat; what is wrong with a chat answer that cannot be translated.
fn answer_body(rec: &mut Record, served: &Served<'_>, bytes: Bytes) -> Result<Bytes, String> {
    let adapter = served.adapter;
    super::traced::answer(rec, &bytes);
    if served.translated.is_some() {
        if let Some(u) = crate::wire::usage::of_body(&bytes) {
            rec.usage = Some(u);
        }
        return Ok(match adapter.answer_from_chat(&bytes, &served.context())? {
            Some(b) => Bytes::from(b),
            None => bytes,
        });
    }
    if let Some(usage) = adapter.usage_of_answer(&bytes) {
        rec.usage = Some(usage);
    }
    let tags = served.alias.think_tags.as_deref();
    Ok(
        match adapter.rewrite_answer(&bytes, served.routed.output, tags) {
            Some(b) => Bytes::from(b),
            None => bytes,
        },
    )
}
