//! The answer of a chat-only backend as a Responses answer: a `chat.completion` as a response
//! object, a chat stream event by event as Responses events (`response.created`,
//! `response.in_progress`, one output item at a time — reasoning, message, function calls —
//! then `response.completed` with the usage), tool calls as `function_call` items.
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
use crate::wire::stream::{data_payload, Action, ApiEvents, Seen, StreamContext};
use crate::wire::usage::{self, Usage};

/// The id tail shared by the response and its items.
fn tail(chat: &Value) -> String {
    let id = chat["id"].as_str().unwrap_or("");
    id.strip_prefix("chatcmpl-").unwrap_or(id).to_owned()
}

fn reasoning_of(m: &Value) -> Option<&str> {
    ["reasoning_content", "reasoning"]
        .iter()
        .find_map(|k| m.get(*k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
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

/// A chat tool call as a `function_call` item.
fn function_call(call: &Value, status: &str) -> Value {
    let id = call["id"].as_str().unwrap_or("");
    json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": id,
        "name": call["function"]["name"].as_str().unwrap_or(""),
        "arguments": call["function"]["arguments"].as_str().unwrap_or(""), "status": status})
}

/// A whole `chat.completion` as a Responses answer.
pub fn answer(chat: &[u8], ctx: &StreamContext) -> Option<Vec<u8>> {
    let v: Value = serde_json::from_slice(chat).ok()?;
    let choice = v.get("choices")?.get(0)?;
    let message = choice.get("message")?;
    let t = tail(&v);
    let mut reasoning = reasoning_of(message).unwrap_or("").to_owned();
    let mut text = message["content"].as_str().unwrap_or("").to_owned();
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
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        output.push(function_call(call, "completed"));
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
    serde_json::to_vec(&Value::Object(r)).ok()
}

/// The item the chat stream is writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Current {
    Reasoning,
    Message,
    Tool(u64),
}

/// A chat stream translated into a Responses stream, event by event.
pub struct FromChat {
    inner: ResponsesStream,
    model: String,
    tail: String,
    started: bool,
    finished: bool,
    current: Option<Current>,
    /// The backend id of the item written now.
    item: String,
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
            current: None,
            item: String::new(),
            items: 0,
            finish: None,
            usage: None,
            reported: None,
        }
    }

    fn put(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        self.inner.handle(v, now, seen, out);
    }

    /// Makes `kind` the item written now (adding `item` when it is not): its backend id.
    fn item(
        &mut self,
        kind: Current,
        mut item: Value,
        now: Instant,
        seen: &mut Seen,
        out: &mut Vec<u8>,
    ) -> String {
        if self.current != Some(kind) {
            self.current = Some(kind);
            self.items += 1;
            if item["id"].is_null() {
                let prefix = if kind == Current::Reasoning {
                    "rs"
                } else {
                    "msg"
                };
                let n = if self.items > 1 {
                    format!("_{}", self.items)
                } else {
                    String::new()
                };
                item["id"] = json!(format!("{prefix}_{}{n}", self.tail));
            }
            self.item = item["id"].as_str().unwrap_or("").to_owned();
            self.put(
                json!({"type": "response.output_item.added", "item": item}),
                now,
                seen,
                out,
            );
        }
        self.item.clone()
    }

    /// One chat choice delta: reasoning, text and tool calls, in that order.
    fn on_delta(&mut self, d: &Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        if let Some(r) = reasoning_of(d) {
            let id = self.item(
                Current::Reasoning,
                json!({"type": "reasoning"}),
                now,
                seen,
                out,
            );
            let ev = json!({"type": "response.reasoning_text.delta", "item_id": id, "delta": r});
            self.put(ev, now, seen, out);
        }
        if let Some(t) = d["content"].as_str().filter(|t| !t.is_empty()) {
            let id = self.item(
                Current::Message,
                json!({"type": "message", "role": "assistant"}),
                now,
                seen,
                out,
            );
            let ev = json!({"type": "response.output_text.delta", "item_id": id, "delta": t});
            self.put(ev, now, seen, out);
        }
        for call in d["tool_calls"].as_array().into_iter().flatten() {
            let n = call["index"].as_u64().unwrap_or(0);
            let starts = call["function"]["name"].is_string() || call["id"].is_string();
            if self.current != Some(Current::Tool(n)) && starts {
                let mut item = function_call(call, "in_progress");
                item["arguments"] = json!("");
                self.item(Current::Tool(n), item, now, seen, out);
            }
            if let Some(a) = call["function"]["arguments"]
                .as_str()
                .filter(|a| !a.is_empty())
            {
                let ev = json!({"type": "response.function_call_arguments.delta",
                    "item_id": self.item, "delta": a});
                self.put(ev, now, seen, out);
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
        let Some(choice) = v["choices"].get(0) else {
            return;
        };
        if let Some(d) = choice.get("delta") {
            self.on_delta(d, now, seen, out);
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            self.finish = Some(f.to_owned());
        }
    }

    /// The end of the answer: `response.completed` with the usage.
    fn finish(&mut self, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
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
        let mut out = Vec::new();
        if data == b"[DONE]" {
            if !self.finished && self.started {
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
