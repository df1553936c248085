//! Request handlers: the routed POST flow, `/v1/models`, `/metrics`, `/health` and the fallbacks.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::json;

use crate::config::Alias;
use crate::error::ProxyError;
use crate::exchange::Exchange;
use crate::health::state_name;
use crate::metrics::{Endpoint, UpstreamReason};
use crate::openai::ParsedRequest;
use crate::reasoning::{self, InputField, OutputField, StreamRewriter};
use crate::state::{AppState, Snapshot};
use crate::stream::{self, RelayOptions};

const REQUEST_ID: &str = "x-request-id";
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

/// The request id: the client's `x-request-id` when it sent a sane one, else a new one.
fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map(String::from)
        .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()))
}

/// Clients must present one of the configured keys, when keys are configured.
fn authorize(snap: &Snapshot, headers: &HeaderMap) -> Result<(), ProxyError> {
    let Some(keys) = &snap.config.server.api_keys else {
        return Ok(());
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(k) if keys.iter().any(|key| key == k) => Ok(()),
        _ => Err(ProxyError::Unauthorized),
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), ProxyError> {
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or_default();
    let essence = ct
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if essence == "application/json" || essence.ends_with("+json") {
        Ok(())
    } else {
        Err(ProxyError::UnsupportedContentType(ct.to_string()))
    }
}

async fn read_body(body: Body, limit: usize, headers: &HeaderMap) -> Result<Bytes, ProxyError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(ProxyError::PayloadTooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(ProxyError::PayloadTooLarge { limit })
        }
        Err(e) => Err(ProxyError::InvalidRequest(format!(
            "failed to read the request body: {e}"
        ))),
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
    let alias: &Alias = &route.alias;
    let backend = &alias.backend;
    let m = snap.metrics(Some(&alias.name));
    ex.route(m, &backend.name);

    let output = output_field(&headers, alias, snap)?;
    let is_chat = endpoint_is_chat(path);
    let mut upstream_body = req.upstream_body(&body, &alias.upstream_model, true);
    if is_chat {
        if let Some(b) = reasoning::rewrite_request_history(
            &upstream_body,
            InputField::for_flavor(backend.flavor),
        ) {
            upstream_body = b;
        }
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
        let body = stream::relay(resp, ex.take(), permit, opts);
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

fn endpoint_is_chat(path: &str) -> bool {
    path.split('?').next() == Some("/v1/chat/completions")
}

fn model_entry(state: &AppState, alias: &Alias) -> serde_json::Value {
    let mut v = json!({
        "id": alias.name,
        "object": "model",
        "created": state.started,
        "owned_by": "switchboard",
        "backend": alias.backend.name,
        "flavor": alias.backend.flavor.as_str(),
        "status": state_name(state.health.get(&alias.backend.name)),
    });
    if let Some(w) = alias.context_window {
        v["context_length"] = json!(w.get());
        v["max_model_len"] = json!(w.get());
    }
    if let Some(d) = &alias.description {
        v["description"] = json!(d);
    }
    v
}

/// `GET /v1/models`: every alias (old names are not listed).
pub async fn models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let snap = state.live.load_full();
    if let Err(e) = authorize(&snap, &headers) {
        return e.into_response();
    }
    let data: Vec<_> = snap
        .routes
        .aliases()
        .iter()
        .map(|a| model_entry(&state, a))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// `GET /v1/models/{id}`: one alias, by its name or an old name.
pub async fn model(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let snap = state.live.load_full();
    if let Err(e) = authorize(&snap, &headers) {
        return e.into_response();
    }
    match snap.routes.resolve(&id) {
        Some(r) => Json(model_entry(&state, &r.alias)).into_response(),
        None => ProxyError::ModelNotFound {
            model: id,
            known: snap.routes.known(),
        }
        .into_response(),
    }
}

/// `GET /metrics`: OpenMetrics when the scraper asks for it, else Prometheus text.
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let (ct, body) = if openmetrics {
        (
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            state.metrics.render(true),
        )
    } else {
        (
            "text/plain; version=0.0.4; charset=utf-8",
            state.metrics.render(false),
        )
    };
    ([(header::CONTENT_TYPE, ct)], body).into_response()
}

/// `GET /health`: the proxy itself is up.
pub async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// Any other path or method.
pub async fn not_found(OriginalUri(uri): OriginalUri, method: axum::http::Method) -> Response {
    ProxyError::NotFound {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
    .into_response()
}
