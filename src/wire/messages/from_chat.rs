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
use crate::reasoning::TextSplitter;
use crate::wire::from_chat::{
    arguments_of, choice0, chunk_of, feed, id_of, name_of, reasoning_of, text_of, Block, Ids, Op,
    Order,
};
use crate::wire::stream::{data_payload, Action, ApiEvents, Seen, StreamContext};
use crate::wire::usage::{self, Usage};

/// Anthropic's stop reason for a chat finish reason.
pub fn stop_reason(finish: Option<&str>) -> &'static str {
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
pub fn answer(chat: &[u8], ctx: &StreamContext) -> Result<Vec<u8>, String> {
    let v: Value = serde_json::from_slice(chat).map_err(|e| format!("not JSON: {e}"))?;
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
    serde_json::to_vec(&out).map_err(|e| e.to_string())
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
pub struct FromChat {
    inner: MessagesStream,
    model: String,
    started: bool,
    finished: bool,
    order: Order,
    /// The backend index of the block open now (the repair renumbers them).
    block: u64,
    /// The delta type of the block open now.
    delta_type: &'static str,
    finish: Option<String>,
    usage: Option<Value>,
    reported: Option<Usage>,
}

impl FromChat {
    pub fn new(ctx: &StreamContext) -> Self {
        FromChat {
            inner: MessagesStream::new(ctx.tags.clone()),
            model: ctx.model.clone(),
            started: false,
            finished: false,
            order: Order::new(Ids::new("toolu_")),
            block: 0,
            delta_type: "text_delta",
            finish: None,
            usage: None,
            reported: None,
        }
    }

    fn put(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        self.inner.handle(v, now, seen, out);
    }

    /// The blocks [`Order`] wrote, as Messages events.
    fn write(&mut self, ops: Vec<Op>, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        for op in ops {
            let ev = match op {
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
            let model = v
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or(&self.model);
            let start = json!({"type": "message_start", "message": {
                "id": message_id(&v), "type": "message", "role": "assistant", "model": model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "output_tokens": 0}}});
            self.put(start, now, seen, out);
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
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_owned());
        }
    }

    /// The end of the answer: the blocks held written, stop reason and usage, `message_stop`.
    fn finish(&mut self, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        let mut ops = Vec::new();
        self.order.finish(&mut ops);
        self.write(ops, now, seen, out);
        self.finished = true;
        let delta = json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(self.finish.as_deref()), "stop_sequence": null},
            "usage": usage_json(self.usage.as_ref())});
        self.put(delta, now, seen, out);
        self.put(json!({"type": "message_stop"}), now, seen, out);
        // The chat usage has the backend's own speeds, which Anthropic's usage has no room for.
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
            self.finish(now, seen, &mut out);
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
        let mut out = Vec::new();
        if self.started && self.finish.is_some() {
            self.finish(Instant::now(), seen, &mut out);
            return Some(out);
        }
        self.inner.end(seen)
    }

    fn broken(&mut self, e: &ProxyError, seen: &mut Seen) -> Vec<u8> {
        self.finished = true;
        self.inner.broken(e, seen)
    }
}

#[cfg(test)]
#[path = "from_chat_tests.rs"]
pub(crate) mod tests;
