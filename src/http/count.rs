//! Counting endpoints: `POST /tokenize` (vLLM's shape) and `POST /v1/messages/count_tokens` (Anthropic's).

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::intake::{request_id, respond, routed_body};
use crate::error::ProxyError;
use crate::guard::{self, GuardSpec};
use crate::live::AppState;
use crate::observe::record::Record;
use crate::pipeline::{resolve, Incoming};
use crate::wire::{self, Endpoint};

/// Which counting answer to give.
#[derive(Clone, Copy)]
enum Shape {
    Vllm,
    Anthropic,
}

async fn answer(state: AppState, headers: HeaderMap, body: Body, shape: Shape) -> Response {
    let snap = state.live.load_full();
    let endpoint = match shape {
        Shape::Vllm => Endpoint::tokenize,
        Shape::Anthropic => Endpoint::count_tokens,
    };
    let adapter = wire::adapter(endpoint);
    let mut ex = Record::start(snap.metrics(None), endpoint, request_id(&headers));
    let result = async {
        let body = routed_body(&snap, &headers, body).await?;
        let req = Incoming {
            adapter,
            path: String::new(),
            headers,
            body,
        };
        let routed = resolve(&snap, &mut ex, &req)?;
        let alias = &routed.route.alias;
        let spec: &GuardSpec = snap.guard(&alias.name).ok_or_else(|| {
            ProxyError::InvalidRequest(format!(
                "alias {} has no context_window configured, so its tokens are not counted",
                alias.name
            ))
        })?;
        let body = routed
            .view
            .upstream_body(&req.body, &alias.upstream_model, false);
        match shape {
            Shape::Vllm => guard::tokenize_response(spec, &state.client, &body).await,
            Shape::Anthropic => guard::count_tokens_response(spec, &state.client, &body).await,
        }
    }
    .await;
    respond(&mut ex, adapter, result.map(|v| Json(v).into_response()))
}

/// `POST /tokenize` `{model, messages, tools?}` → `{count, max_model_len, method}`.
pub async fn tokenize(State(state): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    answer(state, headers, body, Shape::Vllm).await
}

/// `POST /v1/messages/count_tokens` in Anthropic's shape → `{input_tokens}`.
pub async fn count_tokens(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(state, headers, body, Shape::Anthropic).await
}
