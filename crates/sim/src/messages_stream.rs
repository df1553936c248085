//! `POST /v1/messages` as each flavour answers it, streamed and not: the request converted to
//! chat as that backend converts it, the chat generation planned, the answer in its shape.
//!
//! - llama.cpp (`server-task.cpp`, and the real server's captures): `message_start` comes with
//!   the first token; a thinking block (index 0) stays open until the end, where it is signed
//!   and stopped after the text block's deltas; `tool_use` starts without `input`; usage splits
//!   the prompt into `input_tokens` and `cache_read_input_tokens`; errors are its chat errors.
//! - vLLM (`entrypoints/anthropic`): blocks one at a time, a thinking block signed (a hex
//!   signature) before it stops, `message_delta` with input and output tokens.
//! - SGLang (`entrypoints/anthropic`): `message_start` with 0 input tokens, the real counts in
//!   `message_delta`; reasoning is left out of streams (only text and tool use are streamed).

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};

use super::api_tokens;
use super::dialects::dialect;
use super::event_steps::{self, named, parse_body, ApiRequest, Step};
use super::frame::{Counts, Failure, Field};
use super::generation::{End, Generation};
use super::gpu::CacheUse;
use super::plan::Plan;
use super::reply;
use super::state::Shared;
use switchboard_wire::flavor::Flavor;

/// vLLM's signature of a thinking block (a uuid's hex in vLLM).
const VLLM_SIGNATURE: &str = "5f0e6c1d9a8b4e3f8c2d1a0b9e8f7d6c";

fn stop_reason(plan: &Plan) -> &'static str {
    if plan.finish == "length" {
        "max_tokens"
    } else {
        "end_turn"
    }
}

/// The flavour's answer to a refused request.
fn failure(sh: &Shared, f: &Failure) -> Response {
    let flavor = sh.flavor();
    let (status, body) = dialect(flavor).error(f);
    if flavor == Flavor::Llamacpp {
        return reply::json(flavor, status, &body);
    }
    let message = body["error"]["message"]
        .as_str()
        .or(body["message"].as_str());
    let kind = if status == StatusCode::BAD_REQUEST {
        "invalid_request_error"
    } else {
        "api_error"
    };
    let env = json!({"type": "error", "error": {"type": kind, "message": message.unwrap_or("")}});
    reply::json(flavor, status, &env)
}

pub(crate) async fn messages(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    let flavor = sh.flavor();
    let converted = parse_body(&raw).and_then(|body| {
        let chat =
            api_tokens::converted(flavor, &raw, switchboard_wire::messages::to_chat::to_chat)?;
        Ok((body, chat))
    });
    let (body, mut chat) = match converted {
        Ok(bc) => bc,
        Err(f) => return failure(&sh, &f),
    };
    if body["thinking"]["type"] == "disabled" {
        chat["chat_template_kwargs"] = json!({"enable_thinking": false});
    }
    let req = ApiRequest {
        chat,
        max_tokens: body["max_tokens"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok()),
        stream: body["stream"].as_bool().unwrap_or(false),
        // llama.cpp's converter builds a new body of a few fields: `id_slot` and
        // `cache_prompt` are dropped.
        id_slot: None,
        cache: CacheUse::default(),
    };
    let (gen_req, plan) = match req.plan(&sh) {
        Ok(p) => p,
        Err(f) => return failure(&sh, &f),
    };
    let Some(mut gen) = Generation::start(&sh, &gen_req, &plan).await else {
        return reply::empty(flavor, StatusCode::SERVICE_UNAVAILABLE);
    };
    let counts = event_steps::counts(&sh, &gen, &plan);
    let id = sh.next_id();
    let model = body["model"].as_str().unwrap_or(&sh.cfg.model).to_owned();
    if req.stream {
        let steps = match flavor {
            Flavor::Llamacpp => llamacpp_steps(&sh.cfg.model, &id, &plan, &counts),
            Flavor::Sglang => sglang_steps(&model, &id, &plan, &counts),
            _ => vllm_steps(&sh.cfg.model, &id, &plan, &counts),
        };
        return event_steps::respond(sh, gen, steps, counts);
    }
    event_steps::wait_whole(&sh, &mut gen, &plan).await;
    let answer = whole(
        flavor,
        if flavor == Flavor::Sglang {
            &model
        } else {
            &sh.cfg.model
        },
        &id,
        &plan,
        &counts,
    );
    gen.end(End::Completed);
    reply::count_generation(&sh, &counts);
    reply::json(flavor, StatusCode::OK, &answer)
}

/// A whole answer in the flavour's shape.
fn whole(flavor: Flavor, model: &str, id: &str, plan: &Plan, c: &Counts) -> Value {
    let (reasoning, text) = plan.texts();
    let mut content = Vec::new();
    if let Some(r) = reasoning {
        let signature = match flavor {
            Flavor::Llamacpp => "",
            Flavor::Sglang => "dummy-signature",
            _ => VLLM_SIGNATURE,
        };
        content.push(json!({"type": "thinking", "thinking": r, "signature": signature}));
    }
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    let mut v = json!({"type": "message", "role": "assistant", "content": content,
        "model": model, "stop_reason": stop_reason(plan)});
    match flavor {
        Flavor::Llamacpp => {
            v["id"] = json!(format!("chatcmpl-{id}"));
            v["stop_sequence"] = Value::Null;
            let cached = c.cached.unwrap_or(0);
            v["usage"] = json!({"cache_read_input_tokens": cached,
                "input_tokens": c.prompt - cached, "output_tokens": c.completion});
        }
        Flavor::Sglang => {
            v["id"] = json!(format!("msg_{id}"));
            v["usage"] = json!({"input_tokens": c.prompt, "output_tokens": c.completion,
                "cache_read_input_tokens": 0});
        }
        _ => {
            v["id"] = json!(format!("chatcmpl-{id}"));
            v["stop_sequence"] = Value::Null;
            v["usage"] = json!({"input_tokens": c.prompt, "output_tokens": c.completion});
        }
    }
    v
}

fn block_start(index: usize, block: Value) -> Value {
    json!({"type": "content_block_start", "index": index, "content_block": block})
}

fn block_delta(index: usize, delta: Value) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": delta})
}

fn token_delta(field: Field, text: &str) -> Value {
    match field {
        Field::Reasoning => json!({"type": "thinking_delta", "thinking": text}),
        Field::Content => json!({"type": "text_delta", "text": text}),
    }
}

/// llama.cpp's stream (its `to_json_anthropic` partials and final).
fn llamacpp_steps(model: &str, id: &str, plan: &Plan, c: &Counts) -> Vec<Step> {
    let tokens = event_steps::tokens(plan);
    let has_thinking = tokens.iter().any(|(f, _)| *f == Field::Reasoning);
    let has_text = tokens.iter().any(|(f, _)| *f == Field::Content);
    let text_index = usize::from(has_thinking);
    let (mut thinking, mut text) = (false, false);
    let mut steps = Vec::new();
    for (n, (field, t)) in tokens.iter().enumerate() {
        let mut out = Vec::new();
        if n == 0 {
            out.extend_from_slice(&named(&json!({"type": "message_start", "message": {
                "id": format!("chatcmpl-{id}"), "type": "message", "role": "assistant",
                "content": [], "model": model, "stop_reason": null, "stop_sequence": null,
                "usage": {"cache_read_input_tokens": c.cached.unwrap_or(0),
                    "input_tokens": c.prompt - c.cached.unwrap_or(0), "output_tokens": 0}}})));
        }
        let (index, started) = match field {
            Field::Reasoning => (0, &mut thinking),
            Field::Content => (text_index, &mut text),
        };
        if !*started {
            *started = true;
            let block = match field {
                Field::Reasoning => json!({"type": "thinking", "thinking": ""}),
                Field::Content => json!({"type": "text", "text": ""}),
            };
            out.extend_from_slice(&named(&block_start(index, block)));
        }
        out.extend_from_slice(&named(&block_delta(index, token_delta(*field, t))));
        steps.push(Step {
            bytes: Bytes::from(out),
            token: true,
        });
    }
    let mut out = Vec::new();
    if has_thinking {
        let sign = json!({"type": "signature_delta", "signature": ""});
        out.extend_from_slice(&named(&block_delta(0, sign)));
        out.extend_from_slice(&named(&json!({"type": "content_block_stop", "index": 0})));
    }
    if has_text {
        out.extend_from_slice(&named(
            &json!({"type": "content_block_stop", "index": text_index}),
        ));
    }
    out.extend_from_slice(&named(&json!({"type": "message_delta",
        "delta": {"stop_reason": stop_reason(plan), "stop_sequence": null},
        "usage": {"output_tokens": c.completion}})));
    out.extend_from_slice(&named(&json!({"type": "message_stop"})));
    steps.push(Step {
        bytes: Bytes::from(out),
        token: false,
    });
    steps
}

/// vLLM's stream (its chat stream converted block by block).
fn vllm_steps(model: &str, id: &str, plan: &Plan, c: &Counts) -> Vec<Step> {
    let mut steps = vec![Step {
        bytes: named(&json!({"type": "message_start", "message": {
            "id": format!("chatcmpl-{id}"), "type": "message", "role": "assistant",
            "content": [], "model": model, "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": c.prompt, "output_tokens": 0}}})),
        token: false,
    }];
    let mut open: Option<(Field, usize)> = None;
    let mut next = 0;
    let stop = |open: &mut Option<(Field, usize)>, out: &mut Vec<u8>| {
        if let Some((f, i)) = open.take() {
            if f == Field::Reasoning {
                let sign = json!({"type": "signature_delta", "signature": VLLM_SIGNATURE});
                out.extend_from_slice(&named(&block_delta(i, sign)));
            }
            out.extend_from_slice(&named(&json!({"type": "content_block_stop", "index": i})));
        }
    };
    for (field, t) in event_steps::tokens(plan) {
        let mut out = Vec::new();
        if open.map(|(f, _)| f) != Some(field) {
            stop(&mut open, &mut out);
            let block = match field {
                Field::Reasoning => json!({"type": "thinking", "thinking": ""}),
                Field::Content => json!({"type": "text", "text": ""}),
            };
            out.extend_from_slice(&named(&block_start(next, block)));
            open = Some((field, next));
            next += 1;
        }
        let i = open.map_or(0, |(_, i)| i);
        out.extend_from_slice(&named(&block_delta(i, token_delta(field, &t))));
        steps.push(Step {
            bytes: Bytes::from(out),
            token: true,
        });
    }
    let mut out = Vec::new();
    stop(&mut open, &mut out);
    out.extend_from_slice(&named(&json!({"type": "message_delta",
        "delta": {"stop_reason": stop_reason(plan)},
        "usage": {"input_tokens": c.prompt, "output_tokens": c.completion}})));
    out.extend_from_slice(&named(&json!({"type": "message_stop"})));
    steps.push(Step {
        bytes: Bytes::from(out),
        token: false,
    });
    steps
}

/// SGLang's stream: text only, the counts at the end.
fn sglang_steps(model: &str, id: &str, plan: &Plan, c: &Counts) -> Vec<Step> {
    let mut steps = vec![Step {
        bytes: named(&json!({"type": "message_start", "message": {
            "id": format!("msg_{id}"), "type": "message", "role": "assistant", "content": [],
            "model": model, "usage": {"input_tokens": 0, "cache_read_input_tokens": 0,
                "output_tokens": 0}}})),
        token: false,
    }];
    let mut open = false;
    for (field, t) in event_steps::tokens(plan) {
        if field == Field::Reasoning {
            continue;
        }
        let mut out = Vec::new();
        if !open {
            open = true;
            out.extend_from_slice(&named(&block_start(0, json!({"type": "text", "text": ""}))));
        }
        out.extend_from_slice(&named(&block_delta(0, token_delta(field, &t))));
        steps.push(Step {
            bytes: Bytes::from(out),
            token: true,
        });
    }
    let mut out = Vec::new();
    if open {
        out.extend_from_slice(&named(&json!({"type": "content_block_stop", "index": 0})));
    }
    out.extend_from_slice(&named(&json!({"type": "message_delta",
        "delta": {"stop_reason": stop_reason(plan)},
        "usage": {"input_tokens": c.prompt, "output_tokens": c.completion,
            "cache_read_input_tokens": 0}})));
    out.extend_from_slice(&named(&json!({"type": "message_stop"})));
    steps.push(Step {
        bytes: Bytes::from(out),
        token: false,
    });
    steps
}
