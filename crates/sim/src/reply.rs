//! Response helpers: each flavour's headers, JSON and SSE bodies, error rendering.

use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::response::Response;
use http::{header, HeaderValue, StatusCode};
use serde_json::Value;

use super::dialects::dialect;
use super::frame::{Counts, Failure};
use super::state::Shared;
use switchboard_wire::flavor::Flavor;

fn server_name(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Llamacpp => "llama.cpp",
        Flavor::Vllm | Flavor::Sglang | Flavor::Openai => "uvicorn",
    }
}

fn build(
    flavor: Flavor,
    status: StatusCode,
    content_type: Option<&'static str>,
    body: Body,
) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(
        header::SERVER,
        HeaderValue::from_static(server_name(flavor)),
    );
    if let Some(ct) = content_type {
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    }
    resp
}

/// A JSON answer with the flavour's content type.
pub(crate) fn json(flavor: Flavor, status: StatusCode, body: &Value) -> Response {
    let ct = match flavor {
        Flavor::Llamacpp => "application/json; charset=utf-8",
        _ => "application/json",
    };
    build(flavor, status, Some(ct), Body::from(body.to_string()))
}

/// An answer with no body (vLLM and SGLang health).
pub(crate) fn empty(flavor: Flavor, status: StatusCode) -> Response {
    build(flavor, status, None, Body::empty())
}

/// A plain-text answer (metrics).
pub(crate) fn text(flavor: Flavor, body: String) -> Response {
    build(
        flavor,
        StatusCode::OK,
        Some("text/plain; version=0.0.4"),
        Body::from(body),
    )
}

/// A 200 `text/event-stream` answer.
pub(crate) fn sse(flavor: Flavor, body: Body) -> Response {
    let mut resp = build(flavor, StatusCode::OK, Some("text/event-stream"), body);
    if flavor == Flavor::Llamacpp {
        resp.headers_mut()
            .insert("x-accel-buffering", HeaderValue::from_static("no"));
    }
    resp
}

/// The flavour's error answer for a refused request.
pub(crate) fn failure(sh: &Shared, failure: &Failure) -> Response {
    let (status, body) = dialect(sh.flavor()).error(failure);
    json(sh.flavor(), status, &body)
}

/// Unix time in seconds.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Adds a finished generation to the `/metrics` totals.
pub(crate) fn count_generation(sh: &Shared, counts: &Counts) {
    let stats = &sh.stats;
    stats.requests.fetch_add(1, Ordering::Relaxed);
    stats
        .prompt_tokens
        .fetch_add(u64::from(counts.prompt), Ordering::Relaxed);
    stats
        .predicted_tokens
        .fetch_add(u64::from(counts.completion), Ordering::Relaxed);
}
