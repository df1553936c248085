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
use crate::from_chat::{
    arguments_of, choice0, id_of, name_of, reasoning_of, text_of, Block, Ids, Op, Order,
};
use crate::reasoning::TextSplitter;
use crate::stream::{ApiEvents, Seen, StreamContext};
use crate::translated::{self, NotChat, Translated};

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
pub(crate) fn answer(chat: &[u8], ctx: &StreamContext) -> Result<Vec<u8>, NotChat> {
    let v: Value = serde_json::from_slice(chat)?;
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
    Ok(serde_json::to_vec(&Value::Object(r))?)
}

/// A chat stream translated into a Responses stream, event by event.
pub(crate) type FromChat = Translated<Writer>;

/// The Responses events of a translated chat stream.
pub(crate) struct Writer {
    inner: ResponsesStream,
    model: String,
    tail: String,
    /// The backend id of the item open now and the kind of its deltas.
    item: String,
    delta_type: &'static str,
    items: u32,
}

/// The translation of a chat stream for `ctx`.
pub(crate) fn translation(ctx: &StreamContext) -> FromChat {
    let writer = Writer {
        inner: ResponsesStream::new(ctx.tags.clone(), &ctx.model),
        model: ctx.model.clone(),
        tail: String::new(),
        item: String::new(),
        delta_type: "response.output_text.delta",
        items: 0,
    };
    Translated::new(writer, Order::new(Ids::new("call_")))
}

impl Writer {
    /// The id of a reasoning or message item: the response's tail, numbered after the first.
    fn item_id(&self, prefix: &str) -> String {
        let n = if self.items > 1 {
            format!("_{}", self.items)
        } else {
            String::new()
        };
        format!("{prefix}_{}{n}", self.tail)
    }
}

impl translated::Writer for Writer {
    fn put(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        self.inner.handle(v, now, seen, out);
    }

    fn start(&mut self, v: &Value) -> Vec<Value> {
        self.tail = tail(v);
        let model = v["model"].as_str().unwrap_or(&self.model).to_owned();
        let r = json!({"id": format!("resp_{}", self.tail), "created_at": v["created"], "model": model});
        vec![
            json!({"type": "response.created", "response": r}),
            json!({"type": "response.in_progress", "response": r}),
        ]
    }

    /// An item [`Order`] wrote, as a Responses event.
    fn op(&mut self, op: Op) -> Value {
        match op {
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
        }
    }

    /// `response.completed` with the usage.
    fn close(&mut self, finish: Option<&str>, usage: Option<&Value>) -> Vec<Value> {
        let r = json!({"status": "completed", "completed_at": unix_now(),
            "incomplete_details": incomplete(finish),
            "usage": usage_json(usage)});
        vec![json!({"type": "response.completed", "response": r})]
    }

    fn end(&mut self, seen: &mut Seen) -> Option<Vec<u8>> {
        self.inner.end(seen)
    }

    fn broken(&mut self, e: &ProxyError, seen: &mut Seen) -> Vec<u8> {
        self.inner.broken(e, seen)
    }
}

#[cfg(test)]
mod tests;
