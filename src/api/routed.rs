//! The routed POST flow: alias → guard → slot → backend → relay, for every JSON API under `/v1/`.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{OriginalUri, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;

use super::intake::{authorize, check_content_type, read_body, request_id, REQUEST_ID};
use crate::config::Alias;
use crate::error::ProxyError;
use crate::exchange::Exchange;
use crate::flavor::Flavor;
use crate::guard::{self, Verdict};
use crate::metrics::{CountMethodLabel, Endpoint, UpstreamReason};
use crate::openai::ParsedRequest;
use crate::reasoning::{self, InputField, OutputField, StreamRewriter};
use crate::state::{AppState, Snapshot};
use crate::stream::{self, RelayOptions};
use crate::tokens::Method;

const SERVED_ALIAS: &str = "x-switchboard-alias";
const REASONING_FIELD: &str = "x-reasoning-field";

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
                    String::from_utf8_lossy(v.as_bytes())
                ))
            }),
        None => Ok(alias
            .reasoning_field
            .unwrap_or(snap.config.server.reasoning_field)),
    }
}

/// Every JSON POST routed by its `model`: chat, completions, embeddings, responses, messages, …
pub async fn routed(
    State(state): State<AppState>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let snap = state.live.load_full();
    let endpoint = Endpoint::from_path(uri.path());
    let rid = request_id(&headers);
    let mut ex = Exchange::start(snap.metrics(None), endpoint, rid.clone());
    let path = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    let mut resp = match forward(&state, &snap, &mut ex, path, headers, body).await {
        Ok(resp) => resp,
        Err(e) => {
            ex.error = Some(e.to_string());
            e.into_response()
        }
    };
    ex.status = resp.status().as_u16();
    ex.completed = true;
    if let Ok(v) = HeaderValue::from_str(&rid) {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    resp
}

async fn forward(
    state: &AppState,
    snap: &Arc<Snapshot>,
    ex: &mut Exchange,
    path: &str,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ProxyError> {
    authorize(snap, &headers)?;
    check_content_type(&headers)?;
    let server = &snap.config.server;
    let body = read_body(body, server.body_limit, &headers).await?;
    let req = ParsedRequest::parse(&body)?;
    ex.stream = req.stream;
    let route = snap
        .routes
        .resolve(&req.model)
        .ok_or_else(|| ProxyError::ModelNotFound {
            model: req.model.clone(),
            known: snap.routes.known(),
        })?;
    ex.route(
        snap.metrics(Some(&route.alias.name)),
        &route.alias.backend.name,
    );
    let is_chat = endpoint_is_chat(path);
    let (alias, upstream_body) =
        guarded(state, snap, ex, &req, &body, &route.alias, is_chat).await?;
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
    let up_headers = crate::proxy::upstream_headers(&headers, backend);
    ex.sending();
    let resp = crate::proxy::send(
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
    let status = resp.status();
    let window = alias.context_window.map_or(0, |w| w.get());
    if status == StatusCode::SERVICE_UNAVAILABLE {
        return Err(ProxyError::UpstreamLoading {
            backend: backend.name.clone(),
            retry_after: crate::proxy::retry_after(resp.headers()),
        });
    }
    if status.is_server_error() {
        m.upstream_error(UpstreamReason::status_5xx);
    }
    let mut out_headers = crate::proxy::client_headers(resp.headers());
    out_headers.insert(
        SERVED_ALIAS,
        HeaderValue::from_str(&alias.name).unwrap_or(HeaderValue::from_static("invalid")),
    );
    if let Some(old) = &route.deprecated_name {
        out_headers.insert("deprecation", HeaderValue::from_static("true"));
        let link = format!("</v1/models/{}>; rel=\"successor-version\"", alias.name);
        if let Ok(v) = HeaderValue::from_str(&link) {
            out_headers.insert(header::LINK, v);
        }
        tracing::debug!(old = %old, alias = %alias.name, "request used an old model name");
    }
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));

    if is_sse && status.is_success() {
        let mut upstream = resp.bytes_stream().boxed();
        let mut first = None;
        if backend.flavor == Flavor::Sglang {
            // SGLang reports a context overflow inside an HTTP 200 stream: look at the first
            // event before the client's headers are committed.
            if let Ok(chunk) = tokio::time::timeout(server.stream_peek, upstream.next()).await {
                match chunk {
                    Some(Ok(c)) => {
                        let error = stream::first_payload(&c)
                            .and_then(|data| guard::canonical::from_sse_event(data, window));
                        if let Some(e) = error {
                            m.rejection(CountMethodLabel::backend);
                            return Err(e);
                        }
                        first = Some(Ok(c));
                    }
                    other => first = other,
                }
            }
        }
        out_headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
        out_headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        ex.status = status.as_u16();
        ex.responding();
        let opts = RelayOptions {
            drop_usage_chunk: req.stream && !req.client_wants_usage(),
            transform: is_chat.then(|| {
                Box::new(StreamRewriter::new(output, alias.think_tags.clone()))
                    as Box<dyn stream::EventTransform>
            }),
            error_event: None,
        };
        let upstream = match first {
            Some(c) => futures_util::stream::once(async move { c })
                .chain(upstream)
                .boxed(),
            None => upstream,
        };
        let body = stream::relay(upstream, ex.take(), permit, opts);
        let mut r = Response::new(body);
        *r.status_mut() = status;
        *r.headers_mut() = out_headers;
        return Ok(r);
    }

    let bytes = match resp.bytes().await {
        Ok(b) => b,
        Err(e) => {
            m.upstream_error(UpstreamReason::stream_broken);
            return Err(ProxyError::UpstreamProtocol {
                backend: backend.name.clone(),
                detail: crate::proxy::without_url(&e),
            });
        }
    };
    drop(permit);
    if status.is_client_error() {
        if let Some(e) = guard::canonical::from_backend_error(status.as_u16(), &bytes, window) {
            m.rejection(CountMethodLabel::backend);
            return Err(e);
        }
    }
    let mut bytes = bytes;
    if status.is_success() {
        if let Some((usage, _)) = stream::parse_usage(&bytes) {
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
    is_chat: bool,
) -> Result<(Arc<Alias>, Vec<u8>), ProxyError> {
    let mut alias = Arc::clone(first);
    loop {
        let mut upstream = req.upstream_body(body, &alias.upstream_model, true);
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

fn endpoint_is_chat(path: &str) -> bool {
    path.split('?').next() == Some("/v1/chat/completions")
}
