//! The answer of a chat-only backend as a Messages answer: a `chat.completion` as a message,
//! a chat stream event by event as Messages events (`message_start`, one content block at a
//! time: thinking, text, tool use; `message_delta` with the stop reason and usage,
//! `message_stop`), tool calls as `tool_use` blocks, finish reasons as stop reasons.
//!
//! Blocks come in the order [`Order`] gives (its header has the design): one open at a time,
//! a tool call streamed live while no other call is open and kept open to the end, whatever
//! comes in the meantime held and written whole at the end, so a call's later fragment still
//! reaches its own block. A tool call without an id gets `toolu_` and an id made for the
//! answer; an event that cannot be read ends the stream with Anthropic's `error` event; only
//! choice 0 is translated.
//!
//! The events are built in the shape llama.cpp's own Messages endpoint sends and go through
//! the same repair as a native stream, so both reach the client alike.

use std::time::Instant;

use serde_json::{json, Value};

use super::stream::MessagesStream;
use crate::error::ProxyError;
use crate::from_chat::{
    arguments_of, choice0, id_of, name_of, reasoning_of, text_of, Block, Ids, Op, Order,
};
use crate::reasoning::TextSplitter;
use crate::stream::{ApiEvents, Seen, StreamContext};
use crate::translated::{self, NotChat, Translated};

/// Anthropic's stop reason for a chat finish reason.
pub(crate) fn stop_reason(finish: Option<&str>) -> &'static str {
    match finish {
        Some("length") => "max_tokens",
        Some("tool_calls" | "function_call") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    }
}

/// A chat usage object's prompt (less what was read from the cache), cached and completion
/// tokens, as Anthropic's usage.
fn usage_json(u: Option<&Value>) -> Value {
    let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
    let prompt = n(u.and_then(|u| u.get("prompt_tokens")));
    let cached = n(u.and_then(|u| u.pointer("/prompt_tokens_details/cached_tokens"))).min(prompt);
    let completion = n(u.and_then(|u| u.get("completion_tokens")));
    json!({"input_tokens": prompt - cached, "cache_read_input_tokens": cached,
        "output_tokens": completion})
}

/// Anthropic's id for a chat id.
fn message_id(chat: &Value) -> String {
    let id = chat.get("id").and_then(Value::as_str).unwrap_or("");
    format!("msg_{}", id.strip_prefix("chatcmpl-").unwrap_or(id))
}

/// A whole `chat.completion` as a Messages answer; what is wrong with it when it is not one
/// (no choice 0, or a choice without a message).
pub(crate) fn answer(chat: &[u8], ctx: &StreamContext) -> Result<Vec<u8>, NotChat> {
    let v: Value = serde_json::from_slice(chat)?;
    let choice = choice0(&v).ok_or("an answer without choice 0")?;
    let message = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or("choice 0 without a message")?;
    let mut content = Vec::new();
    if let Some(r) = reasoning_of(message) {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    let text = text_of(message.get("content"));
    let (thinking, text) = match ctx.tags.as_deref() {
        Some(tags) => {
            let split = TextSplitter::split_all(tags, &text);
            (split.reasoning, split.answer)
        }
        None => (String::new(), text),
    };
    if !thinking.is_empty() {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    let ids = Ids::new("toolu_");
    for (n, call) in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        content.push(tool_use(call, &ids.id(id_of(call), n)));
    }
    let finish = choice.get("finish_reason").and_then(Value::as_str);
    let model = v.get("model").and_then(Value::as_str).unwrap_or(&ctx.model);
    let out = json!({
        "id": message_id(&v), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason(finish), "stop_sequence": null,
        "usage": usage_json(v.get("usage")),
    });
    Ok(serde_json::to_vec(&out)?)
}

/// A chat tool call as a `tool_use` block with id `id` (arguments that are not a JSON object:
/// `{}`).
fn tool_use(call: &Value, id: &str) -> Value {
    let args = serde_json::from_str::<Value>(&arguments_of(call))
        .ok()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({
        "type": "tool_use", "id": id, "name": name_of(call).unwrap_or(""), "input": args,
    })
}

/// A chat stream translated into a Messages stream, event by event.
pub(crate) type FromChat = Translated<Writer>;

/// The Messages events of a translated chat stream.
pub(crate) struct Writer {
    inner: MessagesStream,
    model: String,
    /// The backend index of the block open now (the repair renumbers them).
    block: u64,
    /// The delta type of the block open now.
    delta_type: &'static str,
}

/// The translation of a chat stream for `ctx`.
pub(crate) fn translation(ctx: &StreamContext) -> FromChat {
    let writer = Writer {
        inner: MessagesStream::new(ctx.tags.clone()),
        model: ctx.model.clone(),
        block: 0,
        delta_type: "text_delta",
    };
    Translated::new(writer, Order::new(Ids::new("toolu_")))
}

impl translated::Writer for Writer {
    fn put(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        self.inner.handle(v, now, seen, out);
    }

    fn start(&mut self, v: &Value) -> Vec<Value> {
        let model = v
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(&self.model);
        vec![json!({"type": "message_start", "message": {
            "id": message_id(v), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0}}})]
    }

    /// A block [`Order`] wrote, as a Messages event.
    fn op(&mut self, op: Op) -> Value {
        match op {
            Op::Open(block) => {
                self.block += 1;
                let start = match block {
                    Block::Thinking => {
                        self.delta_type = "thinking_delta";
                        json!({"type": "thinking", "thinking": "", "signature": ""})
                    }
                    Block::Text => {
                        self.delta_type = "text_delta";
                        json!({"type": "text", "text": ""})
                    }
                    Block::Tool { id, name } => {
                        self.delta_type = "input_json_delta";
                        json!({"type": "tool_use", "id": id, "name": name, "input": {}})
                    }
                };
                json!({"type": "content_block_start", "index": self.block,
                    "content_block": start})
            }
            Op::Delta(d) => {
                let delta = match self.delta_type {
                    "thinking_delta" => json!({"type": self.delta_type, "thinking": d}),
                    "input_json_delta" => json!({"type": self.delta_type, "partial_json": d}),
                    _ => json!({"type": self.delta_type, "text": d}),
                };
                json!({"type": "content_block_delta", "index": self.block, "delta": delta})
            }
            Op::Close => json!({"type": "content_block_stop", "index": self.block}),
        }
    }

    /// Stop reason and usage, `message_stop`.
    fn close(&mut self, finish: Option<&str>, usage: Option<&Value>) -> Vec<Value> {
        vec![
            json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(finish), "stop_sequence": null},
                "usage": usage_json(usage)}),
            json!({"type": "message_stop"}),
        ]
    }

    fn end(&mut self, seen: &mut Seen) -> Option<Vec<u8>> {
        self.inner.end(seen)
    }

    fn broken(&mut self, e: &ProxyError, seen: &mut Seen) -> Vec<u8> {
        self.inner.broken(e, seen)
    }
}

#[cfg(test)]
pub(crate) mod tests;
