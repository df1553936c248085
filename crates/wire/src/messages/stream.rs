//! A Messages stream made to the specification, whatever the backend sent: content blocks one
//! after the other (a block is stopped before the next starts, a thinking block signed before
//! it stops), every block's required fields present, usage read from `message_start` and
//! `message_delta`, inline think tags split into `thinking` blocks, the backend's error event
//! in Anthropic's envelope, first tokens timed.
//!
//! llama.cpp keeps its thinking block open until the end of the answer, after the text block
//! that follows it, and leaves `input` out of a `tool_use` block's start: both are repaired
//! here. Blocks are renumbered in the order the client sees them.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Map, Value};

use super::usage::MessagesUsage;
use crate::error::ProxyError;
use crate::reasoning::{Split, TextSplitter, ThinkTags};
use crate::stream::{named_data, push_named, Action, ApiEvents, Seen};
use crate::Adapter;

/// A content block's kind, as far as the repair tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Thinking,
    ToolUse,
    Other,
}

impl Kind {
    fn of(block_type: &str) -> Kind {
        match block_type {
            "text" => Kind::Text,
            "thinking" => Kind::Thinking,
            "tool_use" => Kind::ToolUse,
            _ => Kind::Other,
        }
    }
}

#[derive(Debug)]
struct Block {
    kind: Kind,
    open: bool,
    signed: bool,
}

/// Where a backend block's content goes.
enum Target {
    /// To this client block.
    Block(usize),
    /// A text block whose text is split on think tags into thinking and text blocks.
    Split(Box<TextSplitter>),
}

/// The per-stream repair of one Messages stream.
pub(crate) struct MessagesStream {
    tags: Option<Arc<ThinkTags>>,
    /// The client's blocks, by their index.
    blocks: Vec<Block>,
    /// The backend's block indices and where their content goes.
    targets: Vec<(u64, Target)>,
    /// The client block open now.
    open: Option<usize>,
    usage: MessagesUsage,
    stopped: bool,
}

impl MessagesStream {
    pub(crate) fn new(tags: Option<Arc<ThinkTags>>) -> Self {
        MessagesStream {
            tags,
            blocks: Vec::new(),
            targets: Vec::new(),
            open: None,
            usage: MessagesUsage::default(),
            stopped: false,
        }
    }

    /// Appends `v` as the event named by its `type`.
    fn emit(out: &mut Vec<u8>, v: &Value) {
        let name = v.get("type").and_then(Value::as_str).unwrap_or("message");
        if let Ok(data) = serde_json::to_vec(v) {
            push_named(out, name, &data);
        }
    }

    /// Stops the open block (signing a thinking block first).
    fn close_open(&mut self, out: &mut Vec<u8>) {
        let Some(i) = self.open.take() else { return };
        let Some(b) = self.blocks.get_mut(i) else {
            return;
        };
        if b.kind == Kind::Thinking && !b.signed {
            b.signed = true;
            let sign = json!({"type": "content_block_delta", "index": i,
                "delta": {"type": "signature_delta", "signature": ""}});
            Self::emit(out, &sign);
        }
        b.open = false;
        Self::emit(out, &json!({"type": "content_block_stop", "index": i}));
    }

    /// Starts a client block of `kind` (stopping the open one): its index.
    fn start(&mut self, kind: Kind, block: Value, out: &mut Vec<u8>) -> usize {
        self.close_open(out);
        let i = self.blocks.len();
        self.blocks.push(Block {
            kind,
            open: true,
            signed: false,
        });
        self.open = Some(i);
        let ev = json!({"type": "content_block_start", "index": i, "content_block": block});
        Self::emit(out, &ev);
        i
    }

    /// The open block if it is of `kind`, else a new one.
    fn ensure_open(&mut self, kind: Kind, out: &mut Vec<u8>) -> usize {
        if let Some(i) = self.open.filter(|i| self.blocks[*i].kind == kind) {
            return i;
        }
        let block = match kind {
            Kind::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            _ => json!({"type": "text", "text": ""}),
        };
        self.start(kind, block, out)
    }

    /// Text a splitter settled: reasoning to a thinking block, answer to a text block.
    fn put_split(&mut self, split: Split, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        if !split.reasoning.is_empty() {
            let i = self.ensure_open(Kind::Thinking, out);
            seen.token(now, false);
            let ev = json!({"type": "content_block_delta", "index": i,
                "delta": {"type": "thinking_delta", "thinking": split.reasoning}});
            Self::emit(out, &ev);
        }
        if !split.answer.is_empty() {
            let i = self.ensure_open(Kind::Text, out);
            seen.token(now, true);
            let ev = json!({"type": "content_block_delta", "index": i,
                "delta": {"type": "text_delta", "text": split.answer}});
            Self::emit(out, &ev);
        }
    }

    /// Releases the text every splitter holds back.
    fn finish_splits(&mut self, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        let mut held = Vec::new();
        for (_, t) in &mut self.targets {
            if let Target::Split(s) = t {
                held.push(s.finish());
            }
        }
        for split in held {
            self.put_split(split, now, seen, out);
        }
    }

    fn target(&mut self, index: u64) -> Option<&mut Target> {
        self.targets
            .iter_mut()
            .find(|(b, _)| *b == index)
            .map(|(_, t)| t)
    }

    /// `content_block_start`: a client block, or a split when think tags apply to text.
    fn on_block_start(&mut self, v: &Value, out: &mut Vec<u8>) {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        let mut block = v.get("content_block").cloned().unwrap_or_else(|| json!({}));
        let kind = Kind::of(block.get("type").and_then(Value::as_str).unwrap_or(""));
        if let (Kind::Text, Some(tags)) = (kind, &self.tags) {
            let splitter = Box::new(TextSplitter::new(Arc::clone(tags)));
            self.targets.retain(|(b, _)| *b != index);
            self.targets.push((index, Target::Split(splitter)));
            return;
        }
        if let Some(obj) = block.as_object_mut() {
            complete_block(kind, obj);
        }
        let i = self.start(kind, block, out);
        self.targets.retain(|(b, _)| *b != index);
        self.targets.push((index, Target::Block(i)));
    }

    /// `content_block_delta`: to its client block (reopened when the repair stopped it).
    fn on_block_delta(&mut self, v: Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        let delta = v.get("delta").cloned().unwrap_or_else(|| json!({}));
        let delta_type = delta.get("type").and_then(Value::as_str).unwrap_or("");
        let i = match self.target(index) {
            Some(Target::Split(s)) => {
                let text = delta.get("text").and_then(Value::as_str).unwrap_or("");
                let split = s.push(text);
                return self.put_split(split, now, seen, out);
            }
            Some(Target::Block(i)) => *i,
            None => self.ensure_open(Kind::Text, out),
        };
        let i = if self.blocks[i].open {
            i
        } else if delta_type == "signature_delta" {
            // The repair signed and stopped this block already.
            return;
        } else {
            let kind = self.blocks[i].kind;
            let j = self.ensure_open(kind, out);
            if let Some(t) = self.target(index) {
                *t = Target::Block(j);
            }
            j
        };
        match delta_type {
            "signature_delta" => self.blocks[i].signed = true,
            "text_delta" => seen.token(now, true),
            "thinking_delta" | "input_json_delta" => seen.token(now, false),
            _ => {}
        }
        let ev = json!({"type": "content_block_delta", "index": i, "delta": delta});
        Self::emit(out, &ev);
    }

    /// `content_block_stop`: the block stopped unless the repair stopped it already.
    fn on_block_stop(&mut self, v: &Value, now: Instant, seen: &mut Seen, out: &mut Vec<u8>) {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        match self.target(index) {
            Some(Target::Split(s)) => {
                let split = s.finish();
                self.put_split(split, now, seen, out);
                self.close_open(out);
            }
            Some(Target::Block(i)) => {
                let i = *i;
                if self.open == Some(i) {
                    self.close_open(out);
                }
            }
            None => {}
        }
    }

    /// One event's JSON, repaired into `out`.
    pub(crate) fn handle(
        &mut self,
        mut v: Value,
        now: Instant,
        seen: &mut Seen,
        out: &mut Vec<u8>,
    ) {
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        match kind.as_str() {
            "message_start" => {
                if let Some(m) = v.get_mut("message").and_then(Value::as_object_mut) {
                    complete_message(m);
                    if let Some(u) = m.get("usage").and_then(MessagesUsage::of) {
                        self.usage.update(u);
                        seen.usage = Some(self.usage.usage());
                    }
                }
                Self::emit(out, &v);
            }
            "content_block_start" => self.on_block_start(&v, out),
            "content_block_delta" => self.on_block_delta(v, now, seen, out),
            "content_block_stop" => self.on_block_stop(&v, now, seen, out),
            "message_delta" => {
                self.finish_splits(now, seen, out);
                self.close_open(out);
                if let Some(u) = v.get("usage").and_then(MessagesUsage::of) {
                    self.usage.update(u);
                    seen.usage = Some(self.usage.usage());
                }
                Self::emit(out, &v);
            }
            "message_stop" => {
                self.finish_splits(now, seen, out);
                self.close_open(out);
                self.stopped = true;
                Self::emit(out, &v);
            }
            "error" if v.get("error").is_some_and(Value::is_object) => {
                seen.error = Some("error event from backend".into());
                self.stopped = true;
                Self::emit(out, &v);
            }
            _ if v.get("error").is_some() || kind == "error" => {
                seen.error = Some("error event from backend".into());
                self.stopped = true;
                self.finish_splits(now, seen, out);
                Self::emit(out, &anthropic_error(&v));
            }
            _ => Self::emit(out, &v),
        }
    }
}

/// The fields every `message_start` message has.
fn complete_message(m: &mut Map<String, Value>) {
    for (key, value) in [
        ("type", json!("message")),
        ("role", json!("assistant")),
        ("content", json!([])),
        ("stop_reason", Value::Null),
        ("stop_sequence", Value::Null),
    ] {
        m.entry(key).or_insert(value);
    }
    let usage = m.entry("usage").or_insert_with(|| json!({}));
    if let Some(u) = usage.as_object_mut() {
        u.entry("input_tokens").or_insert(json!(0));
        u.entry("output_tokens").or_insert(json!(0));
    }
}

/// The fields a block's start has by its kind.
fn complete_block(kind: Kind, b: &mut Map<String, Value>) {
    match kind {
        Kind::Text => {
            b.entry("text").or_insert(json!(""));
        }
        Kind::Thinking => {
            b.entry("thinking").or_insert(json!(""));
            b.entry("signature").or_insert(json!(""));
        }
        Kind::ToolUse => {
            b.entry("input").or_insert(json!({}));
        }
        Kind::Other => {}
    }
}

/// A backend's error (llama.cpp's `{"code","message","type"}`, or a chat-style
/// `{"error":{…}}`) in Anthropic's envelope.
fn anthropic_error(v: &Value) -> Value {
    let e = v.get("error").filter(|e| e.is_object()).unwrap_or(v);
    let message = e
        .get("message")
        .and_then(Value::as_str)
        .unwrap_or("the backend failed during the stream");
    let kind = match e.get("code").and_then(Value::as_u64) {
        Some(code) => axum::http::StatusCode::from_u16(code as u16)
            .map(super::error_type)
            .unwrap_or("api_error"),
        None => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

impl ApiEvents for MessagesStream {
    fn event(&mut self, ev: &[u8], now: Instant, seen: &mut Seen) -> Action {
        let (name, data) = named_data(ev);
        let Some(mut v) = data.and_then(|d| serde_json::from_slice::<Value>(d).ok()) else {
            return Action::Keep;
        };
        if !v.is_object() {
            return Action::Keep;
        }
        if name == Some(b"error") && v.get("type").and_then(Value::as_str) != Some("error") {
            // llama.cpp's own error object under Anthropic's event name.
            v = json!({ "error": v });
        }
        let mut out = Vec::with_capacity(ev.len() + 64);
        self.handle(v, now, seen, &mut out);
        Action::Replace(out)
    }

    fn end(&mut self, seen: &mut Seen) -> Option<Vec<u8>> {
        if self.stopped {
            return None;
        }
        let e = ProxyError::UpstreamProtocol {
            backend: String::new(),
            detail: "the stream ended before message_stop".into(),
        };
        seen.error = Some(e.to_string());
        Some(self.broken(&e, seen))
    }

    fn broken(&mut self, e: &ProxyError, seen: &mut Seen) -> Vec<u8> {
        let mut out = Vec::new();
        self.finish_splits(Instant::now(), seen, &mut out);
        out.extend_from_slice(&super::Messages.stream_error(e));
        self.stopped = true;
        out
    }
}

#[cfg(test)]
pub(crate) mod tests;
