//! Counting endpoints: `/tokenize`, `/detokenize`, `/apply-template` in each flavour's shape.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};

use super::frame::Failure;
use super::reply;
use super::state::Shared;
use super::tokenize::{count_prompt_tokens, pieces, render_chat};

fn parse(raw: &[u8]) -> Result<Value, Failure> {
    serde_json::from_slice(raw).map_err(|e| Failure::Json {
        line: e.line(),
        column: e.column(),
        detail: e.to_string(),
    })
}

/// Tokenizes `text`, remembering pieces for `/detokenize`.
fn tokens(sh: &Shared, text: &str, parse_special: bool, with_pieces: bool) -> Vec<Value> {
    let mut out = Vec::new();
    pieces(text, parse_special, |t| {
        sh.learn(t.id, t.piece);
        out.push(if with_pieces {
            json!({"id": t.id, "piece": t.piece})
        } else {
            Value::from(t.id)
        });
    });
    out
}

fn ids(body: &Value) -> Vec<u32> {
    let list = body.get("tokens").and_then(Value::as_array);
    list.into_iter()
        .flatten()
        .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// llama.cpp `POST /tokenize {"content","add_special","parse_special","with_pieces"}`.
pub(crate) async fn llama_tokenize(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    let body = match parse(&raw) {
        Ok(b) => b,
        Err(f) => return reply::failure(&sh, &f),
    };
    let flag = |k: &str, default: bool| body.get(k).and_then(Value::as_bool).unwrap_or(default);
    let content = body.get("content").and_then(Value::as_str).unwrap_or("");
    let list = tokens(
        &sh,
        content,
        flag("parse_special", true),
        flag("with_pieces", false),
    );
    reply::json(sh.flavor(), StatusCode::OK, &json!({"tokens": list}))
}

/// llama.cpp `POST /detokenize {"tokens"}` → `{"content"}`.
pub(crate) async fn llama_detokenize(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    match parse(&raw) {
        Ok(body) => {
            let content = sh.detokenize(&ids(&body));
            reply::json(sh.flavor(), StatusCode::OK, &json!({"content": content}))
        }
        Err(f) => reply::failure(&sh, &f),
    }
}

/// llama.cpp `POST /apply-template` (a chat body) → `{"prompt"}`.
pub(crate) async fn apply_template(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    match parse(&raw).and_then(chat_body) {
        Ok(body) => reply::json(
            sh.flavor(),
            StatusCode::OK,
            &json!({"prompt": render_chat(&body)}),
        ),
        Err(f) => reply::failure(&sh, &f),
    }
}

/// llama.cpp `POST /v1/chat/completions/input_tokens` → `{"input_tokens","object"}`.
pub(crate) async fn input_tokens(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    match parse(&raw).and_then(chat_body) {
        Ok(body) => {
            let n = count_prompt_tokens(sh.flavor(), &body);
            let out = json!({"input_tokens": n, "object": "response.input_tokens"});
            reply::json(sh.flavor(), StatusCode::OK, &out)
        }
        Err(f) => reply::failure(&sh, &f),
    }
}

fn chat_body(body: Value) -> Result<Value, Failure> {
    match body.get("messages") {
        Some(Value::Array(_)) => Ok(body),
        None | Some(Value::Null) => Err(Failure::Missing("messages")),
        Some(_) => Err(Failure::Invalid("'messages' must be an array".to_owned())),
    }
}

/// The text a vLLM or SGLang tokenize request stands for: a rendered chat or a prompt.
fn request_text(body: &Value) -> Result<String, Failure> {
    match (body.get("messages"), body.get("prompt")) {
        (Some(Value::Array(_)), None) => Ok(render_chat(body)),
        (None, Some(Value::String(p))) => Ok(p.clone()),
        _ => Err(Failure::Invalid(
            "exactly one of 'prompt' (a string) or 'messages' must be given".to_owned(),
        )),
    }
}

/// vLLM `POST /tokenize` (prompt or messages form) → `{"count","max_model_len","tokens"}`.
pub(crate) async fn vllm_tokenize(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    match parse(&raw).and_then(|b| request_text(&b)) {
        Ok(text) => {
            let list = tokens(&sh, &text, true, false);
            let body = json!({"count": list.len(), "max_model_len": sh.cfg.slot_ctx, "tokens": list, "token_strs": null});
            reply::json(sh.flavor(), StatusCode::OK, &body)
        }
        Err(f) => reply::failure(&sh, &f),
    }
}

/// vLLM `POST /detokenize {"tokens"}` → `{"prompt"}`.
pub(crate) async fn vllm_detokenize(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    match parse(&raw) {
        Ok(body) => reply::json(
            sh.flavor(),
            StatusCode::OK,
            &json!({"prompt": sh.detokenize(&ids(&body))}),
        ),
        Err(f) => reply::failure(&sh, &f),
    }
}

/// SGLang `POST /v1/tokenize` and `/tokenize` → `{"tokens","count","max_model_len"}`.
pub(crate) async fn sglang_tokenize(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    match parse(&raw).and_then(|b| request_text(&b)) {
        Ok(text) => {
            let list = tokens(&sh, &text, true, false);
            let body =
                json!({"tokens": list, "count": list.len(), "max_model_len": sh.cfg.slot_ctx});
            reply::json(sh.flavor(), StatusCode::OK, &body)
        }
        Err(f) => reply::failure(&sh, &f),
    }
}

/// SGLang `POST /v1/detokenize` and `/detokenize {"tokens"}` → `{"text"}`.
pub(crate) async fn sglang_detokenize(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    match parse(&raw) {
        Ok(body) => reply::json(
            sh.flavor(),
            StatusCode::OK,
            &json!({"text": sh.detokenize(&ids(&body))}),
        ),
        Err(f) => reply::failure(&sh, &f),
    }
}
