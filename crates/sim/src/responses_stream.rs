//! `POST /v1/responses` as each flavour answers it, streamed and not: the request converted to
//! chat as that backend converts it, the chat generation planned, the answer in its shape.
//!
//! - llama.cpp (`server-task.cpp`, and the real server's captures): events without
//!   `sequence_number`, `output_index` or `content_index`; a bare response object in
//!   `response.created`; a reasoning item added with the first reasoning token and done only
//!   at the end, with no content part; llama.cpp's `timings` beside the final response.
//! - vLLM and SGLang (`responses/simple_streaming_events.py`): the specification's events,
//!   numbered, one item at a time, every part added and done.
//!
//! A refused request gets the flavour's chat error, as each of them answers these endpoints.

use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::StatusCode;
use serde_json::{json, Value};

use super::api_tokens;
use super::event_steps::{self, named, parse_body, ApiRequest, Step};
use super::frame::{Counts, Field};
use super::generation::{End, Generation};
use super::gpu::CacheUse;
use super::llamacpp;
use super::plan::Plan;
use super::reply;
use super::state::Shared;
use switchboard_wire::flavor::Flavor;

pub(crate) async fn responses(State(sh): State<Arc<Shared>>, raw: Bytes) -> Response {
    let flavor = sh.flavor();
    let converted = parse_body(&raw).and_then(|body| {
        let chat =
            api_tokens::converted(flavor, &raw, switchboard_wire::responses::to_chat::to_chat)?;
        Ok((body, chat))
    });
    let (body, chat) = match converted {
        Ok(bc) => bc,
        Err(f) => return reply::failure(&sh, &f),
    };
    let req = ApiRequest {
        chat,
        max_tokens: body["max_output_tokens"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok()),
        stream: body["stream"].as_bool().unwrap_or(false),
        id_slot: body["id_slot"].as_i64(),
        cache: CacheUse::of(&body),
    };
    let (gen_req, plan) = match req.plan(&sh) {
        Ok(p) => p,
        Err(f) => return reply::failure(&sh, &f),
    };
    let Some(mut gen) = Generation::start(&sh, &gen_req, &plan).await else {
        return reply::empty(flavor, StatusCode::SERVICE_UNAVAILABLE);
    };
    let counts = event_steps::counts(&sh, &gen, &plan);
    let ids = Ids::new(&sh.next_id());
    let model = sh.cfg.model.clone();
    if req.stream {
        let steps = if flavor == Flavor::Llamacpp {
            llamacpp_steps(&model, &ids, &plan, &counts)
        } else {
            spec_steps(&model, &ids, &plan, &counts)
        };
        return event_steps::respond(sh, gen, steps, counts);
    }
    event_steps::wait_whole(&sh, &mut gen, &plan).await;
    let (reasoning, text) = plan.texts();
    let output = items(&ids, reasoning.as_deref(), &text);
    let mut answer = response(flavor, &model, &ids, "completed", output, &counts);
    answer["completed_at"] = json!(reply::unix_now());
    gen.end(End::Completed);
    reply::count_generation(&sh, &counts);
    reply::json(flavor, StatusCode::OK, &answer)
}

/// The ids of one response and its items.
struct Ids {
    response: String,
    reasoning: String,
    message: String,
}

impl Ids {
    fn new(id: &str) -> Self {
        Ids {
            response: format!("resp_{id}"),
            reasoning: format!("rs_{id}"),
            message: format!("msg_{id}"),
        }
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "annotations": [], "logprobs": [], "text": text})
}

fn reasoning_item(ids: &Ids, text: &str) -> Value {
    json!({"id": ids.reasoning, "summary": [], "type": "reasoning",
        "content": [{"text": text, "type": "reasoning_text"}], "encrypted_content": "",
        "status": "completed"})
}

fn message_item(ids: &Ids, text: &str) -> Value {
    json!({"type": "message", "status": "completed", "id": ids.message,
        "content": [output_text(text)], "role": "assistant"})
}

/// The output items of a finished generation.
fn items(ids: &Ids, reasoning: Option<&str>, text: &str) -> Vec<Value> {
    let mut out = Vec::new();
    if let Some(r) = reasoning {
        out.push(reasoning_item(ids, r));
    }
    if !text.is_empty() {
        out.push(message_item(ids, text));
    }
    out
}

/// The response object in the flavour's shape.
fn response(
    flavor: Flavor,
    model: &str,
    ids: &Ids,
    status: &str,
    output: Vec<Value>,
    c: &Counts,
) -> Value {
    let mut usage = json!({"input_tokens": c.prompt, "output_tokens": c.completion,
        "total_tokens": c.prompt + c.completion,
        "input_tokens_details": {"cached_tokens": c.cached.unwrap_or(0)}});
    let mut r = json!({"id": ids.response, "object": "response", "created_at": reply::unix_now(),
        "status": status, "model": model, "output": output, "usage": usage});
    if flavor != Flavor::Llamacpp {
        usage["output_tokens_details"] = json!({"reasoning_tokens": c.reasoning});
        r["usage"] = usage;
        for (k, v) in [
            ("error", Value::Null),
            ("incomplete_details", Value::Null),
            ("instructions", Value::Null),
            ("metadata", json!({})),
            ("parallel_tool_calls", json!(true)),
            ("temperature", json!(1.0)),
            ("tool_choice", json!("auto")),
            ("tools", json!([])),
            ("top_p", json!(1.0)),
        ] {
            r[k] = v;
        }
    }
    r
}

/// llama.cpp's stream (its `to_json_oaicompat_resp` partials and final).
fn llamacpp_steps(model: &str, ids: &Ids, plan: &Plan, c: &Counts) -> Vec<Step> {
    let bare = json!({"id": ids.response, "object": "response", "status": "in_progress"});
    let lifecycle = || {
        let mut out = named(&json!({"type": "response.created", "response": bare})).to_vec();
        out.extend_from_slice(&named(
            &json!({"type": "response.in_progress", "response": bare}),
        ));
        out
    };
    let (mut thinking, mut text) = (String::new(), String::new());
    let mut steps = Vec::new();
    for (n, (field, t)) in event_steps::tokens(plan).into_iter().enumerate() {
        let mut out = if n == 0 { lifecycle() } else { Vec::new() };
        match field {
            Field::Reasoning => {
                if thinking.is_empty() {
                    out.extend_from_slice(&named(&json!({"type": "response.output_item.added",
                        "item": {"id": ids.reasoning, "summary": [], "type": "reasoning",
                            "content": [], "encrypted_content": "", "status": "in_progress"}})));
                }
                thinking.push_str(&t);
                out.extend_from_slice(&named(&json!({"type": "response.reasoning_text.delta",
                    "delta": t, "item_id": ids.reasoning})));
            }
            Field::Content => {
                if text.is_empty() {
                    out.extend_from_slice(&named(&json!({"type": "response.output_item.added",
                        "item": {"content": [], "id": ids.message, "role": "assistant",
                            "status": "in_progress", "type": "message"}})));
                    out.extend_from_slice(&named(&json!({"type": "response.content_part.added",
                        "item_id": ids.message, "part": {"type": "output_text", "text": ""}})));
                }
                text.push_str(&t);
                out.extend_from_slice(&named(&json!({"type": "response.output_text.delta",
                    "item_id": ids.message, "delta": t})));
            }
        }
        steps.push(Step {
            bytes: Bytes::from(out),
            token: true,
        });
    }
    let mut out = if steps.is_empty() {
        lifecycle()
    } else {
        Vec::new()
    };
    if !thinking.is_empty() {
        let mut item = reasoning_item(ids, &thinking);
        item.as_object_mut().map(|o| o.remove("status"));
        out.extend_from_slice(&named(
            &json!({"type": "response.output_item.done", "item": item}),
        ));
    }
    if !text.is_empty() {
        out.extend_from_slice(&named(&json!({"type": "response.output_text.done",
            "item_id": ids.message, "text": text})));
        out.extend_from_slice(&named(&json!({"type": "response.content_part.done",
            "item_id": ids.message, "part": output_text(&text)})));
        out.extend_from_slice(&named(&json!({"type": "response.output_item.done",
            "item": message_item(ids, &text)})));
    }
    let r = response(
        Flavor::Llamacpp,
        model,
        ids,
        "completed",
        items(
            ids,
            (!thinking.is_empty()).then_some(thinking.as_str()),
            &text,
        ),
        c,
    );
    let done =
        json!({"type": "response.completed", "response": r, "timings": llamacpp::timings(c)});
    out.extend_from_slice(&named(&done));
    steps.push(Step {
        bytes: Bytes::from(out),
        token: false,
    });
    steps
}

/// Numbers events as the specification's streams do.
struct Numbered {
    seq: u64,
}

impl Numbered {
    fn event(&mut self, mut v: Value) -> Bytes {
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        named(&v)
    }
}

/// The events closing item `i` of `kind` with `text` (vLLM's `_events_*_done`).
fn close_item(n: &mut Numbered, ids: &Ids, i: usize, field: Field, text: &str) -> Vec<u8> {
    let (id, part, kind) = match field {
        Field::Reasoning => (
            &ids.reasoning,
            json!({"type": "reasoning_text", "text": text}),
            "reasoning_text",
        ),
        Field::Content => (&ids.message, output_text(text), "output_text"),
    };
    let mut done = json!({"type": format!("response.{kind}.done"), "item_id": id,
        "output_index": i, "content_index": 0, "text": text});
    if field == Field::Content {
        done["logprobs"] = json!([]);
    }
    let item = match field {
        Field::Reasoning => reasoning_item(ids, text),
        Field::Content => message_item(ids, text),
    };
    let mut out = n.event(done).to_vec();
    out.extend_from_slice(
        &n.event(json!({"type": "response.content_part.done", "item_id": id,
        "output_index": i, "content_index": 0, "part": part})),
    );
    out.extend_from_slice(&n.event(json!({"type": "response.output_item.done",
        "output_index": i, "item": item})));
    out
}

/// The events opening item `i` for tokens of `field`: the item, then its one part.
fn open_item(n: &mut Numbered, ids: &Ids, i: usize, field: Field) -> Vec<u8> {
    let (item, id, part) = match field {
        Field::Reasoning => (
            json!({"type": "reasoning", "id": ids.reasoning, "summary": [], "status": "in_progress"}),
            &ids.reasoning,
            json!({"type": "reasoning_text", "text": ""}),
        ),
        Field::Content => (
            json!({"type": "message", "id": ids.message, "role": "assistant", "content": [],
                "status": "in_progress"}),
            &ids.message,
            output_text(""),
        ),
    };
    let mut out = n
        .event(json!({"type": "response.output_item.added", "output_index": i, "item": item}))
        .to_vec();
    out.extend_from_slice(
        &n.event(json!({"type": "response.content_part.added", "item_id": id,
        "output_index": i, "content_index": 0, "part": part})),
    );
    out
}

/// vLLM's and SGLang's stream: the specification's events.
fn spec_steps(model: &str, ids: &Ids, plan: &Plan, c: &Counts) -> Vec<Step> {
    let mut n = Numbered { seq: 0 };
    let start = response(Flavor::Vllm, model, ids, "in_progress", Vec::new(), c);
    let mut head = n
        .event(json!({"type": "response.created", "response": start}))
        .to_vec();
    head.extend_from_slice(&n.event(json!({"type": "response.in_progress", "response": start})));
    let mut steps = vec![Step {
        bytes: Bytes::from(head),
        token: false,
    }];
    let mut open: Option<(Field, usize, String)> = None;
    let mut done_items = Vec::new();
    for (field, t) in event_steps::tokens(plan) {
        let mut out = Vec::new();
        if open.as_ref().map(|o| o.0) != Some(field) {
            if let Some((f, i, text)) = open.take() {
                out.extend_from_slice(&close_item(&mut n, ids, i, f, &text));
                done_items.push((f, text));
            }
            let i = done_items.len();
            out.extend_from_slice(&open_item(&mut n, ids, i, field));
            open = Some((field, i, String::new()));
        }
        if let Some((_, i, text)) = open.as_mut() {
            text.push_str(&t);
            let (kind, id) = match field {
                Field::Reasoning => ("reasoning_text", &ids.reasoning),
                Field::Content => ("output_text", &ids.message),
            };
            let mut ev = json!({"type": format!("response.{kind}.delta"), "item_id": id,
                "output_index": *i, "content_index": 0, "delta": t});
            if field == Field::Content {
                ev["logprobs"] = json!([]);
            }
            out.extend_from_slice(&n.event(ev));
        }
        steps.push(Step {
            bytes: Bytes::from(out),
            token: true,
        });
    }
    let mut out = Vec::new();
    if let Some((f, i, text)) = open.take() {
        out.extend_from_slice(&close_item(&mut n, ids, i, f, &text));
        done_items.push((f, text));
    }
    let reasoning = done_items
        .iter()
        .find(|(f, _)| *f == Field::Reasoning)
        .map(|(_, t)| t.as_str());
    let text = done_items
        .iter()
        .find(|(f, _)| *f == Field::Content)
        .map_or("", |(_, t)| t.as_str());
    let r = response(
        Flavor::Vllm,
        model,
        ids,
        "completed",
        items(ids, reasoning, text),
        c,
    );
    out.extend_from_slice(&n.event(json!({"type": "response.completed", "response": r})));
    steps.push(Step {
        bytes: Bytes::from(out),
        token: false,
    });
    steps
}
