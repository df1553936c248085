//! The routed POST flow: alias → guard → slot → backend → relay, for every JSON API under `/v1/`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::StreamExt;

use super::intake::{request_id, respond, routed_request};
use crate::config::Alias;
use crate::error::{Echo, ProxyError};
use crate::exchange::Exchange;
use crate::flavor::Flavor;
use crate::guard::{self, Verdict};
use crate::metrics::{CountMethodLabel, Endpoint, UpstreamReason};
use crate::openai::ParsedRequest;
use crate::reasoning::{self, InputField, OutputField, StreamRewriter};
use crate::state::{AppState, Snapshot};
use crate::stream::{self, RelayOptions};
use crate::tokens::Method;
use crate::upstream::BoxError;

const X_ACCEL_BUFFERING: HeaderName = HeaderName::from_static("x-accel-buffering");
const SERVED_ALIAS: HeaderName = HeaderName::from_static("x-switchboard-alias");
const REASONING_FIELD: HeaderName = HeaderName::from_static("x-reasoning-field");

/// The reasoning field this client gets: its header, else the alias's setting, else the server's.
fn output_field(
    headers: &HeaderMap,
    alias: &Alias,
    snap: &Snapshot,
) -> Result<OutputField, ProxyError> {
    match headers.get(REASONING_FIELD) {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                ProxyError::InvalidRequest(format!(
                    "invalid X-Reasoning-Field header {:?}: expected reasoning_content, reasoning or both",
                    Echo::new(&String::from_utf8_lossy(v.as_bytes()))
                ))
            }),
        None => Ok(alias
            .reasoning_field
            .unwrap_or(snap.config.server.reasoning_field)),
    }
}

/// Every JSON POST routed by its `model`: chat, completions, embeddings, responses, messages, …
pub async fn routed_with<B>(state: &AppState, req: Request<B>) -> Response
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    // The request taken whole: its headers move along instead of being copied.
    let (parts, body) = req.into_parts();
    let (uri, headers) = (parts.uri, parts.headers);
    let snap = state.live.load_full();
    // Only a canonical path is classified and forwarded: another spelling of an API's path
    // (`/v1/ch%61t/completions`) would reach that API's handler on the backend unguarded.
    let canonical = crate::path::check(uri.path()).is_ok();
    let endpoint = if canonical {
        Endpoint::from_path(uri.path())
    } else {
        Endpoint::other
    };
    let mut ex = Exchange::start(snap.metrics(None), endpoint, request_id(&headers));
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    let result = if !canonical {
        Err(ProxyError::NotFound {
            method: Echo::new("POST"),
            path: Echo::new(path),
        })
    } else {
        forward(state, &snap, &mut ex, endpoint, path, headers, body).await
    };
    respond(&mut ex, result)
}

async fn forward<B>(
    state: &AppState,
    snap: &Arc<Snapshot>,
    ex: &mut Exchange,
    endpoint: Endpoint,
    path: &str,
    headers: HeaderMap,
    body: B,
) -> Result<Response, ProxyError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let server = &snap.config.server;
    let (body, req, route) = routed_request(snap, &headers, body).await?;
    ex.stream = req.stream;
    ex.route(
        snap.metrics(Some(&route.alias.name)),
        &route.alias.backend.name,
    );
    let is_chat = endpoint == Endpoint::chat_completions;
    let (alias, upstream_body) =
        guarded(state, snap, ex, &req, &body, &route.alias, endpoint).await?;
    let alias: &Alias = &alias;
    let backend = &alias.backend;
    let m = snap.metrics(Some(&alias.name));
    let output = output_field(&headers, alias, snap)?;
    if let Some(spec) = alias
        .guard
        .as_ref()
        .filter(|s| s.counter.kind() == Method::Estimate)
    {
        ex.estimator = Some((
            Arc::clone(&spec.counter),
            crate::tokens::prompt_bytes(&upstream_body),
        ));
    }
    let permit = match snap.slots(&backend.name) {
        Some(slots) => Some(slots.acquire(&alias.name, server.queue_timeout, m).await?),
        None => None,
    };
    let up_headers = crate::proxy::upstream_headers(headers, backend, server.api_keys.is_some());
    ex.sending();
    let resp = crate::proxy::send(
        &state.pool,
        &state.client,
        backend,
        path,
        up_headers,
        Bytes::from(upstream_body),
        server.header_timeout,
        m,
    )
    .await?;
    ex.headers_received();
    let status = resp.status;
    let window = alias.context_window.map_or(0, |w| w.get());
    if status.is_server_error() {
        m.upstream_error(UpstreamReason::status_5xx);
    }
    let is_sse = resp
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut out_headers = crate::proxy::client_headers(resp.headers);
    out_headers.insert(SERVED_ALIAS, alias.served_as.clone());
    if let Some(old) = &route.deprecated_name {
        out_headers.insert("deprecation", HeaderValue::from_static("true"));
        let link = format!("</v1/models/{}>; rel=\"successor-version\"", alias.name);
        if let Ok(v) = HeaderValue::from_str(&link) {
            out_headers.insert(header::LINK, v);
        }
        tracing::debug!(old = %old, alias = %alias.name, "request used an old model name");
    }

    if is_sse && status.is_success() {
        let mut upstream = resp.body;
        let mut read = Vec::new();
        if backend.flavor == Flavor::Sglang {
            // SGLang reports a context overflow inside an HTTP 200 stream: look at the first
            // event before the client's headers are committed.
            let (chunks, error) = peek_first_event(&mut upstream, server.stream_peek, window).await;
            if let Some(e) = error {
                m.rejection(CountMethodLabel::backend);
                return Err(e);
            }
            read = chunks;
        }
        out_headers.insert(X_ACCEL_BUFFERING, HeaderValue::from_static("no"));
        out_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        ex.status = status.as_u16();
        ex.responding();
        let opts = RelayOptions {
            drop_usage_chunk: req.stream && !req.client_wants_usage() && takes_usage(endpoint),
            transform: is_chat.then(|| {
                Box::new(StreamRewriter::new(output, alias.think_tags.clone()))
                    as Box<dyn stream::EventTransform>
            }),
        };
        let upstream = if read.is_empty() {
            upstream
        } else {
            futures_util::stream::iter(read).chain(upstream).boxed()
        };
        let body = stream::relay(upstream, ex.take(), permit, opts);
        let mut r = Response::new(body);
        *r.status_mut() = status;
        *r.headers_mut() = out_headers;
        return Ok(r);
    }

    let bytes = match crate::proxy::read_all(resp.body).await {
        Ok(b) => b,
        Err(e) => {
            m.upstream_error(if crate::upstream::is_malformed(e.as_ref()) {
                UpstreamReason::protocol
            } else {
                UpstreamReason::stream_broken
            });
            return Err(ProxyError::UpstreamProtocol {
                backend: backend.name.clone(),
                detail: crate::upstream::chain(e.as_ref()),
            });
        }
    };
    drop(permit);
    if status == StatusCode::SERVICE_UNAVAILABLE && is_loading(&bytes) {
        return Err(ProxyError::UpstreamLoading {
            backend: backend.name.clone(),
            retry_after: crate::proxy::retry_after(&out_headers),
        });
    }
    if status.is_client_error() {
        if let Some(e) = guard::canonical::from_backend_error(status.as_u16(), &bytes, window) {
            m.rejection(CountMethodLabel::backend);
            return Err(e);
        }
    }
    let mut bytes = bytes;
    if status.is_success() {
        if let Some(usage) = crate::usage::of_body(&bytes) {
            ex.usage = Some(usage);
        }
        if is_chat {
            if let Some(b) =
                reasoning::rewrite_response_body(&bytes, output, alias.think_tags.as_deref())
            {
                bytes = Bytes::from(b);
            }
        }
    }
    ex.responding();
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    *r.headers_mut() = out_headers;
    Ok(r)
}

/// Model rewrite, history normalization and the context guard, following `context_fallback`
/// while the request does not fit. Returns the alias that serves it and the upstream body.
async fn guarded(
    state: &AppState,
    snap: &Snapshot,
    ex: &mut Exchange,
    req: &ParsedRequest,
    body: &[u8],
    first: &Arc<Alias>,
    endpoint: Endpoint,
) -> Result<(Arc<Alias>, Vec<u8>), ProxyError> {
    let is_chat = endpoint == Endpoint::chat_completions;
    let mut alias = Arc::clone(first);
    loop {
        let mut upstream = req.upstream_body(body, &alias.upstream_model, takes_usage(endpoint));
        if !is_chat {
            return Ok((alias, upstream));
        }
        let input = InputField::for_flavor(alias.backend.flavor);
        if let Some(b) = reasoning::rewrite_request_history(&upstream, input) {
            upstream = b;
        }
        let Some(spec) = &alias.guard else {
            return Ok((alias, upstream));
        };
        let verdict = guard::check(spec, &state.client, &upstream).await?;
        match verdict {
            Verdict::Pass { .. } => return Ok((alias, upstream)),
            Verdict::Clamp { max_tokens, .. } => {
                let clamped = guard::clamp_body(&upstream, max_tokens)?;
                return Ok((alias, clamped));
            }
            Verdict::Over { method, .. } => {
                let next = alias
                    .context_fallback
                    .as_deref()
                    .and_then(|f| snap.routes.alias(f))
                    .cloned();
                match next {
                    Some(next) => {
                        ex.route(snap.metrics(Some(&next.name)), &next.backend.name);
                        alias = next;
                    }
                    None => {
                        snap.metrics(Some(&alias.name)).rejection(method.into());
                        return Err(verdict.into_error(spec.window).unwrap_or_else(|| {
                            ProxyError::InvalidRequest("the request does not fit".into())
                        }));
                    }
                }
            }
        }
    }
}

/// A backend 503 that means "still loading": llama.cpp's "Loading model", or the empty 503 of
/// SGLang starting up. Other 503s (overload, an unhealthy engine) pass through as they are.
fn is_loading(body: &[u8]) -> bool {
    body.iter().all(u8::is_ascii_whitespace)
        || memchr::memmem::find(&body.to_ascii_lowercase(), b"loading").is_some()
}

/// Read the stream until its first complete event (or `limit` passes) and say whether that
/// event is a context error. Returns what was read, to be sent on unchanged otherwise.
async fn peek_first_event(
    upstream: &mut futures_util::stream::BoxStream<'static, Result<Bytes, BoxError>>,
    limit: std::time::Duration,
    window: u32,
) -> (Vec<Result<Bytes, BoxError>>, Option<ProxyError>) {
    let mut read = Vec::new();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + limit;
    while let Ok(Some(item)) = tokio::time::timeout_at(deadline, upstream.next()).await {
        let chunk = match &item {
            Ok(c) => c.clone(),
            Err(_) => {
                read.push(item);
                break;
            }
        };
        read.push(item);
        seen.extend_from_slice(&chunk);
        if let Some(data) = stream::first_payload(&seen) {
            return (read, guard::canonical::from_sse_event(data, window));
        }
        if stream::has_complete_event(&seen) {
            break;
        }
    }
    (read, None)
}

/// Whether the endpoint's streams take `stream_options.include_usage`.
fn takes_usage(endpoint: Endpoint) -> bool {
    matches!(endpoint, Endpoint::chat_completions | Endpoint::completions)
}
