//! The Responses API as llama.cpp, vLLM and SGLang serve it natively: the request converted to
//! chat the way that backend converts it, the chat generation planned, the answer
//! (non-streaming) in the Responses shape; llama.cpp's `/v1/responses/input_tokens` counts the
//! converted prompt.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::json;

use super::messages::{converted, generate, prompt_tokens};
use super::reply;
use super::state::Shared;
use crate::wire::responses::to_chat::to_chat;

pub(crate) async fn responses(State(sh): State<Arc<Shared>>, body: Bytes) -> Response {
    let flavor = sh.flavor();
    let chat = match converted(flavor, &body, to_chat) {
        Ok(c) => c,
        Err(f) => return reply::failure(&sh, &f),
    };
    let g = match generate(&sh, &chat).await {
        Ok(g) => g,
        Err(f) => return reply::failure(&sh, &f),
    };
    let id = sh.next_id();
    let mut output = Vec::new();
    if let Some(r) = g.reasoning.filter(|r| !r.is_empty()) {
        output.push(
            json!({"type": "reasoning", "id": format!("rs_{id}"), "summary": [],
            "content": [{"type": "reasoning_text", "text": r}]}),
        );
    }
    output.push(json!({"type": "message", "id": format!("msg_{id}"), "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": g.content}]}));
    let c = g.counts;
    let status = if g.finish == "length" {
        "incomplete"
    } else {
        "completed"
    };
    let answer = json!({
        "id": format!("resp_{id}"),
        "object": "response",
        "created_at": reply::unix_now(),
        "status": status,
        "model": sh.cfg.model,
        "output": output,
        "usage": {"input_tokens": c.prompt, "output_tokens": c.completion,
                  "total_tokens": c.prompt + c.completion,
                  "output_tokens_details": {"reasoning_tokens": c.reasoning}},
    });
    reply::json(flavor, StatusCode::OK, &answer)
}

pub(crate) async fn input_tokens(State(sh): State<Arc<Shared>>, body: Bytes) -> Response {
    let flavor = sh.flavor();
    match converted(flavor, &body, to_chat).and_then(|chat| prompt_tokens(&sh, &chat)) {
        Ok(n) => reply::json(
            flavor,
            StatusCode::OK,
            &json!({"input_tokens": n, "object": "response.input_tokens"}),
        ),
        Err(f) => reply::failure(&sh, &f),
    }
}
