//! The Responses events the client gets, written to the specification: every event numbered
//! (`sequence_number`), output items one at a time by `output_index`, their content parts by
//! `content_index`, each part and item closed with its `done` events before the next begins,
//! the final response listing exactly the items streamed.
//!
//! [`Writer`] keeps the state that makes those fields consistent; the stream repair and the
//! translation from chat both write through it.

use std::time::Instant;

use serde_json::{json, Map, Value};

use crate::stream::{push_named, Seen};

/// An output item's kind, as far as the writer tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ItemKind {
    Message,
    Reasoning,
    FunctionCall,
    Other,
}

impl ItemKind {
    pub(crate) fn of(item_type: &str) -> ItemKind {
        match item_type {
            "message" => ItemKind::Message,
            "reasoning" => ItemKind::Reasoning,
            "function_call" => ItemKind::FunctionCall,
            _ => ItemKind::Other,
        }
    }
}

#[derive(Debug)]
struct Part {
    /// `output_text`, `reasoning_text` or `refusal`.
    kind: String,
    text: String,
    text_done: bool,
    open: bool,
}

#[derive(Debug)]
pub(crate) struct Item {
    /// The id the backend's events use for it.
    pub(crate) backend_id: String,
    pub(crate) kind: ItemKind,
    /// The item as added, then as done.
    json: Value,
    parts: Vec<Part>,
    args: String,
    args_done: bool,
    pub(crate) open: bool,
}

/// Writes the client's events.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    seq: u64,
    pub(crate) items: Vec<Item>,
    open: Option<usize>,
}

/// The text field of a part's `done` event and of the part itself.
fn text_key(kind: &str) -> &'static str {
    if kind == "refusal" {
        "refusal"
    } else {
        "text"
    }
}

/// A content part of `kind` with `text`.
fn part_json(kind: &str, text: &str) -> Value {
    let mut p = json!({"type": kind});
    p[text_key(kind)] = json!(text);
    if kind == "output_text" {
        p["annotations"] = json!([]);
        p["logprobs"] = json!([]);
    }
    p
}

impl Writer {
    /// Appends `v` as the event named by its `type`, with the next sequence number.
    pub(crate) fn emit(&mut self, mut v: Value, out: &mut Vec<u8>) {
        if let Some(obj) = v.as_object_mut() {
            obj.insert("sequence_number".into(), json!(self.seq));
        }
        self.seq += 1;
        let name = v.get("type").and_then(Value::as_str).unwrap_or("message");
        if let Ok(data) = serde_json::to_vec(&v) {
            push_named(out, name, &data);
        }
    }

    /// The client index of the item the backend calls `id`.
    pub(crate) fn find(&self, id: &str) -> Option<usize> {
        self.items.iter().rposition(|i| i.backend_id == id)
    }

    pub(crate) fn open_item(&self) -> Option<usize> {
        self.open
    }

    pub(crate) fn id(&self, i: usize) -> String {
        self.items[i].json["id"].as_str().unwrap_or("").to_owned()
    }

    /// Adds an output item (closing the open one first): its `output_index`.
    pub(crate) fn add_item(
        &mut self,
        backend_id: &str,
        mut item: Value,
        out: &mut Vec<u8>,
    ) -> usize {
        self.close_open(out);
        let kind = ItemKind::of(item["type"].as_str().unwrap_or(""));
        if let Some(obj) = item.as_object_mut() {
            obj.entry("id").or_insert_with(|| json!(backend_id));
            obj.insert("status".into(), json!("in_progress"));
            complete_item(kind, obj);
        }
        let i = self.items.len();
        let ev = json!({"type": "response.output_item.added", "output_index": i, "item": item});
        self.items.push(Item {
            backend_id: backend_id.to_owned(),
            kind,
            json: item,
            parts: Vec::new(),
            args: String::new(),
            args_done: false,
            open: true,
        });
        self.open = Some(i);
        self.emit(ev, out);
        i
    }

    /// Adds a content part to item `i` (closing its open part): its `content_index`.
    pub(crate) fn add_part(&mut self, i: usize, kind: &str, out: &mut Vec<u8>) -> usize {
        if let Some(j) = self.items[i].parts.iter().rposition(|p| p.open) {
            self.close_part(i, j, out);
        }
        let j = self.items[i].parts.len();
        self.items[i].parts.push(Part {
            kind: kind.to_owned(),
            text: String::new(),
            text_done: false,
            open: true,
        });
        let ev = json!({"type": "response.content_part.added", "item_id": self.id(i),
            "output_index": i, "content_index": j, "part": part_json(kind, "")});
        self.emit(ev, out);
        j
    }

    /// The open part of `kind` of item `i`, added when there is none.
    pub(crate) fn part(&mut self, i: usize, kind: &str, out: &mut Vec<u8>) -> usize {
        match self.items[i].parts.last() {
            Some(p) if p.open && p.kind == kind => self.items[i].parts.len() - 1,
            _ => self.add_part(i, kind, out),
        }
    }

    /// Text of `kind` for item `i` (its part added when needed); `extra` holds the backend's
    /// delta event, whose `logprobs` are kept.
    pub(crate) fn text_delta(
        &mut self,
        i: usize,
        kind: &str,
        delta: &str,
        extra: Option<&Value>,
        (now, seen): (Instant, &mut Seen),
        out: &mut Vec<u8>,
    ) {
        if delta.is_empty() {
            return;
        }
        let j = self.part(i, kind, out);
        self.items[i].parts[j].text.push_str(delta);
        seen.token(now, kind == "output_text");
        let mut ev = json!({"type": format!("response.{kind}.delta"), "item_id": self.id(i),
            "output_index": i, "content_index": j, "delta": delta});
        if kind == "output_text" {
            let logprobs = extra.and_then(|e| e.get("logprobs")).cloned();
            ev["logprobs"] = logprobs.unwrap_or_else(|| json!([]));
        }
        self.emit(ev, out);
    }

    /// The `done` event of the text of part `j` of item `i`, once.
    pub(crate) fn text_done(&mut self, i: usize, j: usize, out: &mut Vec<u8>) {
        let part = &mut self.items[i].parts[j];
        if part.text_done {
            return;
        }
        part.text_done = true;
        let kind = part.kind.clone();
        let mut ev = json!({"type": format!("response.{kind}.done"), "item_id": self.id(i),
            "output_index": i, "content_index": j});
        ev[text_key(&kind)] = json!(self.items[i].parts[j].text);
        if kind == "output_text" {
            ev["logprobs"] = json!([]);
        }
        self.emit(ev, out);
    }

    /// Closes part `j` of item `i`: its text's `done`, then `content_part.done`.
    pub(crate) fn close_part(&mut self, i: usize, j: usize, out: &mut Vec<u8>) {
        if !self.items[i].parts[j].open {
            return;
        }
        self.text_done(i, j, out);
        let p = &mut self.items[i].parts[j];
        p.open = false;
        let part = part_json(&p.kind, &p.text);
        let ev = json!({"type": "response.content_part.done", "item_id": self.id(i),
            "output_index": i, "content_index": j, "part": part});
        self.emit(ev, out);
    }

    /// A function call's arguments grew by `delta`.
    pub(crate) fn args_delta(
        &mut self,
        i: usize,
        delta: &str,
        now: Instant,
        seen: &mut Seen,
        out: &mut Vec<u8>,
    ) {
        if delta.is_empty() {
            return;
        }
        self.items[i].args.push_str(delta);
        seen.token(now, false);
        let ev = json!({"type": "response.function_call_arguments.delta",
            "item_id": self.id(i), "output_index": i, "delta": delta});
        self.emit(ev, out);
    }

    /// A function call's arguments are complete (`arguments` when the backend says so).
    pub(crate) fn args_done(&mut self, i: usize, arguments: Option<&str>, out: &mut Vec<u8>) {
        let item = &mut self.items[i];
        if item.args_done {
            return;
        }
        item.args_done = true;
        if item.args.is_empty() {
            item.args = arguments.unwrap_or("").to_owned();
        }
        let ev = json!({"type": "response.function_call_arguments.done",
            "item_id": self.id(i), "output_index": i, "arguments": self.items[i].args,
            "name": self.items[i].json["name"]});
        self.emit(ev, out);
    }

    /// Closes item `i` (its parts and arguments first); `done` is the backend's final item,
    /// whose fields are kept where the stream did not say otherwise.
    pub(crate) fn close_item(&mut self, i: usize, done: Option<&Value>, out: &mut Vec<u8>) {
        if !self.items[i].open {
            return;
        }
        for j in 0..self.items[i].parts.len() {
            self.close_part(i, j, out);
        }
        if self.items[i].kind == ItemKind::FunctionCall {
            let args = done
                .and_then(|d| d["arguments"].as_str())
                .map(str::to_owned);
            self.args_done(i, args.as_deref(), out);
        }
        let item = self.final_item(i, done);
        self.items[i].json = item.clone();
        self.items[i].open = false;
        if self.open == Some(i) {
            self.open = None;
        }
        let ev = json!({"type": "response.output_item.done", "output_index": i, "item": item});
        self.emit(ev, out);
    }

    /// Item `i` as done: the backend's fields, the streamed text and arguments, completed.
    fn final_item(&self, i: usize, done: Option<&Value>) -> Value {
        let it = &self.items[i];
        let mut item: Map<String, Value> = it.json.as_object().cloned().unwrap_or_default();
        if let Some(d) = done.and_then(Value::as_object) {
            for (k, v) in d {
                if k != "id" {
                    item.insert(k.clone(), v.clone());
                }
            }
        }
        item.insert("status".into(), json!("completed"));
        if matches!(it.kind, ItemKind::Message | ItemKind::Reasoning) && !it.parts.is_empty() {
            let theirs = item
                .get("content")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let parts = it.parts.iter().enumerate().map(|(j, p)| {
                let mut part = theirs
                    .get(j)
                    .filter(|t| t["type"] == p.kind.as_str())
                    .cloned()
                    .unwrap_or_else(|| part_json(&p.kind, ""));
                part[text_key(&p.kind)] = json!(p.text);
                part
            });
            item.insert("content".into(), Value::Array(parts.collect()));
        }
        if it.kind == ItemKind::FunctionCall {
            item.insert("arguments".into(), json!(it.args));
        }
        Value::Object(item)
    }

    /// Closes the open item, if any.
    pub(crate) fn close_open(&mut self, out: &mut Vec<u8>) {
        if let Some(i) = self.open {
            self.close_item(i, None, out);
        }
    }

    /// Every item as the final response lists it.
    pub(crate) fn output(&self) -> Vec<Value> {
        self.items.iter().map(|i| i.json.clone()).collect()
    }
}

/// The fields an item has by its kind when it is added.
fn complete_item(kind: ItemKind, item: &mut Map<String, Value>) {
    match kind {
        ItemKind::Message => {
            item.entry("role").or_insert(json!("assistant"));
            item.insert("content".into(), json!([]));
        }
        ItemKind::Reasoning => {
            item.entry("summary").or_insert(json!([]));
            item.insert("content".into(), json!([]));
        }
        ItemKind::FunctionCall => {
            item.insert("arguments".into(), json!(""));
        }
        ItemKind::Other => {}
    }
}
