//! The answer of a chat-only backend as a Messages answer: a `chat.completion` as a message,
//! a chat stream event by event as Messages events (`message_start`, one content block at a
//! time: thinking, text, tool use; `message_delta` with the stop reason and usage,
//! `message_stop`), tool calls as `tool_use` blocks, finish reasons as stop reasons.
//!
//! The events are built in the shape llama.cpp's own Messages endpoint sends and go through
//! the same repair as a native stream, so both reach the client alike.

use std::time::Instant;

use serde_json::{json, Value};

use super::stream::MessagesStream;
use crate::error::ProxyError;
use crate::reasoning::TextSplitter;
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

/// The reasoning of a chat message or delta, under either field name.
fn reasoning_of(m: &Value) -> Option<&str> {
    ["reasoning_content", "reasoning"]
        .iter()
        .find_map(|k| m.get(*k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
}

/// Anthropic's id for a chat id.
fn message_id(chat: &Value) -> String {
    let id = chat.get("id").and_then(Value::as_str).unwrap_or("");
    format!("msg_{}", id.strip_prefix("chatcmpl-").unwrap_or(id))
}

/// A whole `chat.completion` as a Messages answer.
pub fn answer(chat: &[u8], ctx: &StreamContext) -> Option<Vec<u8>> {
    let v: Value = serde_json::from_slice(chat).ok()?;
    let choice = v.get("choices")?.get(0)?;
    let message = choice.get("message")?;
    let mut content = Vec::new();
    if let Some(r) = reasoning_of(message) {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    let text = message.get("content").and_then(Value::as_str).unwrap_or("");
    let (thinking, text) = match ctx.tags.as_deref() {
        Some(tags) => {
            let split = TextSplitter::split_all(tags, text);
            (split.reasoning, split.answer)
        }
        None => (String::new(), text.to_owned()),
    };
    if !thinking.is_empty() {
        content.push(json!({"type": "thinking", "thinking": thinking, "signature": ""}));
    }
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        content.push(tool_use(call));
    }
    let finish = choice.get("finish_reason").and_then(Value::as_str);
    let model = v.get("model").and_then(Value::as_str).unwrap_or(&ctx.model);
    let out = json!({
        "id": message_id(&v), "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": stop_reason(finish), "stop_sequence": null,
        "usage": usage_json(v.get("usage")),
    });
    serde_json::to_vec(&out).ok()
}

/// A chat tool call as a `tool_use` block (arguments that are not a JSON object: `{}`).
fn tool_use(call: &Value) -> Value {
    let f = call.get("function");
    let args = f
        .and_then(|f| f.get("arguments"))
        .and_then(Value::as_str)
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({
        "type": "tool_use",
        "id": call.get("id").and_then(Value::as_str).unwrap_or(""),
        "name": f.and_then(|f| f.get("name")).and_then(Value::as_str).unwrap_or(""),
        "input": args,
    })
}

/// The block the chat stream is writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Current {
    Thinking,
    Text,
    Tool(u64),
}

/// A chat stream translated into a Messages stream, event by event.
pub struct FromChat {
    inner: MessagesStream,
    model: String,
    started: bool,
    finished: bool,
    current: Option<Current>,
    next_index: u64,
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
            current: None,
            next_index: 0,
            finish: None,
            usage: None,
            reported: None,
        }
    }

    fn put(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        self.inner.handle(v, now, seen, out);
    }

    /// The backend index of a block of `kind`: the current one, or a new one started.
    fn block(
        &mut self,
        kind: Current,
        start: Value,
        now: Instant,
        seen: &mut Seen,
        out: &mut Vec<u8>,
    ) -> u64 {
        if self.current != Some(kind) {
            self.current = Some(kind);
            self.next_index += 1;
            let ev = json!({"type": "content_block_start", "index": self.next_index,
                "content_block": start});
            self.put(ev, now, seen, out);
        }
        self.next_index
    }

    fn delta(
        &mut self,
        index: u64,
        delta: Value,
        now: Instant,
        seen: &mut Seen,
        out: &mut Vec<u8>,
    ) {
        let ev = json!({"type": "content_block_delta", "index": index, "delta": delta});
        self.put(ev, now, seen, out);
    }

    /// One chat choice delta: reasoning, text and tool calls, in that order.
    fn on_delta(&mut self, d: &Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        if let Some(r) = reasoning_of(d) {
            let start = json!({"type": "thinking", "thinking": "", "signature": ""});
            let i = self.block(Current::Thinking, start, now, seen, out);
            self.delta(
                i,
                json!({"type": "thinking_delta", "thinking": r}),
                now,
                seen,
                out,
            );
        }
        if let Some(t) = d
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            let i = self.block(
                Current::Text,
                json!({"type": "text", "text": ""}),
                now,
                seen,
                out,
            );
            self.delta(i, json!({"type": "text_delta", "text": t}), now, seen, out);
        }
        for call in d
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let n = call.get("index").and_then(Value::as_u64).unwrap_or(0);
            let f = call.get("function");
            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
            if self.current != Some(Current::Tool(n))
                && (name.is_some() || call.get("id").is_some())
            {
                let mut start = tool_use(call);
                start["input"] = json!({});
                self.block(Current::Tool(n), start, now, seen, out);
            }
            let args = f.and_then(|f| f.get("arguments")).and_then(Value::as_str);
            if let Some(a) = args.filter(|a| !a.is_empty()) {
                let i = self.next_index;
                self.delta(
                    i,
                    json!({"type": "input_json_delta", "partial_json": a}),
                    now,
                    seen,
                    out,
                );
            }
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
        let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
            return;
        };
        if let Some(d) = choice.get("delta") {
            self.on_delta(d, now, seen, out);
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_owned());
        }
    }

    /// The end of the answer: stop reason and usage, then `message_stop`.
    fn finish(&mut self, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
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
        let mut out = Vec::new();
        if data == b"[DONE]" {
            if !self.finished {
                self.finish(now, seen, &mut out);
            }
            return Action::Replace(out);
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            return Action::Drop;
        };
        if let Some((u, _)) = usage::of_event(data) {
            self.reported = Some(u);
        }
        if self.finished || !v.is_object() {
            return Action::Drop;
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
mod tests;
