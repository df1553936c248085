//! SGLang's Messages → chat converter (`entrypoints/anthropic/serving.py`
//! `AnthropicServing._convert_to_chat_completion_request`), step for step.

use serde_json::{json, Map, Value};

use super::vllm::python_str;
use super::{call_id, tool_call};
use crate::chat_form::{bad, copy_keys, image_part, msg, str_or, text_of, text_part, truthy};
use crate::error::ProxyError;

/// SGLang's `_convert_to_chat_completion_request`.
pub(super) fn convert(req: &Map<String, Value>) -> Result<Map<String, Value>, ProxyError> {
    let list = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("messages: Field required"))?;
    let mut messages = Vec::new();
    match req.get("system") {
        Some(Value::String(s)) if !s.is_empty() => {
            messages.push(msg([
                ("role", "system".into()),
                ("content", s.as_str().into()),
            ]));
        }
        Some(Value::Array(blocks)) if !blocks.is_empty() => {
            let text: Vec<&str> = blocks
                .iter()
                .filter(|b| str_or(b, "type", "") == "text")
                .filter_map(|b| text_of(b, "text"))
                .collect();
            messages.push(msg([
                ("role", "system".into()),
                ("content", text.join("\n").into()),
            ]));
        }
        _ => {}
    }
    for m in list {
        sglang_turn(m, &mut messages);
    }
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    copy_keys(req, &mut chat, &["model", "max_tokens"]);
    if let Some(Value::Array(tools)) = req.get("tools").filter(|t| truthy(Some(t))) {
        let tools = tools
            .iter()
            .map(|t| {
                let mut tool = Map::new();
                tool.insert("type".into(), "function".into());
                if let Some(d) = t.get("defer_loading").filter(|d| !d.is_null()) {
                    tool.insert("defer_loading".into(), d.clone());
                }
                tool.insert(
                    "function".into(),
                    json!({
                        "name": str_or(t, "name", ""),
                        "description": text_of(t, "description").unwrap_or(""),
                        "parameters": t.get("input_schema").cloned().unwrap_or(Value::Null),
                    }),
                );
                Value::Object(tool)
            })
            .collect();
        chat.insert("tools".into(), Value::Array(tools));
    }
    Ok(chat)
}

/// One SGLang turn: tool results of a user turn become tool messages ahead of it; thinking is
/// dropped; one text part becomes a string.
fn sglang_turn(m: &Value, out: &mut Vec<Value>) {
    let role = str_or(m, "role", "");
    let blocks = match m.get("content") {
        Some(Value::Array(blocks)) => blocks,
        other => {
            let content = other.cloned().unwrap_or(Value::Null);
            out.push(msg([("role", role.into()), ("content", content)]));
            return;
        }
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for b in blocks {
        match str_or(b, "type", "") {
            "text" => parts.extend(text_of(b, "text").map(text_part)),
            "image" => parts.extend(sglang_image(b.get("source"))),
            "tool_use" => calls.push(tool_call(
                &call_id(b),
                text_of(b, "name").unwrap_or(""),
                b.get("input").filter(|v| truthy(Some(v))),
            )),
            "tool_result" => {
                let (content, text) = sglang_result(b.get("content"));
                if role == "user" {
                    let id = text_of(b, "tool_use_id")
                        .or_else(|| text_of(b, "id"))
                        .unwrap_or("");
                    out.push(msg([
                        ("role", "tool".into()),
                        ("tool_call_id", id.into()),
                        ("content", content),
                    ]));
                } else {
                    parts.push(text_part(&format!("Tool result: {text}")));
                }
            }
            _ => {}
        }
    }
    let mut turn = Map::new();
    turn.insert("role".into(), role.into());
    let has_calls = !calls.is_empty();
    if has_calls {
        turn.insert("tool_calls".into(), Value::Array(calls));
    }
    match parts.as_slice() {
        [] if !has_calls => return,
        [] => {}
        [one] if one["type"] == "text" => drop(turn.insert("content".into(), one["text"].clone())),
        _ => drop(turn.insert("content".into(), Value::Array(parts))),
    }
    out.push(Value::Object(turn));
}

fn sglang_image(source: Option<&Value>) -> Option<Value> {
    let source = source.filter(|s| s.is_object())?;
    if str_or(source, "type", "") == "base64" {
        let data = text_of(source, "data")?;
        let url = crate::chat_form::data_url(str_or(source, "media_type", "image/png"), data);
        return Some(image_part(&url));
    }
    text_of(source, "url").map(image_part)
}

/// SGLang's `_convert_tool_result_content`: (the tool message's content, its text).
fn sglang_result(content: Option<&Value>) -> (Value, String) {
    let Some(Value::Array(items)) = content else {
        let text = python_str(content);
        return (text.clone().into(), text);
    };
    let mut parts = Vec::new();
    let mut texts = Vec::new();
    for item in items.iter().filter(|i| i.is_object()) {
        match str_or(item, "type", "") {
            "text" => {
                if let Some(t) = text_of(item, "text") {
                    texts.push(t);
                    parts.push(text_part(t));
                }
            }
            "image" => parts.extend(sglang_image(item.get("source"))),
            "tool_reference" => {
                let name = text_of(item, "tool_name").or_else(|| text_of(item, "name"));
                parts.extend(name.map(|n| json!({"type": "tool_reference", "name": n})));
            }
            _ => {}
        }
    }
    let text = texts.join("\n");
    match parts.as_slice() {
        [one] if one["type"] == "text" => (one["text"].clone(), text),
        [] => ("".into(), text),
        _ => (Value::Array(parts), text),
    }
}
