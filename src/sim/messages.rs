//! Anthropic Messages as llama.cpp, vLLM and SGLang serve it natively: the request converted
//! to chat the way that backend converts it (the same converters the proxy counts with), the
//! chat generation planned, and the answer (non-streaming) in Anthropic's shape with the
//! flavour's usage fields; `/v1/messages/count_tokens` counts the converted prompt. A
//! context overflow is the flavour's chat error, as the real servers answer it.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Map, Value};

use super::frame::{dialect, Counts, Failure, Kind};
use super::generation::{End, Generation};
use super::plan::{self, GenRequest, Plan};
use super::reply;
use super::sse_body::millis;
use super::state::Shared;
use crate::flavor::Flavor;
use crate::wire::chat_form::Converter;

/// A converter of one API's request into chat form.
pub(super) type ToChat =
    fn(Map<String, Value>, Converter) -> Result<Map<String, Value>, crate::error::ProxyError>;

/// The request in the chat form the flavour makes of it, as chat bytes.
pub(super) fn converted(flavor: Flavor, raw: &[u8], convert: ToChat) -> Result<Vec<u8>, Failure> {
    let req: Value = serde_json::from_slice(raw).map_err(|e| Failure::Json {
        line: e.line(),
        column: e.column(),
        detail: e.to_string(),
    })?;
    let Value::Object(req) = req else {
        return Err(Failure::Invalid(
            "the request body must be a JSON object".into(),
        ));
    };
    let chat =
        convert(req, Converter::native(flavor)).map_err(|e| Failure::Invalid(e.to_string()))?;
    serde_json::to_vec(&chat).map_err(|e| Failure::Invalid(e.to_string()))
}

/// The generation of a converted request, run to its end: its counts and texts.
pub(super) struct Generated {
    pub counts: Counts,
    pub reasoning: Option<String>,
    pub content: String,
    pub finish: &'static str,
}

/// Plans and runs the generation of a chat-form request (as long as it would take).
pub(super) async fn generate(sh: &Shared, chat: &[u8]) -> Result<Generated, Failure> {
    let d = dialect(sh.flavor());
    let mut req: GenRequest = plan::parse(sh.flavor(), d, Kind::Chat, chat)?;
    req.stream = false;
    let plan = Plan::new(&sh.cfg, d, &req)?;
    let mut gen = Generation::new(sh.recorder.clone());
    if !gen.acquire(&sh.slots).await {
        return Err(Failure::Invalid("no slot".into()));
    }
    let start = Instant::now();
    if !sh.cfg.ttft.is_zero() {
        tokio::time::sleep(sh.cfg.ttft).await;
    }
    let first = Instant::now();
    let rest = sh
        .cfg
        .token_delay
        .saturating_mul(plan.tokens.saturating_sub(1));
    if !rest.is_zero() {
        tokio::time::sleep(rest).await;
    }
    let counts = Counts {
        prompt: plan.prompt,
        completion: plan.tokens,
        reasoning: plan.reasoning_tokens(),
        prompt_ms: millis(first - start),
        predicted_ms: millis(first.elapsed()),
    };
    let (reasoning, content) = plan.texts();
    gen.end(End::Completed);
    reply::count_generation(sh, &counts);
    Ok(Generated {
        counts,
        reasoning,
        content,
        finish: plan.finish,
    })
}

/// The prompt tokens of a chat-form request.
pub(super) fn prompt_tokens(sh: &Shared, chat: &[u8]) -> Result<u32, Failure> {
    let d = dialect(sh.flavor());
    Ok(plan::parse(sh.flavor(), d, Kind::Chat, chat)?.prompt_tokens)
}

pub(crate) async fn messages(State(sh): State<Arc<Shared>>, body: Bytes) -> Response {
    let flavor = sh.flavor();
    let chat = match converted(flavor, &body, crate::wire::messages::to_chat::to_chat) {
        Ok(c) => c,
        Err(f) => return reply::failure(&sh, &f),
    };
    let g = match generate(&sh, &chat).await {
        Ok(g) => g,
        Err(f) => return reply::failure(&sh, &f),
    };
    let mut content = Vec::new();
    if let Some(r) = g.reasoning.filter(|r| !r.is_empty()) {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    content.push(json!({"type": "text", "text": g.content}));
    let stop = if g.finish == "length" {
        "max_tokens"
    } else {
        "end_turn"
    };
    // llama.cpp splits the prompt into new and cached tokens; the others report it whole.
    let usage = match flavor {
        Flavor::Llamacpp => {
            json!({"cache_read_input_tokens": 0, "input_tokens": g.counts.prompt, "output_tokens": g.counts.completion})
        }
        _ => json!({"input_tokens": g.counts.prompt, "output_tokens": g.counts.completion}),
    };
    let answer = json!({
        "id": format!("msg_{}", sh.next_id()),
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": sh.cfg.model,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage,
    });
    reply::json(flavor, StatusCode::OK, &answer)
}

pub(crate) async fn count_tokens(State(sh): State<Arc<Shared>>, body: Bytes) -> Response {
    let flavor = sh.flavor();
    let counted = converted(flavor, &body, crate::wire::messages::to_chat::to_chat)
        .and_then(|chat| prompt_tokens(&sh, &chat));
    match counted {
        Ok(n) => reply::json(flavor, StatusCode::OK, &json!({"input_tokens": n})),
        Err(f) => reply::failure(&sh, &f),
    }
}
