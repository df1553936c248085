//! A Responses stream made to the specification, whatever the backend sent: each backend
//! event is read for what it says (an item added, text, arguments, a part or item done, the
//! response's lifecycle) and written again through the [`Writer`], which numbers and indexes
//! everything; inline think tags in a message's text become a `reasoning` item before it;
//! usage is read from the final response; the backend's error becomes the API's `error` event
//! and `response.failed`.
//!
//! llama.cpp's own stream leaves out `sequence_number`, `output_index`, `content_index`,
//! `logprobs` and a reasoning item's content part, keeps a reasoning item open until the end
//! of the answer, never closes a function call's arguments, and sends a bare response object
//! in `response.created`: the official SDK's stream helper fails on it as it is.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Map, Value};

use super::events::{ItemKind, Writer};
use super::usage;
use crate::error::ProxyError;
use crate::reasoning::{Split, TextSplitter, ThinkTags};
use crate::stream::{named_data, Action, ApiEvents, Seen};

/// A message item whose text is split on think tags into reasoning and message items.
struct SplitMessage {
    backend_id: String,
    item: Value,
    splitter: TextSplitter,
    /// Items written for it so far (for their ids).
    written: u32,
}

/// The per-stream repair of one Responses stream.
pub(crate) struct ResponsesStream {
    w: Writer,
    tags: Option<Arc<ThinkTags>>,
    model: String,
    /// The response object as the lifecycle events described it.
    base: Map<String, Value>,
    created: bool,
    finished: bool,
    split: Option<SplitMessage>,
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The fields every response object has, where `b` lacks them.
pub(crate) fn complete_response(b: &mut Map<String, Value>, model: &str) {
    let id = format!("resp_{:x}", unix_now());
    b.entry("id").or_insert_with(|| json!(id));
    b.entry("created_at").or_insert_with(|| json!(unix_now()));
    b.entry("model").or_insert_with(|| json!(model));
    for (k, v) in [
        ("object", json!("response")),
        ("error", Value::Null),
        ("incomplete_details", Value::Null),
        ("instructions", Value::Null),
        ("metadata", json!({})),
        ("parallel_tool_calls", json!(true)),
        ("temperature", Value::Null),
        ("tool_choice", json!("auto")),
        ("tools", json!([])),
        ("top_p", Value::Null),
        ("usage", Value::Null),
    ] {
        b.entry(k).or_insert(v);
    }
}

impl ResponsesStream {
    pub(crate) fn new(tags: Option<Arc<ThinkTags>>, model: &str) -> Self {
        ResponsesStream {
            w: Writer::default(),
            tags,
            model: model.to_owned(),
            base: Map::new(),
            created: false,
            finished: false,
            split: None,
        }
    }

    /// `r` over what the lifecycle said so far, every required field present.
    fn response(&mut self, r: Option<&Value>, status: &str) -> Value {
        if let Some(r) = r.and_then(Value::as_object) {
            for (k, v) in r {
                self.base.insert(k.clone(), v.clone());
            }
        }
        complete_response(&mut self.base, &self.model);
        let mut r = Value::Object(self.base.clone());
        r["status"] = json!(status);
        r["output"] = Value::Array(if status == "in_progress" || status == "queued" {
            Vec::new()
        } else {
            self.w.output()
        });
        r
    }

    /// `response.created` first, whatever the backend began with.
    fn ensure_created(&mut self, out: &mut Vec<u8>) {
        if !self.created {
            self.created = true;
            let r = self.response(None, "in_progress");
            self.w
                .emit(json!({"type": "response.created", "response": r}), out);
        }
    }

    /// `response.created`, `.in_progress`, `.queued`.
    fn on_lifecycle(&mut self, kind: &str, v: &Value, out: &mut Vec<u8>) {
        let status = if kind == "response.queued" {
            "queued"
        } else {
            "in_progress"
        };
        let r = self.response(v.get("response"), status);
        if kind == "response.created" {
            if !self.created {
                self.created = true;
                self.w.emit(json!({"type": kind, "response": r}), out);
            }
            return;
        }
        self.ensure_created(out);
        self.w.emit(json!({"type": kind, "response": r}), out);
    }

    /// `response.completed`, `.incomplete`, `.failed`: open items closed, the final output
    /// the items streamed, usage read.
    fn on_final(
        &mut self,
        kind: &str,
        v: &Value,
        now: Instant,
        seen: &mut Seen,
        out: &mut Vec<u8>,
    ) {
        self.finish_split(now, seen, out);
        self.w.close_open(out);
        let given = v.get("response");
        let status = given
            .and_then(|r| r.get("status"))
            .and_then(Value::as_str)
            .unwrap_or(match kind {
                "response.failed" => "failed",
                "response.incomplete" => "incomplete",
                _ => "completed",
            })
            .to_owned();
        let r = self.response(given, &status);
        if let Some(u) = usage::of_response(&r, v.get("timings")) {
            seen.usage = Some(u);
        }
        self.finished = true;
        self.w.emit(json!({"type": kind, "response": r}), out);
    }

    /// The client item the backend's `item_id` names (added when the backend never did).
    fn item_for(&mut self, v: &Value, kind: ItemKind, out: &mut Vec<u8>) -> usize {
        let id = v.get("item_id").and_then(Value::as_str);
        if let Some(i) = id.and_then(|id| self.w.find(id)) {
            return i;
        }
        if let (None, Some(i)) = (id, self.w.open_item()) {
            return i;
        }
        let (prefix, ty) = match kind {
            ItemKind::Reasoning => ("rs", "reasoning"),
            ItemKind::FunctionCall => ("fc", "function_call"),
            _ => ("msg", "message"),
        };
        let id = id.map_or_else(|| format!("{prefix}_{}", self.w.items.len()), str::to_owned);
        self.w.add_item(&id, json!({"type": ty, "id": id}), out)
    }

    /// The backend's message item `id` is being split on think tags.
    fn splitting(&self, v: &Value) -> bool {
        let id = v
            .get("item_id")
            .or_else(|| v.get("item").and_then(|i| i.get("id")))
            .and_then(Value::as_str);
        self.split
            .as_ref()
            .is_some_and(|s| id.is_none_or(|id| id == s.backend_id))
    }

    /// Text the splitter settled: reasoning to a reasoning item, answer to a message item.
    fn put_split(&mut self, split: Split, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        for (kind, text) in [
            (ItemKind::Reasoning, split.reasoning),
            (ItemKind::Message, split.answer),
        ] {
            if text.is_empty() {
                continue;
            }
            let i = match self.w.open_item() {
                Some(i) if self.w.items[i].kind == kind => i,
                _ => self.split_item(kind, out),
            };
            let part = if kind == ItemKind::Reasoning {
                "reasoning_text"
            } else {
                "output_text"
            };
            self.w.text_delta(i, part, &text, None, (now, seen), out);
        }
    }

    /// A new item written for the split message.
    fn split_item(&mut self, kind: ItemKind, out: &mut Vec<u8>) -> usize {
        let Some(s) = self.split.as_mut() else {
            return self.w.add_item("", json!({"type": "message"}), out);
        };
        let n = s.written;
        s.written += 1;
        let tail = s.backend_id.strip_prefix("msg_").unwrap_or(&s.backend_id);
        let suffix = if n > 1 {
            format!("_{n}")
        } else {
            String::new()
        };
        let item = match kind {
            ItemKind::Reasoning => json!({"type": "reasoning", "id": format!("rs_{tail}{suffix}")}),
            _ => {
                let mut item = s.item.clone();
                item["id"] = json!(format!("{}{suffix}", s.backend_id));
                item
            }
        };
        let backend_id = s.backend_id.clone();
        self.w.add_item(&backend_id, item, out)
    }

    fn finish_split(&mut self, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        let Some(mut s) = self.split.take() else {
            return;
        };
        let held = s.splitter.finish();
        self.split = Some(s);
        self.put_split(held, now, seen, out);
        self.split = None;
        self.w.close_open(out);
    }
}

impl ResponsesStream {
    /// A text delta (`output_text`, `reasoning_text`, `refusal`).
    fn on_text(&mut self, part: &str, v: &Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        let delta = v.get("delta").and_then(Value::as_str).unwrap_or("");
        if part == "output_text" && self.splitting(v) {
            if let Some(s) = self.split.as_mut() {
                let split = s.splitter.push(delta);
                self.put_split(split, now, seen, out);
            }
            return;
        }
        let kind = if part == "reasoning_text" {
            ItemKind::Reasoning
        } else {
            ItemKind::Message
        };
        let i = self.item_for(v, kind, out);
        if !self.w.items[i].open {
            return;
        }
        self.w.text_delta(i, part, delta, Some(v), (now, seen), out);
    }

    /// `response.output_item.added`.
    fn on_item_added(&mut self, v: &Value, out: &mut Vec<u8>) {
        let item = v.get("item").cloned().unwrap_or_else(|| json!({}));
        let kind = ItemKind::of(item["type"].as_str().unwrap_or(""));
        let id = item["id"]
            .as_str()
            .map_or_else(|| format!("item_{}", self.w.items.len()), str::to_owned);
        if let (ItemKind::Message, Some(tags)) = (kind, &self.tags) {
            self.w.close_open(out);
            self.split = Some(SplitMessage {
                backend_id: id,
                item,
                splitter: TextSplitter::new(Arc::clone(tags)),
                written: 0,
            });
            return;
        }
        self.w.add_item(&id, item, out);
    }

    /// `response.output_item.done`.
    fn on_item_done(&mut self, v: &Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        if self.splitting(v) {
            return self.finish_split(now, seen, out);
        }
        let item = v.get("item").cloned().unwrap_or_else(|| json!({}));
        let id = item["id"].as_str().unwrap_or("").to_owned();
        let i = match self.w.find(&id) {
            Some(i) => i,
            None => self.w.add_item(&id, item.clone(), out),
        };
        self.w.close_item(i, Some(&item), out);
    }

    /// `content_part.added/done` and text `done` events: parts as the writer keeps them.
    fn on_part(&mut self, kind: &str, v: &Value, out: &mut Vec<u8>) {
        if self.splitting(v) {
            return;
        }
        let Some(i) = v["item_id"].as_str().and_then(|id| self.w.find(id)) else {
            return;
        };
        if !self.w.items[i].open {
            return;
        }
        let part = v["part"]["type"].as_str().unwrap_or(match kind {
            "response.reasoning_text.done" => "reasoning_text",
            "response.refusal.done" => "refusal",
            _ => "output_text",
        });
        let j = self.w.part(i, part, out);
        match kind {
            "response.content_part.done" => self.w.close_part(i, j, out),
            "response.content_part.added" => {}
            _ => self.w.text_done(i, j, out),
        }
    }

    /// A function call's arguments, growing or done.
    fn on_args(&mut self, kind: &str, v: &Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        let i = self.item_for(v, ItemKind::FunctionCall, out);
        if !self.w.items[i].open {
            return;
        }
        if kind == "response.function_call_arguments.delta" {
            let delta = v["delta"].as_str().unwrap_or("");
            self.w.args_delta(i, delta, now, seen, out);
        } else {
            self.w.args_done(i, v["arguments"].as_str(), out);
        }
    }

    /// The backend's error: the API's `error` event, then `response.failed`.
    fn on_error(
        &mut self,
        code: &str,
        message: &str,
        now: Instant,
        seen: &mut Seen,
        out: &mut Vec<u8>,
    ) {
        seen.error = Some(format!("error event from backend: {message}"));
        self.finish_split(now, seen, out);
        self.fail(code, message, out);
    }

    /// `error` and `response.failed` with `code` and `message`.
    pub(crate) fn fail(&mut self, code: &str, message: &str, out: &mut Vec<u8>) {
        self.ensure_created(out);
        let ev = json!({"type": "error", "code": code, "message": message, "param": null});
        self.w.emit(ev, out);
        let mut r = self.response(None, "failed");
        r["error"] = json!({"code": code, "message": message});
        self.w
            .emit(json!({"type": "response.failed", "response": r}), out);
        self.finished = true;
    }

    /// One backend event's JSON, written again into `out`.
    pub(crate) fn handle(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        let kind = v["type"].as_str().unwrap_or("").to_owned();
        if let Some(e) = v
            .get("error")
            .filter(|_| kind.is_empty() || kind == "error")
        {
            let (code, message) = error_parts(e, &v);
            return self.on_error(&code, &message, now, seen, out);
        }
        if kind == "error" {
            let (code, message) = error_parts(&v, &v);
            return self.on_error(&code, &message, now, seen, out);
        }
        if !matches!(
            kind.as_str(),
            "response.created" | "response.in_progress" | "response.queued"
        ) {
            self.ensure_created(out);
        }
        match kind.as_str() {
            "response.created" | "response.in_progress" | "response.queued" => {
                self.on_lifecycle(&kind, &v, out)
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                self.on_final(&kind, &v, now, seen, out)
            }
            "response.output_item.added" => self.on_item_added(&v, out),
            "response.output_item.done" => self.on_item_done(&v, now, seen, out),
            "response.output_text.delta" => self.on_text("output_text", &v, now, seen, out),
            "response.reasoning_text.delta" => self.on_text("reasoning_text", &v, now, seen, out),
            "response.refusal.delta" => self.on_text("refusal", &v, now, seen, out),
            "response.content_part.added"
            | "response.content_part.done"
            | "response.output_text.done"
            | "response.reasoning_text.done"
            | "response.refusal.done" => self.on_part(&kind, &v, out),
            "response.function_call_arguments.delta" | "response.function_call_arguments.done" => {
                self.on_args(&kind, &v, now, seen, out)
            }
            _ => self.pass(v, out),
        }
    }

    /// An event the repair has no rule for: numbered, its item's index filled in.
    fn pass(&mut self, mut v: Value, out: &mut Vec<u8>) {
        if v.get("type").is_none() {
            return;
        }
        let at = v["item_id"].as_str().and_then(|id| self.w.find(id));
        if let (Some(i), Some(obj)) = (at, v.as_object_mut()) {
            obj.entry("output_index").or_insert(json!(i));
        }
        self.w.emit(v, out);
    }
}

/// `code` and `message` of a backend error object (llama.cpp's `{"code":500,"message",
/// "type":"server_error"}`, OpenAI's `{"code":"…","message"}`).
fn error_parts(e: &Value, event: &Value) -> (String, String) {
    let code = match (&e["code"], &e["type"]) {
        (Value::String(c), _) => c.clone(),
        (_, Value::String(t)) if t != "error" => t.clone(),
        _ => "server_error".to_owned(),
    };
    let message = e["message"]
        .as_str()
        .or_else(|| event["message"].as_str())
        .unwrap_or("the backend failed during the stream")
        .to_owned();
    (code, message)
}

impl ApiEvents for ResponsesStream {
    fn event(&mut self, ev: &[u8], now: Instant, seen: &mut Seen) -> Action {
        let (_, data) = named_data(ev);
        let Some(v) = data.and_then(|d| serde_json::from_slice::<Value>(d).ok()) else {
            // Comments (keep-alives) and `[DONE]`, which this API does not have.
            return if data == Some(b"[DONE]") {
                Action::Drop
            } else {
                Action::Keep
            };
        };
        if self.finished || !v.is_object() {
            return Action::Drop;
        }
        let mut out = Vec::with_capacity(ev.len() + 96);
        self.handle(v, now, seen, &mut out);
        Action::Replace(out)
    }

    fn end(&mut self, seen: &mut Seen) -> Option<Vec<u8>> {
        if self.finished {
            return None;
        }
        let e = ProxyError::UpstreamProtocol {
            backend: String::new(),
            detail: "the stream ended before response.completed".into(),
        };
        seen.error = Some(e.to_string());
        Some(self.broken(&e, seen))
    }

    fn broken(&mut self, e: &ProxyError, seen: &mut Seen) -> Vec<u8> {
        let mut out = Vec::new();
        if self.finished {
            return out;
        }
        self.finish_split(Instant::now(), seen, &mut out);
        let (_, kind, _, code) = e.parts();
        self.fail(code.unwrap_or(kind), &e.to_string(), &mut out);
        out
    }
}

#[cfg(test)]
pub(crate) mod tests;
