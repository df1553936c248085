//! Handlers of the fixed routes: `/v1/models`, `/metrics`, `/health`, and the 404 of the rest.

use axum::extract::{OriginalUri, Path, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::config::Alias;
use crate::error::{Echo, ProxyError};
use crate::live::{AppState, Snapshot};

use super::intake;
use super::routed::{is_routed, routed_with};

/// A shown state's rank for an alias, best first: the best of its replicas is the alias's.
fn rank(shown: &str) -> u8 {
    match shown {
        "up" => 0,
        "unknown" => 1,
        "loading" => 2,
        "breaker_open" => 3,
        _ => 4,
    }
}

/// One alias as `/v1/models` lists it. Its window and slots say where they come from:
/// `"config"`, `"discovered"` (with `discovered_at`, unix seconds) or `"pending"` (an `"auto"`
/// figure the backend has not reported yet).
fn model_entry(state: &AppState, snap: &Snapshot, alias: &Alias) -> serde_json::Value {
    let replicas: Vec<_> = alias
        .backends
        .iter()
        .map(|b| {
            json!({
                "backend": b.name,
                "flavor": b.flavor.as_str(),
                "status": state.shown_state(&b.name),
            })
        })
        .collect();
    let status = alias
        .backends
        .iter()
        .map(|b| state.shown_state(&b.name))
        .min_by_key(|s| rank(s))
        .unwrap_or("unknown");
    let mut v = json!({
        "id": alias.name,
        "object": "model",
        "created": state.started,
        "owned_by": "switchboard",
        "backend": alias.backend.name,
        "flavor": alias.backend.flavor.as_str(),
        "status": status,
        "backends": replicas,
        "inputs": alias.shape.inputs.names(),
    });
    if !alias.fallbacks.is_empty() {
        v["fallbacks"] = json!(alias.fallbacks);
    }
    if let Some(w) = alias.context_window {
        v["context_length"] = json!(w.get());
        v["max_model_len"] = json!(w.get());
    }
    if let Some(f) = snap.figures(&alias.name) {
        if let Some(source) = f.window_source {
            v["context_window_source"] = json!(source.as_str());
        }
        v["slots"] = json!(f.slots);
        v["slots_source"] = json!(f.slots_source.as_str());
        let at = f.window_source.and_then(|s| s.discovered_at());
        if let Some(at) = at.or(f.slots_source.discovered_at()) {
            v["discovered_at"] = json!(at);
        }
    }
    if let Some(m) = alias.shape.max_output_tokens {
        v["max_output_tokens"] = json!(m.get());
    }
    if let Some(d) = &alias.description {
        v["description"] = json!(d);
    }
    v
}

/// `GET /v1/models`: every alias (old names are not listed).
pub(crate) async fn models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let snap = state.live.load_full();
    let caller = match intake::identify(&snap, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let data: Vec<_> = snap
        .routes
        .aliases()
        .iter()
        .filter(|a| caller.as_ref().is_none_or(|c| c.may_use(a.name())))
        .map(|a| model_entry(&state, &snap, &a.spec))
        .collect();
    let mut resp = Json(json!({"object": "list", "data": data})).into_response();
    crate::clients::headers::of_caller(resp.headers_mut(), caller.as_ref(), false);
    resp
}

/// `GET /v1/models/{id}`: one alias, by its name or an old name.
pub(crate) async fn model(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let snap = state.live.load_full();
    let caller = match intake::identify(&snap, &headers) {
        Ok(c) => c,
        Err(e) => return e.into_response(),
    };
    let allowed = snap
        .routes
        .resolve(&id)
        .filter(|r| caller.as_ref().is_none_or(|c| c.may_use(r.alias.name())));
    match allowed {
        Some(r) => Json(model_entry(&state, &snap, &r.alias.spec)).into_response(),
        None => ProxyError::ModelNotFound {
            model: Echo::new(&id),
            known: crate::pipeline::known(&snap, caller.as_ref()),
        }
        .into_response(),
    }
}

/// `GET /metrics`: OpenMetrics when the scraper asks for it, else Prometheus text; behind
/// `server.metrics_keys_env`'s keys when it is set (401 without one).
pub(crate) async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let snap = state.live.load_full();
    if let Some(keys) = &snap.config.server.metrics_keys {
        let presented = crate::clients::presented(&headers);
        if !presented.is_some_and(|k| crate::clients::one_of(keys, k)) {
            return ProxyError::Unauthorized.into_response();
        }
    }
    drop(snap);
    state.record_breakers();
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
pub(crate) async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// Requests no fixed route took: model-routed ones go to [`routed_with`] (the server sends
/// those there directly; this serves the Router on its own), anything else is a 404.
pub(crate) async fn routed_or_not_found(
    State(state): State<AppState>,
    req: axum::extract::Request,
) -> Response {
    if is_routed(req.method(), req.uri().path()) {
        return routed_with(&state, req).await;
    }
    not_found(OriginalUri(req.uri().clone()), req.method().clone()).await
}

/// Any other path or method.
pub(crate) async fn not_found(
    OriginalUri(uri): OriginalUri,
    method: axum::http::Method,
) -> Response {
    ProxyError::NotFound {
        method: Echo::new(method.as_str()),
        path: Echo::new(uri.path()),
    }
    .into_response()
}
