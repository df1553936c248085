//! The answer of a chat-only backend as a Responses answer: a `chat.completion` as a response
//! object, a chat stream event by event as Responses events (`response.created`,
//! `response.in_progress`, one output item at a time — reasoning, message, function calls —
//! then `response.completed` with the usage), tool calls as `function_call` items.
//!
//! Items come in the order [`Order`] gives (its header has the design): one open at a time,
//! as the writer keeps them, a function call streamed live while no other call is open and
//! kept open to the end, whatever comes in the meantime held and written whole at the end,
//! so every arguments delta names its own item. A call without an id gets `call_` and an id
//! made for the answer; an event that cannot be read ends the stream with `error` and
//! `response.failed`; only choice 0 is translated.
//!
//! The events are built in the shape llama.cpp's own Responses endpoint sends and go through
//! the same repair as a native stream, so both reach the client alike. A chat answer cut by
//! its token budget completes with `incomplete_details.reason = "max_output_tokens"`, as a
//! completed response (what llama.cpp's endpoint sends, and what the SDKs' stream helpers
//! finish on).

use std::time::Instant;

use serde_json::{json, Map, Value};

use super::answer::reasoning_item;
use super::stream::{complete_response, unix_now, ResponsesStream};
use crate::error::ProxyError;
use crate::reasoning::TextSplitter;
use crate::wire::from_chat::{
    arguments_of, choice0, chunk_of, feed, id_of, name_of, reasoning_of, text_of, Block, Ids, Op,
    Order,
};
use crate::wire::stream::{data_payload, Action, ApiEvents, Seen, StreamContext};
use crate::wire::usage::{self, Usage};

/// The id tail shared by the response and its items.
fn tail(chat: &Value) -> String {
    let id = chat["id"].as_str().unwrap_or("");
    id.strip_prefix("chatcmpl-").unwrap_or(id).to_owned()
}

/// A chat usage object as the Responses usage.
fn usage_json(u: Option<&Value>) -> Value {
    let n = |p: &str| {
        u.and_then(|u| u.pointer(p))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let (input, output) = (n("/prompt_tokens"), n("/completion_tokens"));
    json!({"input_tokens": input,
        "input_tokens_details": {"cached_tokens": n("/prompt_tokens_details/cached_tokens")},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": n("/completion_tokens_details/reasoning_tokens")},
        "total_tokens": input + output})
}

/// What a chat finish reason leaves in the response's `incomplete_details`.
fn incomplete(finish: Option<&str>) -> Value {
    match finish {
        Some("length") => json!({"reason": "max_output_tokens"}),
        Some("content_filter") => json!({"reason": "content_filter"}),
        _ => Value::Null,
    }
}

/// A chat tool call as a `function_call` item with call id `id`.
fn function_call(id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": id, "name": name,
        "arguments": arguments, "status": status})
}

/// A whole `chat.completion` as a Responses answer; what is wrong with it when it is not one
/// (no choice 0, or a choice without a message).
pub fn answer(chat: &[u8], ctx: &StreamContext) -> Result<Vec<u8>, String> {
    let v: Value = serde_json::from_slice(chat).map_err(|e| format!("not JSON: {e}"))?;
    let choice = choice0(&v).ok_or("an answer without choice 0")?;
    let message = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or("choice 0 without a message")?;
    let t = tail(&v);
    let mut reasoning = reasoning_of(message).unwrap_or("").to_owned();
    let mut text = text_of(message.get("content"));
    if let Some(tags) = ctx.tags.as_deref() {
        let split = TextSplitter::split_all(tags, &text);
        reasoning.push_str(&split.reasoning);
        text = split.answer;
    }
    let mut output = Vec::new();
    if !reasoning.is_empty() {
        output.push(reasoning_item(&format!("msg_{t}"), &reasoning));
    }
    if !text.is_empty() {
        output.push(
            json!({"type": "message", "id": format!("msg_{t}"), "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "annotations": [],
            "logprobs": [], "text": text}]}),
        );
    }
    let ids = Ids::new("call_");
    for (n, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let id = ids.id(id_of(call), n);
        let name = name_of(call).unwrap_or("");
        output.push(function_call(&id, name, &arguments_of(call), "completed"));
    }
    let mut r = Map::new();
    r.insert("id".into(), json!(format!("resp_{t}")));
    r.insert("created_at".into(), v["created"].clone());
    r.insert(
        "model".into(),
        v.get("model").cloned().unwrap_or(json!(ctx.model)),
    );
    r.insert("status".into(), json!("completed"));
    r.insert("completed_at".into(), json!(unix_now()));
    let finish = choice["finish_reason"].as_str();
    r.insert("incomplete_details".into(), incomplete(finish));
    r.insert("output".into(), Value::Array(output));
    r.insert("usage".into(), usage_json(v.get("usage")));
    complete_response(&mut r, &ctx.model);
    serde_json::to_vec(&Value::Object(r)).map_err(|e| e.to_string())
}

/// A chat stream translated into a Responses stream, event by event.
pub struct FromChat {
    inner: ResponsesStream,
    model: String,
    tail: String,
    started: bool,
    finished: bool,
    order: Order,
    /// The backend id of the item open now and the kind of its deltas.
    item: String,
    delta_type: &'static str,
    items: u32,
    finish: Option<String>,
    usage: Option<Value>,
    reported: Option<Usage>,
}

impl FromChat {
    pub fn new(ctx: &StreamContext) -> Self {
        FromChat {
            inner: ResponsesStream::new(ctx.tags.clone(), &ctx.model),
            model: ctx.model.clone(),
            tail: String::new(),
            started: false,
            finished: false,
            order: Order::new(Ids::new("call_")),
            item: String::new(),
            delta_type: "response.output_text.delta",
            items: 0,
            finish: None,
            usage: None,
            reported: None,
        }
    }

    fn put(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        self.inner.handle(v, now, seen, out);
    }

    /// The id of a reasoning or message item: the response's tail, numbered after the first.
    fn item_id(&self, prefix: &str) -> String {
        let n = if self.items > 1 {
            format!("_{}", self.items)
        } else {
            String::new()
        };
        format!("{prefix}_{}{n}", self.tail)
    }

    /// The items [`Order`] wrote, as Responses events.
    fn write(&mut self, ops: Vec<Op>, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        for op in ops {
            let ev = match op {
                Op::Open(block) => {
                    self.items += 1;
                    let item = match block {
                        Block::Thinking => {
                            self.delta_type = "response.reasoning_text.delta";
                            json!({"type": "reasoning", "id": self.item_id("rs")})
                        }
                        Block::Text => {
                            self.delta_type = "response.output_text.delta";
                            json!({"type": "message", "role": "assistant",
                                "id": self.item_id("msg")})
                        }
                        Block::Tool { id, name } => {
                            self.delta_type = "response.function_call_arguments.delta";
                            function_call(&id, &name, "", "in_progress")
                        }
                    };
                    self.item = item["id"].as_str().unwrap_or("").to_owned();
                    json!({"type": "response.output_item.added", "item": item})
                }
                Op::Delta(d) => json!({"type": self.delta_type, "item_id": self.item, "delta": d}),
                Op::Close => {
                    json!({"type": "response.output_item.done", "item": {"id": self.item}})
                }
            };
            self.put(ev, now, seen, out);
        }
    }

    /// One chat event's JSON.
    fn on_chunk(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        if v.get("error").is_some() {
            self.finished = true;
            return self.put(v, now, seen, out);
        }
        if !self.started {
            self.started = true;
            self.tail = tail(&v);
            let model = v["model"].as_str().unwrap_or(&self.model).to_owned();
            let r = json!({"id": format!("resp_{}", self.tail), "created_at": v["created"], "model": model});
            self.put(
                json!({"type": "response.created", "response": r}),
                now,
                seen,
                out,
            );
            self.put(
                json!({"type": "response.in_progress", "response": r}),
                now,
                seen,
                out,
            );
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        // Choice 0 only: a backend's other choices (n > 1) are not the client's answer.
        let Some(choice) = choice0(&v) else {
            return;
        };
        if let Some(d) = choice.get("delta") {
            let mut ops = Vec::new();
            feed(&mut self.order, d, &mut ops);
            self.write(ops, now, seen, out);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish = Some(f.to_owned());
        }
    }

    /// The end of the answer: the items held written, `response.completed` with the usage.
    fn finish(&mut self, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        let mut ops = Vec::new();
        self.order.finish(&mut ops);
        self.write(ops, now, seen, out);
        self.finished = true;
        let r = json!({"status": "completed", "completed_at": unix_now(),
            "incomplete_details": incomplete(self.finish.as_deref()),
            "usage": usage_json(self.usage.as_ref())});
        self.put(
            json!({"type": "response.completed", "response": r}),
            now,
            seen,
            out,
        );
        if let Some(u) = self.reported {
            seen.usage = Some(u);
        }
    }
}

impl ApiEvents for FromChat {
    fn event(&mut self, ev: &[u8], now: Instant, seen: &mut Seen) -> Action {
        let Some(data) = data_payload(ev) else {
            return Action::Drop;
        };
        if self.finished {
            return Action::Drop;
        }
        let mut out = Vec::new();
        if data == b"[DONE]" {
            if self.started {
                self.finish(now, seen, &mut out);
            }
            return Action::Replace(out);
        }
        let v = match chunk_of(data) {
            Ok(v) => v,
            Err(e) => {
                seen.error = Some(e.to_string());
                return Action::Replace(self.broken(&e, seen));
            }
        };
        if let Some((u, _)) = usage::of_event(data) {
            self.reported = Some(u);
        }
        self.on_chunk(v, now, seen, &mut out);
        Action::Replace(out)
    }

    fn end(&mut self, seen: &mut Seen) -> Option<Vec<u8>> {
        if self.finished {
            return None;
        }
        if self.started && self.finish.is_some() {
            let mut out = Vec::new();
            self.finish(Instant::now(), seen, &mut out);
            return Some(out);
        }
        self.finished = true;
        self.inner.end(seen)
    }

    fn broken(&mut self, e: &ProxyError, seen: &mut Seen) -> Vec<u8> {
        self.finished = true;
        self.inner.broken(e, seen)
    }
}

#[cfg(test)]
#[path = "from_chat_tests.rs"]
mod tests;
